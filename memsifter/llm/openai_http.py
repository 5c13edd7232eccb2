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

The first-token ranking head reads a server two ways (:mod:`memsifter.ranker.first_token`): the
next token's top logprobs (``read: label``, :meth:`OpenAIBackend.label_logprobs`, the same request
on both servers), and one token's logit at many positions of the prompt (``read: marker``,
:meth:`OpenAIBackend.marker_logits`), which neither server's completions API returns: it needs a
server started for it, and which one is behind ``base_url`` is said, never guessed (``server``:
``vllm`` or ``llamacpp``; the flags each needs are in :data:`MARKER_SERVE_HINT`).
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx
from tenacity import AsyncRetrying, Retrying

from memsifter.llm.base import Generation, SamplingParams
from memsifter.llm.errors import BackendError, retry_policy

# What may stand behind ``base_url``, where it matters (the marker read): its kind is said, never
# inferred from an answer.
SERVERS: tuple[str, ...] = ("vllm", "llamacpp")
# How each server is started for the marker read (docs/ranking_head.md, "Head reads"): vLLM turns
# the LM head's row of the read token into a one-label token classifier and returns that logit at
# every token; llama-server returns every token's final hidden state, and the client multiplies
# it by the row itself.
MARKER_SERVE_HINT: dict[str, str] = {
    "vllm": (
        "start vLLM with --runner pooling --convert classify --hf-overrides "
        '\'{"classifier_from_token": ["<the read token as the vocabulary writes it>"], '
        '"method": "no_post_processing"}\' --pooler-config \'{"task": "token_classify"}\' '
        "(scripts/vllm_cpu_server.sh --marker-read does)"
    ),
    "llamacpp": (
        "start llama-server with --embeddings --pooling none --ubatch-size N --batch-size N, "
        "N at least a prompt's tokens (scripts/llamacpp_server.sh --marker-read does)"
    ),
}


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
        server: str | None = None,
        head_weights: str | None = None,
    ) -> None:
        if server is not None and server not in SERVERS:
            raise BackendError(
                f"server must be one of {', '.join(SERVERS)} (or unset), got {server!r}"
            )
        # Which server is behind base_url: only the marker read needs to know (None: unsaid).
        self.server = server
        # llama.cpp's marker read: the model folder whose LM-head row multiplies the hidden
        # states (default: the merged folder of ``model``, the one its GGUF was exported from).
        self._head_weights = head_weights
        self._head_rows: dict[int, tuple[list[float], float]] = {}
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

    def _post_all(self, url: str, bodies: Sequence[dict[str, Any]]) -> list[httpx.Response]:
        """POST each body to ``url``, at most ``max_concurrency`` at once, each retried on
        transient failures; the responses in body order. A lone body from a thread goes through
        the kept client (no event loop to build). An HTTP failure after the retries raises
        :class:`BackendError` with the server's own message."""

        async def one(client: httpx.AsyncClient, sem: asyncio.Semaphore, body: dict) -> Any:
            async with sem:
                async for attempt in AsyncRetrying(**self._retrying()):
                    with attempt:
                        resp = await client.post(url, json=body)
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
                        resp = client.post(url, json=bodies[0])
                        resp.raise_for_status()
                return [resp]
            return asyncio.run(run())
        except httpx.HTTPError as e:
            raise self._failed(e) from e

    def label_logprobs(
        self, prompts: Sequence[str | Sequence[int]], labels: Sequence[int], top: int = 20
    ) -> list[dict[int, float]]:
        """For each prompt, the next token's top-``top`` logprobs (``{token id: logprob}``),
        one request with ``max_tokens`` 1 each: what the first-token head reads. A server that
        returns none raises :class:`BackendError`; the caller checks that every label is there."""
        bodies = [self._logprob_body(p, top) for p in prompts]
        responses = self._post_all(f"{self.base_url}/completions", bodies)
        return [self._top_logprobs(r, labels) for r in responses]

    # -- one token's logit at many positions: the head's marker read ---------------------------
    def marker_read_refusal(self) -> str | None:
        """Why this backend cannot serve the marker read, or None when it can: the server
        behind ``base_url`` must be named (``server``), since the two answer different
        requests and a guess could read the wrong thing."""
        if self.server is None:
            return (
                f"the openai backend at {self.base_url} does not say which server it is; set "
                "its server option (BackendSpec.server, proxy.server in a serve config) to vllm "
                "or llamacpp, started for the marker read: "
                + "; or ".join(f"{k}: {v}" for k, v in MARKER_SERVE_HINT.items())
            )
        return None

    def _root(self) -> str:
        """The server's root: both marker endpoints (vLLM's /pooling, llama-server's
        /embeddings) live beside /v1, not under it."""
        return self.base_url.removesuffix("/v1")

    def _head_row(self, token_id: int) -> tuple[list[float], float]:
        """The LM head's row (and bias) of ``token_id``, read once from the model's weights."""
        if token_id not in self._head_rows:
            from memsifter.llm.llamacpp import output_row

            folder = self._head_weights
            if folder is None:
                from memsifter.models import plain_model_folder

                folder = plain_model_folder(self.model_name)
            self._head_rows[token_id] = output_row(folder, token_id)
        return self._head_rows[token_id]

    def marker_logits(
        self,
        prompts: Sequence[Sequence[int]],
        positions: Sequence[Sequence[int]],
        token_id: int,
    ) -> list[list[float]]:
        """For each prompt (token ids), the logit of ``token_id`` at each of its ``positions``
        (indices into those ids), from one prefill a prompt: the marker read of the first-token
        head. Each prompt is sent only up to its last position (a causal model's states there
        do not depend on later tokens, so the scores are the full prompt's, for less work).

        - ``server: vllm`` (``--runner pooling --convert classify``, the read token's LM-head
          row as a one-label classifier, served per token: ``--pooler-config`` task
          ``token_classify``): ``POST /pooling`` with task ``token_classify`` and
          the activation off returns that logit at every token, one float each. The token is
          the one the server was started with (``token_id`` is not sent: the launcher names
          it from the same tokenizer, :func:`memsifter.llm.vllm_cpu.marker_read_args`).
        - ``server: llamacpp`` (``--embeddings --pooling none``): ``POST /embeddings`` returns
          every token's final (normed) hidden state, unnormalised; the client multiplies the
          positions' states by the LM head's row of ``token_id``, read from the model folder
          (the tied input embedding where the config ties them).

        Anything unusable (no server named, the wrong endpoint or flags, fewer values than
        tokens sent, more than one value a token) raises :class:`BackendError` naming the
        prompt: no score is made up."""
        why = self.marker_read_refusal()
        if why is not None:
            raise BackendError(why)
        if len(prompts) != len(positions):
            raise BackendError(f"{len(prompts)} prompts for {len(positions)} position lists")
        sent: list[list[int]] = []
        for i, (ids, where) in enumerate(zip(prompts, positions, strict=True)):
            if isinstance(ids, str):
                raise BackendError(
                    f"prompt {i}: the marker read takes token ids (its positions index them), "
                    "not text"
                )
            bad = [p for p in where if not 0 <= p < len(ids)]
            if not where or bad:
                raise BackendError(
                    f"prompt {i}: positions {list(bad) or list(where)} are not within its "
                    f"{len(ids)} tokens"
                )
            sent.append(list(ids)[: max(where) + 1])
        values: Sequence[Any]  # per prompt: position -> logit (a list, or a dict of the wanted)
        if self.server == "vllm":
            values = self._vllm_token_logits(sent)
        else:
            values = self._llamacpp_token_logits(sent, positions, token_id)
        return [[got[p] for p in where] for got, where in zip(values, positions, strict=True)]

    def _marker_failed(self, e: BackendError) -> BackendError:
        hint = MARKER_SERVE_HINT[self.server or "vllm"]
        return BackendError(f"{e}; the marker read on {self.server}: {hint}")

    def _answer(
        self, resp: httpx.Response, i: int, endpoint: str, pick: Callable[[Any], Any]
    ) -> Any:
        """``pick`` applied to prompt ``i``'s JSON answer from ``endpoint``; an answer of
        another shape raises :class:`BackendError` quoting its start."""
        try:
            return pick(resp.json())
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise BackendError(
                f"prompt {i}: unusable {endpoint} answer from {self._root()}: {e}: "
                f"{resp.text[:300]!r}"
            ) from e

    def _vllm_token_logits(self, prompts: list[list[int]]) -> list[list[float]]:
        """Each prompt's per-token logit of the classifier vLLM built from the read token's
        LM-head row. Why this and not hidden states (``token_embed``): one float a token
        comes back instead of a hidden state's width, and the product runs inside vLLM, in its
        fp32 pooling head, on the very weights it serves."""
        bodies = [
            {
                "model": self.served_model_name,
                "input": p,
                "task": "token_classify",
                "use_activation": False,  # the raw logit, not its sigmoid
                "add_special_tokens": False,
                "encoding_format": "float",
            }
            for p in prompts
        ]
        try:
            responses = self._post_all(f"{self._root()}/pooling", bodies)
        except BackendError as e:
            raise self._marker_failed(e) from e

        def rows_of(data: Any) -> list[list[float]]:
            rows = data["data"][0]["data"]
            if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows):
                raise TypeError(f"data is not one list of values a token: {str(rows)[:80]}")
            return rows

        out = []
        for i, (resp, p) in enumerate(zip(responses, prompts, strict=True)):
            rows = self._answer(resp, i, "/pooling", rows_of)
            if len(rows) != len(p):
                raise BackendError(
                    f"prompt {i}: {self._root()}/pooling gave {len(rows)} values for "
                    f"{len(p)} tokens"
                )
            widths = {len(r) for r in rows}
            if widths != {1}:
                raise BackendError(
                    f"prompt {i}: {self._root()}/pooling gave {sorted(widths)} values a token, "
                    "not one: the server's classifier is not the read token's row alone; "
                    + MARKER_SERVE_HINT["vllm"]
                )
            out.append([float(r[0]) for r in rows])
        return out

    def _llamacpp_token_logits(
        self, prompts: list[list[int]], positions: Sequence[Sequence[int]], token_id: int
    ) -> list[dict[int, float]]:
        """The read token's logit at each wanted position: llama-server's per-token hidden
        states (``--pooling none``: after the final norm, not normalised) times the LM head's
        row, summed in float64."""
        row, bias = self._head_row(token_id)
        bodies = [{"content": p} for p in prompts]  # "content": llama-server's own (non-OAI) shape
        try:
            responses = self._post_all(f"{self._root()}/embeddings", bodies)
        except BackendError as e:
            raise self._marker_failed(e) from e

        def states_of(data: Any) -> list[Any]:
            states = data[0]["embedding"]
            if len(data) != 1 or not isinstance(states, list):
                raise TypeError(f"{len(data)} results, not one list of states")
            return states

        out: list[dict[int, float]] = []
        for i, (resp, p, where) in enumerate(zip(responses, prompts, positions, strict=True)):
            states = self._answer(resp, i, "/embeddings", states_of)
            flat = bool(states) and not isinstance(states[0], list)  # one vector, unwrapped
            if len(states) != len(p) or flat:
                pooled = len(states) == 1 or flat
                raise BackendError(
                    f"prompt {i}: {self._root()}/embeddings gave {len(states)} vectors for "
                    f"{len(p)} tokens"
                    + ("; it pools them (start it with --pooling none)" if pooled else "")
                )
            scores: dict[int, float] = {}
            for pos in where:
                state = states[pos]
                if len(state) != len(row):
                    raise BackendError(
                        f"prompt {i}: a hidden state of width {len(state)} from "
                        f"{self._root()}, but the LM head's rows have {len(row)}: the server "
                        "serves another model than the weights the row was read from"
                    )
                scores[pos] = math.fsum(a * b for a, b in zip(state, row, strict=True)) + bias
            out.append(scores)
        return out

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
