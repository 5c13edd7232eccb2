"""Real servers for tests: waiting on a ``memsifter serve`` child process, and the service's
app on a TCP port in a thread, with the connection settings ``memsifter serve`` gives uvicorn."""

from __future__ import annotations

import re
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx


def wait_ready(proc: subprocess.Popen, port: int, log: Path, timeout_s: float = 300) -> str:
    """Poll ``/readyz`` until it answers 200 and return the server's output so far; fail with
    the log's tail if the process exits or ``timeout_s`` passes first."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no /readyz within {timeout_s:g} s\n" + log.read_text()
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return log.read_text()
        except httpx.TransportError:
            pass
        time.sleep(1)


def printed_key(printed: str) -> str:
    """The tenant key ``--seed-sample`` prints (``Bearer msk-…``)."""
    key = re.search(r"Bearer (msk-[\w-]+)", printed)
    assert key, printed[-3000:]
    return key.group(1)


@contextmanager
def live_server(config: Any) -> Iterator[str]:
    """``create_app(config)`` served by uvicorn on a free port of 127.0.0.1, in a thread, with
    ``memsifter serve``'s connection settings (header deadline, connection bound, keep-alive);
    yields the base URL and stops the server on exit."""
    import uvicorn

    from memsifter.serving.app import create_app
    from memsifter.serving.server import uvicorn_limits

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(config), host="127.0.0.1", port=port, log_config=None,
            **uvicorn_limits(config),
        )
    )  # fmt: skip
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def seed_session(sid: str, day: int, *texts: str) -> dict[str, Any]:
    """A session body for ``POST /v1/users/{user}/sessions`` (and MCP's ``remember``): turns
    alternate user and bot, dated 10:00 on ``day`` of May 2024."""
    turns = [{"speaker": "user" if i % 2 == 0 else "bot", "text": t} for i, t in enumerate(texts)]
    return {"id": sid, "date": f"2024-05-{day:02d}T10:00:00", "turns": turns}


# The two sessions the generated-input suites seed their user with, so reads, recall and
# deletions run over real rows.
SEED_SESSIONS = {
    "s-dog": seed_session(
        "s-dog", 1, "I adopted a golden retriever named Max.", "How old is Max?", "Two years."
    ),
    "s-run": seed_session("s-run", 2, "I signed up for the Lisbon half marathon.", "Great goal!"),
}
