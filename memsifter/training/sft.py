"""Cold-start SFT: teach a small proxy the output format before GRPO (our addition to the
paper's recipe, off by default).

GRPO learns only from completions the reward can read; SmolLM2-135M-Instruct writes a strictly
parseable ``<think>…</think><ranking>…</ranking>`` about 1 time in 8, and an untrained proxy
that never parses gets the same format reward on every sample: zero-std groups, no signal. One
short SFT pass on format-correct targets fixes that. Targets come from the **training split
only** (the RL data's ``train.parquet``): a full ranking (after a one-line ``<think>`` when the
PromptSpec asks to think), either the coarse filter's order or the gold sessions first and then
the coarse order. Prompts are the data's rendered ``prompt`` text (the PromptSpec's one
renderer), the target ends with the tokenizer's end of turn, and the loss is on the target only.

``target: gold`` rows are the prompts that show gold, in a seeded shuffle (``max_examples`` takes
a seeded sample, not the first conversations in file order), for ``epochs`` passes. ``target:
coarse`` teaches only the coarse filter's order: it is a format lesson, and with curriculum-selected
rows (the ones the coarse filter ranks worst) it teaches the wrong order, so prefer ``gold``.
``target: random`` is a format lesson and nothing else: every candidate once, in a permutation
seeded by the row, so no relevance and no position habit is taught (the memory gym's
learnability benchmark uses it, so that what the proxy learns of relevance comes from the reward).
``target: rankings`` teaches another ranker's order, read from ``sft.rankings`` (a rankings file
of this data build, the curriculum's format): its positions first, then the rest in the coarse
order. Every train prompt must have its ranking there; a missing one is refused, not skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memsifter.training.config import SFTSettings


def sft_target(
    coarse_order: Sequence[int],
    gold_positions: Sequence[int],
    target: str = "coarse",
    think: bool = True,
    key: str = "",
    ids: int | None = None,
) -> str:
    """The assistant reply for one example: (``<think>`` line +) ``<ranking>`` of every
    candidate position. ``random`` is a permutation seeded by ``key`` (the row's qid and the
    run's seed), the same on every run; ``ids`` keeps only the first ``ids`` of it."""
    order = list(coarse_order)
    if target == "random":
        import random

        random.Random(f"sft-target:{key}").shuffle(order)
    elif target == "gold":
        gold_set = set(gold_positions)
        gold = [p for p in order if p in gold_set]
        order = gold + [p for p in order if p not in gold_set]
    if not order:
        raise ValueError("an SFT target needs at least one candidate")
    if ids is not None:
        order = order[:ids]
    ranking = f"<ranking>{', '.join(map(str, order))}</ranking>"
    if not think:
        return ranking
    top = ", ".join(str(p) for p in order[:2])
    reason = f"Sessions {top} look most relevant to the question; the others follow by relevance."
    return f"<think>{reason}</think>{ranking}"


def sft_rows(
    rows: Any, settings: SFTSettings, *, think: bool = True, seed: int = 0
) -> list[dict[str, Any]]:
    """Prompt-completion rows (plain text: the prompt is already rendered) for TRL's
    ``SFTTrainer``, in a seeded shuffle; gold targets only for prompts that show gold."""
    import random

    rows = list(rows)
    given = _given_rankings(rows, settings)
    picked = []
    for row in rows:
        if not isinstance(row["prompt"], str):
            raise ValueError(
                "RL data rows must carry the rendered prompt text in `prompt`; rebuild the data "
                "with `memsifter data rl`"
            )
        if settings.target == "gold" and not row["gold_positions"]:
            continue
        order, target_kind = row["coarse_order"], settings.target
        if given is not None:
            # The given ranking's positions, then the rest in the coarse order: a full ranking.
            ranked = given[str(row["qid"])]
            order = [*ranked, *(p for p in row["coarse_order"] if p not in ranked)]
            target_kind = "coarse"  # the order as given
        target = sft_target(
            order,
            row["gold_positions"],
            target_kind,
            think,
            key=f"{seed}:{row.get('qid', '')}",
            ids=settings.target_ids,
        )
        picked.append({"prompt": row["prompt"], "completion": target})
    random.Random(f"sft:{seed}").shuffle(picked)
    if settings.max_examples is not None:
        picked = picked[: settings.max_examples]
    return picked


def _given_rankings(rows: list[Any], settings: SFTSettings) -> dict[str, tuple[int, ...]] | None:
    """``sft.rankings`` read against ``rows`` (``target: rankings``), else None."""
    if settings.target != "rankings":
        return None
    from memsifter.errors import DataError
    from memsifter.training.rldata.curriculum import read_rankings

    path = str(settings.rankings)  # SFTSettings refuses the target without its file
    given = read_rankings(path, {str(r["qid"]): int(r["n_candidates"]) for r in rows})
    missing = [str(r["qid"]) for r in rows if str(r["qid"]) not in given]
    if missing:
        raise DataError(
            f"sft.target rankings: {len(missing)} of {len(rows)} train prompts have no ranking "
            f"in the file (first: {', '.join(missing[:3])}); it must rank every train prompt",
            file=path,
            field="sft.rankings",
        )
    return given


def run_sft(
    model_path: str,
    train_rows: Any,
    settings: SFTSettings,
    out: Path,
    *,
    use_cpu: bool,
    bf16: bool,
    tracking: dict[str, Any],
    seed: int = 0,
    think: bool = True,
    peft_config: Any = None,
) -> Path:
    """Train and save the cold-start model to ``out/final``; returns that folder. With a
    ``peft_config`` the adapter is kept in ``out/adapter`` and ``final`` holds it merged, so
    GRPO starts from an ordinary model folder."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    rows = sft_rows(train_rows, settings, think=think, seed=seed)
    if not rows:
        raise ValueError("cold-start SFT has no training rows")
    tok = AutoTokenizer.from_pretrained(model_path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_path)
    args = SFTConfig(
        output_dir=str(out),
        num_train_epochs=settings.epochs,
        learning_rate=settings.learning_rate,
        per_device_train_batch_size=settings.per_device_train_batch_size,
        gradient_accumulation_steps=settings.gradient_accumulation_steps,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        **tracking,
        use_cpu=use_cpu,
        bf16=bf16,
        seed=seed,
        max_length=None,  # prompts are already bounded by the RL data's prompt builder
        completion_only_loss=True,
        # TRL turns checkpointing on by default; with LoRA on the top layers it also makes the
        # inputs require grad, so backward would run through every frozen layer (4x slower
        # per step on CPU, measured).
        gradient_checkpointing=False,
    )
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        peft_config=peft_config,
    )
    trainer.train()
    final = out / "final"
    main = trainer.is_world_process_zero()
    if peft_config is not None:
        trainer.save_model(str(out / "adapter"))  # every process: collective under ZeRO-3
        if main:
            trainer.model.merge_and_unload().save_pretrained(str(final))
    else:
        trainer.save_model(str(final))
    # In a multi-process run one process writes; the caller waits for it before loading.
    if main:
        tok.save_pretrained(str(final))
        trainer.state.save_to_json(str(out / "trainer_state.json"))
    return final
