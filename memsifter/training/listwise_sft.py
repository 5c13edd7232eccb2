"""The first-token head's cold start: listwise softmax cross-entropy on the gold label at the
ranking position (FIRST's objective), before Plackett–Luce GRPO.

The head's scores are the logits at the position after ``<ranking>``, restricted to the
candidates' labels (:func:`memsifter.ranker.first_token.head_scores`). The loss is the negative
log of the probability the softmax over those labels puts on the gold ones,
``-log Σ_{g ∈ gold} softmax(s)_g``: with one gold page this is FIRST's cross-entropy on the gold
label; with several it is the likelihood that a gold page comes first, which is what NDCG@1 and
recall_any@1 pay for (no gold page is made to beat another). Only the labels' logits enter the
softmax, so nothing else of the vocabulary is trained.

Unlike the ``generate`` head's format SFT (:mod:`memsifter.training.sft`), this stage teaches
relevance, not a format: it reads the training split's gold pages (``target: gold``, the
default for this head) or the coarse filter's first choice (``target: coarse``, a distillation of
BM25). ``target: random`` would teach labels unrelated to the content (the memory gym's finding
9) and is refused, as is ``target_ids`` (the head reads one position).

Rows are the training split's prompts that show gold, in a seeded shuffle (``max_examples``
takes a seeded sample), for ``epochs`` passes; with LoRA the adapter is kept in ``out/adapter``
and ``out/final`` holds it merged, as :func:`memsifter.training.sft.run_sft` does, so GRPO
starts from an ordinary model folder.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from memsifter.errors import DataError
from memsifter.ranker.checkpoint import read_spec
from memsifter.ranker.coarse_prior import fuse_tensor, row_orders
from memsifter.ranker.first_token import head_scores

Log = Callable[[str], None]
TARGETS = ("gold", "coarse")


def check_listwise_settings(settings: Any) -> None:
    """Refuse the SFT settings that mean nothing for the head, naming them."""
    if settings.target not in TARGETS:
        raise DataError(
            f"sft.target: {settings.target!r} with ranking_head: first_token; the head's cold "
            f"start is a cross-entropy on a relevant label, so it takes one of {TARGETS} (a "
            "random target teaches labels that ignore the content)",
            field="sft.target",
        )
    if settings.target_ids is not None:
        raise DataError(
            "sft.target_ids: the first-token head reads one position, so its cold start has "
            "one target a prompt; leave target_ids unset",
            field="sft.target_ids",
        )


def listwise_rows(rows: Any, target: str, *, seed: int = 0) -> list[dict[str, Any]]:
    """``{prompt, n, targets}`` for each training row with a target, seeded shuffle. ``gold``:
    the gold positions (rows without gold are skipped); ``coarse``: the coarse filter's first."""
    picked = []
    for row in rows:
        if target == "gold":
            targets = sorted(int(p) for p in row["gold_positions"])
        else:
            targets = [int(row["coarse_order"][0])] if row["coarse_order"] else []
        if not targets:
            continue
        picked.append(
            {
                "prompt": row["prompt"],
                "n": int(row["n_candidates"]),
                "targets": targets,
                "coarse_order": row.get("coarse_order"),
            }
        )
    random.Random(f"listwise-sft:{seed}").shuffle(picked)
    return picked


def listwise_loss(scores: Any, targets: Sequence[Sequence[int]]) -> Any:
    """Mean over rows of ``-log Σ_{t ∈ targets} softmax(scores)_t``; ``-inf`` scores (padding
    past a row's candidates) carry no probability."""
    import torch

    logp = torch.log_softmax(scores.float(), dim=-1)
    mask = torch.zeros_like(logp, dtype=torch.bool)
    for i, ts in enumerate(targets):
        mask[i, list(ts)] = True
    picked = logp.masked_fill(~mask, float("-inf"))
    return -torch.logsumexp(picked, dim=-1).mean()


