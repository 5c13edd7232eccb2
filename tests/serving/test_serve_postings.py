"""Users' BM25 indexes held by the database (``store.postings``) and read by replicas
(``StoredIndex``): the ranking equals BM25 over the same pages, ties and the zero tail
included; postings written at ingest equal postings written again from the pages; a user whose
postings are missing or another analyzer's is indexed again (with a log line and a counted
load) before being served; replicas that cached a term see another replica's ingest at once.
Every test runs on SQLite, and on PostgreSQL when ``MEMSIFTER_TEST_PG_DSN`` names a server."""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import select, update

from memsifter.coarse import build_filter
from memsifter.data.types import Session, Turn
from memsifter.serving.bookmarks import YakeExtractor
from memsifter.serving.config import PagingSettings, ServeConfig
from memsifter.serving.memory import MemoryService
from memsifter.serving.ranking import IndexLoad, ServiceRanker
from memsifter.serving.store import Principal, Store, packs
from memsifter.serving.store.postings import MAX_TERM, term_key
from memsifter.serving.store.records import IndexState
from memsifter.serving.store.schema import (
    MIGRATIONS,
    IndexTermRow,
    PageRow,
    PostingRow,
    UserRow,
)
from memsifter.serving.stored_index import SLOT_SPAN, StoredIndex, _lookup
from memsifter.testing.coarse import LetterFilter


