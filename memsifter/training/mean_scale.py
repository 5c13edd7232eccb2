"""``grpo.scale_rewards: mean``: each group's centred rewards divided by the group's mean reward.

``A_i = (r_i - mean_g) / mean_g`` is the sampled gradient of ``log E[R]`` (``∇E[R] / E[R]``):
a group with one success among G draws gives it ``G - 1`` and each failure ``-1``, whatever the
success's reward, where GRPO's std scaling gives a rare success ever less weight as its group's
spread shrinks and a one-id policy collapses (``eval/probes/gym_pg_probe.py``, ``--scale
mean``). Both trainers divide by :func:`mean_divisor`: the Plackett–Luce head
(``memsifter.training.pl_grpo``) and TRL's (``memsifter.training.mean_scale_trainer``, which
takes TRL's ``r - mean`` under ``scale_rewards: none`` and divides it here).

**Rewards must be >= 0.** With negative rewards a group's mean can be 0 or below: the division
then flips every advantage's sign or explodes it, and ``log E[R]`` is not defined. So:

* at build time :func:`check_mean_scale` refuses a run whose rewards can be negative, naming the
  cause and its fix: R_ans with ``subtract_s0: true`` (``s_k - s_0`` is negative wherever memory
  spoils an answer), a negative ``format_reward`` under ``ranking_head: generate`` (the head's
  rankings always parse, so it never pays it), and ``grpo.soft_overlong`` (DAPO's punishment
  pays down to -1);
* at run time a negative reward that still arrives (a reward function this check does not
  know) is an unusable reward: :func:`mean_divisor` raises :class:`DataError`, as the head's
  trainer does for a non-finite reward, rather than train on a sign it cannot interpret. TRL's
  rewards are gathered from every process before the check, so every process raises together.

A group whose rewards are all 0 has ``r - mean = 0`` and gets advantage 0. The divisor is
floored at :data:`MEAN_EPS` (the probe's ``clamp_min(1e-4)``) so that 0/0 is 0; since rewards are
>= 0, ``|r - mean| <= (G - 1) * mean``, so a group whose mean is below the floor gets at most
``(G - 1) * mean / MEAN_EPS``, damped towards 0 rather than a full-size step from float noise.
Rows TRL could not score (NaN: every reward function returned None) are left out of the mean,
as TRL leaves them out of its baseline; their advantage is 0 already.
"""

from __future__ import annotations

from typing import Any

from memsifter.errors import DataError

MEAN_EPS = 1e-4  # the divisor's floor: what the probe clamps the group mean at


def mean_divisor(grouped: Any) -> Any:
    """``[B, G]`` rewards (NaN: unscored, left out) to ``[B, 1]``: each group's mean reward,
    floored at :data:`MEAN_EPS` (1 for a group with no scored row: its advantages are 0).
    A negative reward is refused by name (see the module docstring)."""
    import torch

    scored = grouped[~torch.isnan(grouped)]
    negative = scored[scored < 0]
    if negative.numel():
        raise DataError(
            f"grpo.scale_rewards: mean got {negative.numel()} negative rewards (e.g. "
            f"{negative[:3].tolist()}): it divides by the group's mean reward (the gradient of "
            "log E[R]), which needs rewards >= 0. Pay nothing below 0 (subtract_s0: false, "
            "format_reward: 0, no grpo.soft_overlong) or choose another grpo.scale_rewards "
            "(group, batch, none)",
            field="grpo.scale_rewards",
        )
    means = torch.nanmean(grouped, dim=1, keepdim=True)
    return torch.nan_to_num(means, nan=1.0).clamp_min(MEAN_EPS)


def negative_reward_causes(cfg: Any, reward_config: Any, head: bool) -> list[str]:
    """What in the run (a :class:`memsifter.training.config.TrainConfig` and its
    :class:`memsifter.rewards.RewardConfig`) can pay a negative reward, each with its fix.
    ``head``: the first-token trainer, whose rankings always parse (no format reward) and which
    has no overlong punishment (refused there anyway)."""
    causes = []
    if reward_config.alpha > 0 and reward_config.subtract_s0:
        causes.append(
            "subtract_s0: true (R_ans = sum_n w_n (s_{F_n} - s_0) is negative wherever the "
            "memory makes an answer worse than none; set subtract_s0: false)"
        )
    if not head and reward_config.format_reward < 0:
        causes.append(
            f"format_reward: {reward_config.format_reward} (a completion without a usable "
            "<ranking> is paid it; set format_reward: 0, which subtract_s0: false allows)"
        )
    if not head and cfg.grpo.soft_overlong is not None:
        causes.append("grpo.soft_overlong (DAPO's overlong punishment pays down to -1; remove it)")
    return causes


def check_mean_scale(cfg: Any, reward_config: Any, head: bool) -> None:
    """Refuse ``grpo.scale_rewards: mean`` when the run can pay a negative reward (see the
    module docstring); nothing to check for the other scales."""
    if cfg.grpo.scale_rewards != "mean":
        return
    causes = negative_reward_causes(cfg, reward_config, head)
    if causes:
        raise DataError(
            "grpo.scale_rewards: mean divides each group's centred rewards by the group's mean "
            "reward (the gradient of log E[R]), which needs rewards >= 0: a mean at or below 0 "
            f"flips or explodes the advantages. This run can pay negative rewards: "
            f"{'; '.join(causes)}. Or choose another grpo.scale_rewards (group, batch, none)",
            field="grpo.scale_rewards",
        )
