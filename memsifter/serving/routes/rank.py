"""``POST /v1/rank``: rank candidate sessions for a question, storing nothing."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from memsifter.serving.deps import (
    Svc,
    Who,
    check_question,
    check_sessions,
    check_top_k,
    in_thread,
    to_session,
)
from memsifter.serving.logs import request_id_var
from memsifter.serving.ranking import IndexLoad, RankOutcome
from memsifter.serving.schemas import ErrorResponse, ParseOut, RankedItem, RankIn, RankOut, Timings

router = APIRouter(prefix="/v1", tags=["rank"])
ERRORS: dict[int | str, dict[str, Any]] = {
    s: {"model": ErrorResponse} for s in (400, 401, 413, 422, 503)
}


def parse_out(outcome: RankOutcome) -> ParseOut:
    p = outcome.parse
    return ParseOut(
        status=p.status,  # type: ignore[arg-type]
        error=p.error,
        completed=p.completed,
        n_from_model=p.n_from_model,
        dropped=p.dropped,
        duplicates=p.duplicates,
        shown=p.shown,
        cut_by_coarse=p.cut,
    )


def timings_out(outcome: RankOutcome | None, index: IndexLoad | None = None) -> Timings:
    """The response's timings; with the request's ``index`` load (recall, context) its time is
    part of the total, so a first recall that rebuilt an index reports what it took."""
    t = outcome.timings_ms if outcome is not None else {}
    index_ms = index.ms if index is not None else 0.0
    return Timings(
        index_ms=index_ms if index is not None else None,
        index_load=index.kind if index is not None else None,
        index_cached=index.cached if index is not None else None,
        coarse_ms=t.get("coarse_ms", 0.0),
        proxy_ms=t.get("proxy_ms"),
        model_ms=t.get("model_ms"),
        total_ms=t.get("total_ms", 0.0) + index_ms,
    )


@router.post("/rank", response_model=RankOut, responses=ERRORS)
@in_thread
def rank(body: RankIn, svc: Svc, who: Who) -> RankOut:
    """Rank ``sessions`` for ``question``: the coarse filter, then the proxy (unless the service
    runs coarse-only, which ``ranker`` then says). Ids come back best first."""
    limits = svc.config.limits
    check_question(body.question, limits)
    check_sessions(body.sessions, limits)
    check_top_k(body.top_k, limits, "body.top_k")
    sessions = [to_session(s) for s in body.sessions]
    outcome = svc.ranker.rank(
        body.question, sessions, tenant=who.tenant_id, question_date=body.question_date
    )
    ids = outcome.ids[: body.top_k] if body.top_k else outcome.ids
    return RankOut(
        ranker=outcome.ranker,
        ranking=[
            RankedItem(id=sid, rank=i + 1, score=outcome.coarse_score(sid))
            for i, sid in enumerate(ids)
        ],
        think=outcome.think,
        parse=parse_out(outcome),
        timings=timings_out(outcome),
        request_id=request_id_var.get(),
    )
