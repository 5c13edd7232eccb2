"""Building the proxy's prompt, as the recall service does (committed as
eval/results/bench_prompt/bench_prompt.md).

One user's pages as ``bench_load.py`` seeds them (4-turn sessions, one an hour), tokenized once
as ingest does (``PromptBuilder.warm``); then prompts of ``--candidates`` pages drawn at random
for random questions, built the two ways the builder can: from cached token ids (what the
service sends) and as rendered text counted whole (what a tokenizer that fails the builder's
probe gets). Each prompt's build is timed alone, in this one process (no server, no client).

    python -m eval.bench.bench_prompt [--pages 2000] [--candidates 40] [--prompts 300]
"""

from __future__ import annotations

import os
import random
import time
from hashlib import sha256
from pathlib import Path
from typing import Annotated, Any

import typer

from eval.common import (
    RESULTS,
    command_line,
    machine,
    make_question,
    make_session,
    run_header,
    session_date,
    summarize,
    utc_now_text,
    write_report_files,
)
from memsifter.data.types import Session, Turn


def _pages(n: int, rng: random.Random) -> list[Session]:
    from datetime import datetime

    out = []
    for i in range(n):
        d = make_session(rng, f"s{i}", session_date(i))
        turns = tuple(Turn(t["speaker"], t["text"]) for t in d["turns"])
        out.append(Session(id=d["id"], turns=turns, date=datetime.fromisoformat(d["date"])))
    return out


def main(
    model: Annotated[str, typer.Option(help="whose tokenizer and chat template")] = (
        "smollm2-135m-instruct"
    ),
    pages: Annotated[int, typer.Option(help="the user's pages")] = 2000,
    candidates: Annotated[int, typer.Option(help="pages per prompt (max_candidates)")] = 40,
    prompts: Annotated[int, typer.Option(help="prompts timed per way")] = 300,
    window: Annotated[int, typer.Option(help="window tokens")] = 8192,
    completion: Annotated[int, typer.Option(help="completion tokens")] = 1024,
    out: Annotated[Path, typer.Option(help="report .md (the .json goes next to it)")] = (
        RESULTS / "bench_prompt" / "bench_prompt.md"
    ),
    dump: Annotated[
        Path | None,
        typer.Option(help="also write each prompt's sha256 (text and ids), to compare commits"),
    ] = None,
) -> None:
    from memsifter.models import load_tokenizer
    from memsifter.ranker.prompt import PromptBuilder

    started, info = utc_now_text(), machine()
    rng = random.Random(0)
    tokenizer = load_tokenizer(model)
    history = _pages(pages, rng)
    draws = [
        (make_question(rng), [history[i] for i in sorted(rng.sample(range(pages), candidates))])
        for _ in range(prompts)
    ]
    rows: list[dict[str, Any]] = []
    digests: list[str] = []
    for way in ("token ids", "text"):
        builder = PromptBuilder(tokenizer, window, completion)
        if way == "text":
            builder.token_ids_off = "forced by the benchmark"
        for page in history:  # at ingest, outside the timed builds
            builder.warm(page)
        for question, shown in draws[:20]:  # warm: label and template caches
            builder.build(question, shown)
        times, n_tokens = [], []
        for question, shown in draws:
            t0 = time.perf_counter()
            built = builder.build(question, shown)
            times.append((time.perf_counter() - t0) * 1000)
            n_tokens.append(built.n_tokens)
            digests.append(
                f"{way}\t{sha256(built.text.encode()).hexdigest()}\t"
                f"{sha256(repr(built.token_ids).encode()).hexdigest()}"
            )
        rows.append(
            {
                "way": way,
                "prompts": prompts,
                "mean_tokens": round(sum(n_tokens) / len(n_tokens)),
                "build_ms": summarize(times),
            }
        )
    result = {
        "date": started,
        "command": command_line(),
        "machine": info,
        "model": model,
        "params": {"pages": pages, "candidates": candidates, "window": window},
        "rows": rows,
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    }
    lines = [
        "# Building the proxy's prompt",
        "",
        *run_header(result),
        f"`{model}`'s tokenizer and chat template; one user's {pages} pages (4-turn sessions, "
        f"one an hour, as `bench_load.py` seeds), tokenized at ingest; {prompts} prompts of "
        f"{candidates} pages drawn at random for random questions, window {window} "
        f"(completion {completion}). Each build timed alone, after 20 warm-up builds.",
        "",
        "| way | prompts | mean tokens | p50 ms | p95 ms | mean ms |",
        "|---|---|---|---|---|---|",
        *(
            f"| {r['way']} | {r['prompts']} | {r['mean_tokens']} | {r['build_ms']['p50_ms']} | "
            f"{r['build_ms']['p95_ms']} | {r['build_ms']['mean_ms']} |"
            for r in rows
        ),
        "",
        "token ids: the prompt assembled from cached per-page ids (what the recall service sends "
        "to a server); text: rendered with the chat template and counted whole, the path of a "
        "tokenizer that fails the builder's probe.",
        "",
    ]
    write_report_files(out, lines, result)
    if dump is not None:
        dump.write_text("\n".join(digests) + "\n")


if __name__ == "__main__":
    typer.run(main)
