"""The recall service's store and memory layer: schema vs migrations, ingest/list/get/delete,
pages and bookmarks, facts (supersede, forget, sweep, decay), paging watermarks, and SQLite
WAL with concurrent writers. Every store test runs on SQLite, and on PostgreSQL too when
``MEMSIFTER_TEST_PG_DSN`` names a server (e.g. ``postgresql+psycopg://u@host/db``; the
``serve_db`` fixture makes a scratch database there and drops it after)."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from memsifter.coarse import build_filter
from memsifter.data.types import Session, Turn
from memsifter.ranker.spec import PromptSpec
from memsifter.serving.bookmarks import YakeExtractor
from memsifter.serving.config import PagingSettings, ServeConfig
from memsifter.serving.errors import ConflictError, NotFoundError
from memsifter.serving.facts import decay, normalize_subject, rank_facts
from memsifter.serving.memory import MemoryService
from memsifter.serving.paging import PageSlot, plan_paging
from memsifter.serving.ranking import IndexLoad, ServiceRanker
from memsifter.serving.store import (
    Base,
    Fact,
    PageRecord,
    Principal,
    SessionRecord,
    Store,
    utcnow,
)


@pytest.fixture(scope="module")
def ranker() -> ServiceRanker:
    return ServiceRanker(build_filter("bm25"))


@pytest.fixture()
def memory(store: Store, ranker: ServiceRanker) -> MemoryService:
    config = ServeConfig(db_url=store.url, paging=PagingSettings(turns_per_page=2))
    return MemoryService(config, store, ranker, YakeExtractor(max_keywords=5))


def _session(sid: str, day: int, lines: list[str]) -> Session:
    date = datetime(2024, 5, day, 12)
    turns = tuple(Turn("user" if i % 2 == 0 else "bot", t) for i, t in enumerate(lines))
    return Session(id=sid, turns=turns, date=date, date_text=f"{day} May 2024")


SESSIONS = [
    _session(
        "s-dog",
        3,
        [
            "I adopted a golden retriever named Max.",
            "Lovely! How old is Max?",
            "He is ten weeks old and chews shoes.",
            "Try puppy school.",
        ],
    ),
    _session(
        "s-run",
        1,
        [
            "I signed up for the Lisbon half marathon.",
            "What is your weekly mileage?",
            "About twenty kilometres along the river.",
        ],
    ),
    _session(
        "s-wed",
        2,
        [
            "My sister Clara is getting married in Porto.",
            "Are you the maid of honour?",
        ],
    ),
]


def test_migrations_match_the_models(store: Store) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    store.migrate()  # a second upgrade is a no-op
    with store._writer.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []


def test_ingest_list_get_delete(store: Store, tenant: str, memory: MemoryService) -> None:
    who = Principal(tenant)
    records = memory.ingest_sessions(who, "u1", SESSIONS)
    assert [len(r.pages) for r in records] == [2, 2, 1]  # two turns a page

    infos, total = store.list_sessions(tenant, "u1")
    assert total == 3
    assert [i.session_id for i in infos] == ["s-run", "s-wed", "s-dog"]  # by date
    assert infos[2].n_pages == 2 and infos[2].n_turns == 4

    got = store.get_session(tenant, "u1", "s-dog")
    assert got is not None and got.session.turns == SESSIONS[0].turns
    assert [p.page.id for p in got.pages] == ["s-dog#0", "s-dog#2"]
    assert any("Max" in k or "golden retriever" in k for k in got.pages[0].keywords)

    with pytest.raises(ConflictError) as e:
        memory.ingest_sessions(who, "u1", [SESSIONS[1]])
    assert e.value.field == "body.sessions[0].id"
    memory.ingest_sessions(who, "u1", [SESSIONS[1]], replace=True)
    assert store.list_sessions(tenant, "u1")[1] == 3

    version = store.user_version(tenant, "u1")
    assert store.delete_session(tenant, "u1", "s-dog")
    assert not store.delete_session(tenant, "u1", "s-dog")
    assert store.get_session(tenant, "u1", "s-dog") is None
    assert store.user_version(tenant, "u1") == (version or 0) + 1
    # Pages and their bookmarks went with the session.
    delta = store.load_pages(tenant, "u1")
    assert delta is not None and delta.state.version == store.user_version(tenant, "u1")
    assert len(delta.pages) == 3 and delta.live is None  # a full load
    assert all(p.stored.session_id != "s-dog" for p in delta.pages)
    assert all(p.bookmark_terms for p in delta.pages)
    pks = {p.pk for p in delta.pages}
    assert store.load_pages(tenant, "u1", since=delta.state.version, known=pks).pages == []
    # A replica that still holds the deleted pages learns they are gone.
    behind = store.load_pages(tenant, "u1", since=delta.state.version, known=pks | {10**9})
    assert behind is not None and behind.live == frozenset(pks)
    assert store.load_pages(tenant, "nobody") is None


def test_incremental_index_matches_a_fresh_one(
    store: Store, tenant: str, memory: MemoryService, ranker: ServiceRanker
) -> None:
    """The replica that followed every ingest, replace and delete (loading only deltas) ranks
    exactly like a replica that loads the user once, at the end."""
    who = Principal(tenant)
    memory.ingest_sessions(who, "u5", SESSIONS[:1])
    memory.ingest_sessions(who, "u5", SESSIONS[1:])
    changed = _session("s-run", 1, ["I switched to the Porto marathon with Clara."])
    memory.ingest_sessions(who, "u5", [changed], replace=True)
    store.delete_session(tenant, "u5", "s-wed")
    # Replace the newest session and delete it, then ingest another: SQLite hands the freed
    # pks to the new rows, which the replica must not mistake for the pages it holds.
    memory.ingest_sessions(
        who, "u5", [_session("s-wed", 2, ["Clara moved the wedding."])], replace=True
    )
    followed_ids = [h.page.page.id for h in memory.recall(who, "u5", "wedding", top_k=10).hits]
    assert "s-wed#0" in followed_ids
    store.delete_session(tenant, "u5", "s-wed")
    memory.ingest_sessions(who, "u5", [_session("s-cat", 4, ["I also got a cat named Luna."])])
    questions = ["which marathon?", "golden retriever Max", "Porto Clara", "cat Luna", "zzz"]
    followed = [memory.recall(who, "u5", q, top_k=10) for q in questions]
    fresh_memory = MemoryService(
        memory.config, store, ServiceRanker(build_filter("bm25")), memory.extractor
    )
    fresh = [fresh_memory.recall(who, "u5", q, top_k=10) for q in questions]
    for a, b in zip(followed, fresh, strict=True):
        assert [h.page.page.id for h in a.hits] == [h.page.page.id for h in b.hits]
        assert [h.score for h in a.hits] == pytest.approx([h.score for h in b.hits])
        assert [h.keywords for h in a.hits] == [h.keywords for h in b.hits]
    ids = {h.page.page.id for h in followed[0].hits}
    assert ids == {"s-dog#0", "s-dog#2", "s-run#0", "s-cat#0"}  # s-wed deleted, s-run replaced
    assert "Luna" in followed[3].hits[0].page.page.render()
    assert followed[0].hits[0].page.page.id == "s-run#0"
    # And both match BM25 built from scratch over the same pages.
    delta = store.load_pages(tenant, "u5")
    assert delta is not None
    pages = [p.stored.page for p in sorted(delta.pages, key=lambda p: p.order)]
    scratch = build_filter("bm25").score(questions[0], pages)
    assert [h.page.page.id for h in followed[0].hits] == list(scratch.ids)
    assert [h.coarse_score for h in followed[0].hits] == pytest.approx(list(scratch.scores))


def test_a_user_deleted_and_created_again_is_never_served_from_the_old_index(
    store: Store, tenant: str, memory: MemoryService, ranker: ServiceRanker
) -> None:
    """Another replica forgets the user and ingests a new history under the same id, reaching
    the same version number: this replica must notice (the user's epoch) and drop its index."""
    who = Principal(tenant)
    memory.ingest_sessions(who, "u6", SESSIONS)
    assert (
        memory.recall(who, "u6", "golden retriever Max", top_k=1).hits[0].page.session_id == "s-dog"
    )
    old = ranker._indexes[(tenant, "u6")]
    other = MemoryService(
        memory.config, store, ServiceRanker(build_filter("bm25")), memory.extractor
    )
    assert store.delete_user(tenant, "u6")
    other.ingest_sessions(who, "u6", [_session("s-new", 9, ["A golden sunset by the sea."])])
    assert store.user_version(tenant, "u6") == old.version  # the number alone cannot tell
    hits = memory.recall(who, "u6", "golden retriever Max", top_k=5).hits
    assert [h.page.session_id for h in hits] == ["s-new"]
    assert ranker._indexes[(tenant, "u6")] is not old


def test_longest_ids_fit_every_column(store: Store, tenant: str, memory: MemoryService) -> None:
    sid = "s" * 128  # the longest ids the API accepts, on a database that enforces lengths
    turns = tuple(Turn("u" * 128, f"turn {i}", turn_id=f"{i}" + "t" * 63) for i in range(3))
    memory.ingest_sessions(Principal(tenant), "u" * 128, [Session(id=sid, turns=turns)])
    stored = store.get_session(tenant, "u" * 128, sid)
    assert stored is not None and len(stored.pages[0].page.id) == 128 + 1 + 64


def test_ingest_raw_turns_segments_on_time_gaps(tenant: str, memory: MemoryService) -> None:
    t0 = datetime(2024, 6, 1, 9)
    turns = [
        Turn("user", f"morning note {i}", timestamp=t0 + timedelta(minutes=i)) for i in range(3)
    ]
    turns += [
        Turn("user", f"evening note {i}", timestamp=t0 + timedelta(hours=10, minutes=i))
        for i in range(2)
    ]
    records = memory.ingest_turns(Principal(tenant), "u2", turns, prefix="day1")
    assert [r.session.id for r in records] == ["day1_0", "day1_1"]
    assert [len(r.session.turns) for r in records] == [3, 2]


def test_recall_fuses_bookmarks_and_is_indexed_at_ingest(
    store: Store, tenant: str, memory: MemoryService, ranker: ServiceRanker
) -> None:
    who = Principal(tenant)
    memory.ingest_sessions(who, "u3", SESSIONS)
    cached = ranker._indexes[(tenant, "u3")]  # built by the ingest, not by the first query
    assert cached.version == store.user_version(tenant, "u3")
    result = memory.recall(who, "u3", "what is the name of my golden retriever?", top_k=3)
    assert result.outcome.ranker == "coarse-only"
    assert result.hits[0].page.page.id == "s-dog#0"
    assert result.hits[0].bookmark_score is not None
    assert ranker._indexes[(tenant, "u3")] is cached  # reused: nothing changed
    with pytest.raises(NotFoundError):
        memory.recall(who, "nobody", "anything")


def test_every_recall_reports_what_finding_the_index_cost(
    store: Store, tenant: str, memory: MemoryService
) -> None:
    """A second replica (a fresh ranker on the same store) opens the user's stored index on its
    first recall, then finds it warm, then reads only an ingest's new pages; a request that
    arrives while another loads waits for that load and says so. Only store reads reach the
    metrics hook."""
    who = Principal(tenant)
    memory.ingest_sessions(who, "u7", SESSIONS)
    replica = ServiceRanker(build_filter("bm25"))
    loads: list[IndexLoad] = []
    replica.on_index_load = loads.append
    other = MemoryService(memory.config, store, replica, YakeExtractor(max_keywords=5))
    n_pages = len(store.load_pages(tenant, "u7").pages)

    first = other.recall(who, "u7", "golden retriever", top_k=1)
    assert first.index.kind == "opened" and first.index.pages == n_pages > 0
    assert first.index.ms > 0
    assert other.recall(who, "u7", "golden retriever", top_k=1).index == IndexLoad("warm")
    more = [_session("s-cat", 20, ["We got a cat called Tom.", "Nice."])]
    memory.ingest_sessions(who, "u7", more)
    caught = other.recall(who, "u7", "cat Tom", top_k=1)
    assert caught.index.kind == "caught_up" and caught.index.pages == 1
    assert caught.hits[0].page.page.id == "s-cat#0"
    assert [load.kind for load in loads] == ["opened", "caught_up"]

    loading, release = threading.Event(), threading.Event()

    class SlowStore:  # the store, with an index read that holds until released
        def __getattr__(self, name: str) -> object:
            return getattr(store, name)

        def index_state(self, *args: object, **kw: object) -> object:
            loading.set()
            release.wait(10)
            return store.index_state(*args, **kw)

    slow_store: Store = SlowStore()  # type: ignore[assignment]
    slow = MemoryService(
        memory.config, slow_store, ServiceRanker(build_filter("bm25")), YakeExtractor()
    )
    results: dict[str, IndexLoad] = {}
    loader = threading.Thread(
        target=lambda: results.update(loader=slow.recall(who, "u7", "cat", top_k=1).index)
    )
    loader.start()
    assert loading.wait(10)
    waiter = threading.Thread(
        target=lambda: results.update(waiter=slow.recall(who, "u7", "cat", top_k=1).index)
    )
    waiter.start()
    time.sleep(0.2)  # the waiter is now blocked on the loader's catch-up
    release.set()
    loader.join(10)
    waiter.join(10)
    assert results["loader"].kind == "opened"
    assert results["waiter"].kind == "waited" and results["waiter"].ms >= 150
    assert results["waiter"].pages == 0


def _fact(store: Store, tenant: str, subject: str, text: str, **kw: object) -> Fact:
    fact, _ = store.add_fact(
        tenant,
        "u4",
        type=str(kw.pop("type", "preference")),
        subject=normalize_subject(subject),
        text=text,
        importance=float(kw.pop("importance", 0.5)),  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )
    return fact


def test_facts_supersede_forget_and_sweep(store: Store, tenant: str) -> None:
    old = _fact(store, tenant, "Home City", "Lives in Berlin.", type="entity")
    # A fact of another type about the same subject is a different fact: never superseded.
    other = _fact(store, tenant, "home city", "Wants to move to a bigger flat.", type="task")
    new, superseded = store.add_fact(
        tenant,
        "u4",
        type="entity",
        subject=normalize_subject("  home   city "),
        text="Lives in Lisbon.",
        importance=0.7,
    )
    assert superseded == [old.fact_id]
    live = store.list_facts(tenant, "u4")
    assert [f.fact_id for f in live] == [new.fact_id, other.fact_id]
    assert store.get_fact(tenant, "u4", old.fact_id) is None  # history is never returned

    # Forget removes the fact and the history it replaced, for good.
    assert store.forget_fact(tenant, "u4", new.fact_id) == 2
    assert store.forget_fact(tenant, "u4", new.fact_id) == 0
    assert store.forget_fact(tenant, "u4", other.fact_id) == 1
    assert store.list_facts(tenant, "u4") == []

    now = utcnow()
    soon = _fact(
        store, tenant, "trip", "Flying to Rome on Friday.", expires_at=now + timedelta(hours=1)
    )
    gone = _fact(
        store, tenant, "lunch", "Lunch with Ana today.", expires_at=now + timedelta(seconds=1)
    )
    keep = _fact(store, tenant, "diet", "Vegetarian.")
    later = now + timedelta(minutes=5)
    # Expired facts are hidden before any sweep runs ...
    assert {f.fact_id for f in store.list_facts(tenant, "u4", now=later)} == {
        soon.fact_id,
        keep.fact_id,
    }
    # ... and the sweep deletes exactly them, in this tenant only when asked to.
    assert store.sweep_expired(tenant=f"{tenant}-other", now=later) == 0
    assert store.sweep_expired(tenant=tenant, now=later) == 1
    assert store.get_fact(tenant, "u4", gone.fact_id, now=now) is None
    assert store.list_facts(tenant, "u4", types=["preference"], now=later)


def test_fact_ranking_decays_with_time_since_access() -> None:
    assert decay(0) == 1.0
    assert decay(100) == pytest.approx(0.5)  # 1 / (1 + 0.01 * 100)
    now = datetime(2025, 1, 1)

    def fact(fid: str, importance: float, days_ago: float, text: str = "x") -> Fact:
        at = now - timedelta(days=days_ago)
        return Fact(fid, "preference", fid, text, importance, at, at, None)

    facts = [fact("old", 0.8, 200), fact("fresh", 0.5, 1), fact("mid", 0.8, 50)]
    ranked = rank_facts(facts, now)
    assert [r.fact.fact_id for r in ranked] == ["mid", "fresh", "old"]
    assert ranked[2].score == pytest.approx(0.8 / 3)
    # Relevance to the question lifts a matching fact above a fresher unrelated one.
    facts = [fact("tea", 0.5, 0, "likes green tea"), fact("dog", 0.5, 10, "has a dog named Max")]
    assert rank_facts(facts, now, "what is my dog called?")[0].fact.fact_id == "dog"


def _slots(*pairs: tuple[str, int]) -> list[PageSlot]:
    return [PageSlot(pid, n) for pid, n in pairs]


def test_paging_evicts_only_above_high_and_stops_at_low() -> None:
    calls: list[list[str]] = []

    def relevance(ids: list[str]) -> list[str]:
        calls.append(ids)
        return sorted(ids)  # alphabetical = most relevant first

    # Under the high watermark (90 of 100): everything is paged in, no ranking call.
    plan = plan_paging(
        _slots(("a", 30)),
        _slots(("b", 30), ("c", 20)),
        100,
        high_watermark=0.9,
        low_watermark=0.5,
        relevance=relevance,
    )
    assert plan.page_in == ("b", "c") and plan.page_out == () and not plan.evicted
    assert calls == [] and plan.used_tokens == 80

    # Over it: one ranking call over resident + offered, then drop least relevant to <= low.
    plan = plan_paging(
        _slots(("a", 30), ("d", 30)),
        _slots(("b", 30), ("c", 20), ("z", 500)),
        100,
        high_watermark=0.9,
        low_watermark=0.5,
        relevance=relevance,
    )
    assert len(calls) == 1 and sorted(calls[0]) == ["a", "b", "c", "d"]
    assert plan.evicted and plan.used_tokens <= 50
    # 110 tokens > 90: drop d (80), c (60), b (30 <= 50) from the bottom of the ranking.
    assert plan.page_out == ("d",) and plan.page_in == () and plan.resident == ("a",)
    assert plan.used_tokens == 30
    assert plan.skipped == ("z", "b", "c")  # z never fits the budget; b, c lost on relevance
    assert {e.action for e in plan.events} == {"out", "skip"}
    assert all(e.reason for e in plan.events)


def test_paging_keeps_the_most_relevant_page_even_over_low() -> None:
    plan = plan_paging(
        _slots(("old", 24)),
        _slots(("new", 24)),
        37,
        high_watermark=0.9,
        low_watermark=0.6,
        relevance=lambda ids: ["new", "old"],
    )
    assert plan.page_out == ("old",) and plan.page_in == ("new",)
    assert plan.used_tokens == 24 > plan.low_tokens


def test_context_pages_in_and_out_and_logs_every_decision(
    store: Store, tenant: str, memory: MemoryService
) -> None:
    who = Principal(tenant)
    memory.ingest_sessions(who, "u5", SESSIONS)
    # Pages are 14-25 tokens; a budget of 80 leaves ~76 for pages: high 68, low 45.
    first = memory.context(
        who, "u5", "golden retriever Max, puppy school, shoes", budget_tokens=80, recent_turns=0
    )
    assert first.plan.page_in == ("s-dog#0", "s-dog#2") and not first.plan.evicted
    assert {pid for pid, _ in store.resident_pages(tenant, "u5")} == {"s-dog#0", "s-dog#2"}
    second = memory.context(
        who,
        "u5",
        "Lisbon half marathon: weekly kilometres by the river",
        budget_tokens=80,
        recent_turns=0,
    )
    plan = second.plan
    assert plan.evicted and plan.used_tokens <= plan.low_tokens < plan.high_tokens
    assert set(plan.page_out) == {"s-dog#0", "s-dog#2"}
    assert plan.page_in == ("s-run#0", "s-run#2")
    assert second.tokens["total"] <= 80 and "marathon" in second.text and "Max" not in second.text
    logged = store.paging_events(tenant, "u5", limit=100)
    assert len(logged) == len(first.plan.events) + len(plan.events)
    assert {e.action for e in logged} == {"in", "out"}
    assert all(e.reason for e in logged)


def test_sqlite_store_runs_in_wal_mode(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'wal.db'}")
    store.migrate()
    with store._reader.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    store.close()


def test_concurrent_writers_and_readers_never_fail(store: Store, tenant: str) -> None:
    """8 threads over two Store objects on one database, writing (with supersedes) and reading
    at once: on SQLite nothing may surface "database is locked"."""
    other = Store(store.url)
    turns = (Turn("user", "hello there"), Turn("bot", "general kenobi"))
    errors: list[BaseException] = []

    def work(n: int) -> None:
        s = (store, other)[n % 2]
        try:
            for i in range(12):
                s.add_fact(
                    tenant, f"u{n}", type="task", subject=f"s{i % 3}", text="t", importance=0.5
                )
                record = SessionRecord(
                    Session(id=f"x{i}", turns=turns), 4, (PageRecord(f"x{i}#0", 0, 2, 4),)
                )
                s.put_sessions(tenant, f"u{n}", [record])
                s.list_facts(tenant, f"u{n}")
                s.load_pages(tenant, f"u{n}")
        except BaseException as e:  # noqa: BLE001 - any failure counts, "database is locked" first
            errors.append(e)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    other.close()
    assert not errors, errors[:3]
    assert all(store.list_sessions(tenant, f"u{n}")[1] == 12 for n in range(8))
    # Subjects repeat, so supersede ran under contention: one live fact per subject per user.
    assert all(len(store.list_facts(tenant, f"u{n}")) == 3 for n in range(8))


def test_llm_bookmarks_parse_a_keyword_list() -> None:
    from memsifter.serving.bookmarks import LLMExtractor, to_bookmarks
    from memsifter.testing.backends import ScriptedBackend

    backend = ScriptedBackend(lambda _p: '1. Golden retriever\n- Max\n* the\nMax\n"puppy school".')
    extractor = LLMExtractor(backend, max_keywords=5)
    [keywords] = extractor.extract([SESSIONS[0]])
    assert [k for k, _ in keywords] == ["Golden retriever", "Max", "the", "puppy school"]
    assert backend.calls == 1 and "golden retriever named Max" in backend.prompts[0]
    marks = to_bookmarks(keywords)
    assert [b.keyword for b in marks] == ["Golden retriever", "Max", "puppy school"]  # "the": none
    assert marks[0].terms == ("golden", "retriev")


def test_the_proxys_page_token_cache_is_bounded() -> None:
    """The prompt builder's page-token cache lives as long as the server: least recently used
    pages go first once ``token_cache_pages`` are held; a training run keeps every count."""
    from memsifter.data.tokens import ApproxCounter, SessionTokenCache
    from memsifter.testing.backends import ScriptedBackend, reverse_ranking

    calls: list[str] = []

    class Counting(ApproxCounter):
        def count(self, text: str) -> int:
            calls.append(text)
            return super().count(text)

    cache = SessionTokenCache(Counting(), max_size=2)
    a, b, c = (_session(s, 1, [f"text {s}"]) for s in ("a", "b", "c"))
    for s in (a, b, a, c):  # a was used after b, so c pushes b out
        cache(s)
    assert len(cache) == 2 and len(calls) == 3
    cache(a)
    assert len(calls) == 3  # still held
    cache(b)
    assert len(calls) == 4  # counted again
    assert SessionTokenCache(Counting()).max_size is None
    ranker = ServiceRanker(
        build_filter("bm25"), ScriptedBackend(reverse_ranking), PromptSpec(), token_cache_pages=123
    )
    assert ranker.proxy is not None and ranker.proxy.builder.session_tokens.max_size == 123
