"""Tiers that the answerer's window cannot fill: a LongMemEval-sized prompt (sessions of ~2,600
tokens) in an 8,192-token window repeats tier 3 at tiers 5 and 8. The service reports it per data
source and warns; the shipped configs either drop those tiers (default.yaml, SmolLM2's window) or
give the working LLM a window that holds all eight (qwen3_4b.yaml)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from memsifter.data.types import Session, Turn
from memsifter.qa.answerer import Answerer
from memsifter.rewards import (
    RewardConfig,
    RewardRequest,
    RewardService,
    TierRepeatWarning,
    load_reward_config,
    make_reward_function,
    position_value,
    repeat_credit,
)
from memsifter.testing.rewards import FACTS, FakeWorkingLLM, ranking_text

ROOT = Path(__file__).resolve().parents[2]
SESSION_TOKENS = 2_600  # a LongMemEval-S session's mean length


def _longmemeval_request(n: int = 8) -> RewardRequest:
    filler = " ".join(["word"] * SESSION_TOKENS)
    sessions = tuple(
        Session(
            id=f"lme/s{i}",
            turns=(Turn("user", f"the fact is {FACTS[i]}. {filler}"), Turn("assistant", "ok")),
            date_text=f"{i + 1} May 2023",
        )
        for i in range(n)
    )
    return RewardRequest(
        question="What did I mention?",
        answer="blue Lisbon",
        candidates=sessions,
        completions=(ranking_text(range(n)), ranking_text(reversed(range(n)))),
        gold_ids=("lme/s0",),
        data_source="longmemeval",
    )


def _service(cfg: RewardConfig, window: int) -> tuple[RewardService, FakeWorkingLLM]:
    llm = FakeWorkingLLM()
    answerer = Answerer(llm, window, 48, memory_order=cfg.answerer.memory_order)
    return RewardService(answerer, cfg), llm


def _f1(cfg: RewardConfig, **changes: object) -> RewardConfig:
    """``cfg`` scoring LongMemEval with token F1 (the fake working LLM has no judge)."""
    from dataclasses import replace

    return replace(cfg, task_metrics={**cfg.task_metrics, "longmemeval": "f1"}, **changes)


def test_a_full_window_is_reported_and_warned_not_repeated_silently() -> None:
    cfg = _f1(load_reward_config(ROOT / "configs/rewards/default.yaml"), tier_max_k={})
    assert cfg.answerer.window_tokens == 8192
    service, _ = _service(cfg, cfg.answerer.window_tokens)
    with pytest.warns(TierRepeatWarning, match=r"'longmemeval'.*full at tier 3.*\[5, 8\]"):
        batch = service.score([_longmemeval_request()])
    assert batch.stats.tier_repeats == {"longmemeval": 2}  # both completions
    assert batch.stats.window_full_k == {"longmemeval": 3}
    assert service.totals.window_full_k == {"longmemeval": 3}
    for c in batch.rewards[0]:
        assert c.tier_scores[5] == c.tier_scores[8] == c.tier_scores[3]

    # Logged through TRL per data source.
    fn = make_reward_function(_service(cfg, 8192)[0])
    req = _longmemeval_request()
    with pytest.warns(TierRepeatWarning):
        fn(
            prompts=["p", "p"],
            completions=list(req.completions),
            question=[req.question] * 2,
            answer=[req.answer] * 2,
            candidates=[_candidates_column(req)] * 2,
            gold_ids=[list(req.gold_ids)] * 2,
            data_source=["longmemeval"] * 2,
        )
    assert fn.last_metrics["window_full_k/longmemeval"] == 3.0
    assert fn.last_metrics["tier_repeats/longmemeval"] == 2.0

    # Warned once per source and tier, reported every call.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = service.score([_longmemeval_request()])
    assert again.stats.tier_repeats == {"longmemeval": 2}


def _candidates_column(req: RewardRequest) -> str:
    from memsifter.rewards import sessions_to_column

    return sessions_to_column(req.candidates)


def test_the_default_config_drops_the_tiers_it_cannot_fill() -> None:
    """default.yaml stops LongMemEval at tier 3: no repeat, no warning. With the paper's
    weights, scoring the repeated tiers instead credits tier 3 with repeat_credit more weight
    (C(5) - C(13)); with the tail weights (they telescope) R_ans is the same number."""
    cfg = _f1(load_reward_config(ROOT / "configs/rewards/default.yaml"))
    assert cfg.max_k_for("longmemeval") == 3 and cfg.max_k_for("locomo") == 8
    service, _ = _service(cfg, cfg.answerer.window_tokens)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batch = service.score([_longmemeval_request()])
    assert batch.stats.tier_repeats == {}
    assert all(sorted(c.tier_scores) == [0, 1, 2, 3] for c in batch.rewards[0])

    repeating, _ = _service(_f1(cfg, tier_max_k={}), cfg.answerer.window_tokens)
    with pytest.warns(TierRepeatWarning):
        full = repeating.score([_longmemeval_request()])
    assert all(sorted(c.tier_scores) == [0, 1, 2, 3, 5, 8] for c in full.rewards[0])
    credit = repeat_credit((1, 2, 3, 5, 8), 3)
    assert credit == pytest.approx(position_value(5) - position_value(13), abs=1e-15)
    for dropped, kept in zip(batch.rewards[0], full.rewards[0], strict=True):
        s = kept.tier_scores
        assert s[5] == s[8] == s[3]  # the repeats score what tier 3 scored
        assert kept.r_ans - dropped.r_ans == pytest.approx(credit * (s[3] - s[0]), abs=1e-12)

    tail = _f1(cfg, tier_weights="tail")
    tail_dropped, _ = _service(tail, cfg.answerer.window_tokens)
    tail_kept, _ = _service(_f1(tail, tier_max_k={}), cfg.answerer.window_tokens)
    a = tail_dropped.score([_longmemeval_request()])
    with pytest.warns(TierRepeatWarning):
        b = tail_kept.score([_longmemeval_request()])
    assert repeat_credit((1, 2, 3, 5, 8), 3, "tail") == pytest.approx(0.0, abs=1e-15)
    assert [c.r_ans for c in a.rewards[0]] == pytest.approx(
        [c.r_ans for c in b.rewards[0]], abs=1e-12
    )


def test_the_qwen3_recipe_window_fills_tiers_5_and_8() -> None:
    cfg = _f1(load_reward_config(ROOT / "configs/rewards/qwen3_4b.yaml"))
    assert cfg.max_k_for("longmemeval") == 8
    service, llm = _service(cfg, cfg.answerer.window_tokens)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batch = service.score([_longmemeval_request()])
    assert batch.stats.tier_repeats == {} and batch.stats.window_full_k == {}
    # s_0 and tiers 1, 2, 3, 5, 8 of two rankings (tiers 8 agree: the same eight sessions).
    assert max(p.count("[Memory ") for p in llm.seen) == 8
    assert batch.stats.unique_prompts == 1 + 5 + 4


def test_tier_max_k_is_checked() -> None:
    with pytest.raises(ValueError, match="tier_max_k.longmemeval"):
        RewardConfig(tier_max_k={"longmemeval": 0})
