"""The recall service keeps its OpenAPI contract under generated input (schemathesis).

Every operation in the app's own schema is called in-process (ASGI, no server) with cases that
schemathesis derives from that schema, valid and invalid, authenticated with a tenant key (the
admin API with the admin key), and every response must: not be a 5xx, carry a status code the
operation documents, use a content type it declares, and match the schema declared for that
status. Two in three cases with path parameters are aimed at a seeded user, its sessions, facts
and keys, so reads, recall, corrections and deletions run over real rows and not only the 404
path; a second test checks that each operation did answer some case with a 2xx, so the run
cannot pass by never reaching a handler. On SQLite, and on PostgreSQL too when
``MEMSIFTER_TEST_PG_DSN`` is set.
"""

from __future__ import annotations

import tempfile
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")

from fastapi.testclient import TestClient  # noqa: E402
from hypothesis import HealthCheck, Phase, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from memsifter.serving.app import create_app  # noqa: E402
from memsifter.serving.config import AdminSettings, ApiKeySettings, ServeConfig  # noqa: E402
from memsifter.serving.store import hash_key  # noqa: E402
from memsifter.testing.server import SEED_SESSIONS  # noqa: E402

KEY = "key-schemathesis-0123456789"
ADMIN_KEY = "admin-schemathesis-0123456789"
TENANT, USER = "acme", "bob"
SESSIONS = ("s-dog", "s-run")
CHECKS = [
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
    content_type_conformance,
]


SEED_FACTS = [
    {"type": "entity", "subject": "dog", "text": "Has a golden retriever named Max."},
    {"type": "event", "subject": "half marathon", "text": "Runs the Lisbon half marathon."},
]


@dataclass
class Service:
    """The app under test, a client for setup, and what the run has reached so far."""

    app: Any
    client: TestClient
    tenant_key: str
    tenant_key_id: int
    fact_ids: list[str] = field(default_factory=list)
    reached: Counter[str] = field(default_factory=Counter)  # operation label -> 2xx answers
    statuses: Counter[tuple[str, int]] = field(default_factory=Counter)  # for the failure message

    def tenant(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tenant_key}"}

    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {ADMIN_KEY}"}

    def restore_seed(self) -> None:
        """Put back what a generated DELETE, PATCH or POST may have removed or superseded, so
        the next seeded case finds both sessions and two live facts again."""
        r = self.client.get(f"/v1/users/{USER}/sessions", headers=self.tenant())
        assert r.status_code == 200, r.text
        have = {s["session_id"] for s in r.json()["sessions"]}
        missing = [s for sid, s in SEED_SESSIONS.items() if sid not in have]
        if missing:
            r = self.client.post(
                f"/v1/users/{USER}/sessions", json={"sessions": missing}, headers=self.tenant()
            )
            assert r.status_code == 201, r.text
        r = self.client.get(f"/v1/users/{USER}/facts", headers=self.tenant())
        assert r.status_code == 200, r.text
        live = [f["fact_id"] for f in r.json()["facts"]]
        for fact in SEED_FACTS[len(live) :]:
            r = self.client.post(f"/v1/users/{USER}/facts", json=fact, headers=self.tenant())
            assert r.status_code == 201, r.text
            live.append(r.json()["fact"]["fact_id"])
        self.fact_ids = live[: len(SEED_FACTS)]

    def throwaway_key_id(self) -> int:
        r = self.client.post(f"/v1/admin/tenants/{TENANT}/keys", json={}, headers=self.admin())
        assert r.status_code == 201, r.text
        return int(r.json()["info"]["key_id"])


@pytest.fixture(scope="module")
def service(serve_db: Callable[[str], str]) -> Iterator[Service]:
    config = ServeConfig(
        db_url=serve_db("schemathesis"),
        api_keys=[ApiKeySettings(tenant=TENANT, key_sha256=hash_key(KEY))],
        admin=AdminSettings(key_env=None, key_sha256=hash_key(ADMIN_KEY)),
    )
    app = create_app(config)
    with TestClient(app) as client:
        r = client.get(
            f"/v1/admin/tenants/{TENANT}/keys", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
        )
        assert r.status_code == 200, r.text
        (key_id,) = [k["key_id"] for k in r.json()["keys"]]
        svc = Service(app=app, client=client, tenant_key=KEY, tenant_key_id=key_id)
        svc.restore_seed()
        yield svc


