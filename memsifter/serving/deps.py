"""What routes share: the app's services, the caller's identity, path parameters, and the checks
of deployment limits that pydantic cannot know about."""

from __future__ import annotations

import functools
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, ParamSpec, TypeVar

from fastapi import Depends, Path, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from memsifter.data.types import Session, Turn
from memsifter.serving.config import LimitSettings, ServeConfig
from memsifter.serving.errors import ServeError
from memsifter.serving.logs import tenant_var
from memsifter.serving.memory import MemoryService, session_from_input
from memsifter.serving.metrics import Metrics
from memsifter.serving.ranking import ServiceRanker
from memsifter.serving.ratelimit import RateLimiter
from memsifter.serving.schemas import (
    SESSION_ID_MAX_CHARS,
    SESSION_ID_PATTERN,
    USER_ID_PATTERN,
    SessionIn,
    TurnIn,
)
from memsifter.serving.store import PrincipalCache, Store, hash_key
from memsifter.serving.store.records import Principal

P = ParamSpec("P")
R = TypeVar("R")


@dataclass
class Services:
    config: ServeConfig
    store: Store
    ranker: ServiceRanker
    memory: MemoryService
    metrics: Metrics
    limiter: RateLimiter | None = None
    principals: PrincipalCache = field(default_factory=lambda: PrincipalCache(0.0))


async def services(request: Request) -> Services:  # async: a def dependency costs a thread hop
    return request.app.state.services


_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="TenantKey",
    description="A tenant API key: `Authorization: Bearer KEY`",
)


async def principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    if credentials is None or not credentials.credentials:
        raise ServeError(
            "missing API key: send 'Authorization: Bearer <key>'",
            field="header.Authorization",
            status=401,
        )
    svc: Services = request.app.state.services
    digest = hash_key(credentials.credentials)
    who = svc.principals.get(digest)
    if who is None:
        who = await run_in_threadpool(svc.store.authenticate, credentials.credentials)
        if who is None:
            raise ServeError("invalid API key", field="header.Authorization", status=401)
        svc.principals.put(digest, who)
    tenant_var.set(who.tenant_id)
    if svc.limiter is not None:
        svc.limiter.check(who.tenant_id)
    return who


def in_thread(endpoint: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """A blocking endpoint (database, ranker) run in the threadpool in one hop.

    FastAPI runs a ``def`` endpoint in the threadpool, then validates its response in a second
    hop; on 2 cores each hop (a thread handoff, then the GIL passed back and forth) cost about
    a millisecond of CPU, as much as a recall's ranking. Wrapped, the endpoint is a coroutine
    to FastAPI, which reads the parameters from the wrapped function's signature: the body
    runs in one hop and the response is validated on the event loop."""

    @functools.wraps(endpoint)
    async def run(*args: P.args, **kwargs: P.kwargs) -> R:
        return await run_in_threadpool(endpoint, *args, **kwargs)

    return run


Svc = Annotated[Services, Depends(services)]
Who = Annotated[Principal, Depends(principal)]
UserId = Annotated[str, Path(pattern=USER_ID_PATTERN, description="the app's id of the user")]
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


async def session_id(
    request: Request,
    session_id: Annotated[str, Path(pattern=SESSION_ID_PATTERN, max_length=SESSION_ID_MAX_CHARS)],
) -> str:
    """The ``{session_id:path}`` parameter, refused when the raw path holds a control character.

    Starlette's path routes match with ``$``, which also matches before a final newline, and
    their ``.*`` stops at one: ``/sessions/s1%0A`` would act on ``s1``. The id itself passes
    its pattern, so the raw path is checked."""
    bad = _CONTROL.search(request.scope.get("path", ""))
    if bad is not None:
        raise ServeError(
            f"the path contains a control character (U+{ord(bad.group()):04X}); session ids "
            "never do",
            field="path.session_id",
            status=422,
        )
    return session_id


SessionId = Annotated[str, Depends(session_id)]


def to_turn(t: TurnIn) -> Turn:
    return Turn(speaker=t.speaker, text=t.text, turn_id=t.turn_id, timestamp=t.timestamp)


def to_session(s: SessionIn) -> Session:
    return session_from_input(s.id, [to_turn(t) for t in s.turns], s.date, s.date_text)


def check_question(question: str, limits: LimitSettings, field: str = "body.question") -> None:
    if len(question) > limits.max_question_chars:
        raise ServeError(
            f"question has {len(question)} characters; the limit is {limits.max_question_chars}",
            field=field,
            status=413,
        )


def check_top_k(k: int | None, limits: LimitSettings, field: str) -> None:
    if k is not None and k > limits.max_top_k:
        raise ServeError(f"{k} is over the limit of {limits.max_top_k}", field=field, status=422)


def check_turns(turns: Sequence[TurnIn], limits: LimitSettings, field: str, max_turns: int) -> None:
    if len(turns) > max_turns:
        raise ServeError(f"{len(turns)} turns; the limit is {max_turns}", field=field, status=413)
    seen: set[str] = set()
    for j, t in enumerate(turns):
        if len(t.text) > limits.max_text_chars:
            raise ServeError(
                f"text has {len(t.text)} characters; the limit is {limits.max_text_chars}",
                field=f"{field}[{j}].text",
                status=413,
            )
        if t.turn_id is not None:
            if t.turn_id in seen:
                raise ServeError(
                    f"turn id {t.turn_id!r} repeats", field=f"{field}[{j}].turn_id", status=422
                )
            seen.add(t.turn_id)


def check_sessions(
    sessions: Sequence[SessionIn], limits: LimitSettings, field: str = "body.sessions"
) -> None:
    if len(sessions) > limits.max_sessions:
        raise ServeError(
            f"{len(sessions)} sessions; the limit is {limits.max_sessions}", field=field, status=413
        )
    seen: set[str] = set()
    for i, s in enumerate(sessions):
        if s.id in seen:
            raise ServeError(f"session id {s.id!r} repeats", field=f"{field}[{i}].id", status=422)
        seen.add(s.id)
        check_turns(s.turns, limits, f"{field}[{i}].turns", limits.max_turns_per_session)
