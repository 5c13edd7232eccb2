"""Serving latency of the first-token ranking head on 2 cores (committed as
eval/results/bench_head_latency/bench_head_latency.{md,json}):

1. **The README's curl** (`What is my dog called?`, top 2) against `memsifter serve --config
   configs/serve/first_token_proxy.yaml --seed-sample`, once and then ``--repeats`` times (the
   service, its HTTP stack, the coarse filter and the head: what a user measures);
2. **1K-token LoCoMo prompts**: the head's test prompts of the CPU recipe
   (``data/rl/locomo_smollm2_first_token``, the 1,024-token window, built when missing), one at
   a time, timed from the rendered prompt to the ranking (one forward pass), beside the generate
   recipe's greedy decode of the same questions (``data/rl/locomo_smollm2``, up to 48 tokens).

Both use SmolLM2-135M-Instruct's weights: a trained head or adapter has the same shape, so the
same cost. Goals (issue 24): recall p50 <= 0.5 s, a 1K-token prompt p50 <= 1.5 s.

    python -m eval.bench.bench_head_latency [--repeats 9] [--prompts 60] [--dtype D ...]

Each curl and each prompt row runs in every ``--dtype`` (``proxy.dtype``: the in-process
weights); the first dtype is the reference the others' head rankings are compared with.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from eval.common import results, rl_data, split_rows

ROOT = Path(__file__).resolve().parents[2]
HEAD = ("configs/data/locomo_smollm2_first_token.yaml", "data/rl/locomo_smollm2_first_token")
GENERATE = ("configs/data/locomo_smollm2_cpu.yaml", "data/rl/locomo_smollm2")


def locomo_test_rows(recipe: str, folder: str) -> list[dict[str, Any]]:
    return sorted(split_rows(rl_data(recipe, folder), "test"), key=lambda r: r["qid"])


def _stats(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {
        "n": len(xs),
        "p50_s": statistics.median(xs),
        "p95_s": xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))],
        "max_s": xs[-1],
    }


def _head_pass(model: Any, tok: Any, rows: list[dict[str, Any]]) -> tuple[list[float], list]:
    """One prompt at a time: each one's seconds (rendered text to ranking) and ranking."""
    from memsifter.ranker.first_token import rank_prompts

    rank_prompts(model, tok, [rows[0]["prompt"]], [int(rows[0]["n_candidates"])])  # warm-up
    seconds, orders = [], []
    for r in rows:
        t0 = time.perf_counter()
        (order,) = rank_prompts(model, tok, [r["prompt"]], [int(r["n_candidates"])], batch_size=1)
        seconds.append(time.perf_counter() - t0)
        orders.append(list(order))
    return seconds, orders


def _agreement(reference: list[list[int]], other: list[list[int]]) -> dict[str, float]:
    """How ``other``'s rankings agree with ``reference``'s, prompt by prompt."""
    import numpy as np
    from scipy.stats import kendalltau

    taus = [
        1.0 if len(a) < 2 else float(kendalltau(np.argsort(a), np.argsort(b)).statistic)
        for a, b in zip(reference, other, strict=True)
    ]
    return {
        "n": len(reference),
        "top1": float(np.mean([a[0] == b[0] for a, b in zip(reference, other, strict=True)])),
        "identical": float(np.mean([a == b for a, b in zip(reference, other, strict=True)])),
        "kendall_tau_mean": float(np.mean(taus)),
    }


def prompt_latency(n: int, threads: int, dtypes: tuple[str, ...]) -> dict[str, Any]:
    """The head on ``n`` LoCoMo test prompts in each of ``dtypes`` (the first is the reference
    the others' rankings are compared with), and greedy decoding in float32."""
    import torch
    from transformers import AutoTokenizer

    from memsifter.models import load_causal_lm, resolve_model

    torch.set_num_threads(threads)
    path = resolve_model("smollm2-135m-instruct").path
    tok = AutoTokenizer.from_pretrained(path)
    head = locomo_test_rows(*HEAD)[:n]
    by_qid = {r["qid"]: r for r in locomo_test_rows(*GENERATE)}
    tokens = [len(tok(r["prompt"], add_special_tokens=False)["input_ids"]) for r in head]
    heads: dict[str, Any] = {}
    orders: dict[str, list[list[int]]] = {}
    model = None
    for dtype in dtypes:
        model = load_causal_lm(path, dtype).eval()
        seconds, orders[dtype] = _head_pass(model, tok, head)
        heads[dtype] = _stats(seconds)
        if dtype != dtypes[0]:
            heads[dtype]["agreement_with_" + dtypes[0]] = _agreement(
                orders[dtypes[0]], orders[dtype]
            )
    model = load_causal_lm(path, "float32").eval()
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
        "first_token": heads,
        "generate": {**_stats(gen_s), "completion_tokens_mean": statistics.mean(gen_tokens)},
    }


