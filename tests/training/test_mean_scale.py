"""``grpo.scale_rewards: mean``: advantages ``(r - mean_g) / mean_g`` (the gradient of log E[R])
on both trainers, checked against hand computations; rewards that can be negative refused at
build time and at run time; all-zero groups teach nothing."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from memsifter.errors import DataError
from memsifter.rewards import RewardConfig
from memsifter.training.config import GRPOSettings, SoftOverlongSettings, TrainConfig
from memsifter.training.mean_scale import MEAN_EPS, check_mean_scale, mean_divisor
from memsifter.training.pl_grpo import check_settings, group_advantages, place_advantages

# Three groups of 4: one success in four, a graded group, and one where nothing scored.
REWARDS = [[1.0, 0.0, 0.0, 0.0], [0.5, 0.25, 0.25, 0.0], [0.0, 0.0, 0.0, 0.0]]
# By hand: group means 0.25, 0.25, 0 (floored, and 0 / floor = 0).
WANT = [[3.0, -1.0, -1.0, -1.0], [1.0, 0.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0]]


def _close(got: torch.Tensor, want: Any) -> None:
    torch.testing.assert_close(got, torch.as_tensor(want, dtype=got.dtype), rtol=1e-5, atol=1e-6)


def test_pl_mean_scale_divides_by_the_group_mean() -> None:
    adv = group_advantages(torch.tensor(REWARDS), "mean")
    _close(adv, WANT)
    # A rare success keeps G - 1 whatever its reward's size: (0.1 - 0.01) / 0.01.
    rare = torch.tensor([[0.1] + [0.0] * 9])
    assert group_advantages(rare, "mean")[0, 0].item() == pytest.approx(9.0)


def test_a_group_mean_below_the_floor_is_damped_not_blown_up() -> None:
    # Mean 5e-6 < 1e-4: (2e-5 - 5e-6) / 1e-4 and (0 - 5e-6) / 1e-4.
    adv = group_advantages(torch.tensor([[2e-5, 0.0, 0.0, 0.0]]), "mean")
    assert MEAN_EPS == 1e-4
    _close(adv, [[0.15, -0.05, -0.05, -0.05]])


def test_pl_mean_scale_per_place_divides_by_the_whole_rewards_mean() -> None:
    rewards = torch.tensor([[1.0, 0.0], [0.6, 0.2]])  # group means 0.5 and 0.4
    # [B, G, k] rewards-to-go: place 0 is the reward itself.
    to_go = torch.tensor([[[1.0, 0.5], [0.0, 0.0]], [[0.6, 0.1], [0.2, 0.3]]])
    adv = place_advantages(to_go, rewards, "mean")
    # Each place centred on its own group mean, divided by the reward's group mean.
    want = [
        [[0.5 / 0.5, 0.25 / 0.5], [-0.5 / 0.5, -0.25 / 0.5]],
        [[0.2 / 0.4, -0.1 / 0.4], [-0.2 / 0.4, 0.1 / 0.4]],
    ]
    _close(adv, want)
    _close(adv[..., 0], group_advantages(rewards, "mean"))


def test_a_negative_reward_at_run_time_is_refused_by_name() -> None:
    with pytest.raises(DataError, match=r"scale_rewards: mean.*negative.*-0\.5"):
        group_advantages(torch.tensor([[1.0, -0.5, 0.0, 0.0]]), "mean")
    # Unscored rows (NaN) are left out of the mean and of the check.
    got = mean_divisor(torch.tensor([[0.3, float("nan")], [float("nan"), float("nan")]]))
    _close(got, [[0.3], [1.0]])


def test_mean_is_a_scale_rewards_value_and_others_are_refused() -> None:
    assert GRPOSettings(scale_rewards="mean").scale_rewards == "mean"
    with pytest.raises(ValueError, match="scale_rewards must be one of.*mean"):
        GRPOSettings(scale_rewards="median")
    cfg = TrainConfig()
    cfg.grpo = GRPOSettings(num_generations=2, per_device_train_batch_size=2, scale_rewards="mean")
    check_settings(cfg)  # the head's trainer takes it


def _run(**grpo: Any) -> TrainConfig:
    cfg = TrainConfig()
    cfg.grpo = GRPOSettings(scale_rewards="mean", **grpo)
    return cfg


def test_rewards_that_can_be_negative_are_refused_at_build_time() -> None:
    s0 = RewardConfig()  # subtract_s0: true, format_reward -1
    for head in (True, False):
        with pytest.raises(DataError, match=r"scale_rewards: mean.*>= 0.*subtract_s0: false"):
            check_mean_scale(_run(), s0, head)
    # subtract_s0: false: the head never pays the format reward; generate mode does.
    absolute = RewardConfig(subtract_s0=False)
    check_mean_scale(_run(), absolute, head=True)
    with pytest.raises(DataError, match="format_reward: 0"):
        check_mean_scale(_run(), absolute, head=False)
    paid_nothing = RewardConfig(subtract_s0=False, format_reward=0.0)
    check_mean_scale(_run(), paid_nothing, head=False)
    overlong = _run(soft_overlong=SoftOverlongSettings())
    with pytest.raises(DataError, match="soft_overlong"):
        check_mean_scale(overlong, paid_nothing, head=False)
    # Retrieval only (R = beta * R_ret >= 0): subtract_s0 does not matter.
    labels = RewardConfig(alpha=0.0, format_reward=0.0)
    check_mean_scale(_run(), labels, head=False)
    # The other scales take negative rewards as they always have.
    check_mean_scale(dataclasses.replace(_run(), grpo=GRPOSettings()), s0, head=False)


def test_the_shipped_gym_absolute_reward_with_mean_is_refused_only_for_its_format_reward() -> None:
    from memsifter.rewards import load_reward_config

    root = Path(__file__).resolve().parents[2]
    rcfg = load_reward_config(root / "configs/rewards/gym_outcome_absolute.yaml")
    check_mean_scale(_run(), rcfg, head=True)
    with pytest.raises(DataError, match="format_reward"):
        check_mean_scale(_run(), rcfg, head=False)
    rcfg = load_reward_config(root / "configs/rewards/gym_outcome.yaml")  # subtract_s0: true
    with pytest.raises(DataError, match="subtract_s0"):
        check_mean_scale(_run(), rcfg, head=True)


# -- the TRL path ---------------------------------------------------------------------------------


def test_trl_divisor_is_the_global_group_mean_sliced_per_process() -> None:
    pytest.importorskip("trl")
    from memsifter.training.mean_scale_trainer import global_mean_divisor, local_rows

    # Two processes, one group of 4 each (TRL gathered both), two reward functions weighted
    # 1 and 0.5; row 3's functions both returned None (NaN: left out of its group's mean).
    nan = float("nan")
    per_func = torch.tensor(
        [[1.0, 0.0], [0.0, 0.0], [0.0, 1.0], [nan, nan]]
        + [[0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]
    )
    divisor = global_mean_divisor(per_func, torch.tensor([1.0, 0.5]), 4)
    # Group 0: weighted rewards 1, 0, 0.5 (row 3 unscored): mean 0.5. Group 1: all 0, floored.
    assert divisor.tolist() == pytest.approx([0.5] * 4 + [MEAN_EPS] * 4)
    assert local_rows(1, 4) == slice(4, 8)
    # TRL's centred advantages for process 0's rows (r - 0.5; the unscored row's is 0).
    centred = torch.tensor([0.5, -0.5, 0.0, 0.0])
    assert (centred / divisor[local_rows(0, 4)]).tolist() == pytest.approx([1.0, -1.0, 0.0, 0.0])


class ByPosition:
    """Rewards by the completion's row in the scored batch, one list per call."""

    __name__ = "by_position"

    def __init__(self, calls: list[list[float]]) -> None:
        self.calls = list(calls)

    def __call__(self, prompts: list[Any], completions: list[Any], **_: Any) -> list[float]:
        return self.calls.pop(0)


