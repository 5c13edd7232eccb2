"""One user's history grown to ``--sessions`` sizes, against a real ``memsifter serve``: what
a long history costs the recall service (issue 36's table).

For each store (``--db``), one user is seeded through HTTP in batches of ``--seed-batch``
sessions (200, the API's limit) of the recall benchmarks' generator
(``eval.common.make_session``), growing to each size in turn; at each size:

* **seeding rate**: sessions a second while growing to it (this size's new sessions only);
* **disk**: the database's size (SQLite: the file and its WAL; PostgreSQL: the database);
* **warm recall**: ``--questions`` recalls one at a time after ``--warmup``, client-side p50 and
  p95, and the service's own ``total_ms`` p50;
* **RSS** of the server process with the user loaded (after the warm recalls);
* **ingest**: ``--ingests`` single-session ingests into the same user, one at a time (p50/p95);
  they become part of the history;
* **cold first recall**: the server stopped and started ``--restarts`` times (the OS page cache
  as it was found: not dropped), each time the first recall's client latency, with its
  ``timings.index_load`` and ``index_ms``.

On PostgreSQL the database is vacuumed and checkpointed after seeding to each size, as a
history that grew over months is left (``vacuum_s``).

Results: ``eval/results/bench_scale/bench_scale.md`` and ``.json`` (``--out``), one row per store
and size.

    python -m eval.bench.bench_scale --sessions 10000 --sessions 100000 --db sqlite --db postgres
"""

from __future__ import annotations

import json
import random
import time
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from sqlalchemy import create_engine, text

from eval.common import (
    DEFAULT_PG_DSN,
    RESULTS,
    TENANT,
    ProxyOptions,
    Server,
    command_line,
    create_database,
    free_port,
    git_head,
    machine,
    machine_line,
    make_question,
    make_session,
    new_key,
    session_date,
    summarize,
    utc_now_text,
    workspace,
    write_config,
    write_report_files,
)

USER = "scale"
DIRECT_BATCH = 2000
FULL_SESSIONS = 10_000  # a run whose largest history is smaller is a smoke run, and says so
OUT = RESULTS / "bench_scale" / "bench_scale.md"


def _post(client: httpx.Client, url: str, body: Any) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    r = client.post(url, json=body)
    ms = (time.perf_counter() - t0) * 1000
    if r.status_code not in (200, 201):
        raise RuntimeError(f"{url}: {r.status_code} {r.text[:300]}")
    return ms, r.json()


def _client(server: Server, timeout_s: float) -> httpx.Client:
    return httpx.Client(base_url=server.base_url, headers=server.headers, timeout=timeout_s)


def seed(server: Server, start: int, stop: int, batch: int, rng: random.Random) -> float:
    """Sessions ``start..stop`` of the user (``seed-<i>``), in batches; the seconds it took."""
    t0 = time.perf_counter()
    with _client(server, 600.0) as c:
        for lo in range(start, stop, batch):
            sessions = [
                make_session(rng, f"seed-{i}", session_date(i))
                for i in range(lo, min(lo + batch, stop))
            ]
            _post(c, f"/v1/users/{USER}/sessions", {"sessions": sessions})
    return time.perf_counter() - t0


class _NoBookmarks:
    name = "none"

    def extract(self, pages: Any) -> list[list[tuple[str, float]]]:
        return [[] for _ in pages]


def seed_direct(config: Path, start: int, stop: int, rng: random.Random) -> float:
    """Sessions ``start..stop`` written through the service's own ingest in this process, not
    over HTTP (the server stopped), without bookmarks: keyword extraction (YAKE, ~10 ms a
    session here) would make a million sessions take a day. The seconds it took."""
    from memsifter.data.types import Turn
    from memsifter.serving.config import load_serve_config
    from memsifter.serving.memory import MemoryService, session_from_input
    from memsifter.serving.ranking import ServiceRanker
    from memsifter.serving.store import Principal, Store

    settings = load_serve_config(config)
    store = Store(settings.db_url)
    memory = MemoryService(settings, store, ServiceRanker.from_config(settings), _NoBookmarks())
    who = Principal(TENANT)
    t0 = time.perf_counter()
    try:
        for lo in range(start, stop, DIRECT_BATCH):
            batch = []
            for i in range(lo, min(lo + DIRECT_BATCH, stop)):
                raw = make_session(rng, f"seed-{i}", session_date(i))
                turns = tuple(Turn(t["speaker"], t["text"], t["turn_id"]) for t in raw["turns"])
                date = datetime.fromisoformat(raw["date"])
                batch.append(session_from_input(raw["id"], turns, date, None))
            memory.ingest_sessions(who, USER, batch)
    finally:
        store.close()
    return time.perf_counter() - t0


