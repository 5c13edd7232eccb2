"""``memsifter serve --workers 2`` as a user starts it, on a temporary SQLite database and, when
``MEMSIFTER_TEST_PG_DSN`` is set, on PostgreSQL: concurrent ingests and recalls all succeed
(writes of several processes to one user included), ``/metrics`` sums every worker
(Prometheus multiprocess mode), and a killed worker is replaced without its counts being lost
or its live gauge lingering."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from memsifter.serving.server import serve
from memsifter.testing.launch import free_port
from memsifter.testing.server import wait_until

KEY = "msk-workers-test-key-0123456789"
NAMES = ("Rex", "Bella", "Max", "Luna")


def _metric(text: str, name: str) -> float:
    """Sum of every sample of ``name`` (all label sets)."""
    pattern = re.compile(rf"^{re.escape(name)}(?:{{.*}})? (\S+)$", re.M)  # routes hold braces
    values = [float(v) for v in pattern.findall(text)]
    assert values, f"{name} not in /metrics"
    return sum(values)


@pytest.fixture
def two_workers(
    serve_db: Callable[[str], str], tmp_path: Path
) -> Iterator[tuple[httpx.Client, Path, subprocess.Popen]]:
    config = tmp_path / "serve.yaml"
    config.write_text(
        f"db_url: {serve_db('workers')}\n"
        "coarse: bm25\n"
        "ranker: coarse\n"
        "api_keys:\n  - tenant: acme\n    key_env: MEMSIFTER_WORKERS_TEST_KEY\n",
        encoding="utf-8",
    )
    metrics_dir = tmp_path / "prom"
    port = free_port()
    env = {
        **os.environ,
        "MEMSIFTER_WORKERS_TEST_KEY": KEY,
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
        "OMP_NUM_THREADS": "1",
    }
    cmd = [sys.executable, "-m", "memsifter.cli", "serve", "--config", str(config)]
    cmd += ["--port", str(port), "--workers", "2", "--log-level", "warning"]
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    client = httpx.Client(
        base_url=f"http://127.0.0.1:{port}",
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=60,
    )
    try:
        wait_until(
            lambda: "memsifter_workers 2.0" in client.get("/metrics").text,
            "two workers up",
            proc,
            120,
        )
        yield client, metrics_dir, proc
    finally:
        client.close()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _session(sid: str, text: str) -> dict:
    return {"id": sid, "turns": [{"speaker": "user", "text": text}], "date": "2024-05-01"}


@pytest.mark.slow  # starts server processes; CI runs it (docs/setup.md, the fast run)
def test_two_workers_serve_and_metrics_sum_over_them(
    two_workers: tuple[httpx.Client, Path, subprocess.Popen],
) -> None:
    client, metrics_dir, proc = two_workers
    users = [f"u{i}" for i in range(6)]

    def ingest(job: tuple[str, int]) -> int:
        user, i = job
        body = {"sessions": [_session(f"s{i}", f"my dog is called {NAMES[i]}")]}
        # A fresh connection each: the kernel hands them to either worker.
        with httpx.Client(base_url=client.base_url, headers=client.headers, timeout=60) as c:
            return c.post(f"/v1/users/{user}/sessions", json=body).status_code

    # Every user is written by several requests at once, so both processes write one user.
    jobs = [(u, i) for u in users for i in range(4)]
    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(ingest, jobs))
    assert codes == [201] * len(jobs), codes

    def recall(user: str) -> list[str]:
        with httpx.Client(base_url=client.base_url, headers=client.headers, timeout=60) as c:
            r = c.post(f"/v1/users/{user}/recall", json={"question": "Is Luna my dog?", "top_k": 4})
            assert r.status_code == 200, r.text
            return [h["session_id"] for h in r.json()["hits"]]

    with ThreadPoolExecutor(8) as pool:
        hits = list(pool.map(recall, users * 3))
    # Each recall, on whichever worker, sees every page written through either of them.
    assert all(sorted(set(h)) == ["s0", "s1", "s2", "s3"] for h in hits), hits
    assert all(h[0] == "s3" for h in hits), hits  # Luna

    text = client.get("/metrics").text
    assert _metric(text, "memsifter_workers") == 2
    served = _metric(text, "memsifter_request_seconds_count")
    assert served >= len(jobs) + 3 * len(users)
    pids = {
        int(m.group(1))
        for f in metrics_dir.glob("*.db")
        if (m := re.search(r"_(\d+)\.db$", f.name))
    }
    assert len(pids - {proc.pid}) >= 2  # files of two worker processes, summed above

    # Kill a worker: uvicorn starts another; the dead one's counts stay in the totals, and its
    # live gauge is reaped, so the count of workers is 2 again, not 3.
    live = sorted(
        int(m.group(1))
        for f in metrics_dir.glob("gauge_livesum_*.db")
        if (m := re.search(r"_(\d+)\.db$", f.name))
    )
    assert len(live) == 2
    os.kill(live[0], signal.SIGKILL)

    def replaced() -> bool:
        files = {f.name for f in metrics_dir.glob("gauge_livesum_*.db")}
        return f"gauge_livesum_{live[0]}.db" not in files and len(files) == 2

    wait_until(
        lambda: replaced() if client.get("/metrics").status_code == 200 else False,
        "the killed worker replaced",
        proc,
        120,
    )
    after = client.get("/metrics").text
    assert _metric(after, "memsifter_workers") == 2
    assert _metric(after, "memsifter_request_seconds_count") >= served
    assert client.post("/v1/users/u0/recall", json={"question": "Rex"}).status_code == 200


def test_workers_must_be_positive() -> None:
    from memsifter.serving.errors import ServeError

    with pytest.raises(ServeError, match="--workers must be at least 1"):
        serve(None, workers=0)


@pytest.mark.parametrize("workers", [1, 2])
def test_idle_connections_outlive_the_clients_keep_alive(
    workers: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """uvicorn closes idle connections after 5 s by default, as long as httpx keeps them: a
    client could send on a connection the server is closing (a reset, httpx ReadError). The
    service keeps them ``keep_alive_s`` (75 s), one worker or several."""
    import uvicorn

    seen: dict[str, object] = {}
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: seen.update(kw))
    config = tmp_path / "serve.yaml"
    config.write_text(f"db_url: sqlite:///{tmp_path / 'm.db'}\n")
    serve(config, workers=workers)
    assert seen["timeout_keep_alive"] == 75.0
    config.write_text(f"db_url: sqlite:///{tmp_path / 'm.db'}\nkeep_alive_s: 20\n")
    serve(config, workers=workers)
    assert seen["timeout_keep_alive"] == 20.0


def _hold(lock: object, log: str, rounds: int) -> None:
    for _ in range(rounds):
        with lock:  # type: ignore[attr-defined]
            with open(log, "a") as f:
                f.write(f"in {os.getpid()}\n")
            time.sleep(0.003)
            with open(log, "a") as f:
                f.write(f"out {os.getpid()}\n")


@pytest.mark.skipif(sys.platform == "win32", reason="flock")
def test_sqlite_writers_of_several_processes_take_turns(tmp_path: Path) -> None:
    """Workers share one SQLite file: its ``WriterLock`` lets one process write at a time (and
    blocks the others in the kernel rather than in SQLite's sleeping busy handler). The lock
    object is used in the parent before the fork, so the children also prove that each
    process takes its own lock rather than the parent's inherited one."""
    import multiprocessing

    from memsifter.serving.store.engine import WriterLock

    lock = WriterLock(tmp_path / "s.db")
    log = str(tmp_path / "log")
    with lock:
        pass
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_hold, args=(lock, log, 15)) for _ in range(3)]
    for p in procs:
        p.start()
    _hold(lock, log, 15)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    lines = Path(log).read_text().splitlines()
    assert len(lines) == 2 * 15 * 4
    for enter, leave in zip(lines[::2], lines[1::2], strict=True):
        assert enter.startswith("in ") and leave == "out " + enter[3:], lines
