"""Files the library ships beside its code (package data), so that an installed wheel runs without
a source checkout.

Each file has this one home. ``configs/serve/default.yaml`` in the checkout is a symbolic link to
:data:`SERVE_DEFAULT`, so ``memsifter serve --config configs/serve/default.yaml`` and a bare
``memsifter serve`` read the same bytes; ``scripts/vllm_cpu_server.sh`` and
``scripts/llamacpp_server.sh`` are thin wrappers that run :data:`VLLM_CPU_SERVER` and
:data:`LLAMACPP_SERVER` with the checkout's defaults. pyproject's ``package-data`` lists this
folder, and ``tests/serving/test_wheel.py`` installs the built wheel and serves from it.
"""

from __future__ import annotations

from pathlib import Path

RESOURCES = Path(__file__).resolve().parent
# The recall service's default configuration (memsifter.serving.config.load_serve_config).
SERVE_DEFAULT = RESOURCES / "serve_default.yaml"
# The vLLM CPU server launcher (memsifter.llm.vllm_cpu.launch_vllm_cpu_server).
VLLM_CPU_SERVER = RESOURCES / "vllm_cpu_server.sh"
# The llama.cpp server launcher and builder (memsifter.llm.llamacpp).
LLAMACPP_SERVER = RESOURCES / "llamacpp_server.sh"
# The released MemSifter proxy's user prompt, verbatim (memsifter.ranker.official).
OFFICIAL_USER_PROMPT = RESOURCES / "official_user_prompt.txt"

__all__ = [
    "LLAMACPP_SERVER",
    "OFFICIAL_USER_PROMPT",
    "RESOURCES",
    "SERVE_DEFAULT",
    "VLLM_CPU_SERVER",
]
