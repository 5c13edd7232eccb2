"""Dynamic sampling (DAPO filter groups) on TRL's GRPOTrainer: zero-std detection, the one plan
every process derives from the gathered rewards (which groups train, on which process), batch
merging with re-padding, metrics and the completions table over the trained groups only, and a
real tiny-model run where flat groups are dropped and refilled."""

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
    import pandas as pd
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
        log_completions=True,
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
    # Metrics and the completions table count the groups that trained, not the discarded ones:
    # no flat prompt in any step's table, no zero-std group in the logged fraction, and the
    # logged mean reward is the mean over exactly the table's (trained) rows.
    for h in history:
        step = h["step"]
        table = pd.read_parquet(
            tmp_path / "out" / "completions" / f"completions_{step:05d}.parquet"
        )
        assert len(table) == 8, table  # 2 trained groups of 4
        assert not table["prompt"].astype(str).str.contains("flat").any(), table["prompt"]
        assert h["frac_reward_zero_std"] == 0.0
        assert h["reward"] == pytest.approx(table["fake_reward"].mean())
        assert h["rewards/fake_reward/mean"] == pytest.approx(table["fake_reward"].mean())


def test_refuses_groups_split_across_processes() -> None:
    from memsifter.training.dynamic_sampling import check_whole_groups

    check_whole_groups(12, 6)
    with pytest.raises(ValueError, match="multiple of num_generations"):
        check_whole_groups(3, 6)  # e.g. 2 processes x 3 rows for groups of 6


def test_refills_differ_between_epochs_at_the_same_epoch_step() -> None:
    """Each epoch is a new trainer whose global_step restarts at 0: the run's step (offset by
    the earlier epochs' steps) seeds the refill, so epoch 1 does not redraw epoch 0's prompts."""
    from types import SimpleNamespace

    from memsifter.rewards.shaping import RunClock
    from memsifter.training.dynamic_sampling import DynamicSamplingGRPOTrainer

    def fake(offset: int, step: int) -> SimpleNamespace:
        return SimpleNamespace(
            args=SimpleNamespace(seed=0),
            state=SimpleNamespace(global_step=step),
            accelerator=SimpleNamespace(num_processes=1, process_index=0),
            num_generations=2,
            train_dataset=[{"i": i} for i in range(64)],
            clock=RunClock(offset=offset),
        )

    refill = DynamicSamplingGRPOTrainer._refill_inputs
    epoch0 = refill(fake(0, 3), 8, 0)  # type: ignore[arg-type]
    assert refill(fake(0, 3), 8, 0) == epoch0  # seeded: a resumed run draws the same
    assert refill(fake(12, 3), 8, 0) != epoch0  # epoch 1, same epoch step: other prompts
    assert refill(fake(12, 3), 8, 0) == refill(fake(0, 15), 8, 0)  # the run's step 15 either way
    assert [r["i"] for r in epoch0[::2]] == [r["i"] for r in epoch0[1::2]]  # whole groups


def _gathered(*ranks: list[list[float]]) -> torch.Tensor:
    """The rewards TRL gathers: every process's groups, in process order, flattened."""
    return torch.tensor([r for groups in ranks for group in groups for r in group])


def test_two_simulated_processes_share_one_plan_and_refill_globally() -> None:
    """Two processes with two groups of 2 each. Round 0: process 0's groups vary, process 1's are
    flat. Round 1 (a refill for the global batch): only process 0's first group varies. The plan
    trains 3 informative groups and one zero-std pad; process 1, whose own groups were all flat,
    trains the informative groups process 0 generated, instead of two pads while process 0's
    refill is thrown away (the old per-process rule)."""
    from memsifter.training.dynamic_sampling import (
        GroupRef,
        assign_groups,
        count_informative,
        moved_groups,
        select_groups,
    )

    rounds = [
        _gathered([[0.1, 0.9], [0.2, 0.4]], [[0.5, 0.5], [0.3, 0.3]]),
        _gathered([[0.0, 1.0], [0.7, 0.7]], [[0.6, 0.6], [0.1, 0.1]]),
    ]
    # Every process computes the flags from the same gathered tensor (and the main process's are
    # broadcast): the decision is a function of global data, not of a process's slice.
    flags = [zero_std_groups(r, 2, 1e-6).tolist() for r in rounds]
    assert flags == [[False, False, True, True], [False, True, True, True]]
    assert count_informative(flags) == 3
    trained, padding = select_groups(flags, need=4)
    assert trained == [GroupRef(0, 0), GroupRef(0, 1), GroupRef(1, 0)]
    assert padding == [GroupRef(0, 2)]
    plan = assign_groups(trained + padding, per_process=2, world=2)
    assert plan == [[GroupRef(0, 0), GroupRef(0, 1)], [GroupRef(0, 2), GroupRef(1, 0)]]
    # Process 1 trains process 0's refill group; nothing else changes process.
    assert moved_groups(plan, per_process=2) == [GroupRef(1, 0)]
    # Nothing dropped, nothing moves: each process keeps its own round-0 groups.
    flat_free = [[False] * 4]
    trained, padding = select_groups(flat_free, need=4)
    assert padding == [] and moved_groups(assign_groups(trained, 2, 2), 2) == []


def test_plan_fills_short_processes_in_order_and_refuses_a_short_batch() -> None:
    from memsifter.training.dynamic_sampling import GroupRef, assign_groups, select_groups

    # Three processes of one group; everything informative came from process 2's slice.
    flags = [[True, True, False], [True, True, False], [True, False, True]]
    trained, padding = select_groups(flags, need=3)
    assert trained == [GroupRef(0, 2), GroupRef(1, 2), GroupRef(2, 1)] and padding == []
    assert assign_groups(trained, 1, 3) == [[GroupRef(1, 2)], [GroupRef(2, 1)], [GroupRef(0, 2)]]
    with pytest.raises(ValueError, match="cannot fill"):
        select_groups([[False, True]], need=3)
    with pytest.raises(ValueError, match="3 groups for 2 processes"):
        assign_groups(trained, 1, 2)


