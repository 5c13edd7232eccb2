"""Recall (top-k pages for a question), context assembly with paging, and the paging log."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from memsifter.serving.deps import Svc, UserId, Who, check_question, check_top_k, in_thread
from memsifter.serving.errors import ServeError
from memsifter.serving.logs import request_id_var
from memsifter.serving.memory import RecallResult
from memsifter.serving.routes.rank import ERRORS, parse_out, timings_out
from memsifter.serving.routes.sessions import turn_out
from memsifter.serving.schemas import (
    ContextFact,
    ContextIn,
    ContextOut,
    PagingEventOut,
    PagingLogOut,
    RecallHit,
    RecallIn,
    RecallOut,
    TokenUse,
    Watermarks,
)

router = APIRouter(prefix="/v1/users/{user_id}", tags=["recall"])
RECALL_ERRORS: dict[int | str, dict[str, Any]] = {**ERRORS, 404: ERRORS[400]}


def recall_hits(result: RecallResult) -> list[RecallHit]:
    return [
        RecallHit(
            page_id=h.page.page.id,
            session_id=h.page.session_id,
            rank=h.rank,
            score=h.score,
            coarse_score=h.coarse_score,
            bookmark_score=h.bookmark_score,
            keywords=h.keywords,
            date=h.page.page.date,
            date_text=h.page.page.date_text,
            n_tokens=h.page.n_tokens,
            text=h.page.page.render(),
        )
        for h in result.hits
    ]


@router.post("/recall", response_model=RecallOut, responses=RECALL_ERRORS)
@in_thread
def recall(user_id: UserId, body: RecallIn, svc: Svc, who: Who) -> RecallOut:
    """The user's top-k pages for a question: coarse filter fused with keyword bookmarks, then
    the proxy. ``score`` is the fused coarse+bookmark score; ``rank`` is the final order."""
    limits = svc.config.limits
    check_question(body.question, limits)
    check_top_k(body.top_k, limits, "body.top_k")
    result = svc.memory.recall(
        who, user_id, body.question, top_k=body.top_k, question_date=body.question_date
    )
    return RecallOut(
        ranker=result.outcome.ranker,
        hits=recall_hits(result),
        think=result.outcome.think,
        parse=parse_out(result.outcome),
        timings=timings_out(result.outcome, result.index),
        request_id=request_id_var.get(),
    )


@router.post("/context", response_model=ContextOut, responses=RECALL_ERRORS)
@in_thread
def context(user_id: UserId, body: ContextIn, svc: Svc, who: Who) -> ContextOut:
    """The working LLM's memory context within ``budget_tokens``: pinned facts, then paged-in
    pages, then recent turns. Lists what was paged in, out, or skipped, and why (see the
    paging log)."""
    limits = svc.config.limits
    check_question(body.question, limits)
    if body.budget_tokens > limits.max_budget_tokens:
        raise ServeError(
            f"{body.budget_tokens} is over the limit of {limits.max_budget_tokens}",
            field="body.budget_tokens",
            status=422,
        )
    check_top_k(body.page_in_k, limits, "body.page_in_k")
    result = svc.memory.context(
        who,
        user_id,
        body.question,
        budget_tokens=body.budget_tokens,
        question_date=body.question_date,
        page_in_k=body.page_in_k,
        recent_turns=body.recent_turns,
        request_id=request_id_var.get(),
    )
    plan = result.plan
    svc.metrics.page_ins.inc(len(plan.page_in))
    svc.metrics.page_outs.inc(len(plan.page_out))
    timing_source = result.outcome or (result.recall.outcome if result.recall else None)
    ranker = timing_source.ranker if timing_source else svc.ranker.name
    return ContextOut(
        ranker=ranker,
        text=result.text,
        tokens=TokenUse(**result.tokens),
        facts=[
            ContextFact(fact_id=f.fact.fact_id, type=f.fact.type, text=f.fact.text, score=f.score)
            for f in result.facts
        ],
        pages=list(plan.resident),
        paged_in=list(plan.page_in),
        paged_out=list(plan.page_out),
        skipped=list(plan.skipped),
        watermarks=Watermarks(
            page_budget=plan.budget_tokens,
            high=plan.high_tokens,
            low=plan.low_tokens,
            used=plan.used_tokens,
            evicted=plan.evicted,
        ),
        recent_turns=[turn_out(t) for t in result.recent],
        parse=parse_out(result.outcome) if result.outcome else None,
        timings=timings_out(timing_source, result.index),
        request_id=request_id_var.get(),
    )


@router.get("/paging", response_model=PagingLogOut, responses=RECALL_ERRORS)
@in_thread
def paging_log(
    user_id: UserId, svc: Svc, who: Who, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> PagingLogOut:
    """The newest paging decisions for the user, newest first."""
    events = svc.store.paging_events(who.tenant_id, user_id, limit=limit)
    return PagingLogOut(
        user_id=user_id,
        events=[
            PagingEventOut(
                at=e.at,
                action=e.action,
                page_id=e.page_id,
                tokens=e.tokens,
                reason=e.reason,
                relevance_rank=e.relevance_rank,
                request_id=e.request_id,
            )
            for e in events
        ],
    )
