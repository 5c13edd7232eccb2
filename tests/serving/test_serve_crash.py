"""A server killed (SIGKILL) while clients ingest leaves the pages and their BM25 index
agreeing: after a restart every acknowledged session is found by its own rare word (0 lost),
every hit is a page that exists (0 phantoms), and the stored postings are exactly what indexing
the pages again writes. Runs on SQLite, and on PostgreSQL when ``MEMSIFTER_TEST_PG_DSN`` is
set."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from memsifter.serving.store import Store
from memsifter.serving.store.schema import IndexTermRow, PageRow, PostingRow
from memsifter.testing.launch import free_port
from memsifter.testing.server import wait_until
from memsifter.text import get_analyzer

KEY = "msk-crash-test-key-0123456789abcd"


def _start(config: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "MEMSIFTER_CRASH_TEST_KEY": KEY, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "memsifter.cli", "serve", "--config", str(config)]
    cmd += ["--port", str(port), "--log-level", "warning"]
    return subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: SIGKILL reaches every process
    )


@pytest.fixture
def server(
    serve_db: Callable[[str], str], tmp_path: Path
) -> Iterator[tuple[Callable[[], subprocess.Popen], httpx.Client, str]]:
    db = serve_db("crash")
    config = tmp_path / "serve.yaml"
    config.write_text(
        f"db_url: {db}\ncoarse: bm25\nranker: coarse\n"
        "api_keys:\n  - tenant: acme\n    key_env: MEMSIFTER_CRASH_TEST_KEY\n",
        encoding="utf-8",
    )
    port = free_port()
    client = httpx.Client(
        base_url=f"http://127.0.0.1:{port}",
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=30,
    )
    procs: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        proc = _start(config, port)
        procs.append(proc)
        wait_until(lambda: client.get("/healthz").status_code == 200, "the server", proc, 120)
        return proc

    try:
        yield start, client, db
    finally:
        client.close()
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _word(i: int) -> str:
    return f"zq{i:05d}x"  # one rare word per session, its own BM25 term


@pytest.mark.slow
def test_a_kill_during_ingest_loses_nothing_acknowledged_and_leaves_no_phantom(
    server: tuple[Callable[[], subprocess.Popen], httpx.Client, str],
) -> None:
    start, client, db = server
    proc = start()
    acked: list[int] = []
    sent: list[int] = []
    stop = threading.Event()

    def ingest() -> None:
        with httpx.Client(base_url=client.base_url, headers=client.headers, timeout=30) as c:
            i = 0
            while not stop.is_set():
                sent.append(i)
                body = {
                    "sessions": [
                        {
                            "id": f"s{i}",
                            "date": "2024-05-01",
                            "turns": [
                                {"speaker": "user", "text": f"My locker code is {_word(i)}."},
                                {"speaker": "bot", "text": "Noted, I will remember it."},
                            ],
                        }
                    ]
                }
                try:
                    if c.post("/v1/users/kim/sessions", json=body).status_code == 201:
                        acked.append(i)
                except httpx.HTTPError:
                    return  # the server died mid-request
                i += 1

    writer = threading.Thread(target=ingest)
    writer.start()
    deadline = time.monotonic() + 60
    while len(acked) < 40 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # mid-stream: a request is usually in flight
    proc.wait()
    stop.set()
    writer.join(30)
    assert len(acked) >= 40

    start()
    for i in sent:
        r = client.post("/v1/users/kim/recall", json={"question": _word(i), "top_k": 3})
        assert r.status_code == 200, r.text
        hits = r.json()["hits"]
        stored = client.get(f"/v1/users/kim/sessions/s{i}").status_code == 200
        if i in acked:
            assert hits and hits[0]["session_id"] == f"s{i}", (i, hits)  # 0 lost
        if not stored:  # sent, not committed: nothing may find it
            assert all(h["session_id"] != f"s{i}" for h in hits), (i, hits)
        for h in hits:  # 0 phantoms: every hit is a stored page
            assert client.get(f"/v1/users/kim/sessions/{h['session_id']}").status_code == 200

    # The postings the crash left equal those indexing the pages again writes.
    store = Store(db)
    try:
        before = _postings(store)
        analyzer = get_analyzer()
        from collections import Counter

        assert store.reindex_user("acme", "kim", analyzer.identity, lambda t: Counter(analyzer(t)))
        assert _postings(store) == before
    finally:
        store.close()


def _postings(store: Store) -> set[tuple[str, str, int, int | None]]:
    with store._read() as s:
        rows = s.execute(
            select(PageRow.page_id, IndexTermRow.term, PostingRow.tf, PageRow.n_terms)
            .join(PostingRow, PostingRow.page_pk == PageRow.pk)
            .join(IndexTermRow, IndexTermRow.pk == PostingRow.term_pk)
            .where(PageRow.tenant_id == "acme", PageRow.user_id == "kim")
        ).all()
    return {tuple(row) for row in rows}
