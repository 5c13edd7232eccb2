"""The paging state the store keeps per user: which pages are resident in the working LLM's
context, and the log of every paging decision.

Deciding what to page in or out is ``memsifter/serving/paging.py``; this module (named apart
from it) only persists the outcome, the resident set and its log changing in one transaction.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, select

from memsifter.serving.store.engine import Database, retried_write
from memsifter.serving.store.records import PagingEvent, utcnow
from memsifter.serving.store.schema import PageRow, PagingEventRow, ResidentPageRow


class PagingRepository(Database):
    """Resident pages and paging events."""

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
