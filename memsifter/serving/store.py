"""Persistence for the recall service: tenants and hashed API keys, users, sessions with their
pages and keyword bookmarks, long-term facts, and the paging state. SQLAlchemy 2.0, so the same
code runs on the embedded SQLite default and on PostgreSQL.

**SQLite.** WAL mode (readers never block the writer or each other), ``busy_timeout``, foreign
keys on. Writes serialize through one process-wide lock per database file and open with
``BEGIN IMMEDIATE``: a deferred transaction that reads and then writes can get ``SQLITE_BUSY``
without the busy handler ever running (another writer committed after its snapshot), which is
how "database is locked" reaches users of naive setups. Holding the lock for the whole write
transaction means that cannot happen within a process; across processes ``BEGIN IMMEDIATE``
waits on ``busy_timeout``. Many processes writing one database is what PostgreSQL is for.

**PostgreSQL.** Every write that changes a user's data first locks that user's row
(``SELECT … FOR UPDATE``, creating the row with ``INSERT … ON CONFLICT DO NOTHING`` when the
write may create the user). Check-then-write sequences (does this session exist? which live fact
has this subject?) are therefore serialised per user across every replica: without the lock, two
ingests of one session id both see "absent" and one fails on the unique key, a delete racing an
ingest leaves it a foreign-key violation, and two facts about one subject both stay live. Users
do not wait on each other. Writes that touch no single user (``touch_facts``, ``sweep_expired``)
take no user lock and can still deadlock against the others; so every write transaction is
retried (tenacity) on a deadlock or serialization failure, and surfaces as a 503
(``UnavailableError``) when retries run out. A unique or foreign-key violation that still
happens becomes a 409 or 404 naming the field, never a 500. Reads run in ``REPEATABLE READ``:
a multi-statement read (a user's version and their pages) sees one snapshot, as on SQLite.
Migrations take an advisory lock so replicas starting together do not race.

**Revoked keys** are remembered (``revoked_keys``, by hash), so re-adding a configured
bootstrap key at start-up never brings back a key an admin revoked.

The schema is owned by the alembic migrations in ``memsifter/serving/migrations`` (applied by
``Store.migrate``); the models below must match them, which ``tests/test_serve_store.py`` checks.
Methods return plain frozen records, never ORM objects, so nothing lazy-loads after its
session closed. Datetimes are naive UTC throughout.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
import secrets
import threading
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import (
    JSON,
    DateTime,
    Engine,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    bindparam,
    create_engine,
    delete,
    event,
    func,
    select,
    text,
    update,
)
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from tenacity import (
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from memsifter.data.types import Session as ChatSession
from memsifter.data.types import Turn
from memsifter.serving.errors import ConflictError, NotFoundError, ServeError, UnavailableError

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
logger = logging.getLogger(__name__)


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def to_naive_utc(value: datetime | None) -> datetime | None:
    if value is None or value.tzinfo is None:
        return value
    return value.astimezone(timezone.utc).replace(tzinfo=None)


def _rowcount(result: Any) -> int:
    """Rows a DELETE/UPDATE touched (``Session.execute`` is typed as returning a plain
    ``Result``, which hides the cursor's count)."""
    return int(getattr(result, "rowcount", 0) or 0)


def hash_key(key: str) -> str:
    """API keys are random and long, so an unsalted sha256 cannot be brute-forced; it lets a
    request's key be looked up by an index instead of checked against every stored hash."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------------------- models


class Base(DeclarativeBase):
    # Named constraints, so that migrations can refer to them on every database.
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(column_0_label)s",
            "uq": "uq_%(table_name)s_%(column_0_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


class TenantRow(Base):
    __tablename__ = "tenants"
    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class ApiKeyRow(Base):
    __tablename__ = "api_keys"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("tenants.id", ondelete="CASCADE"), index=True
    )
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    agent: Mapped[str | None] = mapped_column(String(128), nullable=True)
    fact_types: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class RevokedKeyRow(Base):
    """A revoked key's hash, kept after its ``api_keys`` row is gone: start-up re-adds missing
    bootstrap keys, and must tell "never added" from "revoked"."""

    __tablename__ = "revoked_keys"
    key_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(128))  # no foreign key: outlives the tenant
    revoked_at: Mapped[datetime] = mapped_column(DateTime)


class UserRow(Base):
    __tablename__ = "users"
    tenant_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    user_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    # Bumped whenever this user's pages change: every replica's in-memory index keys on it.
    version: Mapped[int] = mapped_column(Integer, default=0)
    # New at every creation: a user deleted and created again restarts at version 0, and a
    # replica must not take the new user's version 3 for the old user's.
    epoch: Mapped[str | None] = mapped_column(String(32), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


def _user_fk() -> ForeignKeyConstraint:
    return ForeignKeyConstraint(
        ["tenant_id", "user_id"], ["users.tenant_id", "users.user_id"], ondelete="CASCADE"
    )


class SessionRow(Base):
    __tablename__ = "sessions"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(String(128))
    user_id: Mapped[str] = mapped_column(String(128))
    session_id: Mapped[str] = mapped_column(String(128))
    date: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    date_text: Mapped[str | None] = mapped_column(String(64), nullable=True)
    turns: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    n_turns: Mapped[int] = mapped_column(Integer)
    n_tokens: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    __table_args__ = (
        _user_fk(),
        UniqueConstraint("tenant_id", "user_id", "session_id", name="uq_sessions_user_session"),
    )


class PageRow(Base):
    __tablename__ = "pages"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    session_pk: Mapped[int] = mapped_column(
        Integer, ForeignKey("sessions.pk", ondelete="CASCADE"), index=True
    )
    tenant_id: Mapped[str] = mapped_column(String(128))
    user_id: Mapped[str] = mapped_column(String(128))
    page_id: Mapped[str] = mapped_column(String(200))
    turn_start: Mapped[int] = mapped_column(Integer)
    turn_end: Mapped[int] = mapped_column(Integer)
    n_tokens: Mapped[int] = mapped_column(Integer)
    # The user's version that added this page: replicas load pages newer than theirs by it,
    # not by pk, which SQLite reuses after a delete.
    added_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    __table_args__ = (
        UniqueConstraint("tenant_id", "user_id", "page_id", name="uq_pages_user_page"),
    )


class BookmarkRow(Base):
    __tablename__ = "bookmarks"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    page_pk: Mapped[int] = mapped_column(
        Integer, ForeignKey("pages.pk", ondelete="CASCADE"), index=True
    )
    tenant_id: Mapped[str] = mapped_column(String(128))
    user_id: Mapped[str] = mapped_column(String(128))
    keyword: Mapped[str] = mapped_column(String(200))
    term: Mapped[str] = mapped_column(String(100))  # one analysed (stemmed) term of keyword
    weight: Mapped[float] = mapped_column(Float)
    __table_args__ = (Index("ix_bookmarks_user_term", "tenant_id", "user_id", "term"),)


class FactRow(Base):
    __tablename__ = "facts"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    fact_id: Mapped[str] = mapped_column(String(36), unique=True)
    tenant_id: Mapped[str] = mapped_column(String(128))
    user_id: Mapped[str] = mapped_column(String(128))
    type: Mapped[str] = mapped_column(String(16))
    subject: Mapped[str] = mapped_column(String(200))  # normalised: the supersede key
    text: Mapped[str] = mapped_column(Text)
    importance: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    last_accessed_at: Mapped[datetime] = mapped_column(DateTime)
    expires_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True, index=True)
    superseded_by: Mapped[str | None] = mapped_column(String(36), nullable=True)
    superseded_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    source: Mapped[str | None] = mapped_column(String(128), nullable=True)
    __table_args__ = (
        _user_fk(),
        Index("ix_facts_user_subject", "tenant_id", "user_id", "subject"),
    )


class ResidentPageRow(Base):
    """Pages currently paged in to a user's working context."""

    __tablename__ = "resident_pages"
    page_pk: Mapped[int] = mapped_column(
        Integer, ForeignKey("pages.pk", ondelete="CASCADE"), primary_key=True
    )
    tenant_id: Mapped[str] = mapped_column(String(128))
    user_id: Mapped[str] = mapped_column(String(128))
    paged_in_at: Mapped[datetime] = mapped_column(DateTime)
    __table_args__ = (Index("ix_resident_user", "tenant_id", "user_id"),)


class PagingEventRow(Base):
    __tablename__ = "paging_events"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(String(128))
    user_id: Mapped[str] = mapped_column(String(128))
    at: Mapped[datetime] = mapped_column(DateTime)
    request_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    action: Mapped[str] = mapped_column(String(16))  # in | out | skip
    page_id: Mapped[str] = mapped_column(String(200))
    tokens: Mapped[int] = mapped_column(Integer)
    relevance_rank: Mapped[int | None] = mapped_column(Integer, nullable=True)
    reason: Mapped[str] = mapped_column(String(200))
    __table_args__ = (
        _user_fk(),
        Index("ix_paging_events_user_at", "tenant_id", "user_id", "at"),
    )


# -------------------------------------------------------------------------------------- records


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


# --------------------------------------------------------------------------------- turn coding


def turn_to_json(turn: Turn) -> dict[str, Any]:
    return {
        "speaker": turn.speaker,
        "text": turn.text,
        "turn_id": turn.turn_id,
        "timestamp": turn.timestamp.isoformat() if turn.timestamp else None,
    }


def turn_from_json(data: dict[str, Any]) -> Turn:
    ts = data.get("timestamp")
    return Turn(
        speaker=data["speaker"],
        text=data["text"],
        turn_id=data.get("turn_id"),
        timestamp=datetime.fromisoformat(ts) if ts else None,
    )


# ------------------------------------------------------------------------------------- the store

_SQLITE_LOCKS: dict[str, threading.Lock] = {}
_SQLITE_LOCKS_GUARD = threading.Lock()


def _sqlite_lock(database: str) -> threading.Lock:
    """One lock per database file for the whole process, however many Stores open it."""
    key = str(Path(database).resolve())
    with _SQLITE_LOCKS_GUARD:
        return _SQLITE_LOCKS.setdefault(key, threading.Lock())


def _sqlite_engine(url: str, begin: str, busy_timeout_s: float) -> Engine:
    engine = create_engine(
        url, connect_args={"check_same_thread": False, "timeout": busy_timeout_s}
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Autocommit at the driver so that the BEGIN below is the only one, and ours to choose.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")  # durable across app crashes in WAL mode
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql(begin)

    return engine


# ------------------------------------------------------------------------ transaction failures

# PostgreSQL SQLSTATEs a transaction may hit through no fault of its own, and succeed on a rerun:
# deadlock_detected, serialization_failure, lock_not_available.
_TRANSIENT_SQLSTATES = frozenset({"40P01", "40001", "55P03"})
WRITE_ATTEMPTS = 5

# Which request field each unique constraint guards, by constraint name (PostgreSQL reports it)
# and by the columns SQLite names in its message.
_UNIQUE_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("uq_sessions_user_session", "sessions.session_id", "sessions"),
    ("uq_pages_user_page", "pages.page_id", "sessions"),
    ("uq_api_keys_key_hash", "api_keys.key_hash", "key"),
    ("uq_facts_fact_id", "facts.fact_id", "path.fact_id"),
)
_SQLITE_UNIQUE = re.compile(r"UNIQUE constraint failed: (.+)")

P = ParamSpec("P")
R = TypeVar("R")


def _sqlstate(e: BaseException) -> str | None:
    orig = getattr(e, "orig", None)
    return getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)


