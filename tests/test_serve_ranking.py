"""The service's ranker: a failed proxy parse is completed in the fused coarse + bookmark order,
so it returns exactly the coarse-only ranking (not a re-score by the plain coarse filter); and
the cache of request-borne haystacks (``/v1/rank``) is the byte-bounded one, where the proxy's
prompt cut keys its indexes by tenant too (``/v1/rank`` itself: tests/test_serve_isolation.py)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from memsifter.coarse import ByteBoundedBM25, build_filter
from memsifter.data.types import Session, Turn
from memsifter.ranker.spec import PromptSpec
from memsifter.serving.config import PagingSettings, ServeConfig
from memsifter.serving.memory import MemoryService
from memsifter.serving.ranking import ServiceRanker
from memsifter.serving.store import Principal, Store
from memsifter.testing.backends import ScriptedBackend, reverse_ranking

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


def test_stateless_rank_goes_through_the_bounded_cache() -> None:
    # The cache's own bounds are tested with the coarse filters (tests/test_coarse_variants.py).
    ranker = ServiceRanker(build_filter("bm25"), index_cache_users=10, rank_cache_bytes=150_000)
    inner = ranker.coarse.inner
    assert isinstance(inner, ByteBoundedBM25) and inner.max_bytes == 150_000
    assert inner.cache_size == 10 + 64  # raised on the bounded filter, not a discarded one
    for n in range(8):
        outcome = ranker.rank("page word", _haystack(n, 400), tenant="acme")
        assert len(outcome.ids) == 20
    assert inner.held_bytes <= 150_000 or len(inner.cache) == 1
    assert 0 < len(inner.cache) < 8


def test_the_proxys_prompt_cut_caches_in_the_tenants_scope() -> None:
    # The proxy's prompt builder ranks its candidates with the same cached coarse filter when
    # they overflow the window: that index is a tenant's too, never one keyed by content alone.
    backend = ScriptedBackend(reverse_ranking)
    spec = PromptSpec(window_tokens=3000, completion_tokens=200)
    ranker = ServiceRanker(build_filter("bm25"), backend, spec)
    inner = ranker.coarse.inner
    assert isinstance(inner, ByteBoundedBM25)
    haystack = _haystack(0, 400)  # 20 pages of ~400 words: more than the window holds
    for tenant in ("acme", "globex"):
        outcome = ranker.rank("page word", haystack, tenant=tenant)
        assert outcome.parse.status == "ok" and outcome.parse.cut > 0
    assert backend.calls == 2
    # One index per tenant for the fused top candidates the prompt cut from, none unscoped.
    assert sorted(k[0] for k in inner.cache.keys()) == ["scope:acme", "scope:globex"]