def _load_schema() -> Any:
    """The service's OpenAPI schema, read from a throwaway app at collection time; the cases
    are then sent to each backend's own app. (The schema does not depend on the database, and
    schemathesis' fixture-based loader does not run under pytest 9.2.)"""
    with tempfile.TemporaryDirectory() as tmp:
        app = create_app(ServeConfig(db_url=f"sqlite:///{tmp}/schema.db"))
        with TestClient(app):  # its lifespan closes the store before the folder goes
            return schemathesis.openapi.from_asgi("/openapi.json", app)


schema = _load_schema()


def _aim_at_seed(case: Any, service: Service) -> None:
    """Point two in three cases' path parameters at seeded rows (the generator's random ids
    would almost never name one), leaving query and body as generated. Which ones is a hash of
    the generated parameters, not a coin: hypothesis replays a failing case and must see the
    same request again. (Not ``@schema.given``: schemathesis refuses it beside the schema's
    own examples, which are worth running.)"""
    params = case.path_parameters
    if not params:
        return
    pick = zlib.crc32(repr(sorted(params.items())).encode()) % 3
    if pick == len(SESSIONS):
        return
    if "user_id" in params:
        params["user_id"] = USER
        if case.operation.path == "/v1/users/{user_id}" and case.method.upper() == "DELETE":
            # A user delete names the user twice; an aimed case names it in both places.
            case.query = {**(case.query or {}), "confirm": USER}
    if "session_id" in params:
        params["session_id"] = SESSIONS[pick]
    if "fact_id" in params:
        params["fact_id"] = service.fact_ids[pick]
    if "tenant_id" in params:
        params["tenant_id"] = TENANT
    if "key_id" in params:
        # Never the tenant key the run authenticates with: revoke a key minted for the purpose.
        params["key_id"] = service.throwaway_key_id()


@schema.parametrize()
@settings(
    max_examples=20,
    derandomize=True,
    # No example database: a run replays nothing from earlier runs, so every machine (and CI's
    # fresh clone) sends exactly the same cases.
    database=None,
    deadline=None,
    # A failing case is reported as generated: shrinking a stateful HTTP case can take minutes.
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
def test_every_operation_keeps_its_contract(case: Any, service: Service) -> None:
    _aim_at_seed(case, service)
    admin_op = case.operation.path.startswith("/v1/admin")
    headers = service.admin() if admin_op else service.tenant()
    response = case.call_and_validate(app=service.app, headers=headers, checks=CHECKS)
    service.statuses[case.operation.label, response.status_code] += 1
    if not 200 <= response.status_code < 300:
        return
    service.reached[case.operation.label] += 1
    # A generated revocation may still have named the tenant's key by its id: mint another.
    if admin_op and case.method.upper() == "DELETE":
        if response.json()["key_id"] == service.tenant_key_id:
            r = service.client.post(
                f"/v1/admin/tenants/{TENANT}/keys", json={}, headers=service.admin()
            )
            assert r.status_code == 201, r.text
            service.tenant_key = r.json()["key"]
            service.tenant_key_id = r.json()["info"]["key_id"]
    if case.method.upper() != "GET":
        service.restore_seed()


def test_every_operation_was_reached(service: Service) -> None:
    """Runs after the test above (same module, same backend): every operation answered at least
    one case with a 2xx, so the contract checks saw each handler's success path."""
    labels = {op.ok().label for op in schema.get_all_operations()}
    assert labels, "the schema lists no operations"
    missed = sorted(labels - set(service.reached))
    assert not missed, {
        op: [(c, n) for (o, c), n in service.statuses.items() if o == op] for op in missed
    }
