"""The service's error type and the one error body every door answers with.

Every refusal carries the HTTP status and the field at fault, so the app can answer a 4xx that
names it and never a 500. ``error_body`` is the shape of that answer, shared by the HTTP routes
(``app.error_response``) and the MCP tools over both transports (``mcp``), so a client sees the
same bounded error whichever door it used.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from memsifter.errors import MemSifterError

# An error body stays small whatever the request: a body with 100,000 bad keys is told about
# the first MAX_ERROR_FIELDS and how many there were, each text cut to a bounded length, and
# fields are dropped from the end while the encoded body is over MAX_ERROR_BYTES (JSON escapes
# of control characters can make a short text six times longer). A door that sends the body
# inside something else (MCP: the body is the text of a tool result, escaped again in the
# JSON-RPC reply) measures it as sent, with its own ``size``.
MAX_ERROR_FIELDS = 20
MAX_FIELD_CHARS = 200
MAX_MESSAGE_CHARS = 500
MAX_ERROR_BYTES = 16 * 1024

_KINDS = {401: "unauthorized", 403: "forbidden", 404: "not_found", 409: "conflict"}
_KINDS |= {413: "payload_too_large", 429: "rate_limited"}


class ServeError(MemSifterError):
    """A request the service refuses. ``field`` is a path such as ``body.sessions[2].id``."""

    def __init__(self, message: str, *, field: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.status = status

    @property
    def kind(self) -> str:
        """The error body's ``type``: what a client branches on, the status in words."""
        if self.status >= 500:
            return "unavailable"
        return _KINDS.get(self.status, "invalid_request")


class NotFoundError(ServeError):
    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message, field=field, status=404)


class ConflictError(ServeError):
    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message, field=field, status=409)


class UnavailableError(ServeError):
    """A dependency (the proxy backend, the database) failed; the client may retry."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message, field=field, status=503)


def _safe(text: str) -> str:
    """Text that can always be encoded as UTF-8 JSON (field names and messages can carry
    whatever the client sent, lone surrogates included)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def clip(text: str, limit: int) -> str:
    text = _safe(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def json_size(body: dict[str, Any]) -> int:
    """The body's size as the HTTP API sends it (``ensure_ascii`` counts a character at least
    as long as its UTF-8 bytes)."""
    return len(json.dumps(body))


def error_body(
    kind: str,
    message: str,
    fields: list[tuple[str, str]] | None = None,
    *,
    size: Callable[[dict[str, Any]], int] = json_size,
    **extra: Any,
) -> dict[str, Any]:
    """``{"error": {"type", "message", "fields": [{"field", "message"}], "fields_total"},
    **extra}``, at most MAX_ERROR_BYTES by ``size`` whatever ``fields`` holds (see above)."""
    fields = fields or []
    listed = [
        {"field": clip(f, MAX_FIELD_CHARS), "message": clip(m, MAX_FIELD_CHARS)}
        for f, m in fields[:MAX_ERROR_FIELDS]
    ]
    error = {
        "type": kind,
        "message": clip(message, MAX_MESSAGE_CHARS),
        "fields": listed,
        "fields_total": len(fields),
    }
    body = {"error": error, **extra}
    while listed and size(body) > MAX_ERROR_BYTES:
        listed.pop()
    return body


def field_path(loc: tuple[Any, ...] | list[Any], empty: str = "body") -> str:
    """('body', 'sessions', 0, 'id') -> 'body.sessions[0].id'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or empty


def summary(prefix: str, fields: list[tuple[str, str]], shown: int = 5) -> str:
    """``"invalid request: a: m; b: m (and 7 more)"``: the first few fields in one line."""
    head = "; ".join(f"{f}: {m}" for f, m in fields[:shown])
    more = f" (and {len(fields) - shown} more)" if len(fields) > shown else ""
    return f"{prefix}: {head}{more}"