def is_transient(e: BaseException) -> bool:
    """A deadlock or serialization failure: the transaction was rolled back and may be rerun."""
    return isinstance(e, DBAPIError) and _sqlstate(e) in _TRANSIENT_SQLSTATES


def integrity_error(e: IntegrityError) -> ServeError | None:
    """The 409/404 a constraint violation stands for, or None for one no request can cause
    (a bug: left to surface as a 500 with its traceback in the log).

    With the per-user lock none of these should happen; this is the net under it, so that a
    race nobody foresaw still answers a client error naming the field."""
    state = _sqlstate(e)
    message = str(e.orig) if e.orig is not None else str(e)
    diag = getattr(getattr(e, "orig", None), "diag", None)
    constraint = getattr(diag, "constraint_name", None) or ""
    if state == "23503" or "FOREIGN KEY constraint failed" in message:
        return NotFoundError(
            "the user (or a session or page this write refers to) was deleted while the request "
            "ran; retry to create it again",
            field="path.user_id",
        )
    sqlite_columns = _SQLITE_UNIQUE.search(message)
    for name, columns, field_name in _UNIQUE_FIELDS:
        if constraint == name or (sqlite_columns and columns in sqlite_columns.group(1)):
            return ConflictError(
                f"{field_name} already exists (written by a concurrent request)", field=field_name
            )
    return None


