"""Does the outcome reward's policy gradient find the useful session, stripped of everything
but the id? A probe of the RL signal, between the supervised pointer probe and the recipes.

    python -m eval.probes.gym_pg_probe                       # the committed grid, ~12 min on 2
    cores
    python -m eval.probes.gym_pg_probe --mode exact --scale mean --start proxy --seed 2 --steps 200

The policy is the tiny gym proxy read at one position: the benchmark's world rendered as the
generate-mode prompt (``configs/data/gym_tiny.yaml``) followed by ``<ranking>``, its logits over
the candidate ids. It starts either untrained (``--start proxy``) or from the format-only SFT
start (``--start sft``: random one-id rankings, ``configs/train/gym_sft.yaml``), the start the
generate-mode recipes use. Every id's reward is R_ans of the one-id ranking
``<ranking>i</ranking>`` from the reward service (``configs/rewards/gym_outcome.yaml``: the
gym's working LLM, tiers, s_0), exactly what GRPO pays that completion. Estimators:

* ``sample``: GRPO's, G ids sampled per prompt, advantages from the group;
* ``exact``: the expectation itself, sum_i p_i R_i (no sampling noise at all);
* ``pl``: the first-token head's, G whole rankings drawn by Gumbel top-k, scored as rankings,
  loss -A log PL(ranking) (what :mod:`memsifter.training.pl_grpo` trains).

``--scale``: ``group`` divides the advantage by the group's std (GRPO), ``mean`` by the group's
mean reward (with ``exact``: the gradient of log E[R], which on one-hot rewards is the
cross-entropy on the useful id), ``none`` by nothing. ``--kl`` adds beta * KL(p || p_start)
over the ids. 16 memory prompts of the train users a step, AdamW lr 1e-3, gradients clipped at
1. Reports validation accuracy of the greedy id (n = 200 memory questions of the validation
users) and the policy's entropy over the ids, every 25 steps. Writes
``eval/results/gym_pg_probe/gym_pg_probe.{md,json}`` (the grid) or prints one run.
"""

from __future__ import annotations

import copy
import json
import random
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from eval.common import results

ROOT = Path(__file__).resolve().parents[2]

# (mode, scale, start, seed, kl, steps): the runs behind docs/gym.md's findings 8 and 9
GRID: tuple[tuple[str, str, str, int, float, int], ...] = (
    ("sample", "group", "sft", 2, 0.0, 200),
    ("exact", "mean", "sft", 2, 0.0, 300),
    ("exact", "mean", "proxy", 2, 0.0, 300),
    ("sample", "group", "proxy", 2, 0.0, 300),
    ("sample", "mean", "proxy", 2, 0.0, 300),
    ("pl", "group", "proxy", 2, 0.0, 300),
)


# The generate-mode prompt (the probe appends <ranking> itself) and its format-only SFT start.
GENERATE_DATA = "configs/data/gym_tiny.yaml"
SFT = "configs/train/gym_sft.yaml"


def sft_start(built: dict[str, Path]) -> Path:
    """SFT on random one-id rankings (``configs/train/gym_sft.yaml``): the format, no relevance."""
    from eval.probes.gym_learnability import outputs_dir
    from memsifter.training.config import load_train_config
    from memsifter.training.loop import run_training

    out = outputs_dir(False) / "probe_sft"
    final = out / "sft" / "final"
    if not (final / "config.json").is_file():
        over = [f"output_dir={out}", f"data={built['data']}", f"model.name={built['proxy']}"]
        run_training(load_train_config(ROOT / SFT, over), until="sft")
    return final


