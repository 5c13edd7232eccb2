"""Lexical coarse filtering: BM25, reciprocal-rank fusion, and the budgeted ``select`` step.

No model is loaded here; the dense filters have their own (slower) tests. The fixtures' sessions
each have a distinctive topic, so "the topical session ranks first" is a fair expectation for BM25.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

from memsifter.coarse import BM25Filter, HybridFilter, build_filter
from memsifter.coarse.base import CoarseFilter, Selection, rank_by_scores
from memsifter.data import Ranking, Session, Turn, load_jsonl, load_locomo
from memsifter.data.tokens import SessionTokenCache
from memsifter.errors import MemSifterError, UnknownNameError

FIXTURES = Path(__file__).resolve().parents[2] / "data" / "fixtures"
LOCOMO = load_locomo(FIXTURES / "locomo_mini.json")
USERS = load_jsonl(FIXTURES / "users_mini.jsonl")


# ------------------------------------------------------------------------------------------
# BM25


@pytest.mark.parametrize(
    "query",
    [q for q in LOCOMO.queries if q.category == "4" and q.has_evidence],
    ids=lambda q: q.qid,
)
def test_bm25_ranks_topical_session_first(query) -> None:
    ranking = BM25Filter().score(query.question, query.haystack)
    assert ranking.ids[0] in query.gold_session_ids
    assert ranking.source == "bm25"


def test_bm25_every_id_once_scores_descending() -> None:
    sessions = list(LOCOMO.sessions.values())
    ranking = BM25Filter().score("beagle puppy shelter leash", sessions)
    assert sorted(ranking.ids) == sorted(s.id for s in sessions)
    assert len(ranking) == len(set(ranking.ids)) == len(ranking.scores) == len(sessions)
    assert list(ranking.scores) == sorted(ranking.scores, reverse=True)
    assert ranking.ids[0] == "conv-m3/session_1"
    assert ranking.top(1) == ("conv-m3/session_1",)


def test_bm25_ties_keep_input_order() -> None:
    sessions = list(LOCOMO.conversations["conv-m2"])
    bm25 = BM25Filter()
    for order in (sessions, sessions[::-1]):
        ranking = bm25.score("xylophone quokka", order)  # no word of it is in the corpus
        assert ranking.ids == tuple(s.id for s in order)
        assert set(ranking.scores) == {0.0}
    # Stopwords only: analysed to nothing, still a full, stable ranking.
    assert bm25.score("the and of", sessions).ids == tuple(s.id for s in sessions)


def test_bm25_index_is_cached() -> None:
    sessions = LOCOMO.conversations["conv-m1"]
    bm25 = BM25Filter()
    with mock.patch.object(
        BM25Filter, "build_index", autospec=True, side_effect=BM25Filter.build_index
    ) as spy:
        first = bm25.score("pottery wheel", sessions)
        second = bm25.score("coral reef dive", sessions)
        assert spy.call_count == 1
        # Equal content in new objects hits the same index (the key is the content fingerprint).
        copies = [Session(s.id, s.turns, s.date, s.date_text, s.conversation_id) for s in sessions]
        bm25.score("pottery wheel", copies)
        assert spy.call_count == 1
        bm25.index(sessions)
        assert spy.call_count == 1
        # Another haystack is another index.
        bm25.score("pottery wheel", LOCOMO.conversations["conv-m2"])
        assert spy.call_count == 2
    assert first.ids[0] == "conv-m1/session_1" and second.ids[0] == "conv-m1/session_2"


def test_bm25_cache_is_bounded() -> None:
    bm25 = BM25Filter(cache_size=2)
    for conv in LOCOMO.conversations.values():
        bm25.index(conv)
    assert len(bm25.cache) == 2


def test_bm25_chinese_via_jieba() -> None:
    for q in (q for q in USERS.queries if q.conversation_id == "user-2"):
        ranking = BM25Filter().score(q.question, q.haystack)
        assert ranking.ids[0] == q.gold_session_ids[0]
        assert ranking.scores[0] > 0.0


def test_bm25_empty_and_blank_sessions() -> None:
    bm25 = BM25Filter()
    assert bm25.score("anything", []) == Ranking(ids=(), source="bm25")
    blank = Session("blank", (Turn("a", ""),))
    other = Session("dog", (Turn("a", "my beagle puppy"),))
    # "a:" analyses to no tokens; the index must still line up positions.
    assert bm25.score("beagle", [blank, other]).ids == ("dog", "blank")


# ------------------------------------------------------------------------------------------
# fakes for fusion and select


class FixedOrder(CoarseFilter):
    """Ranks sessions in a fixed id order, whatever the query."""

    def __init__(self, name: str, order: Sequence[str]) -> None:
        self.name = name
        self.order = list(order)
        self.calls = 0

    def score(self, query: str, sessions: Sequence[Session]) -> Ranking:
        self.calls += 1
        pos = {sid: i for i, sid in enumerate(self.order)}
        ranked = sorted(sessions, key=lambda s: pos[s.id])
        return Ranking(ids=tuple(s.id for s in ranked), scores=(), source=self.name)


def _sized(sid: str, chars: int) -> Session:
    """A session whose rendered text is exactly ``chars`` characters ("u: " + filler)."""
    s = Session(sid, (Turn("u", "x" * (chars - 3)),))
    assert len(s.render()) == chars
    return s


class CharCounter:
    name = "chars"

    def count(self, text: str) -> int:
        return len(text)


ABCD = [_sized(x, 40) for x in "abcd"]


def test_hybrid_rrf_hand_computed() -> None:
    one = FixedOrder("one", "abcd")
    two = FixedOrder("two", "cadb")
    fused = HybridFilter([one, two]).score("q", ABCD)
    # a: 1/61 + 1/62 = .032522; c: 1/63 + 1/61 = .032266
    # b: 1/62 + 1/64 = .031754; d: 1/64 + 1/63 = .031498
    assert fused.ids == ("a", "c", "b", "d")
    assert fused.scores == pytest.approx(
        [1 / 61 + 1 / 62, 1 / 63 + 1 / 61, 1 / 62 + 1 / 64, 1 / 64 + 1 / 63]
    )
    assert fused.source == "hybrid:one+two"


def test_hybrid_weights_and_k() -> None:
    one, two = FixedOrder("one", "abcd"), FixedOrder("two", "cadb")
    # a: 1/61 + 3/62 = .064780; b: 1/62 + 3/64 = .063004
    # c: 1/63 + 3/61 = .065053; d: 1/64 + 3/63 = .063244
    assert HybridFilter([one, two], weights=[1, 3]).score("q", ABCD).ids == ("c", "a", "d", "b")
    # With k=0 rank 1 dominates: a: 1 + 1/2, c: 1/3 + 1.
    assert HybridFilter([one, two], k=0).score("q", ABCD).ids[:2] == ("a", "c")


def test_hybrid_ties_keep_input_order() -> None:
    # Swapped pairs: a and b both get 1/61 + 1/62, c and d both 1/63 + 1/64.
    hybrid = HybridFilter([FixedOrder("one", "abcd"), FixedOrder("two", "badc")])
    assert hybrid.score("q", ABCD).ids == ("a", "b", "c", "d")
    assert hybrid.score("q", ABCD[::-1]).ids == ("b", "a", "d", "c")


def test_hybrid_validation_and_spec() -> None:
    with pytest.raises(MemSifterError, match="at least two"):
        HybridFilter([FixedOrder("one", "abcd")])
    with pytest.raises(MemSifterError, match="3 weights for 2"):
        HybridFilter([FixedOrder("one", "a"), FixedOrder("two", "a")], weights=[1, 1, 1])
    hybrid = build_filter("hybrid:bm25+bm25")
    assert isinstance(hybrid, HybridFilter) and hybrid.name == "hybrid:bm25+bm25"
    q = LOCOMO.queries[0]
    assert hybrid.score(q.question, q.haystack).ids[0] == q.gold_session_ids[0]
    assert isinstance(build_filter(" bm25 "), BM25Filter)
    with pytest.raises(UnknownNameError, match="unknown coarse filter 'tfidf'"):
        build_filter("tfidf")


def test_rank_by_scores_stable() -> None:
    ranking = rank_by_scores(ABCD, [0.5, 1.0, 0.5, 1.0], "t")
    assert ranking.ids == ("b", "d", "a", "c")
    assert ranking.scores == (1.0, 1.0, 0.5, 0.5)


# ------------------------------------------------------------------------------------------
# select


def test_select_passes_everything_when_it_fits() -> None:
    fake = FixedOrder("fake", "dcba")
    sel = fake.select("q", ABCD, budget_tokens=160, counter=CharCounter())
    assert sel == Selection(sessions=tuple(ABCD), ranking=None, tokens=160)
    assert all(a is b for a, b in zip(sel.sessions, ABCD, strict=True))  # untouched, in order
    assert not sel.cut and fake.calls == 0, "no ranking needed when everything fits"


def test_select_keeps_top_ranked_within_budget() -> None:
    sessions = [_sized("s0", 50), _sized("s1", 30), _sized("s2", 40), _sized("s3", 20)]
    fake = FixedOrder("fake", ["s0", "s1", "s2", "s3"])
    sel = fake.select("q", sessions, budget_tokens=75, counter=CharCounter())
    # s0 (50) fits; s1 (80) and s2 (90) would not; s3 (70) still does.
    assert [s.id for s in sel.sessions] == ["s0", "s3"]
    assert sel.tokens == 70
    assert sel.dropped_ids == ("s1", "s2") and sel.cut
    assert sel.ranking is not None and sel.ranking.ids == ("s0", "s1", "s2", "s3")


def test_select_nothing_fits_and_shared_cache() -> None:
    sessions = [_sized("big", 500), _sized("bigger", 600)]
    cache = SessionTokenCache(CharCounter())
    sel = FixedOrder("fake", ["bigger", "big"]).select("q", sessions, 100, counter=cache)
    assert sel.sessions == () and sel.tokens == 0
    assert sel.dropped_ids == ("bigger", "big")
    assert cache(sessions[0]) == 500  # the caller's cache was used and filled


def test_select_with_bm25_and_default_counter() -> None:
    q = next(q for q in LOCOMO.queries if q.qid == "conv-m2/q2")  # the hiking summit question
    sel = BM25Filter().select(q.question, q.haystack, budget_tokens=200)
    assert sel.cut and sel.tokens <= 200
    assert sel.sessions[0].id in q.gold_session_ids
    kept = {s.id for s in sel.sessions}
    assert kept.isdisjoint(sel.dropped_ids)
    assert kept | set(sel.dropped_ids) == {s.id for s in q.haystack}


def test_incremental_bm25_matches_bm25s_after_adds_and_removes() -> None:
    """IncrementalBM25 scores equal a BM25Filter (bm25s) built on the same live documents, and
    an index that lived through adds, a replace and removes (enough to compact it) equals one
    built fresh."""
    import random

    from memsifter.coarse import IncrementalBM25

    rng = random.Random(0)
    words = "dog cat marathon porto lisbon sister wedding puppy shoes river the a of".split()
    docs = {f"d{i}": " ".join(rng.choices(words, k=rng.randint(0, 30))) for i in range(150)}
    docs["d7"] = ""  # an empty document counts as one token in bm25s
    sessions = [Session(id=d, turns=(Turn("u", t),)) for d, t in docs.items()]
    fresh = IncrementalBM25()
    for s in sessions:
        fresh.add(s.id, s.render())  # what BM25Filter indexes: the rendered session
    ref = BM25Filter()
    for query in ("porto wedding", "dog dog river", "the of a", "nothing matches"):
        expected = ref.score(query, sessions)
        by_id = dict(zip(expected.ids, expected.scores, strict=True))
        got = fresh.scores(query, [s.id for s in sessions])
        assert got.tolist() == pytest.approx([by_id[s.id] for s in sessions], rel=1e-5, abs=1e-6)

    lived = IncrementalBM25()
    for did, text in docs.items():
        lived.add(did, text)
    lived.add("d1", "porto porto wedding")  # a replace
    docs["d1"] = "porto porto wedding"
    for i in range(2, 150):
        if i % 3:  # two thirds removed: the index compacts its dead slots on the way
            assert lived.remove(f"d{i}")
            del docs[f"d{i}"]
    assert not lived.remove("d2") and "d2" not in lived
    assert len(lived) == len(docs)
    rebuilt = IncrementalBM25()
    for did, text in docs.items():
        rebuilt.add(did, text)
    ids = list(docs)
    for query in ("porto wedding", "puppy shoes cat", "river"):
        assert lived.scores(query, ids).tolist() == pytest.approx(
            rebuilt.scores(query, ids).tolist()
        )
    with pytest.raises(KeyError):
        lived.scores("dog", ["d2"])


def test_lucene_weights_are_the_expression_bit_for_bit() -> None:
    """``lucene_weights`` works in place (two arrays for a term's postings, not six) in the
    formula's own order of operations: the weights equal the written expression exactly."""
    from memsifter.coarse.incremental import lucene_weights

    rng = np.random.default_rng(0)
    for _ in range(20):
        m = int(rng.integers(1, 3000))
        tf = rng.integers(1, 9, m).astype(float)
        length = rng.integers(1, 400, m).astype(float)
        n, avgdl = int(rng.integers(m, 10 * m)), float(rng.uniform(5, 200))
        k1, b = float(rng.uniform(0.5, 2)), float(rng.uniform(0, 1))
        idf = np.log(1.0 + (n - m + 0.5) / (m + 0.5))
        expected = idf * tf / (tf + k1 * (1.0 - b + b * length / avgdl))
        assert np.array_equal(lucene_weights(tf, length, m, n, avgdl, k1, b), expected)
