"""Dynamic sampling (DAPO's "filter groups") as a small extension of TRL's ``GRPOTrainer``.

A GRPO group whose rewards all agree has zero advantage everywhere: it costs a forward and a
backward pass and teaches nothing, and the more of them a batch holds the noisier the step. DAPO
drops such groups and generates for fresh prompts until the batch is full again. TRL does not
do this, so :class:`DynamicSamplingGRPOTrainer` overrides ``_generate_and_score_completions``
(and ``_calculate_rewards``, to keep what it scored):

1. generate and score the generation batch as TRL does: each process generates its slice, TRL
   gathers the rewards of every process, and each process keeps its slice of the tensors;
2. judge every group of the *global* batch from those gathered rewards: a group whose reward
   std is ``<= min_std`` is flat (our rewards are continuous, so the test is on the spread, not on
   "all 0" or "all 1" as in DAPO's accuracy rewards). The main process's flags are broadcast, so
   every process holds the same flags by construction, not by floating-point agreement;
3. while the run has fewer informative groups than the global batch holds and fewer than
   ``max_extra_rounds`` extra rounds ran, generate a whole extra batch for fresh prompts drawn
   from the training set for the global batch (seeded by the run's step and the round, so a
   resumed run draws the same prompts; each process generates its slice of them);
4. choose the groups that train: the first informative groups of all rounds, in round-then-group
   order, up to the global batch; when the rounds ran out, zero-std groups fill the rest;
5. hand each process its share (:func:`assign_groups`): every process first keeps the chosen
   groups it generated itself, and the others fill the free places of the processes that came up
   short, so a process whose own slice was flat trains on the groups another process generated.
   A round whose groups change process is gathered (every process joins, the plan being the same
   everywhere); a step where nothing moves costs no transfer.

Why move groups between processes rather than let each process keep its own. TRL's batch is a
fixed ``per_device_train_batch_size x steps_per_generation`` rows per process (its buffering
splits it evenly and every process must run the same number of forward passes), so kept counts
cannot differ between processes. Keeping each process's own groups would leave a process with a
flat slice padding with zero-advantage groups while another process's refills, generated for the
same collective round, were thrown away. DAPO's implementations on TRL pool the batch instead:
ms-swift's ``GRPOTrainer._dynamic_sampling`` gathers every process's samples, keeps the
informative ones and hands each process its slice of that pool (TRL itself has no dynamic
sampling: huggingface/trl#3708). We pool the same way, but over finished TRL batches (TRL 1.16
computes old/ref log-probs and advantages inside the method we extend), and prefer a group's own
process so that nothing moves when no group was dropped.

Padding groups (zero-std groups that fill the batch when the rounds ran out) get an all-zero
completion mask: they add nothing to the policy loss (their advantage is 0 anyway), nothing to
the KL or entropy terms, and their tokens are not in the DAPO normaliser (``num_items_in_batch``
is recounted over the masked batch), so they keep the tensors' shapes and nothing else. With
``loss_type: grpo`` (a per-sequence mean averaged over rows) masked rows still count in the row
average; our configs use ``dapo``.

Metrics and the completions table count only the groups that trained. TRL logs each round as it
generates it, so each round runs with scratch ``_metrics``/``_logs`` (and ``num_input_tokens_seen``
restored afterwards); the metrics TRL computes from rows (completion lengths, reward means and
stds, ``frac_reward_zero_std``, ``num_tokens``, vLLM importance-sampling statistics) are
recomputed over the trained groups and the table holds their rows only. Scalars that a reward
function logs with ``log_metric`` describe a whole scored batch and cannot be split by group:
they are kept from every round, discarded ones included (they also count the scoring's cost, such
as working-LLM calls). ``dynamic_sampling/*`` reports the trained groups, the batch's groups, the
extra rounds, the informative fraction over every generated group and the groups that changed
process. The recomputation lives in :mod:`memsifter.training.dynamic_sampling_metrics`.

Each process's slice must hold whole groups (``per_device_train_batch_size *
steps_per_generation`` a multiple of ``num_generations``, checked). Multimodal inputs, tool
masks, any batch key not listed here and ``multi_objective_aggregation: normalize_then_sum``
(whose advantages depend on the whole batch, so groups from different rounds would not mix) are
refused by name. With ``scale_rewards: batch`` each group keeps the advantages of its own round's
batch std. The TRL range is pinned in ``pyproject.toml``; ``tests/training/test_trl_contract.py``
fails when TRL's methods, batch keys, metric names or completions table change shape.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from trl import GRPOTrainer
from trl.trainer.utils import nanmax, nanmin

from memsifter.rewards.shaping import RunClock
from memsifter.training.dynamic_sampling_metrics import (
    _LOG_KEYS,
    _SAMPLING_METRICS,
    _empty_logs,
    importance_sampling_stats,
    recomputed_metrics,
    select_log_rows,
    trained_metrics,
    weighted_rewards,
)

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


class GroupRef(NamedTuple):
    """One group of one generation round. ``group`` indexes the round's *global* batch (every
    process's rows in process order), so process ``group // groups_per_process`` generated it."""

    round: int
    group: int


