"""Long-term facts about a user: add (superseding the live facts it replaces), list, get,
forget (with the history it superseded), mark as accessed, and sweep the expired.

The policy (which subject a fact is about, how facts rank and decay) is the service's, in
``memsifter/serving/facts.py``; this module only stores and finds them.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select, update

from memsifter.serving.errors import NotFoundError
from memsifter.serving.store.engine import Database, retried_write, rowcount
from memsifter.serving.store.records import Fact, to_naive_utc, utcnow
from memsifter.serving.store.schema import FactRow


class FactRepository(Database):
    """A user's facts and their supersede history."""

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
            return rowcount(s.execute(query))


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
