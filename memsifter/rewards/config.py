"""The reward's typed configuration (``configs/rewards/default.yaml``).

One dataclass tree says everything the reward depends on: tiers, shaping, the format reward, the
task score per dataset, and the working LLM (and judge) that produce s_k. Loading goes through
:func:`memsifter.config.load_config`, so unknown keys and wrong types are errors naming the key.

The answerer must decode greedily (``temperature: 0``). The reward service shares one working-LLM
call between every completion whose top-k prefix renders the same prompt, and caches answers
across steps; that is only the same as calling once per completion when the answer is a function
of the prompt, which sampling is not. A non-zero temperature is refused here rather than
silently ignored.

Two rules keep the reward from paying for the wrong thing:

* ``format_reward`` may not exceed the lowest reward a parsed ranking can get. R_ans lies in
  [-1, 1] (task scores are in [0, 1] and the tier weights sum to 1) and beta * R_ret >= 0, so the
  floor is -alpha, or 0 for a retrieval-only stage (alpha = 0) or when ``subtract_s0`` is false
  (R_ans in [0, 1]: what ``grpo.scale_rewards: mean``, which needs rewards >= 0, can train on).
  A higher format reward would let an unparseable completion beat an honest ranking whose
  answers got worse.
* ``exclude_categories`` leaves rows out of R_ans (R_ans counts as 0, no working-LLM call; R_ret
  and the format reward still apply). The default excludes LoCoMo category 5 (adversarial): the
  answerer is told to reply "No information available" to these, which scores 1 with no memory,
  so any evidence shown can only lower s_k and R_ans would punish finding it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from memsifter.config import load_config
from memsifter.errors import DataError
from memsifter.qa.answerer import MEMORY_ORDERS
from memsifter.qa.scores import TASK_METRICS
from memsifter.rewards.retrieval import DEFAULT_RETRIEVAL_K
from memsifter.rewards.shaping import SCHEDULES, ShapingSchedule
from memsifter.rewards.tiers import TIER_WEIGHTS


@dataclass(frozen=True)
class AnswererSettings:
    """The working LLM whose scores s_k define the reward."""

    model: str = "smollm2-135m-instruct"
    backend: str = "transformers"  # transformers | openai | vllm
    base_url: str | None = None  # openai: the server
    served_model_name: str | None = None  # openai: the name the server knows it by
    window_tokens: int = 8192  # prompt + answer; lower-ranked sessions are cut to fit
    max_new_tokens: int = 48
    temperature: float = 0.0  # must be 0: see the module docstring
    # How the top-k sessions are shown to the working LLM: "chronological" (oldest first, as a
    # chat history reads; the default) or "rank" (best first). Which sessions fit the window is
    # decided by rank either way. With "chronological" s_k depends only on which sessions are in
    # the top k, which is what a tier measures, and completions whose top-k sets agree share a
    # call even when their orders differ (0.40x against 0.63x the naive calls in
    # eval/results/bench_rewards/bench_rewards.md). Order within the top k is still rewarded
    # through the tiers.
    memory_order: str = "chronological"
    language: str = "en"
    batch_size: int = 8  # transformers: prompts per forward pass
    max_concurrency: int = 16  # openai: requests in flight

    def __post_init__(self) -> None:
        if self.memory_order not in MEMORY_ORDERS:
            raise ValueError(
                f"answerer.memory_order must be one of {MEMORY_ORDERS}, got {self.memory_order!r}"
            )
        if self.temperature != 0.0:
            raise ValueError(
                f"answerer.temperature must be 0 (greedy), got {self.temperature}: the reward "
                "service shares and caches working-LLM answers by prompt, which is exact only "
                "under greedy decoding"
            )


# The judge of configs/rewards/default.yaml (LongMemEval's answers); its URL comes at launch.
DEFAULT_JUDGE_MODEL = "Qwen/Qwen3-8B"


@dataclass(frozen=True)
class JudgeSettings:
    """The LLM judge for datasets whose task metric is ``judge`` (OpenAI-compatible server).
    ``base_url`` may be left null in a shipped config and given at launch (``memsifter train
    --judge-url``, the judge role of ``scripts/train_multinode.sh``); a run refuses to start
    without it when a data source is judged."""

    model: str
    base_url: str | None = None
    served_model_name: str | None = None
    max_new_tokens: int = 16
    max_concurrency: int = 16


@dataclass(frozen=True)
class RetrySettings:
    """Retries of a whole working-LLM (or judge) batch, on top of the HTTP backend's own
    per-request retries. After the last attempt the error is raised: no reward is invented."""

    attempts: int = 3
    wait_s: float = 2.0  # exponential backoff base
    max_wait_s: float = 60.0


@dataclass(frozen=True)
class RewardConfig:
    max_k: int = 8  # deepest Fibonacci tier (capped by the number of candidates)
    # data_source -> its own deepest tier, for sources whose sessions the answerer's window cannot
    # hold max_k of: SmolLM2's 8,192 tokens hold about 3 LongMemEval sessions (~2,600 tokens
    # each), so tiers 5 and 8 would repeat tier 3's prompt. The tiers then stop at 3 and take
    # the weights of that shorter list; kept as repeats, they would credit tier 3 with the depth
    # it cannot see (with the paper's weights: memsifter.rewards.tiers.repeat_credit). The
    # service still reports (and warns about) any tier that repeats the one before.
    tier_max_k: dict[str, int] = field(default_factory=lambda: {"longmemeval": 3})
    # paper: w_n = C(F_n) - C(F_{n+1}) for every tier (the paper's 0.3691 ... 0.0528); tail: the
    # official code's, the last tier taking C(F_N) (... 0.3155). memsifter.rewards.tiers.
    tier_weights: str = "paper"
    retrieval_k: int = DEFAULT_RETRIEVAL_K  # NDCG cutoff of R_ret
    alpha: float = 1.0  # weight of R_ans; 0: a retrieval-only stage (no working-LLM calls)
    # R_ans = sum_n w_n (s_{F_n} - s_0), the paper's marginal utility; false scores the answers
    # themselves, sum_n w_n s_{F_n} (an ablation: the memory gym's "outcome_absolute" row).
    subtract_s0: bool = True
    beta0: float = 0.5  # initial weight of R_ret
    # The warm-up's length, one of the two (the other null): beta reaches 0 at optimiser step
    # decay_steps, or at decay_fraction (in (0, 1]) of the run's total optimiser steps, resolved
    # when the training loop calls RewardFunction.set_total_steps.
    decay_steps: int | None = 200
    decay_fraction: float | None = None
    schedule: str = "linear"  # linear | cosine
    # The reward of a completion without a usable ranking; at most the lowest reward a parsed
    # ranking can get (-alpha; 0 when alpha is 0 or subtract_s0 is false). See the module
    # docstring.
    format_reward: float = -1.0
    task_metrics: dict[str, str] = field(
        default_factory=lambda: {"locomo": "locomo", "longmemeval": "judge"}
    )
    # data_source -> categories left out of R_ans (R_ans = 0, no working-LLM call; R_ret and the
    # format reward still apply). LoCoMo 5 is adversarial; see the module docstring.
    exclude_categories: dict[str, tuple[str, ...]] = field(
        default_factory=lambda: {"locomo": ("5",)}
    )
    default_task_metric: str | None = "f1"  # for a data_source not in task_metrics; null: error
    cache_size: int = 200_000  # answers kept across steps (LRU, keyed by prompt hash)
    answerer: AnswererSettings = field(default_factory=AnswererSettings)
    # Loads without a URL (the URL usually comes at launch); `memsifter train` refuses to start
    # when a judged data source meets a judge without one (check_scorers).
    judge: JudgeSettings | None = field(default_factory=lambda: JudgeSettings(DEFAULT_JUDGE_MODEL))
    retry: RetrySettings = field(default_factory=RetrySettings)

    def __post_init__(self) -> None:
        if self.max_k < 1:
            raise ValueError(f"max_k must be >= 1, got {self.max_k}")
        for source, k in dict(self.tier_max_k).items():
            if not isinstance(k, int) or isinstance(k, bool) or k < 1:
                raise ValueError(f"tier_max_k.{source} must be an integer >= 1, got {k!r}")
        if self.tier_weights not in TIER_WEIGHTS:
            raise ValueError(
                f"tier_weights must be one of {TIER_WEIGHTS}, got {self.tier_weights!r}"
            )
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        metrics = dict(self.task_metrics)
        if self.default_task_metric is not None:
            metrics["<default>"] = self.default_task_metric
        for source, metric in metrics.items():
            if metric not in TASK_METRICS:
                raise ValueError(
                    f"task metric {metric!r} for {source!r} is not one of {TASK_METRICS}"
                )
        if self.retry.attempts < 1:
            raise ValueError(f"retry.attempts must be >= 1, got {self.retry.attempts}")
        if self.alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {self.alpha}")
        floor = self.lowest_reward
        if self.format_reward > floor:
            raise ValueError(
                f"format_reward must be <= {floor}, the lowest reward a parsed ranking can get "
                f"(alpha={self.alpha}, subtract_s0={self.subtract_s0}: R_ans in "
                f"[{-1 if self.subtract_s0 else 0}, 1], beta * R_ret >= 0); got "
                f"{self.format_reward}, which would let an unparseable completion beat an honest "
                f"ranking. Set format_reward: {floor} (or lower)"
            )
        excluded: dict[str, tuple[str, ...]] = {}
        for source, categories in dict(self.exclude_categories).items():
            if isinstance(categories, str) or not isinstance(categories, list | tuple):
                raise ValueError(
                    f"exclude_categories.{source} must be a list of categories, got {categories!r}"
                )
            excluded[str(source)] = tuple(str(c) for c in categories)
        object.__setattr__(self, "exclude_categories", excluded)
        _ = self.shaping  # validates decay_steps / decay_fraction

    @property
    def lowest_reward(self) -> float:
        """The lowest reward a parsed ranking can get: -alpha, or 0 when alpha is 0 or
        subtract_s0 is false (R_ans = sum_n w_n s_{F_n} >= 0 then)."""
        return -self.alpha if self.alpha > 0 and self.subtract_s0 else 0.0

    @property
    def shaping(self) -> ShapingSchedule:
        """The warm-up schedule; unresolved (see :meth:`ShapingSchedule.for_run`) when the config
        gives ``decay_fraction``."""
        return ShapingSchedule(
            self.alpha,
            self.beta0,
            self.decay_steps,
            self.schedule,  # type: ignore[arg-type]
            self.decay_fraction,
        )

    def max_k_for(self, data_source: str | None) -> int:
        """The deepest tier for rows of ``data_source``: ``tier_max_k``'s entry, else ``max_k``
        (either is capped by the number of candidates when the tiers are made)."""
        if data_source in self.tier_max_k:
            return self.tier_max_k[data_source]  # type: ignore[index]
        return self.max_k

    def answer_excluded(self, data_source: str | None, category: str | int | None) -> bool:
        """Whether rows of this source and category are left out of R_ans."""
        if category is None or data_source not in self.exclude_categories:
            return False
        return str(category) in self.exclude_categories[data_source]  # type: ignore[index]

    def scorer_problem(self, data_source: str) -> str | None:
        """Why rows of ``data_source`` could not be scored (None when they can): no task metric,
        a judge metric without a judge endpoint, or a working LLM on a server without its URL."""
        if self.alpha == 0:
            return None  # retrieval only: no answer is scored
        if data_source not in self.task_metrics and self.default_task_metric is None:
            return (
                f"data source {data_source!r} has no task metric (task_metrics.{data_source}) "
                "and default_task_metric is null"
            )
        metric = self.task_metric(data_source)
        if metric == "judge" and (self.judge is None or not self.judge.base_url):
            what = "no judge" if self.judge is None else f"no URL for its judge {self.judge.model}"
            return (
                f"data source {data_source!r} is scored by the LLM judge "
                f"(task_metrics.{data_source}: judge) but the reward config has {what}: pass "
                "--judge-url (the judge role of scripts/train_multinode.sh), set judge.base_url, "
                f"or choose token F1 explicitly (task_metrics.{data_source}: f1)"
            )
        if self.answerer.backend == "openai" and not self.answerer.base_url:
            return (
                f"data source {data_source!r} needs the working LLM's answers but answerer "
                f"backend openai has no base_url: pass --answerer-url (the answerer role of "
                "scripts/train_multinode.sh) or set answerer.base_url"
            )
        return None

    def check_scorers(self, data_sources: Iterable[str], where: str = "the reward config") -> None:
        """Refuse (DataError naming the source) when any of ``data_sources`` has no scorer: a
        run would otherwise crash on the first batch that holds one of its rows."""
        problems = [p for s in sorted(set(data_sources)) if (p := self.scorer_problem(s))]
        if problems:
            raise DataError("; ".join(problems), file=where, field="task_metrics")

    def task_metric(self, data_source: str | None) -> str:
        """The task score for rows from ``data_source``."""
        if data_source in self.task_metrics:
            return self.task_metrics[data_source]  # type: ignore[index]
        if self.default_task_metric is None:
            raise DataError(
                f"no task metric for data_source {data_source!r} and no default_task_metric",
                field="task_metrics",
            )
        return self.default_task_metric


def with_endpoints(
    config: RewardConfig, *, answerer_url: str | None = None, judge_url: str | None = None
) -> RewardConfig:
    """``config`` with the servers given at launch: the working LLM behind ``answerer_url``
    (OpenAI-compatible), the judge behind ``judge_url``. A judge URL needs the config to name
    the judge model (its tokenizer renders the prompts locally)."""
    if answerer_url:
        config = replace(
            config, answerer=replace(config.answerer, backend="openai", base_url=answerer_url)
        )
    if judge_url:
        if config.judge is None:
            raise DataError(
                "--judge-url given but the reward config names no judge model; add "
                "judge: {model: MODEL} (the model the judge server runs)",
                field="judge",
            )
        config = replace(config, judge=replace(config.judge, base_url=judge_url))
    return config


def load_reward_config(path: str | Path) -> RewardConfig:
    """Load and validate; a refused value (a sampling answerer, an unknown metric) names the
    file."""
    # memsifter.config turns a dataclass's own ValueError into a DataError naming the file.
    return load_config(RewardConfig, path)
