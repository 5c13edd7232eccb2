"""Can a tiny proxy learn to *point* in the memory gym at all? A supervised probe.

    python eval/gym_pointer_probe.py                  # both shapes, ~12 min on 2 cores
    python eval/gym_pointer_probe.py --arch qwen3 --steps 200

The RL recipes must discover the useful session from rewards; this probe asks the easier
question first. It trains the tiny gym proxy with plain cross-entropy on the first ranking id
(the useful session's position, the answer RL is after) on the train users of the benchmark's
world, and reports validation accuracy of that first id by step. It is not a recipe: it uses the
useful label, which the learnability benchmark never trains on. If supervised learning cannot
leave chance within a budget, no reward-driven recipe will within it either.

Writes ``eval/results/gym_pointer_probe.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from gym_learnability import WORLD  # noqa: E402  (eval/ is this script's sys.path[0])


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
    from gym_learnability import build_data
    from transformers import AutoModelForCausalLM, AutoTokenizer

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", action="append", choices=["qwen3", "gpt2"])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--out", default=str(ROOT / "outputs/gym_probe"))
    ap.add_argument("--results", default=str(ROOT / "eval/results"))
    args = ap.parse_args()
    from memsifter.machine import machine_facts, machine_line

    archs = args.arch or ["qwen3", "gpt2"]
    curves = {a: probe(a, args.steps, args.lr, args.batch_size, Path(args.out)) for a in archs}
    res = Path(args.results)
    res.mkdir(parents=True, exist_ok=True)
    result = {
        "world": WORLD,
        "split": "validation",
        "n": 200,
        "steps": args.steps,
        "lr": args.lr,
        "batch_size": args.batch_size,
        "curves": curves,
        "machine": machine_line(machine_facts(), run=True),
    }
    (res / "gym_pointer_probe.json").write_text(json.dumps(result, indent=1) + "\n")
    steps = sorted({p["step"] for c in curves.values() for p in c})
    lines = [
        "# Memory gym: can a tiny proxy learn to point? (supervised probe)",
        "",
        f"`python eval/gym_pointer_probe.py{''.join(f' --arch {a}' for a in args.arch or [])} "
        f"--steps {args.steps}` ({result['machine']}). "
        f"Cross-entropy on the first ranking id = the useful session, batch {args.batch_size}, "
        f"AdamW lr {args.lr}, world `{WORLD}` (5 candidates, chance 0.2); validation users, "
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
    main()
