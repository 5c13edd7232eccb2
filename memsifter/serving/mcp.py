"""The memory as Model Context Protocol tools (the official ``mcp`` SDK, 2.x): ``recall``,
``remember``, ``add_fact``, ``facts`` and ``forget``, each acting for one tenant key and one user.

Two transports serve the same tools (docs/mcp.md):

* **stdio** (``memsifter mcp --user U``): one process per assistant, the key read from an
  environment variable and authenticated once at start, the user fixed for the process.
* **Streamable HTTP** at ``/mcp`` on the service (``create_app``): every request names its key
  (``Authorization: Bearer KEY``, checked by the same dependency as every route, rate limit
  included) and its user (``X-MemSifter-User``), so a refusal there is the service's JSON error
  (401, 422, 429, 503) before the MCP layer sees the request. The transport is stateless with JSON
  responses: no session lives in one worker's memory, so ``--workers N`` and replicas behind a
  load balancer serve MCP clients like any other.

The tools are thin, like the routes: they validate with the routes' request models and checks
(``RecallIn``, ``IngestTurnsIn``, ``FactIn``, ``check_question`` ...) and call the same
``MemoryService`` and ``Store`` methods, so limits and validation cannot drift apart. A refusal
(``ServeError``, a pydantic ``ValidationError``, an unknown argument, the database down) comes back
as a tool result with ``isError`` and a message naming the argument at fault; the server goes on.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager, redirect_stdout
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import anyio
from fastapi.security import HTTPBearer
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import ToolAnnotations
from pydantic import Field, TypeAdapter, ValidationError
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from memsifter.serving.deps import (
    Services,
    check_question,
    check_sessions,
    check_top_k,
    check_turns,
    principal,
    to_session,
    to_turn,
)
from memsifter.serving.errors import NotFoundError, ServeError, UnavailableError
from memsifter.serving.facts import rank_facts
from memsifter.serving.routes.facts import fact_out, store_fact, visible_fact
from memsifter.serving.routes.recall import recall_hits
from memsifter.serving.routes.sessions import ingest_out
from memsifter.serving.schemas import (
    FACT_ID_PATTERN,
    USER_ID_PATTERN,
    DeletedOut,
    FactAddedOut,
    FactIn,
    FactListOut,
    FactType,
    IngestOut,
    IngestSessionsIn,
    IngestTurnsIn,
    RecallHit,
    RecallIn,
    Response,
    SessionIn,
    TurnIn,
)
from memsifter.serving.store import Store
from memsifter.serving.store.records import Principal, utcnow

logger = logging.getLogger("memsifter.serving.mcp")

USER_HEADER = "X-MemSifter-User"
DEFAULT_KEY_ENV = "MEMSIFTER_API_KEY"
# Where the /mcp endpoint leaves the authenticated caller for the tools: the SDK hands each tool
# the Starlette request of the HTTP exchange that carried the call, built on this scope.
_SCOPE_KEY = "memsifter.mcp.caller"
_INSTRUCTIONS = (
    "Long-term memory of one user. Call `recall` with the user's question to get the stored "
    "conversation pages most likely to answer it; `remember` stores new turns or a session; "
    "`add_fact`, `facts` and `forget` keep short durable facts (preferences, entities, events, "
    "tasks). Every text comes back as plain text exactly as stored."
)


@dataclass(frozen=True)
class Caller:
    """Whom a tool call acts for: the key's principal and the user whose memory it is."""

    principal: Principal
    user: str


CallerResolver = Callable[[Context], Caller]


class RecallToolOut(Response):
    """``recall``'s result: the ranked pages, best first, and the ranker that ordered them."""

    ranker: str
    hits: list[RecallHit]


# ------------------------------------------------------------------------------- error mapping

# The routes name fields as HTTP paths (body.sessions[0].turns[2].text); a tool's caller knows
# argument names. ``remember`` takes one ``session`` where the route takes a list.
_FIELD_NAMES = (
    ("body.sessions[0]", "session"),
    ("sessions[0]", "session"),
    ("session[0]", "session"),
    ("path.user_id", "user"),
    ("path.fact_id", "fact_id"),
    ("header.Authorization", "key"),
    ("body.", ""),
)


def _argument(field: str) -> str:
    for http, name in _FIELD_NAMES:
        if field.startswith(http):
            return name + field[len(http) :]
    return field


