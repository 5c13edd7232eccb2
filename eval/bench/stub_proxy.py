"""Runs the stand-in proxy model (``memsifter.testing.stub_proxy``) for
``bench_load.py --proxy stub``: an OpenAI-compatible server that answers every prompt with a
well-formed ranking after a fixed delay.

    python -m eval.bench.stub_proxy --port 8001 --latency-ms 50
"""

from __future__ import annotations

from http.server import ThreadingHTTPServer
from typing import Annotated

import typer

from memsifter.testing.stub_proxy import make_handler


def main(
    port: Annotated[int, typer.Option()] = 8001,
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    latency_ms: Annotated[float, typer.Option(help="the model's simulated time per call")] = 0.0,
    tokenizer: Annotated[
        str | None, typer.Option(help="decodes prompts sent as token ids (a model name)")
    ] = None,
) -> None:
    """Serves the stub on ``host:port`` until interrupted."""
    tok = None
    if tokenizer:
        from memsifter.models import load_tokenizer

        tok = load_tokenizer(tokenizer)
    server = ThreadingHTTPServer((host, port), make_handler(latency_ms / 1000, tok))
    server.daemon_threads = True
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    typer.run(main)
