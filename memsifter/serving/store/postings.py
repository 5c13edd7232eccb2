"""Each user's BM25 index, held by the database beside the pages it indexes.

A page's postings (its analysed terms and their counts) and its BM25 length are written in the
transaction that writes the page (``write_postings``, called by ``put_sessions``), and go with
it (foreign-key cascades; ``delete_user`` deletes them explicitly). So a replica never rebuilds
an index from the pages' text: it opens a user by reading the pages' pks and lengths
(``index_state``) and reads a query term's postings when a query first needs them
(``read_terms``). Replicas stay consistent as before: the user's version, in the same rows,
says what a replica's cached postings may serve.

The terms are the service's analyzer's (``memsifter.text.Analyzer``), named by its
``identity`` in ``users.index_analyzer``. A user whose postings some other analyzer wrote, or
whose pages predate postings, has ``index_analyzer`` NULL or different; ``reindex_user``
writes them again from the pages.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import bindparam, delete, func, insert, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from memsifter.serving.store import packs
from memsifter.serving.store.engine import USER_KEY, Database, read_columns
from memsifter.serving.store.records import IndexState, PageRecord, TermArrays
from memsifter.serving.store.schema import (
    BookmarkRow,
    IndexTermRow,
    PageRow,
    PostingRow,
    UserRow,
)

logger = logging.getLogger(__name__)
MAX_TERM = 100  # the column's width
_CHUNK = 500  # bound parameters per IN list (SQLite allows 32,766; PostgreSQL 65,535)


def term_key(term: str) -> str:
    """``term`` as ``index_terms.term`` holds it: itself, or for a term too long for the column
    (a URL, a base64 blob) a prefix and a hash of the whole, so two long terms never merge."""
    if len(term) <= MAX_TERM:
        return term
    digest = hashlib.blake2b(term.encode("utf-8"), digest_size=8).hexdigest()
    return f"{term[: MAX_TERM - 17]}#{digest}"


def chunks(items: Sequence[Any], size: int = _CHUNK) -> Iterable[Sequence[Any]]:
    """``items`` in slices short enough for one IN list."""
    for i in range(0, len(items), size):
        yield items[i : i + size]


_OF_USER = (PageRow.tenant_id == bindparam("tenant"), PageRow.user_id == bindparam("user"))
_STATE = select(
    UserRow.epoch, UserRow.version, UserRow.index_analyzer, UserRow.pages_removed
).where(*USER_KEY)
# Pages in the order the service ranks ties in: undated last, then by date, session and turn;
# ix_pages_user_chronological holds them so (with their lengths), so a replica opening a user
# walks one index: no join, no sort.
_CHRONOLOGICAL = (PageRow.undated, PageRow.date, PageRow.session_pk, PageRow.turn_start)
_LENGTHS = select(PageRow.pk, func.coalesce(PageRow.n_terms, 0)).where(*_OF_USER)
_ALL_LENGTHS = _LENGTHS.order_by(*_CHRONOLOGICAL)
_NEW_LENGTHS = _LENGTHS.where(PageRow.added_version > bindparam("since")).order_by(*_CHRONOLOGICAL)
_ORDER_KEYS = select(PageRow.pk, PageRow.date, PageRow.session_pk, PageRow.turn_start).where(
    PageRow.pk.in_(bindparam("pks", expanding=True))
)
# A term's postings by its pk: one clustered range on SQLite (the table has no rowid). Read a
# term at a time, so no rows are grouped in Python (that cost more than the reads).
_TERM_POSTINGS = select(PostingRow.page_pk, PostingRow.tf).where(
    PostingRow.term_pk == bindparam("term")
)
_TERM_POSTINGS_AFTER = _TERM_POSTINGS.where(PostingRow.page_pk > bindparam("after"))
_VERSION = select(UserRow.version, UserRow.pages_removed).where(*USER_KEY)
_TERM_MARKS = select(BookmarkRow.page_pk, BookmarkRow.weight).where(
    BookmarkRow.tenant_id == bindparam("tenant"),
    BookmarkRow.user_id == bindparam("user"),
    BookmarkRow.term == bindparam("term"),
)
_PAGE_POSTINGS = (
    select(IndexTermRow.term, PostingRow.page_pk, PostingRow.tf)
    .join(IndexTermRow, IndexTermRow.pk == PostingRow.term_pk)
    .where(PostingRow.page_pk.in_(bindparam("pks", expanding=True)))
)
_PAGE_MARKS = select(BookmarkRow.term, BookmarkRow.page_pk, BookmarkRow.weight).where(
    BookmarkRow.page_pk.in_(bindparam("pks", expanding=True))
)
_KNOWN_TERMS = select(IndexTermRow.term, IndexTermRow.pk).where(
    IndexTermRow.tenant_id == bindparam("tenant"),
    IndexTermRow.user_id == bindparam("user"),
    IndexTermRow.term.in_(bindparam("terms", expanding=True)),
)
# Core inserts on the tables: through the ORM's bulk path a posting row cost several times more.
_TERMS = IndexTermRow.__table__
_INSERT_TERMS = insert(_TERMS).returning(_TERMS.c.pk, sort_by_parameter_order=True)
_INSERT_POSTINGS = insert(PostingRow.__table__)

_PAGE_COLUMNS = (np.int64, np.float64)  # pk, BM25 length
_ROW_COLUMNS = (np.int64, np.float64)  # page pk, tf or bookmark weight


def _order(row: Any) -> tuple[bool, datetime, int, int]:
    return (row.date is None, row.date or datetime.min, row.session_pk, row.turn_start)


def grouped(rows: Iterable[tuple[str, int, float]]) -> TermArrays:
    """Rows of (term, page pk, value) as ``TermArrays``: each term's page pks and values."""
    by_term: dict[str, tuple[list[int], list[float]]] = {}
    for term, pk, value in rows:
        pks, values = by_term.setdefault(term, ([], []))
        pks.append(pk)
        values.append(value)
    return {
        term: (np.asarray(pks, dtype=np.int64), np.asarray(values, dtype=np.float64))
        for term, (pks, values) in by_term.items()
    }