def test_padding_rows_are_masked_out_of_the_loss_and_the_token_count() -> None:
    from memsifter.training.dynamic_sampling import mask_untrained

    # Two trained rows (5 + 2 tokens), then a zero-std padding group of two rows.
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]])
    out = mask_untrained(mask, torch.tensor([True, True, False, False]))
    assert out.tolist() == [[1, 1, 1], [1, 1, 0], [0, 0, 0], [0, 0, 0]]
    assert out.dtype == mask.dtype and int(out.sum()) == 5


def test_metrics_and_table_count_only_the_trained_groups() -> None:
    """A discarded round-0 group (flat, long, truncated completions) must not reach the reward
    means, the lengths or the completions table; a round-1 group that trained must."""
    from memsifter.training.dynamic_sampling_metrics import (
        recomputed_metrics,
        select_log_rows,
        trained_metrics,
    )

    # Round 0: group 0 informative (rows 0-1), group 1 flat (rows 2-3, discarded).
    # Round 1: group 0 flat (discarded), group 1 informative (rows 2-3).
    rewards = [
        torch.tensor([[0.0], [1.0], [0.5], [0.5]]),
        torch.tensor([[0.2], [0.2], [0.4], [0.8]]),
    ]
    lengths = [torch.tensor([3, 5, 64, 64]), torch.tensor([9, 9, 4, 6])]
    truncated = [torch.tensor([False, False, True, True]), torch.tensor([True, True, False, True])]
    rows = [[0, 1], [2, 3]]  # trained rows per round
    pick = [torch.tensor(r) for r in rows]

    def cat(xs: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([x[i] for x, i in zip(xs, pick, strict=True)])

    m = trained_metrics(cat(rewards), torch.ones(1), ["r"], cat(lengths), cat(truncated), 2)
    assert set(m) == recomputed_metrics(["r"]) - {"num_tokens"} - {
        k for k in recomputed_metrics(["r"]) if k.startswith("sampling/")
    }
    assert m["reward"] == pytest.approx((0.0 + 1.0 + 0.4 + 0.8) / 4)
    assert m["rewards/r/mean"] == pytest.approx(m["reward"])
    assert m["frac_reward_zero_std"] == 0.0  # only informative groups trained
    assert m["completions/mean_length"] == pytest.approx((3 + 5 + 4 + 6) / 4)
    assert m["completions/max_length"] == 6.0 and m["completions/min_length"] == 3.0
    assert m["completions/clipped_ratio"] == pytest.approx(0.25)
    assert m["completions/mean_terminated_length"] == pytest.approx((3 + 5 + 4) / 3)
    none = trained_metrics(
        torch.zeros(0, 1), torch.ones(1), ["r"], torch.zeros(0), torch.zeros(0), 2
    )
    assert none == {}  # no trained group, no value (rather than a NaN logged as None)

    logs = [
        {
            "prompt": ["a", "a", "flat", "flat"],
            "completion": ["a0", "a1", "f0", "f1"],
            "advantages": [-1.0, 1.0, 0.0, 0.0],
            "rewards": {"r": [0.0, 1.0, 0.5, 0.5]},
            "extra": {"reward/r_ret": [0.1, 0.2, 0.3, 0.4]},
        },
        {
            "prompt": ["flat2", "flat2", "b", "b"],
            "completion": ["g0", "g1", "b0", "b1"],
            "advantages": [0.0, 0.0, -1.0, 1.0],
            "rewards": {"r": [0.2, 0.2, 0.4, 0.8]},
            "extra": {},  # the reward function logged no per-completion column this round
        },
    ]
    table = select_log_rows(logs, rows)
    assert table["prompt"] == ["a", "a", "b", "b"]
    assert table["completion"] == ["a0", "a1", "b0", "b1"]
    assert table["advantages"] == [-1.0, 1.0, -1.0, 1.0]
    assert table["rewards"] == {"r": [0.0, 1.0, 0.4, 0.8]}
    assert table["extra"] == {"reward/r_ret": [0.1, 0.2, None, None]}


def test_importance_sampling_stats_cover_trained_rows_only() -> None:
    from memsifter.training.dynamic_sampling_metrics import importance_sampling_stats

    batch = {
        "completion_mask": torch.tensor([[1, 1], [1, 0], [1, 1]]),
        "old_per_token_logps": torch.tensor([[-1.0, -2.0], [-1.0, 0.0], [-9.0, -9.0]]),
        "sampling_per_token_logps": torch.tensor([[-1.5, -2.0], [-1.25, 5.0], [0.0, 0.0]]),
        "importance_sampling_ratio": torch.tensor([[0.5, 1.0], [2.0, 7.0], [9.0, 9.0]]),
    }
    rows = torch.tensor([True, True, False])  # the third row is padding
    stats = importance_sampling_stats(batch, rows, sequence_level=False).tolist()
    assert stats == pytest.approx([0.25, 0.5, 0.5, 3.5 / 3, 2.0])
    seq = {**batch, "importance_sampling_ratio": torch.tensor([[0.5], [2.0], [9.0]])}
    assert importance_sampling_stats(seq, rows, sequence_level=True).tolist()[2:] == [
        0.5,
        1.25,
        2.0,
    ]
    none = importance_sampling_stats(batch, torch.tensor([False, False, False]), False)
    assert torch.isnan(none).all()
