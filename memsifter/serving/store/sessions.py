"""Users' sessions, their pages and keyword bookmarks, and the user's version that every
replica's in-memory index keys on.

They are one repository because they change together: every write of a user's pages bumps the
user's version (and a user created again gets a new epoch), which is how a replica learns that
its index is stale and ``load_pages`` tells it what to catch up on. Deleting a user (the right
to be forgotten) lives here too, as the user row is what the version is kept on.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import bindparam, delete, func, insert, select, update
from sqlalchemy.engine import Connection, Row
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from memsifter.data.types import Session as ChatSession
from memsifter.data.types import Turn
from memsifter.serving.errors import ConflictError, ServeError
from memsifter.serving.store.engine import (
    USER_KEY,
    Database,
    integrity_error,
    retried_write,
    rowcount,
)
from memsifter.serving.store.postings import (
    chunks,
    clear_postings,
    grouped,
    insert_postings,
    page_length,
    term_key,
    write_postings,
)
from memsifter.serving.store.records import (
    IndexedPage,
    IndexState,
    PageDelta,
    PageRecord,
    PagesWritten,
    SessionInfo,
    SessionRecord,
    StoredPage,
    StoredSession,
    TermArrays,
    UserState,
    to_naive_utc,
    utcnow,
)
from memsifter.serving.store.schema import (
    BookmarkRow,
    FactRow,
    PageRow,
    PagingEventRow,
    ResidentPageRow,
    SessionRow,
    UserRow,
    turn_from_json,
    turn_to_json,
)

# Every recall's version check, built once: building a select costs more than running it.
_USER_STATE = select(UserRow.epoch, UserRow.version).where(*USER_KEY)


_OF_USER = (PageRow.tenant_id == bindparam("tenant"), PageRow.user_id == bindparam("user"))
# A page joined with its session, with the column names ``_session`` and ``_page`` read.
_PAGE_ROWS = select(
    SessionRow.pk.label("session_pk"),
    SessionRow.session_id,
    SessionRow.date,
    SessionRow.date_text,
    SessionRow.turns,
    PageRow.pk.label("page_pk"),
    PageRow.page_id,
    PageRow.turn_start,
    PageRow.turn_end,
    PageRow.n_tokens,
    PageRow.tenant_id,
    PageRow.user_id,
).join(PageRow, PageRow.session_pk == SessionRow.pk)
_USER_PAGES = _PAGE_ROWS.where(*_OF_USER)
_USER_PAGES_SINCE = _USER_PAGES.where(func.coalesce(PageRow.added_version, 0) > bindparam("since"))
# By pk alone, the owner checked on the rows: with the user in the WHERE clause too, SQLite
# planned a scan of every page of the user's (ix_pages_user_added) for five pks (4 ms at 10K).
_PAGES_BY_PK = _PAGE_ROWS.where(PageRow.pk.in_(bindparam("pks", expanding=True)))
_PAGES_BY_ID = _USER_PAGES.where(PageRow.page_id.in_(bindparam("ids", expanding=True)))
_USER_PAGE_COUNT = select(func.count()).select_from(PageRow).where(*_OF_USER)
_USER_PAGE_PKS = select(PageRow.pk).where(*_OF_USER)
_PAGE_BOOKMARKS = select(
    BookmarkRow.page_pk, BookmarkRow.keyword, BookmarkRow.term, BookmarkRow.weight
).where(BookmarkRow.page_pk.in_(bindparam("pks", expanding=True)))
_BUMP_USER = (
    update(UserRow.__table__)
    .where(*USER_KEY)
    .values(version=UserRow.version + 1)
    .returning(UserRow.version, UserRow.epoch, UserRow.index_analyzer)
)
# A write that removes pages also records its version, so a replica learns "some page is gone"
# from the user's row instead of counting every page.
_BUMP_USER_REMOVING = (
    update(UserRow.__table__)
    .where(*USER_KEY)
    .values(version=UserRow.version + 1, pages_removed=UserRow.version + 1)
    .returning(UserRow.version, UserRow.epoch, UserRow.index_analyzer)
)
_MARK_REMOVED = (
    update(UserRow.__table__).where(*USER_KEY).values(pages_removed=bindparam("b_version"))
)
# Core inserts on the tables: through the ORM's bulk path each cost more than its round trip.
_SESSIONS, _PAGES = SessionRow.__table__, PageRow.__table__
_INSERT_SESSIONS = insert(_SESSIONS).returning(_SESSIONS.c.pk, sort_by_parameter_order=True)
_INSERT_PAGES = insert(_PAGES).returning(_PAGES.c.pk, sort_by_parameter_order=True)
_INSERT_BOOKMARKS = insert(BookmarkRow.__table__)
_EXISTING_SESSIONS = select(SessionRow.session_id).where(
    SessionRow.tenant_id == bindparam("tenant"),
    SessionRow.user_id == bindparam("user"),
    SessionRow.session_id.in_(bindparam("ids", expanding=True)),
)


def _session_conflict(e: IntegrityError, ids: Sequence[str]) -> ServeError | None:
    """The client error a failed insert of sessions ``ids`` stands for (None: a bug), naming
    the session when it can: one the request itself repeats (the routes refuse those earlier)."""
    mapped = integrity_error(e)
    if not isinstance(mapped, ConflictError):
        return mapped
    seen: set[str] = set()
    for i, sid in enumerate(ids):
        if sid in seen:
            return _already_exists(ids, i)
        seen.add(sid)
    return mapped


def _already_exists(ids: Sequence[str], i: int) -> ConflictError:
    return ConflictError(
        f"session {ids[i]!r} already exists; send replace=true to overwrite it",
        field=f"sessions[{i}].id",
    )


def _written(
    user_row: Row[Any],
    removed: bool,
    pages: Sequence[tuple[int, tuple[int, datetime | None, PageRecord]]],
    marks: Sequence[Mapping[str, Any]],
    analyzer: str | None,
    postings: TermArrays,
) -> PagesWritten:
    """``put_sessions``' pages (pk, (session pk, date, record)) as ``index_state`` since the
    version before would read them: chronological, lengths as ``coalesce(n_terms, 0)``."""
    keyed = sorted(
        ((date is None, date or datetime.min, session_pk, p.turn_start), pk, p)
        for pk, (session_pk, date, p) in pages
    )
    state = IndexState(
        epoch=user_row.epoch or "",
        version=int(user_row.version),
        analyzer=analyzer,
        pks=np.array([pk for _, pk, _ in keyed], dtype=np.int64),
        lengths=np.array([page_length(p) or 0 for _, _, p in keyed], dtype=np.float64),
        first_order=keyed[0][0] if keyed else None,
        last_order=keyed[-1][0] if keyed else None,
        complete=not removed,
    )
    marked = grouped((row["term"], row["page_pk"], row["weight"]) for row in marks)
    return PagesWritten(state, postings, marked)


class SessionRepository(Database):
    """Sessions, pages and bookmarks; users and their versions."""

    @staticmethod
    def _bump(s: Session, tenant: str, user: str, *, removing: bool = False) -> Row[Any]:
        """The user's row at their next version (``version``, ``epoch``, ``index_analyzer``);
        the row stays locked (or the SQLite writer held) until the transaction ends, so no
        other writer can take the same version."""
        bump = _BUMP_USER_REMOVING if removing else _BUMP_USER
        return s.execute(bump, {"tenant": tenant, "user": user}).one()

    @retried_write
    def put_sessions(
        self,
        tenant: str,
        user: str,
        records: Sequence[SessionRecord],
        *,
        replace: bool = False,
        analyzer: str | None = None,
    ) -> PagesWritten:
        """Store sessions with their pages, bookmarks and postings (the pages' ``terms``, as the
        analyzer named ``analyzer`` read them) in one transaction, and say what was written. An
        existing id is a ``ConflictError`` naming it unless ``replace``, which swaps the old
        session out."""
        who = {"tenant": tenant, "user": user}
        with self._write() as s:
            # The bump locks an existing user's row (nearly every write): no separate lock.
            user_row = s.execute(_BUMP_USER, who).first()
            if user_row is None:
                self._lock_user(s, tenant, user, create=True)
                user_row = self._bump(s, tenant, user)
            version = int(user_row.version)
            ids = [r.session.id for r in records]
            existing = set(s.scalars(_EXISTING_SESSIONS, {**who, "ids": ids}))
            if existing and not replace:
                raise _already_exists(ids, next(i for i, sid in enumerate(ids) if sid in existing))
            if existing:
                s.execute(
                    delete(SessionRow).where(
                        SessionRow.tenant_id == tenant,
                        SessionRow.user_id == user,
                        SessionRow.session_id.in_(existing),
                    )
                )
                s.execute(_MARK_REMOVED, {**who, "b_version": version})
            now = utcnow()
            # Core bulk inserts (one statement per table, pks back in order): an ORM flush per
            # row cost more than the rest of the write.
            try:
                session_pks = s.scalars(
                    _INSERT_SESSIONS,
                    [
                        {
                            "tenant_id": tenant,
                            "user_id": user,
                            "session_id": r.session.id,
                            "date": to_naive_utc(r.session.date),
                            "date_text": r.session.date_text,
                            "turns": [turn_to_json(t) for t in r.session.turns],
                            "n_turns": len(r.session.turns),
                            "n_tokens": r.n_tokens,
                            "created_at": now,
                        }
                        for r in records
                    ],
                ).all()
            except IntegrityError as e:  # see integrity_error: the net under the lock
                conflict = _session_conflict(e, ids)
                if conflict is None:
                    raise
                raise conflict from e
            pages = [
                (pk, to_naive_utc(r.session.date), p)
                for pk, r in zip(session_pks, records, strict=True)
                for p in r.pages
            ]
            if not pages:
                return _written(user_row, bool(existing), [], [], user_row.index_analyzer, {})
            page_pks = s.scalars(
                _INSERT_PAGES,
                [
                    {
                        "session_pk": session_pk,
                        "tenant_id": tenant,
                        "user_id": user,
                        "page_id": p.page_id,
                        "turn_start": p.turn_start,
                        "turn_end": p.turn_end,
                        "n_tokens": p.n_tokens,
                        "added_version": version,
                        "n_terms": page_length(p) if analyzer is not None else None,
                        "undated": date is None,
                        "date": date,
                    }
                    for session_pk, date, p in pages
                ],
            ).all()
            marks = [
                {
                    "page_pk": page_pk,
                    "tenant_id": tenant,
                    "user_id": user,
                    "keyword": b.keyword[:200],
                    "term": term[:100],
                    "weight": b.weight,
                }
                for page_pk, (_, _, p) in zip(page_pks, pages, strict=True)
                for b in p.bookmarks
                for term in b.terms
            ]
            if marks:
                s.execute(_INSERT_BOOKMARKS, marks)
            written = list(zip(page_pks, pages, strict=True))
            marker, postings = write_postings(
                s,
                tenant,
                user,
                [(pk, p) for pk, (_, _, p) in written],
                analyzer,
                user_row.index_analyzer,
            )
            return _written(user_row, bool(existing), written, marks, marker, postings)

    def list_sessions(
        self, tenant: str, user: str, *, limit: int = 100, offset: int = 0
    ) -> tuple[list[SessionInfo], int]:
        with self._read() as s:
            where = (SessionRow.tenant_id == tenant, SessionRow.user_id == user)
            total = s.scalar(select(func.count()).select_from(SessionRow).where(*where)) or 0
            n_pages = (
                select(func.count())
                .select_from(PageRow)
                .where(PageRow.session_pk == SessionRow.pk)
                .scalar_subquery()
            )
            rows = s.execute(
                select(SessionRow, n_pages)
                .where(*where)
                .order_by(SessionRow.date.is_(None), SessionRow.date, SessionRow.pk)
                .limit(limit)
                .offset(offset)
            ).all()
            return [_info(row, n) for row, n in rows], int(total)

    def get_session(self, tenant: str, user: str, session_id: str) -> StoredSession | None:
        with self._read() as s:
            row = s.scalar(
                select(SessionRow).where(
                    SessionRow.tenant_id == tenant,
                    SessionRow.user_id == user,
                    SessionRow.session_id == session_id,
                )
            )
            if row is None:
                return None
            pages = s.scalars(
                select(PageRow).where(PageRow.session_pk == row.pk).order_by(PageRow.turn_start)
            ).all()
            keywords = self._keywords(s, [p.pk for p in pages])
            session = _session(row)
            stored = tuple(_page(session, p, keywords.get(p.pk, ())) for p in pages)
            return StoredSession(_info(row, len(pages)), session, stored)

    @retried_write
    def delete_session(self, tenant: str, user: str, session_id: str) -> bool:
        with self._write() as s:
            if not self._lock_user(s, tenant, user, create=False):
                return False
            result = s.execute(
                delete(SessionRow).where(
                    SessionRow.tenant_id == tenant,
                    SessionRow.user_id == user,
                    SessionRow.session_id == session_id,
                )
            )
            if not rowcount(result):
                return False
            self._bump(s, tenant, user, removing=True)
            return True

    @retried_write
    def delete_user(self, tenant: str, user: str) -> bool:
        """Everything about a user, facts and paging history included (right to be forgotten).

        Child rows are deleted explicitly rather than through cascades alone: SQLite enforces
        foreign keys only when the pragma is on, and a database someone opened without it must
        not keep orphans."""
        with self._write() as s:
            if not self._lock_user(s, tenant, user, create=False):
                return False
            clear_postings(s, tenant, user)
            for model in (ResidentPageRow, BookmarkRow, PageRow, SessionRow, FactRow):
                s.execute(delete(model).where(model.tenant_id == tenant, model.user_id == user))
            s.execute(
                delete(PagingEventRow).where(
                    PagingEventRow.tenant_id == tenant, PagingEventRow.user_id == user
                )
            )
            result = s.execute(
                delete(UserRow).where(UserRow.tenant_id == tenant, UserRow.user_id == user)
            )
            return bool(rowcount(result))

    def user_version(self, tenant: str, user: str) -> int | None:
        with self._read() as s:
            return s.scalar(
                select(UserRow.version).where(UserRow.tenant_id == tenant, UserRow.user_id == user)
            )

    def user_state(self, tenant: str, user: str) -> UserState | None:
        with self._read_row() as conn:  # every recall checks the version: as authenticate
            row = conn.execute(_USER_STATE, {"tenant": tenant, "user": user}).first()
        return UserState(row.epoch or "", int(row.version)) if row is not None else None

    def load_pages(
        self,
        tenant: str,
        user: str,
        *,
        since: int | None = None,
        known: Collection[int] = (),
    ) -> PageDelta | None:
        """What a replica's index needs to catch up, read in one transaction. ``since=None``:
        every page. Otherwise the pages added after version ``since``, and, only when the
        user's page count shows that some of ``known`` (the pks the replica holds) are gone,
        the pks of every page the user has now. None for an unknown user."""
        who = {"tenant": tenant, "user": user}
        # Core statements built once, rows read as plain tuples: an ingest catches its replica
        # up through here, and loading ORM objects cost more than the queries.
        with self._read_row() as conn:
            state = conn.execute(_USER_STATE, who).first()
            if state is None:
                return None
            if since is None:
                rows = conn.execute(_USER_PAGES, who).all()
            else:
                rows = conn.execute(_USER_PAGES_SINCE, {**who, "since": since}).all()
            live: frozenset[int] | None = None
            if since is not None:
                count = conn.execute(_USER_PAGE_COUNT, who).scalar() or 0
                if count != len(set(known) | {row.page_pk for row in rows}):
                    live = frozenset(conn.execute(_USER_PAGE_PKS, who).scalars())
            pages = _indexed_pages(conn, rows)
        return PageDelta(UserState(state.epoch or "", int(state.version)), pages, live=live)

    def indexed_pages(
        self, tenant: str, user: str, *, pks: Sequence[int] = (), page_ids: Sequence[str] = ()
    ) -> list[IndexedPage]:
        """The user's pages with these ``pks`` or ``page_ids`` (those that exist)."""
        who = {"tenant": tenant, "user": user}
        rows: list[Row[Any]] = []
        with self._read_row() as conn:
            for chunk in chunks(list(pks)):
                rows += [
                    row
                    for row in conn.execute(_PAGES_BY_PK, {"pks": chunk})
                    if row.tenant_id == tenant and row.user_id == user
                ]
            for chunk in chunks(list(page_ids)):
                rows += conn.execute(_PAGES_BY_ID, {**who, "ids": chunk}).all()
            return _indexed_pages(conn, rows)

    @retried_write
    def reindex_user(
        self,
        tenant: str,
        user: str,
        analyzer: str,
        terms_of: Callable[[str], Mapping[str, int]],
        *,
        batch: int = 2000,
    ) -> int | None:
        """Write the user's postings again from their pages' text with ``terms_of`` (the
        analyzer named ``analyzer``), in one transaction: for pages stored before postings
        existed, or by another analyzer. The pages indexed; None for an unknown user."""
        with self._write() as s:
            if not self._lock_user(s, tenant, user, create=False):
                return None
            clear_postings(s, tenant, user)
            who = {"tenant": tenant, "user": user}
            pks = list(s.execute(_USER_PAGE_PKS, who).scalars())
            term_pks: dict[str, int] = {}
            conn = s.connection()
            for i in range(0, len(pks), batch):
                rows = conn.execute(_PAGES_BY_PK, {"pks": pks[i : i + batch]}).all()
                counts = [
                    (row.page_pk, _counted(terms_of, _page(_session(row), row, ()).page.render()))
                    for row in rows
                ]
                insert_postings(s, tenant, user, counts, term_pks)
            s.execute(
                update(UserRow).where(*USER_KEY).values(index_analyzer=analyzer),
                who,
            )
            return len(pks)

    @staticmethod
    def _keywords(s: Session, page_pks: Sequence[int]) -> dict[int, tuple[str, ...]]:
        if not page_pks:
            return {}
        rows = s.execute(
            select(BookmarkRow.page_pk, BookmarkRow.keyword, BookmarkRow.weight).where(
                BookmarkRow.page_pk.in_(list(page_pks))
            )
        ).all()
        by_page: dict[int, list[tuple[str, float]]] = {}
        for pk, keyword, weight in rows:
            by_page.setdefault(pk, []).append((keyword, float(weight)))
        return {pk: _rank_keywords(items) for pk, items in by_page.items()}

    def recent_turns(self, tenant: str, user: str, n: int) -> list[Turn]:
        """The last ``n`` turns of the user's newest sessions, in chronological order."""
        if n <= 0:
            return []
        out: list[Turn] = []
        with self._read() as s:
            rows = s.scalars(
                select(SessionRow)
                .where(SessionRow.tenant_id == tenant, SessionRow.user_id == user)
                # An undated session (raw turns without timestamps) counts as of its ingest.
                .order_by(
                    func.coalesce(SessionRow.date, SessionRow.created_at).desc(),
                    SessionRow.pk.desc(),
                )
                .limit(n)
            )
            for row in rows:
                out = [turn_from_json(t) for t in row.turns[-(n - len(out)) :]] + out
                if len(out) >= n:
                    break
        return out


