"""Durability of acknowledged writes: ``kill -9`` the recall service while writes are in flight,
restart it, and count the acknowledged sessions that are gone (goal: 0).

Writers ingest one session per request (``POST /v1/users/{user}/sessions``) and record every id
the server acknowledged with a 2xx. At random points (drawn up front from ``--seed``) the server
is killed with SIGKILL the moment the acknowledged count crosses the point, so other writers'
requests are in flight; it is restarted on the same database, every user's sessions are listed,
and the acknowledged ids that are missing are counted. Writers resume on new ids until the
target is acknowledged; then the server is killed once more (idle, right after the last
acknowledgement) and checked a last time. Requests that failed because of a kill are "in
doubt": present or not, both are correct, and the report says how many were committed anyway.
A sample of acknowledged sessions is also read back turn by turn, so a truncated or mangled
row would count as lost too.

    python -m eval.bench.bench_durability --db sqlite
    python -m eval.bench.bench_durability --db postgres --pg-dsn postgresql+psycopg://postgres@127.0.0.1:5432/test

Results go to ``eval/results/bench_durability/bench_durability.md`` / ``.json`` (``--out``); one
run per database
updates its own section and keeps the other's.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from eval.common import (
    DEFAULT_PG_DSN,
    RESULTS,
    Server,
    command_line,
    create_database,
    free_port,
    machine,
    machine_line,
    make_session,
    new_key,
    session_date,
    summarize,
    update_runs,
    utc_now_text,
    workspace,
    write_config,
)


@dataclass
class Ledger:
    """Every write attempt by outcome. ``acked`` maps session id -> (user, the turns sent)."""

    acked: dict[str, tuple[str, list[dict[str, Any]]]] = field(default_factory=dict)
    in_doubt: dict[str, str] = field(default_factory=dict)  # id -> user; failed by a kill
    refused: Counter[str] = field(default_factory=Counter)  # non-2xx answers by status
    # Requests that failed with no kill under way: the server crashed or hung on its own.
    unexpected: Counter[str] = field(default_factory=Counter)
    aborted: str | None = None
    latencies_ms: list[float] = field(default_factory=list)


@dataclass
class Check:
    after: str  # "kill 1", ..., "final kill"
    acked_so_far: int
    in_flight_at_kill: int
    missing: list[str]
    sampled: int
    mismatched: list[str]
    in_doubt: int
    in_doubt_committed: int
    stored: int
    restart_s: float
    verify_s: float


async def list_ids(client: httpx.AsyncClient, server: Server, user: str) -> set[str]:
    ids: set[str] = set()
    offset = 0
    while True:
        r = await client.get(
            f"/v1/users/{user}/sessions",
            params={"limit": 1000, "offset": offset},
            headers=server.headers,
        )
        if r.status_code == 404:  # a user whose first write never committed
            return ids
        r.raise_for_status()
        body = r.json()
        ids.update(s["session_id"] for s in body["sessions"])
        offset += len(body["sessions"])
        if not body["sessions"] or offset >= body["total"]:
            return ids


async def verify(
    server: Server,
    users: list[str],
    ledger: Ledger,
    rng: random.Random,
    sample: int,
) -> tuple[list[str], int, list[str], int, int]:
    """Acked ids missing, how many acked sessions were read back and which of those differ
    from what was sent, in-doubt ids committed, stored ids in all."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120.0) as client:
        stored: set[str] = set()
        for user in users:
            stored |= await list_ids(client, server, user)
        missing = sorted(sid for sid in ledger.acked if sid not in stored)
        present = [sid for sid in ledger.acked if sid in stored]
        mismatched = []
        picked = rng.sample(present, min(sample, len(present)))
        for sid in picked:
            user, turns = ledger.acked[sid]
            r = await client.get(f"/v1/users/{user}/sessions/{sid}", headers=server.headers)
            got = (
                [(t["speaker"], t["text"], t["turn_id"]) for t in r.json()["turns"]]
                if r.status_code == 200
                else None
            )
            if got != [(t["speaker"], t["text"], t["turn_id"]) for t in turns]:
                mismatched.append(sid)
        committed = sum(1 for sid in ledger.in_doubt if sid in stored)
        return missing, len(picked), mismatched, committed, len(stored)


