"""The service's ranker: a failed proxy parse is completed in the fused coarse + bookmark order,
so it returns exactly the coarse-only ranking (not a re-score by the plain coarse filter); the
cache of request-borne haystacks (``/v1/rank``) is the byte-bounded one, where the proxy's
prompt cut keys its indexes by tenant too (``/v1/rank`` itself:
tests/serving/test_serve_isolation.py); and a dense filter's vectors and the prompt builder's page
counts and ids are a tenant's own, from a ranking and from the tokenizing at ingest alike."""

from __future__ import annotations

import gc
import random
import tracemalloc
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from memsifter.coarse import ByteBoundedBM25, build_filter
from memsifter.data.tokens import TokenCounter
from memsifter.data.types import Session, Turn
from memsifter.ranker.spec import PromptSpec
from memsifter.serving.config import PagingSettings, ServeConfig
from memsifter.serving.memory import MemoryService
from memsifter.serving.ranking import ServiceRanker, UserIndex
from memsifter.serving.store import Principal, Store
from memsifter.serving.store.records import (
    IndexedPage,
    IndexState,
    PageDelta,
    StoredPage,
    UserState,
)
from memsifter.serving.stored_index import StoredIndex
from memsifter.testing.backends import ScriptedBackend, reverse_ranking
from memsifter.testing.coarse import LetterFilter

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
    # The cache's own bounds are tested with the coarse filters
    # (tests/coarse/test_coarse_variants.py).
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


class _Counted:
    """A token counter that records what it counts."""

    def __init__(self, inner: TokenCounter) -> None:
        self.inner = inner
        self.name = inner.name
        self.texts: list[str] = []

    def count(self, text: str) -> int:
        self.texts.append(text)
        return self.inner.count(text)


def _proxied_dense() -> tuple[ServiceRanker, LetterFilter, _Counted]:
    dense = LetterFilter()
    ranker = ServiceRanker(dense, ScriptedBackend(reverse_ranking), PromptSpec())
    assert ranker.proxy is not None
    builder = ranker.proxy.builder
    assert builder.token_ids_off is None  # the page-id cache is in use
    counted = _Counted(builder.session_tokens.counter)
    builder.session_tokens.counter = counted
    return ranker, dense, counted


def test_a_ranking_embeds_and_tokenizes_in_its_tenants_scope() -> None:
    # Keyed by content alone, these caches let tenant B's request over pages A had sent skip
    # embedding and tokenizing them: a faster answer that told B someone had sent them. B pays
    # for A's pages as for pages nobody sent, in both orders; each tenant's repeat is free.
    ranker, dense, counted = _proxied_dense()
    assert ranker.proxy is not None
    page_ids = ranker.proxy.builder.page_ids

    def work(tenant: str, texts: list[str]) -> tuple[int, int, int]:
        """Pages embedded, counted and tokenized into ids by one request."""
        before = (len(dense.encoded), len(counted.texts), len(page_ids))
        haystack = [_session(f"p{i}", 1 + i, t) for i, t in enumerate(texts)]
        outcome = ranker.rank(QUESTION, haystack, tenant=tenant)
        assert outcome.parse.status == "ok"
        after = (len(dense.encoded) - 1, len(counted.texts), len(page_ids))  # - the question
        return (after[0] - before[0], after[1] - before[1], after[2] - before[2])

    n = len(SESSIONS)
    miss = (n, n, n)
    for first, second in (("acme", "globex"), ("globex", "acme")):
        sent = [f"{s.turns[0].text} ({first} first)" for s in SESSIONS]
        unsent = [f"{t} (nobody)" for t in sent]
        assert work(first, sent) == miss
        assert work(second, sent) == work(second, unsent) == miss
        assert work(first, sent) == work(second, sent) == (0, 0, 0)


def test_pages_tokenized_at_ingest_are_found_by_their_tenants_queries(tmp_path: Path) -> None:
    # The user index embeds a user's pages and the builder tokenizes them at ingest, so a
    # query finds them cached; that must happen in the tenant's scope, or every query would
    # miss (and another tenant ingesting the same pages would hit).
    store = Store(f"sqlite:///{tmp_path / 'ingest.db'}")
    store.migrate()
    for tenant in ("acme", "globex"):
        store.ensure_tenant(tenant)
    config = ServeConfig(db_url=store.url, paging=PagingSettings(turns_per_page=2))
    ranker, dense, counted = _proxied_dense()
    memory = MemoryService(config, store, ranker, FixedKeywords())

    def work(step: Callable[..., object], *args: object, **kwargs: object) -> tuple[int, int]:
        """Texts embedded and pages counted by one call."""
        before = (len(dense.encoded), len(counted.texts))
        step(*args, **kwargs)
        return (len(dense.encoded) - before[0], len(counted.texts) - before[1])

    n = len(SESSIONS)  # one page each
    for tenant in ("acme", "globex"):
        who = Principal(tenant)
        assert work(memory.ingest_sessions, who, "ann", SESSIONS) == (n, n)
        # The question is embedded; no page is embedded or counted again.
        assert work(memory.recall, who, "ann", QUESTION, top_k=4) == (1, 0)
    store.close()