def retried_write(method: Callable[P, R]) -> Callable[P, R]:
    """Run a write method (one transaction) again on a deadlock or serialization failure, then
    give up with a 503; turn constraint violations into the client errors they stand for.

    The whole method reruns, so a method must do all its writing in one ``_write`` block and
    nothing outside it that a rerun would repeat."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        retrying = Retrying(
            retry=retry_if_exception(is_transient),
            stop=stop_after_attempt(WRITE_ATTEMPTS),
            wait=wait_random_exponential(multiplier=0.01, max=0.5),
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    return method(*args, **kwargs)
        except IntegrityError as e:
            mapped = integrity_error(e)
            if mapped is None:
                raise
            raise mapped from e
        except DBAPIError as e:
            if not is_transient(e):
                raise
            logger.warning("write gave up after %d attempts: %s", WRITE_ATTEMPTS, e.orig)
            raise UnavailableError(
                f"the database kept aborting this write as conflicting with concurrent ones "
                f"({WRITE_ATTEMPTS} attempts); retry"
            ) from e
        raise AssertionError("unreachable: tenacity returns or raises")  # pragma: no cover

    return wrapper


# The one-row reads of every request, built once: building a select costs more than running it.
_KEY_LOOKUP = select(ApiKeyRow.tenant_id, ApiKeyRow.agent, ApiKeyRow.fact_types).where(
    ApiKeyRow.key_hash == bindparam("key_hash")
)
_USER_STATE = select(UserRow.epoch, UserRow.version).where(
    UserRow.tenant_id == bindparam("tenant"), UserRow.user_id == bindparam("user")
)


class Store:
    """The service's database. ``migrate()`` once at startup, then use the methods."""

    def __init__(self, url: str, *, busy_timeout_s: float = 30.0, echo: bool = False) -> None:
        self.url = url
        parsed = make_url(url)
        self.dialect = parsed.get_backend_name()
        if self.dialect == "sqlite":
            database = parsed.database or ""
            if database in ("", ":memory:") or database.startswith("file:"):
                raise ServeError(
                    "the SQLite store needs a file path (sqlite:///path.db): an in-memory "
                    "database is private to one connection",
                    field="db_url",
                )
            Path(database).parent.mkdir(parents=True, exist_ok=True)
            self._writer = _sqlite_engine(url, "BEGIN IMMEDIATE", busy_timeout_s)
            self._reader = _sqlite_engine(url, "BEGIN", busy_timeout_s)
            self._engines = (self._writer, self._reader)
            self._lock: threading.Lock | None = _sqlite_lock(database)
        else:
            self._writer = create_engine(url, pool_pre_ping=True, echo=echo)
            # The same pool; reads see one snapshot for their whole transaction (a read-only
            # REPEATABLE READ transaction never fails to serialize on PostgreSQL).
            self._reader = self._writer.execution_options(isolation_level="REPEATABLE READ")
            self._engines = (self._writer,)
            self._lock = None

    # -- plumbing

    def migrate(self) -> None:
        """Bring the schema to the newest alembic revision (a no-op when it is there)."""
        from alembic import command
        from alembic.config import Config

        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        guard = self._lock or nullcontext()
        with guard, self._writer.begin() as conn:
            if self.dialect == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(7243190)"))
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")

    def close(self) -> None:
        for engine in self._engines:
            engine.dispose()

    @contextmanager
    def _write(self) -> Iterator[Session]:
        guard: AbstractContextManager[Any] = self._lock or nullcontext()
        with guard, Session(self._writer, expire_on_commit=False) as s, s.begin():
            yield s

    @contextmanager
    def _read(self) -> Iterator[Session]:
        with Session(self._reader) as s, s.begin():
            yield s

    @contextmanager
    def _read_row(self) -> Iterator[Connection]:
        """A read transaction on a bare connection, for the one-row reads every request makes
        (the API key, the user's version) with statements built once (``_KEY_LOOKUP``,
        ``_USER_STATE``): an ORM session and a freshly built ``select`` cost ~3-4x as much."""
        with self._reader.begin() as conn:
            yield conn

    def ping(self) -> None:
        with self._read() as s:
            s.execute(text("SELECT 1"))

    def _insert_ignore(self, s: Session, model: type[Base], **values: Any) -> bool:
        """Insert a row unless it would violate a unique key; True if it was inserted."""
        if self.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            result = s.execute(pg_insert(model).values(**values).on_conflict_do_nothing())
        else:
            from sqlalchemy.dialects.sqlite import insert as sqlite_insert

            result = s.execute(sqlite_insert(model).values(**values).on_conflict_do_nothing())
        return _rowcount(result) > 0

    def _ensure_user(self, s: Session, tenant: str, user: str) -> None:
        self._insert_ignore(
            s,
            UserRow,
            tenant_id=tenant,
            user_id=user,
            version=0,
            epoch=uuid.uuid4().hex,
            created_at=utcnow(),
        )

    def _lock_user(self, s: Session, tenant: str, user: str, *, create: bool) -> bool:
        """Lock the user's row until the transaction ends (creating it first when ``create``),
        so that this user's writers run one at a time; False if there is no such user.

        ``ON CONFLICT DO NOTHING`` takes no lock on a row that exists, and a concurrent delete
        can remove it between that insert and the ``FOR UPDATE`` (which then finds nothing once
        the delete commits): the insert is tried again. On SQLite ``FOR UPDATE`` renders as
        nothing; the process lock and ``BEGIN IMMEDIATE`` already make this the only writer."""
        where = (UserRow.tenant_id == tenant, UserRow.user_id == user)
        for _ in range(3):
            if create:
                self._ensure_user(s, tenant, user)
            if s.scalar(select(UserRow.version).where(*where).with_for_update()) is not None:
                return True
            if not create:
                return False
        raise UnavailableError(
            f"user {user!r} was deleted and created again repeatedly while this write waited; "
            "retry",
            field="path.user_id",
        )

    @staticmethod
    def _bump(s: Session, tenant: str, user: str) -> int:
        """The user's next version; the row stays locked (or the SQLite writer held) until the
        transaction ends, so no other writer can take the same one."""
        where = (UserRow.tenant_id == tenant, UserRow.user_id == user)
        s.execute(update(UserRow).where(*where).values(version=UserRow.version + 1))
        return int(s.scalar(select(UserRow.version).where(*where)) or 0)

    # -- tenants and keys

    @retried_write
    def ensure_tenant(self, tenant: str) -> None:
        with self._write() as s:
            self._insert_ignore(s, TenantRow, id=tenant, created_at=utcnow())

    @retried_write
    def add_api_key(
        self,
        tenant: str,
        *,
        key: str | None = None,
        key_sha256: str | None = None,
        agent: str | None = None,
        fact_types: Sequence[str] | None = None,
    ) -> bool:
        """Store a key (by hash) for ``tenant``, creating the tenant; False if it existed or
        was revoked (a revoked key is never added again; see ``key_revoked``)."""
        digest = key_sha256.lower() if key_sha256 else hash_key(key or "")
        if not key and not key_sha256:
            raise ServeError("an API key needs key or key_sha256", field="key")
        with self._write() as s:
            if s.get(RevokedKeyRow, digest) is not None:
                return False
            self._insert_ignore(s, TenantRow, id=tenant, created_at=utcnow())
            # Replicas starting together bootstrap the same keys: insert-or-nothing, then look.
            inserted = self._insert_ignore(
                s,
                ApiKeyRow,
                tenant_id=tenant,
                key_hash=digest,
                agent=agent,
                fact_types=list(fact_types) if fact_types is not None else None,
                created_at=utcnow(),
            )
            if inserted:
                return True
            owner = s.scalar(select(ApiKeyRow.tenant_id).where(ApiKeyRow.key_hash == digest))
            if owner != tenant:
                raise ConflictError("this key already belongs to another tenant", field="key")
            return False

    def key_revoked(self, key_sha256: str) -> bool:
        with self._read() as s:
            return s.get(RevokedKeyRow, key_sha256.lower()) is not None

    @retried_write
    def create_api_key(
        self, tenant: str, *, agent: str | None = None, fact_types: Sequence[str] | None = None
    ) -> tuple[ApiKeyInfo, str]:
        """A new random key for ``tenant`` (created if new): its record and the plaintext,
        which is not stored and cannot be shown again."""
        key = "msk-" + secrets.token_urlsafe(24)
        with self._write() as s:
            self._insert_ignore(s, TenantRow, id=tenant, created_at=utcnow())
            row = ApiKeyRow(
                tenant_id=tenant,
                key_hash=hash_key(key),
                agent=agent,
                fact_types=list(fact_types) if fact_types is not None else None,
                created_at=utcnow(),
            )
            s.add(row)
            s.flush()
            return _key_info(row), key

    def list_api_keys(self, tenant: str) -> list[ApiKeyInfo] | None:
        """The tenant's keys, oldest first; None for an unknown tenant."""
        with self._read() as s:
            if s.get(TenantRow, tenant) is None:
                return None
            rows = s.scalars(
                select(ApiKeyRow).where(ApiKeyRow.tenant_id == tenant).order_by(ApiKeyRow.id)
            ).all()
            return [_key_info(r) for r in rows]

    @retried_write
    def revoke_api_key(self, key_id: int) -> ApiKeyInfo | None:
        """Delete a key and record its hash as revoked, so that no restart adds it back;
        requests with it fail from the next one on. None if there is none."""
        with self._write() as s:
            row = s.get(ApiKeyRow, key_id)
            if row is None:
                return None
            info = _key_info(row)
            self._insert_ignore(
                s,
                RevokedKeyRow,
                key_hash=row.key_hash,
                tenant_id=row.tenant_id,
                revoked_at=utcnow(),
            )
            s.delete(row)
            return info

    def authenticate(self, key: str) -> Principal | None:
        with self._read_row() as conn:  # every request: no ORM session, a prebuilt statement
            row = conn.execute(_KEY_LOOKUP, {"key_hash": hash_key(key)}).first()
        if row is None:
            return None
        types = tuple(row.fact_types) if row.fact_types is not None else None
        return Principal(tenant_id=row.tenant_id, agent=row.agent, fact_types=types)

    # -- sessions and pages

    @retried_write
    def put_sessions(
        self, tenant: str, user: str, records: Sequence[SessionRecord], *, replace: bool = False
    ) -> None:
        """Store sessions with their pages and bookmarks in one transaction. An existing id is a
        ``ConflictError`` naming it unless ``replace``, which swaps the old session out."""
        with self._write() as s:
            self._lock_user(s, tenant, user, create=True)
            ids = [r.session.id for r in records]
            existing = set(
                s.scalars(
                    select(SessionRow.session_id).where(
                        SessionRow.tenant_id == tenant,
                        SessionRow.user_id == user,
                        SessionRow.session_id.in_(ids),
                    )
                )
            )
            if existing and not replace:
                i = next(i for i, sid in enumerate(ids) if sid in existing)
                raise ConflictError(
                    f"session {ids[i]!r} already exists; send replace=true to overwrite it",
                    field=f"sessions[{i}].id",
                )
            if existing:
                s.execute(
                    delete(SessionRow).where(
                        SessionRow.tenant_id == tenant,
                        SessionRow.user_id == user,
                        SessionRow.session_id.in_(existing),
                    )
                )
            version = self._bump(s, tenant, user)
            now = utcnow()
            for i, r in enumerate(records):
                session = r.session
                row = SessionRow(
                    tenant_id=tenant,
                    user_id=user,
                    session_id=session.id,
                    date=to_naive_utc(session.date),
                    date_text=session.date_text,
                    turns=[turn_to_json(t) for t in session.turns],
                    n_turns=len(session.turns),
                    n_tokens=r.n_tokens,
                    created_at=now,
                )
                s.add(row)
                try:
                    s.flush()
                except IntegrityError as e:  # see integrity_error: the net under the lock
                    mapped = integrity_error(e)
                    if mapped is None:
                        raise
                    if isinstance(mapped, ConflictError):
                        mapped = ConflictError(
                            f"session {session.id!r} already exists; send replace=true to "
                            "overwrite it",
                            field=f"sessions[{i}].id",
                        )
                    raise mapped from e
                for p in r.pages:
                    page = PageRow(
                        session_pk=row.pk,
                        tenant_id=tenant,
                        user_id=user,
                        page_id=p.page_id,
                        turn_start=p.turn_start,
                        turn_end=p.turn_end,
                        n_tokens=p.n_tokens,
                        added_version=version,
                    )
                    s.add(page)
                    s.flush()
                    s.add_all(
                        BookmarkRow(
                            page_pk=page.pk,
                            tenant_id=tenant,
                            user_id=user,
                            keyword=b.keyword[:200],
                            term=term[:100],
                            weight=b.weight,
                        )
                        for b in p.bookmarks
                        for term in b.terms
                    )

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
            if not _rowcount(result):
                return False
            self._bump(s, tenant, user)
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
            return bool(_rowcount(result))

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
        with self._read() as s:
            state = s.execute(
                select(UserRow.epoch, UserRow.version).where(
                    UserRow.tenant_id == tenant, UserRow.user_id == user
                )
            ).first()
            if state is None:
                return None
            where = (PageRow.tenant_id == tenant, PageRow.user_id == user)
            query = select(SessionRow, PageRow).join(PageRow, PageRow.session_pk == SessionRow.pk)
            if since is None:
                rows = list(s.execute(query.where(*where)).all())
            else:
                newer = func.coalesce(PageRow.added_version, 0) > since
                rows = list(s.execute(query.where(*where, newer)).all())
            live: frozenset[int] | None = None
            if since is not None:
                count = s.scalar(select(func.count()).select_from(PageRow).where(*where)) or 0
                if count != len(set(known) | {prow.pk for _, prow in rows}):
                    live = frozenset(s.scalars(select(PageRow.pk).where(*where)))
            marks: dict[int, list[tuple[str, str, float]]] = {}
            pks = [prow.pk for _, prow in rows]
            for i in range(0, len(pks), 500):
                for page_pk, keyword, term, weight in s.execute(
                    select(
                        BookmarkRow.page_pk,
                        BookmarkRow.keyword,
                        BookmarkRow.term,
                        BookmarkRow.weight,
                    ).where(BookmarkRow.page_pk.in_(pks[i : i + 500]))
                ):
                    marks.setdefault(page_pk, []).append((keyword, term, float(weight)))
            sessions: dict[int, ChatSession] = {}
            pages = []
            for srow, prow in rows:
                session = sessions.get(srow.pk)
                if session is None:
                    session = sessions[srow.pk] = _session(srow)
                rows_of_page = marks.get(prow.pk, [])
                keywords = _rank_keywords((k, w) for k, _, w in rows_of_page)
                pages.append(
                    IndexedPage(
                        pk=prow.pk,
                        stored=_page(session, prow, keywords),
                        order=(
                            srow.date is None,
                            srow.date or datetime.min,
                            srow.pk,
                            prow.turn_start,
                        ),
                        bookmark_terms=tuple((t, w) for _, t, w in rows_of_page),
                    )
                )
            return PageDelta(UserState(state.epoch or "", int(state.version)), pages, live=live)

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

    # -- facts

    @retried_write
    def add_fact(
        self,
        tenant: str,
        user: str,
        *,
        type: str,
        subject: str,
        text: str,
        importance: float,
        expires_at: datetime | None = None,
        source: str | None = None,
        supersedes: str | None = None,
        visible_types: Collection[str] | None = None,
        now: datetime | None = None,
    ) -> tuple[Fact, list[str]]:
        """Store a fact; every live fact of the same type with the same subject (and
        ``supersedes``, a correction whose subject or type changed) is marked superseded by it.
        Returns the fact and those ids.

        ``visible_types`` are the types the caller may see (None: all): a fact of any other
        type is never superseded, so a restricted agent can neither hide nor learn of facts it
        may not see. A ``supersedes`` id it may not see is a ``NotFoundError``, as on read. The
        user's row is locked first, so concurrent facts about one subject leave exactly one
        live."""
        now = now or utcnow()
        fact_id = str(uuid.uuid4())
        with self._write() as s:
            self._lock_user(s, tenant, user, create=True)
            live = (
                FactRow.tenant_id == tenant,
                FactRow.user_id == user,
                FactRow.superseded_by.is_(None),
            )
            match = (FactRow.subject == subject) & (FactRow.type == type)
            if supersedes is not None:
                target = s.scalar(select(FactRow.type).where(*live, FactRow.fact_id == supersedes))
                if target is None or (visible_types is not None and target not in visible_types):
                    raise NotFoundError(f"unknown fact {supersedes!r}", field="path.fact_id")
                match = match | (FactRow.fact_id == supersedes)
            if visible_types is not None:
                match = match & FactRow.type.in_(list(visible_types))
            old = list(s.scalars(select(FactRow.fact_id).where(*live, match)))
            if old:
                s.execute(
                    update(FactRow)
                    .where(FactRow.fact_id.in_(old))
                    .values(superseded_by=fact_id, superseded_at=now)
                )
            row = FactRow(
                fact_id=fact_id,
                tenant_id=tenant,
                user_id=user,
                type=type,
                subject=subject,
                text=text,
                importance=importance,
                created_at=now,
                last_accessed_at=now,
                expires_at=to_naive_utc(expires_at),
                source=source,
            )
            s.add(row)
            s.flush()
            return _fact(row), old

    def list_facts(
        self,
        tenant: str,
        user: str,
        *,
        types: Sequence[str] | None = None,
        now: datetime | None = None,
        limit: int = 500,
    ) -> list[Fact]:
        """Live facts: neither superseded nor expired, visible types only, newest first."""
        now = now or utcnow()
        with self._read() as s:
            query = select(FactRow).where(
                FactRow.tenant_id == tenant,
                FactRow.user_id == user,
                FactRow.superseded_by.is_(None),
                (FactRow.expires_at.is_(None)) | (FactRow.expires_at > now),
            )
            if types is not None:
                query = query.where(FactRow.type.in_(list(types)))
            rows = s.scalars(
                query.order_by(FactRow.created_at.desc(), FactRow.pk.desc()).limit(limit)
            )
            return [_fact(r) for r in rows]

    def get_fact(
        self, tenant: str, user: str, fact_id: str, *, now: datetime | None = None
    ) -> Fact | None:
        """A live fact; superseded and expired ones are history, never returned."""
        now = now or utcnow()
        with self._read() as s:
            row = s.scalar(
                select(FactRow).where(
                    FactRow.tenant_id == tenant,
                    FactRow.user_id == user,
                    FactRow.fact_id == fact_id,
                    FactRow.superseded_by.is_(None),
                    (FactRow.expires_at.is_(None)) | (FactRow.expires_at > now),
                )
            )
            return _fact(row) if row is not None else None

    @retried_write
    def forget_fact(
        self,
        tenant: str,
        user: str,
        fact_id: str,
        *,
        visible_types: Collection[str] | None = None,
    ) -> int:
        """Hard-delete a fact and the history it superseded: forgetting a fact must not leave
        its earlier versions behind. Returns how many rows went (0: unknown id, or a type the
        caller may not see). Only facts of ``visible_types`` (None: all) are deleted, history
        included: a correction may have changed a fact's type, and an agent must not delete
        what it may not see."""
        with self._write() as s:
            if not self._lock_user(s, tenant, user, create=False):
                return 0
            where: tuple[Any, ...] = (FactRow.tenant_id == tenant, FactRow.user_id == user)
            if visible_types is not None:
                where = (*where, FactRow.type.in_(list(visible_types)))
            if s.scalar(select(FactRow.pk).where(*where, FactRow.fact_id == fact_id)) is None:
                return 0
            doomed = {fact_id}
            frontier = [fact_id]
            while frontier:
                frontier = [
                    fid
                    for fid in s.scalars(
                        select(FactRow.fact_id).where(*where, FactRow.superseded_by.in_(frontier))
                    )
                    if fid not in doomed
                ]
                doomed.update(frontier)
            s.execute(delete(FactRow).where(*where, FactRow.fact_id.in_(doomed)))
            return len(doomed)

    @retried_write
    def touch_facts(self, fact_ids: Sequence[str], now: datetime | None = None) -> None:
        if not fact_ids:
            return
        with self._write() as s:
            s.execute(
                update(FactRow)
                .where(FactRow.fact_id.in_(list(fact_ids)))
                .values(last_accessed_at=now or utcnow())
            )

    @retried_write
    def sweep_expired(self, *, tenant: str | None = None, now: datetime | None = None) -> int:
        """Hard-delete expired facts (all tenants, or one); returns how many."""
        now = now or utcnow()
        with self._write() as s:
            query = delete(FactRow).where(
                FactRow.expires_at.is_not(None), FactRow.expires_at <= now
            )
            if tenant is not None:
                query = query.where(FactRow.tenant_id == tenant)
            return _rowcount(s.execute(query))

    # -- paging

    def resident_pages(self, tenant: str, user: str) -> list[tuple[str, int]]:
        """Paged-in (page id, tokens), oldest page-in first."""
        with self._read() as s:
            rows = s.execute(
                select(PageRow.page_id, PageRow.n_tokens)
                .join(ResidentPageRow, ResidentPageRow.page_pk == PageRow.pk)
                .where(ResidentPageRow.tenant_id == tenant, ResidentPageRow.user_id == user)
                .order_by(ResidentPageRow.paged_in_at, PageRow.pk)
            ).all()
            return [(pid, int(n)) for pid, n in rows]

    @retried_write
    def apply_paging(
        self,
        tenant: str,
        user: str,
        *,
        page_in: Sequence[str],
        page_out: Sequence[str],
        events: Sequence[PagingEvent],
    ) -> None:
        """Change the resident set and log every decision, in one transaction."""
        with self._write() as s:
            self._lock_user(s, tenant, user, create=True)
            by_id = dict(
                s.execute(
                    select(PageRow.page_id, PageRow.pk).where(
                        PageRow.tenant_id == tenant,
                        PageRow.user_id == user,
                        PageRow.page_id.in_(list(page_in) + list(page_out)),
                    )
                ).all()
            )
            if page_out:
                pks = [by_id[p] for p in page_out if p in by_id]
                s.execute(delete(ResidentPageRow).where(ResidentPageRow.page_pk.in_(pks)))
            now = utcnow()
            for pid in page_in:
                if pid in by_id:
                    self._insert_ignore(
                        s,
                        ResidentPageRow,
                        page_pk=by_id[pid],
                        tenant_id=tenant,
                        user_id=user,
                        paged_in_at=now,
                    )
            s.add_all(
                PagingEventRow(
                    tenant_id=tenant,
                    user_id=user,
                    at=e.at,
                    request_id=e.request_id,
                    action=e.action,
                    page_id=e.page_id,
                    tokens=e.tokens,
                    relevance_rank=e.relevance_rank,
                    reason=e.reason[:200],
                )
                for e in events
            )

    def paging_events(self, tenant: str, user: str, *, limit: int = 100) -> list[PagingEvent]:
        with self._read() as s:
            rows = s.scalars(
                select(PagingEventRow)
                .where(PagingEventRow.tenant_id == tenant, PagingEventRow.user_id == user)
                .order_by(PagingEventRow.pk.desc())
                .limit(limit)
            )
            return [
                PagingEvent(
                    action=r.action,
                    page_id=r.page_id,
                    tokens=r.tokens,
                    reason=r.reason,
                    relevance_rank=r.relevance_rank,
                    at=r.at,
                    request_id=r.request_id,
                )
                for r in rows
            ]


