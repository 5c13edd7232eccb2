"""A total deadline on a request's headers, at the HTTP protocol layer.

uvicorn closes idle keep-alive connections, but a client that sends one header line every few
seconds is never idle and never done: each such connection holds a slot for as long as it
likes. These protocols (uvicorn's own, httptools or h11) start a timer at a request's first
byte and, if the headers are not complete when it fires, answer 408 in the service's JSON
error shape and close the connection. A request uvicorn cannot frame (``Content-Length: abc``)
gets the same JSON shape (400) instead of uvicorn's plain text. The body's deadline is the
request middleware's (``limits.request_deadline_s`` for both).

uvicorn is given the class by its import path, so the worker processes of ``--workers`` load
it too; :func:`set_deadline` sets the deadline in the process that serves (each worker calls
it from the app factory).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools is optional for uvicorn; h11 is not
    HttpToolsProtocol = None  # type: ignore[assignment,misc]
from uvicorn.protocols.http.h11_impl import H11Protocol

from memsifter.serving.errors import error_body

_DEADLINE: dict[str, float | None] = {"s": 30.0}


def set_deadline(seconds: float | None) -> None:
    _DEADLINE["s"] = seconds


def protocol_path() -> str:
    """The protocol class for ``uvicorn.run(http=...)``: httptools when it is installed (as
    uvicorn's ``auto`` would pick), else h11."""
    name = "DeadlineHttpTools" if HttpToolsProtocol is not None else "DeadlineH11"
    return f"{__name__}:{name}"


def raw_error(status: int, reason: str, kind: str, message: str, field: str) -> bytes:
    """A whole HTTP response in the service's JSON error shape, for the protocol layer, where
    there is no app to answer (framing errors, deadlines); the connection closes after it."""
    body = json.dumps(error_body(kind, message, [(field, message)], request_id=None)).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode()
    return head + body


class _Deadline:
    """The timer both protocols share: armed at a request's first byte, disarmed when its
    headers are complete, and on expiry a 408 and a closed connection."""

    transport: Any
    _timer: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        seconds = _DEADLINE["s"]
        if seconds is not None and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(seconds, self._expire, seconds)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self, seconds: float) -> None:
        self._timer = None
        if not self.transport.is_closing():
            message = f"the request headers took longer than {seconds} s"
            self.transport.write(
                raw_error(408, "Request Timeout", "request_timeout", message, "headers")
            )
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        # uvicorn's own answer to bad framing (Content-Length: abc, a broken request line) is
        # text/plain; the service answers every error in one JSON shape.
        self._disarm()
        message = f"malformed HTTP request: {msg}"
        self.transport.write(raw_error(400, "Bad Request", "malformed_request", message, "headers"))
        self.transport.close()


if HttpToolsProtocol is not None:

    class DeadlineHttpTools(_Deadline, HttpToolsProtocol):  # type: ignore[misc,valid-type]
        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)


class DeadlineH11(_Deadline, H11Protocol):
    def data_received(self, data: bytes) -> None:
        import h11

        if self.conn.their_state == h11.IDLE:  # the first bytes of a request's head
            self._arm()
        super().data_received(data)
        if self.conn.their_state != h11.IDLE:
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
