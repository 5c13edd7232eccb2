"""The released proxy behind the recall service, as ``configs/serve/released_proxy.yaml`` serves it,
on a tiny random Qwen3 saved in the released model's layout (a folder named
``MemSifter-4B-Thinking``): ``/v1/users/{user}/recall``, ``/v1/rerank`` and MCP's ``recall`` each
send the official prompt on the wire, byte for byte what the official functions render
(:mod:`memsifter.ranker.official`, pinned to them by tests/ranker/test_official_prompt.py), and read
the answer by the official rules.

Between the service and the model server sits a recording forwarder, so the test reads the very
request body that reached the server.
- Fast: the forwarder answers itself, with a fixed completion in the official format, so the
  ranking that comes back is the model's ranking, completed from the coarse order.
- Slow (``vllm_server``): it forwards to the real vLLM CPU server on the same folder, and the
  server's own token count of each prompt is checked against the ids sent. A random model's answer
  does not parse by the official rules; the response's ``parse`` says so, and the coarse order
  answers, as the official toolkit does.

What differs from production, and why: the coarse filter is BM25 (BGE-M3's weights are not on this
machine), and the window and answer are a few thousand tokens (a random model writes until the
answer's limit).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from memsifter.data.types import Session, Turn
from memsifter.ranker.official import SETTINGS, official_messages
from memsifter.serving.config import ApiKeySettings, ServeConfig, load_serve_config
from memsifter.serving.store import hash_key
from memsifter.testing.server import live_server

ROOT = Path(__file__).resolve().parents[2]
KEY = "key-released-proxy-0123456789"
USER = "ana"
SERVED = "MemSifter-4B-Thinking"
# The model's answer in the fast test: sessions 2 then 0, the rest left to the coarse order.
ANSWER = "<think>The second trip is in session 2.</think>\n<ranking>2, 0</ranking>"

SESSIONS = [
    {
        "id": "s-dog",
        "date": "2024-05-01T10:00:00",
        "turns": [
            {"speaker": "user", "text": "I adopted a golden retriever named Max."},
            {"speaker": "assistant", "text": "Congratulations! How old is Max?"},
            {"speaker": "user", "text": "Two years old."},
        ],
    },
    {
        "id": "s-run",
        "date": "2024-05-02T10:00:00",
        "turns": [
            {"speaker": "user", "text": "I signed up for the Lisbon half marathon."},
            {"speaker": "assistant", "text": "Great goal!"},
        ],
    },
    {
        "id": "s-trip",
        "date": "2024-05-03T10:00:00",
        "turns": [
            {"speaker": "user", "text": "We fly to Porto for my sister's wedding in June."},
            {"speaker": "assistant", "text": "Porto in June is lovely."},
        ],
    },
]
QUESTION = "Where is my sister's wedding?"
DOCS = [
    "The dog park opens at eight.",
    "My sister Clara is getting married in Porto.",
    "Lisbon half marathon training plan.",
]


class _Recorder:
    """An OpenAI-compatible endpoint that records every request body, then answers with
    ``ANSWER`` itself or forwards the request unchanged to ``upstream``."""

    def __init__(self, upstream: str | None) -> None:
        self.upstream = upstream
        self.bodies: list[dict[str, Any]] = []
        self.replies: list[dict[str, Any]] = []

    def handler(self) -> type[BaseHTTPRequestHandler]:
        rec = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if rec.upstream:
                    r = httpx.get(rec.upstream + self.path.removeprefix("/v1"), timeout=60)
                    self._send(r.status_code, r.content)
                else:
                    self._send(200, json.dumps({"data": [{"id": SERVED}]}).encode())

            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                body = json.loads(raw)
                rec.bodies.append(body)
                if rec.upstream:
                    r = httpx.post(
                        rec.upstream + self.path.removeprefix("/v1"),
                        content=raw,
                        headers={"Content-Type": "application/json"},
                        timeout=600,
                    )
                    if r.status_code == 200:
                        rec.replies.append(r.json())
                    self._send(r.status_code, r.content)
                    return
                n = len(body["prompt"]) if isinstance(body["prompt"], list) else 1
                reply = {
                    "id": "cmpl-recorded",
                    "object": "text_completion",
                    "model": body["model"],
                    "choices": [
                        {"index": 0, "text": ANSWER, "finish_reason": "stop", "logprobs": None}
                    ],
                    "usage": {"prompt_tokens": n, "completion_tokens": 9, "total_tokens": n + 9},
                }
                rec.replies.append(reply)
                self._send(200, json.dumps(reply).encode())

            def log_message(self, *args: Any) -> None:
                pass

        return Handler


@contextmanager
def _recording(upstream: str | None) -> Iterator[tuple[str, _Recorder]]:
    rec = _Recorder(upstream)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = ThreadingHTTPServer(("127.0.0.1", port), rec.handler())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/v1", rec
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def released(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model in the released layout: a folder named like the checkpoint."""
    import shutil

    folder = tmp_path_factory.mktemp("hub") / SERVED
    shutil.copytree(tiny_qwen3, folder)
    return folder


def _config(released: Path, base_url: str, db_url: str) -> ServeConfig:
    cfg = load_serve_config(ROOT / "configs/serve/released_proxy.yaml")
    prompt = {**SETTINGS, "coarse": "bm25", "window_tokens": 4096, "completion_tokens": 48}
    proxy = dataclasses.replace(
        cfg.proxy, base_url=base_url, model=str(released), prompt=prompt, timeout_s=300.0
    )
    return dataclasses.replace(
        cfg,
        db_url=db_url,
        coarse="bm25",
        proxy=proxy,
        api_keys=[ApiKeySettings(tenant="acme", key_sha256=hash_key(KEY))],
    )


