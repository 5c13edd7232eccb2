"""The README's main job: ``scripts/run.sh`` starts ``memsifter serve`` on the shipped default
config (SQLite, BM25 + YAKE bookmarks, coarse-only: no proxy beat BM25 on the test split) with
the sample seeded, and the first curl it prints answers, in under 2 s. Run here as the same
CLI command in a subprocess, without the setup step (the test venv is already set up)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from memsifter.testing.launch import free_port
from memsifter.testing.server import printed_key, wait_ready

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_main_job_serves_the_sample_coarse_only(tmp_path: Path) -> None:
    port = free_port()
    env = dict(os.environ)
    env.pop("MEMSIFTER_DEMO_KEY", None)  # the key is generated and printed, as on a fresh clone
    env |= {
        "MEMSIFTER_SERVE_DB_URL": f"sqlite:///{tmp_path / 'memsifter.db'}",
        "OMP_NUM_THREADS": "2",
        "HF_HUB_OFFLINE": "1",
    }
    log = tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "memsifter.cli", "serve", "--port", str(port), "--seed-sample"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        printed = wait_ready(proc, port, log)
        key = printed_key(printed)
        assert "generated; shown only now" in printed
        t0 = time.monotonic()
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/users/alice/recall",
            headers={"Authorization": f"Bearer {key}"},
            json={"question": "What is my dog called?", "top_k": 2},
            timeout=60,
        )
        elapsed = time.monotonic() - t0
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["ranker"] == "coarse-only"
        assert elapsed < 2.0, f"first recall took {elapsed:.2f} s"
        assert len(body["hits"]) == 2
        assert any("Max" in h["text"] for h in body["hits"])
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
