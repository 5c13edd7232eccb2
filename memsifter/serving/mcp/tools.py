"""The five tools (``recall``, ``remember``, ``add_fact``, ``facts``, ``forget``) on the SDK's
low-level ``Server``, and the error replies both transports share.

Each tool is an argument model (the contract, and the input schema it advertises), a result
model, and an ``act`` that does the route's checks and makes the route's service call. A call's
arguments are validated here, once: unknown names first (refused by name), then the model. The
SDK's decorator layer would validate before the tool runs, coercing ``"3"`` to a ``top_k`` and
answering a bad call with pydantic's whole report (29.6 MB for 80,000 bad turns); here a
refusal is an ``isError`` result whose text is the service's error body (``errors.error_body``).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.context import CallNext, HandlerResult
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ValidationError
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from memsifter.serving.deps import (
    Services,
    check_question,
    check_sessions,
    check_top_k,
    check_turns,
    to_session,
    to_turn,
)
from memsifter.serving.errors import (
    MAX_MESSAGE_CHARS,
    NotFoundError,
    ServeError,
    clip,
    error_body,
    field_path,
    summary,
)
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
    IngestOut,
    IngestSessionsIn,
    IngestTurnsIn,
    RecallHit,
    RecallIn,
    Request,
    Response,
    SessionIn,
    TurnIn,
)
from memsifter.serving.store.records import Principal, utcnow

logger = logging.getLogger("memsifter.serving.mcp")

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


Context = ServerRequestContext[Any, Any]
# Resolves a call's caller, or raises a ServeError (401, 429). Runs in the tool's worker
# thread: on stdio it may read the database.
CallerResolver = Callable[[Context], Caller]


# ----------------------------------------------------------------------- arguments and results


class RecallToolOut(Response):
    """``recall``'s result: the ranked pages, best first, and the ranker that ordered them."""

    ranker: str
    hits: list[RecallHit]


def _default(model: type[BaseModel], name: str) -> Any:
    return model.model_fields[name].default


class RememberArgs(Request):
    """``remember``'s arguments: ``IngestTurnsIn``'s, or one ``SessionIn`` with
    ``IngestSessionsIn``'s ``replace``. The given ones are then checked by those route models
    (their patterns and ranges); the defaults shown here are theirs."""

    turns: list[TurnIn] | None = None
    session: SessionIn | None = None
    replace: bool = _default(IngestSessionsIn, "replace")
    session_prefix: str | None = _default(IngestTurnsIn, "session_prefix")
    max_gap_hours: float = _default(IngestTurnsIn, "max_gap_hours")
    topic_threshold: float | None = _default(IngestTurnsIn, "topic_threshold")


class AddFactArgs(FactIn):
    ttl_seconds: float | None = None


class FactsArgs(Request):
    pass


class ForgetArgs(Request):
    fact_id: str


@dataclass(frozen=True)
class _Tool:
    """One tool: its argument model (the contract and the advertised input schema), its result
    model, and ``act``, which does the work for a caller with validated arguments."""

    name: str
    title: str
    description: str
    arguments: type[BaseModel]
    output: type[Response]
    act: Callable[[Caller, Any], Response]
    annotations: types.ToolAnnotations
    # Per-argument help for the schema (the route models carry none of their own).
    help: Mapping[str, str] = field(default_factory=dict)

    def input_schema(self) -> dict[str, Any]:
        schema = self.arguments.model_json_schema()
        for name, text in self.help.items():
            schema["properties"][name]["description"] = text
        return schema

    def definition(self) -> types.Tool:
        return types.Tool(
            name=self.name,
            title=self.title,
            description=self.description,
            input_schema=self.input_schema(),
            output_schema=self.output.model_json_schema(mode="serialization"),
            annotations=self.annotations,
        )


# ------------------------------------------------------------------------------- error replies

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


