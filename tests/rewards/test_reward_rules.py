"""Rules that keep the reward from paying for the wrong thing (issue 11): the format reward sits at
or below the lowest reward a parsed ranking can get; omitting candidates never pays (a short
ranking is scored completed: an uninformative tail for R_ans, the worst tail for R_ret); LoCoMo's
adversarial category 5 is left out of R_ans; a retrieval-only stage (alpha = 0) never calls the
working LLM."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from memsifter.errors import DataError
from memsifter.qa.answerer import Answerer
from memsifter.rewards import (
    RewardConfig,
    RewardRequest,
    RewardService,
    load_reward_config,
    omission_order,
    retrieval_rewards,
)
from memsifter.testing.rewards import FakeWorkingLLM, fact_sessions, naive_rewards, ranking_text

ROOT = Path(__file__).resolve().parents[2]


def _service(cfg: RewardConfig) -> RewardService:
    return RewardService(
        Answerer(FakeWorkingLLM(), 100_000, 8, memory_order=cfg.answerer.memory_order), cfg
    )


def _request(completions: Sequence[str], n: int = 8, **kw: Any) -> RewardRequest:
    fields: dict[str, Any] = dict(
        question="What is the fact of c?",
        answer="blue Lisbon",
        candidates=fact_sessions(n),
        gold_ids=("c/s0", "c/s1"),
        question_date="9 May 2023",
        data_source="custom",
    )
    fields.update(kw)
    return RewardRequest(completions=tuple(completions), **fields)


# -- 1. the format reward -----------------------------------------------------------------------


def test_format_reward_may_not_beat_a_parsed_ranking(tmp_path: Path) -> None:
    assert RewardConfig().format_reward == -1.0 == RewardConfig().lowest_reward
    with pytest.raises(ValueError, match="format_reward must be <= -1.0"):
        RewardConfig(format_reward=0.0)
    with pytest.raises(ValueError, match="format_reward must be <= -2.0"):
        RewardConfig(alpha=2.0, format_reward=-1.0)
    assert RewardConfig(alpha=2.0, format_reward=-2.0).lowest_reward == -2.0
    # Retrieval only: R = beta * R_ret >= 0, so 0 is allowed, anything above refused.
    assert RewardConfig(alpha=0.0, format_reward=0.0).lowest_reward == 0.0
    with pytest.raises(ValueError, match="format_reward must be <= 0.0"):
        RewardConfig(alpha=0.0, format_reward=0.1)
    # subtract_s0: false scores the answers alone, R_ans in [0, 1]: the floor is 0 there too
    # (what grpo.scale_rewards: mean, which needs rewards >= 0, trains on).
    assert RewardConfig(subtract_s0=False, format_reward=0.0).lowest_reward == 0.0
    with pytest.raises(ValueError, match="format_reward must be <= 0.0"):
        RewardConfig(subtract_s0=False, format_reward=0.1)
    with pytest.raises(ValueError, match="alpha must be >= 0"):
        RewardConfig(alpha=-1.0, format_reward=-5.0)

    path = tmp_path / "r.yaml"
    path.write_text("format_reward: 0.0\n")
    with pytest.raises(DataError, match="format_reward") as err:
        load_reward_config(path)
    assert str(path) in str(err.value)
    for shipped in sorted((ROOT / "configs/rewards").glob("*.yaml")):
        cfg = load_reward_config(shipped)  # refused on load if the floor were broken
        assert cfg.format_reward <= cfg.lowest_reward, shipped.name


def test_worst_parsed_ranking_still_beats_garbage() -> None:
    """A ranking whose memory makes every answer worse (R_ans at its lowest: minus the weights'
    sum, -0.7374 with the paper's, -1 with the tail weights) never scores below an unparseable
    completion."""
    from memsifter.rewards import tier_weights

    for weights in ("paper", "tail"):
        cfg = RewardConfig(beta0=0.0, decay_steps=0, tier_weights=weights)
        # s_0 = 1 ("unknown" is the answer); any memory adds facts and spoils it.
        req = _request([ranking_text(range(8)), "garbage"], answer="unknown")
        worst, garbage = _service(cfg).score([req]).rewards[0]
        lowest = -sum(tier_weights((1, 2, 3, 5, 8), weights))
        assert worst.r_ans == pytest.approx(lowest)
        assert lowest == pytest.approx(-0.7374 if weights == "paper" else -1.0, abs=1e-4)
        assert worst.reward >= garbage.reward == cfg.format_reward


# -- 2. omission never pays ---------------------------------------------------------------------


def _documented_tail(question: str, n: int, given: Sequence[int]) -> list[int]:
    """The README's recipe, computed independently of the service."""
    order = sorted(range(n), key=lambda i: hashlib.sha256(f"{question}\n{i}".encode()).digest())
    return [i for i in order if i not in set(given)]


@pytest.mark.parametrize("memory_order", ["rank", "chronological"])
def test_short_ranking_answers_from_the_documented_tail(memory_order: str) -> None:
    from memsifter.rewards import AnswererSettings

    # No warm-up: the reward is R_ans alone (R_ret completes differently, see the next test).
    cfg = RewardConfig(
        beta0=0.0, decay_steps=0, answerer=AnswererSettings(memory_order=memory_order)
    )
    question = "What is the fact of c?"
    assert list(omission_order(question, 8)) == _documented_tail(question, 8, [])
    assert list(omission_order(question, 8)) != list(range(8))  # not the prompt (time) order
    prefixes = [[3], [5, 0], [6, 2, 7], [1, 2, 3, 4, 5, 6, 7]]
    short = [ranking_text(p) for p in prefixes]
    full = [ranking_text(p + _documented_tail(question, 8, p)) for p in prefixes]

    service = _service(cfg)
    batch = service.score([_request(short + full)])
    got = batch.rewards[0]
    for i, p in enumerate(prefixes):
        s, f = got[i], got[len(prefixes) + i]
        assert s.ranking == tuple(p) and s.omitted == 8 - len(p)  # the model's own ids kept
        assert (s.r_ans, s.tier_scores, s.reward) == (f.r_ans, f.tier_scores, f.reward)
        assert len(p) == 7 or s.tier_scores[8] != s.tier_scores[len(p)]
    # The completed rankings are the full ones: nothing extra is sent for the short ones.
    alone = _service(cfg).score([_request(full)])
    assert batch.stats.answer_calls == alone.stats.answer_calls
    expected, _ = naive_rewards(
        [_request(short + full)],
        Answerer(FakeWorkingLLM(), 100_000, 8, memory_order=memory_order),
        cfg,
    )
    assert [c.reward for c in got] == expected[0]


@pytest.mark.parametrize("n", [4, 5])
@pytest.mark.parametrize("retrieval_k", [10, 2])
def test_omission_never_beats_any_ordering_for_r_ret(n: int, retrieval_k: int) -> None:
    """For every prefix (every length, every order), R_ret of the prefix alone equals the worst
    R_ret of the prefix followed by any ordering of the rest: never above any of them."""
    # alpha = 0: R_ret only, so scoring hundreds of prefixes calls no working LLM.
    cfg = RewardConfig(alpha=0.0, format_reward=0.0, retrieval_k=retrieval_k)
    service = _service(cfg)
    prefixes = [
        list(p) for length in range(1, n + 1) for p in itertools.permutations(range(n), length)
    ]
    for gold in ([0], [n - 1], [1, 3], [0, 2, n - 1], list(range(n))):
        req = _request(
            [ranking_text(p) for p in prefixes], n=n, gold_ids=tuple(f"c/s{g}" for g in gold)
        )
        scored = service.score([req]).rewards[0]
        # Every prefix followed by every ordering of what it left out, in one NDCG call.
        owner, completions = [], []
        for j, prefix in enumerate(prefixes):
            rest = [i for i in range(n) if i not in prefix]
            for tail in itertools.permutations(rest):
                owner.append(j)
                completions.append(prefix + list(tail))
        values: list[list[float]] = [[] for _ in prefixes]
        for j, v in zip(owner, retrieval_rewards(completions, gold, retrieval_k), strict=True):
            values[j].append(v)
        for prefix, c, vs in zip(prefixes, scored, values, strict=True):
            assert c.r_ret == min(vs), (prefix, gold)
            assert all(c.r_ret <= v for v in vs)
    assert service.answerer.backend.batches == []


# -- 3. LoCoMo category 5 -----------------------------------------------------------------------


def test_adversarial_category_is_left_out_of_r_ans(tmp_path: Path) -> None:
    cfg = RewardConfig(beta0=0.5, decay_steps=10)
    assert cfg.exclude_categories == {"locomo": ("5",)}
    service = _service(cfg)
    adversarial = _request([ranking_text([0, 1, 2]), "garbage"], data_source="locomo", category="5")
    batch = service.score([adversarial], step=0)
    ranked, garbage = batch.rewards[0]
    assert service.answerer.backend.batches == []  # no working-LLM call at all
    assert ranked.r_ans is None and ranked.tier_scores == {}
    assert ranked.r_ret == 1.0 and ranked.reward == 0.5 * ranked.r_ret  # R_ans counts as 0
    assert garbage.reward == cfg.format_reward
    assert batch.stats.r_ans_skipped == 1 and batch.stats.naive_calls == 0
    expected, calls = naive_rewards([adversarial], service.answerer, cfg)
    assert expected == [[ranked.reward, garbage.reward]] and calls == 0

    # Other categories, and category 5 of another source, are answered.
    for kw in ({"data_source": "locomo", "category": "4"}, {"category": "5"}):
        other = _service(cfg)
        c = other.score([_request([ranking_text([0, 1, 2])], **kw)]).rewards[0][0]
        assert c.r_ans is not None and other.answerer.backend.batches
    # Switched off, category 5 is answered like any other.
    off = _service(RewardConfig(exclude_categories={}))
    assert off.score([adversarial]).rewards[0][0].r_ans is not None

    path = tmp_path / "r.yaml"
    path.write_text("exclude_categories: {locomo: [5], longmemeval: []}\n")
    loaded = load_reward_config(path)
    assert loaded.answer_excluded("locomo", "5") and loaded.answer_excluded("locomo", 5)
    assert not loaded.answer_excluded("longmemeval", "5")
    path.write_text("exclude_categories: {locomo: '5'}\n")
    with pytest.raises(DataError, match="exclude_categories.locomo"):
        load_reward_config(path)
    assert load_reward_config(ROOT / "configs/rewards/default.yaml").exclude_categories == {
        "locomo": ("5",)
    }


# -- 4. alpha = 0 -------------------------------------------------------------------------------


def test_alpha_zero_never_calls_the_working_llm() -> None:
    cfg = RewardConfig(
        alpha=0.0, format_reward=0.0, beta0=0.5, decay_steps=10, task_metrics={"lme": "judge"}
    )
    service = _service(cfg)
    reqs = [
        _request([ranking_text([1, 0, 2]), ranking_text([2]), "nope"]),
        _request([ranking_text([0])], data_source="lme"),  # judge-scored, and no judge: fine
    ]
    batch = service.score(reqs, step=2)
    assert service.answerer.backend.batches == [] and not service.answerer.backend.seen
    s = batch.stats
    assert (s.answer_calls, s.naive_calls, s.unique_prompts, s.judge_calls) == (0, 0, 0, 0)
    assert s.parsed == 3 and s.r_ans_skipped == 3
    beta = cfg.shaping.beta(2)
    for group in batch.rewards:
        for c in group:
            if c.parsed:
                assert c.r_ans is None and c.tier_scores == {}
                assert c.reward == beta * c.r_ret  # type: ignore[operator]
    assert batch.rewards[0][2].reward == 0.0  # the format reward
    fake = FakeWorkingLLM()
    expected, calls = naive_rewards(
        reqs, Answerer(fake, 100_000, 8, memory_order=cfg.answerer.memory_order), cfg, step=2
    )
    assert calls == 0 and not fake.seen
    assert [[c.reward for c in g] for g in batch.rewards] == expected