@pytest.fixture(params=["rows", "packs"])
def packed(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Users' indexes read as rows (a small user), or from packs written by nearly every read
    (``store.packs``): the rankings are the same."""
    if request.param == "packs":
        monkeypatch.setattr(packs, "PACK_MIN", 1)


class NoKeywords:
    """No bookmarks: recall is then the coarse ranking alone, comparable with BM25's."""

    name = "none"

    def extract(self, pages: Sequence[Session]) -> list[list[tuple[str, float]]]:
        return [[] for _ in pages]


def _memory(
    store: Store, ranker: ServiceRanker | None = None, *, bookmarks: bool = False
) -> MemoryService:
    config = ServeConfig(db_url=store.url, paging=PagingSettings(turns_per_page=2))
    ranker = ranker or ServiceRanker(build_filter("bm25"))
    extractor = YakeExtractor(max_keywords=5) if bookmarks else NoKeywords()
    return MemoryService(config, store, ranker, extractor)


def _session(sid: str, day: int | None, lines: list[str]) -> Session:
    turns = tuple(Turn("user" if i % 2 == 0 else "bot", t) for i, t in enumerate(lines))
    if day is None:
        return Session(id=sid, turns=turns)
    return Session(
        id=sid, turns=turns, date=datetime(2024, 5, day, 12), date_text=f"{day} May 2024"
    )


# Ties on purpose: the same words on other dates (equal scores), pages sharing no word with
# the questions (the zero tail), an undated session (last in chronological order), and a
# session ingested after newer ones (out of order).
HISTORY = [
    _session("a", 5, ["We walked the dog in the park.", "Nice."]),
    _session("b", 9, ["We walked the dog in the park.", "Nice."]),
    _session("c", 7, ["The quarterly tax forms are due.", "Ugh."]),
    _session("d", None, ["We walked the dog again, in the rain.", "Wet dog."]),
    _session("e", 8, ["I bought a kayak.", "Where will you paddle?", "On the lake.", "Fun."]),
]
LATE = _session("f", 2, ["The dog park was closed.", "Pity.", "Taxes again.", "Ok."])
QUESTIONS = ["dog park", "tax", "kayak lake dog", "zebra", "the"]


def _scratch(store: Store, tenant: str, user: str, question: str) -> tuple[list[str], list[float]]:
    """BM25 (bm25s) built from scratch over the user's pages in chronological order: every
    page, best first, ties in chronological order."""
    delta = store.load_pages(tenant, user)
    assert delta is not None
    pages = [p.stored.page for p in sorted(delta.pages, key=lambda p: p.order)]
    ranking = build_filter("bm25").score(question, pages)
    return list(ranking.ids), list(ranking.scores or ())


def _recall_all(memory: MemoryService, tenant: str, user: str, question: str) -> list[object]:
    return memory.recall(Principal(tenant), user, question, top_k=100).hits


def test_a_stored_index_ranks_like_bm25_over_the_pages_ties_and_zero_tail_included(
    store: Store, tenant: str, packed: None
) -> None:
    memory = _memory(store)
    who = Principal(tenant)
    memory.ingest_sessions(who, "u", HISTORY)
    memory.ingest_sessions(who, "u", [LATE])  # older than every page held: a reopen
    store.delete_session(tenant, "u", "c")
    for replica in (memory, _memory(store)):  # the one that followed, and a fresh one
        for question in QUESTIONS:
            hits = _recall_all(replica, tenant, "u", question)
            ids, scores = _scratch(store, tenant, "u", question)
            assert [h.page.page.id for h in hits] == ids, question
            assert [h.coarse_score for h in hits] == pytest.approx(scores), question
    # A recall asks for the top k only; it is the same prefix.
    top = memory.recall(who, "u", "dog park", top_k=2).hits
    assert [h.page.page.id for h in top] == _scratch(store, tenant, "u", "dog park")[0][:2]


def test_cached_terms_score_as_bm25_after_each_ingest_that_appends(
    store: Store, tenant: str, packed: None
) -> None:
    """A replica keeps the postings and BM25 weights of the terms queries asked for; each
    ingest of newer pages (with the terms, or with none of them: every page count and length
    still moves the weights) is appended, whether this replica wrote it (taken from the write)
    or another did (read), or both, one after the other; every question then scores as BM25
    from scratch over the pages, on both replicas."""
    a, b = _memory(store), _memory(store)
    who = Principal(tenant)
    dated = [s for s in HISTORY if s.date is not None]
    a.ingest_sessions(who, "u", dated)
    later = [
        (a, _session("g", 20, ["A kayak on the lake.", "Calm water."])),
        (a, _session("h", 21, ["Nothing of note today.", "Quiet."])),
        (b, _session("i", 22, ["Tax day, and the dog park.", "Busy."])),
        (a, _session("j", 23, ["The dog again.", "Kayak later."])),
    ]
    for writer, session in [(None, None), *later]:
        if writer is not None:
            writer.ingest_sessions(who, "u", [session])
        for replica in (a, b):
            for question in QUESTIONS:
                result = replica.recall(who, "u", question, top_k=100)
                assert result.index.kind in ("warm", "caught_up", "opened"), result.index
                ids, scores = _scratch(store, tenant, "u", question)
                assert [h.page.page.id for h in result.hits] == ids, question
                assert [h.coarse_score for h in result.hits] == pytest.approx(scores), question


def _rows(arrays: dict[str, tuple[np.ndarray, np.ndarray]]) -> set[tuple[str, int, float]]:
    return {
        (term, int(pk), float(v))
        for term, (pks, vs) in arrays.items()
        for pk, v in zip(pks, vs, strict=True)
    }


def test_what_a_write_returns_is_what_a_replica_would_read_back(store: Store, tenant: str) -> None:
    """``put_sessions`` says what it wrote (the new pages as ``index_state`` since the version
    before reads them, their postings and bookmark rows), so the writing replica catches up
    without reading them back: equal to the read, for dated, undated and several-page
    sessions, with bookmarks, and for a replace (pages removed: not complete)."""
    memory = _memory(store, bookmarks=True)
    analyzer = memory.ranker.index_analyzer
    for batch, replace in [
        (HISTORY[:2], False),
        ([LATE, HISTORY[3]], False),
        ([HISTORY[4]], False),
        ([HISTORY[0]], True),
    ]:
        records = [memory._record(s)[0] for s in batch]
        written = store.put_sessions(tenant, "u", records, replace=replace, analyzer=analyzer)
        state = written.state
        read = store.index_state(tenant, "u", since=state.version - 1)
        assert read is not None
        assert (state.epoch, state.version, state.analyzer, state.complete) == (
            read.epoch,
            read.version,
            read.analyzer,
            read.complete,
        )
        assert state.complete is not replace
        assert state.pks.tolist() == read.pks.tolist() and len(state.pks)
        assert state.lengths.tolist() == read.lengths.tolist()
        assert (state.first_order, state.last_order) == (read.first_order, read.last_order)
        postings, marks = store.page_terms(state.pks.tolist())
        assert _rows(written.postings) == _rows(postings)
        assert _rows(written.marks) == _rows(marks) and marks


def test_bookmarks_fuse_as_they_do_over_pages_held_in_memory(store: Store, tenant: str) -> None:
    """With bookmarks, the stored index's fused ranking equals the in-memory path's (the pages
    held by the replica, scored by the same BM25 filter, bookmark hits from the pages' rows)."""
    stored = _memory(store, bookmarks=True)
    who = Principal(tenant)
    stored.ingest_sessions(who, "u", [*HISTORY, LATE])
    in_memory = ServiceRanker(build_filter("bm25"))
    in_memory._bm25 = None  # the path a non-BM25 filter takes: pages held, the filter scores
    held = _memory(store, in_memory, bookmarks=True)
    marked = 0
    for question in QUESTIONS:
        a = stored.recall(who, "u", question, top_k=100)
        b = held.recall(who, "u", question, top_k=100)
        assert [h.page.page.id for h in a.hits] == [h.page.page.id for h in b.hits], question
        assert [h.bookmark_score for h in a.hits] == [h.bookmark_score for h in b.hits]
        assert [h.score for h in a.hits] == pytest.approx([h.score for h in b.hits])
        marked += sum(h.bookmark_score is not None for h in a.hits)
    assert marked  # bookmarks took part


def test_excluded_pages_are_left_out_of_the_ranking_and_the_zero_tail(
    store: Store, tenant: str
) -> None:
    memory = _memory(store)
    who = Principal(tenant)
    memory.ingest_sessions(who, "u", HISTORY)
    ids, _ = _scratch(store, tenant, "u", "dog park")
    skip = [ids[0], ids[-1]]
    hits = memory.recall(who, "u", "dog park", top_k=100, exclude=skip).hits
    assert [h.page.page.id for h in hits] == [i for i in ids if i not in skip]


def _postings(store: Store, tenant: str, user: str) -> dict[tuple[str, str], int]:
    """(page id, term) -> count, as the database holds the user's postings."""
    with store._read() as s:
        rows = s.execute(
            select(PageRow.page_id, IndexTermRow.term, PostingRow.tf)
            .join(PostingRow, PostingRow.page_pk == PageRow.pk)
            .join(IndexTermRow, IndexTermRow.pk == PostingRow.term_pk)
            .where(PageRow.tenant_id == tenant, PageRow.user_id == user)
        ).all()
    return {(page, term): tf for page, term, tf in rows}


def _lengths(store: Store, tenant: str, user: str) -> dict[str, int | None]:
    with store._read() as s:
        rows = s.execute(
            select(PageRow.page_id, PageRow.n_terms).where(
                PageRow.tenant_id == tenant, PageRow.user_id == user
            )
        ).all()
    return dict(rows)


def _forget_postings(store: Store, tenant: str, user: str) -> None:
    """Make the user look as if stored before postings existed (revision 0003)."""
    with store._write() as s:
        pks = select(PageRow.pk).where(PageRow.tenant_id == tenant, PageRow.user_id == user)
        s.execute(PostingRow.__table__.delete().where(PostingRow.page_pk.in_(pks)))
        s.execute(
            update(PageRow)
            .where(PageRow.tenant_id == tenant, PageRow.user_id == user)
            .values(n_terms=None)
        )
        s.execute(
            update(UserRow)
            .where(UserRow.tenant_id == tenant, UserRow.user_id == user)
            .values(index_analyzer=None)
        )


def test_postings_written_at_ingest_equal_those_written_again_from_the_pages(
    store: Store, tenant: str, caplog: pytest.LogCaptureFixture
) -> None:
    """What ingest writes (terms counted from the page as sent) is what a reindex writes (from
    the page as stored: dates back as naive UTC); a user without postings is indexed again on
    first use, logged and counted as a ``reindexed`` load, and then ranks as before."""
    memory = _memory(store)
    who = Principal(tenant)
    memory.ingest_sessions(who, "u", [*HISTORY, LATE])
    written, lengths = _postings(store, tenant, "u"), _lengths(store, tenant, "u")
    assert written and all(n is not None and n > 0 for n in lengths.values())
    before = [h.page.page.id for h in _recall_all(memory, tenant, "u", "dog park")]

    _forget_postings(store, tenant, "u")
    replica = ServiceRanker(build_filter("bm25"))
    loads: list[IndexLoad] = []
    replica.on_index_load = loads.append
    with caplog.at_level(logging.WARNING, logger="memsifter.serving.ranking"):
        result = _memory(store, replica).recall(who, "u", "dog park", top_k=100)
    assert result.index.kind == "reindexed" and [x.kind for x in loads] == ["reindexed"]
    assert "postings were written again" in caplog.text
    assert _postings(store, tenant, "u") == written
    assert _lengths(store, tenant, "u") == lengths
    assert [h.page.page.id for h in result.hits] == before
    # Indexed once: the next replica opens it.
    again = _memory(store).recall(who, "u", "dog park", top_k=1)
    assert again.index.kind == "opened"


def test_pages_stored_by_a_service_without_bm25_are_indexed_before_bm25_serves_them(
    store: Store, tenant: str
) -> None:
    """A service whose coarse filter is not BM25 writes no postings and marks the user so
    (``index_analyzer`` NULL), even after a BM25 service had indexed them: a BM25 replica then
    never serves postings that miss those pages."""
    who = Principal(tenant)
    _memory(store).ingest_sessions(who, "u", HISTORY[:2])
    letters = _memory(store, ServiceRanker(LetterFilter()))
    letters.ingest_sessions(who, "u", [LATE])
    result = _memory(store).recall(who, "u", "dog park", top_k=100)
    assert result.index.kind == "reindexed"
    ids, _ = _scratch(store, tenant, "u", "dog park")
    assert [h.page.page.id for h in result.hits] == ids


def test_a_replica_that_cached_a_term_sees_another_replicas_ingest_at_once(
    store: Store, tenant: str, packed: None
) -> None:
    """Replica A has the question's postings cached; replica B ingests a page with those
    terms, and deletes one: A's next recall catches up (the new page's postings appended to its
    cached terms, or its cache dropped on a delete) and ranks like a fresh replica."""
    a, b = _memory(store), _memory(store)
    who = Principal(tenant)
    b.ingest_sessions(who, "u", [s for s in HISTORY if s.date is not None])
    a.recall(who, "u", "dog park", top_k=3)  # caches "dog" and "park"
    b.ingest_sessions(who, "u", [_session("g", 20, ["A new dog park opened.", "Great."])])
    caught = a.recall(who, "u", "dog park", top_k=100)
    assert caught.index.kind == "caught_up"
    ids, scores = _scratch(store, tenant, "u", "dog park")
    assert [h.page.page.id for h in caught.hits] == ids
    assert [h.coarse_score for h in caught.hits] == pytest.approx(scores)
    store.delete_session(tenant, "u", "g")
    after = a.recall(who, "u", "dog park", top_k=100)
    assert after.index.kind == "opened"  # a page is gone: read again
    assert [h.page.page.id for h in after.hits] == _scratch(store, tenant, "u", "dog park")[0]


def test_context_pages_come_from_the_store_by_id(store: Store, tenant: str) -> None:
    """Context pages in the recall's top pages and keeps resident pages across calls, reading
    each page it assembles from the store (no replica holds page text)."""
    memory = _memory(store, bookmarks=True)
    who = Principal(tenant)
    memory.ingest_sessions(who, "u", [*HISTORY, LATE])
    first = memory.context(who, "u", "kayak lake", budget_tokens=400)
    assert any("kayak" in p.page.render() for p in first.pages)
    second = _memory(store).context(who, "u", "dog park", budget_tokens=400)
    ids = {p.page.id for p in second.pages}
    assert any(pid.startswith("e#") for pid in ids)  # the kayak page stayed resident
    assert "kayak" in second.text


def test_terms_too_long_for_the_column_keep_apart() -> None:
    long_a, long_b = "x" * 150 + "a", "x" * 150 + "b"
    assert term_key("short") == "short"
    assert len(term_key(long_a)) <= MAX_TERM
    assert term_key(long_a) != term_key(long_b)
    assert term_key(long_a) == term_key(long_a)


def test_terms_read_at_another_version_serve_that_query_only() -> None:
    """Postings read after an ingest this index has not caught up with (or before one it has)
    would miss or double pages in the cache: they score one query, restricted to held pages,
    and are not kept."""
    index = StoredIndex("t", "u", "e", 1.5, 0.75)
    index.open(IndexState("e", 4, "a", [10, 11, 12], [5, 5, 5], None, None))
    newer = {"dog": (np.array([10, 12, 13]), np.array([1.0, 2.0, 1.0]))}  # 13: not held
    extra = index.take(5, newer, {}, (["dog"], []))
    assert index.missing(["dog"], []) == (["dog"], [])  # not cached
    found = index.evidence(["dog"], [], extra)
    assert found.positions.tolist() == [0, 2]
    assert index.take(4, newer, {}, (["dog"], [])) == ({}, {})
    assert index.missing(["dog"], []) == ([], [])


def test_appending_pages_copies_nothing_held_and_leaves_a_querys_snapshot_as_it_was() -> None:
    """Appended pages and postings go into the index's arrays in place (grown by doubling, so
    an ingest does not copy a long history), while evidence taken before still reads the
    pages and scores it was taken over; the index then scores over every page."""
    index = StoredIndex("t", "u", "e", 1.5, 0.75)
    index.open(IndexState("e", 1, "a", [1, 2, 3], [5, 5, 5], None, None))
    index.take(1, {"dog": (np.array([1, 3]), np.array([1.0, 2.0]))}, {}, (["dog"], []))
    before = index.evidence(["dog"], [])
    kept = (before.pks.copy(), before.positions.copy(), before.coarse.copy())
    grown = []
    for version in range(2, 200):
        pk = 100 + version
        state = IndexState("e", version, "a", [pk], [5], None, None)
        assert index.appends(state)
        index.catch_up(state, {"dog": (np.array([pk]), np.array([1.0]))}, {})
        grown.append(index.nbytes)
    assert np.array_equal(before.pks, kept[0]) and np.array_equal(before.positions, kept[1])
    assert np.array_equal(before.coarse, kept[2])
    after = index.evidence(["dog"], [])
    assert after.positions.tolist() == [0, 2, *range(3, 201)]
    assert after.pks.tolist() == [1, 2, 3, *range(102, 300)]
    # Doubling: the bytes held change at a handful of appends, not at each.
    assert len(set(grown)) < 30


def test_positions_by_pk_from_the_table_equal_the_binary_search_through_appends() -> None:
    """A query's postings find their pages' chronological positions in a table by pk while
    the user's pks are dense enough (``SLOT_SPAN``), else by binary search: the same
    positions, -1 for pks not held (between, below and above), for pages in pk order (no
    positions written down) or not, before and after appends in pk order, out of it, and one
    whose gap drops the table."""
    rng = np.random.default_rng(0)
    for gap, shuffled in itertools.product((1, 3, 7), (False, True)):
        # pks every `gap`: dense, within SLOT_SPAN, beyond it; chronological in pk order or not
        pks = np.arange(50, 50 + 400 * gap, gap)
        chronological = rng.permutation(pks) if shuffled else pks
        index = StoredIndex("t", "u", "e", 1.5, 0.75)
        index.open(IndexState("e", 1, "a", chronological, np.full(400, 5.0), None, None))
        assert (index._slots is not None) is (gap <= SLOT_SPAN)
        assert (index._order_pos is None) is not shuffled
        version = 1
        for step in range(5):
            asked = rng.integers(0, int(index.pks.max()) + 100, 3000)
            order = np.argsort(index.pks, kind="stable")
            expected = _lookup(index.pks[order], order, asked)
            assert np.array_equal(index._positions(asked), expected), (gap, shuffled, step)
            assert (expected >= 0).any() and (expected < 0).any()
            version += 1
            jump = 1 if step < 3 else 10_000  # the last append spans too far for a table
            top = int(index.pks.max())
            new = np.arange(top + jump, top + jump + 20 * gap, gap)
            if step == 1:  # chronological order stops following pk order
                new = rng.permutation(new)
            state = IndexState("e", version, "a", new, np.full(len(new), 5.0), None, None)
            assert index.appends(state)
            index.catch_up(state, {}, {})
        assert index._slots is None and index._order_pos is not None


def test_the_top_of_a_fused_ranking_equals_the_full_sorts_prefix() -> None:
    """``_fused_top`` (the heads of both rankings, ranked without sorting every candidate)
    gives what ``_fuse`` (sort everything) gives, first n and their fused scores, on scores
    with ties, zeros, with and without bookmark weights; small sets (ranked whole) and sets
    large enough to be cut to the heads, with small and large ``rrf_k``."""
    from memsifter.serving.ranking import _fuse, _fused_top

    rng = np.random.default_rng(0)
    for trial in range(400):
        size = int(rng.integers(1, 60)) if trial % 2 else int(rng.integers(200, 3000))
        coarse = rng.choice([0.0, 0.5, 1.0, 1.5, 2.0, 3.7], size) * (rng.random() < 0.9)
        if trial % 3:
            coarse = coarse + rng.random(size) * (coarse > 0) * (trial % 5 > 1)
        marks = rng.choice([0.0, 0.0, 0.3, 0.6], size) * (trial % 4 != 0)
        if trial % 7 == 0:  # few bookmark hits, deep in the coarse ranking
            marks = marks * (rng.random(size) < 0.01)
        n = int(rng.integers(1, 45))
        k = int(rng.choice([0, 1, 10, 60]))
        fused, order = _fuse(coarse, np.argsort(-coarse, kind="stable"), marks, k)
        top, top_fused = _fused_top(coarse, marks, k, n)
        assert top.tolist() == order[:n].tolist(), (trial, n, k)
        assert np.array_equal(top_fused, fused[order[:n]]), trial


def test_a_database_from_before_postings_is_indexed_on_first_use(tmp_path: Path) -> None:
    """Pages written at revision 0003 (no postings, lengths or copied dates) are served after
    the upgrade: the migration copies each page's date, and the first recall indexes the user
    from the pages (``reindexed``), ranking as BM25 over them."""
    from alembic import command
    from alembic.config import Config

    url = f"sqlite:///{tmp_path / 'old.db'}"
    store = Store(url)
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with store._writer.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0003")
    with store._writer.begin() as conn:  # what a 0003 service wrote, column by column
        conn.exec_driver_sql("INSERT INTO tenants (id, created_at) VALUES ('acme', '2024-01-01')")
        conn.exec_driver_sql(
            "INSERT INTO users (tenant_id, user_id, version, epoch, created_at)"
            " VALUES ('acme', 'u', 1, 'e1', '2024-01-01')"
        )
        for i, session in enumerate(HISTORY):
            turns = json.dumps([{"speaker": t.speaker, "text": t.text} for t in session.turns])
            conn.exec_driver_sql(
                "INSERT INTO sessions (pk, tenant_id, user_id, session_id, date, date_text,"
                " turns, n_turns, n_tokens, created_at) VALUES (?, 'acme', 'u', ?, ?, ?, ?, ?,"
                " 10, '2024-01-01')",
                (i + 1, session.id, session.date, session.date_text, turns, len(session.turns)),
            )
            conn.exec_driver_sql(
                "INSERT INTO pages (session_pk, tenant_id, user_id, page_id, turn_start,"
                " turn_end, n_tokens, added_version) VALUES (?, 'acme', 'u', ?, 0, ?, 10, 1)",
                (i + 1, f"{session.id}#0", len(session.turns)),
            )
    store.migrate()
    assert _lengths(store, "acme", "u") == {f"{s.id}#0": None for s in HISTORY}
    with store._read() as s:
        copied = dict(s.execute(select(PageRow.page_id, PageRow.date)).all())
        undated = dict(s.execute(select(PageRow.page_id, PageRow.undated)).all())
    assert copied == {f"{x.id}#0": x.date for x in HISTORY}
    assert undated == {f"{x.id}#0": x.date is None for x in HISTORY}
    result = _memory(store).recall(Principal("acme"), "u", "dog park", top_k=100)
    assert result.index.kind == "reindexed"
    assert [h.page.page.id for h in result.hits] == _scratch(store, "acme", "u", "dog park")[0]
    assert all(n for n in _lengths(store, "acme", "u").values())
    store.close()


def _index_definitions(store: Store) -> dict[str, str]:
    with store._writer.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT indexname, indexdef FROM pg_indexes WHERE indexname IN"
            " ('pk_index_postings', 'ix_pages_user_chronological')"
        ).all()
    return dict(rows)