def _counted(terms_of: Callable[[str], Mapping[str, int]], text: str) -> dict[str, int]:
    return {term_key(t): n for t, n in terms_of(text).items()}


def _indexed_pages(conn: Connection, rows: Sequence[Row[Any]]) -> list[IndexedPage]:
    """``rows`` (of ``_USER_PAGES``) as the pages an index holds, with their bookmarks."""
    marks: dict[int, list[tuple[str, str, float]]] = {}
    for chunk in chunks([row.page_pk for row in rows]):
        for page_pk, keyword, term, weight in conn.execute(_PAGE_BOOKMARKS, {"pks": chunk}):
            marks.setdefault(page_pk, []).append((keyword, term, float(weight)))
    sessions: dict[int, ChatSession] = {}
    pages = []
    for row in rows:
        session = sessions.get(row.session_pk)
        if session is None:
            session = sessions[row.session_pk] = _session(row)
        rows_of_page = marks.get(row.page_pk, [])
        keywords = _rank_keywords((k, w) for k, _, w in rows_of_page)
        pages.append(
            IndexedPage(
                pk=row.page_pk,
                stored=_page(session, row, keywords),
                order=(row.date is None, row.date or datetime.min, row.session_pk, row.turn_start),
                bookmark_terms=tuple((t, w) for _, t, w in rows_of_page),
            )
        )
    return pages


