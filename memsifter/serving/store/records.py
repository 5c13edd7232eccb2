"""The store's records: plain frozen dataclasses that its methods take and return, never ORM
objects, so nothing lazy-loads after its database session closed.

They are the vocabulary the service layers share (``memory``, ``paging``, ``ranking``,
``bookmarks``, ``facts``, the routes), kept apart from the schema and the SQL so that those
layers depend on what a session, page or fact *is*, not on how it is persisted. Nothing here
imports SQLAlchemy. Datetimes are naive UTC throughout: ``utcnow`` and ``to_naive_utc`` make
them so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np

from memsifter.data.types import Session as ChatSession


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def to_naive_utc(value: datetime | None) -> datetime | None:
    if value is None or value.tzinfo is None:
        return value
    return value.astimezone(timezone.utc).replace(tzinfo=None)


@dataclass(frozen=True)
class Principal:
    """Who a request speaks for: its tenant, and the agent and fact types its key allows."""

    tenant_id: str
    agent: str | None = None
    fact_types: tuple[str, ...] | None = None  # None: every type

    def may_see(self, fact_type: str) -> bool:
        return self.fact_types is None or fact_type in self.fact_types


@dataclass(frozen=True)
class ApiKeyInfo:
    key_id: int
    tenant_id: str
    key_sha256_prefix: str  # enough to tell keys apart in a listing, useless to an attacker
    agent: str | None
    fact_types: tuple[str, ...] | None
    created_at: datetime


@dataclass(frozen=True)
class Bookmark:
    keyword: str
    terms: tuple[str, ...]
    weight: float


@dataclass(frozen=True)
class PageRecord:
    """A page to store: ``turns[start:end]`` of its session."""

    page_id: str
    turn_start: int
    turn_end: int
    n_tokens: int
    bookmarks: tuple[Bookmark, ...] = ()
    # The page's analysed terms and their counts, as the service's BM25 analyzer (named by
    # ``put_sessions(analyzer=)``) read its text: its postings. None: not indexed.
    terms: tuple[tuple[str, int], ...] | None = None


@dataclass(frozen=True)
class SessionRecord:
    session: ChatSession
    n_tokens: int
    pages: tuple[PageRecord, ...]


@dataclass(frozen=True)
class SessionInfo:
    session_id: str
    date: datetime | None
    date_text: str | None
    n_turns: int
    n_tokens: int
    n_pages: int
    created_at: datetime


@dataclass(frozen=True)
class StoredPage:
    page: ChatSession  # id = page id; what the coarse filter and the proxy rank
    session_id: str
    n_tokens: int
    keywords: tuple[str, ...] = ()


@dataclass(frozen=True)
class IndexedPage:
    """A page as a replica's index loads it: ``order`` sorts pages chronologically (undated
    last, then session and turn), ``bookmark_terms`` are its (term, weight) bookmark rows."""

    pk: int
    stored: StoredPage
    order: tuple[bool, datetime, int, int]
    bookmark_terms: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class UserState:
    epoch: str  # "" for users created before epochs existed
    version: int


@dataclass(frozen=True, eq=False)  # arrays: compare their fields
class IndexState:
    """A user's BM25 index as the database holds it, read in one transaction: the user's
    incarnation and version, the analyzer that wrote the postings (None: some page has none),
    and the pages' pks and BM25 lengths in chronological order (undated last, then session and
    turn), with the newest page's order key. A catch-up (``since``) holds only the pages added
    after that version, and ``complete`` is False when a write since then removed pages."""

    epoch: str
    version: int
    analyzer: str | None
    pks: np.ndarray  # int64
    lengths: np.ndarray  # integers: float64 read as rows, int32 from a pack
    first_order: tuple[bool, datetime, int, int] | None
    last_order: tuple[bool, datetime, int, int] | None
    complete: bool = True
    packed: int = 0  # of the pages, those read from the user's pack (``store.packs``)


# term -> (page pks, values): a term's postings (values: tf) or bookmark rows (values: weight)
TermArrays = dict[str, tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True, eq=False)
class PagesWritten:
    """What one ``put_sessions`` wrote, as the writing replica's index takes it in without
    reading it back: ``state`` is what ``index_state(since=state.version - 1)`` would return
    (the new pages in chronological order, the user's incarnation, the analyzer marker after
    the write), and the new pages' postings and bookmark rows by term."""

    state: IndexState
    postings: TermArrays
    marks: TermArrays


@dataclass(frozen=True)
class PageDelta:
    state: UserState
    pages: list[IndexedPage]  # every page, or (with ``since``) those added after it
    # With ``since``: None when no page the caller holds is gone, else every live pk.
    live: frozenset[int] | None = None


@dataclass(frozen=True)
class StoredSession:
    info: SessionInfo
    session: ChatSession
    pages: tuple[StoredPage, ...]


@dataclass(frozen=True)
class Fact:
    fact_id: str
    type: str
    subject: str
    text: str
    importance: float
    created_at: datetime
    last_accessed_at: datetime
    expires_at: datetime | None
    source: str | None = None
    superseded_by: str | None = None


@dataclass(frozen=True)
class PagingEvent:
    action: str  # in | out | skip
    page_id: str
    tokens: int
    reason: str
    relevance_rank: int | None = None
    at: datetime = field(default_factory=utcnow)
    request_id: str | None = None