def _pages(n: int, vocabulary: int, seed: int = 0) -> list[IndexedPage]:
    """``n`` stored pages of 2-6 turns drawing words from ``vocabulary`` words, with 0-5
    bookmark rows each: pages as ``Store.load_pages`` hands them to a replica's index."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        turns = tuple(
            Turn(
                "user" if j % 2 == 0 else "bot",
                " ".join(f"w{rng.randrange(vocabulary)}" for _ in range(rng.randint(10, 40))),
            )
            for j in range(rng.choice([2, 4, 6]))
        )
        date = datetime(2024, 1, 1) + timedelta(hours=i)
        page = Session(id=f"s{i}#0", turns=turns, date=date)
        marks = tuple((f"k{rng.randrange(500)}", 0.5) for _ in range(rng.randrange(6)))
        stored = StoredPage(page, f"s{i}", 10)
        out.append(IndexedPage(i, stored, (False, date, i, 0), marks))
    return out


@pytest.mark.slow  # starts server processes; CI runs it (docs/setup.md, the fast run)
def test_an_index_estimates_its_memory_within_a_quarter_of_what_tracemalloc_measures() -> None:
    """``nbytes`` is what the byte-bounded cache charges a user, so it must track what an index
    really holds: within 25% of tracemalloc's count of every allocation made while loading it.
    ``UserIndex`` (the pages of a non-BM25 filter) at a narrow and a wide vocabulary and after a
    delete; ``StoredIndex`` (pks, lengths, the pk table, cached postings) over 20,000 pages with
    terms of 10 to 10,000 postings cached. A constant off by 2x (or a term never charged)
    fails."""
    for vocabulary in (300, 30_000):
        gc.collect()
        tracemalloc.start()
        index = UserIndex("t", "u", "e")
        index.apply(PageDelta(UserState("e", 1), _pages(2000, vocabulary)))
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert 0.75 < index.nbytes / held < 1.25, (vocabulary, index.nbytes, held)
    before = index.nbytes
    index.apply(PageDelta(UserState("e", 2), [], live=frozenset(range(1000))))  # half deleted
    assert index.nbytes < 0.8 * before

    n = 20_000
    state = IndexState("e", 3, "a", list(range(n)), [50] * n, None, None)
    rng = np.random.default_rng(0)
    sizes = [10, 100, 1000, 10_000] * 25
    drawn = [np.sort(rng.choice(n, size, replace=False)) for size in sizes]
    gc.collect()
    tracemalloc.start()
    # As the store hands them over: arrays made for the index, which keeps the values (and
    # the pages' positions it looks up), not the pks.
    postings = {f"t{i}": (pks.copy(), np.ones(len(pks))) for i, pks in enumerate(drawn)}
    stored = StoredIndex("t", "u", "e", 1.5, 0.75)
    stored.open(state)
    stored.take(3, postings, {}, (list(postings), []))
    del postings
    gc.collect()
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert 0.75 < stored.nbytes / held < 1.25, (stored.nbytes, held)


def _memory(tmp_path: Path, **kw: object) -> tuple[MemoryService, ServiceRanker, list[object]]:
    store = Store(f"sqlite:///{tmp_path / 'budget.db'}")
    store.migrate()
    store.ensure_tenant("acme")
    ranker = ServiceRanker(build_filter("bm25"), **kw)  # type: ignore[arg-type]
    reports: list[object] = []
    ranker.on_index_cache = reports.append
    config = ServeConfig(db_url=store.url, paging=PagingSettings(turns_per_page=2))
    return MemoryService(config, store, ranker, FixedKeywords()), ranker, reports


def test_the_index_cache_is_bounded_in_bytes_and_a_user_over_it_is_served_uncached(
    tmp_path: Path,
) -> None:
    """Users' indexes (their pks and lengths, and the postings their queries cached) are
    evicted least recently used first once their bytes pass the budget; a user whose index is
    over the whole budget is served and not kept."""
    who = Principal("acme")
    probe, ranker, _ = _memory(tmp_path / "probe")
    probe.ingest_sessions(who, "u0", SESSIONS)
    opened = ranker._indexes[("acme", "u0")].nbytes
    probe.recall(who, "u0", QUESTION, top_k=1)
    one = ranker._indexes[("acme", "u0")].nbytes  # every user below holds the same pages
    assert one > opened  # the question's postings are cached

    memory, ranker, reports = _memory(tmp_path, index_cache_bytes=int(2.5 * one))
    for user in ("u1", "u2", "u3"):
        memory.ingest_sessions(who, user, SESSIONS)
        memory.recall(who, user, QUESTION, top_k=1)
    assert [k[1] for k in ranker._indexes] == ["u2", "u3"]  # u1, least recent, evicted
    assert reports[-1].users == 2 and reports[-1].bytes == 2 * one
    assert sum(r.evicted.get("bytes", 0) for r in reports) == 1
    assert memory.recall(who, "u1", QUESTION, top_k=1).index.kind == "opened"
    assert [k[1] for k in ranker._indexes] == ["u3", "u1"]

    # Over the budget only with its cached postings: it drops them, and stays.
    shedding, ranker, _ = _memory(tmp_path / "shed", index_cache_bytes=(opened + one) // 2)
    shedding.ingest_sessions(who, "mid", SESSIONS)
    assert shedding.recall(who, "mid", QUESTION, top_k=1).index.cached
    assert ranker._indexes[("acme", "mid")].nbytes == opened

    small, ranker, reports = _memory(tmp_path / "small", index_cache_bytes=opened // 2)
    small.ingest_sessions(who, "big", SESSIONS)
    assert ("acme", "big") not in ranker._indexes
    result = small.recall(who, "big", QUESTION, top_k=1)
    assert result.hits and result.index.kind == "opened" and not result.index.cached
    assert reports[-1].evicted == {"too_large": 1} and reports[-1].users == 0


def test_index_cache_bytes_is_validated() -> None:
    with pytest.raises(ValueError, match="index_cache_bytes must be > 0"):
        ServeConfig(index_cache_bytes=0)
    with pytest.raises(ValueError, match="index_cache_bytes must be > 0"):
        ServiceRanker(build_filter("bm25"), index_cache_bytes=-1)
