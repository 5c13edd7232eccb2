"""What the routes share: the principal cache (what it keeps, for how long, how many) and
``in_thread`` (a blocking endpoint runs off the event loop, in one thread hop)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from memsifter.serving.deps import in_thread
from memsifter.serving.ranking import IdOrder
from memsifter.serving.store import PrincipalCache
from memsifter.serving.store.records import Principal

ACME = Principal(tenant_id="acme")


def test_principal_cache_keeps_successes_for_ttl_then_forgets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [100.0]
    monkeypatch.setattr("memsifter.serving.store.keys.time.monotonic", lambda: clock[0])
    cache = PrincipalCache(ttl_s=2.0)
    assert cache.get("d1") is None
    cache.put("d1", ACME)
    clock[0] += 1.9
    assert cache.get("d1") == ACME
    clock[0] += 0.2  # 2.1 s after it was checked
    assert cache.get("d1") is None and len(cache) == 0


def test_principal_cache_is_bounded_and_clears() -> None:
    cache = PrincipalCache(ttl_s=60.0, max_keys=2)
    for d in ("a", "b"):
        cache.put(d, ACME)
    assert cache.get("a") == ACME  # "b" is now the least recently used
    cache.put("c", ACME)
    assert cache.get("b") is None and cache.get("a") == ACME and cache.get("c") == ACME
    cache.clear()
    assert len(cache) == 0 and cache.get("a") is None


def test_principal_cache_off_keeps_nothing() -> None:
    cache = PrincipalCache(ttl_s=0.0)
    cache.put("a", ACME)
    assert cache.get("a") is None and len(cache) == 0
    with pytest.raises(ValueError, match="ttl_s"):
        PrincipalCache(ttl_s=-1.0)


def test_an_invalid_key_is_never_cached(serve_db: Callable[[str], str]) -> None:
    from memsifter.serving.app import create_app
    from memsifter.serving.config import ServeConfig

    app = create_app(ServeConfig(db_url=serve_db("deps"), auth_cache_s=60.0))
    with TestClient(app) as client:
        for _ in range(3):
            r = client.get("/v1/users/u/sessions", headers={"Authorization": "Bearer nope"})
            assert r.status_code == 401
        assert len(app.state.services.principals) == 0


def test_in_thread_runs_the_endpoint_off_the_loop_and_keeps_its_parameters() -> None:
    app = FastAPI()
    seen: dict[str, object] = {}

    @app.get("/items/{item_id}")
    @in_thread
    def item(item_id: int, q: str = "x") -> dict[str, object]:
        seen["thread"] = threading.current_thread()
        try:
            asyncio.get_running_loop()
            seen["loop"] = True
        except RuntimeError:
            seen["loop"] = False
        return {"item_id": item_id, "q": q}

    assert asyncio.iscoroutinefunction(item)
    with TestClient(app) as client:
        assert client.get("/items/3?q=y").json() == {"item_id": 3, "q": "y"}
        assert client.get("/items/nope").status_code == 422  # the wrapped signature validates
    assert seen["loop"] is False and seen["thread"] is not threading.main_thread()


def test_id_order_reads_ids_through_the_order() -> None:
    ids = np.array(["a", "b", "c", "d"], dtype=object)
    order = IdOrder(ids, np.array([2, 0, 3, 1]))
    assert len(order) == 4 and order[0] == "c" and order[-1] == "b"
    assert order[:2] == ("c", "a") and list(order) == ["c", "a", "d", "b"]
    assert order == ("c", "a", "d", "b") and order == ["c", "a", "d", "b"]
    assert order != ("a", "b", "c", "d")