class UnknownArguments(Exception):
    """Arguments the tool does not take: refused by name, as the API's bodies refuse unknown
    keys, rather than ignored (``topk`` would otherwise recall with the default)."""

    def __init__(self, tool: _Tool, names: list[str]) -> None:
        self.names = names
        self.takes = ", ".join(tool.arguments.model_fields) or "no arguments"
        shown = ", ".join(clip(n, 40) for n in names[:5])
        more = f" and {len(names) - 5} more" if len(names) > 5 else ""
        s = "s" if len(names) > 1 else ""
        super().__init__(f"unknown argument{s} {shown}{more}; {tool.name} takes {self.takes}")


# What a refusal's reply holds around its text: the JSON-RPC envelope and the content block
# (about 100 bytes), and the request's id as the client sent it (ids of up to ~400 bytes fit).
_REPLY_ENVELOPE_BYTES = 512


def reply_size(body: dict[str, Any]) -> int:
    """The size of the reply that carries ``body`` as a tool result's text: the body is JSON
    inside JSON, so each quote, backslash and control character is escaped twice (a field name
    of 200 quotes is 800 bytes there, not 400) over both transports."""
    text = json.dumps(body, ensure_ascii=False)
    return len(json.dumps(text, ensure_ascii=False).encode()) + _REPLY_ENVELOPE_BYTES


def _refusal(kind: str, message: str, fields: list[tuple[str, str]]) -> types.CallToolResult:
    """An ``isError`` result whose text is the service's bounded error body (no structured
    content: a client checks that against the tool's output schema, which is the success's),
    measured as the reply carries it, so the whole reply stays within MAX_ERROR_BYTES."""
    text = json.dumps(error_body(kind, message, fields, size=reply_size), ensure_ascii=False)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


def refusal_of(e: Exception) -> types.CallToolResult:
    """The error result of a refused call, for each kind of refusal a tool can meet."""
    if isinstance(e, UnknownArguments):
        return _refusal("validation_error", str(e), [(n, "unknown argument") for n in e.names])
    if isinstance(e, ValidationError):
        errors = e.errors(include_url=False, include_context=False, include_input=False)
        fields = [(_argument(field_path(err["loc"], "arguments")), err["msg"]) for err in errors]
        return _refusal("validation_error", summary("invalid arguments", fields), fields)
    if isinstance(e, ServeError):
        where = _argument(e.field) if e.field else None
        message = f"{where}: {e.message}" if where else e.message
        return _refusal(e.kind, message, [(where, e.message)] if where else [])
    if isinstance(e, OperationalError | InterfaceError | PoolTimeoutError):
        logger.error("database unavailable: %s", e)
        return _refusal(
            "unavailable",
            "the database is unavailable; retry shortly",
            [("database", "unreachable or out of connections")],
        )
    raise TypeError(f"not a refusal: {type(e).__name__}")  # pragma: no cover


_REFUSALS = (
    UnknownArguments,
    ValidationError,
    ServeError,
    OperationalError,
    InterfaceError,
    PoolTimeoutError,
)


def _result(out: Response) -> types.CallToolResult:
    """Structured content plus the same JSON as text, markup as stored (no ``\\u003c``)."""
    data = out.model_dump(mode="json")
    text = json.dumps(data, ensure_ascii=False, indent=2)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structured_content=data
    )


async def bounded_protocol_errors(ctx: Context, call_next: CallNext) -> HandlerResult:
    """Server middleware: a JSON-RPC error the SDK raises echoes what the client sent (an
    unknown method's name is its ``data``); here its message and data are cut to the error
    body's bounds, so no reply to a bad message is larger than the error body."""
    try:
        return await call_next(ctx)
    except MCPError as e:
        data = e.error.data
        shown = data if data is None or isinstance(data, str) else json.dumps(data, default=str)
        if len(e.error.message) <= MAX_MESSAGE_CHARS and len(shown or "") <= MAX_MESSAGE_CHARS:
            raise
        bounded = None if shown is None else clip(shown, MAX_MESSAGE_CHARS)
        raise MCPError(e.error.code, clip(e.error.message, MAX_MESSAGE_CHARS), bounded) from e


def validate_arguments(tool: _Tool, arguments: Mapping[str, Any]) -> Any:
    unknown = [name for name in arguments if name not in tool.arguments.model_fields]
    if unknown:
        raise UnknownArguments(tool, unknown)
    return tool.arguments.model_validate(arguments)


