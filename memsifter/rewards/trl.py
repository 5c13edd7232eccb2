"""The reward as a TRL reward function: ``reward(prompts, completions, **columns) -> list[float]``.

What TRL (1.x, checked against trl 1.16.0's ``GRPOTrainer._calculate_rewards``) passes to a
custom reward function, all as keyword arguments:

* ``prompts`` and ``completions``: one entry per completion, so a prompt appears once for each of
  its ``num_generations`` completions. Standard (text) datasets give strings; conversational ones
  give message lists (the completion is ``[{"role": "assistant", "content": ...}]``).
* ``completion_ids``: token ids per completion (unused here).
* every dataset column other than ``prompt``/``completion``/``completion_ids``, as a list with one
  entry per completion (the row repeated for each of its completions);
* ``trainer_state``: the ``transformers.TrainerState``; ``global_step`` drives the beta schedule;
* ``log_metric(name, value)``: a scalar metric for this batch, averaged by TRL over the logging
  step and across processes and reported next to its own metrics (``kl``, ``entropy``, ...);
* ``log_extra(column, values)``: per-completion values added to the completions table;
* ``environments``: only with ``environment_factory`` (ignored here).

It is called once per generation batch on each process, which sees its own slice of completions;
TRL gathers the rewards before computing group advantages. A group split across processes is
scored in parts (s_0 is then computed once per part). Without ``trainer_state`` the step is
``RewardFunction.step`` (set it yourself); without ``log_metric`` the metrics are still kept in
``RewardFunction.last_metrics``, so the function works outside TRL and in tests.

A warm-up sized by ``decay_fraction`` needs the run's length: call
``RewardFunction.set_total_steps(total)`` (the run's optimiser steps over all epochs, on the
function's :class:`~memsifter.rewards.shaping.RunClock`) before the first call; until then
scoring raises.

Dataset columns read (contract with the GRPO dataset builder, written by
:func:`memsifter.rewards.columns.reward_columns`): ``question``, ``answer``, ``candidates``
(required), ``question_date``, ``gold_ids``, ``category``, ``data_source`` (optional). See
:mod:`memsifter.rewards.columns` for their types.

Metrics logged (prefix ``reward/`` by default): ``r_ans`` (mean over parsed completions that have
one; absent when none has, as with ``alpha: 0``), ``r_ret`` (mean over parsed completions),
``r_ans_skipped`` (parsed completions without R_ans: ``alpha: 0`` or an excluded category),
``beta``, ``s_0``, ``s_1``, ``s_2``, ... (the mean score curve; s_0 over prompts),
``parse_rate``, ``format_failures``, ``answer_calls``, ``naive_calls``, ``call_ratio``,
``cache_hits``, ``judge_calls``, ``answer_s``. Per completion (``log_extra``): ``r_ans``, ``r_ret``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from memsifter.errors import DataError
from memsifter.rewards.columns import REQUIRED_COLUMNS, sessions_from_column
from memsifter.rewards.service import RewardBatch, RewardRequest, RewardService
from memsifter.rewards.shaping import RunClock


def completion_text(completion: Any) -> str:
    """The completion's text: a string as is; for a message list, the last message's content."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion:
        last = completion[-1]
        if isinstance(last, dict) and isinstance(last.get("content"), str):
            return last["content"]
    raise DataError(f"cannot read a completion of type {type(completion).__name__}")


def _prompt_key(prompt: Any) -> str:
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)


