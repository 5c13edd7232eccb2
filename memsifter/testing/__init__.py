"""Test doubles and oracles, for the tests and the benchmarks; no library module imports them.

``tiny_models``: tiny, seeded stand-ins for hub models, so tests never download weights.
``backends``: a ChatML fake tokenizer and a scripted ``memsifter.llm.Backend``.
``rewards``: the reward tests' fake working LLM and ``naive_rewards``, the reference loop.
``stub_proxy``: an OpenAI-compatible stand-in proxy server (run by ``eval/bench/stub_proxy.py``).
``postgres``: a throwaway PostgreSQL database per test module or benchmark run.
``coarse``: ``LetterFilter``, a model-free dense filter that records what it embeds.
"""

from memsifter.testing.tiny_models import build_tiny_bge_m3, build_tiny_qwen3, build_tiny_smollm2

__all__ = ["build_tiny_bge_m3", "build_tiny_qwen3", "build_tiny_smollm2"]
