"""Packed prefixes of users' BM25 indexes (``store.packs``): what ``index_state`` and
``read_terms`` return from a pack and the rows since equals every row read, through appends,
pages dated before the newest, deletes, replaces and SQLite's reused pks; a pack that cannot
say which rows are new (a page added since with a pk below its last) is not used; a reindex or
a deleted user takes the packs with it; a pack that fails to be written fails no read; and
migration 0006 goes down and up. Every test runs on SQLite, and on PostgreSQL when
``MEMSIFTER_TEST_PG_DSN`` names a server."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from datetime import datetime, timedelta

import numpy as np
import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError

from memsifter.coarse import build_filter
from memsifter.data.types import Session, Turn
from memsifter.serving.config import PagingSettings, ServeConfig
from memsifter.serving.memory import MemoryService
from memsifter.serving.ranking import ServiceRanker
from memsifter.serving.store import Principal, Store, packs, postings
from memsifter.serving.store.engine import read_columns
from memsifter.serving.store.schema import (
    MIGRATIONS,
    IndexTermRow,
    PagePackRow,
    PageRow,
    PostingPackRow,
)

WORDS = ["dog", "park", "tax", "kayak", "lake", "rain", "walk", "forms", "calm", "busy"]
TERMS = ["dog", "park", "tax", "kayak", "lake"]  # as the analyzer keeps them


@pytest.fixture()
def small_packs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Packs of a few rows, written by nearly every read: every path runs on a small user."""
    monkeypatch.setattr(packs, "PACK_MIN", 3)


class NoKeywords:
    name = "none"

    def extract(self, pages: list[Session]) -> list[list[tuple[str, float]]]:
        return [[] for _ in pages]


def _memory(store: Store) -> MemoryService:
    config = ServeConfig(db_url=store.url, paging=PagingSettings(turns_per_page=2))
    return MemoryService(config, store, ServiceRanker(build_filter("bm25")), NoKeywords())


def _session(sid: str, day: int, rng: random.Random) -> Session:
    lines = [" ".join(rng.choices(WORDS, k=rng.randint(2, 6))) for _ in range(rng.randint(1, 5))]
    turns = tuple(Turn("user" if i % 2 == 0 else "bot", t) for i, t in enumerate(lines))
    return Session(id=sid, turns=turns, date=datetime(2024, 1, 1) + timedelta(hours=day))


def _rows_state(store: Store, tenant: str, user: str) -> tuple[list[int], list[float]]:
    """Every page's pk and length in chronological order, read as rows (no pack)."""
    with store._read_row() as conn:
        pks, lengths = read_columns(
            conn, postings._ALL_LENGTHS, {"tenant": tenant, "user": user}, (np.int64, np.float64)
        )
    return pks.tolist(), lengths.tolist()


def _rows_terms(store: Store, tenant: str, user: str) -> dict[str, set[tuple[int, float]]]:
    """Each of ``TERMS``' postings, read as rows (no pack)."""
    out: dict[str, set[tuple[int, float]]] = {}
    with store._read_row() as conn:
        for term in TERMS:
            pk = conn.execute(
                select(IndexTermRow.pk).where(
                    IndexTermRow.tenant_id == tenant,
                    IndexTermRow.user_id == user,
                    IndexTermRow.term == term,
                )
            ).scalar()
            if pk is not None:
                pks, tfs = read_columns(
                    conn, postings._TERM_POSTINGS, {"term": pk}, (np.int64, np.float64)
                )
                out[term] = set(zip(pks.tolist(), tfs.tolist(), strict=True))
    return out


def _read_terms(store: Store, tenant: str, user: str) -> dict[str, set[tuple[int, float]]]:
    read = store.read_terms(tenant, user, TERMS)
    assert read is not None
    _, found, _ = read
    out = {}
    for term, (pks, tfs) in found.items():
        pairs = list(zip(pks.tolist(), tfs.tolist(), strict=True))
        assert len(pairs) == len(set(pairs)), term  # no posting twice
        out[term] = set(pairs)
    return out


def _pack_count(store: Store, model: type[PagePackRow] | type[PostingPackRow]) -> int:
    with store._read() as s:
        return int(s.scalar(select(func.count()).select_from(model)) or 0)


