"""The holes issue 13 found, each closed: a restricted agent can neither supersede, learn of,
nor delete facts it may not see; a revoked key stays revoked across restarts; session ids
cannot be collapsed by HTTP clients (dot segments, empty segments) or end in a control
character, and the client percent-encodes them; lengths are checked after normalising; ids
are bounded; response datetimes carry their offset; limits are in the OpenAPI schema and
integers are strict; a database outage is a 503; a stalled body is a 408. On SQLite, and on
PostgreSQL too when ``MEMSIFTER_TEST_PG_DSN`` is set."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine

from memsifter.serving.app import RequestMiddleware, create_app
from memsifter.serving.client import InvalidIdError, MemSifterClient
from memsifter.serving.config import AdminSettings, ApiKeySettings, ServeConfig
from memsifter.serving.errors import NotFoundError
from memsifter.serving.metrics import Metrics
from memsifter.serving.schemas import SessionIn, TurnIn
from memsifter.serving.store import hash_key

KEY = "key-security-full-0123456789"
TASK_KEY = "key-security-task-0123456789"
ADMIN = "admin-security-0123456789"
FULL = {"Authorization": f"Bearer {KEY}"}
TASKS = {"Authorization": f"Bearer {TASK_KEY}"}
AS_ADMIN = {"Authorization": f"Bearer {ADMIN}"}


def _config(db_url: str) -> ServeConfig:
    return ServeConfig(
        db_url=db_url,
        admin=AdminSettings(key_env=None, key_sha256=hash_key(ADMIN)),
        api_keys=[
            ApiKeySettings(tenant="acme", key_sha256=hash_key(KEY)),
            ApiKeySettings(
                tenant="acme", key_sha256=hash_key(TASK_KEY), agent="todo", fact_types=["task"]
            ),
        ],
    )


@pytest.fixture(scope="module")
def db_url(serve_db: Callable[[str], str]) -> str:
    return serve_db("security")


@pytest.fixture(scope="module")
def client(db_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(_config(db_url)), headers=FULL) as c:
        yield c


def _fact(kind: str, subject: str, text: str) -> dict[str, Any]:
    return {"type": kind, "subject": subject, "text": text}


# ----------------------------------------------------------------------------- fact visibility


def test_a_restricted_agent_cannot_supersede_a_fact_it_may_not_see(client: TestClient) -> None:
    base = "/v1/users/vera/facts"
    hidden = client.post(base, json=_fact("entity", "passport", "Passport no. X123."))
    hidden_id = hidden.json()["fact"]["fact_id"]
    mine = client.post(base, headers=TASKS, json=_fact("task", "Passport", "Renew passport."))
    assert mine.status_code == 201 and mine.json()["superseded"] == []  # nothing revealed
    # The entity fact is still live, for a key that may see it.
    assert client.get(f"{base}/{hidden_id}").status_code == 200
    listed = {f["fact_id"] for f in client.get(base).json()["facts"]}
    assert listed == {hidden_id, mine.json()["fact"]["fact_id"]}
    # A second task about the subject supersedes the agent's own task fact, and only it.
    again = client.post(base, headers=TASKS, json=_fact("task", "passport", "Renew it today."))
    assert again.json()["superseded"] == [mine.json()["fact"]["fact_id"]]


def test_a_restricted_agent_deletes_only_what_it_may_see(client: TestClient) -> None:
    base = "/v1/users/walt/facts"
    entity = client.post(base, json=_fact("entity", "car", "Drives a red Fiat.")).json()
    # A full key turns the entity fact into a task: the task's history is an entity fact.
    task = client.patch(
        f"{base}/{entity['fact']['fact_id']}", json={"type": "task", "text": "Sell the Fiat."}
    )
    assert task.status_code == 200 and task.json()["superseded"] == [entity["fact"]["fact_id"]]
    gone = client.delete(f"{base}/{task.json()['fact']['fact_id']}", headers=TASKS)
    assert gone.status_code == 200 and gone.json() == {"deleted": 1}  # not the entity history


def test_a_correction_cannot_name_a_fact_the_agent_may_not_see(client: TestClient) -> None:
    base = "/v1/users/xena/facts"
    hidden = client.post(base, json=_fact("preference", "tea", "Likes green tea.")).json()
    hidden_id = hidden["fact"]["fact_id"]
    r = client.patch(f"{base}/{hidden_id}", headers=TASKS, json={"text": "x"})
    assert r.status_code == 404 and r.json()["error"]["fields"][0]["field"] == "path.fact_id"
    # The store checks it too, inside the write (the route's check ran in an earlier read).
    store = client.app.state.services.store  # type: ignore[attr-defined]
    with pytest.raises(NotFoundError):
        store.add_fact(
            "acme",
            "xena",
            type="task",
            subject="tea",
            text="x",
            importance=0.5,
            supersedes=hidden_id,
            visible_types=("task",),
        )
    assert client.get(f"{base}/{hidden_id}").json()["text"] == "Likes green tea."


# ------------------------------------------------------------------------------------ revocation


def test_a_revoked_bootstrap_key_stays_revoked_after_a_restart(
    serve_db: Callable[[str], str],
) -> None:
    url = serve_db("revoke")
    with TestClient(create_app(_config(url))) as c:
        keys = c.get("/v1/admin/tenants/acme/keys", headers=AS_ADMIN).json()["keys"]
        task_key = next(k for k in keys if k["key_sha256_prefix"] == hash_key(TASK_KEY)[:8])
        assert c.delete(f"/v1/admin/keys/{task_key['key_id']}", headers=AS_ADMIN).is_success
        assert c.get("/v1/users/ann/facts", headers=TASKS).status_code == 401
    # The same config starts again: the missing full key would be re-added, the revoked one not.
    with TestClient(create_app(_config(url))) as c:
        assert c.get("/v1/users/ann/facts", headers=TASKS).status_code == 401
        assert c.get("/v1/users/ann/facts", headers=FULL).status_code == 200


# ------------------------------------------------------------------------------------ session ids


@pytest.mark.parametrize(
    "sid", ["x/../keep", "x/./keep", "x/..", "x/.", "a//b", "a/", "a/b/../c", "s1\n", "s\t1"]
)
def test_session_ids_that_http_clients_would_rewrite_are_refused(
    client: TestClient, sid: str
) -> None:
    body = {"sessions": [{"id": sid, "turns": [{"speaker": "u", "text": "hi"}]}]}
    r = client.post("/v1/users/yuri/sessions", json=body)
    assert r.status_code == 422, r.text
    assert [f["field"] for f in r.json()["error"]["fields"]] == ["body.sessions[0].id"]


def test_odd_but_safe_session_ids_still_work(client: TestClient) -> None:
    ms = MemSifterClient(api_key=KEY, http=client)
    turns = [TurnIn(speaker="u", text="Dots inside a segment are fine.")]
    ids = ["conv/7", "a..b/...", "v1.2/.hidden", "x/..y"]
    ms.ingest_sessions("yuri", [SessionIn(id=sid, turns=turns) for sid in ids])
    for sid in ids:
        assert ms.get_session("yuri", sid).session.session_id == sid


def test_the_client_percent_encodes_ids(client: TestClient) -> None:
    sent: list[str] = []
    client.event_hooks["request"] = [lambda request: sent.append(request.url.raw_path.decode())]
    try:
        ms = MemSifterClient(api_key=KEY, http=client)
        ms.ingest_sessions("zoe", [SessionIn(id="a/b", turns=[TurnIn(speaker="u", text="hi")])])
        assert ms.get_session("zoe", "a/b").session.session_id == "a/b"
    finally:
        client.event_hooks["request"] = []
    assert sent[-1] == "/v1/users/zoe/sessions/a%2Fb"


def test_a_control_character_in_a_session_path_never_reaches_another_session(
    client: TestClient,
) -> None:
    body = {"sessions": [{"id": "keep", "turns": [{"speaker": "u", "text": "keep me"}]}]}
    assert client.post("/v1/users/abe/sessions", json=body).status_code == 201
    for path in ("/v1/users/abe/sessions/keep%0A", "/v1/users/abe/sessions/keep%0D%0A"):
        r = client.delete(path)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["fields"][0]["field"] == "path.session_id"
    assert client.get("/v1/users/abe/sessions/keep").status_code == 200
    # Written into a URL by hand, "x/../keep" is collapsed to "keep" by the HTTP client itself,
    # before any server sees it; the typed client encodes it, and the service refuses it.
    ms = MemSifterClient(api_key=KEY, http=client)
    with pytest.raises(InvalidIdError, match="invalid session id 'x/../keep'"):
        ms.delete_session("abe", "x/../keep")
    assert client.get("/v1/users/abe/sessions/keep").status_code == 200


# ------------------------------------------------------------------------------ bounds and types


def test_a_subject_is_measured_after_normalising(client: TestClient) -> None:
    r = client.post("/v1/users/bea/facts", json=_fact("entity", "İ" * 200, "Dotted capitals."))
    assert r.status_code == 422, r.text
    assert r.json()["error"]["fields"][0]["field"] == "body.subject"
    ok = client.post("/v1/users/bea/facts", json=_fact("entity", "İ" * 100, "Fits."))
    assert ok.status_code == 201 and len(ok.json()["fact"]["subject"]) == 200


@pytest.mark.parametrize("key_id", ["2147483648", "99999999999999999999999"])
def test_a_huge_admin_key_id_is_a_422(client: TestClient, key_id: str) -> None:
    r = client.delete(f"/v1/admin/keys/{key_id}", headers=AS_ADMIN)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["fields"][0]["field"] == "path.key_id"


def test_response_datetimes_carry_their_offset(client: TestClient) -> None:
    session = {
        "id": "dated",
        "date": "2024-05-01T10:00:00",
        "turns": [{"speaker": "u", "text": "hi", "timestamp": "2024-05-01T12:00:00+02:00"}],
    }
    client.post("/v1/users/cal/sessions", json={"sessions": [session]})
    got = client.get("/v1/users/cal/sessions/dated").json()
    fact = client.post("/v1/users/cal/facts", json=_fact("task", "x", "y")).json()["fact"]
    stamps = [
        got["session"]["date"],
        got["session"]["created_at"],
        got["turns"][0]["timestamp"],
        fact["created_at"],
        fact["last_accessed_at"],
    ]
    parsed = [datetime.fromisoformat(s.replace("Z", "+00:00")) for s in stamps]
    assert all(p.utcoffset() is not None for p in parsed), stamps
    assert parsed[0].isoformat() == "2024-05-01T10:00:00+00:00"  # naive input was UTC
    assert parsed[2].isoformat() == "2024-05-01T10:00:00+00:00"  # +02:00 input, now in UTC


def test_limits_are_in_the_openapi_schema(client: TestClient) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    for name in ("RecallIn", "RankIn"):
        props = schemas[name]["properties"]
        top_k = props["top_k"]
        top_k = next((a for a in top_k.get("anyOf", []) if a.get("type") == "integer"), top_k)
        assert top_k["maximum"] == 100 and top_k["minimum"] == 1
        assert props["question"]["maxLength"] == 2000
    assert schemas["SessionIn"]["properties"]["id"]["maxLength"] == 128


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/users/cal/recall", {"question": "q", "top_k": True}, "body.top_k"),
        ("/v1/users/cal/recall", {"question": "q", "top_k": "3"}, "body.top_k"),
        ("/v1/users/cal/recall", {"question": "q", "top_k": 101}, "body.top_k"),
        ("/v1/users/cal/recall", {"question": "q" * 2001}, "body.question"),
        (
            "/v1/rank",
            {
                "question": "q",
                "top_k": False,
                "sessions": [{"id": "s", "turns": [{"speaker": "u", "text": "t"}]}],
            },
            "body.top_k",
        ),
        ("/v1/users/cal/context", {"question": "q", "budget_tokens": True}, "body.budget_tokens"),
    ],
)
def test_integers_are_strict_and_limits_hold(
    client: TestClient, path: str, body: dict[str, Any], field: str
) -> None:
    r = client.post(path, json=body)
    assert r.status_code == 422, r.text
    assert field in [f["field"] for f in r.json()["error"]["fields"]]


# ------------------------------------------------------------------------------ outages, stalls


def test_a_database_outage_is_a_503(db_url: str) -> None:
    app = create_app(_config(db_url))
    store = app.state.services.store
    dead = create_engine("sqlite:////nonexistent-dir/memsifter/none.db")
    saved = (store._reader, store._writer)
    store._reader = store._writer = dead
    try:
        with TestClient(app, headers=FULL) as c:
            for r in (
                c.get("/v1/users/ann/sessions"),
                c.post("/v1/users/ann/facts", json=_fact("task", "a", "b")),
            ):
                assert r.status_code == 503, r.text
                assert r.headers["retry-after"] == "1"
                assert r.json()["error"]["type"] == "unavailable"
            assert c.get("/readyz").status_code == 503
    finally:
        store._reader, store._writer = saved
        dead.dispose()


def test_a_stalled_body_is_a_408() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:  # never reached
        raise AssertionError("the app must not see a stalled request")

    middleware = RequestMiddleware(
        app, max_body_bytes=1000, metrics=Metrics("test"), body_timeout_s=0.05
    )
    chunks = [{"type": "http.request", "body": b'{"question": ', "more_body": True}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if chunks:
            return chunks.pop()
        await asyncio.sleep(3600)  # the client stalls
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/rank", "headers": []}
    asyncio.run(asyncio.wait_for(middleware(scope, receive, send), 5))
    assert sent[0]["status"] == 408
    assert b"stalled" in sent[1]["body"]