def probe(
    mode: str,
    seed: int,
    kl: float,
    steps: int,
    lr: float,
    batch: int,
    group: int,
    scale: str,
    start: str = "sft",
) -> Any:
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eval.probes.gym_learnability import build, outputs_dir
    from eval.probes.gym_pointer_probe import batch as batch_ids
    from memsifter.ranker.first_token import gumbel_topk, pl_log_prob, ranking_text
    from memsifter.rewards import load_reward_config
    from memsifter.rewards.service import RewardService
    from memsifter.rewards.trl import make_reward_function

    built = build(outputs_dir(False), GENERATE_DATA)
    if start == "sft":
        built["start"] = sft_start(built)
    split = {
        s: [
            r
            for r in load_dataset(
                "parquet", data_files=str(built["data"] / f"{s}.parquet"), split="train"
            )
            if r["useful_positions"]
        ]
        for s in ("train", "validation")
    }
    train, val = split["train"], split["validation"][:200]
    fn = make_reward_function(
        RewardService.from_config(load_reward_config(ROOT / "configs/rewards/gym_outcome.yaml"))
    )
    fn.set_total_steps(steps)
    columns = [c for c in train[0] if c != "prompt"]
    cache: dict[str, list[float]] = {}

    def id_rewards(row: dict[str, Any]) -> list[float]:
        if row["qid"] not in cache:
            comps = [f"<ranking>{i}</ranking>" for i in range(row["n_candidates"])]
            cols = {c: [row[c]] * len(comps) for c in columns}
            cache[row["qid"]] = fn([row["prompt"]] * len(comps), comps, **cols)
        return cache[row["qid"]]

    tok = AutoTokenizer.from_pretrained(built["start"])
    model = AutoModelForCausalLM.from_pretrained(built["start"])
    ref = copy.deepcopy(model).eval()
    head = tok("<ranking>", add_special_tokens=False)["input_ids"]
    n = max(r["n_candidates"] for r in train)
    ids = [tok(str(i), add_special_tokens=False)["input_ids"] for i in range(n)]
    if any(len(t) != 1 for t in ids):
        raise ValueError("the probe needs single-token candidate ids")
    label = [t[0] for t in ids]

    ranked: dict[tuple[str, tuple[int, ...]], float] = {}

    def pl_rewards(row: dict[str, Any], orders: list[list[int]]) -> list[float]:
        todo = [o for o in orders if (row["qid"], tuple(o)) not in ranked]
        if todo:
            comps = [ranking_text(o) for o in todo]
            cols = {c: [row[c]] * len(comps) for c in columns}
            for o, r in zip(todo, fn([row["prompt"]] * len(comps), comps, **cols), strict=True):
                ranked[row["qid"], tuple(o)] = r
        return [ranked[row["qid"], tuple(o)] for o in orders]

    def id_logits(m: Any, rows: list[dict[str, Any]]) -> Any:
        x, mask, pos = batch_ids(tok, [r["prompt"] for r in rows], head)
        return m(input_ids=x, attention_mask=mask, position_ids=pos).logits[:, -1, label]

    def accuracy() -> float:
        model.eval()
        hit = 0
        with torch.no_grad():
            for i in range(0, len(val), 50):
                rows = val[i : i + 50]
                best = id_logits(model, rows).argmax(-1).tolist()
                hit += sum(b == r["useful_positions"][0] for b, r in zip(best, rows, strict=True))
        model.train()
        return hit / len(val)

    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    curve = [{"step": 0, "val_acc": accuracy(), "entropy": None}]
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        rows = rng.sample(train, batch)
        if mode != "pl":
            rewards = torch.tensor([id_rewards(r) for r in rows])
            logp = torch.log_softmax(id_logits(model, rows), -1)
        if mode == "pl":
            logits = id_logits(model, rows)
            logp = torch.log_softmax(logits, -1)
            drawn = gumbel_topk(logits, group)
            r = torch.tensor(
                [pl_rewards(row, d.tolist()) for row, d in zip(rows, drawn, strict=True)]
            )
            adv = r - r.mean(1, keepdim=True)
            if scale == "group":
                adv = adv / (r.std(1, keepdim=True) + 1e-4)
            elif scale == "mean":
                adv = adv / r.mean(1, keepdim=True).clamp_min(1e-4)
            loss = -(adv * pl_log_prob(logits, drawn)).mean()
        elif mode == "exact" and scale == "mean":
            loss = -torch.log((logp.exp() * rewards).sum(-1).clamp_min(1e-6)).mean()
        elif mode == "exact":
            loss = -(logp.exp() * rewards).sum(-1).mean()
        else:
            drawn = torch.multinomial(logp.exp().detach(), group, replacement=True)
            r = rewards.gather(1, drawn)
            adv = r - r.mean(1, keepdim=True)
            if scale == "group":
                adv = adv / (r.std(1, keepdim=True) + 1e-4)
            elif scale == "mean":
                adv = adv / r.mean(1, keepdim=True).clamp_min(1e-4)
            loss = -(adv * logp.gather(1, drawn)).mean()
        if kl:
            with torch.no_grad():
                logp_ref = torch.log_softmax(id_logits(ref, rows), -1)
            loss = loss + kl * (logp.exp() * (logp - logp_ref)).sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 25 == 0:
            entropy = float(-(logp.exp() * logp).sum(-1).mean().detach())
            curve.append({"step": step, "val_acc": accuracy(), "entropy": round(entropy, 3)})
            print(mode, scale, seed, kl, curve[-1], f"{time.perf_counter() - t0:.0f} s", flush=True)
    return curve


