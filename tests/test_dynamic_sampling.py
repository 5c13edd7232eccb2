"""Dynamic sampling (DAPO filter groups) on TRL's GRPOTrainer: zero-std detection, batch
merging with re-padding, and a real tiny-model training step where flat groups are dropped and
refilled."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("trl")

from memsifter.training.dynamic_sampling import merge_batches, zero_std_groups  # noqa: E402


def test_zero_std_groups_on_continuous_rewards() -> None:
    rewards = torch.tensor([0.3, 0.3, 0.3, 0.1, 0.2, 0.1, 0.0, 0.0, float("nan")])
    assert zero_std_groups(rewards, 3, 1e-6).tolist() == [True, False, True]
    # A tiny but real spread is signal, not noise to drop.
    assert zero_std_groups(torch.tensor([0.5, 0.5001]), 2, 1e-6).tolist() == [False]


def test_merge_batches_repads_prompts_left_and_completions_right() -> None:
    a = {
        "prompt_ids": torch.tensor([[7, 8], [7, 9]]),
        "prompt_mask": torch.ones(2, 2, dtype=torch.long),
        "completion_ids": torch.tensor([[1, 2, 3], [4, 0, 0]]),
        "completion_mask": torch.tensor([[1, 1, 1], [1, 0, 0]]),
        "advantages": torch.tensor([0.5, -0.5]),
        "old_per_token_logps": None,
        "num_items_in_batch": torch.tensor(4),
    }
    b = {
        "prompt_ids": torch.tensor([[0, 0, 5], [6, 6, 6]]),
        "prompt_mask": torch.tensor([[0, 0, 1], [1, 1, 1]]),
        "completion_ids": torch.tensor([[9], [9]]),
        "completion_mask": torch.tensor([[1], [1]]),
        "advantages": torch.tensor([1.0, -1.0]),
        "old_per_token_logps": None,
        "num_items_in_batch": torch.tensor(2),
    }
    out = merge_batches([(a, torch.tensor([1])), (b, torch.tensor([0, 1]))], pad_token_id=0)
    assert out["prompt_ids"].tolist() == [[0, 7, 9], [0, 0, 5], [6, 6, 6]]
    assert out["prompt_mask"].tolist() == [[0, 1, 1], [0, 0, 1], [1, 1, 1]]
    assert out["completion_ids"].tolist() == [[4, 0, 0], [9, 0, 0], [9, 0, 0]]
    assert out["completion_mask"].tolist() == [[1, 0, 0], [1, 0, 0], [1, 0, 0]]
    assert out["advantages"].tolist() == [-0.5, 1.0, -1.0]
    assert out["old_per_token_logps"] is None and "num_items_in_batch" not in out
    with pytest.raises(NotImplementedError, match="pixel_values"):
        merge_batches([({**a, "pixel_values": torch.zeros(1)}, torch.tensor([0]))], 0)


class FlatForSomePrompts:
    """Reward = a function of the completion, except for prompts that mention "flat", whose
    every completion gets the same reward (a zero-std group)."""

    __name__ = "fake_reward"

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, prompts: list[Any], completions: list[Any], **_: Any) -> list[float]:
        texts = [p[-1]["content"] for p in prompts]
        self.calls.append(texts)
        return [
            0.5 if "flat" in t else float(len(str(c[0]["content"])) % 7) / 7
            for t, c in zip(texts, completions, strict=True)
        ]


@pytest.mark.slow
def test_trainer_drops_flat_groups_and_refills(tiny_qwen3: Path, tmp_path: Path) -> None:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from memsifter.training.dynamic_sampling import DynamicSamplingGRPOTrainer

    torch.manual_seed(0)
    rows = [{"prompt": [{"role": "user", "content": f"flat question {i}"}]} for i in range(4)]
    rows += [{"prompt": [{"role": "user", "content": f"varied question {i}"}]} for i in range(8)]
    reward = FlatForSomePrompts()
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        num_generations=4,
        per_device_train_batch_size=8,  # two groups per step
        max_completion_length=8,
        max_steps=3,
        learning_rate=1e-4,
        loss_type="dapo",
        beta=0.0,
        use_cpu=True,
        bf16=False,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        seed=0,
    )
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    trainer = DynamicSamplingGRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_qwen3),
        reward_funcs=[reward],
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        max_extra_rounds=3,
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    history = [h for h in trainer.state.log_history if "dynamic_sampling/effective_groups" in h]
    assert len(history) == 3
    # Every batch of 2 groups ended with 2 informative ones (4 of 12 prompts are flat, and up
    # to 3 refills draw fresh prompts), and at least one batch needed a refill.
    assert all(h["dynamic_sampling/effective_groups"] == 2.0 for h in history)
    flat_seen = any(any("flat" in t for t in call) for call in reward.calls)
    assert flat_seen and sum(h["dynamic_sampling/extra_rounds"] for h in history) > 0
    moved = any(not torch.equal(before[n], p.detach()) for n, p in trainer.model.named_parameters())
    assert moved


def test_loss_normaliser_counts_informative_groups_only() -> None:
    from memsifter.training.dynamic_sampling import informative_tokens

    # Two informative groups of 2 rows first (5 + 2 tokens), then a zero-std padding group.
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 0], [0, 0, 0], [1, 1, 1], [1, 1, 1]])
    assert int(informative_tokens(mask, 4)) == 7
    assert int(informative_tokens(mask, 6)) == 13
    assert int(informative_tokens(mask, 0)) == 1  # padding only: a zero loss over 1, not 0


def test_refuses_groups_split_across_processes() -> None:
    from memsifter.training.dynamic_sampling import check_whole_groups

    check_whole_groups(12, 6)
    with pytest.raises(ValueError, match="multiple of num_generations"):
        check_whole_groups(3, 6)  # e.g. 2 processes x 3 rows for groups of 6


def test_refills_differ_between_epochs_at_the_same_epoch_step() -> None:
    """Each epoch is a new trainer whose global_step restarts at 0: the run's step (offset by
    the earlier epochs' steps) seeds the refill, so epoch 1 does not redraw epoch 0's prompts."""
    from types import SimpleNamespace

    from memsifter.training.dynamic_sampling import DynamicSamplingGRPOTrainer

    def fake(offset: int, step: int) -> SimpleNamespace:
        return SimpleNamespace(
            args=SimpleNamespace(seed=0),
            state=SimpleNamespace(global_step=step),
            accelerator=SimpleNamespace(num_processes=1, process_index=0),
            num_generations=2,
            train_dataset=[{"i": i} for i in range(64)],
            step_offset=offset,
        )

    refill = DynamicSamplingGRPOTrainer._refill_inputs
    epoch0 = refill(fake(0, 3), 8, 0)  # type: ignore[arg-type]
    assert refill(fake(0, 3), 8, 0) == epoch0  # seeded: a resumed run draws the same
    assert refill(fake(12, 3), 8, 0) != epoch0  # epoch 1, same epoch step: other prompts
    assert refill(fake(12, 3), 8, 0) == refill(fake(0, 15), 8, 0)  # the run's step 15 either way
    assert [r["i"] for r in epoch0[::2]] == [r["i"] for r in epoch0[1::2]]  # whole groups
