"""MCP over Streamable HTTP at ``/mcp`` on the service: the key and user of every request are
checked as the routes check theirs, then the SDK's stateless session manager serves it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import mcp_types as types
from fastapi.security import HTTPBearer
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse
from starlette.types import Message, Receive, Scope, Send

from memsifter.serving.deps import Services, principal
from memsifter.serving.errors import ServeError, UnavailableError, clip
from memsifter.serving.mcp.tools import Caller, Context, build_server, check_user

USER_HEADER = "X-MemSifter-User"
# Where the endpoint leaves the authenticated caller for the tools: the transport hands each
# call the Starlette request of the HTTP exchange that carried it, built on this scope.
_SCOPE_KEY = "memsifter.mcp.caller"


def _caller_from_request(ctx: Context) -> Caller:
    scope = getattr(ctx.request, "scope", None)
    found = scope.get(_SCOPE_KEY) if isinstance(scope, Mapping) else None
    if not isinstance(found, Caller):  # only reachable if the endpoint below were bypassed
        raise ServeError(
            "this call was not authenticated", field="header.Authorization", status=401
        )
    return found


# The scheme is parsed exactly as the routes' HTTPBearer does; the OpenAPI names do not matter.
_bearer = HTTPBearer(auto_error=False)


def invalid_request_id(body: bytes) -> str | None:
    """Why a JSON-RPC request's ``id`` is not one, or None.

    JSON-RPC ids are strings or integers. The SDK reads a message whose ``id`` is null, a
    boolean, a fraction or an object as a notification and answers 202 with no body, so the
    client waits for a reply that never comes; such a request is refused here instead. Any
    other malformed body is left to the SDK, which answers it."""
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(message, dict) or "id" not in message or "method" not in message:
        return None
    rid = message["id"]
    if isinstance(rid, str) or (isinstance(rid, int) and not isinstance(rid, bool)):
        return None
    return f"a request id is a string or an integer, not {clip(json.dumps(rid), 40)}"


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
        manager = StreamableHTTPSessionManager(
            app=self.server,
            # Stateless with JSON answers: every POST stands alone (its key checked, no session
            # held in this worker), which is what several workers or replicas need.
            stateless=True,
            json_response=True,
            max_request_body_size=self.services.config.limits.max_body_bytes,
            # The SDK's DNS-rebinding guard (allowed Host/Origin lists) is for unauthenticated
            # servers on localhost; this endpoint wants a key, and a deployment's host names
            # are not known here.
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        async with manager.run():
            self._manager = manager
            try:
                yield
            finally:
                self._manager = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = HTTPRequest(scope, receive)
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
        # The request middleware has bounded the body (limits.max_body_bytes), so it is read
        # whole here, checked, and handed on as if unread.
        body = await request.body()
        why = invalid_request_id(body)
        if why is not None:
            error = {"code": types.INVALID_REQUEST, "message": f"invalid request: {why}"}
            reply = JSONResponse({"jsonrpc": "2.0", "id": None, "error": error}, status_code=400)
            await reply(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await manager.handle_request({**scope, _SCOPE_KEY: Caller(who, user)}, replay, send)
