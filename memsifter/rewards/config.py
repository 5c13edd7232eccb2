"""The reward's typed configuration (``configs/rewards/default.yaml``).

One dataclass tree says everything the reward depends on: tiers, shaping, the format reward, the
task score per dataset, and the working LLM (and judge) that produce s_k. Loading goes through
:func:`memsifter.config.load_config`, so unknown keys and wrong types are errors naming the key.

The answerer must decode greedily (``temperature: 0``). The reward service shares one working-LLM
call between every completion whose top-k prefix renders the same prompt, and caches answers
across steps; that is only the same as calling once per completion when the answer is a function
of the prompt, which sampling is not. A non-zero temperature is refused here rather than
silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from memsifter.config import load_config
from memsifter.errors import DataError
from memsifter.qa.answerer import MEMORY_ORDERS
from memsifter.qa.scores import TASK_METRICS
from memsifter.rewards.retrieval import DEFAULT_RETRIEVAL_K
from memsifter.rewards.shaping import SCHEDULES, ShapingSchedule


@dataclass(frozen=True)
class AnswererConfig:
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
    # scripts/bench_rewards.md). Order within the top k is still rewarded through the tiers.
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


@dataclass(frozen=True)
class JudgeConfig:
    """The LLM judge for datasets whose task metric is ``judge`` (OpenAI-compatible server)."""

    model: str
    base_url: str
    served_model_name: str | None = None
    max_new_tokens: int = 16
    max_concurrency: int = 16


@dataclass(frozen=True)
class RetryConfig:
    """Retries of a whole working-LLM (or judge) batch, on top of the HTTP backend's own
    per-request retries. After the last attempt the error is raised: no reward is invented."""

    attempts: int = 3
    wait_s: float = 2.0  # exponential backoff base
    max_wait_s: float = 60.0


@dataclass(frozen=True)
class RewardConfig:
    max_k: int = 8  # deepest Fibonacci tier (capped by the number of candidates)
    retrieval_k: int = DEFAULT_RETRIEVAL_K  # NDCG cutoff of R_ret
    alpha: float = 1.0  # weight of R_ans
    beta0: float = 0.5  # initial weight of R_ret
    decay_steps: int = 200  # beta reaches 0 at this optimiser step
    schedule: str = "linear"  # linear | cosine
    format_reward: float = 0.0  # the reward of a completion without a usable ranking
    task_metrics: dict[str, str] = field(
        default_factory=lambda: {"locomo": "locomo", "longmemeval": "judge"}
    )
    default_task_metric: str | None = "f1"  # for a data_source not in task_metrics; null: error
    cache_size: int = 200_000  # answers kept across steps (LRU, keyed by prompt hash)
    answerer: AnswererConfig = field(default_factory=AnswererConfig)
    # Needed only once a judge-scored row arrives (the service raises then), so the default
    # config, which names the judge for LongMemEval, still loads where no judge server runs.
    judge: JudgeConfig | None = None
    retry: RetryConfig = field(default_factory=RetryConfig)

    def __post_init__(self) -> None:
        if self.max_k < 1:
            raise ValueError(f"max_k must be >= 1, got {self.max_k}")
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

    @property
    def shaping(self) -> ShapingSchedule:
        return ShapingSchedule(self.alpha, self.beta0, self.decay_steps, self.schedule)  # type: ignore[arg-type]

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


def load_reward_config(path: str | Path) -> RewardConfig:
    """Load and validate; a refused value (a sampling answerer, an unknown metric) names the
    file."""
    # memsifter.config turns a dataclass's own ValueError into a DataError naming the file.
    return load_config(RewardConfig, path)
