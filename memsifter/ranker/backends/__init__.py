"""Inference backends behind one protocol: transformers (local), OpenAI-compatible HTTP (vLLM /
SGLang servers), and the in-process vLLM engine (only when vllm is installed)."""

from __future__ import annotations

from typing import Any

from memsifter.errors import UnknownNameError
from memsifter.ranker.backends.base import Backend, Generation, SamplingConfig

BACKENDS = ("transformers", "openai", "vllm")


def build_backend(kind: str, model: str, **options: Any) -> Backend:
    """``options`` are the backend's own constructor arguments (``base_url`` for openai, ...)."""
    if kind == "transformers":
        from memsifter.ranker.backends.hf import TransformersBackend

        return TransformersBackend(model, **options)
    if kind == "openai":
        from memsifter.ranker.backends.openai_http import OpenAIBackend

        return OpenAIBackend(model=model, **options)
    if kind == "vllm":
        from memsifter.ranker.backends.vllm_engine import VLLMBackend

        return VLLMBackend(model, **options)
    raise UnknownNameError(f"unknown backend {kind!r}; choose one of {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "Backend", "Generation", "SamplingConfig", "build_backend"]