# --------------------------------------------------------------------------------------- tools


def _tools(services: Services) -> list[_Tool]:
    """The five tools; each ``act`` checks its arguments as the matching route does and makes
    the same ``MemoryService`` or ``Store`` call."""
    memory, store, limits = services.memory, services.store, services.config.limits

    def recall(me: Caller, body: RecallIn) -> RecallToolOut:
        check_question(body.question, limits, "question")
        check_top_k(body.top_k, limits, "top_k")
        result = memory.recall(
            me.principal, me.user, body.question, top_k=body.top_k, question_date=body.question_date
        )
        return RecallToolOut(ranker=result.outcome.ranker, hits=recall_hits(result))

    def remember(me: Caller, args: RememberArgs) -> IngestOut:
        given = args.model_fields_set
        if (args.turns is None) == (args.session is None):
            raise ServeError("give either turns or session, not both or neither", status=422)
        if args.session is not None:
            stray = sorted({"session_prefix", "max_gap_hours", "topic_threshold"} & given)
            if stray:
                raise ServeError("applies to turns only, not to a session", field=stray[0])
            body = IngestSessionsIn(sessions=[args.session], replace=args.replace)
            check_sessions(body.sessions, limits, "session")
            records = memory.ingest_sessions(
                me.principal, me.user, [to_session(s) for s in body.sessions], replace=body.replace
            )
            return ingest_out(me.user, records)
        if "replace" in given:
            raise ServeError("applies to a session only, not to turns", field="replace")
        options = given & {"session_prefix", "max_gap_hours", "topic_threshold"}
        turns = IngestTurnsIn.model_validate(
            args.model_dump(include=options) | {"turns": args.turns}
        )
        check_turns(turns.turns, limits, "turns", limits.max_turns_per_request)
        records = memory.ingest_turns(
            me.principal,
            me.user,
            [to_turn(t) for t in turns.turns],
            prefix=turns.session_prefix,
            max_gap=timedelta(hours=turns.max_gap_hours),
            topic_threshold=turns.topic_threshold,
        )
        return ingest_out(me.user, records)

    def add_fact(me: Caller, args: AddFactArgs) -> FactAddedOut:
        expires_at = args.expires_at
        if args.ttl_seconds is not None:
            if expires_at is not None:
                raise ServeError(
                    "give expires_at or ttl_seconds, not both", field="ttl_seconds", status=422
                )
            if not 0 < args.ttl_seconds <= 1e10:  # NaN and infinity fail this too
                raise ServeError(
                    "must be over 0 and at most 1e10 (about 300 years)",
                    field="ttl_seconds",
                    status=422,
                )
            expires_at = utcnow() + timedelta(seconds=args.ttl_seconds)
        return store_fact(
            store, me.principal, me.user, args.model_copy(update={"expires_at": expires_at}), ""
        )

    def facts(me: Caller, _args: FactsArgs) -> FactListOut:
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

    def forget(me: Caller, args: ForgetArgs) -> DeletedOut:
        fact_id = args.fact_id
        if not re.fullmatch(FACT_ID_PATTERN, fact_id):
            raise ServeError(
                f"{clip(fact_id, 60)!r} is not a fact id (a lowercase UUID, as add_fact gives)",
                field="fact_id",
                status=422,
            )
        visible_fact(store, me.principal, me.user, fact_id, "fact_id")
        deleted = store.forget_fact(
            me.principal.tenant_id, me.user, fact_id, visible_types=me.principal.fact_types
        )
        if not deleted:  # forgotten by a concurrent call since the check above
            raise NotFoundError(f"unknown fact {fact_id!r}", field="fact_id")
        return DeletedOut(deleted=deleted)

    return [
        _Tool(
            "recall",
            "Recall memory",
            "The user's stored conversation pages most relevant to a question, best first, with "
            "their scores, keywords, dates and text.",
            RecallIn,
            RecallToolOut,
            recall,
            types.ToolAnnotations(title="Recall memory", read_only_hint=True),
            help={
                "question": "what the user asked, in their words",
                "top_k": f"how many pages to return (at most {limits.max_top_k})",
                "question_date": "when the question is asked, e.g. '2024-05-01'",
            },
        ),
        _Tool(
            "remember",
            "Remember conversation",
            "Store conversation in the user's memory: either `turns` (segmented into sessions) "
            "or one `session`. Each session is cut into pages, bookmarked and indexed for "
            "`recall`.",
            RememberArgs,
            IngestOut,
            remember,
            types.ToolAnnotations(title="Remember conversation"),
            help={
                "turns": "a raw turn stream, cut into sessions on time gaps and topic shifts",
                "session": "one whole session with its own id (and date)",
                "replace": "session only: replace a stored session of the same id",
                "session_prefix": "turns only: prefix of the new session ids",
                "max_gap_hours": "turns only: a longer gap starts a new session",
                "topic_threshold": "turns only: topic-shift threshold (null: off)",
            },
        ),
        _Tool(
            "add_fact",
            "Add a fact",
            "Remember a durable fact about the user. A live fact with the same subject is "
            "superseded (kept as history, no longer listed); the result names those.",
            AddFactArgs,
            FactAddedOut,
            add_fact,
            types.ToolAnnotations(title="Add a fact", destructive_hint=False),
            help={
                "type": "entity | preference | event | task",
                "subject": "what the fact is about; a new fact supersedes the old one",
                "text": "the fact, one sentence",
                "importance": "0..1; ranks facts in listings",
                "expires_at": "RFC 3339 time after which the fact is gone",
                "ttl_seconds": "or: forget the fact this many seconds from now",
            },
        ),
        _Tool(
            "facts",
            "List facts",
            "Every live fact about the user that this key may see, by importance times time decay.",
            FactsArgs,
            FactListOut,
            facts,
            types.ToolAnnotations(title="List facts", read_only_hint=True),
        ),
        _Tool(
            "forget",
            "Forget a fact",
            "Forget a fact for good: it and the versions it superseded are deleted.",
            ForgetArgs,
            DeletedOut,
            forget,
            types.ToolAnnotations(title="Forget a fact", destructive_hint=True),
            help={"fact_id": "the fact_id that add_fact or facts gave"},
        ),
    ]