def _trainer(
    cls: type, tiny: Path, out: Path, reward: ByPosition, scale: str = "none", **kw: Any
) -> Any:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    args = GRPOConfig(
        output_dir=str(out),
        num_generations=4,
        per_device_train_batch_size=8,  # two groups
        max_completion_length=4,
        scale_rewards=scale,
        loss_type="dapo",
        beta=0.0,
        use_cpu=True,
        bf16=False,
        report_to=[],
        save_strategy="no",
        seed=0,
    )
    rows = [{"prompt": [{"role": "user", "content": f"question {i}"}]} for i in range(4)]
    trainer = cls(
        model=AutoModelForCausalLM.from_pretrained(tiny),
        reward_funcs=[reward],
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(tiny),
        **kw,
    )
    trainer.model.train()
    return trainer


def _inputs() -> list[dict[str, Any]]:
    return [
        {"prompt": [{"role": "user", "content": f"question {i}"}]} for i in (0, 1) for _ in range(4)
    ]


def test_trl_trainers_scale_by_the_group_mean(tiny_qwen3: Path, tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from memsifter.training.mean_scale_trainer import (
        MeanScaledDynamicSamplingGRPOTrainer,
        MeanScaledGRPOTrainer,
    )

    torch.manual_seed(0)
    # One success in four, then an all-zero group: (1 - .25) / .25 = 3, -.25 / .25 = -1; 0.
    reward = ByPosition([[1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    trainer = _trainer(MeanScaledGRPOTrainer, tiny_qwen3, tmp_path / "plain", reward)
    out = trainer._generate_and_score_completions(_inputs())
    want = [3.0, -1.0, -1.0, -1.0, 0.0, 0.0, 0.0, 0.0]
    assert out["advantages"].tolist() == pytest.approx(want)
    assert list(trainer._logs["advantages"])[-8:] == pytest.approx(want)  # the table too

    # Dynamic sampling on top: each round scaled before its groups are chosen. Both groups of
    # this round vary, so nothing is refilled: means 0.25 and 0.5.
    reward = ByPosition([[0.5, 0.25, 0.25, 0.0, 1.0, 0.0, 0.5, 0.5]])
    trainer = _trainer(
        MeanScaledDynamicSamplingGRPOTrainer, tiny_qwen3, tmp_path / "ds", reward,
        max_extra_rounds=0,
    )  # fmt: skip
    out = trainer._generate_and_score_completions(_inputs())
    want = [1.0, 0.0, 0.0, -1.0, 1.0, -1.0, 0.0, 0.0]
    assert out["advantages"].tolist() == pytest.approx(want)
    assert list(trainer._logs["advantages"])[-8:] == pytest.approx(want)


def test_trl_mean_trainer_refuses_a_std_scale_and_a_negative_reward(
    tiny_qwen3: Path, tmp_path: Path
) -> None:
    pytest.importorskip("trl")
    from memsifter.training.mean_scale_trainer import MeanScaledGRPOTrainer

    reward = ByPosition([[1.0, -0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    trainer = _trainer(MeanScaledGRPOTrainer, tiny_qwen3, tmp_path / "neg", reward)
    with pytest.raises(DataError, match="scale_rewards: mean got 1 negative"):
        trainer._generate_and_score_completions(_inputs())
    with pytest.raises(ValueError, match="scale them twice"):
        _trainer(MeanScaledGRPOTrainer, tiny_qwen3, tmp_path / "std", reward, scale="group")


def test_the_grpo_config_asks_trl_to_centre_only() -> None:
    from memsifter.training.grpo import grpo_config_kwargs

    cfg = TrainConfig()
    cfg.grpo = GRPOSettings(scale_rewards="mean")
    assert grpo_config_kwargs(cfg, "/tmp/x", cuda=False)["scale_rewards"] == "none"
    cfg.grpo = GRPOSettings(scale_rewards="batch")
    assert grpo_config_kwargs(cfg, "/tmp/x", cuda=False)["scale_rewards"] == "batch"