def test_postgresql_reads_postings_and_page_lengths_from_indexes_alone(
    serve_db: Callable[[str], str],
) -> None:
    """Migration 0005 makes a term's postings and a user's page lengths index-only reads on
    PostgreSQL (the key index carries ``tf``, the chronological index ``pk``), and goes back
    down to 0004 and up again. SQLite needs neither (a clustered table; indexes hold the
    rowid), so there it changes nothing."""
    from alembic import command
    from alembic.config import Config

    store = Store(serve_db("covering"))
    store.migrate()
    if store.dialect != "postgresql":
        store.close()
        pytest.skip("SQLite clusters the postings, and its indexes hold pages.pk (the rowid)")
    try:
        covered = _index_definitions(store)
        assert "INCLUDE (tf)" in covered["pk_index_postings"]
        assert "INCLUDE (pk)" in covered["ix_pages_user_chronological"]
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        with store._writer.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0004")
        assert not any("INCLUDE" in d for d in _index_definitions(store).values())
        store.migrate()
        assert _index_definitions(store) == covered
    finally:
        store.close()


def _ranked(found: object, excluded: np.ndarray, k: int, n: int) -> tuple[list, list, list]:
    """What a recall ranks from evidence (``_recall_stored``): the excluded positions out,
    then ``_fused_top``'s first n, their fused and coarse scores."""
    from memsifter.serving.ranking import _fused_top

    positions = found.positions  # type: ignore[attr-defined]
    keep = ~np.isin(positions, excluded)
    coarse, marks = found.coarse[keep], found.marks[keep]  # type: ignore[attr-defined]
    top, fused = _fused_top(coarse, marks, k, n)
    return positions[keep][top].tolist(), fused.tolist(), coarse[top].tolist()