def build_server(services: Services, caller: CallerResolver) -> Server[Any]:
    """The MCP server with the five tools; ``caller`` tells each call whom it acts for."""
    tools = {t.name: t for t in _tools(services)}
    listing = types.ListToolsResult(tools=[t.definition() for t in tools.values()])
    schemas = {name: t.input_schema() for name, t in tools.items()}

    def run(tool: _Tool, ctx: Context, arguments: Mapping[str, Any]) -> types.CallToolResult:
        # The caller first (its key and rate limit), as a route authenticates before it reads
        # the body; then the arguments; then the work.
        try:
            return _result(tool.act(caller(ctx), validate_arguments(tool, arguments)))
        except _REFUSALS as e:
            return refusal_of(e)
        except Exception:
            # As a route's unexpected error is a bare 500: the details go to the log only.
            logger.exception("tool %s failed", tool.name)
            return _refusal("internal_error", f"internal error in {tool.name}; see the logs", [])

    async def list_tools(_ctx: Context, _params: Any) -> types.ListToolsResult:
        return listing

    async def call_tool(ctx: Context, params: types.CallToolRequestParams) -> types.CallToolResult:
        tool = tools.get(params.name)
        if tool is None:
            message = f"unknown tool {clip(params.name, 60)!r}; the tools are {', '.join(tools)}"
            return _refusal("not_found", message, [("name", "unknown tool")])
        # Blocking work (the database, the ranker) runs off the event loop.
        return await anyio.to_thread.run_sync(run, tool, ctx, params.arguments or {})

    server: Server[Any] = Server(
        "memsifter",
        version="0.1.0",
        title="MemSifter memory",
        instructions=_INSTRUCTIONS,
        get_tool_input_schema=schemas.get,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
    server.middleware.append(bounded_protocol_errors)
    return server


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