def _wire_text(body: dict[str, Any], tokenizer: Any) -> str:
    """The prompt as the server reads it: text, or the token ids the service counted."""
    prompt = body["prompt"]
    return prompt if isinstance(prompt, str) else tokenizer.decode(prompt)


def _official_prompt(tokenizer: Any, question: str, sessions: list[Session]) -> str:
    return tokenizer.apply_chat_template(
        official_messages(question, sessions), add_generation_prompt=True, tokenize=False
    )


def _stored_sessions() -> list[Session]:
    """The stored sessions as the service pages them: whole sessions (turns_per_page 1000),
    dated as the service writes a date, in the chronological order the official prompt shows."""
    return [
        Session(
            id=s["id"],
            turns=tuple(Turn(t["speaker"], t["text"]) for t in s["turns"]),
            date_text=s["date"].replace("T", " ")[:16],
        )
        for s in SESSIONS
    ]


def _doc_sessions(speaker: str) -> list[Session]:
    return [Session(id=str(i), turns=(Turn(speaker, d),)) for i, d in enumerate(DOCS)]


async def _mcp_recall(base_url: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {KEY}", "X-MemSifter-User": USER}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(600.0)) as http:
        transport = streamable_http_client(f"{base_url}/mcp", http_client=http)
        async with Client(transport) as client:
            result = await client.call_tool("recall", {"question": QUESTION, "top_k": 3})
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


def _serve_and_check(
    released: Path, upstream: str | None, db_url: str
) -> tuple[_Recorder, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Remember the sessions, then recall over REST, rerank, and recall over MCP; every request
    that reached the model server carried the official prompt for its candidates."""
    from transformers import AutoTokenizer

    from memsifter.serving.routes.rerank import SPEAKER

    tokenizer = AutoTokenizer.from_pretrained(released)
    with (
        _recording(upstream) as (base_url, rec),
        live_server(_config(released, base_url, db_url)) as url,
    ):
        headers = {"Authorization": f"Bearer {KEY}"}
        with httpx.Client(base_url=url, headers=headers, timeout=600) as http:
            r = http.post(f"/v1/users/{USER}/sessions", json={"sessions": SESSIONS})
            assert r.status_code == 201, r.text
            recall = http.post(f"/v1/users/{USER}/recall", json={"question": QUESTION, "top_k": 3})
            assert recall.status_code == 200, recall.text
            rerank = http.post("/v1/rerank", json={"query": QUESTION, "documents": DOCS})
            assert rerank.status_code == 200, rerank.text
        mcp = asyncio.run(_mcp_recall(url))

    assert len(rec.bodies) == 3, [b.get("prompt") for b in rec.bodies]
    stored = _official_prompt(tokenizer, QUESTION, _stored_sessions())
    docs = _official_prompt(tokenizer, QUESTION, _doc_sessions(SPEAKER))
    assert [_wire_text(b, tokenizer) for b in rec.bodies] == [stored, docs, stored]
    for body in rec.bodies:
        # The configured sampling and model name, and the ids the service counted.
        assert body["model"] == SERVED and body["temperature"] == 0.6
        if isinstance(body["prompt"], list):
            assert (
                body["prompt"]
                == tokenizer(stored if body is not rec.bodies[1] else docs)["input_ids"]
            )
    return rec, recall.json(), rerank.json(), mcp


def test_recall_rerank_and_mcp_send_the_official_prompt_and_read_the_official_answer(
    released: Path, serve_db: Callable[[str], str]
) -> None:
    _, recall, rerank, mcp = _serve_and_check(released, None, serve_db("released_fast"))
    # <ranking>2, 0</ranking>: sessions 2 and 0 of those shown (chronological), then the rest in
    # the coarse order.
    for hits in (recall["hits"], mcp["hits"]):
        assert [h["session_id"] for h in hits][:2] == ["s-trip", "s-dog"]
    assert [r["index"] for r in rerank["results"]][:2] == [2, 0]
    assert recall["ranker"] == mcp["ranker"] == rerank["ranker"]
    assert "proxy" in recall["ranker"]
    parse = recall["parse"]
    assert (parse["status"], parse["n_from_model"], parse["completed"]) == ("ok", 2, True)


@pytest.mark.slow
@pytest.mark.vllm_server
@pytest.mark.usefixtures("vllm_built")
def test_the_released_layout_served_by_vllm_through_every_door(
    released: Path, serve_db: Callable[[str], str]
) -> None:
    from transformers import AutoTokenizer

    from memsifter.llm.vllm_cpu import launch_vllm_cpu_server

    tokenizer = AutoTokenizer.from_pretrained(released)
    with launch_vllm_cpu_server(released, served_model_name=SERVED, timeout=300) as upstream:
        rec, recall, rerank, mcp = _serve_and_check(released, upstream, serve_db("released_vllm"))
    # The server read the very prompt the service rendered and counted.
    for body, reply in zip(rec.bodies, rec.replies, strict=True):
        sent = body["prompt"]
        n = len(sent) if isinstance(sent, list) else len(tokenizer(sent)["input_ids"])
        assert reply["usage"]["prompt_tokens"] == n
    assert len(recall["hits"]) == len(mcp["hits"]) == 3 and len(rerank["results"]) == 3
    # A random model's answer: what the official rules read of it, said in the response, and
    # completed from the coarse order.
    parse = recall["parse"]
    assert parse["completed"] and parse["status"] in ("ok", "failed")
    if parse["status"] == "failed":
        assert parse["n_from_model"] == 0 and parse["error"]
