"""OpenAI-compatible HTTP backend (``vllm serve``, SGLang, any /v1/completions server).

Async with bounded concurrency (a semaphore), per-request timeouts, and tenacity retries on
transient failures (:func:`memsifter.llm.errors.is_transient`: connection errors, timeouts, 429
and 5xx). After the last retry a :class:`~memsifter.llm.errors.BackendError` is raised: callers
(the reward service above all) must never receive a made-up completion.

We call ``/v1/completions`` with the prompt already rendered by our own chat template, so the
server sees exactly what the transformers backend sees. A prompt may also be a list of token ids
(``accepts_token_ids``; vLLM and llama.cpp take them as ``prompt``): the proxy sends the ids its
budget counted, and the server does not tokenize. ``token_ids=False`` is for servers that take
text only.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

import httpx
from tenacity import AsyncRetrying, Retrying

from memsifter.llm.base import Generation, SamplingParams
from memsifter.llm.errors import BackendError, retry_policy


class OpenAIBackend:
    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        tokenizer: str | None = None,
        api_key: str | None = None,
        max_concurrency: int = 16,
        timeout_s: float = 300.0,
        max_retries: int = 4,
        served_model_name: str | None = None,
        retry_wait_s: float = 0.5,
        transport: httpx.AsyncBaseTransport | httpx.MockTransport | None = None,
        token_ids: bool = True,
    ) -> None:
        self.accepts_token_ids = token_ids
        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        self.model_name = model
        self.served_model_name = served_model_name or model
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.retry_wait_s = retry_wait_s
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._tokenizer_name = tokenizer or model
        self._tok: Any = None
        self._transport = transport  # tests inject a mock transport here
        # A batch runs on its own event loop, so its AsyncClient cannot outlive the call; the
        # TLS context it would load from the CA bundle every time (~70 ms) is built once.
        self._ssl = httpx.create_ssl_context()
        # A lone prompt from a thread (the service's requests) goes through one kept client.
        self._client: httpx.Client | None = None
        self._client_lock = threading.Lock()
        self._sync_transport_ok = transport is None or isinstance(transport, httpx.BaseTransport)

    @property
    def tokenizer(self) -> Any:
        if self._tok is None:
            from memsifter.models import load_tokenizer

            # An adapter folder's own tokenizer, else its base's (the server runs the merge).
            self._tok = load_tokenizer(self._tokenizer_name)
        return self._tok

    def _body(self, prompt: str | Sequence[int], sampling: SamplingParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.served_model_name,
            "prompt": prompt if isinstance(prompt, str) else list(prompt),
            "n": sampling.n,
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        return body

    def _retrying(self) -> dict[str, object]:
        return retry_policy(self.max_retries + 1, self.retry_wait_s, 8.0, jitter=True)

    def _generations(self, resp: httpx.Response, latency: float) -> list[Generation]:
        try:
            data = resp.json()
            usage = data.get("usage") or {}
            choices = sorted(data["choices"], key=lambda c: c.get("index", 0))
            per_choice = int(usage.get("completion_tokens", 0)) // max(len(choices), 1)
            return [
                Generation(
                    text=c["text"],
                    prompt_tokens=int(usage.get("prompt_tokens", 0)),
                    completion_tokens=per_choice,
                    finish_reason=c.get("finish_reason") or "stop",
                    latency_s=latency,
                )
                for c in choices
            ]
        except (KeyError, TypeError, ValueError) as e:
            raise BackendError(
                f"unusable response from {self.base_url}: {e}: {resp.text[:300]!r}"
            ) from e

    def _failed(self, e: httpx.HTTPError) -> BackendError:
        if isinstance(e, httpx.HTTPStatusError):
            return BackendError(
                f"{self.base_url}: HTTP {e.response.status_code} for model "
                f"{self.served_model_name!r}: {e.response.text[:300]}"
            )
        return BackendError(f"{self.base_url}: {type(e).__name__}: {e}")

    async def _request(
        self,
        client: httpx.AsyncClient,
        sem: asyncio.Semaphore,
        prompt: str | Sequence[int],
        sampling: SamplingParams,
    ) -> list[Generation]:
        body = self._body(prompt, sampling)
        async with sem:
            async for attempt in AsyncRetrying(**self._retrying()):
                with attempt:
                    t0 = time.perf_counter()
                    resp = await client.post(f"{self.base_url}/completions", json=body)
                    resp.raise_for_status()
                    latency = time.perf_counter() - t0
        return self._generations(resp, latency)

    def _async_client(self) -> httpx.AsyncClient:
        """A client for one batch's event loop (it cannot outlive the loop)."""
        return httpx.AsyncClient(
            timeout=self.timeout_s,
            headers=self._headers,
            transport=self._transport,
            verify=self._ssl,
        )

    async def agenerate(
        self, prompts: Sequence[str | Sequence[int]], sampling: SamplingParams
    ) -> list[list[Generation]]:
        sem = asyncio.Semaphore(self.max_concurrency)
        async with self._async_client() as client:
            try:
                return list(
                    await asyncio.gather(
                        *(self._request(client, sem, p, sampling) for p in prompts)
                    )
                )
            except httpx.HTTPError as e:
                raise self._failed(e) from e

    def _generate_one(
        self, prompt: str | Sequence[int], sampling: SamplingParams
    ) -> list[Generation]:
        """One prompt, from a thread with no event loop (the recall service's request threads),
        on a client kept for the backend's life: the call reuses a kept-alive connection where
        ``agenerate`` would build an event loop, a client and a TCP connection, about 3 ms of
        CPU on 2 cores for a call the model answers in tens of milliseconds."""
        client = self._sync_client()
        body = self._body(prompt, sampling)
        try:
            for attempt in Retrying(**self._retrying()):
                with attempt:
                    t0 = time.perf_counter()
                    resp = client.post(f"{self.base_url}/completions", json=body)
                    resp.raise_for_status()
                    latency = time.perf_counter() - t0
        except httpx.HTTPError as e:
            raise self._failed(e) from e
        return self._generations(resp, latency)

    def _sync_client(self) -> httpx.Client:
        with self._client_lock:
            if self._client is None:
                transport = self._transport
                self._client = httpx.Client(
                    timeout=self.timeout_s,
                    headers=self._headers,
                    transport=transport if isinstance(transport, httpx.BaseTransport) else None,
                    verify=self._ssl,
                    limits=httpx.Limits(max_keepalive_connections=max(self.max_concurrency, 20)),
                )
            return self._client

    # -- next-token logprobs: what the first-token ranking head reads from a server ----------
    def _logprob_body(self, prompt: str | Sequence[int], top: int) -> dict[str, Any]:
        return {
            "model": self.served_model_name,
            "prompt": prompt if isinstance(prompt, str) else list(prompt),
            "max_tokens": 1,
            "temperature": 0.0,
            "logprobs": top,
            # vLLM: keys "token_id:N" instead of decoded text, so nothing is guessed from a string
            "return_tokens_as_token_ids": True,
            "n_probs": top,  # llama-server's own name for the same request
        }

    def _top_logprobs(self, resp: httpx.Response, labels: Sequence[int]) -> dict[int, float]:
        """The first position's top logprobs as ``{token id: logprob}``, from vLLM's legacy
        completions shape (``top_logprobs: [{"token_id:N": lp}]``) or llama-server's
        (``content: [{top_logprobs: [{id, logprob}]}]``)."""
        try:
            lp = resp.json()["choices"][0].get("logprobs") or {}
            out: dict[int, float] = {}
            if lp.get("content"):
                for e in lp["content"][0].get("top_logprobs") or []:
                    out[int(e["id"])] = float(e["logprob"])
            elif lp.get("top_logprobs"):
                by_text = {self.tokenizer.decode([t]): t for t in labels}
                for key, value in (lp["top_logprobs"][0] or {}).items():
                    if key.startswith("token_id:"):
                        out[int(key.removeprefix("token_id:"))] = float(value)
                    elif key in by_text:  # a server that returns decoded text only
                        out[by_text[key]] = float(value)
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise BackendError(
                f"unusable logprobs from {self.base_url}: {e}: {resp.text[:300]!r}"
            ) from e
        if not out:
            raise BackendError(
                f"{self.base_url} returned no logprobs for model {self.served_model_name!r}: "
                "the first-token ranking head needs a server that returns the top logprobs "
                "of the next token (vLLM, llama-server)"
            )
        return out

    def label_logprobs(
        self, prompts: Sequence[str | Sequence[int]], labels: Sequence[int], top: int = 20
    ) -> list[dict[int, float]]:
        """For each prompt, the next token's top-``top`` logprobs (``{token id: logprob}``),
        one request with ``max_tokens`` 1 each: what the first-token head reads. A server that
        returns none raises :class:`BackendError`; the caller checks that every label is there."""
        bodies = [self._logprob_body(p, top) for p in prompts]

        async def one(client: httpx.AsyncClient, sem: asyncio.Semaphore, body: dict) -> Any:
            async with sem:
                async for attempt in AsyncRetrying(**self._retrying()):
                    with attempt:
                        resp = await client.post(f"{self.base_url}/completions", json=body)
                        resp.raise_for_status()
            return resp

        async def run() -> list[Any]:
            sem = asyncio.Semaphore(self.max_concurrency)
            async with self._async_client() as client:
                return list(await asyncio.gather(*(one(client, sem, b) for b in bodies)))

        try:
            if len(bodies) == 1 and self._sync_transport_ok:
                client = self._sync_client()
                for attempt in Retrying(**self._retrying()):
                    with attempt:
                        resp = client.post(f"{self.base_url}/completions", json=bodies[0])
                        resp.raise_for_status()
                responses = [resp]
            else:
                responses = asyncio.run(run())
        except httpx.HTTPError as e:
            raise self._failed(e) from e
        return [self._top_logprobs(r, labels) for r in responses]

    def close(self) -> None:
        """Closes the kept client (its pooled connections); a later call opens a new one."""
        with self._client_lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def generate(
        self, prompts: Sequence[str | Sequence[int]], sampling: SamplingParams
    ) -> list[list[Generation]]:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            if len(prompts) == 1 and self._sync_transport_ok:
                return [self._generate_one(prompts[0], sampling)]
            return asyncio.run(self.agenerate(prompts, sampling))
        raise BackendError(
            "OpenAIBackend.generate() called inside an event loop; await agenerate() instead"
        )