def vacuum(db_url: str, kind: str) -> float | None:
    """PostgreSQL: ``VACUUM (ANALYZE)`` and a ``CHECKPOINT`` after seeding, the seconds they
    took (None on SQLite). A history that grew over months has been through autovacuum, which
    marks pages all-visible (so a term's postings are read from the index alone) and gathers
    statistics, and its writes were checkpointed long ago; one written in minutes has not, and
    autovacuum and the checkpoint's writes would then run during the measurements."""
    if kind != "postgres":
        return None
    engine = create_engine(db_url, isolation_level="AUTOCOMMIT")
    t0 = time.perf_counter()
    try:
        with engine.connect() as conn:
            conn.execute(text("VACUUM (ANALYZE)"))
            conn.execute(text("CHECKPOINT"))
    finally:
        engine.dispose()
    return round(time.perf_counter() - t0, 1)


def tokens_and_disk(db_url: str, kind: str) -> tuple[int, float]:
    """The user's tokens by the service's own count (``SUM(pages.n_tokens)``) and the
    database's size in MB."""
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            tokens = conn.execute(
                text("SELECT COALESCE(SUM(n_tokens), 0) FROM pages WHERE user_id = :u"),
                {"u": USER},
            ).scalar_one()
            if kind == "postgres":
                size = conn.execute(
                    text("SELECT pg_database_size(current_database())")
                ).scalar_one()
    finally:
        engine.dispose()
    if kind == "sqlite":
        path = Path(db_url.removeprefix("sqlite:///"))
        size = sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())
    return int(tokens), round(size / 1e6, 1)


def measure(
    server: Server,
    db_url: str,
    kind: str,
    sessions: int,
    args: dict[str, int],
    rng: random.Random,
) -> dict[str, Any]:
    warm, service = [], []
    with _client(server, 600.0) as c:
        for i in range(args["warmup"] + args["questions"]):
            ms, body = _post(
                c, f"/v1/users/{USER}/recall", {"question": make_question(rng), "top_k": 5}
            )
            if i >= args["warmup"]:
                warm.append(ms)
                service.append(body["timings"]["total_ms"])
        rss = server.rss_mib()
        ingest = []
        for i in range(args["ingests"]):
            n = sessions + i
            ms, _ = _post(
                c,
                f"/v1/users/{USER}/sessions",
                {"sessions": [make_session(rng, f"ingest-{n}", session_date(n))]},
            )
            ingest.append(ms)
    cold = []
    for _ in range(args["restarts"]):
        server.stop()
        server.start()
        with _client(server, 600.0) as c:
            ms, body = _post(
                c, f"/v1/users/{USER}/recall", {"question": make_question(rng), "top_k": 5}
            )
        t = body["timings"]
        cold.append(
            {
                "s": round(ms / 1000, 3),
                "index_load": t.get("index_load"),
                "index_ms": t.get("index_ms"),
            }
        )
    tokens, disk = tokens_and_disk(db_url, kind)
    w, s, g = summarize(warm), summarize(service), summarize(ingest)
    return {
        "sessions": sessions,
        "sessions_at_end": sessions + args["ingests"],
        "tokens": tokens,
        "store": kind,
        "disk_mb": disk,
        "warm_p50_ms": w["p50_ms"],
        "warm_p95_ms": w["p95_ms"],
        "service_total_p50_ms": s["p50_ms"],
        "rss_mb": rss,
        "cold_first_recall_s": [c["s"] for c in cold],
        "cold_first_recall": cold,
        "ingest_p50_ms": g["p50_ms"],
        "ingest_p95_ms": g["p95_ms"],
        "server_start_s": server.start_seconds[-args["restarts"] :],
    }


def run_store(
    kind: str, sizes: list[int], args: dict[str, int], pg_dsn: str, direct: bool = False
) -> list[dict[str, Any]]:
    rows = []
    rng = random.Random(0)
    with workspace() as ws:
        db = create_database(kind, ws, pg_dsn)
        try:
            write_config(ws / "serve.yaml", db.url, ProxyOptions())
            server = Server(ws / "serve.yaml", free_port(), new_key(), ws / "server.log")
            server.start()
            try:
                held = 0  # the user's sessions: seeded, and the timed ingests before
                for size in sorted(sizes):
                    if direct:
                        server.stop()
                        seconds = seed_direct(ws / "serve.yaml", held, size, rng)
                        server.start()
                    else:
                        seconds = seed(server, held, size, args["seed_batch"], rng)
                    vacuumed = vacuum(db.url, kind)
                    row = measure(server, db.url, kind, size, args, rng)
                    row["vacuum_s"] = vacuumed
                    row["seed"] = "direct, no bookmarks" if direct else "http"
                    row["seed_sessions_per_s"] = round((size - held) / seconds, 1)
                    held = row["sessions_at_end"]
                    rows.append(row)
                    print(row, flush=True)
            finally:
                server.stop()
        finally:
            db.cleanup()
    return rows