def zero_std_groups(rewards: torch.Tensor, num_generations: int, min_std: float) -> torch.Tensor:
    """Boolean per group: True where the group's (NaN-aware) reward std is ``<= min_std``."""
    grouped = rewards.view(-1, num_generations)
    mean = torch.nanmean(grouped, dim=1, keepdim=True)
    var = torch.nanmean((grouped - mean) ** 2, dim=1)
    return torch.nan_to_num(var.sqrt(), nan=0.0) <= min_std


def count_informative(zero_std: Sequence[Sequence[bool]]) -> int:
    """Informative (not flat) groups over every round's flags."""
    return sum(not flat for flags in zero_std for flat in flags)


def select_groups(
    zero_std: Sequence[Sequence[bool]], need: int
) -> tuple[list[GroupRef], list[GroupRef]]:
    """(trained, padding) for a global batch of ``need`` groups, from every round's flags over
    the global batch: the first informative groups in round-then-group order, then, only when
    fewer than ``need`` were found, the first zero-std groups to fill the batch."""
    refs = [GroupRef(r, g) for r, flags in enumerate(zero_std) for g in range(len(flags))]
    trained = [ref for ref in refs if not zero_std[ref.round][ref.group]][:need]
    padding = [ref for ref in refs if zero_std[ref.round][ref.group]][: need - len(trained)]
    if len(trained) + len(padding) != need:
        raise ValueError(f"{len(refs)} generated groups cannot fill a batch of {need}")
    return trained, padding


def assign_groups(groups: Sequence[GroupRef], per_process: int, world: int) -> list[list[GroupRef]]:
    """Which process trains which group, ``per_process`` groups each. Every process first keeps
    the groups it generated (no transfer); the rest fill the other processes' free places in
    process order. Pure and order-preserving: every process computes the same plan from the same
    broadcast flags."""
    if len(groups) != per_process * world:
        raise ValueError(f"{len(groups)} groups for {world} processes of {per_process}")
    plan: list[list[GroupRef]] = [[] for _ in range(world)]
    spill: list[GroupRef] = []
    for ref in groups:
        owner = ref.group // per_process
        if len(plan[owner]) < per_process:
            plan[owner].append(ref)
        else:
            spill.append(ref)
    for ref in spill:
        dest = next(p for p in range(world) if len(plan[p]) < per_process)
        plan[dest].append(ref)
    return plan