# Where a recall's time goes, by the functions cProfile attributes it to (cumulative, so each
# includes what it calls; the forward pass is the model's, the rest is ours).
PHASES = {
    "forward pass": ("memsifter/ranker/first_token.py", "_forward_scores"),
    "tokenising the head's prompt": ("memsifter/ranker/first_token.py", "_encode"),
    "prompt building (render, token counts)": ("memsifter/ranker/prompt.py", "build"),
    "waiting on a lock": ("~", "<method 'acquire' of '_thread.lock' objects>"),
}


def where_time_goes(threads: int, dtype: str, repeats: int, tmp: Path) -> dict[str, Any]:
    """The README curl's recall in process (the service without HTTP), ``repeats`` times
    untimed by a profiler (its p50) and ``repeats`` times under cProfile (each phase's share)."""
    import cProfile
    import dataclasses
    import os
    import pstats

    import torch

    from eval.bench.bench_first_curl import CONFIGS
    from memsifter.config import from_dict, read_yaml
    from memsifter.serving.config import ServeConfig
    from memsifter.serving.sample import SAMPLE_USER, seed_sample
    from memsifter.serving.services import build_services, close_services
    from memsifter.serving.store.records import Principal

    torch.set_num_threads(threads)
    raw = read_yaml(CONFIGS["first_token"])
    raw["proxy"] = {**raw["proxy"], "dtype": dtype}
    cfg = from_dict(ServeConfig, raw, file=str(CONFIGS["first_token"]))
    cfg = dataclasses.replace(cfg, db_url=f"sqlite:///{tmp / f'profile-{dtype}.db'}")
    os.environ.setdefault("MEMSIFTER_DEMO_KEY", "msk-profile-only")
    services = build_services(cfg, None)
    try:
        who = Principal(tenant_id="demo")
        seed_sample(services.memory, who.tenant_id)

        def recall() -> Any:
            return services.memory.recall(who, SAMPLE_USER, "What is my dog called?", top_k=2)

        recall()  # warm-up: the index, the first forward
        plain = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            recall()
            plain.append(time.perf_counter() - t0)
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        for _ in range(repeats):
            recall()
        prof.disable()
        profiled = (time.perf_counter() - t0) / repeats
    finally:
        close_services(services)
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    phases = {}
    for name, (file, func) in PHASES.items():
        cum = sum(v[3] for (f, _line, fn), v in stats.items() if fn == func and f.endswith(file))
        phases[name] = {"s_per_recall": cum / repeats, "share": cum / repeats / profiled}
    return {
        "dtype": dtype,
        "n": repeats,
        "in_process_p50_s": statistics.median(plain),
        "profiled_s_per_recall": profiled,
        "phases": phases,
    }