def report(result: dict[str, Any]) -> list[str]:
    runs: list[dict[str, Any]] = []
    for r in result["rows"]:
        if r["run"] not in runs:
            runs.append(r["run"])
    lines = [
        "# One user's history at scale",
        "",
        "Generated from `bench_scale.json` by `python -m eval.bench.bench_scale`; client and "
        "server on the same machine. Each row names its run:",
        "",
        *(
            f"{i}. `{run['command']}` at code version `{run['code_version']}`, {run['date']}; "
            f"{run['machine']}."
            for i, run in enumerate(runs, 1)
        ),
        "",
        "A store marked vacuumed was vacuumed and checkpointed after seeding (PostgreSQL's "
        "`VACUUM (ANALYZE)` and `CHECKPOINT`, as a history that grew over months is left); "
        "seeding marked direct went "
        "through the service's ingest in-process, without bookmarks.",
        "",
        "| run | sessions | tokens | store | seed sessions/s | disk MB | warm p50 / p95 ms | "
        "RSS MB | cold first recall s (index load, index ms) | ingest p50 / p95 ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    if max(r["sessions"] for r in result["rows"]) < FULL_SESSIONS:
        lines[3:3] = [
            f"**SMOKE RUN**: no history reached {FULL_SESSIONS:,} sessions; these rows check "
            "the script, not the service.",
            "",
        ]
    for r in result["rows"]:
        direct = " (direct)" if r.get("seed", "http") != "http" else ""
        store = r["store"] + (" (vacuumed)" if r.get("vacuum_s") is not None else "")
        cold = ", ".join(
            f"{c['s']} ({c['index_load']}, {c['index_ms']:.0f})" for c in r["cold_first_recall"]
        )
        lines.append(
            f"| {runs.index(r['run']) + 1} | {r['sessions']:,} | {r['tokens']:,} | {store} | "
            f"{r['seed_sessions_per_s']}{direct} | {r['disk_mb']} | {r['warm_p50_ms']} / "
            f"{r['warm_p95_ms']} | {r['rss_mb']} | {cold} | {r['ingest_p50_ms']} / "
            f"{r['ingest_p95_ms']} |"
        )
    return lines + [""]


def main(
    sessions: Annotated[list[int], typer.Option(help="history sizes, grown in turn")] = [10_000],  # noqa: B006
    db: Annotated[list[str], typer.Option(help="sqlite and/or postgres")] = ["sqlite"],  # noqa: B006
    seed_batch: Annotated[
        int, typer.Option(help="sessions an ingest while seeding (the limit: 200)")
    ] = 200,
    questions: Annotated[int, typer.Option(help="warm recalls timed at each size")] = 200,
    warmup: Annotated[int, typer.Option(help="recalls before the timed ones")] = 5,
    ingests: Annotated[int, typer.Option(help="single-session ingests timed at each size")] = 50,
    restarts: Annotated[int, typer.Option(help="server restarts, each a cold first recall")] = 2,
    pg_dsn: Annotated[
        str, typer.Option(help="PostgreSQL server for --db postgres")
    ] = DEFAULT_PG_DSN,
    out: Annotated[Path, typer.Option(help="the report (markdown; .json beside it)")] = OUT,
    keep: Annotated[
        bool, typer.Option(help="keep the report's rows of other stores and sizes")
    ] = True,
    seed_direct: Annotated[
        bool,
        typer.Option(
            "--seed-direct",
            help="seed through the service's ingest in-process, without bookmarks (for 1M)",
        ),
    ] = False,
) -> None:
    facts = machine()
    args = {
        "seed_batch": seed_batch,
        "questions": questions,
        "warmup": warmup,
        "ingests": ingests,
        "restarts": restarts,
    }
    sizes = sorted(sessions)
    if any(b <= a + ingests for a, b in zip(sizes, sizes[1:], strict=False)) or sizes[0] < 1:
        raise typer.BadParameter(
            f"sizes {sizes}: each must exceed the one before by more than --ingests ({ingests}), "
            "which the user keeps"
        )
    run = {
        "command": command_line(),
        "code_version": git_head(),
        "date": utc_now_text(),
        "machine": machine_line(facts, run=True),
    }
    rows = [
        {**row, "run": run}
        for kind in db
        for row in run_store(kind, sessions, args, pg_dsn, seed_direct)
    ]
    result = {"machine": facts, **{k: run[k] for k in ("command", "code_version", "date")}}
    result["rows"] = merged(out.with_suffix(".json"), rows) if keep else rows
    out.parent.mkdir(parents=True, exist_ok=True)
    write_report_files(out, report(result), result)


def merged(json_path: Path, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with the report's earlier rows of other (store, sessions): a size measured
    alone (100K takes most of an hour) joins the table, each row naming its own run."""
    key = {(r["store"], r["sessions"]) for r in rows}
    old: dict[str, Any] = json.loads(json_path.read_text()) if json_path.is_file() else {}
    # A report from before rows named their run: its rows are its top-level run's.
    top = {k: old.get(k) for k in ("command", "code_version", "date")}
    if "machine" in old:
        top["machine"] = machine_line(old["machine"], run=True)
    kept = [
        {"run": top, **r} for r in old.get("rows", []) if (r["store"], r["sessions"]) not in key
    ]
    order = {"sqlite": 0, "postgres": 1}
    return sorted(kept + rows, key=lambda r: (order.get(r["store"], 2), r["sessions"]))


if __name__ == "__main__":
    typer.run(main)
