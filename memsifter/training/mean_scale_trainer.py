"""``grpo.scale_rewards: mean`` on TRL's ``GRPOTrainer`` (``ranking_head: generate``).

TRL 1.16 scales advantages by a group's or the batch's std, or not at all. The run asks TRL for
``scale_rewards: none`` (:func:`memsifter.training.grpo.grpo_config_kwargs`), so TRL returns
``r - mean_g``, and :class:`MeanScaledGRPOTrainer` divides each completion's advantage by its
group's mean reward (:func:`memsifter.training.mean_scale.mean_divisor`, the concept's one home;
the module docstring there gives the rule for zero and negative rewards).

The mean is taken over the same reward TRL centred: the weighted sum of the reward functions
over the rewards ``_calculate_rewards`` gathered from every process, grouped over that global
batch, NaN rows (unscored) left out; then this process's rows are sliced out as TRL slices its
advantages (``process_index * local rows``). ``_calculate_rewards`` is overridden only to keep
what it returned. TRL's completions table (``_logs["advantages"]``, which it fills with the
global advantages) is rescaled the same way, so the logged advantages are the trained ones.

:class:`MeanScaledDynamicSamplingGRPOTrainer` puts dynamic sampling on top: each generation
round is scaled as TRL returns it, before the rounds' groups are chosen and merged (a group's
divisor is its own mean, so groups from different rounds mix freely).
"""

from __future__ import annotations

from typing import Any

import torch
from trl import GRPOTrainer

from memsifter.training.dynamic_sampling import DynamicSamplingGRPOTrainer
from memsifter.training.dynamic_sampling_metrics import weighted_rewards
from memsifter.training.mean_scale import mean_divisor


def global_mean_divisor(
    rewards_per_func: torch.Tensor, weights: torch.Tensor, num_generations: int
) -> torch.Tensor:
    """Per global row (every process's rows, in process order): its group's mean reward as
    :func:`mean_divisor` floors it, from the rewards TRL gathered (``[rows, functions]``) and
    its reward weights, grouped as TRL groups them (``num_generations`` adjacent rows)."""
    rewards = weighted_rewards(rewards_per_func, weights)
    divisor = mean_divisor(rewards.view(-1, num_generations))
    return divisor.repeat_interleave(num_generations, dim=0).view(-1)


def local_rows(process_index: int, n_local: int) -> slice:
    """This process's rows of the global batch, as TRL slices its advantages."""
    return slice(process_index * n_local, (process_index + 1) * n_local)


class MeanScaledGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose advantages are ``(r - mean_g) / mean_g`` (see the module doc).
    Built with TRL's ``scale_rewards: none``; anything else would be scaled twice."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.scale_rewards != "none":
            raise ValueError(
                "grpo.scale_rewards: mean divides TRL's centred rewards (scale_rewards: none) "
                f"by the group mean; TRL was given scale_rewards {self.scale_rewards!r}, which "
                "would scale them twice (is scale_rewards set in grpo.extra?)"
            )
        if self.multi_objective_aggregation != "sum_then_normalize":
            raise NotImplementedError(
                "grpo.scale_rewards: mean divides the summed reward's centred value by its "
                f"group mean; multi_objective_aggregation {self.multi_objective_aggregation!r} "
                "normalises each reward function first, so there is no such mean"
            )
        self._mean_scale_rewards: torch.Tensor | None = None

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):  # type: ignore[no-untyped-def]
        """TRL's gathered rewards, unchanged; kept for the group means."""
        rewards_per_func = super()._calculate_rewards(
            inputs, prompts, completions, completion_ids_list
        )
        self._mean_scale_rewards = rewards_per_func
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):  # type: ignore[no-untyped-def]
        self._mean_scale_rewards = None
        output = super()._generate_and_score_completions(inputs)
        gathered = self._mean_scale_rewards
        if gathered is None:
            raise RuntimeError("TRL scored the batch without _calculate_rewards")
        self._mean_scale_rewards = None
        # TRL's own choice of group size (an eval pass may use num_generations_eval).
        g = self.num_generations if self.model.training else self.num_generations_eval
        divisor = global_mean_divisor(gathered, self.reward_weights, g)
        advantages = output["advantages"]
        mine = local_rows(self.accelerator.process_index, advantages.shape[0])
        output["advantages"] = advantages / divisor[mine].to(advantages.device)
        # The table's newest rows are this batch's global advantages (a bounded deque: it may
        # hold fewer than the batch, never other batches' rows among the last ones).
        table = self._logs["advantages"]
        n = min(len(table), divisor.shape[0])
        for j in range(1, n + 1):
            table[-j] = table[-j] / float(divisor[-j])
        return output


class MeanScaledDynamicSamplingGRPOTrainer(DynamicSamplingGRPOTrainer, MeanScaledGRPOTrainer):
    """Dynamic sampling over mean-scaled rounds: ``DynamicSamplingGRPOTrainer``'s rounds call
    ``MeanScaledGRPOTrainer``'s ``_generate_and_score_completions`` (the next class in the
    method order), so each round is scaled before groups are chosen, merged and logged."""