def moved_groups(plan: Sequence[Sequence[GroupRef]], per_process: int) -> list[GroupRef]:
    """The groups a process other than their generator trains."""
    return [ref for p, refs in enumerate(plan) for ref in refs if ref.group // per_process != p]


def group_rows(groups: Sequence[int], num_generations: int) -> torch.Tensor:
    """Row indices of ``groups`` (a group's completions are adjacent rows)."""
    return torch.tensor(
        [i * num_generations + j for i in groups for j in range(num_generations)], dtype=torch.long
    )


def check_whole_groups(local_rows: int, num_generations: int) -> None:
    """Groups move between processes whole, so each process's slice must hold whole groups
    (TRL only needs the *global* batch to; with one process the two agree)."""
    if local_rows % num_generations:
        raise ValueError(
            "dynamic sampling keeps whole groups per process: per_device_train_batch_size "
            f"x steps_per_generation ({local_rows}) must be a multiple of num_generations "
            f"({num_generations})"
        )


def mask_untrained(completion_mask: torch.Tensor, trained_rows: torch.Tensor) -> torch.Tensor:
    """The completion mask with padding rows (``trained_rows`` False) zeroed: such a row adds
    nothing to the loss, the KL or entropy terms, the loss-side metrics or the token count."""
    return completion_mask * trained_rows.to(completion_mask.dtype).unsqueeze(1)


def _pad_value(key: str, pad_token_id: int) -> float:
    fill = _LEFT_PADDED.get(key, _RIGHT_PADDED.get(key, 0))
    return pad_token_id if fill == "pad" else fill


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


def check_batch_keys(batch: dict[str, Any]) -> None:
    """Refuse, by name, batch keys dynamic sampling does not know how to move or merge."""
    bad = {k for k, v in batch.items() if v is not None} - _MERGED - {"num_items_in_batch"}
    if bad:
        raise NotImplementedError(
            f"dynamic sampling does not support batches with {sorted(bad)} (multimodal "
            "inputs, tool masks, or a key a newer TRL added)"
        )


def merge_batches(
    parts: Sequence[tuple[dict[str, Any], torch.Tensor]], pad_token_id: int
) -> dict[str, Any]:
    """Rows ``idx`` of each TRL generation batch, concatenated, with prompt tensors re-padded
    on the left and completion tensors on the right. ``num_items_in_batch`` is left to the
    caller (it is a cross-process sum)."""
    keys = [k for k in parts[0][0] if k != "num_items_in_batch"]
    for batch, _ in parts:
        check_batch_keys(batch)
        if [k for k in batch if k != "num_items_in_batch"] != keys:
            raise ValueError("generation batches disagree on their keys; cannot merge them")
    out: dict[str, Any] = {}
    for key in keys:
        values = [batch[key] for batch, _ in parts]
        if values[0] is None:
            out[key] = None
            continue
        rows = [v[idx.to(v.device)] for v, (_, idx) in zip(values, parts, strict=True)]
        out[key] = _pad_cat(rows, _pad_value(key, pad_token_id), left=key in _LEFT_PADDED)
    return out


@dataclass
class _Scored:
    """What ``_calculate_rewards`` saw: the gathered rewards and this process's completions."""

    rewards_per_func: torch.Tensor  # global rows x reward functions
    completion_lengths: list[int]  # this process's rows
    truncated: list[bool]  # this process's rows: the last token is not EOS/pad


@dataclass
class _Round:
    """One generation round: this process's TRL batch, and the global per-row facts."""

    batch: dict[str, Any]
    zero_std: list[bool]  # per global group, the main process's flags
    rewards_per_func: torch.Tensor  # global rows
    prompt_lengths: torch.Tensor  # global rows
    completion_lengths: torch.Tensor  # global rows
    truncated: torch.Tensor  # global rows
    logs: dict[str, Any]  # TRL's completions-table rows for the round (global rows)
    metrics: dict[str, list[float]]  # what TRL logged for the round


class DynamicSamplingGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` with DAPO's dynamic sampling (see the module docstring)."""

    def __init__(
        self,
        *args: Any,
        max_extra_rounds: int = 2,
        min_std: float = 1e-6,
        clock: RunClock | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if max_extra_rounds < 0:
            raise ValueError(f"max_extra_rounds must be >= 0, got {max_extra_rounds}")
        self.max_extra_rounds = max_extra_rounds
        self.min_std = min_std
        # The run's clock: each epoch is a new trainer whose global_step restarts at 0, and
        # without the earlier epochs' steps every epoch would refill from the same prompts.
        self.clock = clock or RunClock()
        self._scored: _Scored | None = None
        check_whole_groups(
            self.args.per_device_train_batch_size * self.args.steps_per_generation,
            self.num_generations,
        )
        if self.multi_objective_aggregation != "sum_then_normalize":
            raise NotImplementedError(
                "dynamic sampling needs multi_objective_aggregation sum_then_normalize: with "
                f"{self.multi_objective_aggregation!r} an advantage depends on the whole batch, "
                "so groups from different rounds cannot be mixed"
            )
        if set(self._logs) != _LOG_KEYS:
            raise NotImplementedError(
                f"TRL's completions table has keys {sorted(self._logs)}, dynamic sampling "
                f"knows {sorted(_LOG_KEYS)}"
            )

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):  # type: ignore[no-untyped-def]
        """TRL's gathered rewards, unchanged; keeps them and this process's completion lengths
        and truncation flags, which TRL only turns into batch-wide metrics (so they cannot be
        recomputed for the trained groups afterwards)."""
        rewards_per_func = super()._calculate_rewards(
            inputs, prompts, completions, completion_ids_list
        )
        # TRL's own length and truncation tests (``_generate``), on the same token lists.
        eos_and_pad = {*self.eos_token_ids, self._tokenizer.pad_token_id}
        self._scored = _Scored(
            rewards_per_func=rewards_per_func,
            completion_lengths=[len(ids) for ids in completion_ids_list],
            truncated=[ids[-1] not in eos_and_pad for ids in completion_ids_list],
        )
        return rewards_per_func

    def _refill_inputs(self, n_rows: int, round_: int) -> list[dict[str, Any]]:
        """This process's slice of a fresh global generation batch: prompts drawn without
        replacement from the training set, seeded by (seed, run step, round), each repeated per
        generation. Every process draws the same global batch and generates its own slice."""
        step = self.clock.at(self.state.global_step)
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

    def _score_round(self, inputs: list[dict[str, Any]]) -> _Round:
        """One TRL generation round with its metrics and completions table kept apart (TRL logs
        as it goes; only the groups that train may reach the real ones)."""
        from accelerate.utils import broadcast

        real_metrics, real_logs = self._metrics["train"], self._logs
        tokens_seen = self.state.num_input_tokens_seen
        self._metrics["train"], self._logs = defaultdict(list), _empty_logs()
        self._scored = None
        try:
            batch = super()._generate_and_score_completions(inputs)
            metrics, logs = self._metrics["train"], self._logs
        finally:
            self._metrics["train"], self._logs = real_metrics, real_logs
            self.state.num_input_tokens_seen = tokens_seen
        scored = self._scored
        if scored is None:
            raise RuntimeError("TRL scored the round without _calculate_rewards")
        if logs["images"]:
            raise NotImplementedError("dynamic sampling does not support image batches")
        check_batch_keys(batch)
        device = self.accelerator.device
        rewards = weighted_rewards(scored.rewards_per_func, self.reward_weights)
        flat = zero_std_groups(rewards, self.num_generations, self.min_std)
        # The main process decides; the others take its flags (one tiny collective).
        flat = broadcast(flat.to(device=device, dtype=torch.uint8), from_process=0).bool()
        gather = self.accelerator.gather
        return _Round(
            batch=batch,
            zero_std=flat.tolist(),
            rewards_per_func=scored.rewards_per_func,
            prompt_lengths=gather(batch["prompt_mask"].sum(dim=1)),
            completion_lengths=gather(torch.tensor(scored.completion_lengths, device=device)),
            truncated=gather(torch.tensor(scored.truncated, device=device)),
            logs=logs,
            metrics=dict(metrics),
        )

    def _gather_batch(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Every process's rows of a round's batch, in process order (a collective)."""
        pad_id = self._tokenizer.pad_token_id
        out: dict[str, Any] = {}
        for key, value in batch.items():
            if key == "num_items_in_batch" or value is None:
                out[key] = value
                continue
            if value.dim() > 1:
                value = self.accelerator.pad_across_processes(
                    value, dim=1, pad_index=_pad_value(key, pad_id), pad_first=key in _LEFT_PADDED
                )
            out[key] = self.accelerator.gather(value)
        return out

    def _planned_batch(
        self, rounds: Sequence[_Round], plan: Sequence[Sequence[GroupRef]], trained: set[GroupRef]
    ) -> tuple[dict[str, Any], torch.Tensor]:
        """This process's batch under ``plan``, and which of its rows train. Rounds with a group
        that changes process are gathered on every process, in round order."""
        g = self.num_generations
        rank = self.accelerator.process_index
        per_process = len(plan[rank])
        gathered = {
            r: self._gather_batch(rounds[r].batch)
            for r in sorted({ref.round for ref in moved_groups(plan, per_process)})
        }
        parts: list[tuple[dict[str, Any], torch.Tensor]] = []
        keep: list[bool] = []
        mine = sorted(plan[rank])
        for r in sorted({ref.round for ref in mine}):
            refs = [ref for ref in mine if ref.round == r]
            if r in gathered:
                parts.append((gathered[r], group_rows([ref.group for ref in refs], g)))
            else:  # nothing of this round moved: every group here is this process's own
                local = [ref.group - rank * per_process for ref in refs]
                if not all(0 <= i < per_process for i in local):
                    raise RuntimeError(f"round {r}: groups {refs} are not process {rank}'s own")
                parts.append((rounds[r].batch, group_rows(local, g)))
            keep += [ref in trained for ref in refs for _ in range(g)]
        merged = merge_batches(parts, self._tokenizer.pad_token_id)
        trained_rows = torch.tensor(keep, device=merged["completion_mask"].device)
        return merged, trained_rows

    def _log_trained(
        self,
        rounds: Sequence[_Round],
        trained: Sequence[GroupRef],
        batch: dict[str, Any],
        trained_rows: torch.Tensor,
    ) -> None:
        """TRL's metrics and completions table for the groups that trained only."""
        g = self.num_generations
        metrics = self._metrics["train"]
        by_round = [
            sorted(ref.group for ref in trained if ref.round == r) for r in range(len(rounds))
        ]
        rows = [group_rows(groups, g) for groups in by_round]

        def cat(field: str) -> torch.Tensor:
            return torch.cat(
                [
                    getattr(rnd, field)[idx.to(getattr(rnd, field).device)]
                    for rnd, idx in zip(rounds, rows, strict=True)
                ]
            )

        completion_lengths = cat("completion_lengths")
        values = trained_metrics(
            cat("rewards_per_func"),
            self.reward_weights,
            self.reward_func_names,
            completion_lengths,
            cat("truncated"),
            g,
        )
        for key, value in values.items():
            metrics[key].append(value)
        tokens = (cat("prompt_lengths") + completion_lengths).sum().item()
        self.state.num_input_tokens_seen += tokens
        metrics["num_tokens"] = [self.state.num_input_tokens_seen]
        if trained and self.use_vllm and self.vllm_importance_sampling_correction:
            sequence_level = self.vllm_importance_sampling_mode in (
                "sequence_mask",
                "sequence_truncate",
            )
            local = importance_sampling_stats(batch, trained_rows, sequence_level)
            stats = self.accelerator.gather(local.reshape(1, -1)).view(-1, len(local))
            reduced = (
                torch.nanmean(stats[:, 0]),
                nanmax(stats[:, 1]),
                nanmin(stats[:, 2]),
                torch.nanmean(stats[:, 3]),
                nanmax(stats[:, 4]),
            )
            for key, value in zip(_SAMPLING_METRICS, reduced, strict=True):
                metrics[key].append(value.item())
        # What TRL logged that is not recomputed here: reward functions' log_metric scalars,
        # one per scored batch, discarded rounds included (see the module docstring).
        recomputed = recomputed_metrics(self.reward_func_names)
        for rnd in rounds:
            for key, logged in rnd.metrics.items():
                if key not in recomputed:
                    metrics[key].extend(logged)
        # TRL's table holds the last generation batch: replace it with the trained rows.
        table = select_log_rows([rnd.logs for rnd in rounds], [r.tolist() for r in rows])
        for key in ("prompt", "completion", "advantages"):
            self._logs[key].clear()
            self._logs[key].extend(table[key])
        for nested in ("rewards", "extra"):
            self._logs[nested].clear()
            for column, column_values in table[nested].items():
                self._logs[nested][column].extend(column_values)
        self._logs["images"].clear()

    def _generate_and_score_completions(self, inputs):  # type: ignore[no-untyped-def]
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)
        n_rows = len(inputs)
        per_process = n_rows // self.num_generations  # groups each process hands back
        world = self.accelerator.num_processes
        need = per_process * world
        rounds = [self._score_round(inputs)]
        while (
            count_informative([r.zero_std for r in rounds]) < need
            and len(rounds) <= self.max_extra_rounds
        ):
            rounds.append(self._score_round(self._refill_inputs(n_rows, len(rounds))))

        flags = [r.zero_std for r in rounds]
        trained, padding = select_groups(flags, need)
        plan = assign_groups(trained + padding, per_process, world)
        batch, trained_rows = self._planned_batch(rounds, plan, set(trained))
        batch["completion_mask"] = mask_untrained(batch["completion_mask"], trained_rows)
        # TRL's own count (loss-mask tokens over every process), now over the trained rows.
        count = batch["completion_mask"].sum().reshape(1)
        batch["num_items_in_batch"] = self.accelerator.gather(count).sum()

        self._log_trained(rounds, trained, batch, trained_rows)
        metrics = self._metrics["train"]
        generated = sum(len(f) for f in flags)
        metrics["dynamic_sampling/effective_groups"].append(float(len(trained)))
        metrics["dynamic_sampling/batch_groups"].append(float(need))
        metrics["dynamic_sampling/extra_rounds"].append(float(len(rounds) - 1))
        metrics["dynamic_sampling/informative_frac"].append(
            count_informative(flags) / max(generated, 1)
        )
        metrics["dynamic_sampling/moved_groups"].append(float(len(moved_groups(plan, per_process))))
        return batch
