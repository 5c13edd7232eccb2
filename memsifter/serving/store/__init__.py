"""Persistence for the recall service: tenants and hashed API keys, users, sessions with their
pages and keyword bookmarks, long-term facts, and the paging state. SQLAlchemy 2.0, so the same
code runs on the embedded SQLite default and on PostgreSQL.

One module per concern, so that a change to one (a new fact query, a key column) is read and
reviewed without the rest:

* ``records``: the frozen dataclasses the store takes and returns, which the service layers
  import without depending on persistence;
* ``schema``: the ORM tables, which the alembic migrations own and must match;
* ``engine``: ``Database``, the engines, transactions, SQLite writer lock, per-user row locks,
  and ``retried_write`` (deadlocks and serialization failures retried, then a 503; constraint
  violations as 409/404);
* ``keys``, ``sessions``, ``facts``, ``residency``: one repository each (tenants and keys;
  sessions, pages and user versions; facts; the paging state), each a ``Database``.

``Store`` is all four repositories over one database, the one object the service holds; this
package re-exports it and the names callers use, so ``from memsifter.serving.store import X``
is the import to write outside the package.
"""

from __future__ import annotations

from memsifter.serving.store.engine import (
    WRITE_ATTEMPTS,
    Database,
    integrity_error,
    is_transient,
    retried_write,
)
from memsifter.serving.store.facts import FactRepository
from memsifter.serving.store.keys import KeyRepository, PrincipalCache, hash_key
from memsifter.serving.store.postings import IndexRepository
from memsifter.serving.store.records import (
    ApiKeyInfo,
    Bookmark,
    Fact,
    IndexedPage,
    PageDelta,
    PageRecord,
    PagingEvent,
    Principal,
    SessionInfo,
    SessionRecord,
    StoredPage,
    StoredSession,
    UserState,
    to_naive_utc,
    utcnow,
)
from memsifter.serving.store.residency import PagingRepository
from memsifter.serving.store.schema import (
    MIGRATIONS,
    ApiKeyRow,
    Base,
    BookmarkRow,
    FactRow,
    PageRow,
    PagingEventRow,
    ResidentPageRow,
    RevokedKeyRow,
    SessionRow,
    TenantRow,
    UserRow,
    turn_from_json,
    turn_to_json,
)
from memsifter.serving.store.sessions import SessionRepository


class Store(KeyRepository, SessionRepository, IndexRepository, FactRepository, PagingRepository):
    """The service's database. ``migrate()`` once at startup, then use the methods.

    Every repository over one ``Database`` (one connection pool, one set of engines): the
    repositories share its state and add only methods, so combining them needs nothing more."""


__all__ = [
    "MIGRATIONS",
    "WRITE_ATTEMPTS",
    "ApiKeyInfo",
    "ApiKeyRow",
    "Base",
    "Bookmark",
    "BookmarkRow",
    "Database",
    "Fact",
    "FactRepository",
    "FactRow",
    "IndexedPage",
    "KeyRepository",
    "PageDelta",
    "PageRecord",
    "PageRow",
    "PagingEvent",
    "PagingEventRow",
    "PagingRepository",
    "Principal",
    "PrincipalCache",
    "ResidentPageRow",
    "RevokedKeyRow",
    "SessionInfo",
    "SessionRecord",
    "SessionRepository",
    "SessionRow",
    "Store",
    "StoredPage",
    "StoredSession",
    "TenantRow",
    "UserRow",
    "UserState",
    "hash_key",
    "integrity_error",
    "is_transient",
    "retried_write",
    "to_naive_utc",
    "turn_from_json",
    "turn_to_json",
    "utcnow",
]
