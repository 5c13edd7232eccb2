"""The recall service's FastAPI app: ``create_app(config, ranker=None)``.

Creating the app applies the database migrations, creates the bootstrap API keys and builds the
ranker (from the config unless one is passed, as tests do with a fake backend), so an app that
exists is ready. The lifespan only runs the expired-facts sweeper.

Errors: every refusal is ``{"error": {"type", "message", "fields": [{"field", "message"}]},
"request_id"}`` with a 4xx, and fields are paths such as ``body.sessions[0].turns[2].text``.
The request middleware refuses oversized and non-UTF-8 bodies before any parsing, refuses a
body that stalls (no bytes for ``limits.body_timeout_s``) with a 408, and turns an unexpected
exception into a bare 500 with the request id (the traceback goes to the log, never to the
client). A database that cannot be reached (SQLAlchemy's ``OperationalError``,
``InterfaceError`` or a pool timeout) is a 503 with ``Retry-After``: the client may retry, and a
load balancer can tell an outage from a bug.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException

from memsifter.serving.bookmarks import KeywordExtractor
from memsifter.serving.config import ServeConfig
from memsifter.serving.errors import ServeError, error_body, field_path, summary
from memsifter.serving.logs import request_id_var, tenant_var
from memsifter.serving.mcp import McpEndpoint
from memsifter.serving.metrics import Metrics
from memsifter.serving.ranking import ServiceRanker
from memsifter.serving.ratelimit import RateLimitedError, RateLimiter
from memsifter.serving.routes import admin, facts, ops, rank, recall, rerank, sessions
from memsifter.serving.services import build_services, close_services
from memsifter.serving.store import Store

logger = logging.getLogger("memsifter.serving")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_BODY_METHODS = {"POST", "PUT", "PATCH"}


def error_response(
    status: int,
    kind: str,
    message: str,
    fields: list[tuple[str, str]] | None = None,
) -> JSONResponse:
    body = error_body(kind, message, fields, request_id=request_id_var.get())
    return JSONResponse(body, status_code=status)


class RequestMiddleware:
    """Request id, body limits and UTF-8, access log and latency metrics, last-resort 500."""

    def __init__(
        self,
        app: Any,
        *,
        max_body_bytes: int,
        metrics: Metrics,
        body_timeout_s: float | None = None,
        body_deadline_s: float | None = None,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics
        self.body_timeout_s = body_timeout_s
        self.body_deadline_s = body_deadline_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        given = headers.get("x-request-id", "")
        rid = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        token = request_id_var.set(rid)
        tenant_token = tenant_var.set(None)
        start = time.perf_counter()
        status = {"code": 500, "started": False}
        # HEAD is answered wherever GET is: the GET response, headers only.
        head = scope.get("method") == "HEAD"
        if head:
            scope = {**scope, "method": "GET"}

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                status["started"] = True
                MutableHeaders(scope=message)["x-request-id"] = rid
            elif head and message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        try:
            refusal, receive = await self._read_body(scope, headers, receive)
            if refusal is not None:
                await refusal(scope, receive, send_with_id)
            else:
                await self.app(scope, receive, send_with_id)
        except Exception:
            logger.exception("unhandled error", extra={"path": scope.get("path")})
            if not status["started"]:
                response = error_response(500, "internal_error", "internal error; see the logs")
                await response(scope, receive, send_with_id)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            elapsed = time.perf_counter() - start
            method = scope.get("method", "")
            self.metrics.request_seconds.labels(method, template, str(status["code"])).observe(
                elapsed
            )
            logger.info(
                "request",
                extra={
                    "method": method,
                    "route": template,
                    "status": status["code"],
                    "ms": round(elapsed * 1000, 2),
                },
            )
            tenant_var.reset(tenant_token)
            request_id_var.reset(token)

    async def _read_body(
        self, scope: Scope, headers: dict[str, str], receive: Receive
    ) -> tuple[JSONResponse | None, Receive]:
        """Read the whole body (up to the limit) so size and encoding are checked before any
        parser sees it; hand the app a receive that replays it."""
        if scope.get("method") not in _BODY_METHODS:
            return None, receive
        limit = self.max_body_bytes
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return self._too_large(int(declared)), receive
        chunks: list[bytes] = []
        size = 0
        loop = asyncio.get_running_loop()
        due = None if self.body_deadline_s is None else loop.time() + self.body_deadline_s
        while True:
            # Per chunk, a stall is cut at body_timeout_s; in all, a body that trickles (a byte
            # every few seconds) is cut at the deadline: neither holds a slot forever.
            wait = self.body_timeout_s
            left = None if due is None else due - loop.time()
            late = left is not None and (wait is None or left < wait)
            try:
                message = await asyncio.wait_for(receive(), max(left, 0.0) if late else wait)
            except asyncio.TimeoutError:
                return (self._overdue(size) if late else self._stalled(size)), receive
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return self._too_large(size), receive
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if body:
            try:
                body.decode("utf-8")
            except UnicodeDecodeError as e:
                return (
                    error_response(
                        400,
                        "invalid_encoding",
                        f"the body is not valid UTF-8 (byte {e.start})",
                        [("body", "not valid UTF-8")],
                    ),
                    receive,
                )
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return None, replay

    def _stalled(self, size: int) -> JSONResponse:
        response = error_response(
            408,
            "request_timeout",
            f"the body stalled: no bytes for {self.body_timeout_s} s after {size} bytes",
            [("body", f"no bytes for {self.body_timeout_s} s")],
        )
        response.headers["Connection"] = "close"  # the rest of the body may still come
        return response

    def _overdue(self, size: int) -> JSONResponse:
        response = error_response(
            408,
            "request_timeout",
            f"the body took longer than {self.body_deadline_s} s ({size} bytes had come)",
            [("body", f"not complete within {self.body_deadline_s} s")],
        )
        response.headers["Connection"] = "close"
        return response

    def _too_large(self, size: int) -> JSONResponse:
        return error_response(
            413,
            "payload_too_large",
            f"the body has at least {size} bytes; the limit is {self.max_body_bytes}",
            [("body", f"larger than {self.max_body_bytes} bytes")],
        )


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            e = next(e for e in errors if e.get("type") == "json_invalid")
            reason = (e.get("ctx") or {}).get("error", "invalid JSON")
            where = e["loc"][-1] if len(e["loc"]) > 1 else "?"
            return error_response(
                400,
                "malformed_json",
                f"the body is not valid JSON: {reason} at character {where}",
                [("body", f"malformed JSON: {reason}")],
            )
        fields = [(field_path(e["loc"]), str(e.get("msg", "invalid"))) for e in errors]
        return error_response(422, "validation_error", summary("invalid request", fields), fields)

    @app.exception_handler(ServeError)
    async def _serve(_request: Request, exc: ServeError) -> JSONResponse:
        fields = [(exc.field, exc.message)] if exc.field else []
        response = error_response(exc.status, exc.kind, exc.message, fields)
        if exc.status == 401:
            response.headers["WWW-Authenticate"] = "Bearer"
        if exc.status == 503:
            response.headers["Retry-After"] = "1"
        if isinstance(exc, RateLimitedError):
            response.headers["Retry-After"] = RateLimiter.retry_after_header(exc.retry_after_s)
        return response

    @app.exception_handler(OperationalError)
    @app.exception_handler(InterfaceError)
    @app.exception_handler(PoolTimeoutError)
    async def _database_down(_request: Request, exc: Exception) -> JSONResponse:
        # Not a client error and not a bug of ours: the database is down, unreachable, or out
        # of connections. The cause goes to the log; the client hears "retry".
        logger.error("database unavailable: %s", exc)
        response = error_response(
            503,
            "unavailable",
            "the database is unavailable; retry shortly",
            [("database", "unreachable or out of connections")],
        )
        response.headers["Retry-After"] = "1"
        return response

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and isinstance(exc.__cause__, RecursionError):
            # FastAPI's "There was an error parsing the body": Python's JSON parser recurses
            # once per level, so `[[[…]]]` a thousand deep is valid JSON it cannot read.
            return error_response(
                400,
                "malformed_json",
                "the body's JSON is nested too deeply to parse (past the parser's recursion "
                "limit); no request of this API nests more than a few levels",
                [("body", "JSON nested too deeply")],
            )
        field = {404: "path", 405: "method"}.get(exc.status_code, "body")
        message = str(exc.detail)
        if exc.status_code == 404:
            message = f"no such endpoint: {request.url.path}"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        return error_response(exc.status_code, "http_error", message, [(field, message)])


def _add_api_docs(app: FastAPI) -> None:
    """``/docs`` (Swagger UI) and ``/redoc``, served only with ``api_docs_from_cdn``: their
    pages run scripts from cdn.jsdelivr.net on this origin. FastAPI's own pages would also
    fetch a favicon from fastapi.tiangolo.com, ReDoc its fonts from Google, and Swagger UI
    would send the schema's URL to validator.swagger.io; these keep the CDN the option names
    as the one other host. URLs are relative to the page, so a path prefix in front works."""
    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
    from fastapi.responses import HTMLResponse

    favicon = "ui/favicon.svg"

    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="openapi.json",
            title=f"{app.title} - Swagger UI",
            swagger_favicon_url=favicon,
            swagger_ui_parameters={"validatorUrl": None},
        )

    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url="openapi.json",
            title=f"{app.title} - ReDoc",
            redoc_favicon_url=favicon,
            with_google_fonts=False,
        )

    app.add_api_route("/docs", swagger_ui, include_in_schema=False)
    app.add_api_route("/redoc", redoc, include_in_schema=False)


def _sweeper(config: ServeConfig, store: Store, metrics: Metrics, stop: threading.Event) -> None:
    interval = config.facts.sweep_interval_s
    while not stop.wait(interval):
        try:
            n = store.sweep_expired()
            metrics.facts_swept.inc(n)
            if n:
                logger.info("swept expired facts", extra={"deleted": n})
        except Exception:  # the next round retries; a dead sweeper thread would not
            logger.exception("fact sweep failed")


def create_app(
    config: ServeConfig,
    ranker: ServiceRanker | None = None,
    *,
    extractor: KeywordExtractor | None = None,
) -> FastAPI:
    services = build_services(config, ranker, extractor=extractor)
    store, ranker, metrics = services.store, services.ranker, services.metrics
    mcp_endpoint = McpEndpoint(services)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        stop = threading.Event()
        thread = None
        if config.facts.sweep_interval_s > 0:
            thread = threading.Thread(
                target=_sweeper, args=(config, store, metrics, stop), daemon=True, name="sweeper"
            )
            thread.start()
        try:
            async with mcp_endpoint.running():  # the /mcp transport's session manager
                yield
        finally:
            stop.set()
            if thread is not None:
                await asyncio.to_thread(thread.join, 5)
            close_services(services)

    app = FastAPI(
        title="MemSifter recall service",
        version="0.1.0",
        description=(
            "Memory for chat apps: store sessions, recall the pages a question needs (coarse "
            "filter, keyword bookmarks, then a small proxy model that reasons and ranks), and "
            f"assemble the working LLM's context. Ranker: **{ranker.name}**."
        ),
        lifespan=lifespan,
        # /docs and /redoc only when the config asks (_add_api_docs); /openapi.json always.
        docs_url=None,
        redoc_url=None,
        # No trailing-slash redirects: Starlette builds their Location from the request's Host
        # header, so `POST /v1/rerank/` with `Host: evil.example` was sent to evil.example. A
        # path with a stray slash is the API's JSON 404 instead.
        redirect_slashes=False,
    )
    app.state.services = services
    _install_error_handlers(app)
    routers = (
        rank.router,
        rerank.router,
        sessions.router,
        recall.router,
        facts.router,
        admin.router,
        ops.router,
    )
    for router in routers:
        app.include_router(router)
    if config.api_docs_from_cdn:
        _add_api_docs(app)
    # MCP over Streamable HTTP (docs/mcp.md): a plain route, so it stays out of the OpenAPI
    # schema and behind the request middleware; the endpoint authenticates like the routes.
    # POST only: the transport is stateless with JSON answers, so a GET (a standing SSE stream
    # that would idle forever) or a DELETE (ending a session) is the spec's 405.
    app.add_route("/mcp", mcp_endpoint, methods=["POST"], include_in_schema=False)
    # The recall inspector (docs/inspector.md): static files at /ui, outside the OpenAPI schema,
    # behind the request middleware like every route. It shows user text, so its responses carry
    # a CSP that allows only this origin and no inline script.
    from fastapi.responses import RedirectResponse
    from starlette.staticfiles import StaticFiles

    from memsifter.resources import RESOURCES

    ui_files = StaticFiles(directory=RESOURCES / "ui", html=True)

    async def ui_app(scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_csp(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers["content-security-policy"] = (
                    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
                    "connect-src 'self'; object-src 'none'; base-uri 'none'; "
                    "form-action 'none'; frame-ancestors 'none'"
                )
                headers["x-content-type-options"] = "nosniff"
                headers["referrer-policy"] = "no-referrer"
                headers["cache-control"] = "no-cache"
            await send(message)

        await ui_files(scope, receive, send_with_csp)

    app.add_api_route("/ui", lambda: RedirectResponse("ui/"), include_in_schema=False)
    app.mount("/ui", ui_app, name="ui")
    app.add_middleware(
        RequestMiddleware,
        max_body_bytes=config.limits.max_body_bytes,
        metrics=metrics,
        body_timeout_s=config.limits.body_timeout_s,
        body_deadline_s=config.limits.request_deadline_s,
    )
    return app
