"""The memory as MCP tools, driven by the official SDK's own client over both transports:
``memsifter mcp`` on stdio (a child process) and Streamable HTTP at ``/mcp`` on a live service
(uvicorn on a TCP port), in both of the client's modes (``auto``: the 2026-07-28 single-exchange
protocol; ``legacy``: the initialize handshake).

Each transport round-trips every tool (remember, then recall finds the page; add_fact, facts
lists it, forget removes it). A refused call is an ``isError`` result whose text is the service's
bounded error body naming the argument, and the next call on the same client still works; the
arguments obey the HTTP bodies' contract (strict integers); keys and users never see each other's
memory; a missing or wrong key is the service's JSON 401 before MCP sees the request, and a key
revoked under a running stdio process is refused there too. Over stdio, a request line over
``limits.max_body_bytes`` is a named JSON-RPC error and the session goes on; and the official
TypeScript SDK's stdio client (slow: npm) survives the 30,000-turn request its 10 MiB line
limit once lost the session to.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from fastapi.testclient import TestClient
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types import (
    INVALID_REQUEST,
    CallToolResult,
    JSONRPCError,
    JSONRPCNotification,
    JSONRPCResponse,
)
from mcp_types.version import LATEST_HANDSHAKE_VERSION, LATEST_MODERN_VERSION

from memsifter.serving.app import create_app
from memsifter.serving.config import AdminSettings, ApiKeySettings, LimitSettings, ServeConfig
from memsifter.serving.errors import MAX_ERROR_BYTES, MAX_ERROR_FIELDS
from memsifter.serving.mcp import MAX_STDIO_LINE_BYTES, LineLimit, RequestLines, missing_memory
from memsifter.serving.store import Store, hash_key
from memsifter.testing.server import live_server

ROOT = Path(__file__).resolve().parents[2]
TS_CLIENT = ROOT / "tests" / "fixtures" / "mcp_ts_stdio.mjs"
TS_SDK = "@modelcontextprotocol/sdk@1.32.2"  # the client of the issue-35 tests
KEY = "key-mcp-acme-0123456789"
KEY_TODO = "key-mcp-acme-todo-0123456789"  # tenant acme's todo agent: task facts only
KEY_OTHER = "key-mcp-globex-0123456789"
UNKNOWN_FACT = "00000000-0000-4000-8000-000000000000"
TOOLS = {"recall", "remember", "add_fact", "facts", "forget"}
SCRIPT = "<script>alert('x')</script> & <b>bold</b> \"quoted\""
# Lower than the schema ceilings, so the deployment checks (check_question, check_top_k) answer.
LIMITS = LimitSettings(max_question_chars=200, max_top_k=10, max_body_bytes=100_000)
KEYS = [
    ApiKeySettings(tenant="acme", key_sha256=hash_key(KEY)),
    ApiKeySettings(
        tenant="acme", key_sha256=hash_key(KEY_TODO), agent="todo-bot", fact_types=["task"]
    ),
    ApiKeySettings(tenant="globex", key_sha256=hash_key(KEY_OTHER)),
]


@pytest.fixture(scope="module")
def config(serve_db: Callable[[str], str]) -> ServeConfig:
    return ServeConfig(
        db_url=serve_db("mcp_http"),
        admin=AdminSettings(key_env=None),
        api_keys=KEYS,
        limits=LIMITS,
    )


@pytest.fixture(scope="module")
def base_url(config: ServeConfig) -> Iterator[str]:
    with live_server(config) as url:
        yield url


@asynccontextmanager
async def over_http(
    base_url: str, key: str, user: str, mode: str = "auto"
) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {key}", "X-MemSifter-User": user}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60.0)) as http:
        transport = streamable_http_client(f"{base_url}/mcp", http_client=http)
        async with Client(transport, mode=mode) as client:
            yield client


def ok(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


def refused(result: CallToolResult, *needles: str) -> dict[str, Any]:
    """The refusal's error body (the HTTP API's shape), after checking that its text holds
    each needle."""
    assert result.is_error, result.structured_content
    assert result.structured_content is None  # a client would check it against the output schema
    text = result.content[0].text  # type: ignore[union-attr]
    for needle in needles:
        assert needle in text, text
    assert len(text.encode()) <= MAX_ERROR_BYTES
    error = json.loads(text)["error"]
    assert set(error) == {"type", "message", "fields", "fields_total"}
    assert len(error["fields"]) <= min(error["fields_total"], MAX_ERROR_FIELDS)
    return error


async def round_trip(client: Client, tag: str) -> None:
    """Every tool once: what remember stores, recall finds; what add_fact adds, facts lists
    and forget removes."""
    assert {t.name for t in (await client.list_tools()).tools} == TOOLS
    session = {
        "id": f"{tag}-trip",
        "date": "2024-05-01T18:00:00Z",
        "turns": [
            {"speaker": "user", "text": "My parrot is called Kiwi."},
            {"speaker": "assistant", "text": f"Kiwi is a lovely name. {SCRIPT}"},
        ],
    }
    stored = ok(await client.call_tool("remember", {"session": session}))
    assert stored["sessions"][0]["session_id"] == f"{tag}-trip"
    page = stored["sessions"][0]["page_ids"][0]
    streamed = ok(
        await client.call_tool(
            "remember",
            {
                "turns": [{"speaker": "user", "text": "I started learning the cello."}],
                "session_prefix": f"{tag}-stream",
            },
        )
    )
    assert streamed["sessions"][0]["session_id"].startswith(f"{tag}-stream")

    found = ok(await client.call_tool("recall", {"question": "What is my parrot called?"}))
    assert found["ranker"] == "coarse-only"
    top = found["hits"][0]
    assert (top["page_id"], top["session_id"], top["rank"]) == (page, f"{tag}-trip", 1)
    assert top["date_text"] == "2024-05-01 18:00"
    assert top["score"] > 0 and top["coarse_score"] > 0 and top["keywords"]
    assert "Kiwi" in top["text"] and SCRIPT in top["text"]  # plain text, nothing escaped
    assert len(found["hits"]) == 2  # both sessions, parrot first

    added = ok(
        await client.call_tool(
            "add_fact",
            {
                "type": "preference",
                "subject": "Drink",
                "text": "Prefers green tea.",
                "ttl_seconds": 3600,
            },
        )
    )
    fact_id = added["fact"]["fact_id"]
    assert added["fact"]["subject"] == "drink" and added["fact"]["expires_at"] is not None
    assert [f["fact_id"] for f in ok(await client.call_tool("facts", {}))["facts"]] == [fact_id]
    assert ok(await client.call_tool("forget", {"fact_id": fact_id})) == {"deleted": 1}
    assert ok(await client.call_tool("facts", {}))["facts"] == []


async def failures_then_recovery(client: Client) -> None:
    """Each refusal is an error result naming its argument; the client carries on."""
    refused(await client.call_tool("forget", {"fact_id": UNKNOWN_FACT}), "fact_id", "unknown fact")
    refused(await client.call_tool("forget", {"fact_id": "not-an-id"}), "fact_id", "not a fact id")
    refused(
        await client.call_tool("recall", {"question": "parrot?", "top_k": 11}),
        "top_k",
        "over the limit of 10",
    )
    refused(
        await client.call_tool("recall", {"question": "why " * 60}), "question", "the limit is 200"
    )
    refused(await client.call_tool("recall", {"question": "  "}), "question", "empty")
    refused(
        await client.call_tool("recall", {"question": "parrot?", "topk": 3}),
        "unknown argument topk",
    )
    # Integers are strict, as in the HTTP bodies: neither a string nor a boolean is a top_k.
    for top_k in ("3", True, 2.5):
        error = refused(await client.call_tool("recall", {"question": "parrot?", "top_k": top_k}))
        assert error["type"] == "validation_error"
        assert [f["field"] for f in error["fields"]] == ["top_k"], error
    refused(await client.call_tool("recall_everything", {}), "unknown tool 'recall_everything'")
    refused(await client.call_tool("facts", {"user": "bob"}), "unknown argument user")
    refused(await client.call_tool("remember", {}), "either turns or session")
    refused(
        await client.call_tool(
            "remember",
            {
                "session": {"id": "x", "turns": [{"speaker": "u", "text": "hi"}]},
                "session_prefix": "p",
            },
        ),
        "session_prefix: applies to turns only",
    )
    refused(
        await client.call_tool(
            "remember", {"turns": [{"speaker": "u", "text": "hi", "mood": "happy"}]}
        ),
        "mood",
    )
    refused(
        await client.call_tool(
            "remember", {"session": {"id": "a/../b", "turns": [{"speaker": "u", "text": "hi"}]}}
        ),
        "session.id",
    )
    refused(
        await client.call_tool(
            "add_fact", {"type": "entity", "subject": "s", "text": "t", "importance": 2}
        ),
        "importance",
    )
    refused(
        await client.call_tool("add_fact", {"type": "mood", "subject": "s", "text": "t"}), "type"
    )
    refused(
        await client.call_tool(
            "add_fact",
            {"type": "task", "subject": "s", "text": "t", "expires_at": "2001-01-01T00:00:00Z"},
        ),
        "expires_at is in the past",
    )
    refused(
        await client.call_tool(
            "add_fact", {"type": "task", "subject": "s", "text": "t", "ttl_seconds": -1}
        ),
        "ttl_seconds",
    )
    found = ok(await client.call_tool("recall", {"question": "What is my parrot called?"}))
    assert "Kiwi" in found["hits"][0]["text"]


# ----------------------------------------------------------------------------------------- stdio


def _stdio_config(tmp_path: Path, db_url: str) -> Path:
    path = tmp_path / "serve.yaml"
    stdio_keys = (KEYS[0], KEYS[2])  # acme's full key and globex's
    keys = "\n".join(f"  - {{tenant: {k.tenant}, key_sha256: {k.key_sha256}}}" for k in stdio_keys)
    path.write_text(
        f"db_url: {json.dumps(db_url)}\n"
        "admin: {key_env: null}\n"
        "limits: {max_question_chars: 200, max_top_k: 10}\n"
        f"api_keys:\n{keys}\n",
        encoding="utf-8",
    )
    return path


def _existing_memory(db_url: str) -> Store:
    """The database as `memsifter serve` leaves it (migrated), which `memsifter mcp` opens."""
    store = Store(db_url)
    store.migrate()
    return store


def _mcp_command(config: Path | None, user: str, *extra: str) -> list[str]:
    flags = ["--config", str(config)] if config is not None else []
    return [sys.executable, "-m", "memsifter.cli", "mcp", "--user", user, *flags, *extra]


def _stdio_params(command: list[str], env: dict[str, str]) -> StdioServerParameters:
    return StdioServerParameters(command=command[0], args=command[1:], env=env, cwd=ROOT)


@pytest.mark.slow  # starts server processes; CI runs it (docs/setup.md, the fast run)
def test_stdio_round_trip_and_failures(tmp_path: Path, serve_db: Callable[[str], str]) -> None:
    # --create-db: the one way `memsifter mcp` starts a memory of its own.
    config = _stdio_config(tmp_path, serve_db("mcp_stdio"))
    env = {**os.environ, "MEMSIFTER_API_KEY": KEY, "OMP_NUM_THREADS": "1"}

    async def run() -> None:
        params = _stdio_params(_mcp_command(config, "stdio-alice", "--create-db"), env)
        async with Client(params) as client:
            await round_trip(client, "stdio")
            await failures_then_recovery(client)

    asyncio.run(asyncio.wait_for(run(), 240))


@pytest.mark.slow  # starts server processes; CI runs it (docs/setup.md, the fast run)
def test_stdio_bounds_its_replies_and_rechecks_its_key(
    tmp_path: Path, serve_db: Callable[[str], str]
) -> None:
    """On one stdio session: 30,000 bad turns get the bounded error body; a reply over the
    1 MiB line limit is a JSON-RPC error naming it; the session survives both. Then the key is
    revoked under the running process: within 5 s its calls are refused as on HTTP, and
    nothing more is stored."""
    db_url = serve_db("mcp_stdio_revoke")
    store = _existing_memory(db_url)
    config = _stdio_config(tmp_path, db_url)
    env = {**os.environ, "MEMSIFTER_API_KEY": KEY, "OMP_NUM_THREADS": "1"}
    user = "stdio-revoked"

    async def run() -> None:
        async with Client(_stdio_params(_mcp_command(config, user), env)) as client:
            bad = [{"speaker": 5, "text": 7}] * 30_000
            error = refused(await client.call_tool("remember", {"turns": bad}), "turns[0].speaker")
            assert error["type"] == "validation_error" and error["fields_total"] == 60_000
            assert len(error["fields"]) == MAX_ERROR_FIELDS

            # 40 turns at the 20,000-character limit make 10 pages of 80,000 characters each:
            # storing them is fine, recalling all ten is a reply of about 1.6 MB.
            text = ("parrot " * 2_900)[:19_990]
            big = {"id": "big", "turns": [{"speaker": "user", "text": text}] * 40}
            assert ok(await client.call_tool("remember", {"session": big}))["sessions"]
            with pytest.raises(MCPError, match=f"over the {MAX_STDIO_LINE_BYTES:,} one stdio line"):
                await client.call_tool("recall", {"question": "parrot?", "top_k": 10})
            assert len(ok(await client.call_tool("recall", {"question": "parrot?"}))["hits"]) == 5

            (key,) = store.list_api_keys("acme") or []
            assert store.revoke_api_key(key.key_id) is not None
            revoked_at = time.monotonic()
            while not (await client.call_tool("facts", {})).is_error:
                assert time.monotonic() - revoked_at < 5, "a revoked key still works"
                await asyncio.sleep(0.1)
            turn = [{"speaker": "user", "text": "remember me"}]
            error = refused(await client.call_tool("remember", {"turns": turn}), "invalid API key")
            assert error["type"] == "unauthorized"
            assert error["fields"] == [
                {"field": "$MEMSIFTER_API_KEY", "message": "invalid API key"}
            ]

    asyncio.run(asyncio.wait_for(run(), 240))
    sessions, total = store.list_sessions("acme", user)
    assert total == 1 and [s.session_id for s in sessions] == ["big"]
    store.close()


def test_stdio_answers_an_over_long_request_line_and_reads_on(
    tmp_path: Path, serve_db: Callable[[str], str]
) -> None:
    """Raw JSON-RPC lines, as no SDK client would send them: a request line over
    ``limits.max_body_bytes`` (2,000,000 by default) is answered ``-32600`` with ``id`` null,
    naming its size and the limit, and the next request on the session is served."""
    config = _stdio_config(tmp_path, serve_db("mcp_stdio_long_line"))
    env = {**os.environ, "MEMSIFTER_API_KEY": KEY, "OMP_NUM_THREADS": "1"}
    command = _mcp_command(config, "stdio-long", "--create-db")

    def line(rid: int | None, method: str, params: dict[str, Any]) -> bytes:
        message = {"jsonrpc": "2.0", "method": method, "params": params}
        return json.dumps(message if rid is None else {**message, "id": rid}).encode() + b"\n"

    turn = b'{"speaker": "user", "text": "' + b"x" * 1_000 + b'"},'
    turns = b"[" + turn * 3_000 + turn[:-1] + b"]"  # 3,001 turns: 3.1 MB
    over = b'{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "remember", '
    over += b'"arguments": {"turns": ' + turns + b"}}}"

    async def run() -> None:
        with (tmp_path / "stderr.log").open("wb") as stderr:
            proc = await asyncio.create_subprocess_exec(
                *command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=env,
                cwd=ROOT,
            )
        stdin, stdout = proc.stdin, proc.stdout
        assert stdin is not None and stdout is not None

        async def send(data: bytes) -> None:
            stdin.write(data)
            await stdin.drain()

        async def reply() -> dict[str, Any]:
            return json.loads(await asyncio.wait_for(stdout.readline(), 120))

        client = {"name": "raw", "version": "0"}
        init = {
            "protocolVersion": LATEST_HANDSHAKE_VERSION,
            "capabilities": {},
            "clientInfo": client,
        }
        await send(line(1, "initialize", init))
        assert "result" in await reply()
        await send(line(None, "notifications/initialized", {}))
        await send(over + b"\n")
        error = await reply()
        assert error["id"] is None and error["error"]["code"] == INVALID_REQUEST
        assert error["error"]["message"].startswith(
            f"the request line has {len(over):,} bytes; the limit is 2,000,000 "
            "(limits.max_body_bytes)"
        )
        await send(line(3, "tools/call", {"name": "facts", "arguments": {}}))
        facts = await reply()
        assert facts["id"] == 3 and facts["result"]["structuredContent"]["facts"] == []
        stdin.close()
        assert await asyncio.wait_for(proc.wait(), 60) == 0

    asyncio.run(asyncio.wait_for(run(), 240))


def _typescript_sdk() -> Path:
    """A folder with the TypeScript MCP SDK installed: made once per machine, outside the repo
    (``$XDG_CACHE_HOME/memsifter``, by default ``~/.cache/memsifter``), then reused."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are needed to run the TypeScript MCP SDK's client")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "memsifter"
    folder = cache / f"npm-mcp-sdk-{TS_SDK.rpartition('@')[2]}"
    if (folder / "node_modules" / "@modelcontextprotocol" / "sdk" / "package.json").is_file():
        return folder
    cache.mkdir(parents=True, exist_ok=True)
    # Installed aside and renamed into place, so a folder that exists is a whole install.
    staging = Path(tempfile.mkdtemp(prefix="npm-mcp-sdk-", dir=cache))
    done = subprocess.run(
        ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(staging), TS_SDK],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"npm install {TS_SDK} failed:\n{done.stderr[-3000:]}"
    try:
        staging.rename(folder)
    except OSError:  # another run installed it first
        shutil.rmtree(staging)
    return folder


