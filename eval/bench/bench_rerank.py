"""``POST /v1/rerank`` latency, coarse-only (committed as eval/results/bench_rerank/bench_rerank.md
and .json).

One `memsifter serve` process (coarse-only, SQLite, one worker), then sequential rerank
requests of ``--documents`` short documents each (one to three sentences of the benchmarks'
synthetic chat, 10-24 words a sentence), one connection kept alive, as a rerank client would
call it: client latency percentiles, and the server process's CPU per request (/proc, user +
system). Sizes 10, 50 and 200 documents by default (200 is ``limits.max_sessions``). Every
answer is checked: 200, every index once, scores in [0, 1] and non-increasing. Linux only.

    python -m eval.bench.bench_rerank [--requests 500]
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from eval.bench.bench_load import http_client
from eval.common import (
    RESULTS,
    Server,
    coarse_sqlite_server,
    command_line,
    cpu_seconds,
    fmt_ms,
    machine,
    make_question,
    make_session,
    run_header,
    session_date,
    summarize,
    utc_now_text,
    write_report_files,
)


def documents(rng: random.Random, n: int) -> list[str]:
    out = []
    for i in range(n):
        turns = make_session(rng, f"d{i}", session_date(i), n_turns=rng.randint(1, 3))["turns"]
        out.append(" ".join(t["text"] for t in turns))
    return out


def check(body: dict[str, Any], n: int) -> None:
    results = body["results"]
    scores = [r["relevance_score"] for r in results]
    if sorted(r["index"] for r in results) != list(range(n)):
        raise RuntimeError("a rerank answer did not return every document once")
    if any(not 0 <= s <= 1 for s in scores) or scores != sorted(scores, reverse=True):
        raise RuntimeError(f"scores out of [0, 1] or rising down the list: {scores[:5]}")


async def measure(server: Server, sizes: list[int], requests: int) -> list[dict[str, Any]]:
    rng = random.Random(0)
    assert server.proc is not None
    pid = server.proc.pid
    rows = []
    async with http_client(server, 60.0) as client:
        for n in sizes:
            bodies = [
                {"model": "memsifter", "query": make_question(rng), "documents": documents(rng, n)}
                for _ in range(requests + 20)
            ]
            for body in bodies[:20]:  # warm: the threadpool, the tokenizer's caches
                async with client.post("/v1/rerank", json=body) as r:
                    check(await r.json(), n)
            latencies, errors = [], 0
            c0 = cpu_seconds(pid)
            for body in bodies[20:]:
                t0 = time.perf_counter()
                async with client.post("/v1/rerank", json=body) as r:
                    answer = await r.json()
                    latencies.append((time.perf_counter() - t0) * 1000)
                    if r.status != 200:
                        errors += 1
                        continue
                check(answer, n)
            cpu_ms = 1000 * (cpu_seconds(pid) - c0) / requests
            words = sum(len(d.split()) for b in bodies for d in b["documents"]) / len(bodies) / n
            rows.append(
                {
                    "documents": n,
                    "words_per_document": round(words, 1),
                    "requests": requests,
                    "latency_ms": summarize(latencies),
                    "server_cpu_ms": round(cpu_ms, 2),
                    "errors": errors,
                }
            )
    return rows


def main(
    sizes: Annotated[str, typer.Option(help="documents per request, comma-separated")] = (
        "10,50,200"
    ),
    requests: Annotated[int, typer.Option(help="sequential requests per size")] = 500,
    out: Annotated[Path, typer.Option()] = RESULTS / "bench_rerank" / "bench_rerank.md",
) -> None:
    info, started = machine(), utc_now_text()
    with coarse_sqlite_server() as server:
        rows = asyncio.run(measure(server, [int(s) for s in sizes.split(",")], requests))
    result = {
        "date": started,
        "command": command_line(),
        "machine": info,
        "rows": rows,
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    }
    at_50 = next((r for r in rows if r["documents"] == 50), None)
    verdict = (
        f"50 documents: p50 **{fmt_ms(at_50['latency_ms']['p50_ms'])} ms** (goal <= 5 ms: "
        f"{'met' if at_50['latency_ms']['p50_ms'] <= 5 else 'not met'})."
        if at_50
        else ""
    )
    lines = [
        "# /v1/rerank latency, coarse-only",
        "",
        *run_header(result, "Client and server share the machine."),
        "`memsifter serve`, coarse-only (BM25), SQLite, one worker. Sequential requests on one "
        "kept-alive connection (aiohttp); latency is the client's, request sent to JSON read. "
        "Documents: one to three sentences of synthetic chat each. Server CPU: the server "
        "process's user + system time (/proc) over the requests, divided by their number. "
        "Every answer was checked (all indexes once, scores in [0, 1], non-increasing).",
        "",
        "| documents | words/doc | n | p50 ms | p95 ms | p99 ms | max ms | server CPU ms "
        "| errors |",
        "|---|---|---|---|---|---|---|---|---|",
        *(
            f"| {r['documents']} | {r['words_per_document']} | {r['requests']} | "
            f"{fmt_ms(r['latency_ms']['p50_ms'])} | {fmt_ms(r['latency_ms']['p95_ms'])} | "
            f"{fmt_ms(r['latency_ms']['p99_ms'])} | {fmt_ms(r['latency_ms']['max_ms'])} | "
            f"{r['server_cpu_ms']} | {r['errors']} |"
            for r in rows
        ),
        "",
        verdict,
        "",
    ]
    write_report_files(out, lines, result)


if __name__ == "__main__":
    typer.run(main)
