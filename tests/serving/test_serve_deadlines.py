"""Slow connections are closed: a client that drips its headers or its body a byte at a time
is answered 408 and cut at the request deadline (a total, not an idle timeout), the server
keeps answering others while many such clients hang on, and past the connection bound a new
request is shed with a 503 at once instead of waiting. Live uvicorn servers on TCP ports with
``memsifter serve``'s connection settings (``memsifter.testing.server.live_server``), a short
deadline so that the tests take seconds."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from memsifter.serving.config import AdminSettings, ApiKeySettings, LimitSettings, ServeConfig
from memsifter.serving.store import hash_key
from memsifter.testing.server import live_server

KEY = "key-deadlines-0123456789"
DEADLINE_S = 2.0


def _config(db_url: str, **limits: object) -> ServeConfig:
    return ServeConfig(
        db_url=db_url,
        admin=AdminSettings(key_env=None, key_sha256=hash_key("admin-deadlines-0123456789")),
        api_keys=[ApiKeySettings(tenant="acme", key_sha256=hash_key(KEY))],
        limits=LimitSettings(request_deadline_s=DEADLINE_S, **limits),  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def db_url(serve_db: Callable[[str], str]) -> str:
    return serve_db("deadlines")


@pytest.fixture(scope="module")
def server(db_url: str) -> Iterator[str]:
    with live_server(_config(db_url, max_connections=400)) as url:
        yield url


def _connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    return sock


def _drip(sock: socket.socket, head: bytes, drip: bytes, every_s: float, for_s: float) -> bytes:
    """Send ``head``, then ``drip`` a byte every ``every_s`` until the server answers or
    closes, or ``for_s`` passes; returns what the server sent."""
    sock.sendall(head)
    sock.settimeout(every_s)
    got = b""
    end = time.monotonic() + for_s
    i = 0
    while time.monotonic() < end:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            try:
                sock.sendall(drip[i % len(drip) : i % len(drip) + 1])
            except OSError:
                break
            i += 1
            continue
        if not chunk:
            break
        got += chunk
    return got


def test_dripped_headers_get_a_408_and_the_connection_closed(server: str) -> None:
    sock = _connect(server)
    t0 = time.monotonic()
    got = _drip(sock, b"GET /healthz HTTP/1.1\r\nHost: x\r\n", b"X-Slow: 1\r\n", 0.3, 15)
    took = time.monotonic() - t0
    sock.close()
    assert got.startswith(b"HTTP/1.1 408"), got[:200]
    assert b'"request_timeout"' in got and b'"headers"' in got
    assert took < DEADLINE_S + 3, took  # closed at the deadline, not at 15 s


def test_a_dripped_body_gets_a_408_at_the_deadline(server: str) -> None:
    sock = _connect(server)
    head = (
        "POST /v1/users/u/recall HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
        "Content-Length: 1000\r\n\r\n"
    ).encode()
    t0 = time.monotonic()
    got = _drip(sock, head, b"{", 0.3, 15)  # a byte every 0.3 s: never idle for 30 s
    took = time.monotonic() - t0
    sock.close()
    assert got.startswith(b"HTTP/1.1 408"), got[:300]
    assert b"took longer than" in got and b'"body"' in got
    assert took < DEADLINE_S + 3, took


def test_the_server_answers_while_many_drip_connections_hang_on(server: str) -> None:
    socks = []
    try:
        for _ in range(200):
            s = _connect(server)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # headers never finished
            socks.append(s)
        for _ in range(5):
            r = httpx.get(f"{server}/healthz", timeout=5)
            assert r.status_code == 200, r.text
    finally:
        for s in socks:
            s.close()


def test_past_the_connection_bound_a_request_is_shed_with_503(db_url: str) -> None:
    with live_server(_config(db_url, max_connections=3)) as url:
        socks = [_connect(url) for _ in range(3)]
        try:
            for s in socks:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            time.sleep(0.2)
            # Shed, not queued behind the slow ones (a queued request would time out here).
            r = httpx.get(f"{url}/healthz", timeout=5)
            assert r.status_code == 503, r.text
        finally:
            for s in socks:
                s.close()
        time.sleep(0.2)
        assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200  # and it recovers


def test_bad_framing_gets_the_json_error_shape(server: str) -> None:
    sock = _connect(server)
    sock.sendall(b"POST /v1/rank HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n")
    sock.settimeout(5)
    got = b""
    while chunk := sock.recv(65536):
        got += chunk
    sock.close()
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"application/json" in head, got[:300]
    error = json.loads(body)["error"]
    assert error["type"] == "malformed_request" and error["fields"][0]["field"] == "headers"