def test_a_pack_and_the_rows_since_equal_every_row_through_every_kind_of_write(
    store: Store, tenant: str, small_packs: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random writes (newer sessions, sessions dated before the newest, deletes, replaces, the
    newest session deleted and one added, whose pk SQLite gives again); after each, both
    reads equal the rows, and over the run packs were written, read with rows since, and
    refused (a removal since)."""
    rng = random.Random(7)
    memory, who = _memory(store), Principal(tenant)
    used = {"pages": 0, "tails": 0, "postings": 0}
    unpack = packs.unpack_postings

    def counted(row: object) -> tuple[np.ndarray, np.ndarray]:
        used["postings"] += 1
        return unpack(row)

    monkeypatch.setattr(packs, "unpack_postings", counted)
    live: list[str] = []
    day = 100
    for step in range(60):
        op = rng.choice(["new", "new", "new", "old", "delete", "replace", "newest"])
        if op in ("delete", "replace", "newest") and not live:
            op = "new"
        if op == "new":
            day += 1
            sid = f"s{step}"
            memory.ingest_sessions(who, "u", [_session(sid, day, rng)])
            live.append(sid)
        elif op == "old":
            sid = f"s{step}"
            memory.ingest_sessions(who, "u", [_session(sid, rng.randint(0, 99), rng)])
            live.append(sid)
        elif op == "delete":
            sid = live.pop(rng.randrange(len(live)))
            assert store.delete_session(tenant, "u", sid)
        elif op == "replace":
            sid = rng.choice(live)
            memory.ingest_sessions(who, "u", [_session(sid, day, rng)], replace=True)
        else:  # the newest page deleted, then a page added: SQLite reuses its pk
            store.delete_session(tenant, "u", live.pop())
            day += 1
            sid = f"s{step}"
            memory.ingest_sessions(who, "u", [_session(sid, day, rng)])
            live.append(sid)
        state = store.index_state(tenant, "u")
        assert state is not None
        assert (state.pks.tolist(), state.lengths.tolist()) == _rows_state(store, tenant, "u")
        used["pages"] += state.packed > 0
        used["tails"] += 0 < state.packed < len(state.pks)
        assert _read_terms(store, tenant, "u") == _rows_terms(store, tenant, "u"), step
    assert used["pages"] > 10 and used["tails"] > 5 and used["postings"] > 10, used


def test_a_posting_pack_is_not_used_when_a_page_added_since_has_a_lower_pk(
    store: Store, tenant: str, small_packs: None
) -> None:
    """Pages of one user take growing pks on both databases, but the pack does not rely on
    it: a pack (forged here) whose version is older than a page with a pk below its last one
    would miss that page's postings if read with the rows above its last pk; it is read as
    rows instead."""
    rng = random.Random(3)
    memory, who = _memory(store), Principal(tenant)
    for day in range(8):
        memory.ingest_sessions(who, "u", [_session(f"s{day}", day, rng)])
    expected = _rows_terms(store, tenant, "u")
    with store._read() as s:
        middle = s.execute(
            select(PageRow.pk, PageRow.added_version)
            .where(PageRow.tenant_id == tenant, PageRow.user_id == "u")
            .order_by(PageRow.pk)
        ).all()[4]
    dog = next(t for t in TERMS if any(pk == middle.pk for pk, _ in expected.get(t, ())))
    held = sorted((pk, tf) for pk, tf in expected[dog] if pk != middle.pk)
    assert held[-1][0] > middle.pk  # the forged pack's last pk is above the page it misses
    with store._write() as s:
        term_pk = s.scalar(
            select(IndexTermRow.pk).where(
                IndexTermRow.tenant_id == tenant,
                IndexTermRow.user_id == "u",
                IndexTermRow.term == dog,
            )
        )
        packs.write_postings(
            s,
            middle.added_version - 1,
            {term_pk: (np.array([p for p, _ in held]), np.array([t for _, t in held]))},
        )
    assert _read_terms(store, tenant, "u")[dog] == expected[dog]


def test_a_reindex_and_a_deleted_user_take_the_packs_with_them(
    store: Store, tenant: str, small_packs: None
) -> None:
    rng = random.Random(5)
    memory, who = _memory(store), Principal(tenant)
    before = (_pack_count(store, PagePackRow), _pack_count(store, PostingPackRow))
    memory.ingest_sessions(who, "u", [_session(f"s{d}", d, rng) for d in range(6)])
    assert store.index_state(tenant, "u") is not None
    _read_terms(store, tenant, "u")
    assert _pack_count(store, PagePackRow) == before[0] + 1
    assert _pack_count(store, PostingPackRow) > before[1]
    analyzer = memory.ranker.index_analyzer
    assert analyzer is not None
    pages = len(_rows_state(store, tenant, "u")[0])
    assert store.reindex_user(tenant, "u", analyzer, lambda text: {"word": 1}) == pages
    assert (_pack_count(store, PagePackRow), _pack_count(store, PostingPackRow)) == before
    # Lengths changed under the same analyzer: read as rows, packed again.
    state = store.index_state(tenant, "u")
    assert state is not None and state.packed == 0
    assert state.lengths.tolist() == _rows_state(store, tenant, "u")[1]
    _read_terms(store, tenant, "u")
    assert store.delete_user(tenant, "u")
    assert (_pack_count(store, PagePackRow), _pack_count(store, PostingPackRow)) == before


def test_a_pack_that_fails_to_be_written_fails_no_read(
    store: Store,
    tenant: str,
    small_packs: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    rng = random.Random(9)

    def locked(*args: object) -> None:
        raise OperationalError("INSERT", {}, Exception("database is locked"))

    monkeypatch.setattr(packs, "write_pages", locked)
    monkeypatch.setattr(packs, "write_postings", locked)
    before = (_pack_count(store, PagePackRow), _pack_count(store, PostingPackRow))
    with caplog.at_level(logging.WARNING, logger="memsifter.serving.store.postings"):
        sessions = [_session(f"s{d}", d, rng) for d in range(5)]
        _memory(store).ingest_sessions(Principal(tenant), "u", sessions)
        state = store.index_state(tenant, "u")
        terms = _read_terms(store, tenant, "u")
    assert state is not None and state.pks.tolist() == _rows_state(store, tenant, "u")[0]
    assert terms == _rows_terms(store, tenant, "u")
    assert caplog.text.count("an index pack was not written") >= 2
    assert (_pack_count(store, PagePackRow), _pack_count(store, PostingPackRow)) == before


def test_migration_0006_goes_down_and_up(serve_db: Callable[[str], str]) -> None:
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import inspect

    store = Store(serve_db("packs-migration"))
    store.migrate()
    tables = {"index_page_packs", "index_posting_packs"}
    try:
        assert tables <= set(inspect(store._writer).get_table_names())
        if store.dialect == "postgresql":
            with store._writer.connect() as conn:
                storage = conn.exec_driver_sql(
                    "SELECT attname, attstorage FROM pg_attribute WHERE attrelid IN"
                    " ('index_page_packs'::regclass, 'index_posting_packs'::regclass)"
                    " AND attname IN ('pks', 'lengths', 'tfs')"
                ).all()
            assert {s for _, s in storage} == {"e"}, storage  # EXTERNAL: not compressed
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        with store._writer.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0005")
        assert not tables & set(inspect(store._writer).get_table_names())
        store.migrate()
        assert tables <= set(inspect(store._writer).get_table_names())
    finally:
        store.close()


def test_a_users_pages_added_at_one_version_each_keep_the_pack_used(
    store: Store, tenant: str, small_packs: None
) -> None:
    """After a pack, a newer session's pages are read as the rows since; a removal after the
    pack's version refuses it."""
    rng = random.Random(11)
    memory, who = _memory(store), Principal(tenant)
    memory.ingest_sessions(who, "u", [_session(f"s{d}", d, rng) for d in range(4)])
    first = store.index_state(tenant, "u")
    # The ingesting replica opened the user (read as rows, then packed).
    assert first is not None and first.packed == len(first.pks)
    memory.ingest_sessions(who, "u", [_session("s9", 9, rng)])
    second = store.index_state(tenant, "u")
    assert second is not None and second.packed == len(first.pks) < len(second.pks)
    store.delete_session(tenant, "u", "s0")
    third = store.index_state(tenant, "u")
    assert third is not None and third.packed == 0


@pytest.mark.parametrize(
    "ids",
    [
        [5],
        [3, 1, 2],  # chronological pks need not ascend: negative steps
        [0, 2**62],  # a step too wide for int32
        list(range(100, 100_000, 7)),
        [],
    ],
)
def test_pks_and_counts_pack_in_the_narrowest_type_and_come_back_exactly(ids: list[int]) -> None:
    values = np.asarray(ids, dtype=np.int64)
    for extra in (0, 2):
        back = packs.decode_ids(packs.encode_ids(values), extra)
        assert back.dtype == np.int64 and back[: len(values)].tolist() == ids
        assert len(back) == len(values) + extra
    counts = np.abs(values) % 70_000
    assert packs.decode_counts(packs.encode_counts(counts)).tolist() == counts.tolist()
    if len(values) > 100:  # close pks: one byte a step, not eight
        assert len(packs.encode_ids(values)) < len(values) + 16
