"""The memory layer between a chat app and its working LLM: ingest, recall, context assembly.

Routes stay thin and call this; it joins the store, the ranker, bookmarks, facts and paging.

* **Ingest.** Sessions (or raw turns, segmented by ``memsifter.data.segment``) are cut into pages
  of ``turns_per_page`` turns (``memsifter.data.units.page_session``); each page is counted,
  bookmarked, and stored with its session in one transaction; then this replica's index of the
  user takes in the new pages (``ServiceRanker.user_index``: only what it lacks, never the whole
  history), so the first query after an ingest pays nothing for it.
* **Recall.** The user's pages, ranked by ``ServiceRanker`` (coarse fused with bookmark hits,
  then the proxy), top-k back with keywords and scores.
* **Context.** Pinned facts (at most ``facts_fraction`` of the budget), then the paged-in pages,
  then the most recent turns (at most ``recent_fraction``); pages get what the other two leave,
  and ``paging.plan_paging`` decides what enters and leaves within that.
* **Tenants' caches.** Every step that analyses a tenant's text (segmenting, bookmarking,
  ranking facts; the ranker's own steps) runs in the tenant's ``cache_scope``
  (``memsifter.scopes``), so no content-keyed cache, down to the analyzer's stem memo, answers
  one tenant faster because another sent the same words.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from memsifter.data.segment import SegmentParams, segment_turns
from memsifter.data.tokens import ApproxCounter, HFCounter, TokenCounter
from memsifter.data.types import Session, Turn
from memsifter.data.units import page_session
from memsifter.scopes import cache_scope
from memsifter.serving.bookmarks import KeywordExtractor, to_bookmarks
from memsifter.serving.config import ServeConfig
from memsifter.serving.errors import ConflictError, NotFoundError, ServeError
from memsifter.serving.facts import ScoredFact, rank_facts, render_fact
from memsifter.serving.paging import PageSlot, PagingPlan, plan_paging
from memsifter.serving.ranking import IndexLoad, RankOutcome, ServiceRanker, UserIndex
from memsifter.serving.store import Store
from memsifter.serving.store.records import (
    PageRecord,
    Principal,
    SessionRecord,
    StoredPage,
    to_naive_utc,
    utcnow,
)
from memsifter.serving.stored_index import StoredIndex

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RecallHitResult:
    page: StoredPage
    rank: int
    score: float
    coarse_score: float
    bookmark_score: float | None
    keywords: list[str]


@dataclass(frozen=True)
class RecallResult:
    outcome: RankOutcome
    hits: list[RecallHitResult]
    index: IndexLoad = IndexLoad()  # what finding the user's index cost this request


@dataclass(frozen=True)
class ContextResult:
    text: str
    facts: list[ScoredFact]
    pages: list[StoredPage]
    recent: list[Turn]
    plan: PagingPlan
    tokens: dict[str, int]
    outcome: RankOutcome | None  # the eviction ranking, when the high watermark was crossed
    recall: RecallResult | None
    index: IndexLoad = IndexLoad()


class MemoryService:
    def __init__(
        self,
        config: ServeConfig,
        store: Store,
        ranker: ServiceRanker,
        extractor: KeywordExtractor,
        counter: TokenCounter | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.ranker = ranker
        self.extractor = extractor
        tokenizer = config.paging.tokenizer
        self.counter: TokenCounter = counter or (
            HFCounter(tokenizer) if tokenizer else ApproxCounter()
        )

    # -- ingest

    def _record(self, session: Session) -> tuple[SessionRecord, list[Session]]:
        """The session to store, and its pages as the store will give them back (dates naive
        UTC): the text their postings and the proxy's token counts are taken from."""
        pages = page_session(session, self.config.paging.turns_per_page)
        ids = [p.id for p in pages]
        if len(set(ids)) != len(ids):
            raise ServeError(
                f"session {session.id!r} has repeated turn ids, so its pages cannot be named",
                field="turn_id",
                status=422,
            )
        keywords = self.extractor.extract(pages)
        records = []
        stored = [replace(page, date=to_naive_utc(page.date)) for page in pages]
        for page, kws, as_stored in zip(pages, keywords, stored, strict=True):
            records.append(
                PageRecord(
                    page_id=page.id,
                    turn_start=page.first_turn,
                    turn_end=page.first_turn + len(page.turns),
                    n_tokens=self.counter.count(page.render()),
                    bookmarks=to_bookmarks(kws),
                    terms=self.ranker.index_terms(as_stored.render()),
                )
            )
        record = SessionRecord(session, self.counter.count(session.render()), tuple(records))
        return record, stored

    def ingest_sessions(
        self, who: Principal, user: str, sessions: Sequence[Session], *, replace: bool = False
    ) -> list[SessionRecord]:
        records, pages = [], []
        with cache_scope(who.tenant_id):
            for i, s in enumerate(sessions):
                try:
                    record, stored = self._record(s)
                except ServeError as e:
                    e.field = f"body.sessions[{i}].turns"
                    raise
                records.append(record)
                pages += stored
        try:
            written = self.store.put_sessions(
                who.tenant_id, user, records, replace=replace, analyzer=self.ranker.index_analyzer
            )
        except ServeError as e:  # the store names fields of its input; callers sent a body
            if e.field and not e.field.startswith(("body.", "path.")):
                e.field = f"body.{e.field}"
            raise
        # Index now, not on first query.
        self.ranker.user_index(self.store, who.tenant_id, user, written=written)
        self.ranker.warm(who.tenant_id, pages)
        logger.info(
            "ingested sessions",
            extra={
                "user": user,
                "sessions": len(records),
                "pages": sum(len(r.pages) for r in records),
            },
        )
        return records

    def ingest_turns(
        self,
        who: Principal,
        user: str,
        turns: Sequence[Turn],
        *,
        prefix: str | None = None,
        max_gap: timedelta = timedelta(hours=4),
        topic_threshold: float | None = 0.05,
    ) -> list[SessionRecord]:
        # A fresh prefix per call: segment ids restart at 0, and two batches must not collide.
        prefix = prefix or f"t{utcnow():%Y%m%d%H%M%S}-{uuid.uuid4().hex[:6]}"
        config = SegmentParams(max_gap=max_gap, topic_threshold=topic_threshold)
        with cache_scope(who.tenant_id):
            sessions = segment_turns(turns, config, id_prefix=prefix)
        try:
            return self.ingest_sessions(who, user, sessions)
        except ConflictError as e:  # the ids came from the prefix, not from the body
            e.field = "body.session_prefix"
            raise

    # -- recall

    def _index(self, who: Principal, user: str) -> tuple[UserIndex | StoredIndex, IndexLoad]:
        index, load = self.ranker.user_index(self.store, who.tenant_id, user)
        if index is None:
            raise NotFoundError(f"unknown user {user!r}", field="path.user_id")
        return index, load

    def recall(
        self,
        who: Principal,
        user: str,
        question: str,
        *,
        top_k: int = 5,
        question_date: str | None = None,
        exclude: Sequence[str] = (),
    ) -> RecallResult:
        index, load = self._index(who, user)
        return self._recall(who, index, load, question, top_k, question_date, exclude)

    def _recall(
        self,
        who: Principal,
        index: UserIndex | StoredIndex,
        load: IndexLoad,
        question: str,
        top_k: int,
        question_date: str | None,
        exclude: Sequence[str] = (),
    ) -> RecallResult:
        outcome, pages = self.ranker.recall(
            self.store,
            index,
            question,
            top_k=top_k,
            question_date=question_date,
            exclude=exclude,
        )
        hits = [
            RecallHitResult(
                page=pages[pid],
                rank=i + 1,
                score=outcome.score(pid),
                coarse_score=outcome.coarse_score(pid),
                bookmark_score=outcome.bookmark_score(pid),
                keywords=list(pages[pid].keywords),
            )
            for i, pid in enumerate(outcome.ids[:top_k])
        ]
        return RecallResult(outcome, hits, load)

    # -- context

    def context(
        self,
        who: Principal,
        user: str,
        question: str,
        *,
        budget_tokens: int,
        question_date: str | None = None,
        page_in_k: int | None = None,
        recent_turns: int | None = None,
        request_id: str | None = None,
        now: datetime | None = None,
    ) -> ContextResult:
        now = now or utcnow()
        paging = self.config.paging
        index, load = self._index(who, user)
        count = self.counter.count

        facts = self.store.list_facts(
            who.tenant_id,
            user,
            types=who.fact_types,
            now=now,
            limit=self.config.limits.max_facts_listed,
        )
        with cache_scope(who.tenant_id):
            ranked = rank_facts(facts, now, question, self.config.facts.decay_per_day)
        fact_cap = int(budget_tokens * paging.facts_fraction)
        pinned: list[ScoredFact] = []
        # Each section's header is charged to it, so the sections add up to the whole text.
        fact_tokens = count(_FACTS_HEADER)
        for sf in ranked[: self.config.facts.context_max_facts]:
            n = count(render_fact(sf.fact))
            if fact_tokens + n <= fact_cap:
                pinned.append(sf)
                fact_tokens += n
        if not pinned:
            fact_tokens = 0
        self.store.touch_facts([sf.fact.fact_id for sf in pinned], now)

        n_recent = paging.recent_turns if recent_turns is None else recent_turns
        recent_cap = int(budget_tokens * paging.recent_fraction)
        recent: list[Turn] = []
        recent_tokens = count(_RECENT_HEADER)
        for turn in reversed(self.store.recent_turns(who.tenant_id, user, n_recent)):
            n = count(turn.render())
            if recent_tokens + n > recent_cap:
                break
            recent.insert(0, turn)
            recent_tokens += n
        if not recent:
            recent_tokens = 0

        page_budget = max(budget_tokens - fact_tokens - recent_tokens - count(_PAGES_HEADER), 0)
        k = paging.page_in_k if page_in_k is None else page_in_k
        recall = (
            self._recall(who, index, load, question, k, question_date)
            if k > 0 and len(index)
            else None
        )
        slots = self.store.resident_pages(who.tenant_id, user)
        known = self.ranker.user_pages(self.store, index, [pid for pid, _ in slots])
        known.update((h.page.page.id, h.page) for h in (recall.hits if recall else []))
        resident = [PageSlot(pid, n) for pid, n in slots if pid in known]
        # Only pages with some evidence are offered: with BM25 the rest of a top-k can be
        # pages sharing no term with the question, and paging those in only evicts others.
        offered = [
            PageSlot(h.page.page.id, h.page.n_tokens)
            for h in (recall.hits if recall else [])
            if h.score > 0
        ]
        eviction: list[RankOutcome] = []

        def relevance(ids: list[str]) -> Sequence[str]:
            # One batched call: every resident and offered page in a single ranking.
            outcome = self.ranker.rank_pages(
                self.store, index, question, ids, question_date=question_date
            )
            eviction.append(outcome)
            return outcome.ids

        plan = plan_paging(
            resident,
            offered,
            page_budget,
            high_watermark=paging.high_watermark,
            low_watermark=paging.low_watermark,
            relevance=relevance,
            request_id=request_id,
        )
        if plan.events:
            self.store.apply_paging(
                who.tenant_id,
                user,
                page_in=plan.page_in,
                page_out=plan.page_out,
                events=plan.events,
            )
        for e in plan.events:
            logger.info(
                "paging decision",
                extra={"user": user, "action": e.action, "page_id": e.page_id, "reason": e.reason},
            )

        pages = [known[pid] for pid in plan.resident]
        text = _assemble(pinned, pages, recent)
        page_tokens = plan.used_tokens + count(_PAGES_HEADER) if pages else 0
        tokens = {
            "budget": budget_tokens,
            "facts": fact_tokens,
            "pages": page_tokens,
            "recent": recent_tokens,
            "total": count(text),
        }
        return ContextResult(
            text=text,
            facts=pinned,
            pages=pages,
            recent=recent,
            plan=plan,
            tokens=tokens,
            outcome=eviction[0] if eviction else None,
            recall=recall,
            index=load,
        )