def main(
    repeats: Annotated[int, typer.Option(help="curls after the first")] = 9,
    prompts: Annotated[int, typer.Option(help="LoCoMo test prompts timed")] = 60,
    threads: Annotated[int, typer.Option()] = 2,
    dtype: Annotated[
        list[str] | None,
        typer.Option(help="head weights' dtypes; the first is the reference (repeatable)"),
    ] = None,
) -> None:
    from eval.bench.bench_first_curl import first_curls
    from eval.common import machine, machine_line

    dtypes = tuple(dtype or ("float32", "bfloat16"))
    facts = machine()
    curls = {}
    with tempfile.TemporaryDirectory(prefix="memsifter-head-curl-") as tmp:
        for d in dtypes:
            curls[d] = first_curls("first_token", threads, repeats, Path(tmp), dtype=d)
        profile = {d: where_time_goes(threads, d, repeats, Path(tmp)) for d in dtypes}
    prompt = prompt_latency(prompts, threads, dtypes)
    report = {"machine": facts, "curl": curls, "profile": profile, "prompts": prompt}
    (results("bench_head_latency") / "bench_head_latency.json").write_text(
        json.dumps(report, indent=2) + "\n", "utf-8"
    )
    g = prompt["generate"]
    ref = dtypes[0]
    lines = [
        "# Serving latency of the first-token ranking head",
        "",
        f"Machine: {machine_line(facts, run=True)}. Command: "
        "`python -m eval.bench.bench_head_latency`"
        f" ({threads} threads). Weights: SmolLM2-135M-Instruct (a trained head has the same "
        "shape and cost), in each dtype the service's `proxy.dtype` sets.",
        "",
        "## The README's curl (`memsifter serve --config configs/serve/first_token_proxy.yaml "
        "--seed-sample`)",
        "",
        "| proxy.dtype | ready s | first curl s | repeat p50 s | repeat max s | ranker |",
        "|---|---|---|---|---|---|",
    ]
    for d, curl in curls.items():
        lines.append(
            f"| {d} | {curl['ready_s']:.1f} | {curl['first_s']:.3f} | "
            f"{curl['repeat_median_s']:.3f} | {curl['repeat_max_s']:.3f} | `{curl['ranker']}` |"
        )
    lines += [
        "",
        f"Goal: p50 <= 0.5 s. {repeats} repeats after the first.",
        "",
        "### Where the time goes",
        "",
        "| proxy.dtype | HTTP round trip p50 s | in-process recall p50 s | "
        + " | ".join(PHASES)
        + " |",
        "|---|---|---|" + "---|" * len(PHASES),
    ]
    for d, p in profile.items():
        lines.append(
            f"| {d} | {curls[d]['repeat_median_s']:.3f} | {p['in_process_p50_s']:.3f} | "
            + " | ".join(
                f"{v['s_per_recall']:.3f} ({100 * v['share']:.0f}%)" for v in p["phases"].values()
            )
            + " |"
        )
    lines += [
        "",
        f"The same recall in process ({repeats} times; the service without HTTP), then under "
        "cProfile: each phase's seconds a recall, cumulative (with what it calls), and its share "
        "of the profiled recall. The HTTP round trip less the in-process recall is the HTTP "
        "stack, JSON and the client.",
        "",
        f"## {prompt['first_token'][ref]['n']} LoCoMo test prompts of the CPU recipe "
        "(1,024-token window; "
        f"{prompt['prompt_tokens']['mean']:.0f} tokens on average, at most "
        f"{prompt['prompt_tokens']['max']})",
        "",
        f"| head | dtype | p50 s | p95 s | max s | generated tokens | same top-1 as {ref} | "
        f"same ranking as {ref} | Kendall tau with {ref} |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for d, h in prompt["first_token"].items():
        a = h.get("agreement_with_" + ref)
        agree = (
            [f"{a['top1']:.3f}", f"{a['identical']:.3f}", f"{a['kendall_tau_mean']:.3f}"]
            if a
            else ["(reference)"] * 3
        )
        lines.append(
            f"| first_token (one forward pass) | {d} | {h['p50_s']:.3f} | {h['p95_s']:.3f} | "
            f"{h['max_s']:.3f} | 0 | " + " | ".join(agree) + " |"
        )
    lines += [
        f"| generate (greedy, up to 48 tokens) | float32 | {g['p50_s']:.3f} | {g['p95_s']:.3f} | "
        f"{g['max_s']:.3f} | {g['completion_tokens_mean']:.1f} | – | – | – |",
        "",
        "Goal: first_token p50 <= 1.5 s. One prompt at a time, from the rendered text to the "
        "ranking (tokenising included); the same questions in every row. Agreement: the same "
        f"prompts' head rankings against the {ref} ones (share with the same first candidate, "
        "share identical in full, mean Kendall tau).",
    ]
    (results("bench_head_latency") / "bench_head_latency.md").write_text(
        "\n".join(lines) + "\n", "utf-8"
    )
    print("\n".join(lines))


if __name__ == "__main__":
    typer.run(main)
