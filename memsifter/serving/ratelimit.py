"""Per-tenant rate limits: a token bucket per tenant on each replica (``limits.rate_per_s``
requests a second on average, bursts of ``limits.burst``). A request over the limit is a 429
with ``Retry-After``; it costs no database write and no model call. With N replicas behind a
balancer a tenant gets up to N times the rate: the limit protects each replica's CPU and proxy
slots, it is not a billing quota."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from memsifter.serving.errors import ServeError


class RateLimitedError(ServeError):
    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message, field="header.Authorization", status=429)
        self.retry_after_s = retry_after_s


class RateLimiter:
    def __init__(
        self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError("a rate limit needs rate_per_s > 0 and burst >= 1")
        self.rate = rate_per_s
        self.burst = float(burst)
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # tenant -> (tokens, at)

    def check(self, tenant: str) -> None:
        """Take one token for ``tenant``, or raise ``RateLimitedError`` saying when to retry."""
        with self._lock:
            now = self._clock()
            tokens, at = self._buckets.get(tenant, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            if tokens >= 1.0:
                self._buckets[tenant] = (tokens - 1.0, now)
                return
            self._buckets[tenant] = (tokens, now)
        wait = (1.0 - tokens) / self.rate
        raise RateLimitedError(
            f"tenant {tenant!r} is over its limit of {self.rate:g} requests/s "
            f"(bursts of {self.burst:g}); retry in {wait:.2f} s",
            retry_after_s=wait,
        )

    @staticmethod
    def retry_after_header(seconds: float) -> str:
        return str(max(1, math.ceil(seconds)))  # whole seconds, as HTTP wants
