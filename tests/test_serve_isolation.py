"""Tenant isolation: a key only ever reaches its own tenant's data. Tenant A's key cannot read,
list, recall, page in, correct, forget or delete anything of tenant B, even knowing B's user,
session and fact ids; the same user id under A is a different, empty user. On SQLite, and on
PostgreSQL too when ``MEMSIFTER_TEST_PG_DSN`` is set."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient

from memsifter.serving.app import create_app
from memsifter.serving.config import ApiKeySettings, ServeConfig
from memsifter.serving.store import hash_key

KEY_A = "tenant-a-key-0123456789"
KEY_B = "tenant-b-key-0123456789"
A = {"Authorization": f"Bearer {KEY_A}"}
B = {"Authorization": f"Bearer {KEY_B}"}
SECRET = "The vault code is 4711 and the horse is called Zephyr."


@pytest.fixture(scope="module")
def setup(serve_db: Callable[[str], str]) -> Iterator[tuple[TestClient, str]]:
    config = ServeConfig(
        db_url=serve_db("iso"),
        api_keys=[
            ApiKeySettings(tenant="tenant-a", key_sha256=hash_key(KEY_A)),
            ApiKeySettings(tenant="tenant-b", key_sha256=hash_key(KEY_B)),
        ],
    )
    with TestClient(create_app(config)) as c:
        session = {"id": "vault", "turns": [{"speaker": "bob", "text": SECRET}]}
        assert c.post("/v1/users/bob/sessions", headers=B, json={"sessions": [session]}).is_success
        fact = c.post(
            "/v1/users/bob/facts",
            headers=B,
            json={"type": "entity", "subject": "horse", "text": "Bob's horse is Zephyr."},
        )
        assert fact.status_code == 201
        c.post(
            "/v1/users/bob/context",
            headers=B,
            json={"question": "what is the vault code?", "budget_tokens": 500},
        )
        yield c, fact.json()["fact"]["fact_id"]


def test_a_cannot_read_bs_data(setup: tuple[TestClient, str]) -> None:
    c, fact_id = setup
    assert c.get("/v1/users/bob/sessions", headers=A).json()["total"] == 0
    assert c.get("/v1/users/bob/sessions/vault", headers=A).status_code == 404
    assert c.get("/v1/users/bob/facts", headers=A).json()["facts"] == []
    assert c.get(f"/v1/users/bob/facts/{fact_id}", headers=A).status_code == 404
    assert c.get("/v1/users/bob/paging", headers=A).json()["events"] == []


def test_a_cannot_recall_or_page_in_bs_data(setup: tuple[TestClient, str]) -> None:
    c, _ = setup
    question = {"question": "what is the vault code and the horse's name?"}
    assert c.post("/v1/users/bob/recall", headers=A, json=question).status_code == 404
    ctx = c.post("/v1/users/bob/context", headers=A, json={**question, "budget_tokens": 500})
    assert ctx.status_code == 404
    # A's own user "bob" is a different person: A's recall sees only A's pages.
    own = {"id": "own", "turns": [{"speaker": "bob", "text": "The vault is in the basement."}]}
    assert c.post("/v1/users/bob/sessions", headers=A, json={"sessions": [own]}).is_success
    hits = c.post("/v1/users/bob/recall", headers=A, json={**question, "top_k": 10}).json()["hits"]
    assert [h["session_id"] for h in hits] == ["own"]
    ctx = c.post("/v1/users/bob/context", headers=A, json={**question, "budget_tokens": 500})
    assert SECRET not in ctx.text and "Zephyr" not in ctx.text


def test_a_cannot_change_or_delete_bs_data(setup: tuple[TestClient, str]) -> None:
    c, fact_id = setup
    assert c.delete("/v1/users/bob/sessions/vault", headers=A).status_code == 404
    assert c.delete(f"/v1/users/bob/facts/{fact_id}", headers=A).status_code == 404
    patch = c.patch(f"/v1/users/bob/facts/{fact_id}", headers=A, json={"text": "hacked"})
    assert patch.status_code == 404
    # Same session id under A is A's own namespace: it neither collides with nor replaces B's.
    mine = {"id": "vault", "turns": [{"speaker": "x", "text": "decoy"}]}
    put = c.post("/v1/users/bob/sessions", headers=A, json={"sessions": [mine], "replace": True})
    assert put.status_code == 201
    c.delete("/v1/users/bob", headers=A, params={"confirm": "bob"})  # A forgets its own bob
    assert c.post("/v1/facts/sweep", headers=A).json() == {"deleted": 0}

    # B's data is untouched.
    got = c.get("/v1/users/bob/sessions/vault", headers=B).json()
    assert got["turns"][0]["text"] == SECRET
    facts = c.get("/v1/users/bob/facts", headers=B).json()["facts"]
    assert [f["fact_id"] for f in facts] == [fact_id] and facts[0][
        "text"
    ] == "Bob's horse is Zephyr."
    hits = c.post("/v1/users/bob/recall", headers=B, json={"question": "vault code"}).json()["hits"]
    assert hits[0]["session_id"] == "vault"


def test_stateless_rank_needs_a_key_but_touches_no_tenant_data(
    setup: tuple[TestClient, str],
) -> None:
    c, _ = setup
    body = {
        "question": "vault code?",
        "sessions": [{"id": "x", "turns": [{"speaker": "a", "text": "b"}]}],
    }
    assert c.post("/v1/rank", json=body).status_code == 401
    ranked = c.post("/v1/rank", headers=A, json=body).json()["ranking"]
    assert [r["id"] for r in ranked] == ["x"]


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v2/rerank"])
def test_stateless_rerank_needs_a_key_and_neither_reads_nor_writes_tenant_data(
    setup: tuple[TestClient, str], path: str
) -> None:
    c, _ = setup
    body = {"query": "what is the vault code?", "documents": ["nothing here", "the weather"]}
    assert c.post(path, json=body).status_code == 401
    got = c.post(path, headers=A, json=body).json()
    # Only the given documents come back: B's stored secret is not a candidate, even for B.
    assert [r["document"]["text"] for r in got["results"]] != [] and SECRET not in str(got)
    assert SECRET not in str(c.post(path, headers=B, json=body).json())
    assert c.get("/v1/users/bob/sessions", headers=A).json()["total"] == 0  # nothing stored
    assert c.get("/v1/users/bob/sessions", headers=B).json()["total"] == 1