async def run(
    server: Server,
    *,
    target: int,
    writers: int,
    users: list[str],
    kills: int,
    seed: int,
    sample: int,
) -> tuple[Ledger, list[Check], list[int], float]:
    rng = random.Random(seed)
    # Kill points in the middle 90% of the run, so every kill has writes before and after it.
    points = sorted(rng.sample(range(max(target // 20, 1), max(target * 19 // 20, 2)), kills))
    ledger = Ledger()
    checks: list[Check] = []
    up = asyncio.Event()
    up.set()
    crossed = asyncio.Event()
    next_point = [0]  # index into points
    in_flight = [0]
    counter = [0]
    done = asyncio.Event()
    limits = httpx.Limits(max_connections=writers, max_keepalive_connections=writers)
    max_failures = max(100, target // 10)

    async def writer(w: int, client: httpx.AsyncClient) -> None:
        wrng = random.Random(f"{seed}:{w}")
        user = users[w % len(users)]
        while not done.is_set():
            await up.wait()
            if done.is_set():
                return
            i = counter[0]
            counter[0] += 1
            sid = f"w{w}-s{i}"
            body = make_session(wrng, sid, session_date(i))
            in_flight[0] += 1
            t0 = time.perf_counter()
            try:
                r = await client.post(
                    f"/v1/users/{user}/sessions", json={"sessions": [body]}, headers=server.headers
                )
            except httpx.HTTPError as e:
                # The server died under this request: it may or may not have committed.
                ledger.in_doubt[sid] = user
                if up.is_set():  # no kill of ours: count it, and stop rather than spin
                    ledger.unexpected[type(e).__name__] += 1
                    if sum(ledger.unexpected.values()) > max_failures:
                        ledger.aborted = f"{dict(ledger.unexpected)} failures with no kill"
                        done.set()
                    await asyncio.sleep(0.05)
                continue
            finally:
                in_flight[0] -= 1
            if 200 <= r.status_code < 300:
                ledger.latencies_ms.append((time.perf_counter() - t0) * 1000)
                ledger.acked[sid] = (user, body["turns"])
                n = len(ledger.acked)
                if next_point[0] < len(points) and n >= points[next_point[0]]:
                    crossed.set()
                if n >= target:
                    done.set()
            else:
                ledger.refused[str(r.status_code)] += 1
                if sum(ledger.refused.values()) > max_failures:
                    ledger.aborted = f"{dict(ledger.refused)} refusals"
                    done.set()
                await asyncio.sleep(0.05)  # do not spin on a persistent refusal

    async def kill_and_check(label: str) -> None:
        up.clear()  # no new requests start; those already sent stay in flight
        flying = in_flight[0]
        server.kill()
        acked_now = len(ledger.acked)
        t0 = time.perf_counter()
        await asyncio.to_thread(server.start)
        restart_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        missing, sampled, mismatched, committed, stored = await verify(
            server, users, ledger, rng, sample
        )
        checks.append(
            Check(
                after=label,
                acked_so_far=acked_now,
                in_flight_at_kill=flying,
                missing=missing,
                sampled=sampled,
                mismatched=mismatched,
                in_doubt=len(ledger.in_doubt),
                in_doubt_committed=committed,
                stored=stored,
                restart_s=round(restart_s, 2),
                verify_s=round(time.perf_counter() - t0, 2),
            )
        )
        print(
            f"{label}: {acked_now} acked, {flying} in flight at the kill, "
            f"{len(missing)} missing, {len(mismatched)} mismatched, "
            f"{committed}/{len(ledger.in_doubt)} in-doubt committed",
            file=sys.stderr,
            flush=True,
        )

    t_start = time.perf_counter()
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120.0, limits=limits) as client:
        tasks = [asyncio.create_task(writer(w, client)) for w in range(writers)]
        while next_point[0] < len(points):
            waiter = asyncio.create_task(crossed.wait())
            finished = asyncio.create_task(done.wait())
            await asyncio.wait({waiter, finished}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            finished.cancel()
            if done.is_set():
                break
            crossed.clear()
            next_point[0] += 1
            await kill_and_check(f"kill {next_point[0]}")
            up.set()
        await done.wait()
        up.set()  # writers parked on a kill must see `done` and leave
        await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - t_start
    await kill_and_check("final kill")
    return ledger, checks, points, elapsed


def _section(result: dict[str, Any]) -> str:
    lat = result["ingest_latency_ms"]
    lines = [
        f"## {result['db']}",
        "",
        f"Date: {result['date']}. Machine: {machine_line(result['machine'], run=True)}.",
        "",
        f"Command: `{result['command']}`",
        "",
        *([f"Note: {result['note']}", ""] if result.get("note") else []),
        f"Writers: {result['writers']} concurrent, one session (4 turns) per request, into "
        f"{len(result['users'])} user(s); {result['kills']} SIGKILL(s) at acknowledged counts "
        f"{result['kill_points']} (seed {result['seed']}), then a final SIGKILL after the last "
        f"acknowledgement. The writes took {result['wall_seconds']:.0f} s of wall time, "
        f"{result['write_seconds']:.0f} s without the restarts and checks between them "
        f"({result['acked'] / max(result['write_seconds'], 1e-9):.1f} acknowledged writes/s); "
        f"ingest p50/p95/p99 {lat['p50_ms']}/{lat['p95_ms']}/{lat['p99_ms']} ms. This is a "
        "correctness run, not a throughput one: the writers queue on the store's one writer "
        "(SQLite) or its row locks, and client, server and database share the machine.",
        "",
        "| check | acked so far | in flight at kill | lost (acked, missing) | read back, "
        "mismatched | in doubt (committed) | stored | restart s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in result["checks"]:
        lines.append(
            f"| {c['after']} | {c['acked_so_far']} | {c['in_flight_at_kill']} | "
            f"**{len(c['missing'])}** | {c['sampled']} / {len(c['mismatched'])} | "
            f"{c['in_doubt']} ({c['in_doubt_committed']}) | {c['stored']} | {c['restart_s']} |"
        )
    refused = result["refused"] or {}
    unexpected = result.get("unexpected") or {}
    lines += [
        "",
        f"**Result: {result['lost']} of {result['acked']} acknowledged writes lost** "
        f"(goal: 0). Non-2xx answers: {dict(refused) or 'none'}; requests failed with no kill "
        f"under way: {dict(unexpected) or 'none'}.",
        "",
    ]
    if result.get("aborted"):
        lines += [f"**ABORTED before the target**: {result['aborted']}.", ""]
    return "\n".join(lines)


def write_report(out: Path, result: dict[str, Any]) -> None:
    """Update ``result['db']``'s section in the md/json pair, keeping the other database's."""
    runs = update_runs(out.with_suffix(".json"), result["db"], result)
    header = [
        "# Recall service: durability of acknowledged writes under kill -9",
        "",
        "Each run starts `memsifter serve` (coarse-only) as a subprocess, ingests sessions from "
        "concurrent writers, SIGKILLs the server at random points while requests are in flight, "
        "restarts it on the same database and lists every user's sessions. **Lost** = a session "
        "the server acknowledged (2xx) that is not there after the restart; a sample of the "
        "acknowledged sessions is also read back and compared turn by turn. **In doubt** = "
        "requests cut off by the kill, never acknowledged: either outcome is correct.",
        "",
        "SQLite runs in WAL mode with `synchronous=NORMAL`: a commit is in the WAL (the OS page "
        "cache) before it is acknowledged, which survives the process dying. It does not claim "
        "to survive power loss or an OS crash (that needs `synchronous=FULL`); this test kills "
        "the process, not the machine. PostgreSQL runs with its defaults (`synchronous_commit = "
        "on`), and only the service is killed.",
        "",
        "Regenerate: `python -m eval.bench.bench_durability --db sqlite` and "
        "`python -m eval.bench.bench_durability --db postgres` (see `--help`).",
        "",
    ]
    sections = [_section(runs[db]) for db in ("sqlite", "postgres") if db in runs]
    out.write_text("\n".join(header + sections))


def main(
    db: Annotated[str, typer.Option(help="sqlite | postgres")] = "sqlite",
    writes: Annotated[int, typer.Option(help="acknowledged writes to reach")] = 10_000,
    writers: Annotated[int, typer.Option(help="concurrent writer clients")] = 16,
    users: Annotated[int, typer.Option(help="users the writers spread over")] = 16,
    kills: Annotated[int, typer.Option(help="SIGKILLs during the writes")] = 3,
    seed: Annotated[int, typer.Option()] = 0,
    sample: Annotated[int, typer.Option(help="acked sessions read back per check")] = 200,
    pg_dsn: Annotated[str, typer.Option(help="PostgreSQL server (a fresh DB is made)")] = (
        DEFAULT_PG_DSN
    ),
    out: Annotated[Path, typer.Option(help="report .md (the .json goes next to it)")] = (
        RESULTS / "bench_durability" / "bench_durability.md"
    ),
    keep: Annotated[bool, typer.Option(help="keep the temp dir and database")] = False,
    note: Annotated[str | None, typer.Option(help="a remark for the report (conditions)")] = None,
) -> None:
    if kills < 0 or writes < 10 or writers < 1 or users < 1:
        raise typer.BadParameter("need writes >= 10, writers >= 1, users >= 1, kills >= 0")
    started = utc_now_text()
    info = machine()
    user_ids = [f"dur-u{u}" for u in range(users)]
    with workspace(keep) as tmp:
        database = create_database(db, tmp, pg_dsn)
        try:
            config = tmp / "serve.yaml"
            write_config(config, database.url)
            server = Server(config, free_port(), new_key(), tmp / "server.log")
            server.start()
            try:
                ledger, checks, points, elapsed = asyncio.run(
                    run(
                        server,
                        target=writes,
                        writers=writers,
                        users=user_ids,
                        kills=kills,
                        seed=seed,
                        sample=sample,
                    )
                )
            finally:
                server.stop()
        finally:
            if not keep:
                database.cleanup()
        if keep:
            print(f"kept {tmp} ({database.url})", file=sys.stderr)

    lost = sorted({sid for c in checks for sid in c.missing + c.mismatched})
    # The restarts and checks after the kills during the writes stopped the writers meanwhile.
    paused = sum(c.restart_s + c.verify_s for c in checks[:-1])
    result = {
        "db": db,
        "date": started,
        "command": command_line(),
        "note": note,
        "machine": info,
        "target": writes,
        "acked": len(ledger.acked),
        "lost": len(lost),
        "lost_ids": lost[:100],
        "writers": writers,
        "users": user_ids,
        "kills": kills,
        "kill_points": points,
        "seed": seed,
        "sample": sample,
        "wall_seconds": round(elapsed, 1),
        "write_seconds": round(elapsed - paused, 1),
        "ingest_latency_ms": summarize(ledger.latencies_ms),
        "refused": dict(ledger.refused),
        "unexpected": dict(ledger.unexpected),
        "aborted": ledger.aborted,
        "in_doubt": len(ledger.in_doubt),
        "server_starts": server.starts,
        "server_start_seconds": server.start_seconds,
        "checks": [
            {
                "after": c.after,
                "acked_so_far": c.acked_so_far,
                "in_flight_at_kill": c.in_flight_at_kill,
                "missing": c.missing[:100],
                "sampled": c.sampled,
                "mismatched": c.mismatched[:100],
                "in_doubt": c.in_doubt,
                "in_doubt_committed": c.in_doubt_committed,
                "stored": c.stored,
                "restart_s": c.restart_s,
                "verify_s": c.verify_s,
            }
            for c in checks
        ],
    }
    write_report(out, result)
    print(
        f"{db}: {len(lost)} of {len(ledger.acked)} acknowledged writes lost "
        f"({kills} kills + final); report in {out}",
        file=sys.stderr,
    )
    if lost or ledger.aborted:
        raise typer.Exit(1)


if __name__ == "__main__":
    typer.run(main)
