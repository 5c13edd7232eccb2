"""The one error type an LLM call raises, and the one policy that decides which failures are
worth another attempt.

Two retry loops use it: the HTTP backend retries each request (connection trouble, timeouts,
429 and 5xx from the server), and the reward service retries a whole working-LLM or judge batch
on top of that. Both ask :func:`is_transient`, so "transient" means the same thing at both
levels: a 4xx answer (a bad request, an unknown model) would only fail again and is raised at
once. After the last attempt the error is raised; no caller ever receives a made-up completion.
"""

from __future__ import annotations

from memsifter.errors import MemSifterError


class BackendError(MemSifterError):
    """The inference server failed or answered something unusable."""


# What a backend call may raise: our own error, or a transport error that escaped a backend.
CALL_ERRORS: tuple[type[BaseException], ...] = (BackendError, ConnectionError, TimeoutError)


def _transient_status(code: int) -> bool:
    return code == 429 or code >= 500


def is_transient(exc: BaseException) -> bool:
    """Worth another attempt: connection trouble, timeouts, 429 and 5xx, whether raised by httpx
    directly (inside the HTTP backend) or wrapped in a :class:`BackendError` (above it)."""
    import httpx  # here, not at the top: ``memsifter.llm`` stays cheap to import

    if isinstance(exc, httpx.TransportError | httpx.TimeoutException):
        return True
    if isinstance(exc, httpx.HTTPStatusError):
        return _transient_status(exc.response.status_code)
    if not isinstance(exc, CALL_ERRORS):
        return False
    cause = exc.__cause__
    if isinstance(cause, httpx.HTTPStatusError):
        return _transient_status(cause.response.status_code)
    return True


def retry_policy(
    attempts: int, wait_s: float, max_wait_s: float, *, jitter: bool = False
) -> dict[str, object]:
    """tenacity keyword arguments for ``Retrying``/``AsyncRetrying``: ``attempts`` tries in all,
    exponential backoff from ``wait_s`` capped at ``max_wait_s`` (plus up to ``wait_s`` of random
    jitter when many concurrent requests would otherwise retry in step), only on
    :func:`is_transient` errors, re-raising the last one."""
    from tenacity import retry_if_exception, stop_after_attempt, wait_exponential, wait_random

    wait = wait_exponential(multiplier=wait_s, max=max_wait_s)
    if jitter:
        wait = wait + wait_random(0, wait_s)
    return {
        "stop": stop_after_attempt(attempts),
        "wait": wait,
        "retry": retry_if_exception(is_transient),
        "reraise": True,
    }


__all__ = ["CALL_ERRORS", "BackendError", "is_transient", "retry_policy"]
