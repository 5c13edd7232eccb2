"""Bad input never gets a 500: each malformed request below gets the 4xx it deserves, in the
service's error shape, naming the field at fault. On SQLite, and on PostgreSQL too when
``MEMSIFTER_TEST_PG_DSN`` is set."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from memsifter.serving.app import create_app
from memsifter.serving.config import ApiKeySettings, LimitSettings, ServeConfig
from memsifter.serving.store import hash_key

KEY = "key-bad-input-0123456789"
FACT = "00000000-0000-4000-8000-000000000000"  # well-formed, never issued


@pytest.fixture(scope="module")
def client(serve_db: Callable[[str], str]) -> Iterator[TestClient]:
    config = ServeConfig(
        db_url=serve_db("bad"),
        limits=LimitSettings(max_body_bytes=200_000, max_sessions=20, max_question_chars=1000),
        api_keys=[ApiKeySettings(tenant="acme", key_sha256=hash_key(KEY))],
    )
    with TestClient(create_app(config), headers={"Authorization": f"Bearer {KEY}"}) as c:
        r = c.post("/v1/users/bob/sessions", json={"sessions": [_session("s1")]})
        assert r.status_code == 201, r.text
        r = c.post("/v1/users/bob/turns", json={"turns": [_turn()], "session_prefix": "raw"})
        assert r.status_code == 201, r.text
        yield c


def _session(sid: str = "s", **over: Any) -> dict[str, Any]:
    return {"id": sid, "turns": [{"speaker": "u", "text": "hello there"}], **over}


def _rank(**over: Any) -> dict[str, Any]:
    return {"question": "who?", "sessions": [_session()], **over}


def _turn(**over: Any) -> dict[str, Any]:
    return {"speaker": "u", "text": "hi", **over}


def _fact(**over: Any) -> dict[str, Any]:
    return {"type": "preference", "subject": "tea", "text": "Likes tea.", **over}


JSON = {"content-type": "application/json"}
NO_KEY = {"Authorization": ""}
RANK, BOB = "/v1/rank", "/v1/users/bob"

CASES: list[tuple[str, str, str, dict[str, Any], int, str]] = [
    # (id, method, path, request kwargs, status, field named)
    ("malformed-json", "POST", RANK, {"content": b'{"question": ', "headers": JSON}, 400, "body"),
    (
        "trailing-garbage",
        "POST",
        RANK,
        {"content": b'{"question": "q"} x', "headers": JSON},
        400,
        "body",
    ),
    (
        "non-utf8",
        "POST",
        RANK,
        {"content": b'{"question": "\xff\xfe"}', "headers": JSON},
        400,
        "body",
    ),
    (
        "utf16-bom",
        "POST",
        RANK,
        {"content": '{"q": 1}'.encode("utf-16"), "headers": JSON},
        400,
        "body",
    ),
    ("deep-nesting", "POST", RANK, {"content": b"[" * 100_000, "headers": JSON}, 400, "body"),
    (
        "deep-nesting-valid",
        "POST",
        RANK,
        {"content": b"[" * 1000 + b"]" * 1000, "headers": JSON},
        400,
        "body",
    ),
    ("empty-body", "POST", RANK, {"content": b"", "headers": JSON}, 422, "body"),
    ("array-body", "POST", RANK, {"json": [1, 2]}, 422, "body"),
    ("string-body", "POST", RANK, {"json": "rank please"}, 422, "body"),
    (
        "text-plain",
        "POST",
        RANK,
        {"content": b"question=who", "headers": {"content-type": "text/plain"}},
        422,
        "body",
    ),
    ("question-missing", "POST", RANK, {"json": {"sessions": [_session()]}}, 422, "body.question"),
    ("question-empty", "POST", RANK, {"json": _rank(question="")}, 422, "body.question"),
    ("question-blank", "POST", RANK, {"json": _rank(question=" \n\t")}, 422, "body.question"),
    ("question-int", "POST", RANK, {"json": _rank(question=42)}, 422, "body.question"),
    ("question-null", "POST", RANK, {"json": _rank(question=None)}, 422, "body.question"),
    (
        "question-surrogate",
        "POST",
        RANK,
        {"content": b'{"question": "a\\ud800b", "sessions": []}', "headers": JSON},
        422,
        "body.question",
    ),
    ("question-nul", "POST", RANK, {"json": _rank(question="a\x00b")}, 422, "body.question"),
    (
        "question-too-long",
        "POST",
        RANK,
        {"json": _rank(question="why " * 300)},
        413,
        "body.question",
    ),
    ("sessions-missing", "POST", RANK, {"json": {"question": "q"}}, 422, "body.sessions"),
    ("sessions-empty", "POST", RANK, {"json": _rank(sessions=[])}, 422, "body.sessions"),
    ("sessions-object", "POST", RANK, {"json": _rank(sessions={"id": "s"})}, 422, "body.sessions"),
    (
        "too-many-sessions",
        "POST",
        RANK,
        {"json": _rank(sessions=[_session(f"s{i}") for i in range(21)])},
        413,
        "body.sessions",
    ),
    (
        "session-id-missing",
        "POST",
        RANK,
        {"json": _rank(sessions=[{"turns": [_turn()]}])},
        422,
        "body.sessions[0].id",
    ),
    (
        "session-id-hash",
        "POST",
        RANK,
        {"json": _rank(sessions=[_session("a#1")])},
        422,
        "body.sessions[0].id",
    ),
    (
        "session-id-too-long",
        "POST",
        RANK,
        {"json": _rank(sessions=[_session("s" * 200)])},
        422,
        "body.sessions[0].id",
    ),
    (
        "session-id-repeats",
        "POST",
        RANK,
        {"json": _rank(sessions=[_session("a"), _session("a")])},
        422,
        "body.sessions[1].id",
    ),
    (
        "turns-empty",
        "POST",
        RANK,
        {"json": _rank(sessions=[_session(turns=[])])},
        422,
        "body.sessions[0].turns",
    ),
    (
        "turn-text-list",
        "POST",
        RANK,
        {"json": _rank(sessions=[_session(turns=[_turn(text=["hi"])])])},
        422,
        "body.sessions[0].turns[0].text",
    ),
    (
        "turn-speaker-missing",
        "POST",
        RANK,
        {"json": _rank(sessions=[_session(turns=[{"text": "hi"}])])},
        422,
        "body.sessions[0].turns[0].speaker",
    ),
    (
        "turn-text-too-long",
        "POST",
        RANK,
        {"json": _rank(sessions=[_session(turns=[_turn(text="x" * 20_001)])])},
        413,
        "body.sessions[0].turns[0].text",
    ),
    (
        "turn-id-repeats",
        "POST",
        RANK,
        {"json": _rank(sessions=[_session(turns=[_turn(turn_id="1"), _turn(turn_id="1")])])},
        422,
        "body.sessions[0].turns[1].turn_id",
    ),
    (
        "turn-timestamp-word",
        "POST",
        RANK,
        {"json": _rank(sessions=[_session(turns=[_turn(timestamp="yesterday")])])},
        422,
        "body.sessions[0].turns[0].timestamp",
    ),
    (
        "session-date-impossible",
        "POST",
        RANK,
        {"json": _rank(sessions=[_session(date="2024-13-45")])},
        422,
        "body.sessions[0].date",
    ),
    ("unknown-top-field", "POST", RANK, {"json": _rank(temperature=0.7)}, 422, "body.temperature"),
    (
        "unknown-turn-field",
        "POST",
        RANK,
        {"json": _rank(sessions=[_session(turns=[_turn(mood="happy")])])},
        422,
        "body.sessions[0].turns[0].mood",
    ),
    ("top-k-zero", "POST", RANK, {"json": _rank(top_k=0)}, 422, "body.top_k"),
    ("top-k-huge", "POST", RANK, {"json": _rank(top_k=10**30)}, 422, "body.top_k"),
    ("top-k-word", "POST", RANK, {"json": _rank(top_k="five")}, 422, "body.top_k"),
    ("top-k-fraction", "POST", RANK, {"json": _rank(top_k=2.5)}, 422, "body.top_k"),
    ("body-too-large", "POST", RANK, {"json": _rank(question="q" * 250_000)}, 413, "body"),
    ("no-api-key", "POST", RANK, {"json": _rank(), "headers": NO_KEY}, 401, "header.Authorization"),
    (
        "wrong-api-key",
        "POST",
        RANK,
        {"json": _rank(), "headers": {"Authorization": "Bearer nope"}},
        401,
        "header.Authorization",
    ),
    (
        "basic-auth",
        "GET",
        f"{BOB}/sessions",
        {"headers": {"Authorization": "Basic dTpw"}},
        401,
        "header.Authorization",
    ),
    ("user-id-spaces", "GET", "/v1/users/bad%20user/sessions", {}, 422, "path.user_id"),
    ("user-id-too-long", "GET", f"/v1/users/{'u' * 200}/sessions", {}, 422, "path.user_id"),
    (
        "unknown-user-recall",
        "POST",
        "/v1/users/nobody/recall",
        {"json": {"question": "q"}},
        404,
        "path.user_id",
    ),
    (
        "unknown-user-delete",
        "DELETE",
        "/v1/users/nobody",
        {"params": {"confirm": "nobody"}},
        404,
        "path.user_id",
    ),
    # A user delete names the user twice; a path that lost its tail names it once.
    ("user-delete-unconfirmed", "DELETE", BOB, {}, 400, "query.confirm"),
    (
        "user-delete-other-confirm",
        "DELETE",
        BOB,
        {"params": {"confirm": "eve"}},
        400,
        "query.confirm",
    ),
    ("unknown-session-get", "GET", f"{BOB}/sessions/nope", {}, 404, "path.session_id"),
    ("unknown-session-delete", "DELETE", f"{BOB}/sessions/nope", {}, 404, "path.session_id"),
    (
        "session-exists",
        "POST",
        f"{BOB}/sessions",
        {"json": {"sessions": [_session("s1")]}},
        409,
        "body.sessions[0].id",
    ),
    (
        "ingest-replace-word",
        "POST",
        f"{BOB}/sessions",
        {"json": {"sessions": [_session()], "replace": "maybe"}},
        422,
        "body.replace",
    ),
    (
        "turns-gap-zero",
        "POST",
        f"{BOB}/turns",
        {"json": {"turns": [_turn()], "max_gap_hours": 0}},
        422,
        "body.max_gap_hours",
    ),
    (
        "turns-prefix-bad",
        "POST",
        f"{BOB}/turns",
        {"json": {"turns": [_turn()], "session_prefix": "a b"}},
        422,
        "body.session_prefix",
    ),
    (
        "turns-prefix-taken",
        "POST",
        f"{BOB}/turns",
        {"json": {"turns": [_turn()], "session_prefix": "raw"}},
        409,
        "body.session_prefix",
    ),
    (
        "turn-id-space",
        "POST",
        f"{BOB}/turns",
        {"json": {"turns": [_turn(turn_id="a b")]}},
        422,
        "body.turns[0].turn_id",
    ),
    (
        "recall-question-empty",
        "POST",
        f"{BOB}/recall",
        {"json": {"question": ""}},
        422,
        "body.question",
    ),
    (
        "recall-top-k-over-limit",
        "POST",
        f"{BOB}/recall",
        {"json": {"question": "q", "top_k": 101}},
        422,
        "body.top_k",
    ),
    (
        "context-budget-missing",
        "POST",
        f"{BOB}/context",
        {"json": {"question": "q"}},
        422,
        "body.budget_tokens",
    ),
    (
        "context-budget-huge",
        "POST",
        f"{BOB}/context",
        {"json": {"question": "q", "budget_tokens": 10**12}},
        422,
        "body.budget_tokens",
    ),
    (
        "context-budget-negative",
        "POST",
        f"{BOB}/context",
        {"json": {"question": "q", "budget_tokens": -5}},
        422,
        "body.budget_tokens",
    ),
    ("list-limit-zero", "GET", f"{BOB}/sessions", {"params": {"limit": 0}}, 422, "query.limit"),
    (
        "list-offset-negative",
        "GET",
        f"{BOB}/sessions",
        {"params": {"offset": -1}},
        422,
        "query.offset",
    ),
    (
        "list-offset-huge",
        "GET",
        f"{BOB}/sessions",
        {"params": {"offset": 10**20}},
        422,
        "query.offset",
    ),
    ("fact-id-not-uuid", "GET", f"{BOB}/facts/42", {}, 422, "path.fact_id"),
    ("fact-unknown", "GET", f"{BOB}/facts/{FACT}", {}, 404, "path.fact_id"),
    ("forget-unknown", "DELETE", f"{BOB}/facts/{FACT}", {}, 404, "path.fact_id"),
    (
        "fact-importance-over-1",
        "POST",
        f"{BOB}/facts",
        {"json": _fact(importance=1.5)},
        422,
        "body.importance",
    ),
    (
        "fact-importance-nan",
        "POST",
        f"{BOB}/facts",
        {
            "content": b'{"type": "task", "subject": "s", "text": "t", "importance": NaN}',
            "headers": JSON,
        },
        422,
        "body.importance",
    ),
    (
        "fact-importance-inf",
        "POST",
        f"{BOB}/facts",
        {
            "content": b'{"type": "task", "subject": "s", "text": "t", "importance": 1e400}',
            "headers": JSON,
        },
        422,
        "body.importance",
    ),
    (
        "fact-type-unknown",
        "POST",
        f"{BOB}/facts",
        {"json": _fact(type="opinion")},
        422,
        "body.type",
    ),
    (
        "fact-expired-already",
        "POST",
        f"{BOB}/facts",
        {"json": _fact(expires_at="2001-01-01T00:00:00Z")},
        422,
        "body.expires_at",
    ),
    ("fact-patch-empty", "PATCH", f"{BOB}/facts/{FACT}", {"json": {}}, 422, "body"),
    (
        "rerank-model-nul",
        "POST",
        "/v1/rerank",
        {"json": {"model": "a\x00b", "query": "q", "documents": ["d"]}},
        422,
        "body.model",
    ),
    ("unknown-endpoint", "GET", "/v1/nothing-here", {}, 404, "path"),
    # No redirect adds or drops a slash (its Location would come from the Host header).
    (
        "trailing-slash",
        "POST",
        "/v1/rerank/",
        {"json": {"query": "q", "documents": ["d"]}, "headers": {"host": "evil.example"}},
        404,
        "path",
    ),
    ("trailing-slash-get", "GET", "/healthz/", {}, 404, "path"),
    # Swagger UI and ReDoc are off unless the config turns them on (api_docs_from_cdn).
    ("api-docs-off", "GET", "/docs", {}, 404, "path"),
    ("redoc-off", "GET", "/redoc", {}, 404, "path"),
    ("wrong-method", "GET", RANK, {}, 405, "method"),
]


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "field"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_bad_request_gets_a_4xx_naming_the_field(
    client: TestClient, method: str, path: str, kwargs: dict[str, Any], status: int, field: str
) -> None:
    r = client.request(method, path, **kwargs)
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error", "request_id"} and body["request_id"] == r.headers["x-request-id"]
    fields = [f["field"] for f in body["error"]["fields"]]
    assert field in fields, (fields, body["error"]["message"])
    assert "Traceback" not in r.text


def test_the_error_says_what_is_wrong_with_the_body(client: TestClient) -> None:
    # The field alone ("body") does not tell a client that 1,000 levels of [] is the problem.
    deep = client.post(RANK, content=b"[" * 1000 + b"]" * 1000, headers=JSON).json()["error"]
    assert deep["type"] == "malformed_json" and "nested too deeply" in deep["message"]
    assert deep["fields"] == [{"field": "body", "message": "JSON nested too deeply"}]
    # A plain 404, not a redirect to the host the request named.
    r = client.post(
        "/v1/rerank/",
        json={"query": "q", "documents": ["d"]},
        headers={"host": "evil.example"},
        follow_redirects=False,
    )
    assert r.status_code == 404 and "location" not in r.headers and "evil" not in r.text
    # The model name is echoed back, so it is text like any other field: no NUL, no surrogate.
    r = client.post("/v1/rerank", json={"model": "m\x00", "query": "q", "documents": ["d"]})
    assert r.status_code == 422 and "NUL" in r.json()["error"]["fields"][0]["message"]
    r = client.post("/v1/rerank", json={"model": "m-1", "query": "q", "documents": ["d"]})
    assert r.status_code == 200 and r.json()["model"] == "m-1"


def test_there_are_enough_cases_and_none_expects_a_5xx() -> None:
    assert len(CASES) >= 40
    assert len({c[0] for c in CASES}) == len(CASES)
    assert all(400 <= c[4] < 500 for c in CASES)


def test_the_store_is_intact_after_the_barrage(client: TestClient) -> None:
    assert client.get(f"{BOB}/sessions").json()["total"] == 2
    assert client.get("/readyz").status_code == 200