def page_length(page: PageRecord) -> int | None:
    """The page's BM25 length (``pages.n_terms``): its terms, repeats included."""
    return sum(n for _, n in page.terms) if page.terms is not None else None


def write_postings(
    s: Session,
    tenant: str,
    user: str,
    pages: Sequence[tuple[int, PageRecord]],
    analyzer: str | None,
    current: str | None,
) -> tuple[str | None, TermArrays]:
    """Index ``pages`` (their pks, just inserted with their ``page_length``, and records) in
    the caller's transaction, and keep ``users.index_analyzer`` (``current`` before this
    write) true: ``analyzer`` while every page's postings are its, else NULL. The caller holds
    the user's row lock. The marker after the write, and the postings written by term."""
    who = {"tenant": tenant, "user": user}
    indexed = analyzer is not None and all(p.terms is not None for _, p in pages)
    marker = analyzer if indexed else None
    if indexed and current != analyzer:
        # Valid only if these are the user's only pages (a new user, or all replaced).
        new_pks = [pk for pk, _ in pages]
        others = s.execute(
            select(PageRow.pk).where(*_OF_USER, PageRow.pk.not_in(new_pks)).limit(1), who
        ).first()
        marker = analyzer if others is None else None
    if marker != current:
        s.execute(update(UserRow).where(*USER_KEY).values(index_analyzer=marker), who)
    if not indexed:
        return marker, {}
    counts = [(pk, {term_key(t): n for t, n in p.terms or ()}) for pk, p in pages]
    insert_postings(s, tenant, user, counts, {}, lengths=False)  # put_sessions wrote them
    return marker, grouped((t, pk, n) for pk, terms in counts for t, n in terms.items())


def clear_postings(s: Session, tenant: str, user: str) -> None:
    """Delete the user's postings, terms and packs (the caller holds the user's row lock)."""
    packs.clear(s, tenant, user)
    page_pks = select(PageRow.pk).where(PageRow.tenant_id == tenant, PageRow.user_id == user)
    s.execute(delete(PostingRow).where(PostingRow.page_pk.in_(page_pks)))
    s.execute(
        delete(IndexTermRow).where(IndexTermRow.tenant_id == tenant, IndexTermRow.user_id == user)
    )


_SET_LENGTH = (
    update(PageRow.__table__)
    .where(PageRow.pk == bindparam("b_pk"))
    .values(n_terms=bindparam("b_terms"))
)


