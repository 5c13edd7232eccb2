"""Dynamic sampling (DAPO's "filter groups") as a small extension of TRL's ``GRPOTrainer``.

A GRPO group whose rewards all agree has zero advantage everywhere: it costs a forward and a
backward pass and teaches nothing, and the more of them a batch holds the noisier the step. DAPO
drops such groups and generates for fresh prompts until the batch is full again. TRL does not
do this, so :class:`DynamicSamplingGRPOTrainer` overrides one method,
``_generate_and_score_completions``:

1. generate and score the batch as TRL does;
2. find the groups whose reward std is ``<= min_std`` (our rewards are continuous, so the test is
   on the spread, not on "all 0" or "all 1" as in DAPO's accuracy rewards);
3. while groups are missing and fewer than ``max_extra_rounds`` extra rounds ran, generate a
   whole extra batch for fresh prompts drawn from the training set (seeded by the optimiser step
   and the round, so a resumed run draws the same prompts) and keep its informative groups;
4. fill the batch back to its original size: informative groups first, in the order found, then
   (only when the rounds ran out) zero-std groups, whose advantages are 0 and so add nothing to
   the gradient but keep every tensor the shape TRL's buffering expects.

The effective batch (informative groups) and the rounds used are logged as
``dynamic_sampling/*``. Group membership comes from the rewards TRL gathers across processes,
so every process makes the same decision; a process keeps whole groups of its own slice, which
needs ``per_device_train_batch_size * steps_per_generation`` to be a multiple of
``num_generations`` (checked). The token count used by the DAPO loss normaliser
(``num_items_in_batch``) is recomputed for the rebuilt batch over the informative groups
only: padding groups add no gradient, and counting their tokens would shrink every real
token's weight by the fraction of the batch that was padding. Multimodal inputs, tool masks
and any batch key not listed here are refused, by name. The TRL range is pinned in
``pyproject.toml``; ``tests/test_trl_contract.py`` fails when TRL's methods change shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from trl import GRPOTrainer

# Batch keys whose second dimension is padded on the left (prompts) or right (completions).
_LEFT_PADDED = {"prompt_ids": "pad", "prompt_mask": 0}
_RIGHT_PADDED = {
    "completion_ids": "pad",
    "completion_mask": 0,
    "old_per_token_logps": 0.0,
    "ref_per_token_logps": 0.0,
    "sampling_per_token_logps": 0.0,
    "importance_sampling_ratio": 1.0,
}
# One value per row: kept by row index, nothing to pad.
_PER_ROW = {"advantages"}
# Everything else TRL may put in a batch (images, tool masks, token type ids, and whatever a later
# release adds) is refused by name rather than merged by a guess at its layout.
_MERGED = set(_LEFT_PADDED) | set(_RIGHT_PADDED) | _PER_ROW


def zero_std_groups(rewards: torch.Tensor, num_generations: int, min_std: float) -> torch.Tensor:
    """Boolean per group: True where the group's (NaN-aware) reward std is ``<= min_std``."""
    grouped = rewards.view(-1, num_generations)
    mean = torch.nanmean(grouped, dim=1, keepdim=True)
    var = torch.nanmean((grouped - mean) ** 2, dim=1)
    return torch.nan_to_num(var.sqrt(), nan=0.0) <= min_std


def informative_tokens(completion_mask: torch.Tensor, informative_rows: int) -> torch.Tensor:
    """The DAPO normaliser's token count of a rebuilt batch whose first ``informative_rows`` rows
    are the informative groups (the rest is zero-advantage padding). At least 1, so a batch of
    padding alone divides a zero loss by 1, not by 0."""
    return completion_mask[:informative_rows].sum().clamp(min=1)


def check_whole_groups(local_rows: int, num_generations: int) -> None:
    """A process filters the groups of its own slice, so its slice must hold whole groups
    (TRL only needs the *global* batch to; with one process the two agree)."""
    if local_rows % num_generations:
        raise ValueError(
            "dynamic sampling keeps whole groups per process: per_device_train_batch_size "
            f"x steps_per_generation ({local_rows}) must be a multiple of num_generations "
            f"({num_generations})"
        )


def _pad_cat(tensors: Sequence[torch.Tensor], value: float, left: bool) -> torch.Tensor:
    if tensors[0].dim() == 1:
        return torch.cat(list(tensors))
    width = max(t.shape[1] for t in tensors)
    out = []
    for t in tensors:
        gap = width - t.shape[1]
        if gap:
            pad = t.new_full((t.shape[0], gap), value)
            t = torch.cat([pad, t] if left else [t, pad], dim=1)
        out.append(t)
    return torch.cat(out)


def merge_batches(
    parts: Sequence[tuple[dict[str, Any], torch.Tensor]], pad_token_id: int
) -> dict[str, Any]:
    """Rows ``idx`` of each TRL generation batch, concatenated, with prompt tensors re-padded
    on the left and completion tensors on the right. ``num_items_in_batch`` is left to the
    caller (it is a cross-process sum)."""
    keys = [k for k in parts[0][0] if k != "num_items_in_batch"]
    for batch, _ in parts:
        bad = {k for k, v in batch.items() if v is not None} - _MERGED - {"num_items_in_batch"}
        if bad:
            raise NotImplementedError(
                f"dynamic sampling does not support batches with {sorted(bad)} (multimodal "
                "inputs, tool masks, or a key a newer TRL added)"
            )
        if [k for k in batch if k != "num_items_in_batch"] != keys:
            raise ValueError("generation batches disagree on their keys; cannot merge them")
    out: dict[str, Any] = {}
    for key in keys:
        values = [batch[key] for batch, _ in parts]
        if values[0] is None:
            out[key] = None
            continue
        rows = [v[idx] for v, (_, idx) in zip(values, parts, strict=True)]
        if key in _LEFT_PADDED:
            fill = _LEFT_PADDED[key]
            out[key] = _pad_cat(rows, pad_token_id if fill == "pad" else fill, left=True)
        else:
            fill = _RIGHT_PADDED.get(key, 0)
            out[key] = _pad_cat(rows, pad_token_id if fill == "pad" else fill, left=False)
    return out


class DynamicSamplingGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` with DAPO's dynamic sampling (see the module docstring)."""

    def __init__(
        self,
        *args: Any,
        max_extra_rounds: int = 2,
        min_std: float = 1e-6,
        step_offset: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.max_extra_rounds = max_extra_rounds
        self.min_std = min_std
        # Steps of earlier epochs: each epoch is a new trainer whose global_step restarts at 0,
        # and without the offset every epoch would refill from the same prompts.
        self.step_offset = step_offset
        self._last_rewards: torch.Tensor | None = None
        check_whole_groups(
            self.args.per_device_train_batch_size * self.args.steps_per_generation,
            self.num_generations,
        )

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):  # type: ignore[no-untyped-def]
        rewards_per_func = super()._calculate_rewards(
            inputs, prompts, completions, completion_ids_list
        )
        # TRL sums the weighted functions before normalising per group; mirror it to judge spread.
        weights = self.reward_weights.to(rewards_per_func.device)
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        self._last_rewards = rewards
        return rewards_per_func

    def _refill_inputs(self, n_rows: int, round_: int) -> list[dict[str, Any]]:
        """This process's slice of a fresh generation batch: prompts drawn without replacement
        from the training set, seeded by (seed, run step, round), each repeated per generation."""
        step = self.step_offset + self.state.global_step
        seed = (self.args.seed * 1_000_003 + step) * 101 + round_
        g = torch.Generator().manual_seed(seed)
        world = self.accelerator.num_processes
        n_prompts = n_rows * world // self.num_generations
        dataset = self.train_dataset
        order = torch.randperm(len(dataset), generator=g).tolist()
        picks = [order[i % len(order)] for i in range(n_prompts)]
        rows = [i for i in picks for _ in range(self.num_generations)]
        start = self.accelerator.process_index * n_rows
        return [dataset[i] for i in rows[start : start + n_rows]]

    def _generate_and_score_completions(self, inputs):  # type: ignore[no-untyped-def]
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)
        n_rows = len(inputs)
        g = self.num_generations
        want = n_rows // g  # groups this process must hand back
        start = self.accelerator.process_index * n_rows
        kept: list[tuple[dict[str, Any], torch.Tensor]] = []
        fillers: list[tuple[dict[str, Any], torch.Tensor]] = []
        n_kept = 0
        rounds = 0
        informative_total = 0
        groups_total = 0
        batch_inputs = inputs
        while True:
            batch = super()._generate_and_score_completions(batch_inputs)
            assert self._last_rewards is not None
            flat = zero_std_groups(self._last_rewards, g, self.min_std)
            groups_total += flat.numel()
            informative_total += int((~flat).sum())
            # This process's rows are [start, start + n_rows) of the gathered batch.
            local_flat = flat[start // g : (start + n_rows) // g]
            good = [i for i, f in enumerate(local_flat.tolist()) if not f]
            bad = [i for i, f in enumerate(local_flat.tolist()) if f]
            take = good[: want - n_kept]
            if take:
                kept.append((batch, _rows(take, g)))
                n_kept += len(take)
            if bad:
                fillers.append((batch, _rows(bad, g)))
            # Every process must agree on whether to go again (generation is collective).
            short = torch.tensor(float(want - n_kept), device=self.accelerator.device)
            short = self.accelerator.gather(short.reshape(1)).max().item()
            if short <= 0 or rounds >= self.max_extra_rounds:
                break
            rounds += 1
            batch_inputs = self._refill_inputs(n_rows, rounds)

        parts = list(kept)
        missing = want - n_kept
        for batch, idx in fillers:
            if missing <= 0:
                break
            take_n = min(missing, idx.numel() // g)
            parts.append((batch, idx[: take_n * g]))
            missing -= take_n
        tok = getattr(self, "_tokenizer", None) or self.processing_class
        merged = merge_batches(parts, tok.pad_token_id)
        mask = merged["completion_mask"]
        # Informative groups come first in ``parts``; padding groups add no gradient and their
        # tokens must not dilute the real ones in the DAPO token-mean.
        count = informative_tokens(mask, n_kept * g)
        merged["num_items_in_batch"] = self.accelerator.gather(count.reshape(1)).sum()

        mode = "train"
        effective = self.accelerator.gather(torch.tensor([float(n_kept)], device=mask.device))
        self._metrics[mode]["dynamic_sampling/effective_groups"].append(effective.sum().item())
        world = self.accelerator.num_processes
        self._metrics[mode]["dynamic_sampling/batch_groups"].append(float(want * world))
        self._metrics[mode]["dynamic_sampling/extra_rounds"].append(float(rounds))
        self._metrics[mode]["dynamic_sampling/informative_frac"].append(
            informative_total / max(groups_total, 1)
        )
        return merged


def _rows(groups: Sequence[int], g: int) -> torch.Tensor:
    return torch.tensor([i * g + j for i in groups for j in range(g)], dtype=torch.long)
