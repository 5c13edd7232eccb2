"""Run an OpenAI-compatible inference server as a child process for the length of a ``with``
block: the one mechanism behind the vLLM CPU launcher (:mod:`memsifter.llm.vllm_cpu`) and the
llama.cpp one (:mod:`memsifter.llm.llamacpp`).

The server runs in its own process group (a launcher script execs the server, which may fork an
engine and workers), so leaving the block ends all of them. It is ready when ``GET /v1/models``
lists its served name: both servers answer that only once the model is loaded (llama.cpp says 503
while loading). A server that dies or does not answer in time raises the caller's error type with
the tail of its log, since the cause (a bad model, a port in use, out of memory) is only ever
written there.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from memsifter.errors import MemSifterError


def free_port() -> int:
    # Another process could take it before the server binds; the caller then gets a clear
    # "address already in use" in the log tail, which is rare enough not to retry for.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def log_tail(path: Path, lines: int = 60) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "<no log>"
    return "\n".join(text.splitlines()[-lines:])


def served_models(base_url: str) -> list[str] | None:
    """The ids ``/v1/models`` lists, or None while the server does not answer."""
    try:
        with urllib.request.urlopen(f"{base_url}/models", timeout=5) as r:
            return [m["id"] for m in json.load(r).get("data", [])]
    except (OSError, ValueError, KeyError):  # URLError/HTTPError are OSErrors; 503 while loading
        return None


def stop_group(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM the whole group (servers shut their engines down on it), SIGKILL what is left."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        # The leader is gone; an engine or worker it failed to reap may still hold the group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return


@contextlib.contextmanager
def run_server(
    cmd: Sequence[str],
    *,
    port: int,
    served_name: str,
    timeout: float,
    label: str,
    error: type[MemSifterError],
    env: Mapping[str, str] | None = None,
    log_path: str | Path | None = None,
) -> Iterator[str]:
    """Start ``cmd`` (a server listening on 127.0.0.1:``port``), wait until it serves
    ``served_name``, yield ``http://127.0.0.1:PORT/v1``, and stop its process group afterwards.

    ``timeout`` bounds the startup; ``label`` names the server in errors (raised as ``error``).
    ``log_path`` keeps the server's output (default: a temporary file, removed afterwards).
    """
    # Otherwise the readiness poll could be answered by whatever already listens there.
    if port_in_use(port):
        raise error(f"port {port} is already in use")
    base_url = f"http://127.0.0.1:{port}/v1"
    own_log = log_path is None
    if log_path is None:
        fd, log_name = tempfile.mkstemp(prefix="memsifter-server-", suffix=".log")
        os.close(fd)
        log = Path(log_name)
    else:
        log = Path(log_path)
    with open(log, "wb") as log_file:
        # A file, not a pipe: nobody reads a pipe while we wait, and servers log enough to fill one.
        proc = subprocess.Popen(
            list(cmd),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise error(
                    f"{label} exited with {proc.returncode} before answering "
                    f"({' '.join(cmd)}); log tail:\n{log_tail(log)}"
                )
            if served_name in (served_models(base_url) or []):
                break
            if time.monotonic() > deadline:
                raise error(
                    f"{label} did not answer {base_url}/models within {timeout:.0f} s "
                    f"({' '.join(cmd)}); log tail:\n{log_tail(log)}"
                )
            time.sleep(0.2)
        yield base_url
    finally:
        stop_group(proc)
        if own_log:
            log.unlink(missing_ok=True)


__all__ = ["free_port", "log_tail", "port_in_use", "run_server", "served_models", "stop_group"]
