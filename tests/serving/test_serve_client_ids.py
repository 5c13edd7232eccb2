"""No client call touches more than the resource it names: every id-taking method of the
Python client, given ``.``, ``..``, ``%2e%2e`` or ``a/../b``, against a live server (uvicorn on
a TCP port, httpx's real transport, which resolves dot segments) leaves everything of the user
as it was. And the server's own defence: a user delete must name the user twice, so a path
that lost its tail cannot delete a user; error bodies stay small whatever the request."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from memsifter.serving.client import InvalidIdError, MemSifterClient, ServiceError
from memsifter.serving.config import AdminSettings, ApiKeySettings, ServeConfig
from memsifter.serving.schemas import FactPatch, SessionIn, TurnIn
from memsifter.serving.store import hash_key
from memsifter.testing.server import live_server

KEY = "key-client-ids-0123456789"
BAD_IDS = (".", "..", "%2e%2e", "a/../b")
FACT = "00000000-0000-4000-8000-000000000000"


@pytest.fixture(scope="module")
def base_url(serve_db: Callable[[str], str]) -> Iterator[str]:
    config = ServeConfig(
        db_url=serve_db("client_ids"),
        admin=AdminSettings(key_env=None, key_sha256=hash_key("admin-client-ids-0123456789")),
        api_keys=[ApiKeySettings(tenant="acme", key_sha256=hash_key(KEY))],
    )
    with live_server(config) as url:
        yield url


@pytest.fixture
def client(base_url: str) -> Iterator[MemSifterClient]:
    with MemSifterClient(base_url, api_key=KEY) as c:
        yield c


def _snapshot(c: MemSifterClient, user: str) -> tuple[Any, ...]:
    sessions = c.list_sessions(user)
    facts = c.facts(user)
    return (
        sorted(s.session_id for s in sessions.sessions),
        sorted((f.fact_id, f.text) for f in facts.facts),
    )


def _seed(c: MemSifterClient, user: str) -> str:
    turns = [TurnIn(speaker="u", text="my dog is called Max")]
    c.ingest_sessions(user, [SessionIn(id=sid, turns=turns) for sid in ("a", "b", "a/b")])
    return c.remember(user, "entity", "dog", "The dog is Max.").fact.fact_id


CALLS: dict[str, Callable[[MemSifterClient, str, str], Any]] = {
    "get_session": lambda c, u, i: c.get_session(u, i),
    "delete_session": lambda c, u, i: c.delete_session(u, i),
    "get_fact": lambda c, u, i: c.get_fact(u, i),
    "correct": lambda c, u, i: c.correct(u, i, FactPatch(text="changed")),
    "forget": lambda c, u, i: c.forget(u, i),
    # The user id itself, in every method that takes one.
    "list_sessions(user)": lambda c, u, i: c.list_sessions(i),
    "delete_user(user)": lambda c, u, i: c.delete_user(i),
    "ingest_sessions(user)": lambda c, u, i: c.ingest_sessions(
        i, [SessionIn(id="x", turns=[TurnIn(speaker="u", text="hi")])]
    ),
    "recall(user)": lambda c, u, i: c.recall(i, "dog?"),
    "context(user)": lambda c, u, i: c.context(i, "dog?", 200),
    "remember(user)": lambda c, u, i: c.remember(i, "entity", "cat", "A cat."),
    "facts(user)": lambda c, u, i: c.facts(i),
    "get_session(user)": lambda c, u, i: c.get_session(i, "a"),
    "delete_session(user)": lambda c, u, i: c.delete_session(i, "a"),
    "forget(user)": lambda c, u, i: c.forget(i, FACT),
}


@pytest.mark.parametrize("bad", BAD_IDS)
@pytest.mark.parametrize("call", list(CALLS))
def test_a_dot_segment_id_touches_nothing(client: MemSifterClient, call: str, bad: str) -> None:
    user = f"u-{re.sub('[^A-Za-z0-9]', '-', call)}-{BAD_IDS.index(bad)}"
    _seed(client, user)
    before = _snapshot(client, user)
    with pytest.raises(InvalidIdError, match="nothing was sent"):
        CALLS[call](client, user, bad)
    assert _snapshot(client, user) == before


def test_valid_ids_with_dots_and_slashes_still_work(client: MemSifterClient) -> None:
    user = "dots.and-dashes"
    fact = _seed(client, user)
    assert client.get_session(user, "a/b").session.session_id == "a/b"
    assert client.delete_session(user, "a/b").deleted == 1
    assert client.get_fact(user, fact).text == "The dog is Max."
    assert _snapshot(client, user)[0] == ["a", "b"]
    assert client.delete_user(user).deleted == 1


def test_a_user_delete_must_name_the_user_twice(base_url: str, client: MemSifterClient) -> None:
    user = "twice"
    _seed(client, user)
    before = _snapshot(client, user)
    auth = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=base_url, headers=auth) as raw:
        # What a collapsed ".../sessions/.." becomes: a bare user path.
        missing = raw.delete(f"/v1/users/{user}")
        other = raw.delete(f"/v1/users/{user}", params={"confirm": "someone-else"})
    for r in (missing, other):
        assert r.status_code == 400, r.text
        assert [f["field"] for f in r.json()["error"]["fields"]] == ["query.confirm"]
    assert _snapshot(client, user) == before
    assert client.delete_user(user).deleted == 1  # named twice: the client's call is gone
    assert _snapshot(client, user) == ([], [])
    with pytest.raises(ServiceError) as e:
        client.recall(user, "dog?")
    assert e.value.status == 404


@pytest.mark.parametrize(
    "body",
    [
        {f"k{i}": i for i in range(100_000)},  # 100,000 unknown keys
        {"question": "q", "top_k": "x" * 300_000},
    ],
    ids=["unknown-keys", "long-value"],
)
def test_error_bodies_stay_small(base_url: str, body: dict[str, Any]) -> None:
    import json

    raw = json.dumps(body).encode()
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {KEY}"}) as c:
        r = c.post("/v1/users/u/recall", content=raw, headers={"content-type": "application/json"})
    assert r.status_code in (413, 422), r.text[:300]
    assert len(r.content) <= 16 * 1024, len(r.content)
    err = r.json()["error"]
    assert len(err["fields"]) <= 20 and err["fields_total"] >= len(err["fields"])


def test_head_is_answered_wherever_get_is(base_url: str, client: MemSifterClient) -> None:
    _seed(client, "heads")
    auth = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=base_url, headers=auth) as raw:
        for path in ("/healthz", "/v1/users/heads/sessions", "/v1/users/heads/sessions/a"):
            got, head = raw.get(path), raw.head(path)
            assert head.status_code == got.status_code == 200, (path, head.text)
            assert head.content == b""
            assert head.headers["content-length"] == got.headers["content-length"]
        assert raw.head("/v1/users/heads/sessions/nope").status_code == 404


def test_an_error_body_full_of_escapes_stays_under_16_kb(base_url: str) -> None:
    import json

    # Keys of control characters: each is six bytes once JSON-escaped in the error body.
    body = {"\x01" * 150 + str(i): i for i in range(50)}
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {KEY}"}) as c:
        r = c.post("/v1/users/u/recall", content=json.dumps(body).encode(),
                   headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 422, r.text[:300]
    assert len(r.content) <= 16 * 1024, len(r.content)
    assert r.json()["error"]["fields_total"] >= 50
