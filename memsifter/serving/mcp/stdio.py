"""``memsifter mcp``: the tools over stdin/stdout for one key and one user.

The process opens the serve config's database (an existing memory unless told to create one),
re-checks its key at every call, and bounds its lines both ways, as the HTTP service bounds
bodies: it writes no reply line over ``MAX_STDIO_LINE_BYTES`` (``LineLimit``) and holds no
request line over ``limits.max_body_bytes`` (``RequestLines``); either is answered with a
JSON-RPC error that names the size and the limit, and the session goes on."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Protocol

import anyio
import mcp_types as types
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from sqlalchemy import create_engine, inspect
from sqlalchemy.engine import make_url
from sqlalchemy.exc import InterfaceError, OperationalError

from memsifter.serving.config import DEFAULT_CONFIG, load_serve_config
from memsifter.serving.deps import Services
from memsifter.serving.errors import ServeError
from memsifter.serving.logs import configure_logging
from memsifter.serving.mcp.tools import Caller, CallerResolver, Context, build_server, check_user
from memsifter.serving.services import build_services, close_services
from memsifter.serving.store import Store, hash_key
from memsifter.serving.store.records import Principal

logger = logging.getLogger("memsifter.serving.mcp")

DEFAULT_KEY_ENV = "MEMSIFTER_API_KEY"
DB_URL_ENV = "MEMSIFTER_SERVE_DB_URL"  # load_serve_config's override of db_url
# The TypeScript SDK's stdio client ends the session on a line over 10 MiB, and a line of
# megabytes is no answer an assistant can use: a reply over this is refused by name instead.
MAX_STDIO_LINE_BYTES = 1 << 20
# How much of an over-long request line is read at a time while it is skipped.
_SKIP_CHUNK = 1 << 16


class _Sender(Protocol):
    async def send(self, item: SessionMessage, /) -> None: ...
    async def aclose(self) -> None: ...


class LineLimit:
    """The stdio write stream, with no line over ``limit`` bytes: a reply that would be longer
    is replaced by a JSON-RPC error naming its size and the limit (for the same request id),
    so the client hears why instead of losing the session."""

    def __init__(self, inner: _Sender, limit: int = MAX_STDIO_LINE_BYTES) -> None:
        self.inner = inner
        self.limit = limit

    async def send(self, item: SessionMessage, /) -> None:
        message = item.message
        # As the SDK's writer puts it on the line (plus its newline).
        size = len(message.model_dump_json(by_alias=True, exclude_unset=True).encode()) + 1
        if size > self.limit:
            if not isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
                what = getattr(message, "method", type(message).__name__)
                logger.error("dropped a %d-byte %s over the stdio line limit", size, what)
                return
            rid = message.id if len(json.dumps(message.id)) <= 1000 else None
            text = (
                f"the reply is {size:,} bytes, over the {self.limit:,} one stdio line may carry; "
                "ask for less (a smaller top_k, shorter texts)"
            )
            error = types.ErrorData(code=types.INTERNAL_ERROR, message=text)
            logger.warning("%s", text)
            item = SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=rid, error=error))
        await self.inner.send(item)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> LineLimit:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class RequestLines:
    """stdin for the SDK's ``stdio_server``, which only iterates it: its lines as text (decoded
    as the SDK decodes them), and never more than ``limit`` bytes of one held in memory.

    The SDK's own reader keeps reading a line until its newline, however long. Here a line over
    ``limit`` bytes is read on to its end ``_SKIP_CHUNK`` bytes at a time and dropped, and it
    is answered on the write stream named by ``answer_on`` with a JSON-RPC error (``-32600``,
    ``id`` null: the id is somewhere in what was not parsed) naming its size and the limit; the
    lines after it are read as usual."""

    def __init__(self, wire: BinaryIO, limit: int, setting: str = "limits.max_body_bytes") -> None:
        self.wire = wire
        self.limit = limit
        self.setting = setting  # named in the error, so the client knows what to raise
        self._replies: _Sender | None = None
        # The transport reads its first line before it hands out the write stream.
        self._ready = anyio.Event()

    def answer_on(self, replies: _Sender) -> None:
        self._replies = replies
        self._ready.set()

    def __aiter__(self) -> RequestLines:
        return self

    async def __anext__(self) -> str:
        while True:
            line = await anyio.to_thread.run_sync(self.wire.readline, self.limit + 1)
            if not line:
                raise StopAsyncIteration
            if line.endswith(b"\n") or len(line) <= self.limit:
                return line.decode("utf-8", errors="replace")
            await self._refuse(len(line) + await self._skip_rest())

    async def _skip_rest(self) -> int:
        """Read the rest of the line and drop it; its length, without the newline."""
        skipped = 0
        while chunk := await anyio.to_thread.run_sync(self.wire.readline, _SKIP_CHUNK):
            if chunk.endswith(b"\n"):
                return skipped + len(chunk) - 1
            skipped += len(chunk)
        return skipped

    async def _refuse(self, size: int) -> None:
        text = (
            f"the request line has {size:,} bytes; the limit is {self.limit:,} ({self.setting}): "
            "send less (fewer turns, shorter texts)"
        )
        logger.warning("%s", text)
        await self._ready.wait()
        assert self._replies is not None  # set with _ready
        error = types.ErrorData(code=types.INVALID_REQUEST, message=text)
        await self._replies.send(
            SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=None, error=error))
        )


@contextmanager
def _claimed_stdin() -> Iterator[BinaryIO]:
    """The protocol's stdin as a private copy of fd 0, with fd 0 itself on the null device
    until the block ends, as the SDK's ``stdio_server`` arranges for a stdin it reads itself:
    a library or child process that reads stdin meanwhile gets EOF, not the client's bytes."""
    wire = os.dup(0)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
    finally:
        os.close(null)
    try:
        # Never closed (closefd=False, as the SDK does): a worker thread may still be blocked
        # reading it when the transport ends, and a number closed under it could be reused.
        yield os.fdopen(wire, "rb", closefd=False)
    finally:
        os.dup2(wire, 0)


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


