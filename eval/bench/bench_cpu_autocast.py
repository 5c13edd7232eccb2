"""Does ``model.autocast: bf16`` pay on this CPU? One head-trainer step's cost, fp32 against bf16.

    python -m eval.bench.bench_cpu_autocast                 # ~2 min on 2 cores
    python -m eval.bench.bench_cpu_autocast --tokens 2048   # a longer prompt

The first-token trainers (``memsifter.training.pl_grpo``, ``listwise_sft``) spend a step on one
forward of the policy over each prompt and a backward through the adapted layers. This times
exactly that on the reading gym's policy (``configs/train/gym_read_pl_outcome.yaml``: SmolLM2-135M,
LoRA on the top 6 layers) with ``memsifter.training.grpo.load_policy`` and ``policy_autocast``:
a batch of ``--batch`` prompts of ``--tokens`` random token ids, the head's last-position logits,
a scalar of them backpropagated. Median of ``--repeats`` after one warm-up each. Also the
no-grad forward (what validation and eval do, in fp32 whatever the recipe says) and how far the
bf16 scores are from the fp32 ones on the same inputs.

Whether bf16 is faster depends on the CPU: AMX (``amx_bf16``) and AVX-512 BF16 units run its
matmuls natively; without them bf16 is emulated and slower. The JSON records the CPU flags.
Writes ``eval/results/bench_cpu_autocast/bench_cpu_autocast.{json,md}``.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from eval.common import command_line, git_dirty, git_head, machine, utc_now_text
from memsifter.machine import machine_line

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "eval" / "results" / "bench_cpu_autocast" / "bench_cpu_autocast"
RECIPE = ROOT / "configs" / "train" / "gym_read_pl_outcome.yaml"


def cpu_flags() -> list[str]:
    from memsifter.machine import cpu_flags as flags

    return sorted(f for f in ("amx_bf16", "avx512_bf16", "avx512f") if f in flags())


def measure(autocast: str, batch: int, tokens: int, repeats: int, threads: int) -> dict[str, Any]:
    import torch
    from peft import get_peft_model

    from memsifter.models import resolve_model
    from memsifter.training.config import load_train_config
    from memsifter.training.grpo import load_policy, policy_autocast

    torch.set_num_threads(threads)
    cfg = load_train_config(RECIPE, [f"model.autocast={autocast}"])
    model, _, peft_config = load_policy(cfg, str(resolve_model(cfg.model.name).path), cuda=False)
    model = get_peft_model(model, peft_config)
    model.train()
    ids = torch.randint(1000, 40000, (batch, tokens), generator=torch.Generator().manual_seed(0))
    step_s, fwd_s, nograd_s = [], [], []
    logits = None
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        with policy_autocast(cfg, cuda=False):
            out = model(input_ids=ids, logits_to_keep=1).logits[:, -1].float()
        t1 = time.perf_counter()
        model.zero_grad()
        out.logsumexp(-1).sum().backward()
        t2 = time.perf_counter()
        with torch.no_grad(), policy_autocast(cfg, cuda=False):
            logits = model(input_ids=ids, logits_to_keep=1).logits[:, -1].float()
        t3 = time.perf_counter()
        if i:  # the first pass warms the kernels and allocator
            fwd_s.append(t1 - t0)
            step_s.append(t2 - t0)
            nograd_s.append(t3 - t2)
    return {
        "autocast": autocast,
        "step_s": round(statistics.median(step_s), 3),
        "forward_s": round(statistics.median(fwd_s), 3),
        "nograd_forward_s": round(statistics.median(nograd_s), 3),
        "logits": logits,
    }


def cpu_key(record: dict[str, Any]) -> str:
    """One record a kind of CPU: its model and its bf16 units decide what autocast pays."""
    return (
        f"{record['machine'].get('cpu', '?')} ({', '.join(record['cpu_flags']) or 'no bf16 flags'})"
    )


def load_records() -> dict[str, Any]:
    """The committed records, one per kind of CPU (a file from before there were several holds
    one record: it becomes the first)."""
    path = OUT.with_suffix(".json")
    if not path.is_file():
        return {"records": []}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if "records" in data else {"records": [data]}


def merged(records: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """``records`` with ``result`` replacing the record of the same kind of CPU, or added."""
    kept = [r for r in records["records"] if cpu_key(r) != cpu_key(result)]
    return {"records": [*kept, result]}


def render(records: dict[str, Any]) -> str:
    lines = [
        "# A head-trainer step on CPU: fp32 against `model.autocast: bf16`",
        "",
        "One section per kind of CPU, each from its own run. Whether bf16 pays depends on the "
        "CPU's bf16 units (`amx_bf16`, `avx512_bf16`): without them torch emulates it.",
    ]
    for r in records["records"]:
        rows = r["rows"]
        lines += [
            "",
            f"## {cpu_key(r)}",
            "",
            f"Generated by `{r['command']}` at code version `{r['code_version']}` on "
            f"{r['date']}. Machine: {machine_line(r['machine'], run=True)}. CPU bf16 flags: "
            f"{', '.join(r['cpu_flags']) or 'none'}.",
            "",
            f"Batch {r['batch']} × {r['tokens']} tokens, SmolLM2-135M with LoRA on the top 6 "
            f"layers (`{r['recipe']}`), {r['threads']} threads, median of {r['repeats']} after "
            "a warm-up.",
            "",
            "| autocast | step (fwd + bwd) s | forward s | no-grad forward s |",
            "|---|---|---|---|",
            *(
                f"| {x['autocast']} | {x['step_s']} | {x['forward_s']} | {x['nograd_forward_s']} |"
                for x in rows
            ),
            "",
            f"Step speed-up {r['speedup_step']}×. bf16 vs fp32 last-position logits: largest "
            f"difference {r['max_abs_logit_diff']}, same argmax on "
            f"{r['same_argmax_share']:.2f} of the batch.",
        ]
    return "\n".join(lines) + "\n"


def main(
    batch: Annotated[int, typer.Option(help="prompts a step")] = 4,
    tokens: Annotated[int, typer.Option(help="the small rung's prompts: ~900")] = 900,
    repeats: Annotated[int, typer.Option(help="timed repeats (the median is reported)")] = 3,
    threads: Annotated[int, typer.Option(help="torch threads")] = 2,
) -> None:
    """One first-token trainer step and a no-grad forward, fp32 against bf16 autocast."""
    facts = machine()
    rows = [measure(a, batch, tokens, repeats, threads) for a in ("none", "bf16")]
    fp32, bf16 = rows[0].pop("logits"), rows[1].pop("logits")
    result = {
        "what": "one first-token trainer step (forward + backward, LoRA top 6) and a no-grad "
        "forward, fp32 vs model.autocast: bf16",
        "recipe": str(RECIPE.relative_to(ROOT)),
        "batch": batch,
        "tokens": tokens,
        "repeats": repeats,
        "threads": threads,
        "cpu_flags": cpu_flags(),
        "rows": rows,
        "speedup_step": round(rows[0]["step_s"] / rows[1]["step_s"], 2),
        "max_abs_logit_diff": round(float((fp32 - bf16).abs().max()), 3),
        "same_argmax_share": float((fp32.argmax(-1) == bf16.argmax(-1)).float().mean()),
        "date": utc_now_text(),
        "machine": facts,
        "command": command_line(),
        "code_version": git_head() + ("-dirty" if git_dirty("memsifter", "eval") else ""),
    }
    records = merged(load_records(), result)
    OUT.with_suffix(".json").write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")
    text = render(records)
    OUT.with_suffix(".md").write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    typer.run(main)