@pytest.mark.slow
def test_the_typescript_sdks_stdio_session_survives_30000_bad_turns(
    tmp_path: Path, serve_db: Callable[[str], str]
) -> None:
    # 30,000 invalid turns once made one 11 MB reply line; this client ends its session on a
    # line over 10 MiB ("ReadBuffer exceeded maximum size"), every later call "Not connected".
    sdk = _typescript_sdk()
    client = sdk / TS_CLIENT.name  # beside node_modules, where its imports resolve
    shutil.copyfile(TS_CLIENT, client)
    config = _stdio_config(tmp_path, serve_db("mcp_stdio_ts"))
    command = _mcp_command(config, "stdio-ts", "--create-db")
    env = {**os.environ, "MEMSIFTER_API_KEY": KEY, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        ["node", str(client)],
        env={**env, "MEMSIFTER_MCP_COMMAND": json.dumps(command)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    bad = CallToolResult.model_validate(results["bad"])
    error = refused(bad, "turns[0].speaker")  # within MAX_ERROR_BYTES
    assert error["type"] == "validation_error" and error["fields_total"] == 60_000
    assert ok(CallToolResult.model_validate(results["after"]))["facts"] == []


@pytest.mark.slow  # starts server processes; CI runs it (docs/setup.md, the fast run)
def test_stdio_refuses_to_start_without_a_valid_key(
    tmp_path: Path, serve_db: Callable[[str], str]
) -> None:
    db_url = serve_db("mcp_stdio_refused")
    _existing_memory(db_url).close()
    config = _stdio_config(tmp_path, db_url)
    env = {k: v for k, v in os.environ.items() if k != "MEMSIFTER_API_KEY"}
    cases = [
        ({}, (), "$MEMSIFTER_API_KEY is not set"),
        ({"MY_KEY": KEY}, (), "$MEMSIFTER_API_KEY is not set"),
        ({"MEMSIFTER_API_KEY": "key-nobody-has"}, (), "not a valid API key"),
        ({"MY_KEY": "key-nobody-has"}, ("--key-env", "MY_KEY"), "$MY_KEY is not a valid"),
    ]
    for extra_env, flags, message in cases:
        done = subprocess.run(
            _mcp_command(config, "alice", *flags),
            env={**env, **extra_env, "OMP_NUM_THREADS": "1"},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert done.returncode == 2, done.stderr[-2000:]
        assert message in " ".join(done.stderr.split()), done.stderr[-2000:]
        assert done.stdout == ""  # stdout is the protocol's
    bad_user = subprocess.run(
        _mcp_command(config, "../alice"),
        env={**env, "MEMSIFTER_API_KEY": KEY},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert bad_user.returncode == 2 and "is not a user id" in bad_user.stderr


def test_stdio_never_starts_an_empty_memory_unasked(tmp_path: Path) -> None:
    """The default config's database is `memsifter serve`'s (sqlite:///memsifter.db, relative
    to the working directory). Where there is none, `memsifter mcp` says which setting to point
    at it instead of creating an empty memory that knows no user."""
    env = {k: v for k, v in os.environ.items() if k != "MEMSIFTER_SERVE_DB_URL"}
    done = subprocess.run(
        _mcp_command(None, "alice"),
        # COLUMNS: the error is printed by rich, which would fold a long path across lines.
        env={**env, "MEMSIFTER_API_KEY": KEY, "OMP_NUM_THREADS": "1", "COLUMNS": "1000"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    stderr = " ".join(done.stderr.split())
    assert done.returncode == 2, stderr
    assert f"no database file {tmp_path / 'memsifter.db'}" in stderr, stderr
    for needle in ("$MEMSIFTER_SERVE_DB_URL", "--config", "--create-db", "memsifter serve"):
        assert needle in stderr, stderr
    assert done.stdout == "" and list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------- Streamable HTTP


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_http_round_trip(base_url: str, mode: str) -> None:
    async def run() -> None:
        async with over_http(base_url, KEY, f"http-{mode}", mode) as client:
            await round_trip(client, mode)
            await failures_then_recovery(client)
            # auto took the single-exchange protocol, legacy the handshake: both server paths.
            expected = LATEST_MODERN_VERSION if mode == "auto" else LATEST_HANDSHAKE_VERSION
            assert client.protocol_version == expected

    asyncio.run(asyncio.wait_for(run(), 120))


def test_http_refusals_are_the_service_json_errors(base_url: str) -> None:
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        },
    }
    accept = {"Accept": "application/json, text/event-stream"}
    user = {"X-MemSifter-User": "alice"}
    with httpx.Client(base_url=base_url, timeout=30) as http:
        for headers, message in (
            ({}, "missing API key"),
            ({"Authorization": "Bearer wrong-key"}, "invalid API key"),
            ({"Authorization": f"Basic {KEY}"}, "missing API key"),
        ):
            r = http.post("/mcp", json=init, headers={**accept, **user, **headers})
            assert r.status_code == 401, r.text
            assert r.headers["www-authenticate"] == "Bearer" and r.headers["x-request-id"]
            error = r.json()["error"]
            assert error["type"] == "unauthorized" and message in error["message"]
            assert error["fields"][0]["field"] == "header.Authorization"

        auth = {"Authorization": f"Bearer {KEY}"}
        for headers, message in (
            ({}, "missing user"),
            ({"X-MemSifter-User": "../alice"}, "is not a user id"),
            ({"X-MemSifter-User": "a" * 129}, "is not a user id"),
        ):
            r = http.post("/mcp", json=init, headers={**accept, **auth, **headers})
            assert r.status_code == 422, r.text
            assert message in r.json()["error"]["message"]
            assert r.json()["error"]["fields"][0]["field"] == "header.X-MemSifter-User"

        # The service's request middleware still runs first: body limit, request id.
        big = b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "pad": "' + b"x" * 100_000 + b'"}'
        r = http.post("/mcp", content=big, headers={**accept, **auth, **user})
        assert r.status_code == 413 and r.json()["error"]["type"] == "payload_too_large"
        r = http.post(
            "/mcp", json=init, headers={**accept, **auth, **user, "X-Request-ID": "mcp-1"}
        )
        assert r.status_code == 200, r.text
        assert r.headers["x-request-id"] == "mcp-1"
        assert r.json()["result"]["serverInfo"]["name"] == "memsifter"
        # Stateless JSON transport: no standing SSE stream, no session to delete.
        for method in ("GET", "DELETE"):
            r = http.request(method, "/mcp", headers={**accept, **auth, **user})
            assert r.status_code == 405, r.text

        # /mcp is no part of the OpenAPI schema, and the routes still are.
        r = http.get("/openapi.json")
        assert r.status_code == 200
        paths = r.json()["paths"]
        assert not [p for p in paths if p.startswith("/mcp")]
        assert "/v1/users/{user_id}/recall" in paths and "/v1/users/{user_id}/facts" in paths
        assert http.get("/healthz").status_code == 200


def test_http_script_text_comes_back_as_plain_text(base_url: str) -> None:
    async def run() -> None:
        async with over_http(base_url, KEY, "script-user") as client:
            text = f"{SCRIPT} and my locker is 4417"
            ok(
                await client.call_tool(
                    "remember",
                    {"session": {"id": "xss", "turns": [{"speaker": "user", "text": text}]}},
                )
            )
            result = await client.call_tool("recall", {"question": "what is my locker number?"})
            hit = ok(result)["hits"][0]
            assert hit["text"] == f"user: {text}"
            # The text block is the same JSON, with the markup as typed (no \\u003c, no &lt;).
            block = result.content[0].text  # type: ignore[union-attr]
            assert "<script>alert('x')</script> & <b>bold</b>" in block
            assert "&lt;" not in block and "\\u003c" not in block
            assert json.loads(block)["hits"][0]["text"] == hit["text"]

    asyncio.run(asyncio.wait_for(run(), 120))


def test_http_isolation_between_users_tenants_and_agents(base_url: str) -> None:
    async def run() -> None:
        async with (
            over_http(base_url, KEY, "iso-alice") as alice,
            over_http(base_url, KEY, "iso-bob") as bob,
            over_http(base_url, KEY_OTHER, "iso-alice") as other_tenant,
            over_http(base_url, KEY_TODO, "iso-alice") as todo_agent,
        ):
            secret = {
                "id": "locker",
                "turns": [{"speaker": "user", "text": "My locker code is 4417."}],
            }
            ok(await alice.call_tool("remember", {"session": secret}))
            entity = ok(
                await alice.call_tool(
                    "add_fact", {"type": "entity", "subject": "locker", "text": "Code 4417."}
                )
            )["fact"]["fact_id"]
            task = ok(
                await alice.call_tool(
                    "add_fact", {"type": "task", "subject": "dentist", "text": "Book the dentist."}
                )
            )["fact"]["fact_id"]

            # Another user of the same key: nothing of alice's.
            refused(await bob.call_tool("recall", {"question": "locker code?"}), "unknown user")
            assert ok(await bob.call_tool("facts", {}))["facts"] == []
            refused(await bob.call_tool("forget", {"fact_id": entity}), "unknown fact")
            ok(
                await bob.call_tool(
                    "remember",
                    {"session": {"id": "bob", "turns": [{"speaker": "user", "text": "locker 9"}]}},
                )
            )
            hits = ok(await bob.call_tool("recall", {"question": "locker code?"}))["hits"]
            assert {h["session_id"] for h in hits} == {"bob"}

            # Another tenant, same user id: nothing either.
            refused(await other_tenant.call_tool("recall", {"question": "locker?"}), "unknown user")
            assert ok(await other_tenant.call_tool("facts", {}))["facts"] == []
            refused(await other_tenant.call_tool("forget", {"fact_id": task}), "unknown fact")

            # Same tenant and user, a key restricted to task facts: sees and writes only those.
            listed = ok(await todo_agent.call_tool("facts", {}))["facts"]
            assert [f["fact_id"] for f in listed] == [task]
            refused(
                await todo_agent.call_tool(
                    "add_fact", {"type": "entity", "subject": "car", "text": "A red car."}
                ),
                "type",
                "may not use 'entity' facts",
            )
            refused(await todo_agent.call_tool("forget", {"fact_id": entity}), "unknown fact")

            ids = {f["fact_id"] for f in ok(await alice.call_tool("facts", {}))["facts"]}
            assert ids == {entity, task}
            hits = ok(await alice.call_tool("recall", {"question": "locker code?"}))["hits"]
            assert {h["session_id"] for h in hits} == {"locker"}

    asyncio.run(asyncio.wait_for(run(), 120))


def test_mcp_runs_within_each_lifespan(config: ServeConfig) -> None:
    """The transport's session manager can run once, so each lifespan starts its own; without
    one, /mcp says so (503) rather than failing."""
    app = create_app(config)
    headers = {
        "Authorization": f"Bearer {KEY}",
        "X-MemSifter-User": "alice",
        "Accept": "application/json, text/event-stream",
    }
    ping = {"jsonrpc": "2.0", "id": 7, "method": "ping"}
    r = TestClient(app).post("/mcp", json=ping, headers=headers)
    assert r.status_code == 503 and "not running" in r.json()["error"]["message"]
    for _ in range(2):
        with TestClient(app) as client:
            r = client.post("/mcp", json=ping, headers=headers)
            assert r.status_code == 200, r.text
            assert r.json() == {"jsonrpc": "2.0", "id": 7, "result": {}}


def test_http_rate_limit_is_the_service_429(config: ServeConfig) -> None:
    """The endpoint authenticates with the routes' dependency, so a tenant's rate limit counts
    /mcp requests too."""
    limited = replace(config, limits=replace(LIMITS, rate_per_s=0.001, burst=1))
    headers = {
        "Authorization": f"Bearer {KEY_OTHER}",
        "X-MemSifter-User": "alice",
        "Accept": "application/json, text/event-stream",
    }
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    with TestClient(create_app(limited)) as client:
        assert client.post("/mcp", json=ping, headers=headers).status_code == 200
        r = client.post("/mcp", json=ping, headers=headers)
        assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limited"
        assert int(r.headers["retry-after"]) >= 1


def _tool_call(name: str, arguments: dict[str, Any], rid: Any = 1) -> dict[str, Any]:
    params = {"name": name, "arguments": arguments}
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}


@pytest.mark.slow  # starts server processes; CI runs it (docs/setup.md, the fast run)
def test_http_error_replies_are_bounded_and_shaped_as_the_api_errors(config: ServeConfig) -> None:
    """What the API answers a bad body with, /mcp answers the same arguments with: the same
    bounded error (20 fields listed, the total counted), whatever the size of the mistake."""
    roomy = replace(config, limits=replace(LIMITS, max_body_bytes=4_000_000))
    headers = {
        "Authorization": f"Bearer {KEY}",
        "X-MemSifter-User": "bounded",
        "Accept": "application/json, text/event-stream",
    }
    bad_turns = [{"speaker": 5, "text": 7}] * 80_000
    with TestClient(create_app(roomy)) as client:
        api = client.post("/v1/users/bounded/turns", json={"turns": bad_turns}, headers=headers)
        assert api.status_code == 422
        r = client.post("/mcp", json=_tool_call("remember", {"turns": bad_turns}), headers=headers)
        assert r.status_code == 200 and len(r.content) < 4_000, len(r.content)
        error = json.loads(r.json()["result"]["content"][0]["text"])["error"]
        assert r.json()["result"]["isError"] is True
        expected = api.json()["error"]
        assert error["fields_total"] == expected["fields_total"] == 160_000
        assert [f["field"] for f in error["fields"]] == [
            f["field"].removeprefix("body.") for f in expected["fields"]
        ]
        assert error["message"].startswith("invalid arguments: turns[0].speaker")

        many = {f"arg{i}": 1 for i in range(20_000)} | {"question": "q"}
        r = client.post("/mcp", json=_tool_call("recall", many), headers=headers)
        assert len(r.content) < 4_000, len(r.content)
        error = json.loads(r.json()["result"]["content"][0]["text"])["error"]
        assert error["fields_total"] == 20_000 and len(error["fields"]) == MAX_ERROR_FIELDS
        assert "and 19995 more; recall takes question, question_date, top_k" in error["message"]

        # The SDK's own protocol errors echo the request (an unknown method is its data).
        r = client.post(
            "/mcp", json={"jsonrpc": "2.0", "id": 2, "method": "m" * 1_000_000}, headers=headers
        )
        assert r.json()["error"]["code"] == -32601 and len(r.content) < 1_000, len(r.content)
        r = client.post("/mcp", json=_tool_call("x" * 1_000_000, {}), headers=headers)
        assert "unknown tool" in r.text and len(r.content) < 1_000, len(r.content)

        r = client.post("/mcp", json=_tool_call("facts", {}), headers=headers)
        assert r.json()["result"]["structuredContent"] == {"user_id": "bounded", "facts": []}


def test_http_request_ids_that_are_not_ids_are_invalid_requests(base_url: str) -> None:
    """JSON-RPC ids are strings or integers; the SDK would take any other as a notification and
    answer 202 with no body, leaving the client waiting."""
    headers = {
        "Authorization": f"Bearer {KEY}",
        "X-MemSifter-User": "ids",
        "Accept": "application/json, text/event-stream",
    }
    with httpx.Client(base_url=base_url, timeout=30) as http:
        for rid in (None, True, 1.5, {"n": 1}, [1]):
            r = http.post("/mcp", json=_tool_call("facts", {}, rid), headers=headers)
            assert r.status_code == 400, (rid, r.status_code, r.text)
            reply = r.json()
            assert reply["id"] is None and reply["error"]["code"] == -32600
            assert "a request id is a string or an integer" in reply["error"]["message"]
        for rid in (7, "call-7"):
            r = http.post("/mcp", json=_tool_call("facts", {}, rid), headers=headers)
            assert r.status_code == 200 and r.json()["id"] == rid, r.text
        # A notification (no id at all) is still one.
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert http.post("/mcp", json=note, headers=headers).status_code == 202


# ----------------------------------------------------------------------------- the parts alone


class _Collect:
    def __init__(self) -> None:
        self.sent: list[SessionMessage] = []

    async def send(self, item: SessionMessage, /) -> None:
        self.sent.append(item)

    async def aclose(self) -> None:
        pass


def test_line_limit_replaces_an_over_long_reply_by_an_error_for_the_same_id() -> None:
    def reply(rid: Any, n: int) -> SessionMessage:
        return SessionMessage(JSONRPCResponse(jsonrpc="2.0", id=rid, result={"t": "x" * n}))

    def line(item: SessionMessage) -> int:
        return len(item.message.model_dump_json(by_alias=True, exclude_unset=True)) + 1

    async def run() -> list[SessionMessage]:
        out = _Collect()
        limited = LineLimit(out, limit=1_000)
        fits = reply(1, 1_000 - line(reply(1, 0)))  # exactly the limit
        await limited.send(fits)
        await limited.send(reply("r-2", 5_000))
        await limited.send(reply("i" * 2_000, 5_000))  # its id alone is over the limit
        note = JSONRPCNotification(jsonrpc="2.0", method="n", params={"t": "x" * 5_000})
        await limited.send(SessionMessage(note))  # nothing to answer: dropped
        assert line(fits) == 1_000 and out.sent[0] is fits
        return out.sent

    sent = asyncio.run(run())
    assert len(sent) == 3
    for item, rid in zip(sent[1:], ("r-2", None), strict=True):
        error = item.message
        assert isinstance(error, JSONRPCError) and error.id == rid
        found = re.match(r"the reply is ([\d,]+) bytes", error.error.message)
        assert found is not None and int(found[1].replace(",", "")) > 5_000, error.error.message
        assert "over the 1,000 one stdio line may carry" in error.error.message


def test_request_lines_hold_no_line_over_the_limit_and_answer_it_by_name() -> None:
    limit = 100
    fits = b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}'.ljust(limit)  # exactly the limit
    wire = io.BytesIO(b"\n".join([fits, b"y" * 250_000, b"", fits, b"z" * (limit + 1), b"end"]))

    async def run() -> tuple[list[str], list[SessionMessage]]:
        out = _Collect()
        lines = RequestLines(wire, limit)
        lines.answer_on(out)
        return [line async for line in lines], out.sent

    got, sent = asyncio.run(run())
    # The over-long lines are gone; the rest come through whole, the last without a newline.
    assert got == [fits.decode() + "\n", "\n", fits.decode() + "\n", "end"]
    sizes = []
    for item in sent:
        error = item.message
        assert isinstance(error, JSONRPCError) and error.id is None
        assert error.error.code == INVALID_REQUEST
        found = re.match(
            r"the request line has ([\d,]+) bytes; the limit is 100 ", error.error.message
        )
        assert found is not None, error.error.message
        sizes.append(int(found[1].replace(",", "")))
    assert sizes == [250_000, limit + 1]


def test_missing_memory_never_creates_the_database(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "memsifter.db"
    url = f"sqlite:///{path}"
    assert missing_memory(url) == f"there is no database file {path}"
    assert not (tmp_path / "deep").exists()
    path.parent.mkdir()
    path.touch()
    assert missing_memory(url) == f"the database {url} has no memory"
    _existing_memory(url).close()
    assert missing_memory(url) is None
