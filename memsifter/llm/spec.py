"""Which LLM to call and how: one typed :class:`BackendSpec`, and :func:`build_backend`, the one
place a spec becomes a backend.

Every role that calls an LLM (the proxy, the working-LLM answerer, the judge, the bookmark
extractor; in training, evaluation and serving alike) describes its model as a ``BackendSpec``
(its config converts to one) and asks ``build_backend`` for it. A field left ``None`` keeps the
backend's own default, and a field that the chosen kind does not take (``batch_size`` for a
server, ``base_url`` for a local model) is ignored, so one config section can describe any kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from memsifter.errors import UnknownNameError
from memsifter.llm.base import Backend

BACKENDS = ("transformers", "openai", "vllm", "gym")

# The spec fields each kind's constructor takes (beyond the model).
_FIELDS: dict[str, tuple[str, ...]] = {
    "transformers": ("device", "dtype", "batch_size", "threads"),
    "openai": (
        "base_url",
        "served_model_name",
        "tokenizer",
        "api_key",
        "max_concurrency",
        "timeout_s",
        "max_retries",
        "retry_wait_s",
        "server",
    ),
    "vllm": ("dtype",),
    "gym": (),  # the memory gym's deterministic reader (memsifter.llm.gym)
}


@dataclass(frozen=True)
class BackendSpec:
    """One LLM: the backend kind, the model, and the settings of that kind's client."""

    kind: str  # transformers | openai | vllm | gym
    model: str  # a hub id, a local folder (a PEFT adapter included) or a built-in offline name
    # openai (any OpenAI-compatible /v1/completions server)
    base_url: str | None = None
    served_model_name: str | None = None  # the server's name for the model, if not ``model``
    tokenizer: str | None = None  # where to load the tokenizer from, if not ``model``
    api_key: str | None = None
    max_concurrency: int | None = None  # requests in flight
    timeout_s: float | None = None  # per request
    max_retries: int | None = None  # per request, on transient errors
    retry_wait_s: float | None = None  # backoff base
    # which server is behind base_url (vllm | llamacpp): said, never guessed; the first-token
    # head's marker read needs it (memsifter.llm.openai_http.MARKER_SERVE_HINT)
    server: str | None = None
    # transformers (local); dtype also for vllm
    device: str | None = None
    dtype: str | None = None
    batch_size: int | None = None
    threads: int | None = None  # torch CPU threads
    # anything else the kind's constructor takes (vllm engine arguments, a test's transport)
    options: Mapping[str, Any] = field(default_factory=dict)

    def kwargs(self) -> dict[str, Any]:
        """The constructor arguments of this kind that the spec sets."""
        if self.kind not in _FIELDS:
            raise UnknownNameError(
                f"unknown backend {self.kind!r}; choose one of {', '.join(BACKENDS)}"
            )
        out = {k: getattr(self, k) for k in _FIELDS[self.kind] if getattr(self, k) is not None}
        out.update(self.options)
        return out


def build_backend(spec: BackendSpec) -> Backend:
    """The backend ``spec`` describes (its module is imported only now: vllm and torch are
    heavy, and vllm is optional)."""
    kwargs = spec.kwargs()
    if spec.kind == "transformers":
        from memsifter.llm.transformers_backend import TransformersBackend

        return TransformersBackend(spec.model, **kwargs)
    if spec.kind == "openai":
        from memsifter.llm.openai_http import OpenAIBackend

        return OpenAIBackend(model=spec.model, **kwargs)
    if spec.kind == "gym":
        from memsifter.llm.gym import GymBackend

        return GymBackend(spec.model, **kwargs)
    from memsifter.llm.vllm_engine import VLLMBackend

    return VLLMBackend(spec.model, **kwargs)


__all__ = ["BACKENDS", "BackendSpec", "build_backend"]