_FACTS_HEADER = "## What I know about the user"
_PAGES_HEADER = "## Relevant memory"
_RECENT_HEADER = "## Recent conversation"


def _assemble(
    facts: Sequence[ScoredFact], pages: Sequence[StoredPage], recent: Sequence[Turn]
) -> str:
    parts = []
    if facts:
        parts.append("\n".join([_FACTS_HEADER, *(render_fact(f.fact) for f in facts)]))
    if pages:
        # Chronological, like the proxy's prompt: the working LLM reads memory as a timeline.
        ordered = sorted(pages, key=lambda p: (p.page.date is None, p.page.date or datetime.min))
        parts.append("\n\n".join([_PAGES_HEADER, *(p.page.render() for p in ordered)]))
    if recent:
        parts.append("\n".join([_RECENT_HEADER, *(t.render() for t in recent)]))
    return "\n\n".join(parts)


def session_from_input(
    sid: str, turns: Sequence[Turn], date: datetime | None, date_text: str | None
) -> Session:
    """A ``Session`` from request data; a missing ``date_text`` is written from ``date``."""
    if date_text is None and date is not None:
        date_text = date.strftime("%Y-%m-%d %H:%M")
    return replace(Session(id=sid, turns=tuple(turns)), date=date, date_text=date_text)