def run_listwise_sft(
    cfg: Any,
    model_path: str,
    train_rows: Any,
    out: Path,
    *,
    cuda: bool = False,
    log: Log = print,
) -> Path:
    """Train the head's cold start with ``cfg.sft`` and ``cfg.model`` (LoRA included) and save
    it to ``out/final``; returns that folder."""
    import torch

    from memsifter.training.grpo import load_policy, policy_autocast

    settings = cfg.sft
    check_listwise_settings(settings)
    rows = listwise_rows(train_rows, settings.target, seed=cfg.grpo.seed)
    if settings.max_examples is not None:
        rows = rows[: settings.max_examples]
    if not rows:
        raise DataError(
            f"the head's cold start has no training rows with a {settings.target} target"
        )
    model, tok, peft_config = load_policy(cfg, model_path, cuda)
    spec = read_spec(cfg.data)
    labels, read = spec.labels, spec.head_read  # how the data's prompts were rendered and read
    weight = spec.coarse_weight  # the policy is over the head's scores fused with the prior
    if peft_config is not None:
        from peft import get_peft_model

        model = get_peft_model(model, peft_config)
    if cuda:
        model.to("cuda")
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=settings.learning_rate, weight_decay=0.0)
    batch = settings.per_device_train_batch_size
    accum = max(1, settings.gradient_accumulation_steps)
    per_pass = math.ceil(len(rows) / batch)
    micro = max(1, round(per_pass * settings.epochs))
    steps = math.ceil(micro / accum)
    log(f"listwise cold start: {len(rows)} prompts ({settings.target} targets), {steps} steps")
    torch.manual_seed(cfg.grpo.seed)
    history: list[dict[str, Any]] = []
    orders: dict[int, list[int]] = {}
    t0 = time.perf_counter()
    for step in range(steps):
        opt.zero_grad()
        losses, first = [], []
        for m in range(step * accum, min((step + 1) * accum, micro)):
            n_pass, slot = divmod(m, per_pass)
            if n_pass not in orders:  # one seeded shuffle a pass, not one a micro-step
                order = list(range(len(rows)))
                random.Random(f"listwise-sft:{cfg.grpo.seed}:{n_pass}").shuffle(order)
                orders = {n_pass: order}
            take = [rows[i] for i in orders[n_pass][slot * batch : (slot + 1) * batch]]
            prompts, ns = [r["prompt"] for r in take], [r["n"] for r in take]
            with policy_autocast(cfg, cuda):
                scores = head_scores(model, tok, prompts, ns, labels=labels, read=read)
            scores = fuse_tensor(scores, row_orders(take, weight), ns, weight)
            targets = [r["targets"] for r in take]
            loss = listwise_loss(scores, targets)
            (loss / accum).backward()
            losses.append(float(loss.detach()))
            top = scores.detach().argmax(-1).tolist()
            first += [float(t in ts) for t, ts in zip(top, targets, strict=True)]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grpo.max_grad_norm)
        opt.step()
        entry = {
            "step": step + 1,
            "loss": sum(losses) / len(losses),
            "target_first": sum(first) / len(first),  # before this step's update
            "grad_norm": float(grad_norm),
            "seconds": round(time.perf_counter() - t0, 1),
        }
        history.append(entry)
        if (step + 1) % max(1, cfg.grpo.logging_steps) == 0 or step + 1 == steps:
            log(
                f"cold start {step + 1}/{steps}: loss {entry['loss']:.3f}, target first "
                f"{entry['target_first']:.2f}, {entry['seconds']:.0f} s"
            )
    final = out / "final"
    final.mkdir(parents=True, exist_ok=True)
    if peft_config is not None:
        model.save_pretrained(str(out / "adapter"))
        model = model.merge_and_unload()
    model.save_pretrained(str(final))
    tok.save_pretrained(str(final))
    (out / "trainer_state.json").write_text(
        json.dumps({"global_step": steps, "log_history": history}, indent=1) + "\n", "utf-8"
    )
    return final
