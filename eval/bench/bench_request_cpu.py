"""Server CPU per request of the recall service (committed as
eval/results/bench_request_cpu/bench_request_cpu.md).

Client latency mixes the server's work with the client's and the scheduler's; this reads the
server process's own CPU time (/proc, user + system) around N sequential requests, so the cost
of one recall and of one ingest can be compared, and what limits throughput on 2 cores seen.
One `memsifter serve` (coarse-only, SQLite), one user seeded with --sessions sessions; then N
recalls on that user (top_k 5) and N ingests of one 4-turn session, spread over 50 other users
as `bench_load.py`'s load phase does. Linux only.

    python -m eval.bench.bench_request_cpu [--sessions 10000] [--requests 300]
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from eval.bench.bench_load import http_client, ingest_once, recall_once, seed_user
from eval.common import (
    RESULTS,
    Server,
    coarse_sqlite_server,
    command_line,
    cpu_seconds,
    machine,
    make_question,
    make_session,
    run_header,
    session_date,
    utc_now_text,
    write_report_files,
)


async def measure(server: Server, sessions: int, requests: int) -> dict[str, Any]:
    rng = random.Random(0)
    seed_s = await seed_user(server, sessions, 200, rng, 120.0)
    assert server.proc is not None
    pid = server.proc.pid
    out: dict[str, Any] = {"seed_seconds": round(seed_s, 1)}
    async with http_client(server, 60.0) as client:
        for _ in range(20):  # warm: the user's index, caches, the threadpool
            await recall_once(client, server, make_question(rng), 5)
        c0, t0 = cpu_seconds(pid), time.perf_counter()
        recalls = [
            await recall_once(client, server, make_question(rng), 5) for _ in range(requests)
        ]
        errors = sum(not s.ok for s in recalls)
        out["recall"] = (cpu_seconds(pid) - c0, time.perf_counter() - t0, errors)
        c0, t0 = cpu_seconds(pid), time.perf_counter()
        errors = 0
        for i in range(requests):
            session = make_session(rng, f"cpu-{i}", session_date(i))
            errors += (await ingest_once(client, server, f"cpu{i % 50}", session)).status != "201"
        out["ingest"] = (cpu_seconds(pid) - c0, time.perf_counter() - t0, errors)
    return out


def main(
    sessions: Annotated[int, typer.Option(help="sessions seeded for the recalled user")] = 10_000,
    requests: Annotated[int, typer.Option(help="sequential requests of each kind")] = 300,
    out: Annotated[Path, typer.Option()] = RESULTS / "bench_request_cpu" / "bench_request_cpu.md",
) -> None:
    info, started = machine(), utc_now_text()
    with coarse_sqlite_server() as server:
        got = asyncio.run(measure(server, sessions, requests))
    rows = []
    for op in ("recall", "ingest"):
        cpu_s, wall_s, errors = got[op]
        rows.append(
            {
                "op": op,
                "requests": requests,
                "server_cpu_ms": round(1000 * cpu_s / requests, 2),
                "wall_ms": round(1000 * wall_s / requests, 2),
                "errors": errors,
            }
        )
    result = {
        "date": started,
        "command": command_line(),
        "machine": info,
        "sessions": sessions,
        "seed_seconds": got["seed_seconds"],
        "rows": rows,
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    }
    lines = [
        "# Recall service: server CPU per request",
        "",
        *run_header(result, "Client and server share the machine."),
        f"`memsifter serve`, coarse-only, SQLite, one worker; one user seeded with {sessions} "
        f"sessions ({got['seed_seconds']} s). Server CPU: the server process's user + system "
        "time (/proc) over the requests, divided by their number; wall: the client's time per "
        "request, one at a time. Recall: top_k 5 on the seeded user. Ingest: one 4-turn "
        "session into one of 50 other users.",
        "",
        "| request | n | server CPU ms | wall ms | errors |",
        "|---|---|---|---|---|",
        *(
            f"| {r['op']} | {r['requests']} | {r['server_cpu_ms']} | {r['wall_ms']} | "
            f"{r['errors']} |"
            for r in rows
        ),
        "",
    ]
    write_report_files(out, lines, result)


if __name__ == "__main__":
    typer.run(main)
