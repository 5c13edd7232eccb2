"""The service's ranker: a failed proxy parse is completed in the fused coarse + bookmark order,
so it returns exactly the coarse-only ranking (not a re-score by the plain coarse filter); and
the cache of request-borne haystacks (``/v1/rank``) is bounded in bytes."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from memsifter.coarse import build_filter
from memsifter.coarse.bm25 import BM25Filter
from memsifter.data.types import Session, Turn
from memsifter.ranker.spec import PromptSpec
from memsifter.serving.config import PagingSettings, ServeConfig
from memsifter.serving.memory import MemoryService
from memsifter.serving.ranking import ByteBoundedBM25, ServiceRanker
from memsifter.serving.store import Principal, Store
from memsifter.testing.backends import ScriptedBackend

QUESTION = "dog kennel"


class FixedKeywords:
    """Bookmarks chosen by the test: the page about the garden is bookmarked "kennel"."""

    name = "fixed"

    def extract(self, pages: Sequence[Session]) -> list[list[tuple[str, float]]]:
        return [
            [("kennel", 1.0)] if "garden" in p.turns[0].text else [("park", 0.5)] for p in pages
        ]


def _session(sid: str, day: int, text: str) -> Session:
    return Session(
        id=sid, turns=(Turn("user", text), Turn("bot", "I see.")), date=datetime(2024, 5, day)
    )


SESSIONS = [
    _session("run", 1, "The dog dog dog was running in the park with another dog."),
    _session("garden", 2, "Our dog likes the garden."),
    _session("tax", 3, "Nothing relevant here: a tax form."),
    _session("car", 4, "The car needs new tyres before the trip."),
]


def test_a_failed_parse_returns_exactly_the_coarse_only_ranking(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'fallback.db'}")
    store.migrate()
    store.ensure_tenant("acme")
    config = ServeConfig(db_url=store.url, paging=PagingSettings(turns_per_page=2))
    coarse_only = MemoryService(config, store, ServiceRanker(build_filter("bm25")), FixedKeywords())
    who = Principal("acme")
    coarse_only.ingest_sessions(who, "ann", SESSIONS)
    backend = ScriptedBackend(lambda _prompt: "I would rather not say.")
    proxied = MemoryService(
        config,
        store,
        ServiceRanker(build_filter("bm25"), backend, PromptSpec()),
        FixedKeywords(),
    )

    expected = coarse_only.recall(who, "ann", QUESTION, top_k=4)
    got = proxied.recall(who, "ann", QUESTION, top_k=4)

    # The bookmark moves "garden" above "run", which plain BM25 ranks first: a re-score by the
    # coarse filter alone would differ from the coarse-only answer.
    plain = build_filter("bm25").score(QUESTION, [h.page.page for h in expected.hits])
    fused = [h.page.page.id for h in expected.hits]
    assert fused[:2] == ["garden#0", "run#0"] and list(plain.ids[:2]) == ["run#0", "garden#0"]
    assert backend.calls == 1
    assert got.outcome.parse.status == "failed" and got.outcome.parse.completed
    assert got.outcome.ids == expected.outcome.ids
    assert [h.page.page.id for h in got.hits] == fused
    store.close()


def _haystack(n: int, size: int) -> list[Session]:
    return [
        Session(id=f"h{n}-{i}", turns=(Turn("u", f"haystack {n} page {i} " + "word " * size),))
        for i in range(20)
    ]


def test_the_rank_cache_is_bounded_in_bytes() -> None:
    plain = BM25Filter()
    bounded = ByteBoundedBM25(BM25Filter(), max_bytes=200_000)
    sizes = []
    for n in range(12):
        sessions = _haystack(n, 400)  # ~40 KB of text and index each
        got = bounded.score("haystack page word", sessions)
        assert got == plain.score("haystack page word", sessions)  # the same ranking, scores
        sizes.append(bounded._sizes[tuple(s.fingerprint for s in sessions)])
        assert bounded.held_bytes <= max(200_000, sizes[-1])
        assert bounded.held_bytes == sum(bounded._sizes.values())
    assert 10_000 < sizes[0] < 200_000  # the estimate is in the right range
    assert len(bounded._indexes) < 12 and len(bounded._seen) <= len(bounded._indexes)


def test_a_resent_haystack_keeps_one_copy() -> None:
    bounded = ByteBoundedBM25(BM25Filter(), max_bytes=10_000_000)
    for _ in range(20):  # each request parses its body into new Session objects
        bounded.score("word", _haystack(0, 50))
    assert len(bounded._indexes) == 1 and len(bounded._seen) == 1


def test_stateless_rank_goes_through_the_bounded_cache() -> None:
    ranker = ServiceRanker(build_filter("bm25"), rank_cache_bytes=150_000)
    inner = ranker.coarse.inner
    assert isinstance(inner, ByteBoundedBM25)
    for n in range(8):
        outcome = ranker.rank("page word", _haystack(n, 400))
        assert len(outcome.ids) == 20
    assert inner.held_bytes <= 150_000 or len(inner._indexes) == 1
