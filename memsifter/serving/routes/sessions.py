"""A user's stored sessions: ingest (sessions or raw turns), list, get, delete; and deleting a
user altogether."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query

from memsifter.data.types import Turn
from memsifter.serving.deps import (
    SessionId,
    Svc,
    UserId,
    Who,
    check_sessions,
    check_turns,
    in_thread,
    to_session,
    to_turn,
)
from memsifter.serving.errors import NotFoundError, ServeError
from memsifter.serving.schemas import (
    DeletedOut,
    ErrorResponse,
    IngestedSession,
    IngestOut,
    IngestSessionsIn,
    IngestTurnsIn,
    PageOut,
    SessionListOut,
    SessionOut,
    SessionSummary,
    TurnOut,
)
from memsifter.serving.store.records import SessionInfo, SessionRecord, StoredPage

router = APIRouter(prefix="/v1/users/{user_id}", tags=["sessions"])
ERRORS: dict[int | str, dict[str, Any]] = {
    s: {"model": ErrorResponse} for s in (400, 401, 404, 409, 413, 422, 503)
}


def ingest_out(user: str, records: list[SessionRecord]) -> IngestOut:
    return IngestOut(
        user_id=user,
        sessions=[
            IngestedSession(
                session_id=r.session.id,
                n_turns=len(r.session.turns),
                n_pages=len(r.pages),
                n_tokens=r.n_tokens,
                page_ids=[p.page_id for p in r.pages],
            )
            for r in records
        ],
    )


def summary(info: SessionInfo) -> SessionSummary:
    return SessionSummary(
        session_id=info.session_id,
        date=info.date,
        date_text=info.date_text,
        n_turns=info.n_turns,
        n_tokens=info.n_tokens,
        n_pages=info.n_pages,
        created_at=info.created_at,
    )


def turn_out(t: Turn) -> TurnOut:
    return TurnOut(speaker=t.speaker, text=t.text, turn_id=t.turn_id, timestamp=t.timestamp)


def page_out(p: StoredPage) -> PageOut:
    return PageOut(
        page_id=p.page.id,
        session_id=p.session_id,
        n_tokens=p.n_tokens,
        keywords=list(p.keywords),
        turns=[turn_out(t) for t in p.page.turns],
    )


@router.post("/sessions", response_model=IngestOut, status_code=201, responses=ERRORS)
@in_thread
def ingest_sessions(user_id: UserId, body: IngestSessionsIn, svc: Svc, who: Who) -> IngestOut:
    """Store sessions: each is cut into pages, bookmarked and indexed. An existing session id
    is a 409 unless ``replace`` is true."""
    check_sessions(body.sessions, svc.config.limits)
    sessions = [to_session(s) for s in body.sessions]
    records = svc.memory.ingest_sessions(who, user_id, sessions, replace=body.replace)
    return ingest_out(user_id, records)


@router.post("/turns", response_model=IngestOut, status_code=201, responses=ERRORS)
@in_thread
def ingest_turns(user_id: UserId, body: IngestTurnsIn, svc: Svc, who: Who) -> IngestOut:
    """Store a raw turn stream, segmented into sessions on time gaps and topic shifts."""
    limits = svc.config.limits
    check_turns(body.turns, limits, "body.turns", limits.max_turns_per_request)
    records = svc.memory.ingest_turns(
        who,
        user_id,
        [to_turn(t) for t in body.turns],
        prefix=body.session_prefix,
        max_gap=timedelta(hours=body.max_gap_hours),
        topic_threshold=body.topic_threshold,
    )
    return ingest_out(user_id, records)


@router.get("/sessions", response_model=SessionListOut, responses=ERRORS)
@in_thread
def list_sessions(
    user_id: UserId,
    svc: Svc,
    who: Who,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=1_000_000_000)] = 0,
) -> SessionListOut:
    infos, total = svc.store.list_sessions(who.tenant_id, user_id, limit=limit, offset=offset)
    return SessionListOut(user_id=user_id, total=total, sessions=[summary(i) for i in infos])


@router.get("/sessions/{session_id:path}", response_model=SessionOut, responses=ERRORS)
@in_thread
def get_session(user_id: UserId, session_id: SessionId, svc: Svc, who: Who) -> SessionOut:
    stored = svc.store.get_session(who.tenant_id, user_id, session_id)
    if stored is None:
        raise NotFoundError(f"unknown session {session_id!r}", field="path.session_id")
    return SessionOut(
        session=summary(stored.info),
        turns=[turn_out(t) for t in stored.session.turns],
        pages=[page_out(p) for p in stored.pages],
    )


@router.delete("/sessions/{session_id:path}", response_model=DeletedOut, responses=ERRORS)
@in_thread
def delete_session(user_id: UserId, session_id: SessionId, svc: Svc, who: Who) -> DeletedOut:
    if not svc.store.delete_session(who.tenant_id, user_id, session_id):
        raise NotFoundError(f"unknown session {session_id!r}", field="path.session_id")
    return DeletedOut(deleted=1)


@router.delete("", response_model=DeletedOut, responses=ERRORS)
@in_thread
def delete_user(
    user_id: UserId,
    svc: Svc,
    who: Who,
    confirm: Annotated[
        str | None,
        Query(max_length=128, description="the user id again: a user delete names it twice"),
    ] = None,
) -> DeletedOut:
    """Forget a user entirely: sessions, pages, bookmarks, facts and paging history. The id is
    named twice (``?confirm=<user_id>``), so that no client's path mistake (a session id of
    ``..`` resolved away by a URL parser) can turn a smaller delete into this one."""
    if confirm != user_id:
        raise ServeError(
            "deleting a user must name it twice: add ?confirm=<user_id>"
            if confirm is None
            else f"confirm={confirm!r} does not name the user {user_id!r} of the path",
            field="query.confirm",
        )
    if not svc.store.delete_user(who.tenant_id, user_id):
        raise NotFoundError(f"unknown user {user_id!r}", field="path.user_id")
    svc.ranker.forget_user(who.tenant_id, user_id)
    return DeletedOut(deleted=1)