def test_pruned_evidence_ranks_a_recall_exactly_as_the_full_scoring(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``top``, a query with common terms (on more than 1/COMMON_SHARE of the pages) is
    scored at the pages that can change a recall's ranking only (MaxScore): the recall's first
    n, their fused and coarse scores equal the full scoring's bit for bit, without bookmark
    hits and with them (fused by rank with every page's coarse rank), with excluded pages;
    every page it holds has its exact score (but bookmarked pages that cannot rank, held at
    0). Over random histories with ties (few lengths and tfs), repeated query terms, pages in
    pk order or not, terms cached before and after appends. The control: many queries of both
    kinds were pruned and held fewer pages (at any gain: these histories are small)."""
    import memsifter.serving.stored_index as stored_index

    monkeypatch.setattr(stored_index, "PRUNE_GAIN", 1)
    rng = np.random.default_rng(1)
    pruned = {False: 0, True: 0}
    for trial in range(150):
        n = int(rng.integers(60, 500))
        pks = np.arange(10, 10 + 2 * n, 2)
        chronological = rng.permutation(pks) if trial % 3 == 0 else pks
        lengths = rng.choice([3, 8, 8, 20], n).astype(np.int64)
        index = StoredIndex("t", "u", "e", 1.5, 0.75)
        index.open(IndexState("e", 1, "a", chronological, lengths, None, None))
        shares = {"w0": 0.9, "w1": 0.5, "w2": 0.2, "r0": 0.05, "r1": 0.03, "r2": 0.1}
        postings = {}
        for term, share in shares.items():
            held = np.sort(rng.choice(pks, max(1, int(share * n)), replace=False))
            tf = rng.choice([1, 1, 2, 3], len(held)).astype(np.uint8)
            postings[term_key(term)] = (held, tf)
        # Bookmarks on pages with a rare term (as a page's keywords come from its text), and
        # on half the pages (whose weakest scores leave little to prune).
        marked = {
            term: (np.sort(rng.choice(among, size, replace=False)), rng.choice([0.5, 1.0], size))
            for term, among, size in (
                ("m0", postings[term_key("r0")][0], min(3, len(postings[term_key("r0")][0]))),
                ("m1", postings[term_key("r2")][0], max(1, n // 20)),
                ("m2", pks, n // 2),
            )
        }
        index.take(1, postings, marked, (list(postings), list(marked)))
        if trial % 2:  # appended pages, with postings of the cached terms
            new = np.arange(pks[-1] + 1, pks[-1] + 41)
            state = IndexState("e", 2, "a", new, rng.choice([3, 8], 40), None, None)
            assert index.appends(state)
            grown = {term_key(t): (rng.permutation(new)[:15], np.ones(15)) for t in ("w0", "r1")}
            index.catch_up(state, grown, {"m1": (new[:2], np.ones(2))})
        for _ in range(4):
            terms = list(rng.choice(list(shares), int(rng.integers(1, 6))))
            marks = list(rng.choice(list(marked), int(rng.integers(0, 2))))
            top, k = int(rng.integers(1, 12)), int(rng.choice([0, 1, 10, 60]))
            excluded = rng.choice(len(index.pks), int(rng.integers(0, 3)), replace=False)
            tops = (top + len(excluded), k + 2 * top + len(excluded))
            full = index.evidence(terms, marks)
            cut = index.evidence(terms, marks, top=tops)
            assert _ranked(cut, excluded, k, top) == _ranked(full, excluded, k, top), trial
            exact = dict(zip(full.positions.tolist(), full.coarse.tolist(), strict=True))
            held = zip(cut.positions.tolist(), cut.coarse.tolist(), cut.marks, strict=True)
            # Exact, but bookmarked pages outside their head and below the bar: held at 0.
            assert all(c == exact[p] or (c == 0.0 and m > 0) for p, c, m in held)
            if not cut.complete:
                pruned[bool(marks)] += 1
                assert len(cut.positions) < len(full.positions)
    assert pruned[False] > 80 and pruned[True] > 10, pruned


def test_a_recall_with_common_words_returns_the_full_rankings_top_and_scores(
    store: Store, tenant: str, packed: None
) -> None:
    """Through the service: a history where every page shares a word with the question (so a
    recall scores the rare words' pages and bounds the common word's share) returns BM25's
    top k and scores, with and without excluded pages."""
    memory = _memory(store)
    who = Principal(tenant)
    rng = np.random.default_rng(2)
    rare = "kayak tax lake violin piano garden sofa tent pasta bike radio chess".split()
    history = []
    for i in range(120):
        words = ["the", "dog", "walked"] + list(rng.choice(rare, int(rng.integers(0, 3))))
        history.append(_session(f"s{i}", 1 + i % 28, [" ".join(words) + ".", "Ok."]))
    memory.ingest_sessions(who, "u", history)
    found: list[bool] = []
    evidence = StoredIndex.evidence

    def spy(self: StoredIndex, *args: object, **kwargs: object) -> object:
        result = evidence(self, *args, **kwargs)  # type: ignore[arg-type]
        found.append(result.complete)
        return result

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(StoredIndex, "evidence", spy)
        for question, skip in [("dog kayak", 0), ("the dog and the tax lake", 2)]:
            ids, scores = _scratch(store, tenant, "u", question)
            exclude = ids[:skip]  # the two best pages: the next ones come up
            hits = memory.recall(who, "u", question, top_k=4, exclude=exclude).hits
            assert [h.page.page.id for h in hits] == ids[skip : skip + 4], question
            assert [h.coarse_score for h in hits] == pytest.approx(scores[skip : skip + 4])
    assert found == [False, False]  # both were pruned


def test_merging_a_few_pages_into_a_sorted_set_equals_the_union() -> None:
    from memsifter.serving.stored_index import _merged

    rng = np.random.default_rng(3)
    for size, few in itertools.product((0, 1, 50), (0, 1, 7)):
        ascending = np.unique(rng.integers(0, 80, size))
        more = rng.permutation(np.unique(rng.integers(0, 80, few)))
        assert _merged(ascending, more).tolist() == np.union1d(ascending, more).tolist()