def _loc(loc: tuple[Any, ...] | list[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return _argument(out or "arguments")


def _validation_message(e: ValidationError) -> str:
    errors = e.errors()
    shown = "; ".join(f"{_loc(err['loc'])}: {err['msg']}" for err in errors[:5])
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return f"invalid arguments: {shown}{more}"


@contextmanager
def _tool_errors() -> Iterator[None]:
    """Refusals become ``ToolError``: the SDK passes its text to the client as an ``isError``
    result, while any other exception reaches the client only as "Error executing tool", its
    text kept in the server log (as a route's unexpected error is a bare 500)."""
    try:
        yield
    except ServeError as e:
        where = _argument(e.field) if e.field else None
        raise ToolError(f"{where}: {e.message}" if where else e.message) from e
    except ValidationError as e:
        raise ToolError(_validation_message(e)) from e
    except (OperationalError, InterfaceError, PoolTimeoutError) as e:
        logger.error("database unavailable: %s", e)
        raise ToolError("the database is unavailable; retry shortly") from e


def _raw_arguments(ctx: Context) -> Mapping[str, Any]:
    """The arguments as the client sent them (the SDK's argument model drops unknown keys)."""
    try:
        params = ctx.request_context.params or {}
    except ValueError:  # called in-process, outside any request
        return {}
    arguments = params.get("arguments")
    return arguments if isinstance(arguments, Mapping) else {}


def _check_arguments(ctx: Context, tool: Callable[..., Any]) -> Mapping[str, Any]:
    """Like the API's request bodies, a misspelt argument is refused by name rather than
    silently ignored (``topk`` would otherwise recall with the default)."""
    raw = _raw_arguments(ctx)
    known = [p for p in inspect.signature(tool).parameters if p != "ctx"]
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ServeError(
            f"unknown argument{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
            f"{tool.__name__} takes {', '.join(known) or 'no arguments'}",
            field=unknown[0],
            status=422,
        )
    return raw


_FACT_ID = TypeAdapter(Annotated[str, Field(pattern=FACT_ID_PATTERN)])


# --------------------------------------------------------------------------------------- tools


def build_server(services: Services, caller: CallerResolver) -> MCPServer:
    """The MCP server with the five tools; ``caller`` tells each call whom it acts for."""
    root = logging.getLogger()
    # MCPServer() calls logging.basicConfig, which installs a handler on a root logger that has
    # none: a library user's (or the service's) own logging setup must stay theirs.
    guard = None if root.handlers else logging.NullHandler()
    if guard is not None:
        root.addHandler(guard)
    try:
        server: MCPServer = MCPServer(
            "memsifter", title="MemSifter memory", instructions=_INSTRUCTIONS, version="0.1.0"
        )
    finally:
        if guard is not None:
            root.removeHandler(guard)
    _add_tools(server, services, caller)
    return server


def _add_tools(server: MCPServer, services: Services, caller: CallerResolver) -> None:
    """Each tool resolves its caller first (on stdio that takes a rate-limit token, as the
    HTTP endpoint does per request), then checks its arguments as the matching route does."""
    memory, store, limits = services.memory, services.store, services.config.limits

    @server.tool(annotations=ToolAnnotations(title="Recall memory", read_only_hint=True))
    def recall(
        ctx: Context,
        question: Annotated[str, Field(description="what the user asked, in their words")],
        top_k: Annotated[int, Field(description="how many pages to return")] = 5,
        question_date: Annotated[
            str | None, Field(description="when the question is asked, e.g. '2024-05-01'")
        ] = None,
    ) -> RecallToolOut:
        """The user's stored conversation pages most relevant to a question, best first, with
        their scores, keywords, dates and text."""
        with _tool_errors():
            me = caller(ctx)
            _check_arguments(ctx, recall)
            body = RecallIn(question=question, top_k=top_k, question_date=question_date)
            check_question(body.question, limits, "question")
            check_top_k(body.top_k, limits, "top_k")
            result = memory.recall(
                me.principal,
                me.user,
                body.question,
                top_k=body.top_k,
                question_date=body.question_date,
            )
            return RecallToolOut(
                ranker=result.outcome.ranker,
                hits=recall_hits(result),
            )

    @server.tool(annotations=ToolAnnotations(title="Remember conversation"))
    def remember(
        ctx: Context,
        turns: Annotated[
            list[TurnIn] | None,
            Field(description="a raw turn stream, cut into sessions on time gaps and topic shifts"),
        ] = None,
        session: Annotated[
            SessionIn | None, Field(description="one whole session with its own id (and date)")
        ] = None,
        replace: Annotated[
            bool, Field(description="session only: replace a stored session of the same id")
        ] = False,
        session_prefix: Annotated[
            str | None, Field(description="turns only: prefix of the new session ids")
        ] = None,
        max_gap_hours: Annotated[
            float, Field(description="turns only: a longer gap starts a new session")
        ] = 4.0,
        topic_threshold: Annotated[
            float | None, Field(description="turns only: topic-shift threshold (null: off)")
        ] = 0.05,
    ) -> IngestOut:
        """Store conversation in the user's memory: either `turns` (segmented into sessions) or
        one `session`. Each session is cut into pages, bookmarked and indexed for `recall`."""
        with _tool_errors():
            me = caller(ctx)
            raw = _check_arguments(ctx, remember)
            if (turns is None) == (session is None):
                raise ServeError("give either turns or session, not both or neither", status=422)
            if session is not None:
                stray = sorted({"session_prefix", "max_gap_hours", "topic_threshold"} & set(raw))
                if stray:
                    raise ServeError("applies to turns only, not to a session", field=stray[0])
                body = IngestSessionsIn(sessions=[session], replace=replace)
                check_sessions(body.sessions, limits, "session")
                records = memory.ingest_sessions(
                    me.principal,
                    me.user,
                    [to_session(s) for s in body.sessions],
                    replace=body.replace,
                )
                return ingest_out(me.user, records)
            if "replace" in raw:
                raise ServeError("applies to a session only, not to turns", field="replace")
            turn_body = IngestTurnsIn(
                turns=turns or [],
                session_prefix=session_prefix,
                max_gap_hours=max_gap_hours,
                topic_threshold=topic_threshold,
            )
            check_turns(turn_body.turns, limits, "turns", limits.max_turns_per_request)
            records = memory.ingest_turns(
                me.principal,
                me.user,
                [to_turn(t) for t in turn_body.turns],
                prefix=turn_body.session_prefix,
                max_gap=timedelta(hours=turn_body.max_gap_hours),
                topic_threshold=turn_body.topic_threshold,
            )
            return ingest_out(me.user, records)

    @server.tool(annotations=ToolAnnotations(title="Add a fact", destructive_hint=False))
    def add_fact(
        ctx: Context,
        type: Annotated[FactType, Field(description="entity | preference | event | task")],
        subject: Annotated[
            str, Field(description="what the fact is about; a new fact supersedes the old one")
        ],
        text: Annotated[str, Field(description="the fact, one sentence")],
        importance: Annotated[float, Field(description="0..1; ranks facts in listings")] = 0.5,
        expires_at: Annotated[
            datetime | None, Field(description="RFC 3339 time after which the fact is gone")
        ] = None,
        ttl_seconds: Annotated[
            float | None, Field(description="or: forget the fact this many seconds from now")
        ] = None,
    ) -> FactAddedOut:
        """Remember a durable fact about the user. A live fact with the same subject is
        superseded (kept as history, no longer listed); the result names those."""
        with _tool_errors():
            me = caller(ctx)
            _check_arguments(ctx, add_fact)
            if ttl_seconds is not None:
                if expires_at is not None:
                    raise ServeError(
                        "give expires_at or ttl_seconds, not both", field="ttl_seconds", status=422
                    )
                if not 0 < ttl_seconds <= 1e10:  # NaN and infinity fail this too
                    raise ServeError(
                        "must be over 0 and at most 1e10 (about 300 years)",
                        field="ttl_seconds",
                        status=422,
                    )
                expires_at = utcnow() + timedelta(seconds=ttl_seconds)
            body = FactIn(
                type=type, subject=subject, text=text, importance=importance, expires_at=expires_at
            )
            return store_fact(store, me.principal, me.user, body, "")

    @server.tool(annotations=ToolAnnotations(title="List facts", read_only_hint=True))
    def facts(ctx: Context) -> FactListOut:
        """Every live fact about the user that this key may see, by importance times time
        decay."""
        with _tool_errors():
            me = caller(ctx)
            _check_arguments(ctx, facts)
            now = utcnow()
            listed = store.list_facts(
                me.principal.tenant_id,
                me.user,
                types=me.principal.fact_types,
                now=now,
                limit=limits.max_facts_listed,
            )
            ranked = rank_facts(listed, now, None, services.config.facts.decay_per_day)
            return FactListOut(user_id=me.user, facts=[fact_out(r.fact, r.score) for r in ranked])

    @server.tool(annotations=ToolAnnotations(title="Forget a fact", destructive_hint=True))
    def forget(
        ctx: Context,
        fact_id: Annotated[str, Field(description="the fact_id that add_fact or facts gave")],
    ) -> DeletedOut:
        """Forget a fact for good: it and the versions it superseded are deleted."""
        with _tool_errors():
            me = caller(ctx)
            _check_arguments(ctx, forget)
            try:
                _FACT_ID.validate_python(fact_id)
            except ValidationError as e:
                raise ServeError(
                    f"{fact_id!r} is not a fact id: {e.errors()[0]['msg']}",
                    field="fact_id",
                    status=422,
                ) from e
            visible_fact(store, me.principal, me.user, fact_id, "fact_id")
            deleted = store.forget_fact(
                me.principal.tenant_id, me.user, fact_id, visible_types=me.principal.fact_types
            )
            if not deleted:  # forgotten by a concurrent call since the check above
                raise NotFoundError(f"unknown fact {fact_id!r}", field="fact_id")
            return DeletedOut(deleted=deleted)


def check_user(user: str, field: str) -> str:
    """A user id as the routes' path parameter accepts it (``USER_ID_PATTERN``)."""
    if not re.fullmatch(USER_ID_PATTERN, user):
        raise ServeError(
            f"{user!r} is not a user id: 1-128 characters, letters, digits and ._:@- , "
            "starting with a letter or digit",
            field=field,
            status=422,
        )
    return user


# ----------------------------------------------------------------------------- Streamable HTTP


def _caller_from_request(ctx: Context) -> Caller:
    request = ctx.request_context.request
    scope = getattr(request, "scope", None)
    found = scope.get(_SCOPE_KEY) if isinstance(scope, Mapping) else None
    if not isinstance(found, Caller):  # only reachable if the endpoint below were bypassed
        raise ServeError(
            "this call was not authenticated", field="header.Authorization", status=401
        )
    return found


# The scheme is parsed exactly as the routes' HTTPBearer does; the OpenAPI names do not matter.
_bearer = HTTPBearer(auto_error=False)


class McpEndpoint:
    """The ASGI endpoint at ``/mcp``: authenticates the key (the routes' ``principal``
    dependency: cache, store, rate limit), reads the user header, then hands the request to the
    SDK's Streamable HTTP session manager with the caller on its scope.

    Refusals are raised as ``ServeError``, so the app's handlers answer them in the service's
    JSON error shape. ``running()`` belongs in the app's lifespan: a session manager runs once,
    so each lifespan (a test client may open several) gets a fresh one."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.server = build_server(services, _caller_from_request)
        self._manager: StreamableHTTPSessionManager | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        self.server.streamable_http_app(
            # Stateless with JSON answers: every POST stands alone (its key checked, no session
            # held in this worker), which is what several workers or replicas need.
            stateless_http=True,
            json_response=True,
            max_request_body_size=self.services.config.limits.max_body_bytes,
            # The SDK's DNS-rebinding guard (allowed Host/Origin lists) is for unauthenticated
            # servers on localhost; this endpoint wants a key, and a deployment's host names
            # are not known here.
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        manager = self.server.session_manager
        async with manager.run():
            self._manager = manager
            try:
                yield
            finally:
                self._manager = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        who = await principal(request, await _bearer(request))
        user = request.headers.get(USER_HEADER)
        if not user:
            raise ServeError(
                f"missing user: send '{USER_HEADER}: <user id>'",
                field=f"header.{USER_HEADER}",
                status=422,
            )
        check_user(user, f"header.{USER_HEADER}")
        manager = self._manager
        if manager is None:
            raise UnavailableError(
                "the MCP transport is not running (the app's lifespan has not started)",
                field="path",
            )
        await manager.handle_request({**scope, _SCOPE_KEY: Caller(who, user)}, receive, send)


# --------------------------------------------------------------------------------------- stdio


def require_key(key: str | None, key_env: str) -> str:
    if not key:
        raise ServeError(
            f"no API key: ${key_env} is not set (put a tenant key there, or name another "
            "variable with --key-env)",
            field=key_env,
            status=401,
        )
    return key


def authenticate(store: Store, key: str, key_env: str) -> Principal:
    """The principal of the key in ``$key_env``, or a ``ServeError`` saying it has none."""
    who = store.authenticate(key)
    if who is None:
        raise ServeError(
            f"the key in ${key_env} is not a valid API key for this database (unknown or revoked)",
            field=key_env,
            status=401,
        )
    return who


def run_stdio(
    config_path: str | Path | None,
    *,
    user: str,
    key_env: str = DEFAULT_KEY_ENV,
    log_level: str = "warning",
) -> None:
    """``memsifter mcp``: serve the tools over stdin/stdout for one key and one user until the
    client closes stdin. Logs go to stderr; stdout carries only the protocol."""
    # Imported here: the app module imports this one to mount /mcp.
    from memsifter.serving.app import build_services, close_services
    from memsifter.serving.config import load_serve_config
    from memsifter.serving.logs import configure_logging

    # Both refused before any database or model is opened.
    check_user(user, "--user")
    key = require_key(os.environ.get(key_env), key_env)
    configure_logging(log_level)
    config = load_serve_config(config_path)
    # Anything a library prints while the store and ranker open must not reach the protocol.
    with redirect_stdout(sys.stderr):
        services = build_services(config)
    try:
        who = authenticate(services.store, key, key_env)
        fixed = Caller(who, user)

        def stdio_caller(_ctx: Context) -> Caller:
            # One process, one key: the tenant's rate limit applies per tool call here, as it
            # applies per request on HTTP.
            if services.limiter is not None:
                services.limiter.check(who.tenant_id)
            return fixed

        server = build_server(services, stdio_caller)
        logger.info("serving MCP on stdio", extra={"tenant": who.tenant_id, "user": user})
        anyio.run(server.run_stdio_async)
    finally:
        close_services(services)
