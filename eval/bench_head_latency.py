"""Serving latency of the first-token ranking head on 2 cores (committed as
eval/bench_head_latency.{md,json}):

1. **The README's curl** (`What is my dog called?`, top 2) against `memsifter serve --config
   configs/serve/first_token_proxy.yaml --seed-sample`, once and then ``--repeats`` times (the
   service, its HTTP stack, the coarse filter and the head: what a user measures);
2. **1K-token LoCoMo prompts**: the head's test prompts of the CPU recipe
   (``data/rl/locomo_smollm2_first_token``, the 1,024-token window, built when missing), one at
   a time, timed from the rendered prompt to the ranking (one forward pass), beside the generate
   recipe's greedy decode of the same questions (``data/rl/locomo_smollm2``, up to 48 tokens).

Both use SmolLM2-135M-Instruct's weights: a trained head or adapter has the same shape, so the
same cost. Goals (issue 24): recall p50 <= 0.5 s, a 1K-token prompt p50 <= 1.5 s.

    python eval/bench_head_latency.py [--repeats 9] [--prompts 30]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
HEAD = ("configs/data/locomo_smollm2_first_token.yaml", "data/rl/locomo_smollm2_first_token")
GENERATE = ("configs/data/locomo_smollm2_cpu.yaml", "data/rl/locomo_smollm2")


def _rows(recipe: str, folder: str) -> list[dict[str, Any]]:
    from datasets import load_dataset

    path = ROOT / folder
    if not (path / "test.parquet").is_file():
        subprocess.run(
            [sys.executable, "-m", "memsifter.cli", "data", "rl", "--recipe", recipe,
             "--out", str(path)],
            cwd=ROOT, check=True,
        )  # fmt: skip
    rows = load_dataset("parquet", data_files=str(path / "test.parquet"), split="train")
    return sorted((dict(r) for r in rows), key=lambda r: r["qid"])


def _stats(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {
        "n": len(xs),
        "p50_s": statistics.median(xs),
        "p95_s": xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))],
        "max_s": xs[-1],
    }


def prompt_latency(n: int, threads: int) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memsifter.models import resolve_model
    from memsifter.ranker.first_token import rank_prompts

    torch.set_num_threads(threads)
    path = resolve_model("smollm2-135m-instruct").path
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    head = _rows(*HEAD)[:n]
    by_qid = {r["qid"]: r for r in _rows(*GENERATE)}
    tokens = [len(tok(r["prompt"], add_special_tokens=False)["input_ids"]) for r in head]
    rank_prompts(model, tok, [head[0]["prompt"]], [int(head[0]["n_candidates"])])  # warm-up
    head_s = []
    for r in head:
        t0 = time.perf_counter()
        rank_prompts(model, tok, [r["prompt"]], [int(r["n_candidates"])], batch_size=1)
        head_s.append(time.perf_counter() - t0)
    gen_s, gen_tokens = [], []
    with torch.no_grad():
        for r in head:
            g = by_qid[r["qid"]]
            ids = tok(g["prompt"], add_special_tokens=False, return_tensors="pt")["input_ids"]
            t0 = time.perf_counter()
            out = model.generate(ids, max_new_tokens=48, do_sample=False)
            gen_s.append(time.perf_counter() - t0)
            gen_tokens.append(out.shape[1] - ids.shape[1])
    return {
        "prompt_tokens": {"mean": statistics.mean(tokens), "max": max(tokens)},
        "first_token": _stats(head_s),
        "generate": {**_stats(gen_s), "completion_tokens_mean": statistics.mean(gen_tokens)},
    }


def main(
    repeats: Annotated[int, typer.Option(help="curls after the first")] = 9,
    prompts: Annotated[int, typer.Option(help="LoCoMo test prompts timed")] = 30,
    threads: Annotated[int, typer.Option()] = 2,
) -> None:
    from bench_first_curl import first_curls
    from benchlib import machine, machine_line

    facts = machine()
    with tempfile.TemporaryDirectory(prefix="memsifter-head-curl-") as tmp:
        curl = first_curls("first_token", threads, repeats, Path(tmp))
    prompt = prompt_latency(prompts, threads)
    report = {"machine": facts, "curl": curl, "prompts": prompt}
    (HERE / "bench_head_latency.json").write_text(json.dumps(report, indent=2) + "\n", "utf-8")
    h, g = prompt["first_token"], prompt["generate"]
    lines = [
        "# Serving latency of the first-token ranking head",
        "",
        f"Machine: {machine_line(facts, run=True)}. Command: `python eval/bench_head_latency.py`"
        f" ({threads} threads). Weights: SmolLM2-135M-Instruct (a trained head has the same "
        "shape and cost).",
        "",
        "## The README's curl (`memsifter serve --config configs/serve/first_token_proxy.yaml "
        "--seed-sample`)",
        "",
        "| ready s | first curl s | repeat p50 s | repeat max s | ranker |",
        "|---|---|---|---|---|",
        f"| {curl['ready_s']:.1f} | {curl['first_s']:.3f} | {curl['repeat_median_s']:.3f} | "
        f"{curl['repeat_max_s']:.3f} | `{curl['ranker']}` |",
        "",
        f"Goal: p50 <= 0.5 s. {repeats} repeats after the first.",
        "",
        f"## {h['n']} LoCoMo test prompts of the CPU recipe (1,024-token window; "
        f"{prompt['prompt_tokens']['mean']:.0f} tokens on average, at most "
        f"{prompt['prompt_tokens']['max']})",
        "",
        "| head | p50 s | p95 s | max s | generated tokens |",
        "|---|---|---|---|---|",
        f"| first_token (one forward pass) | {h['p50_s']:.3f} | {h['p95_s']:.3f} | "
        f"{h['max_s']:.3f} | 0 |",
        f"| generate (greedy, up to 48 tokens) | {g['p50_s']:.3f} | {g['p95_s']:.3f} | "
        f"{g['max_s']:.3f} | {g['completion_tokens_mean']:.1f} |",
        "",
        "Goal: first_token p50 <= 1.5 s. One prompt at a time, from the rendered text to the "
        "ranking (tokenising included); the same questions in both rows.",
    ]
    (HERE / "bench_head_latency.md").write_text("\n".join(lines) + "\n", "utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    typer.run(main)
