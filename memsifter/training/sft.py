"""Cold-start SFT: teach a small proxy the output format before GRPO (our addition to the
paper's recipe, off by default).

GRPO learns only from completions the reward can read; SmolLM2-135M-Instruct writes a strictly
parseable ``<think>…</think><ranking>…</ranking>`` about 1 time in 8, and an untrained proxy
that never parses gets the same format reward on every sample: zero-std groups, no signal. One
short SFT pass on format-correct targets fixes that. Targets come from the **training split
only** (the RL data's ``train.parquet``): a one-line reasoning plus a full ranking, either the
coarse filter's order or the gold sessions first and then the coarse order. They teach the
format and a sensible prior; GRPO then moves the ranking toward what helps the working LLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memsifter.training.config import SFTSettings


def sft_target(
    coarse_order: Sequence[int], gold_positions: Sequence[int], target: str = "coarse"
) -> str:
    """The assistant message for one example: ``<think>`` line + ``<ranking>`` of every
    candidate position."""
    order = list(coarse_order)
    if target == "gold":
        gold = [p for p in order if p in set(gold_positions)]
        order = gold + [p for p in order if p not in set(gold)]
    if not order:
        raise ValueError("an SFT target needs at least one candidate")
    top = ", ".join(str(p) for p in order[:2])
    think = f"Sessions {top} look most relevant to the question; the others follow by relevance."
    return f"<think>{think}</think><ranking>{', '.join(map(str, order))}</ranking>"


def sft_rows(rows: Any, settings: SFTSettings) -> list[dict[str, Any]]:
    """Prompt-completion conversational rows for TRL's ``SFTTrainer`` (loss on the completion
    only)."""
    out = []
    for row in rows:
        if settings.max_examples is not None and len(out) >= settings.max_examples:
            break
        target = sft_target(row["coarse_order"], row["gold_positions"], settings.target)
        out.append(
            {"prompt": row["prompt"], "completion": [{"role": "assistant", "content": target}]}
        )
    return out


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
) -> Path:
    """Train and save the cold-start model to ``out/final``; returns that folder."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    rows = sft_rows(train_rows, settings)
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
    )
    trainer = SFTTrainer(
        model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok
    )
    trainer.train()
    final = out / "final"
    trainer.save_model(str(final))
    tok.save_pretrained(str(final))
    trainer.state.save_to_json(str(out / "trainer_state.json"))
    return final
