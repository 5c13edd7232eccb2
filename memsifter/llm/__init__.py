"""The LLM layer: every model call in the project (the proxy, the working-LLM answerer, the judge,
the bookmark extractor) goes through one :class:`Backend` protocol, built from one typed
:class:`BackendSpec` by :func:`build_backend`, and fails with one :class:`BackendError` after one
retry policy.

Backends: transformers (local), OpenAI-compatible HTTP (vLLM / SGLang servers), and the
in-process vLLM engine (only when vllm is installed); ``vllm_cpu`` starts a vLLM server on CPU
for tests and local runs without a GPU.
"""

from __future__ import annotations

from memsifter.llm.base import Backend, Generation, SamplingParams
from memsifter.llm.errors import CALL_ERRORS, BackendError, is_transient, retry_policy
from memsifter.llm.spec import BACKENDS, BackendSpec, build_backend

__all__ = [
    "BACKENDS",
    "CALL_ERRORS",
    "Backend",
    "BackendError",
    "BackendSpec",
    "Generation",
    "SamplingParams",
    "build_backend",
    "is_transient",
    "retry_policy",
]
