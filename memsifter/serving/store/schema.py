"""The store's tables, as SQLAlchemy 2.0 ORM models, so the same code runs on the embedded
SQLite default and on PostgreSQL.

The schema is owned by the alembic migrations in ``memsifter/serving/migrations`` (applied by
``Store.migrate``; their ``env.py`` compares against ``Base.metadata``): the models below must
match them, which ``tests/serving/test_serve_store.py`` checks. Only the repositories and the engine
use these rows; everything else sees the records in ``records.py``.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from memsifter.data.types import Turn
from memsifter.serving.store.records import utcnow

MIGRATIONS = Path(__file__).resolve().parents[1] / "migrations"


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
    # The ``Analyzer.identity`` that wrote every one of this user's postings; None when some
    # page has none (stored before postings existed, or by a service without BM25): a replica
    # whose analyzer differs indexes the user again before serving from them.
    index_analyzer: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # The version of the last write that removed pages (a delete, a replace): a replica whose
    # index is older reads the user's pages again rather than counting them to find out.
    pages_removed: Mapped[int | None] = mapped_column(Integer, nullable=True)


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
    # The page's BM25 length: its analysed terms, repeats included (None: not indexed yet).
    n_terms: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The session's date, copied, so that a user's pages are read in chronological order
    # (undated last, then date, session, turn) from one index, with no join and no sort.
    undated: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    date: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    __table_args__ = (
        UniqueConstraint("tenant_id", "user_id", "page_id", name="uq_pages_user_page"),
        Index("ix_pages_user_added", "tenant_id", "user_id", "added_version"),
        Index(
            "ix_pages_user_chronological",
            "tenant_id",
            "user_id",
            "undated",
            "date",
            "session_pk",
            "turn_start",
            "n_terms",
            postgresql_include=["pk"],  # SQLite's indexes hold the rowid (pk) anyway
        ),
    )


class IndexTermRow(Base):
    """One analysed term of one user's pages: postings name it by ``pk``, so a posting row is
    three integers, not the tenant, user and term strings again."""

    __tablename__ = "index_terms"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(String(128))
    user_id: Mapped[str] = mapped_column(String(128))
    term: Mapped[str] = mapped_column(String(100))  # store.postings.term_key of the term
    __table_args__ = (
        _user_fk(),
        UniqueConstraint("tenant_id", "user_id", "term", name="uq_index_terms_user_term"),
    )


class PostingRow(Base):
    """A term's count in a page: the user's BM25 index, written in the transaction that writes
    the page, so no replica rebuilds an index from the pages' text."""

    __tablename__ = "index_postings"
    term_pk: Mapped[int] = mapped_column(
        Integer, ForeignKey("index_terms.pk", ondelete="CASCADE"), primary_key=True
    )
    page_pk: Mapped[int] = mapped_column(
        Integer, ForeignKey("pages.pk", ondelete="CASCADE"), primary_key=True, index=True
    )
    tf: Mapped[int] = mapped_column(Integer)
    # A term's postings are read as one range of the key, with no table access: SQLite
    # clusters the table on it; PostgreSQL's key index carries tf (migration 0005).
    __table_args__ = (
        PrimaryKeyConstraint(
            "term_pk", "page_pk", name="pk_index_postings", postgresql_include=["tf"]
        ),
        {"sqlite_with_rowid": False},
    )


class PagePackRow(Base):
    """A user's pages as of ``version``, packed: their pks and BM25 lengths in chronological
    order as two arrays (``store.packs``). A replica opening the user reads this row and the
    pages added since, not a row per page. Valid while no page was removed after ``version``,
    for the incarnation (``epoch``) and postings (``analyzer``) it names."""

    __tablename__ = "index_page_packs"
    tenant_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    version: Mapped[int] = mapped_column(Integer)
    epoch: Mapped[str | None] = mapped_column(String(32), nullable=True)
    analyzer: Mapped[str | None] = mapped_column(String(64), nullable=True)
    pks: Mapped[bytes] = mapped_column(LargeBinary)
    lengths: Mapped[bytes] = mapped_column(LargeBinary)
    __table_args__ = (_user_fk(),)


class PostingPackRow(Base):
    """A term's postings as of ``version``, packed: page pks ascending and their counts as two
    arrays (``store.packs``). A query reads this row and the postings of pages above the last
    pk packed. Valid while no page was removed after ``version``."""

    __tablename__ = "index_posting_packs"
    term_pk: Mapped[int] = mapped_column(
        Integer, ForeignKey("index_terms.pk", ondelete="CASCADE"), primary_key=True
    )
    version: Mapped[int] = mapped_column(Integer)
    pks: Mapped[bytes] = mapped_column(LargeBinary)
    tfs: Mapped[bytes] = mapped_column(LargeBinary)


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


# ------------------------------------------------------------------------------ turn coding
# ``sessions.turns`` is a JSON column: a session's turns as these dicts.


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
