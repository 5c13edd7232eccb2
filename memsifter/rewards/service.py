"""The reward service: rewards for GRPO groups at a fraction of the working-LLM calls.

For a group of n completions of one prompt, scoring each completion on its own costs n x (T + 1)
working-LLM calls (T tiers plus the no-memory s_0). The answerer's prompt depends only on the
question and the ranked sessions it is shown, and the answerer decodes greedily, so:

* **s_0 once per prompt.** The no-memory prompt is the same for every completion of a group.
* **Shared prefixes share a call.** Completions whose top-k agree (they very often agree at k = 1
  and 2) render the same tier prompt. Every needed prompt is keyed by the sha256 of its exact
  text (:meth:`memsifter.qa.answerer.Answerer.render`), so any two requests that would send the
  same bytes send them once, whatever the reason: same prefix (short rankings are completed in
  one fixed order per question, so they share too), or top-5 and top-8 both cut to the same
  sessions by the answerer's window.
* **One batch.** The unique prompts of the whole reward call go to the backend in one
  ``generate`` (batched by transformers / vLLM, concurrent with the backend's bound over HTTP).
* **Cache across steps.** Answers are kept (LRU, ``cache_size``) by prompt hash, since the working
  LLM is frozen: a question seen again in a later epoch reuses its answers.
* **Fail loudly.** The batch call is retried with tenacity on transient errors (on top of the
  HTTP backend's own per-request retries); after the last attempt :class:`RewardError` is raised.
  A reward is never made up for a call that did not happen.

A completion without a usable ranking (``parse_ranking(...).ok`` is false) gets the configured
``format_reward`` and costs no call; the ranking is never completed from the coarse order here.
A parsed ranking that names fewer candidates than the prompt showed is completed *for scoring*
(:mod:`memsifter.rewards.omission`): for R_ans with the omitted candidates in a fixed order
seeded by the question, for R_ret with them in the order worst for the ranking, so omission never
pays. ``CompletionReward.ranking`` keeps the model's own ids.

R_ans is not computed (``r_ans`` is None, it counts as 0 in the reward, and no working-LLM call
is made) for rows the config's ``exclude_categories`` names (LoCoMo's adversarial category 5 by
default), and for every row when ``alpha`` is 0 (a retrieval-only stage).

Sharing is exact only if an answer depends on nothing but its prompt. Greedy decoding is
required by the config; beyond that, batched generation can change the last bits of the logits
with the batch's padding, and so, at a near tie, the greedy answer. A backend with batch size 1
(or a batch-invariant server) makes service and naive loop (``naive_rewards`` in
``memsifter.testing.rewards``) agree bit for bit, which ``eval/bench/bench_rewards.py`` checks.
"""

from __future__ import annotations

import hashlib
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tenacity import Retrying

from memsifter.data.types import Session
from memsifter.errors import MemSifterError
from memsifter.llm import CALL_ERRORS, BackendSpec, retry_policy
from memsifter.qa.answerer import Answerer
from memsifter.qa.judge import LLMJudge
from memsifter.qa.scores import task_score
from memsifter.ranker.parse import ParsedRanking, parse_ranking
from memsifter.rewards.config import RewardConfig
from memsifter.rewards.marginal_utility import marginal_utility
from memsifter.rewards.omission import answer_ranking, omission_order, retrieval_ranking
from memsifter.rewards.retrieval import retrieval_rewards
from memsifter.rewards.shaping import ShapingSchedule
from memsifter.rewards.tiers import fibonacci_tiers

T = TypeVar("T")


class TierRepeatWarning(UserWarning):
    """A tier's answerer prompt repeats the previous tier's: the window was already full."""


class RewardError(MemSifterError):
    """The working LLM (or judge) could not be called; no reward is given rather than a made-up
    one."""


@dataclass(frozen=True)
class RewardRequest:
    """One prompt and its completions (a GRPO group, or the part of it this call received)."""

    question: str
    answer: str
    candidates: tuple[Session, ...]  # prompt order: completion ids index into it
    completions: tuple[str, ...]
    gold_ids: tuple[str, ...] = ()  # session ids
    question_date: str | None = None
    category: str | None = None
    data_source: str | None = None

    def gold_positions(self) -> tuple[int, ...]:
        """Prompt positions of the gold sessions that the prompt showed."""
        gold = set(self.gold_ids)
        return tuple(i for i, s in enumerate(self.candidates) if s.id in gold)

    def tiers(self, max_k: int) -> tuple[int, ...]:
        return fibonacci_tiers(min(max_k, len(self.candidates))) if self.candidates else ()


