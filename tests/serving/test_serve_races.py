"""Concurrent writes to one user never answer 5xx and leave consistent data: simultaneous
ingests of one session id (``replace`` false and true), deleting a user while ingesting into it,
and simultaneous facts about one subject (exactly one stays live). The races that 500'd on
PostgreSQL (issue 13); they run on SQLite too, and on PostgreSQL when ``MEMSIFTER_TEST_PG_DSN``
is set (the ``serve_db`` fixture). Also: a violated constraint becomes the 409/404 it stands
for, and a transaction the database keeps aborting (deadlock, serialization failure) is retried
and then a 503."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.exc import OperationalError

from memsifter.data.types import Session, Turn
from memsifter.serving.app import create_app
from memsifter.serving.config import ApiKeySettings, ServeConfig
from memsifter.serving.errors import ConflictError, UnavailableError
from memsifter.serving.store import PageRecord, SessionRecord, Store, hash_key, retried_write
from memsifter.serving.store import engine as store_engine

KEY = "key-races-0123456789"
THREADS = 8
ROUNDS = 4


@pytest.fixture(scope="module")
def client(serve_db: Callable[[str], str]) -> Iterator[TestClient]:
    config = ServeConfig(
        db_url=serve_db("races"),
        api_keys=[ApiKeySettings(tenant="acme", key_sha256=hash_key(KEY))],
    )
    with TestClient(create_app(config), headers={"Authorization": f"Bearer {KEY}"}) as c:
        yield c


def _at_once(n: int, call: Callable[[int], Any]) -> list[Any]:
    """Run ``call(i)`` for i < n on n threads released together; every result, in order."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = call(i)
        except BaseException as e:  # noqa: BLE001 - a crash is a result the test reports
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _session(sid: str, text: str) -> dict[str, Any]:
    return {"id": sid, "turns": [{"speaker": "u", "text": text}, {"speaker": "b", "text": "ok"}]}


def _statuses(results: list[Any]) -> list[int]:
    assert not [r for r in results if isinstance(r, BaseException)], results
    return [r.status_code for r in results]


def test_simultaneous_ingests_of_one_session_id(client: TestClient) -> None:
    for _ in range(ROUNDS):
        user = f"/v1/users/r-{uuid.uuid4().hex[:8]}"

        def ingest(i: int, user: str = user) -> Any:
            body = {"sessions": [_session("same", f"version {i} of the story")]}
            return client.post(f"{user}/sessions", json=body)

        results = _at_once(THREADS, ingest)
        statuses = _statuses(results)
        assert sorted(statuses) == [201] + [409] * (THREADS - 1), [r.text for r in results]
        for r in results:
            if r.status_code == 409:
                fields = [f["field"] for f in r.json()["error"]["fields"]]
                assert fields == ["body.sessions[0].id"]
        assert client.get(f"{user}/sessions").json()["total"] == 1


def test_simultaneous_replaces_of_one_session_id(client: TestClient) -> None:
    for _ in range(ROUNDS):
        user = f"/v1/users/r-{uuid.uuid4().hex[:8]}"
        client.post(f"{user}/sessions", json={"sessions": [_session("same", "the original")]})

        def replace(i: int, user: str = user) -> Any:
            body = {"sessions": [_session("same", f"replacement {i}")], "replace": True}
            return client.post(f"{user}/sessions", json=body)

        statuses = _statuses(_at_once(THREADS, replace))
        assert statuses == [201] * THREADS
        listed = client.get(f"{user}/sessions").json()
        assert listed["total"] == 1
        got = client.get(f"{user}/sessions/same").json()
        assert got["turns"][0]["text"].startswith("replacement ")
        # One session's pages, not several replaced ones' leftovers: recall sees one page.
        hits = client.post(f"{user}/recall", json={"question": "replacement", "top_k": 10})
        assert hits.status_code == 200 and len(hits.json()["hits"]) == 1


