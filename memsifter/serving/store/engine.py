"""How the store talks to its database: the engines, transactions, locks and retries that every
repository shares, so that each repository module holds only its own queries.

**SQLite.** WAL mode (readers never block the writer or each other), ``busy_timeout``, foreign
keys on. Writes serialize through one lock per database file (``WriterLock``: a thread lock,
and ``flock`` across processes) and open with ``BEGIN IMMEDIATE``: a deferred transaction that
reads and then writes can get ``SQLITE_BUSY`` without the busy handler ever running (another
writer committed after its snapshot), which is how "database is locked" reaches users of naive
setups. Holding the lock for the whole write transaction means that cannot happen; a process
that opens the database without it (another tool) still meets ``BEGIN IMMEDIATE`` waiting on
``busy_timeout``. Many machines writing one database is what PostgreSQL is for.

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
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import re
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

try:
    import fcntl
except ImportError:  # Windows: no flock
    fcntl = None  # type: ignore[assignment]

import numpy as np
from sqlalchemy import Engine, bindparam, create_engine, event, select, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.sql.expression import Executable
from tenacity import (
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from memsifter.serving.errors import ConflictError, NotFoundError, ServeError, UnavailableError
from memsifter.serving.store.records import utcnow
from memsifter.serving.store.schema import MIGRATIONS, Base, UserRow

logger = logging.getLogger(__name__)


def rowcount(result: Any) -> int:
    """Rows a DELETE/UPDATE touched (``Session.execute`` is typed as returning a plain
    ``Result``, which hides the cursor's count)."""
    return int(getattr(result, "rowcount", 0) or 0)


# ------------------------------------------------------------------------------------ SQLite


class WriterLock:
    """Serialises the writers of one SQLite file: this process's threads with a
    ``threading.Lock``, processes (``serve --workers N``) with ``flock`` on a file beside the
    database, which blocks in the kernel and wakes the next writer at once. Without it, SQLite's
    busy handler made a second worker's writers poll with sleeps of up to 100 ms, leaving a
    core idle under load. Where ``fcntl`` is missing (Windows) the busy handler still
    serialises processes.

    The file is opened once per process, after a fork too: a descriptor inherited from the
    parent would be the parent's lock (``flock`` belongs to the open file), not a second one."""

    def __init__(self, database: Path) -> None:
        self.path = database.with_name(database.name + ".writer-lock")
        self._threads = threading.Lock()
        self._fd: int | None = None
        self._pid = 0

    def _file(self) -> int:
        if self._fd is None or self._pid != os.getpid():
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            self._pid = os.getpid()
        return self._fd

    def __enter__(self) -> WriterLock:
        self._threads.acquire()
        if fcntl is not None:
            try:
                fcntl.flock(self._file(), fcntl.LOCK_EX)
            except BaseException:
                self._threads.release()
                raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if fcntl is not None and self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._threads.release()


_SQLITE_LOCKS: dict[str, WriterLock] = {}
_SQLITE_LOCKS_GUARD = threading.Lock()


def _sqlite_lock(database: str) -> WriterLock:
    """One lock per database file for the whole process, however many Stores open it."""
    path = Path(database).resolve()
    with _SQLITE_LOCKS_GUARD:
        return _SQLITE_LOCKS.setdefault(str(path), WriterLock(path))


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

# One user's row, by the ``tenant`` and ``user`` parameters, for statements built once (see
# ``_read_row``): building a statement costs more than running it.
USER_KEY = (UserRow.tenant_id == bindparam("tenant"), UserRow.user_id == bindparam("user"))
# Every write locks its user's row first.
_LOCK_USER = select(UserRow.version).where(*USER_KEY).with_for_update()

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


def upsert_insert(dialect: str, model: Any) -> Any:
    """``INSERT`` into ``model``'s table in the dialect's own form, which has ``ON CONFLICT``
    (both databases the store runs on spell it alike)."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(model)
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(model)


# ---------------------------------------------------------------------------------- database


class Database:
    """The engines and transactions of one database URL: the base every repository extends.

    ``Store`` combines all repositories over one ``Database``, so the service opens one pool
    (and on SQLite shares the file's writer lock, which is per process, with any other
    ``Database`` on the same file). Repositories write only inside ``_write`` (under a
    ``retried_write`` method) and read inside ``_read`` or ``_read_row``."""

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
            self._lock: WriterLock | None = _sqlite_lock(database)
        else:
            self._writer = create_engine(url, pool_pre_ping=True, echo=echo)
            # The same pool; reads see one snapshot for their whole transaction (a read-only
            # REPEATABLE READ transaction never fails to serialize on PostgreSQL).
            self._reader = self._writer.execution_options(isolation_level="REPEATABLE READ")
            self._engines = (self._writer,)
            self._lock = None

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
        (the API key, the user's version) with statements built once (``keys._KEY_LOOKUP``,
        ``sessions._USER_STATE``): an ORM session and a freshly built ``select`` cost ~3-4x as
        much."""
        with self._reader.begin() as conn:
            yield conn

    def ping(self) -> None:
        with self._read() as s:
            s.execute(text("SELECT 1"))

    def _insert_ignore(self, s: Session, model: type[Base], **values: Any) -> bool:
        """Insert a row unless it would violate a unique key; True if it was inserted."""
        stmt = upsert_insert(self.dialect, model).values(**values).on_conflict_do_nothing()
        return rowcount(s.execute(stmt)) > 0

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
        who = {"tenant": tenant, "user": user}
        # An existing user (nearly every write) is locked by the first statement; a missing one
        # is created, then locked.
        if s.execute(_LOCK_USER, who).first() is not None:
            return True
        if not create:
            return False
        for _ in range(3):
            self._ensure_user(s, tenant, user)
            if s.execute(_LOCK_USER, who).first() is not None:
                return True
        raise UnavailableError(
            f"user {user!r} was deleted and created again repeatedly while this write waited; "
            "retry",
            field="path.user_id",
        )


# ------------------------------------------------------------------------- bulk column reads

_COMPILED: dict[tuple[Executable, str], Any] = {}


def read_columns(
    conn: Connection, stmt: Executable, params: Mapping[str, Any], dtypes: Sequence[Any]
) -> tuple[np.ndarray, ...]:
    """The rows of ``stmt`` (built once, at module level) as one array per column, in order,
    read through the driver's own cursor (PostgreSQL's in binary): for a user's 100K page
    lengths or a term's 50K postings, SQLAlchemy's row objects and a ``zip`` cost more than
    the read itself. Numeric columns only, and no NULLs (``coalesce`` them in ``stmt``)."""
    key = (stmt, conn.dialect.name)
    compiled = _COMPILED.get(key)
    if compiled is None:
        compiled = _COMPILED[key] = stmt.compile(dialect=conn.dialect)
    values = compiled.construct_params(params)
    raw = conn.connection.driver_connection
    if conn.dialect.name == "postgresql":
        cursor = raw.cursor(binary=True)
        args: Any = values
    else:
        cursor = raw.cursor()
        args = tuple(values[name] for name in compiled.positiontup)
    try:
        cursor.execute(compiled.string, args)
        # Values straight from the cursor: no list of row tuples, no nested-sequence parse.
        flat = np.fromiter(itertools.chain.from_iterable(cursor), dtype=np.float64)
    finally:
        cursor.close()
    table = flat.reshape(-1, len(dtypes))
    return tuple(table[:, i].astype(dtype) for i, dtype in enumerate(dtypes))