def insert_postings(
    s: Session,
    tenant: str,
    user: str,
    counts: Sequence[tuple[int, Mapping[str, int]]],
    term_pks: dict[str, int],
    *,
    lengths: bool = True,
) -> None:
    """Postings rows (and with ``lengths`` the pages' BM25 lengths) for ``counts`` (page pk,
    its ``term_key`` -> count), creating the user's terms they need; ``term_pks`` caches term
    -> pk across calls (a reindex makes many)."""
    if not counts:
        return
    if lengths:
        s.execute(_SET_LENGTH, [{"b_pk": pk, "b_terms": sum(c.values())} for pk, c in counts])
    wanted = list(dict.fromkeys(t for _, c in counts for t in c if t not in term_pks))
    for chunk in chunks(wanted):
        rows = s.execute(_KNOWN_TERMS, {"tenant": tenant, "user": user, "terms": chunk})
        term_pks.update((term, pk) for term, pk in rows)
    new = [t for t in wanted if t not in term_pks]
    if new:
        rows = [{"tenant_id": tenant, "user_id": user, "term": t} for t in new]
        term_pks.update(zip(new, s.scalars(_INSERT_TERMS, rows).all(), strict=True))
    postings = [
        {"term_pk": term_pks[t], "page_pk": pk, "tf": n} for pk, c in counts for t, n in c.items()
    ]
    if postings:
        s.execute(_INSERT_POSTINGS, postings)