def _session(row: SessionRow | Row[Any]) -> ChatSession:
    return ChatSession(
        id=row.session_id,
        turns=tuple(turn_from_json(t) for t in row.turns),
        date=row.date,
        date_text=row.date_text,
    )


def _page(session: ChatSession, row: PageRow | Row[Any], keywords: tuple[str, ...]) -> StoredPage:
    page = ChatSession(
        id=row.page_id,
        turns=session.turns[row.turn_start : row.turn_end],
        date=session.date,
        date_text=session.date_text,
        conversation_id=session.id,
    )
    return StoredPage(page=page, session_id=session.id, n_tokens=row.n_tokens, keywords=keywords)


def _info(row: SessionRow, n_pages: int) -> SessionInfo:
    return SessionInfo(
        session_id=row.session_id,
        date=row.date,
        date_text=row.date_text,
        n_turns=row.n_turns,
        n_tokens=row.n_tokens,
        n_pages=int(n_pages),
        created_at=row.created_at,
    )


def _rank_keywords(rows: Iterable[tuple[str, float]]) -> tuple[str, ...]:
    """A page's keywords, best first: one bookmark row per analysed term, so a keyword's weight
    is the largest of its rows."""
    best: dict[str, float] = {}
    for keyword, weight in rows:
        best[keyword] = max(weight, best.get(keyword, weight))
    return tuple(k for k, _ in sorted(best.items(), key=lambda kv: (-kv[1], kv[0])))
