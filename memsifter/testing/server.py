"""Waiting on a ``memsifter serve`` child process, for tests that start the real server."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

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
