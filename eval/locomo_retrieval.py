"""Build eval/results/locomo_retrieval.md: every offline coarse filter on full LoCoMo, native and
32k haystacks. Runs `memsifter eval retrieval` for each haystack (or, with --reuse, reads the
metrics.json files such runs already wrote) and renders one table with the machine it ran on.

    python eval/locomo_retrieval.py --data ../shared/data/locomo/locomo10.json
"""

from __future__ import annotations

import dataclasses
import json
import os
from datetime import date
from pathlib import Path
from typing import Annotated

import typer

from memsifter.config import load_config
from memsifter.evaluation.retrieval import (
    RetrievalEvalConfig,
    RetrieverResult,
    render_table,
    run_retrieval_eval,
    slug,
)
from memsifter.machine import cpu_model, memory_gib

ROOT = Path(__file__).resolve().parents[1]


def main(
    data: Annotated[str, typer.Option()] = "../shared/data/locomo/locomo10.json",
    out: Annotated[Path, typer.Option()] = Path("outputs"),
    reuse: Annotated[bool, typer.Option(help="read existing outputs/locomo_*/")] = False,
    result: Annotated[Path, typer.Option()] = ROOT / "eval/results/locomo_retrieval.md",
) -> None:
    base = load_config(RetrievalEvalConfig, ROOT / "configs/eval/locomo_retrieval.yaml")
    sections = []
    for haystack in ("native", "32k"):
        cfg = dataclasses.replace(
            base, data=data, haystack=haystack, out=str(out / f"locomo_{haystack}")
        )
        if reuse:
            results = [
                RetrieverResult(
                    r, json.loads((Path(cfg.out) / slug(r) / "metrics.json").read_text()), {}
                )
                for r in cfg.retrievers
            ]
        else:
            results = run_retrieval_eval(cfg)
        ctx = results[0].metrics
        note = f"{ctx['haystack_sessions_mean']:.1f} sessions per haystack on average"
        if "haystack_tokens_mean" in ctx:
            note += f", {ctx['haystack_tokens_mean']:.0f} approx tokens"
        sections.append((haystack, note, render_table(results, haystack)))
    lines = [
        "# LoCoMo retrieval: offline coarse filters",
        "",
        "Data: `locomo10.json` (1,986 questions; 1,982 with usable evidence "
        "are scored). Gold = sessions named by evidence ids. Metrics by ir-measures.",
        f"Machine: {cpu_model()}, {os.cpu_count()} cores, {memory_gib()} GiB; "
        f"{date.today().isoformat()}.",
        "Latency is per query with the haystack already indexed (sessions embedded once); these",
        "runs shared the 2 cores with other jobs (OMP_NUM_THREADS=2), so take p95 loosely and see",
        "`scripts/bench_coarse.md` for controlled timings. Dense filters score a session by its",
        "best ~160-token passage (MaxP). BGE-M3 needs hub weights: not in this offline table.",
        "",
        "Made with:",
        "",
        "```bash",
        "memsifter eval retrieval --config configs/eval/locomo_retrieval.yaml "
        "--data ../shared/data/locomo/locomo10.json --haystack native --out outputs/locomo_native",
        "memsifter eval retrieval --config configs/eval/locomo_retrieval.yaml "
        "--data ../shared/data/locomo/locomo10.json --haystack 32k --out outputs/locomo_32k",
        "python eval/locomo_retrieval.py --reuse   # renders this file from those outputs",
        "```",
        "",
    ]
    for haystack, note, table in sections:
        lines += [f"## Haystack: {haystack} ({note})", "", table]
    result.parent.mkdir(parents=True, exist_ok=True)
    result.write_text("\n".join(lines))
    typer.echo(result.read_text())


if __name__ == "__main__":
    typer.run(main)