def test_deleting_a_user_while_ingesting(client: TestClient) -> None:
    for _ in range(ROUNDS):
        user = f"/v1/users/r-{uuid.uuid4().hex[:8]}"
        client.post(f"{user}/sessions", json={"sessions": [_session("first", "hello")]})

        def act(i: int, user: str = user) -> Any:
            if i % 4 == 0:
                return client.delete(user, params={"confirm": user.rsplit("/", 1)[-1]})
            body = {"sessions": [_session(f"s{i}", f"session number {i}")]}
            return client.post(f"{user}/sessions", json=body)

        results = _at_once(THREADS, act)
        statuses = _statuses(results)
        assert all(s < 500 for s in statuses), [r.text for r in results]
        assert all(s == 201 for i, s in enumerate(statuses) if i % 4), statuses
        assert all(s in (200, 404) for i, s in enumerate(statuses) if i % 4 == 0), statuses
        # Whatever interleaving happened, the user's data is whole: every listed session opens.
        listed = client.get(f"{user}/sessions").json()["sessions"]
        for s in listed:
            assert client.get(f"{user}/sessions/{s['session_id']}").status_code == 200


def test_simultaneous_facts_about_one_subject_leave_one_live(client: TestClient) -> None:
    for _ in range(ROUNDS):
        user = f"/v1/users/r-{uuid.uuid4().hex[:8]}"

        def remember(i: int, user: str = user) -> Any:
            fact = {"type": "entity", "subject": "Home City", "text": f"Lives in city {i}."}
            return client.post(f"{user}/facts", json=fact)

        results = _at_once(THREADS, remember)
        assert _statuses(results) == [201] * THREADS, [r.text for r in results]
        live = client.get(f"{user}/facts").json()["facts"]
        assert len(live) == 1, live
        # Serialised: each fact superseded exactly the one live before it, so the superseded
        # lists chain all the others, each once.
        superseded = [fid for r in results for fid in r.json()["superseded"]]
        ids = {r.json()["fact"]["fact_id"] for r in results}
        assert sorted(superseded) == sorted(ids - {live[0]["fact_id"]})


def test_a_violated_unique_key_is_a_409_naming_the_field(serve_db: Callable[[str], str]) -> None:
    """The net under the user lock: a duplicate that reaches the database (here, one request
    carrying the same session twice, which the routes refuse earlier) is a ConflictError."""
    store = Store(serve_db("unique"))
    store.migrate()
    store.ensure_tenant("acme")
    turns = (Turn("u", "hi"), Turn("b", "hello"))
    record = SessionRecord(Session(id="dup", turns=turns), 2, (PageRecord("dup#0", 0, 2, 2),))
    with pytest.raises(ConflictError) as e:
        store.put_sessions("acme", "ann", [record, record])
    assert e.value.status == 409 and e.value.field == "sessions[1].id"
    assert store.list_sessions("acme", "ann")[1] == 0  # nothing of it was kept
    store.close()


class _Aborted(Exception):
    sqlstate = "40P01"  # deadlock_detected, as psycopg reports it


def test_transient_aborts_are_retried_then_a_503(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_engine, "wait_random_exponential", lambda **_kw: lambda _s: 0.0)
    calls = {"n": 0}

    @retried_write
    def flaky(fail_times: int) -> str:
        calls["n"] += 1
        if calls["n"] <= fail_times:
            raise OperationalError("UPDATE users ...", {}, _Aborted("deadlock detected"))
        return "done"

    assert flaky(2) == "done" and calls["n"] == 3
    calls["n"] = 0
    with pytest.raises(UnavailableError) as e:
        flaky(100)
    assert e.value.status == 503 and calls["n"] == store_engine.WRITE_ATTEMPTS

    @retried_write
    def broken() -> None:  # not transient: raised as it is, at once
        calls["n"] += 1
        raise OperationalError("SELECT 1", {}, Exception("connection refused"))

    calls["n"] = 0
    with pytest.raises(OperationalError):
        broken()
    assert calls["n"] == 1
