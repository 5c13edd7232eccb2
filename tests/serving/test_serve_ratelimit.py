"""Per-tenant rate limits: the token bucket's arithmetic on a fake clock, and over HTTP a 429
with Retry-After that names the field, for the limited tenant only."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from memsifter.serving.app import create_app
from memsifter.serving.config import ApiKeySettings, LimitSettings, ServeConfig
from memsifter.serving.ratelimit import RateLimitedError, RateLimiter
from memsifter.serving.store import hash_key


def test_token_bucket_refills_at_the_rate() -> None:
    now = [0.0]
    limiter = RateLimiter(rate_per_s=2.0, burst=3, clock=lambda: now[0])
    for _ in range(3):  # a full bucket lets a burst through
        limiter.check("a")
    with pytest.raises(RateLimitedError) as e:
        limiter.check("a")
    assert e.value.status == 429 and e.value.retry_after_s == pytest.approx(0.5)
    limiter.check("b")  # buckets are per tenant
    now[0] = 0.5  # one token back after 1 / rate seconds
    limiter.check("a")
    with pytest.raises(RateLimitedError):
        limiter.check("a")
    now[0] = 100.0  # never more than the burst
    for _ in range(3):
        limiter.check("a")
    with pytest.raises(RateLimitedError):
        limiter.check("a")
    assert RateLimiter.retry_after_header(0.01) == "1"
    assert RateLimiter.retry_after_header(2.2) == "3"
    with pytest.raises(ValueError):
        RateLimiter(rate_per_s=0.0, burst=1)


def test_over_the_limit_is_a_429_for_that_tenant_only(tmp_path: Path) -> None:
    config = ServeConfig(
        db_url=f"sqlite:///{tmp_path / 'rl.db'}",
        limits=LimitSettings(rate_per_s=0.01, burst=2),  # no refill within the test
        api_keys=[
            ApiKeySettings(tenant="a", key_sha256=hash_key("key-a-0123456789")),
            ApiKeySettings(tenant="b", key_sha256=hash_key("key-b-0123456789")),
        ],
    )
    a = {"Authorization": "Bearer key-a-0123456789"}
    b = {"Authorization": "Bearer key-b-0123456789"}
    with TestClient(create_app(config)) as c:
        assert [c.get("/v1/users/u/sessions", headers=a).status_code for _ in range(2)] == [200] * 2
        r = c.get("/v1/users/u/sessions", headers=a)
        assert r.status_code == 429, r.text
        assert int(r.headers["Retry-After"]) >= 1
        error = r.json()["error"]
        assert error["type"] == "rate_limited" and "'a'" in error["message"]
        assert error["fields"][0]["field"] == "header.Authorization"
        assert c.get("/v1/users/u/sessions", headers=b).status_code == 200
        # A bad key is refused before it can spend anyone's tokens.
        assert (
            c.get("/v1/users/u/sessions", headers={"Authorization": "Bearer x"}).status_code == 401
        )
        assert c.get("/healthz").status_code == 200  # operations endpoints are never limited
    with pytest.raises(ValueError, match="rate_per_s"):
        LimitSettings(rate_per_s=-1.0)