def main(
    mode: Annotated[
        str | None, typer.Option(help="sample | exact | pl: one run instead of the grid")
    ] = None,
    seed: Annotated[int, typer.Option(help="prompt order and sampling seed")] = 0,
    kl: Annotated[float, typer.Option(help="beta of KL(p || p_start)")] = 0.0,
    steps: Annotated[int, typer.Option(help="training steps")] = 150,
    lr: Annotated[float, typer.Option(help="learning rate")] = 1e-3,
    batch: Annotated[int, typer.Option(help="prompts a step")] = 16,
    group: Annotated[int, typer.Option(help="ids sampled a prompt (sample mode)")] = 8,
    scale: Annotated[
        str,
        typer.Option(help="advantage scale: group (GRPO's group std), mean (log E[R]) or none"),
    ] = "group",
    start: Annotated[
        str, typer.Option(help="sft (the format-only SFT start) or proxy (the untrained proxy)")
    ] = "sft",
) -> None:
    """Does the policy gradient on the outcome reward find the useful session's id?"""
    for value, allowed, opt in (
        (mode, ("sample", "exact", "pl", None), "--mode"),
        (scale, ("group", "mean", "none"), "--scale"),
        (start, ("sft", "proxy"), "--start"),
    ):
        if value not in allowed:
            raise typer.BadParameter(f"{value!r}: choose from {allowed}", param_hint=opt)

    import torch

    from memsifter.machine import machine_facts, machine_line

    torch.set_num_threads(2)
    if mode:
        probe(
            mode,
            seed,
            kl,
            steps,
            lr,
            batch,
            group,
            scale,
            start,
        )
        return
    t0 = time.perf_counter()
    runs = [
        {
            "mode": mode,
            "scale": scale,
            "start": start,
            "seed": seed,
            "kl": kl,
            "curve": probe(mode, seed, kl, steps, lr, batch, group, scale, start),
        }
        for mode, scale, start, seed, kl, steps in GRID
    ]
    result = {
        "split": "validation",
        "n_questions": 200,
        "lr": lr,
        "batch": batch,
        "group": group,
        "runs": runs,
        "machine": machine_line(machine_facts(), run=True),
        "seconds": round(time.perf_counter() - t0),
    }
    out = results("gym_pg_probe")
    (out / "gym_pg_probe.json").write_text(json.dumps(result, indent=1) + "\n")
    steps = sorted({p["step"] for r in runs for p in r["curve"]})
    names = [
        f"{r['mode']}/{r['scale']} from {r['start']}" + (f" kl {r['kl']}" if r["kl"] else "")
        for r in runs
    ]
    lines = [
        "# Memory gym: the outcome reward's policy gradient on the id alone (probe)",
        "",
        f"`python -m eval.probes.gym_pg_probe` ({result['seconds']} s; {result['machine']}). The "
        "tiny gym proxy on the benchmark's world, read at the id after `<ranking>`, from the "
        "format-only SFT start (`sft`) or untrained (`proxy`); R_ans of each ranking from "
        f"`configs/rewards/gym_outcome.yaml`; {batch} train prompts a step, "
        f"{group} ids (`sample`) or rankings (`pl`) sampled a prompt, or the exact "
        "expectation (`exact`); advantage scale `group` (GRPO's std) or `mean` (log E[R]); "
        f"AdamW lr {lr}, clip 1. Validation users, n = 200 memory questions; chance "
        "0.2. Cells: greedy-id accuracy / entropy of the ids (nats; uniform = 1.609). The "
        "docstring and docs/gym.md (findings 8-10) say what each column shows.",
        "",
        "| step | " + " | ".join(names) + " |",
        "|---" * (len(names) + 1) + "|",
    ]
    for s in steps:
        cells = []
        for r in runs:
            p = next((p for p in r["curve"] if p["step"] == s), None)
            ent = "" if p is None or p["entropy"] is None else f" / {p['entropy']:.2f}"
            cells.append("" if p is None else f"{p['val_acc']:.2f}{ent}")
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    (out / "gym_pg_probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    typer.run(main)
