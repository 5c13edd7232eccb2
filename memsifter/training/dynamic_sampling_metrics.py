"""TRL's per-batch metrics and completions table, recomputed over the groups dynamic sampling
trains (see :mod:`memsifter.training.dynamic_sampling`).

TRL computes these as it generates each round, over every row it generated; dynamic sampling
throws some rounds' groups away, so the numbers it logs are rebuilt here from the rows that
trained: reward means and stds, completion lengths, vLLM importance-sampling statistics and the
completions table. Also here: the weighted reward TRL normalises per group, which both these
metrics and the zero-std test are computed from, and the names TRL uses for all of it (pinned
against the installed TRL by ``tests/training/test_trl_contract.py``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch
from trl.trainer.utils import nanstd

# The completions table TRL 1.16 keeps (``GRPOTrainer._logs``).
_LOG_KEYS = {"images", "prompt", "completion", "rewards", "advantages", "extra"}
# Metrics TRL computes from a round's rows; recomputed over the trained groups. Per reward
# function it adds ``rewards/<name>/mean`` and ``rewards/<name>/std`` (see recomputed_metrics).
_ROW_METRICS = {
    "num_tokens",
    "completions/mean_length",
    "completions/min_length",
    "completions/max_length",
    "completions/clipped_ratio",
    "completions/mean_terminated_length",
    "completions/min_terminated_length",
    "completions/max_terminated_length",
    "reward",
    "reward_std",
    "frac_reward_zero_std",
}
_SAMPLING_METRICS = (
    "sampling/sampling_logp_difference/mean",
    "sampling/sampling_logp_difference/max",
    "sampling/importance_sampling_ratio/min",
    "sampling/importance_sampling_ratio/mean",
    "sampling/importance_sampling_ratio/max",
)


def weighted_rewards(rewards_per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The reward TRL normalises per group (``sum_then_normalize``): the weighted sum of the
    reward functions, NaN where every function returned None (TRL leaves those rows out of the
    group baseline)."""
    rewards = (rewards_per_func * weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
    rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    return rewards


def recomputed_metrics(reward_func_names: Sequence[str]) -> set[str]:
    """Every metric key TRL logs per round that :func:`trained_metrics` (or the vLLM statistics)
    recompute over the trained groups."""
    per_func = {f"rewards/{n}/{s}" for n in reward_func_names for s in ("mean", "std")}
    return _ROW_METRICS | set(_SAMPLING_METRICS) | per_func


def trained_metrics(
    rewards_per_func: torch.Tensor,
    weights: torch.Tensor,
    reward_func_names: Sequence[str],
    completion_lengths: torch.Tensor,
    truncated: torch.Tensor,
    num_generations: int,
) -> dict[str, float]:
    """TRL's per-batch metrics (``_generate`` and ``_generate_and_score_completions``, same
    formulas) over the trained rows only, whole groups in order. Nothing when nothing trained:
    a mean over no group is not a value, and a step without one has no entry (TRL averages the
    entries of a logging window, and writes None for a key whose entries are all NaN)."""
    if rewards_per_func.shape[0] == 0:
        return {}
    out: dict[str, float] = {}
    for i, name in enumerate(reward_func_names):
        out[f"rewards/{name}/mean"] = torch.nanmean(rewards_per_func[:, i]).item()
        out[f"rewards/{name}/std"] = nanstd(rewards_per_func[:, i]).item()
    rewards = weighted_rewards(rewards_per_func, weights)
    out["reward"] = torch.nanmean(rewards).item()
    out["reward_std"] = nanstd(rewards).item()
    group_std = nanstd(rewards.view(-1, num_generations), dim=1)
    out["frac_reward_zero_std"] = (
        torch.isclose(group_std, torch.zeros_like(group_std)).float().mean().item()
    )
    lengths = completion_lengths.float()
    out["completions/mean_length"] = lengths.mean().item()
    out["completions/min_length"] = lengths.min().item()
    out["completions/max_length"] = lengths.max().item()
    out["completions/clipped_ratio"] = truncated.float().mean().item()
    terminated = lengths[~truncated.bool()]
    if terminated.numel() == 0:  # TRL's edge case: no completion ended with EOS
        terminated = torch.zeros(1)
    out["completions/mean_terminated_length"] = terminated.mean().item()
    out["completions/min_terminated_length"] = terminated.min().item()
    out["completions/max_terminated_length"] = terminated.max().item()
    return out


def importance_sampling_stats(
    batch: dict[str, Any], trained_rows: torch.Tensor, sequence_level: bool
) -> torch.Tensor:
    """This process's vLLM importance-sampling statistics over its trained rows, as TRL computes
    them per process before gathering: (mean |logp diff|, max |logp diff|, min ratio, mean ratio,
    max ratio). NaN where the process trained no token (TRL would report 0)."""
    mask = batch["completion_mask"].bool() & trained_rows.bool().unsqueeze(1)
    delta = (batch["old_per_token_logps"] - batch["sampling_per_token_logps"]).abs()
    delta = delta[mask & ~torch.isnan(delta)]
    ratio = batch["importance_sampling_ratio"]
    flat = ratio[trained_rows.bool()].flatten() if sequence_level else ratio[mask]
    nan = torch.tensor(math.nan, device=delta.device)

    def stat(t: torch.Tensor, fn: Any) -> torch.Tensor:
        return fn(t).float() if t.numel() else nan

    return torch.stack(
        [
            stat(delta, torch.mean),
            stat(delta, torch.max),
            stat(flat, torch.min),
            stat(flat, torch.mean),
            stat(flat, torch.max),
        ]
    )


def select_log_rows(
    round_logs: Sequence[dict[str, Any]], rows_per_round: Sequence[Sequence[int]]
) -> dict[str, Any]:
    """The completions-table rows of the trained groups (``rows_per_round``: global row indices
    per round) from each round's table. A per-completion column a reward function logged in some
    rounds only is None in the others."""
    out: dict[str, Any] = {"prompt": [], "completion": [], "advantages": []}
    out["rewards"], out["extra"] = {}, {}
    n = 0
    for logs, rows in zip(round_logs, rows_per_round, strict=True):
        for key in ("prompt", "completion", "advantages"):
            out[key].extend(logs[key][i] for i in rows)
        for nested in ("rewards", "extra"):
            for column in set(logs[nested]) | set(out[nested]):
                values = logs[nested].get(column)
                picked = [None] * len(rows) if values is None else [values[i] for i in rows]
                out[nested].setdefault(column, [None] * n).extend(picked)
        n += len(rows)
    return out


def _empty_logs() -> dict[str, Any]:
    """A scratch completions table with TRL's keys (``_LOG_KEYS``), unbounded."""
    return {
        "images": [],
        "prompt": [],
        "completion": [],
        "rewards": defaultdict(list),
        "advantages": [],
        "extra": defaultdict(list),
    }