class IndexRepository(Database):
    """Reads of users' BM25 indexes, and writing one again from the pages."""

    def index_state(self, tenant: str, user: str, *, since: int | None = None) -> IndexState | None:
        """The user's index: every page (``since=None``), or the pages added after version
        ``since`` (``complete`` False when a write since then removed pages). None for an
        unknown user. Every page is read from the user's pack and the pages added since
        (``store.packs``) when a pack holds a prefix of them; a read whose pages outside a
        pack are ``packs.due`` writes a new one."""
        who = {"tenant": tenant, "user": user}
        with self._read_row() as conn:
            state = conn.execute(_STATE, who).first()
            if state is None:
                return None
            removed = state.pages_removed
            if since is None:
                found = self._packed_pages(conn, who, state)
                if found is None:
                    found = (*read_columns(conn, _ALL_LENGTHS, who, _PAGE_COLUMNS), 0)
            else:
                found = (
                    *read_columns(conn, _NEW_LENGTHS, {**who, "since": since}, _PAGE_COLUMNS),
                    0,
                )
            pks, lengths, packed = found
            ends = self._order_keys(conn, [pks[0], pks[-1]] if len(pks) else [])
        index = IndexState(
            epoch=state.epoch or "",
            version=int(state.version),
            analyzer=state.index_analyzer,
            pks=pks,
            lengths=lengths,
            first_order=ends.get(int(pks[0])) if len(pks) else None,
            last_order=ends.get(int(pks[-1])) if len(pks) else None,
            complete=since is None or removed is None or removed <= since,
            packed=packed,
        )
        if since is None and packs.due(len(pks) - packed, packed):
            self._write_packs(lambda s: packs.write_pages(s, tenant, user, index))
        return index

    @staticmethod
    def _order_keys(conn: Any, pks: Sequence[Any]) -> dict[int, tuple[bool, datetime, int, int]]:
        if not len(pks):
            return {}
        rows = conn.execute(_ORDER_KEYS, {"pks": [int(pk) for pk in pks]})
        return {row.pk: _order(row) for row in rows}

    def _packed_pages(
        self, conn: Any, who: Mapping[str, str], state: Any
    ) -> tuple[np.ndarray, np.ndarray, int] | None:
        """Every page of the user as the user's pack and the pages added since (pks, lengths,
        the pages from the pack), when the pack holds a prefix: a usable pack of the same
        incarnation and analyzer, with the pages since all after its newest (a page dated
        before it makes the order a merge: the caller reads every page instead)."""
        pack = conn.execute(packs.PAGE_PACK, who).first()
        if (
            pack is None
            or pack.epoch != state.epoch
            or pack.analyzer != state.index_analyzer
            or not packs.usable(pack.version, state.version, state.pages_removed)
        ):
            return None
        new_pks, new_lengths = read_columns(
            conn, _NEW_LENGTHS, {**who, "since": pack.version}, _PAGE_COLUMNS
        )
        pks, lengths = packs.unpack_pages(pack, new_pks, new_lengths)
        packed = len(pks) - len(new_pks)
        if len(new_pks):
            if not packed:
                return None
            ends = self._order_keys(conn, [pks[packed - 1], new_pks[0]])
            if ends[int(new_pks[0])] <= ends[int(pks[packed - 1])]:
                return None
        return pks, lengths, packed

    def _write_packs(self, write: Callable[[Session], None]) -> None:
        """Write packs after a read: a pack failing to be written (a concurrent delete of the
        user, a busy database) costs later reads time, never an answer, so it is logged and
        the read goes on."""
        try:
            with self._write() as s:
                write(s)
        except SQLAlchemyError as e:
            logger.warning("an index pack was not written: %s", e)

    def read_terms(
        self, tenant: str, user: str, terms: Sequence[str], mark_terms: Sequence[str] = ()
    ) -> tuple[int, TermArrays, TermArrays] | None:
        """The postings of ``terms`` (``term_key``s) and the bookmark rows of ``mark_terms``
        over the user's pages, and the user's version they were read at, in one transaction.
        None for an unknown user. A term's postings are read from its pack and the rows since
        (``store.packs``) when the pack holds a prefix; terms whose rows outside a pack are
        ``packs.due`` are packed again after the read."""
        who = {"tenant": tenant, "user": user}
        repack: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        with self._read_row() as conn:
            state = conn.execute(_VERSION, who).first()
            if state is None:
                return None
            version = int(state.version)
            term_pks: dict[str, int] = {}
            for chunk in chunks(list(terms)):
                term_pks.update(conn.execute(_KNOWN_TERMS, {**who, "terms": chunk}).all())
            postings: TermArrays = {}
            first_new: dict[int, int | None] = {}  # version -> least pk of the pages since
            for term, pk in term_pks.items():
                rows, packed = self._packed_postings(conn, who, pk, state, first_new)
                postings[term] = rows
                if packs.due(len(rows[0]) - packed, packed):
                    repack[pk] = rows
            marks = {
                term: read_columns(conn, _TERM_MARKS, {**who, "term": term}, _ROW_COLUMNS)
                for term in mark_terms
            }
        if repack:
            self._write_packs(lambda s: packs.write_postings(s, version, repack))
        return version, postings, {t: rows for t, rows in marks.items() if len(rows[0])}

    @staticmethod
    def _packed_postings(
        conn: Any, who: Mapping[str, str], term: int, state: Any, first_new: dict[int, int | None]
    ) -> tuple[tuple[np.ndarray, np.ndarray], int]:
        """Term ``term``'s postings (page pks, tf) and how many came from its pack: the pack
        and the postings above its last pk when it holds a prefix (``usable``, and every page
        added since has a pk above its last: ``first_new`` caches that least pk by version),
        else every posting read as rows."""
        pack = conn.execute(packs.POSTING_PACK, {"term": term}).first()
        if pack is not None and packs.usable(pack.version, state.version, state.pages_removed):
            pks, tfs = packs.unpack_postings(pack)
            if pack.version not in first_new:
                first_new[pack.version] = packs.first_new_pk(conn, who, pack.version)
            first = first_new[pack.version]
            if len(pks) and (first is None or first > pks[-1]):
                after = {"term": term, "after": int(pks[-1])}
                new_pks, new_tfs = read_columns(conn, _TERM_POSTINGS_AFTER, after, _ROW_COLUMNS)
                if len(new_pks):
                    pks, tfs = np.concatenate([pks, new_pks]), np.concatenate([tfs, new_tfs])
                return (pks, tfs), len(pks) - len(new_pks)
        return read_columns(conn, _TERM_POSTINGS, {"term": term}, _ROW_COLUMNS), 0

    def page_terms(self, pks: Sequence[int]) -> tuple[TermArrays, TermArrays]:
        """The postings and bookmark rows of pages ``pks``: what a replica's cached terms take
        in when it catches up with new pages."""
        postings: list[Any] = []
        marks: list[Any] = []
        with self._read_row() as conn:
            for chunk in chunks(list(pks)):
                postings += conn.execute(_PAGE_POSTINGS, {"pks": chunk}).all()
                marks += conn.execute(_PAGE_MARKS, {"pks": chunk}).all()
        return grouped(postings), grouped(marks)