def stdio_caller(services: Services, key: str, key_env: str, user: str) -> CallerResolver:
    """Each call re-checks the process's key, as each HTTP request does (``deps.principal``):
    from the ``auth_cache_s`` cache when it was checked that recently, else in the store. A key
    revoked while the process runs is refused from then on with the HTTP service's error."""
    digest = hash_key(key)

    def resolve(_ctx: Context) -> Caller:
        who = services.principals.get(digest)
        if who is None:
            who = services.store.authenticate(key)
            if who is None:
                raise ServeError("invalid API key", field=f"${key_env}", status=401)
            services.principals.put(digest, who)
        if services.limiter is not None:
            services.limiter.check(who.tenant_id)
        return Caller(who, user)

    return resolve


def missing_memory(db_url: str) -> str | None:
    """Why ``db_url`` holds no memory yet, or None when it does: a SQLite file that does not
    exist, or a database without the store's tables. Opening the store would create either,
    which is right for the service and wrong for a client that meant an existing memory."""
    url = make_url(db_url)
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        path = Path(url.database)
        if not path.is_file():
            return f"there is no database file {path.resolve()}"
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            if not inspect(conn).has_table("api_keys"):
                return f"the database {url.render_as_string(hide_password=True)} has no memory"
    except (OperationalError, InterfaceError) as e:
        raise ServeError(
            f"cannot open the database {url.render_as_string(hide_password=True)}: {e.orig}",
            field="db_url",
            status=503,
        ) from e
    finally:
        engine.dispose()
    return None


def run_stdio(
    config_path: str | Path | None,
    *,
    user: str,
    key_env: str = DEFAULT_KEY_ENV,
    log_level: str = "warning",
    create_db: bool = False,
) -> None:
    """``memsifter mcp``: serve the tools over stdin/stdout for one key and one user until the
    client closes stdin. Logs go to stderr; stdout carries only the protocol.

    The database is the serve config's, as for ``memsifter serve`` (``$MEMSIFTER_SERVE_DB_URL``
    overrides ``db_url``). It must already hold a memory unless ``create_db``: a relative SQLite
    path resolves against the working directory, which an assistant picks, so the default
    config would otherwise start an empty memory wherever the client happened to launch it."""
    # All refused before any database or model is opened.
    check_user(user, "--user")
    key = require_key(os.environ.get(key_env), key_env)
    configure_logging(log_level)
    config = load_serve_config(config_path)
    if not create_db:
        why = missing_memory(config.db_url)
        if why is not None:
            origin = (
                f"${DB_URL_ENV}"
                if os.environ.get(DB_URL_ENV)
                else f"db_url in {config_path or DEFAULT_CONFIG}"
            )
            raise ServeError(
                f"no memory to serve: {why} (from {origin}; a relative SQLite path is relative "
                f"to the working directory, {Path.cwd()}). Point ${DB_URL_ENV} or --config at "
                "the database `memsifter serve` uses, or pass --create-db to start an empty one",
                field=DB_URL_ENV,
                status=404,
            )
    # Anything a library prints while the store and ranker open must not reach the protocol.
    with redirect_stdout(sys.stderr):
        services = build_services(config)
    try:
        who = authenticate(services.store, key, key_env)
        server = build_server(services, stdio_caller(services, key, key_env, user))
        logger.info("serving MCP on stdio", extra={"tenant": who.tenant_id, "user": user})

        async def serve() -> None:
            with _claimed_stdin() as wire:
                lines = RequestLines(wire, config.limits.max_body_bytes)
                # The SDK only iterates its stdin: bounded lines serve as well as a file.
                transport = stdio_server(stdin=lines)  # type: ignore[arg-type]
                async with transport as (read_stream, write_stream):
                    replies = LineLimit(write_stream)
                    lines.answer_on(replies)
                    await server.run(read_stream, replies, server.create_initialization_options())

        anyio.run(serve)
    finally:
        close_services(services)