class RewardFunction:
    """Callable TRL reward function around a :class:`RewardService`."""

    def __init__(self, service: RewardService, metric_prefix: str = "reward/") -> None:
        self.service = service
        self.metric_prefix = metric_prefix
        self.step = 0
        # The run's step clock across epochs (the warm-up's beta(t) keeps decaying over them);
        # the trainers read it from here.
        self.clock = RunClock()
        self.last_metrics: dict[str, float] = {}
        self.last_batch: RewardBatch | None = None
        self.last_completions: list[Any] = []
        # TRL names the reward in its logs after ``__name__`` (class name as a fallback).
        self.__name__ = "memsifter_reward"

    def set_total_steps(self, total_steps: int) -> None:
        """Size the warm-up to the run: ``total_steps`` optimiser steps over all epochs (the run
        clock's, :attr:`clock`). Required when the reward config gives ``decay_fraction``;
        harmless with ``decay_steps``."""
        self.clock.total = total_steps
        self.service.set_total_steps(total_steps)

    def __call__(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        completion_ids: Sequence[Any] | None = None,
        trainer_state: Any = None,
        log_metric: Callable[[str, float], None] | None = None,
        log_extra: Callable[[str, list], None] | None = None,
        **columns: Any,
    ) -> list[float]:
        n = len(completions)
        if len(prompts) != n:
            raise DataError(f"{len(prompts)} prompts for {n} completions")
        missing = [c for c in REQUIRED_COLUMNS if c not in columns]
        if missing:
            raise DataError(
                f"the reward needs dataset columns {list(REQUIRED_COLUMNS)}; missing {missing}"
            )
        for name, values in columns.items():
            if isinstance(values, list | tuple) and len(values) != n:
                raise DataError(f"column has {len(values)} values for {n} completions", field=name)

        groups: dict[str, list[int]] = defaultdict(list)
        for i, prompt in enumerate(prompts):
            groups[_prompt_key(prompt)].append(i)
        requests = [self._request(idx, completions, columns) for idx in groups.values()]

        step = getattr(trainer_state, "global_step", None)
        step = self.step if step is None else self.clock.at(step)
        batch = self.service.score(requests, step=step)

        rewards = [0.0] * n
        r_ans: list[float | None] = [None] * n
        r_ret: list[float | None] = [None] * n
        scored: list[Any] = [None] * n
        for idx, group in zip(groups.values(), batch.rewards, strict=True):
            for i, c in zip(idx, group, strict=True):
                rewards[i], r_ans[i], r_ret[i], scored[i] = c.reward, c.r_ans, c.r_ret, c
        self.last_batch = batch
        self.last_completions = scored  # each completion's CompletionReward, in input order
        self.last_metrics = self._metrics(batch)
        if log_metric is not None:
            for name, value in self.last_metrics.items():
                log_metric(self.metric_prefix + name, value)
        if log_extra is not None:
            log_extra(self.metric_prefix + "r_ans", r_ans)
            log_extra(self.metric_prefix + "r_ret", r_ret)
        return rewards

    @staticmethod
    def _request(
        idx: list[int], completions: Sequence[Any], columns: dict[str, Any]
    ) -> RewardRequest:
        first = idx[0]

        def col(name: str, default: Any = None) -> Any:
            return columns[name][first] if name in columns else default

        # Rows of one prompt must describe one question; a mismatch means the batch was
        # assembled wrongly, and scoring it against the first row would hide that.
        for name in ("question", "answer"):
            values = {str(columns[name][i]) for i in idx}
            if len(values) > 1:
                raise DataError(f"completions of one prompt disagree on {name}", field=name)
        gold = col("gold_ids") or ()
        return RewardRequest(
            question=str(col("question")),
            answer=str(col("answer")),
            candidates=sessions_from_column(col("candidates")),
            completions=tuple(completion_text(completions[i]) for i in idx),
            gold_ids=tuple(str(g) for g in gold),
            question_date=col("question_date"),
            category=None if col("category") is None else str(col("category")),
            data_source=col("data_source"),
        )

    @staticmethod
    def _metrics(batch: RewardBatch) -> dict[str, float]:
        s = batch.stats
        out: dict[str, float] = {
            "beta": s.beta,
            "parse_rate": s.parse_rate,
            "format_failures": float(s.completions - s.parsed),
            "r_ans_skipped": float(s.r_ans_skipped),
            "answer_calls": float(s.answer_calls),
            "naive_calls": float(s.naive_calls),
            "call_ratio": s.call_ratio,
            "cache_hits": float(s.cache_hits),
            "judge_calls": float(s.judge_calls),
            "answer_s": s.answer_s,
        }
        # Tiers that repeated the previous one (the answerer's window was full), per source.
        for source, n in s.tier_repeats.items():
            out[f"tier_repeats/{source}"] = float(n)
            out[f"window_full_k/{source}"] = float(s.window_full_k[source])
        parsed = [c for group in batch.rewards for c in group if c.parsed]
        answered = [c.r_ans for c in parsed if c.r_ans is not None]
        if answered:
            out["r_ans"] = sum(answered) / len(answered)
        if parsed:
            out["r_ret"] = sum(c.r_ret for c in parsed) / len(parsed)  # type: ignore[misc]
            curve: dict[int, list[float]] = defaultdict(list)
            for group in batch.rewards:
                done_s0 = False
                for c in group:
                    for k, v in c.tier_scores.items():
                        if k == 0:
                            if done_s0:
                                continue
                            done_s0 = True
                        curve[k].append(v)
            for k in sorted(curve):
                out[f"s_{k}"] = sum(curve[k]) / len(curve[k])
        return out


def make_reward_function(service: RewardService, metric_prefix: str = "reward/") -> RewardFunction:
    """The function to pass as ``GRPOTrainer(reward_funcs=[...])``."""
    return RewardFunction(service, metric_prefix)
