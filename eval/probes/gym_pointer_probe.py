"""Can a tiny proxy learn to *point* in the memory gym at all? A supervised probe.

    python -m eval.probes.gym_pointer_probe                  # both shapes, ~12 min on 2 cores
    python -m eval.probes.gym_pointer_probe --arch qwen3 --steps 200

The RL recipes must discover the useful session from rewards; this probe asks the easier
question first. It trains the tiny gym proxy with plain cross-entropy on the first ranking id
(the useful session's position, the answer RL is after) on the train users of the benchmark's
world, and reports validation accuracy of that first id by step. It is not a recipe: it uses the
useful label, which the learnability benchmark never trains on. If supervised learning cannot
leave chance within a budget, no reward-driven recipe will within it either.

Writes ``eval/results/gym_pointer_probe/gym_pointer_probe.{md,json}``.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from eval.probes.gym_learnability import WORLD

ROOT = Path(__file__).resolve().parents[2]


def batch(tok: Any, prompts: list[str], suffix: list[int]) -> tuple[Any, Any, Any]:
    import torch

    enc = [e + suffix for e in tok(prompts, add_special_tokens=False)["input_ids"]]
    width = max(map(len, enc))
    ids = torch.full((len(enc), width), tok.pad_token_id)
    mask = torch.zeros((len(enc), width), dtype=torch.long)
    for i, e in enumerate(enc):  # left padding, positions counted from the mask (as generate)
        ids[i, width - len(e) :] = torch.tensor(e)
        mask[i, width - len(e) :] = 1
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def probe(arch: str, steps: int, lr: float, batch_size: int, out: Path) -> list[dict[str, Any]]:
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eval.probes.gym_learnability import build_data
    from memsifter.testing.gym import build_gym_proxy

    proxy = build_gym_proxy(out / f"proxy-{arch}", arch=arch)
    data = build_data(proxy, out / "data", "configs/data/gym_tiny.yaml")  # generate-mode prompt
    split = {
        s: list(load_dataset("parquet", data_files=str(data / f"{s}.parquet"), split="train"))
        for s in ("train_pool", "validation")
    }
    train = [r for r in split["train_pool"] if r["useful_positions"]]
    val = [r for r in split["validation"] if r["useful_positions"]][:200]
    torch.manual_seed(0)
    rng = random.Random(0)
    tok = AutoTokenizer.from_pretrained(proxy)
    model = AutoModelForCausalLM.from_pretrained(proxy)
    suffix = tok("<ranking>", add_special_tokens=False)["input_ids"]
    digit = [tok(str(i), add_special_tokens=False)["input_ids"][0] for i in range(10)]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    curve: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for step in range(steps + 1):
        if step % 50 == 0:
            model.eval()
            hits = 0
            with torch.no_grad():
                for i in range(0, len(val), 25):
                    rows = val[i : i + 25]
                    ids, mask, pos = batch(tok, [r["prompt"] for r in rows], suffix)
                    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
                    for j, r in enumerate(rows):
                        first = int(logits[j, -1, digit[: r["n_candidates"]]].argmax())
                        hits += first in r["useful_positions"]
            curve.append(
                {
                    "step": step,
                    "val_acc@1": hits / len(val),
                    "seconds": round(time.perf_counter() - t0),
                }
            )
            print(arch, curve[-1], flush=True)
            model.train()
        if step == steps:
            break
        rows = rng.sample(train, batch_size)
        ids, mask, pos = batch(tok, [r["prompt"] for r in rows], suffix)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1]
        target = torch.tensor([digit[r["useful_positions"][0]] for r in rows])
        loss = torch.nn.functional.cross_entropy(logits, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return curve


def main(
    arch: Annotated[
        list[str] | None, typer.Option(help="qwen3 | gpt2 (repeatable; default both)")
    ] = None,
    steps: Annotated[int, typer.Option(help="training steps")] = 400,
    lr: Annotated[float, typer.Option(help="learning rate")] = 1e-3,
    batch_size: Annotated[int, typer.Option(help="prompts a step")] = 16,
    out: Annotated[str, typer.Option(help="work folder")] = str(ROOT / "outputs/gym_probe"),
    results: Annotated[str, typer.Option(help="report folder")] = str(
        ROOT / "eval/results/gym_pointer_probe"
    ),
) -> None:
    """Can a tiny proxy learn to point? Supervised on the useful session's id."""
    bad = sorted(set(arch or ()) - set(("qwen3", "gpt2")))
    if bad:
        raise typer.BadParameter(
            f"{bad}: choose from {list(('qwen3', 'gpt2'))}", param_hint="--arch"
        )
    from memsifter.machine import machine_facts, machine_line

    archs = arch or ["qwen3", "gpt2"]
    curves = {a: probe(a, steps, lr, batch_size, Path(out)) for a in archs}
    res = Path(results)
    res.mkdir(parents=True, exist_ok=True)
    result = {
        "world": WORLD,
        "split": "validation",
        "n": 200,
        "steps": steps,
        "lr": lr,
        "batch_size": batch_size,
        "curves": curves,
        "machine": machine_line(machine_facts(), run=True),
    }
    (res / "gym_pointer_probe.json").write_text(json.dumps(result, indent=1) + "\n")
    steps = sorted({p["step"] for c in curves.values() for p in c})
    lines = [
        "# Memory gym: can a tiny proxy learn to point? (supervised probe)",
        "",
        "`python -m eval.probes.gym_pointer_probe"
        f"{''.join(f' --arch {a}' for a in arch or [])} "
        f"--steps {steps}` ({result['machine']}). "
        f"Cross-entropy on the first ranking id = the useful session, batch {batch_size}, "
        f"AdamW lr {lr}, world `{WORLD}` (5 candidates, chance 0.2); validation users, "
        "n = 200 memory questions. Accuracy of the first id by step:",
        "",
        "| step | " + " | ".join(curves) + " |",
        "|---" * (len(curves) + 1) + "|",
    ]
    for s in steps:
        cells = [
            next((f"{p['val_acc@1']:.3f}" for p in c if p["step"] == s), "-")
            for c in curves.values()
        ]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    lines.append("")
    (res / "gym_pointer_probe.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    typer.run(main)