def _session(row: SessionRow) -> ChatSession:
    return ChatSession(
        id=row.session_id,
        turns=tuple(turn_from_json(t) for t in row.turns),
        date=row.date,
        date_text=row.date_text,
    )


def _page(session: ChatSession, row: PageRow, keywords: tuple[str, ...]) -> StoredPage:
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


def _key_info(row: ApiKeyRow) -> ApiKeyInfo:
    return ApiKeyInfo(
        key_id=row.id,
        tenant_id=row.tenant_id,
        key_sha256_prefix=row.key_hash[:8],
        agent=row.agent,
        fact_types=tuple(row.fact_types) if row.fact_types is not None else None,
        created_at=row.created_at,
    )


def _fact(row: FactRow) -> Fact:
    return Fact(
        fact_id=row.fact_id,
        type=row.type,
        subject=row.subject,
        text=row.text,
        importance=row.importance,
        created_at=row.created_at,
        last_accessed_at=row.last_accessed_at,
        expires_at=row.expires_at,
        source=row.source,
        superseded_by=row.superseded_by,
    )


def _rank_keywords(rows: Iterable[tuple[str, float]]) -> tuple[str, ...]:
    """A page's keywords, best first: one bookmark row per analysed term, so a keyword's weight
    is the largest of its rows."""
    best: dict[str, float] = {}
    for keyword, weight in rows:
        best[keyword] = max(weight, best.get(keyword, weight))
    return tuple(k for k, _ in sorted(best.items(), key=lambda kv: (-kv[1], kv[0])))
