"""The OpenAI-compatible backend against a mock transport: request shape, bounded concurrency,
retries on transient errors, and a loud failure (never a made-up completion) after the last."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from memsifter.llm import BackendError, BackendSpec, SamplingParams, build_backend
from memsifter.llm.openai_http import OpenAIBackend


def _ok(body: dict) -> httpx.Response:
    n = body["n"]
    return httpx.Response(
        200,
        json={
            "choices": [
                {"index": i, "text": f"{body['prompt']}|{i}", "finish_reason": "stop"}
                for i in range(n)
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2 * n},
        },
    )


def test_request_shape_order_and_n() -> None:
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/completions"
        assert request.headers["authorization"] == "Bearer k"
        body = json.loads(request.content)
        seen.append(body)
        return _ok(body)

    be = OpenAIBackend(
        "http://x:1",
        model="m",
        api_key="k",
        served_model_name="srv",
        transport=httpx.MockTransport(handler),
    )
    out = be.generate(["a", "b"], SamplingParams(max_new_tokens=7, n=2, seed=3, stop=("</r>",)))
    assert [[g.text for g in gs] for gs in out] == [["a|0", "a|1"], ["b|0", "b|1"]]
    assert out[0][0].completion_tokens == 2 and out[0][0].prompt_tokens == 3
    assert seen[0]["model"] == "srv" and seen[0]["max_tokens"] == 7 and seen[0]["seed"] == 3
    assert seen[0]["stop"] == ["</r>"] and seen[0]["temperature"] == 0.0


def test_bounded_concurrency() -> None:
    state = {"now": 0, "peak": 0}

    async def handler(request: httpx.Request) -> httpx.Response:
        state["now"] += 1
        state["peak"] = max(state["peak"], state["now"])
        await asyncio.sleep(0.01)
        state["now"] -= 1
        return _ok(json.loads(request.content))

    be = OpenAIBackend(
        "http://x:1/v1", model="m", max_concurrency=3, transport=httpx.MockTransport(handler)
    )
    out = be.generate([str(i) for i in range(20)], SamplingParams())
    assert len(out) == 20 and state["peak"] == 3


def test_retries_transient_then_succeeds() -> None:
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] == 1:
            raise httpx.ConnectError("refused")
        if calls["n"] == 2:
            return httpx.Response(503, text="busy")
        return _ok(json.loads(request.content))

    be = OpenAIBackend(
        "http://x:1", model="m", max_retries=3, transport=httpx.MockTransport(handler)
    )
    assert be.generate(["p"], SamplingParams())[0][0].text == "p|0"
    assert calls["n"] == 3


def test_raises_after_last_retry_and_on_client_errors() -> None:
    calls = {"n": 0}

    def down(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        return httpx.Response(500, text="boom")

    be = OpenAIBackend(
        "http://x:1",
        model="m",
        retry_wait_s=0.01,
        max_retries=1,
        transport=httpx.MockTransport(down),
    )
    with pytest.raises(BackendError, match="500"):
        be.generate(["p"], SamplingParams())
    assert calls["n"] == 2  # first try + one retry, then loud failure

    calls["n"] = 0
    bad = OpenAIBackend(
        "http://x:1",
        model="m",
        max_retries=3,
        transport=httpx.MockTransport(
            lambda r: (calls.__setitem__("n", calls["n"] + 1), httpx.Response(400, text="no"))[1]
        ),
    )
    with pytest.raises(BackendError, match="400"):
        bad.generate(["p"], SamplingParams())
    assert calls["n"] == 1  # a 4xx is not transient: no retry

    garbage = OpenAIBackend(
        "http://x:1",
        model="m",
        transport=httpx.MockTransport(lambda r: httpx.Response(200, json={})),
    )
    with pytest.raises(BackendError, match="unusable response"):
        garbage.generate(["p"], SamplingParams())


def test_a_lone_prompt_reuses_one_kept_client_and_a_batch_does_not() -> None:
    """The service sends one prompt per recall from a worker thread: those calls share one
    client (kept-alive connections) until ``close``; a batch runs on its own event loop."""
    be = OpenAIBackend(
        "http://x:1", model="m", transport=httpx.MockTransport(lambda r: _ok(json.loads(r.content)))
    )
    assert be.generate(["a"], SamplingParams())[0][0].text == "a|0"
    kept = be._client
    assert kept is not None
    assert be.generate(["b"], SamplingParams())[0][0].text == "b|0" and be._client is kept
    assert [g[0].text for g in be.generate(["c", "d"], SamplingParams())] == ["c|0", "d|0"]
    assert be._client is kept
    be.close()
    assert be._client is None and kept.is_closed
    assert be.generate(["e"], SamplingParams())[0][0].text == "e|0"  # a new client after close


def test_a_batch_fails_loudly_too() -> None:
    be = OpenAIBackend(
        "http://x:1",
        model="m",
        max_retries=0,
        transport=httpx.MockTransport(lambda r: httpx.Response(500, text="boom")),
    )
    with pytest.raises(BackendError, match="HTTP 500 for model 'm': boom"):
        be.generate(["p", "q"], SamplingParams())


def test_build_backend_unknown() -> None:
    from memsifter.errors import UnknownNameError

    with pytest.raises(UnknownNameError, match="unknown backend"):
        build_backend(BackendSpec(kind="tgi", model="m"))
