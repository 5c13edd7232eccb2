"""Serving: the recall service (``memsifter serve``: ``app.create_app`` and the modules it
wires together). A vLLM server on CPU for local runs is :mod:`memsifter.llm.vllm_cpu`."""
