"""Haystack padding ("LoCoMo 32K/128K/1M") on the synthetic LoCoMo fixture.

A benchmark number is only comparable across runs if the haystack is: these tests pin down that
it depends on the seed and nothing else, and that the budget rules in the module docstring hold.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memsifter.data import (
    LoadReport,
    MemoryDataset,
    Query,
    Session,
    Turn,
    load_locomo,
    load_longmemeval,
)
from memsifter.data.haystack import HAYSTACK_BUDGETS, HaystackBuilder, parse_budget
from memsifter.data.tokens import ApproxCounter, SessionTokenCache
from memsifter.errors import MemSifterError

FIXTURES = Path(__file__).resolve().parents[2] / "data" / "fixtures"
# The whole fixture pool is ~2,000 approx tokens; 1,500 pads partially, so the seed matters.
BUDGET = 1_500

_DS = load_locomo(FIXTURES / "locomo_mini.json")
_TOKENS = SessionTokenCache(ApproxCounter())
_POOL_TOKENS = sum(_TOKENS(s) for s in _DS.sessions.values())


def _ids(q: Query) -> list[str]:
    return [s.id for s in q.haystack]


def _build_all(builder: HaystackBuilder, queries: list[Query], budget: int) -> dict[str, list]:
    return {q.qid: _ids(builder.build(q, budget)[0]) for q in queries}


def test_same_seed_same_haystack_in_any_order() -> None:
    first = _build_all(HaystackBuilder(_DS, ApproxCounter(), seed=3), _DS.queries, BUDGET)
    # A fresh builder (no shared cache), questions built in reverse order.
    again = _build_all(HaystackBuilder(_DS, ApproxCounter(), seed=3), _DS.queries[::-1], BUDGET)
    assert first == again
    # Interleaving conversations does not change anything either.
    odd_first = _DS.queries[1::2] + _DS.queries[::2]
    assert _build_all(HaystackBuilder(_DS, ApproxCounter(), seed=3), odd_first, BUDGET) == first


def test_other_seed_other_haystack() -> None:
    a = _build_all(HaystackBuilder(_DS, ApproxCounter(), seed=0), _DS.queries, BUDGET)
    b = _build_all(HaystackBuilder(_DS, ApproxCounter(), seed=1), _DS.queries, BUDGET)
    assert a != b


def test_same_haystack_for_every_question_of_a_conversation() -> None:
    builder = HaystackBuilder(_DS, ApproxCounter(), seed=0)
    per_conv: dict[str, set[tuple[str, ...]]] = {}
    for q in _DS.queries:
        per_conv.setdefault(q.conversation_id or "", set()).add(
            tuple(_ids(builder.build(q, BUDGET)[0]))
        )
    assert all(len(v) == 1 for v in per_conv.values())


@pytest.mark.parametrize("budget", [0, 300, 700, BUDGET, 1_900, 10**9])
def test_budget_rules(budget: int) -> None:
    builder = HaystackBuilder(_DS, ApproxCounter(), seed=0)
    for q in _DS.queries:
        padded, stats = builder.build(q, budget)
        own = {s.id for s in q.haystack}
        got = _ids(padded)
        assert own <= set(got), "own sessions are always kept"
        assert len(got) == len(set(got))
        own_tokens = sum(_TOKENS(s) for s in q.haystack)
        assert stats.tokens == sum(_TOKENS(s) for s in padded.haystack)
        assert stats.tokens <= max(budget, own_tokens)
        assert (stats.n_own, stats.n_distractors) == (len(own), len(got) - len(own))
        if own_tokens > budget:
            assert stats.n_distractors == 0 and stats.tokens == own_tokens
        # Distractors come only from other conversations.
        extra = [s for s in padded.haystack if s.id not in own]
        assert all(s.conversation_id != q.conversation_id for s in extra)
        # Every other field of the question is untouched.
        assert padded.gold_session_ids == q.gold_session_ids and padded.qid == q.qid


def test_haystack_sorted_by_date() -> None:
    padded, _ = HaystackBuilder(_DS, ApproxCounter(), seed=0).build(_DS.queries[0], 10**9)
    keys = [(s.date, s.id) for s in padded.haystack]
    assert keys == sorted(keys)  # type: ignore[type-var]
    assert padded.haystack[0].conversation_id == "conv-m2"  # the 2022 conversation comes first


def _session(sid: str, conv: str, date: datetime | None, words: int = 5) -> Session:
    return Session(
        id=sid, turns=(Turn("a", " ".join(["word"] * words)),), date=date, conversation_id=conv
    )


def test_undated_sessions_go_last_ties_by_id() -> None:
    d = datetime(2024, 1, 1)
    own = (_session("own/b", "own", d), _session("own/undated", "own", None))
    other = (
        _session("x/2", "x", d),
        _session("x/1", "x", d),
        _session("x/0", "x", None),
        _session("x/early", "x", datetime(2020, 1, 1)),
    )
    ds = MemoryDataset(
        queries=[Query("q", "?", "", own, conversation_id="own")],
        conversations={"own": own, "x": other},
        report=LoadReport("test"),
    )
    padded, stats = HaystackBuilder(ds, ApproxCounter()).build(ds.queries[0], 10**6)
    assert _ids(padded) == ["x/early", "own/b", "x/1", "x/2", "own/undated", "x/0"]
    assert not stats.filled


def test_pool_exhausted_and_filled() -> None:
    builder = HaystackBuilder(_DS, ApproxCounter(), seed=0)
    q = _DS.queries[0]
    padded, stats = builder.build(q, 10**9)
    # The pool ran out long before a "1m"-style budget: the whole pool, and it says so.
    assert sorted(_ids(padded)) == sorted(_DS.sessions)
    assert stats.tokens == _POOL_TOKENS and not stats.filled
    _, stats = builder.build(q, BUDGET)
    assert stats.filled and stats.tokens <= BUDGET


def test_distractors_deduplicated_across_conversations() -> None:
    """LongMemEval haystacks share sessions; one must not be padded in twice."""
    ds = load_longmemeval(FIXTURES / "longmemeval_mini.json")
    builder = HaystackBuilder(ds, ApproxCounter(), seed=0)
    for q in ds.queries:
        padded, stats = builder.build(q, 10**6)
        got = _ids(padded)
        assert len(got) == len(set(got))
        assert set(got) == {s.id for conv in ds.conversations.values() for s in conv}
        assert stats.n_distractors == len(got) - len(q.haystack)


@pytest.mark.parametrize(
    ("name", "tokens"),
    [
        ("native", None),
        ("NATIVE", None),
        ("32k", 32_000),
        ("128K", 128_000),
        ("1m", 1_000_000),
        ("5000", 5_000),
    ],
)
def test_parse_budget(name: str, tokens: int | None) -> None:
    assert parse_budget(name) == tokens


@pytest.mark.parametrize("name", ["", "2m", "12.5k", "-5", "32 k"])
def test_parse_budget_rejects(name: str) -> None:
    with pytest.raises(MemSifterError, match="unknown haystack"):
        parse_budget(name)


def test_budget_names_match_table() -> None:
    assert {k: parse_budget(k) for k in HAYSTACK_BUDGETS} == HAYSTACK_BUDGETS


_BUILDER = HaystackBuilder(_DS, ApproxCounter(), seed=11)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(budget=st.integers(0, _POOL_TOKENS + 200), index=st.integers(0, len(_DS.queries) - 1))
def test_budget_never_exceeded_and_fill_is_greedy(budget: int, index: int) -> None:
    q = _DS.queries[index]
    padded, stats = _BUILDER.build(q, budget)
    own_tokens = sum(_TOKENS(s) for s in q.haystack)
    assert stats.tokens <= max(budget, own_tokens)
    assert {s.id for s in q.haystack} <= set(_ids(padded))
    # Nothing left out would still fit: a skipped distractor was bigger than what remained.
    chosen = set(_ids(padded))
    left_out = [
        s
        for cid, conv in _DS.conversations.items()
        if cid != q.conversation_id
        for s in conv
        if s.id not in chosen
    ]
    assert all(_TOKENS(s) > budget - stats.tokens for s in left_out)
    assert stats.filled == (bool(left_out) or stats.tokens >= budget)
