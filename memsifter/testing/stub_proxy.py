"""A stand-in proxy model for ``eval/bench/bench_load.py --proxy stub``: an OpenAI-compatible
``/v1/completions`` server that answers every prompt after a fixed delay with a well-formed
ranking of its candidates (in the order shown). A prompt sent as token ids (the recall service
sends ids to an OpenAI backend) is decoded with ``--tokenizer`` first.

The service cannot tell it from vLLM, so the whole proxy path runs (prompt building with the
real tokenizer, the HTTP call, parsing), while the model's own time is known exactly. That
isolates what the goal "stack overhead over the model call" is about; a real model's latency
only adds to ``timings.proxy_ms``. ``eval/bench/stub_proxy.py`` runs it:

    python -m eval.bench.stub_proxy --port 8001 --latency-ms 50
"""

from __future__ import annotations

import json
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

from memsifter.testing.backends import n_candidates


def answer(prompt: str) -> str:
    """A well-formed ranking of the prompt's candidates, in the order shown."""
    n = n_candidates(prompt)
    return f"<think>stub</think><ranking>{', '.join(str(i) for i in range(n))}</ranking>"


def make_handler(latency_s: float, tokenizer: Any = None) -> type[BaseHTTPRequestHandler]:
    """A request handler that answers after ``latency_s``, decoding token-id prompts with
    ``tokenizer``."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, like a real inference server
        # TCP_NODELAY, as uvicorn (under vLLM) sets it: headers and body go out in two writes,
        # and on a kept-alive connection Nagle would hold the body for the client's delayed
        # ACK (~40 ms a request).
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass  # one line per request would cost more than the stub's work

        def _send(self, status: int, body: dict[str, object]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            if self.path.rstrip("/") in ("/v1/models", "/health"):
                self._send(200, {"object": "list", "data": [{"id": "stub"}]})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path.rstrip("/") != "/v1/completions":
                self._send(404, {"error": "not found"})
                return
            if latency_s > 0:
                time.sleep(latency_s)
            prompt = body.get("prompt", "")
            if isinstance(prompt, list):
                if tokenizer is None:
                    self._send(400, {"error": "token ids sent; start the stub with --tokenizer"})
                    return
                prompt = tokenizer.decode(prompt)
            text = answer(str(prompt))
            n = int(body.get("n", 1))
            self._send(
                200,
                {
                    "object": "text_completion",
                    "model": body.get("model", "stub"),
                    "choices": [
                        {"index": i, "text": text, "finish_reason": "stop"} for i in range(n)
                    ],
                    "usage": {"prompt_tokens": 0, "completion_tokens": 8 * n},
                },
            )

    return Handler