@dataclass(frozen=True)
class CompletionReward:
    reward: float
    parsed: bool
    ranking: tuple[int, ...] = ()  # positions as parsed (the model's own); empty when not parsed
    # None when not parsed, and when R_ans is not computed (alpha = 0 or an excluded category;
    # it then counts as 0 in the reward)
    r_ans: float | None = None
    r_ret: float | None = None
    tier_scores: dict[int, float] = field(default_factory=dict)  # k -> s_k, 0 -> s_0
    error: str | None = None  # the parse error kind
    omitted: int = 0  # candidates the ranking left out (completed for scoring only)


@dataclass
class RewardStats:
    """What one reward call did. ``naive_calls`` is what scoring each parsed completion on its
    own costs: parsed completions x (tiers + 1)."""

    step: int = 0
    beta: float = 0.0
    prompts: int = 0
    completions: int = 0
    parsed: int = 0
    r_ans_skipped: int = 0  # parsed completions without R_ans (alpha = 0, excluded category)
    naive_calls: int = 0
    prompt_refs: int = 0  # tier and s_0 prompts asked for, before any sharing
    unique_prompts: int = 0  # after sharing by prompt hash within the call
    answer_calls: int = 0  # prompts actually sent to the working LLM
    cache_hits: int = 0  # unique prompts answered by an earlier call
    judge_calls: int = 0
    # A tier whose prompt equals the previous tier's: the answerer's window was already full, so
    # the tier measured nothing new. Per data source: completions with such a repeat, and the
    # smallest tier k at which the window was full (the tier the repeats copy).
    tier_repeats: dict[str, int] = field(default_factory=dict)
    window_full_k: dict[str, int] = field(default_factory=dict)
    answer_s: float = 0.0
    total_s: float = 0.0

    @property
    def parse_rate(self) -> float:
        return self.parsed / self.completions if self.completions else 0.0

    @property
    def call_ratio(self) -> float:
        return self.answer_calls / self.naive_calls if self.naive_calls else 0.0

    def add(self, other: RewardStats) -> None:
        """Accumulate counts and times (``step``/``beta`` take the latest)."""
        for name in (
            "prompts",
            "completions",
            "parsed",
            "r_ans_skipped",
            "naive_calls",
            "prompt_refs",
            "unique_prompts",
            "answer_calls",
            "cache_hits",
            "judge_calls",
            "answer_s",
            "total_s",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.step, self.beta = other.step, other.beta
        for source, n in other.tier_repeats.items():
            self.tier_repeats[source] = self.tier_repeats.get(source, 0) + n
        for source, k in other.window_full_k.items():
            self.window_full_k[source] = min(k, self.window_full_k.get(source, k))


@dataclass
class RewardBatch:
    rewards: list[list[CompletionReward]]  # per request, per completion, in input order
    stats: RewardStats

    def flat(self) -> list[float]:
        return [c.reward for group in self.rewards for c in group]


def prompt_key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class RewardService:
    def __init__(
        self,
        answerer: Answerer,
        config: RewardConfig | None = None,
        judge: LLMJudge | None = None,
    ) -> None:
        self.answerer = answerer
        self.config = config or RewardConfig()
        if answerer.memory_order != self.config.answerer.memory_order:
            raise ValueError(
                f"the answerer shows memory in {answerer.memory_order!r} order but the reward "
                f"config says answerer.memory_order={self.config.answerer.memory_order!r}"
            )
        self.judge = judge
        self.shaping: ShapingSchedule = self.config.shaping
        self.total_steps: int | None = None
        self._cache: OrderedDict[str, str] = OrderedDict()
        self.totals = RewardStats()
        self._warned: set[tuple[str, int]] = set()  # (data source, full-at tier) warned about

    @classmethod
    def from_config(cls, config: RewardConfig) -> RewardService:
        """Build the answerer (and judge) backends the config names."""
        from memsifter import llm

        a = config.answerer
        answerer = Answerer(
            llm.build_backend(
                BackendSpec(
                    kind=a.backend,
                    model=a.model,
                    batch_size=a.batch_size,
                    base_url=a.base_url,
                    served_model_name=a.served_model_name,
                    max_concurrency=a.max_concurrency,
                )
            ),
            window_tokens=a.window_tokens,
            max_new_tokens=a.max_new_tokens,
            language=a.language,
            memory_order=a.memory_order,
        )
        judge = None
        # A judge without a URL is no judge (check_scorers refuses runs that need one).
        if config.judge is not None and config.judge.base_url:
            j = config.judge
            judge = LLMJudge(
                llm.build_backend(
                    BackendSpec(
                        kind="openai",
                        model=j.model,
                        base_url=j.base_url,
                        served_model_name=j.served_model_name,
                        max_concurrency=j.max_concurrency,
                    )
                ),
                max_new_tokens=j.max_new_tokens,
            )
        return cls(answerer, config, judge)

    def set_total_steps(self, total_steps: int) -> ShapingSchedule:
        """Size the warm-up to a run of ``total_steps`` optimiser steps (all epochs together, on
        the clock ``score``'s ``step`` uses). Needed when the config gives ``decay_fraction``;
        harmless with ``decay_steps``. Returns the resolved schedule."""
        self.shaping = self.config.shaping.for_run(total_steps)
        self.total_steps = total_steps
        return self.shaping

    # -- the call ---------------------------------------------------------------------------

    def score(self, requests: Sequence[RewardRequest], step: int = 0) -> RewardBatch:
        """Rewards for every completion of every request at optimiser step ``step``."""
        t0 = time.perf_counter()
        cfg = self.config
        stats = RewardStats(step=step, beta=self.shaping.beta(step), prompts=len(requests))
        texts: dict[str, str] = {}  # prompt hash -> prompt, first-seen order
        plans: list[_Plan] = []
        for req in requests:
            answers = needs_answers(cfg, req)
            plan = _Plan(
                req,
                cfg.task_metric(req.data_source) if answers else None,
                req.tiers(cfg.max_k_for(req.data_source)),
            )
            plan.parsed = [parse_ranking(c, len(req.candidates)) for c in req.completions]
            ok = [p for p in plan.parsed if p.ok]
            stats.completions += len(plan.parsed)
            stats.parsed += len(ok)
            if not answers:
                stats.r_ans_skipped += len(ok)
            elif ok:
                stats.naive_calls += len(ok) * (len(plan.tiers) + 1)
                stats.prompt_refs += 1 + len(ok) * len(plan.tiers)
                plan.key(self.answerer, ())
                order = omission_order(req.question, len(req.candidates))
                for p in ok:
                    full = answer_ranking(p.ids, req.question, len(req.candidates), order)
                    plan.shown[p.ids] = full
                    for k in plan.tiers:
                        plan.key(self.answerer, full[:k])
                    self._note_repeats(plan, full, stats)
            texts.update(plan.texts)
            plans.append(plan)
        stats.unique_prompts = len(texts)

        answers = self._answers(texts, stats)
        scores = self._scores(plans, answers, stats)

        rewards: list[list[CompletionReward]] = []
        for plan, group_scores in zip(plans, scores, strict=True):
            rewards.append(self._group_rewards(plan, group_scores, step))
        stats.total_s = time.perf_counter() - t0
        self.totals.add(stats)
        return RewardBatch(rewards, stats)

    def _note_repeats(self, plan: _Plan, full: tuple[int, ...], stats: RewardStats) -> None:
        """Record (and warn once per source and tier) when a tier's prompt repeats the previous
        tier's: the answerer's window was full at that previous tier, so the deeper tiers
        silently score it again. Dropping them (``tier_max_k``) or a larger answerer window
        (``answerer.window_tokens``) is the config's choice; here it is only made visible."""
        tiers = plan.tiers
        full_at = next(
            (
                a
                for a, b in zip(tiers, tiers[1:], strict=False)
                if plan.keys[full[:a]] == plan.keys[full[:b]]
            ),
            None,
        )
        if full_at is None:
            return
        source = str(plan.request.data_source)
        stats.tier_repeats[source] = stats.tier_repeats.get(source, 0) + 1
        stats.window_full_k[source] = min(full_at, stats.window_full_k.get(source, full_at))
        if (source, full_at) not in self._warned:
            self._warned.add((source, full_at))
            deeper = [k for k in tiers if k > full_at]
            warnings.warn(
                f"data source {source!r}: the answerer's window ({self.answerer.window_tokens} "
                f"tokens) is full at tier {full_at}, so tier(s) {deeper} repeat it and score "
                f"the same sessions; raise answerer.window_tokens or set "
                f"tier_max_k.{source}: {full_at} in the reward config",
                TierRepeatWarning,
                stacklevel=3,
            )

    def _answers(self, texts: dict[str, str], stats: RewardStats) -> dict[str, str]:
        answers = {h: self._cache[h] for h in texts if h in self._cache}
        for h in answers:
            self._cache.move_to_end(h)
        todo = [h for h in texts if h not in answers]
        stats.cache_hits = len(answers)
        if todo:
            t1 = time.perf_counter()
            predictions = self._retrying(
                "the working LLM", self.answerer.answer_texts, [texts[h] for h in todo]
            )
            stats.answer_s = time.perf_counter() - t1
            if len(predictions) != len(todo):
                raise RewardError(
                    f"the working LLM returned {len(predictions)} answers for {len(todo)} prompts"
                )
            stats.answer_calls = len(todo)
            answers.update(zip(todo, predictions, strict=True))
            for h in todo:
                self._cache[h] = answers[h]
            while len(self._cache) > self.config.cache_size:
                self._cache.popitem(last=False)
        return answers

    def _scores(
        self, plans: list[_Plan], answers: dict[str, str], stats: RewardStats
    ) -> list[dict[str, float]]:
        """Per plan: prompt hash -> task score of its answer."""
        out: list[dict[str, float]] = []
        judged: list[tuple[int, str, tuple[str, str, str]]] = []
        for i, plan in enumerate(plans):
            req = plan.request
            scores: dict[str, float] = {}
            for h in plan.texts:
                if plan.metric == "judge":
                    judged.append((i, h, (req.question, req.answer, answers[h])))
                else:
                    scores[h] = task_score(
                        answers[h],
                        req.answer,
                        plan.metric,  # type: ignore[arg-type]  # set whenever texts are
                        req.category,
                    )
            out.append(scores)
        if judged:
            judge = self.judge
            if judge is None:
                raise RewardError(
                    "a row's task metric is 'judge' but the reward service has no judge "
                    "(set judge: in the reward config, or pass --judge-url)"
                )
            before = judge.calls
            verdicts = self._retrying("the judge", judge.judge_many, [j[2] for j in judged])
            stats.judge_calls = judge.calls - before
            for (i, h, _), v in zip(judged, verdicts, strict=True):
                out[i][h] = v
        return out

    def _group_rewards(
        self, plan: _Plan, scores: dict[str, float], step: int
    ) -> list[CompletionReward]:
        cfg = self.config
        req = plan.request
        n = len(req.candidates)
        gold = req.gold_positions()
        ok = [p for p in plan.parsed if p.ok]
        r_rets = iter(
            retrieval_rewards(
                [retrieval_ranking(p.ids, n, gold) for p in ok], gold, cfg.retrieval_k
            )
        )
        answers = plan.metric is not None
        out: list[CompletionReward] = []
        for parsed in plan.parsed:
            if not parsed.ok:
                out.append(
                    CompletionReward(
                        cfg.format_reward,
                        False,
                        error=parsed.error.value,  # type: ignore[union-attr]
                    )
                )
                continue
            tier_scores: dict[int, float] = {}
            r_ans: float | None = None
            if answers:
                full = plan.shown[parsed.ids]
                tier_scores[0] = scores[plan.keys[()]]
                for k in plan.tiers:
                    tier_scores[k] = scores[plan.keys[full[:k]]]
                r_ans = marginal_utility(tier_scores, cfg.subtract_s0, cfg.tier_weights)
            r_ret = next(r_rets)
            out.append(
                CompletionReward(
                    reward=self.shaping.combine(0.0 if r_ans is None else r_ans, r_ret, step),
                    parsed=True,
                    ranking=parsed.ids,
                    r_ans=r_ans,
                    r_ret=r_ret,
                    tier_scores=tier_scores,
                    omitted=n - len(parsed.ids),
                )
            )
        return out

    def _retrying(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        retry = self.config.retry
        attempts = 0

        def attempt() -> T:
            nonlocal attempts
            attempts += 1
            return fn(*args)

        retrying = Retrying(**retry_policy(retry.attempts, retry.wait_s, retry.max_wait_s))
        try:
            return retrying(attempt)
        except CALL_ERRORS as e:
            raise RewardError(
                f"{what} failed after {attempts} attempt(s); refusing to substitute a "
                f"reward: {type(e).__name__}: {e}"
            ) from e


def needs_answers(config: RewardConfig, request: RewardRequest) -> bool:
    """Whether R_ans is computed for ``request``: not when alpha is 0, nor for a category the
    config's ``exclude_categories`` names."""
    return config.alpha != 0 and not config.answer_excluded(request.data_source, request.category)


@dataclass
class _Plan:
    """The prompts one request needs: prefix (positions) -> prompt hash. ``metric`` is None when
    the request needs no answers (see :func:`needs_answers`)."""

    request: RewardRequest
    metric: str | None
    tiers: tuple[int, ...]
    parsed: list[ParsedRanking] = field(default_factory=list)
    # parsed ids -> the ranking the working LLM is shown (completed, see rewards.omission)
    shown: dict[tuple[int, ...], tuple[int, ...]] = field(default_factory=dict)
    keys: dict[tuple[int, ...], str] = field(default_factory=dict)  # prefix -> prompt hash
    texts: dict[str, str] = field(default_factory=dict)

    def key(self, answerer: Answerer, prefix: tuple[int, ...]) -> str:
        if prefix not in self.keys:
            text = render_prefix(answerer, self.request, prefix)
            h = prompt_key(text)
            self.texts.setdefault(h, text)
            self.keys[prefix] = h
        return self.keys[prefix]


def render_prefix(answerer: Answerer, request: RewardRequest, prefix: Sequence[int]) -> str:
    """The working LLM's prompt for a top-k ``prefix`` of candidate positions. Positions double
    as time keys: the proxy prompt lists candidates oldest first."""
    return answerer.render(
        request.question,
        [request.candidates[i] for i in prefix],
        request.question_date,
        times=list(prefix),
    )
