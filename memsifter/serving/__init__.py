"""Helpers that run inference servers next to MemSifter (for now: vLLM on CPU, for tests and
local runs of the OpenAI-compatible backend without a GPU)."""
