"""Servers for tests: waiting on a ``memsifter serve`` child process, the service's app on a TCP
port in a thread (with the connection settings ``memsifter serve`` gives uvicorn), and a
stand-in for a local inference server's launcher script (vLLM's, llama.cpp's) with the checks
that its whole process group went away."""

from __future__ import annotations

import re
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
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


def wait_until(
    check: Callable[[], bool], what: str, proc: subprocess.Popen, timeout: float
) -> None:
    """Poll ``check`` until it is true; fail the test with the child's output if ``proc`` exits
    first, or after ``timeout`` seconds (an HTTP error counts as not yet)."""
    import pytest

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            pytest.fail(f"the server exited ({proc.returncode}) waiting for {what}:\n{out[-3000:]}")
        try:
            if check():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")


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


# A launcher script's stand-in: answers GET /v1/models like vLLM and llama-server (its
# --served-model-name as the id), records its arguments in $PIDS/args, and starts a background
# `sleep` for the engine's child process, so a test sees the whole group go, not just the leader.
FAKE_LAUNCHER = r"""#!/usr/bin/env bash
[ "$1" = --setup-only ] && exit 0
echo "$@" > "$PIDS/args"
while [ $# -gt 0 ]; do
  case "$1" in --port) port=$2; shift 2 ;; --served-model-name) name=$2; shift 2 ;; *) shift ;; esac
done
sleep 300 & echo $! > "$PIDS/child"
echo $$ > "$PIDS/leader"
exec "$MEMSIFTER_PYTHON" -c '
import http.server, json, sys
name = sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"data": [{"id": name}]}).encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
' "$port" "$name"
"""


def stand_in_launcher(
    module: Any, folder: Path, monkeypatch: Any, text: str = FAKE_LAUNCHER
) -> Path:
    """Point ``module.SCRIPT`` (a launcher module: ``memsifter.llm.vllm_cpu``,
    ``memsifter.llm.llamacpp``) at a script with ``text`` in ``folder``, whose pid files land in
    ``folder`` too (``$PIDS``). Returns the script."""
    script = folder / "fake_server.sh"
    script.write_text(text)
    monkeypatch.setattr(module, "SCRIPT", script)
    monkeypatch.setenv("PIDS", str(folder))
    return script


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: a killed child of an already reaped leader is re-parented and may
    linger as a zombie, which counts as gone."""
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def group_gone(folder: Path, timeout_s: float = 5.0) -> bool:
    """Whether the stand-in's leader and child (pids in ``folder``) are both gone within
    ``timeout_s``."""
    pids = [int((folder / name).read_text()) for name in ("leader", "child")]
    deadline = time.monotonic() + timeout_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)
