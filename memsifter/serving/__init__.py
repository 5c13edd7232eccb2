"""Serving: the recall service (``memsifter serve``: ``app.create_app`` and the modules it
wires together) and helpers that run inference servers next to MemSifter (``vllm_cpu``: vLLM
on CPU, for tests and local runs of the OpenAI-compatible backend without a GPU)."""
