"""The key admin API: only the admin key reaches it (never a tenant key); keys it creates work
at once and see only their tenant; a revoked key fails on its next request; with no admin key
configured the API is off (404). On SQLite, and on PostgreSQL too when MEMSIFTER_TEST_PG_DSN
is set."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient

from memsifter.serving.app import create_app
from memsifter.serving.config import AdminSettings, ApiKeySettings, ServeConfig
from memsifter.serving.store import hash_key

ADMIN = "admin-key-0123456789abcdef"
TENANT_KEY = "tenant-key-0123456789"
AS_ADMIN = {"Authorization": f"Bearer {ADMIN}"}


@pytest.fixture(scope="module")
def client(serve_db: Callable[[str], str]) -> Iterator[TestClient]:
    config = ServeConfig(
        db_url=serve_db("admin"),
        admin=AdminSettings(key_env=None, key_sha256=hash_key(ADMIN)),
        api_keys=[ApiKeySettings(tenant="acme", key_sha256=hash_key(TENANT_KEY))],
    )
    with TestClient(create_app(config)) as c:
        yield c


def test_create_use_list_and_revoke_a_key(client: TestClient) -> None:
    r = client.post(
        "/v1/admin/tenants/globex/keys",
        headers=AS_ADMIN,
        json={"agent": "todo-bot", "fact_types": ["task"]},
    )
    assert r.status_code == 201, r.text
    body = r.json()
    key, key_id = body["key"], body["info"]["key_id"]
    assert key.startswith("msk-") and body["info"]["fact_types"] == ["task"]
    assert body["info"]["key_sha256_prefix"] == hash_key(key)[:8]
    new = {"Authorization": f"Bearer {key}"}

    # The new key works at once, for its own tenant only.
    session = {"id": "s1", "turns": [{"speaker": "u", "text": "Globex ships rockets."}]}
    assert client.post(
        "/v1/users/ann/sessions", headers=new, json={"sessions": [session]}
    ).is_success
    acme = {"Authorization": f"Bearer {TENANT_KEY}"}
    assert client.get("/v1/users/ann/sessions", headers=acme).json()["total"] == 0
    # ... and its agent sees only task facts, where an unrestricted key of globex sees all.
    full = client.post("/v1/admin/tenants/globex/keys", headers=AS_ADMIN, json={}).json()
    everything = {"Authorization": f"Bearer {full['key']}"}
    for kind in ("task", "preference"):
        fact = {"type": kind, "subject": kind, "text": f"a {kind}"}
        assert client.post("/v1/users/ann/facts", headers=everything, json=fact).is_success
    assert len(client.get("/v1/users/ann/facts", headers=everything).json()["facts"]) == 2
    seen = client.get("/v1/users/ann/facts", headers=new).json()["facts"]
    assert [f["type"] for f in seen] == ["task"]

    listed = client.get("/v1/admin/tenants/globex/keys", headers=AS_ADMIN).json()
    assert [k["key_id"] for k in listed["keys"]] == [key_id, full["info"]["key_id"]]
    assert key not in str(listed) and hash_key(key) not in str(listed)  # never the key or hash

    r = client.delete(f"/v1/admin/keys/{key_id}", headers=AS_ADMIN)
    assert r.status_code == 200 and r.json()["tenant_id"] == "globex"
    r = client.get("/v1/users/ann/sessions", headers=new)
    assert (
        r.status_code == 401 and r.json()["error"]["fields"][0]["field"] == "header.Authorization"
    )
    left = client.get("/v1/admin/tenants/globex/keys", headers=AS_ADMIN).json()["keys"]
    assert [k["key_id"] for k in left] == [full["info"]["key_id"]]


@pytest.mark.parametrize(
    ("method", "path", "kwargs"),
    [
        ("POST", "/v1/admin/tenants/acme/keys", {"json": {}}),
        ("GET", "/v1/admin/tenants/acme/keys", {}),
        ("DELETE", "/v1/admin/keys/1", {}),
    ],
)
def test_only_the_admin_key_reaches_the_admin_api(
    client: TestClient, method: str, path: str, kwargs: dict
) -> None:
    for headers in ({}, {"Authorization": f"Bearer {TENANT_KEY}"}, {"Authorization": "Bearer x"}):
        r = client.request(method, path, headers=headers, **kwargs)
        assert r.status_code == 401, (headers, r.text)
        assert r.json()["error"]["fields"][0]["field"] == "header.Authorization"
    # The admin key is not a tenant key.
    assert client.get("/v1/users/ann/sessions", headers=AS_ADMIN).status_code == 401


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "field"),
    [
        ("GET", "/v1/admin/tenants/nobody/keys", {}, 404, "path.tenant_id"),
        ("DELETE", "/v1/admin/keys/999999", {}, 404, "path.key_id"),
        ("DELETE", "/v1/admin/keys/0", {}, 422, "path.key_id"),
        ("DELETE", "/v1/admin/keys/abc", {}, 422, "path.key_id"),
        ("POST", "/v1/admin/tenants/bad%20id/keys", {"json": {}}, 422, "path.tenant_id"),
        ("POST", "/v1/admin/tenants/acme/keys", {"json": {"fact_types": ["x"]}}, 422, None),
        ("POST", "/v1/admin/tenants/acme/keys", {"json": {"role": "root"}}, 422, "body.role"),
    ],
)
def test_admin_bad_input_is_a_named_4xx(
    client: TestClient, method: str, path: str, kwargs: dict, status: int, field: str | None
) -> None:
    r = client.request(method, path, headers=AS_ADMIN, **kwargs)
    assert r.status_code == status, r.text
    fields = [f["field"] for f in r.json()["error"]["fields"]]
    if field is None:
        assert fields and all(f.startswith("body.fact_types") for f in fields)
    else:
        assert field in fields


def test_admin_api_is_off_without_an_admin_key(serve_db: Callable[[str], str]) -> None:
    config = ServeConfig(db_url=serve_db("no-admin"), admin=AdminSettings(key_env=None))
    with TestClient(create_app(config)) as c:
        r = c.get("/v1/admin/tenants/acme/keys", headers=AS_ADMIN)
    assert r.status_code == 404 and "admin API is off" in r.json()["error"]["message"]


@pytest.mark.parametrize("auth_cache_s", [2.0, 0.0])
def test_a_revoked_key_is_refused_by_another_worker_within_auth_cache_s(
    serve_db: Callable[[str], str], auth_cache_s: float
) -> None:
    """Two workers (two apps) over one database: the one that revokes refuses the key at
    once; the other keeps trusting it for at most ``auth_cache_s``, then asks the database
    (at once with the cache off)."""
    import time

    config = ServeConfig(
        db_url=serve_db(f"admin_cache_{auth_cache_s:g}"),
        admin=AdminSettings(key_env=None, key_sha256=hash_key(ADMIN)),
        auth_cache_s=auth_cache_s,
    )
    with TestClient(create_app(config)) as one, TestClient(create_app(config)) as other:
        made = one.post("/v1/admin/tenants/initech/keys", headers=AS_ADMIN, json={}).json()
        key = {"Authorization": f"Bearer {made['key']}"}
        assert one.get("/v1/users/bob/sessions", headers=key).status_code == 200
        assert other.get("/v1/users/bob/sessions", headers=key).status_code == 200
        assert one.delete(f"/v1/admin/keys/{made['info']['key_id']}", headers=AS_ADMIN).is_success
        assert one.get("/v1/users/bob/sessions", headers=key).status_code == 401
        cached = other.get("/v1/users/bob/sessions", headers=key).status_code
        assert cached == (200 if auth_cache_s > 0 else 401)
        time.sleep(auth_cache_s + 0.1)
        assert other.get("/v1/users/bob/sessions", headers=key).status_code == 401
