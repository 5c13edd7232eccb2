"""The in-process vLLM backend (``vllm.LLM``) on the converted SmolLM2, run inside ``.venv-vllm``
(the main venv has no vllm): greedy output must equal the transformers backend's."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from memsifter.llm.vllm_cpu import vllm_venv

ROOT = Path(__file__).resolve().parents[2]
QUESTION = "What is the capital of France? Answer in one sentence."

_SCRIPT = """
import json, sys
from memsifter.llm import BackendSpec, SamplingParams, build_backend

if __name__ == "__main__":  # vLLM spawns its engine process
    be = build_backend(BackendSpec(kind="vllm", model=sys.argv[1], dtype="float32",
                       options={"max_model_len": 1024, "gpu_memory_utilization": 0,
                                "enforce_eager": True}))
    p = be.tokenizer.apply_chat_template([{"role": "user", "content": sys.argv[2]}],
                                         tokenize=False, add_generation_prompt=True)
    g = be.generate([p], SamplingParams(max_new_tokens=24))[0][0]
    print("RESULT " + json.dumps({"text": g.text, "prompt_tokens": g.prompt_tokens,
                                  "finish_reason": g.finish_reason}))
"""


@pytest.mark.slow
@pytest.mark.vllm_server
@pytest.mark.usefixtures("vllm_built")
def test_vllm_engine_backend_matches_transformers(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    python = vllm_venv() / "bin" / "python"
    smollm2_dir: Path = request.getfixturevalue("smollm2_dir")
    script = tmp_path / "engine.py"
    script.write_text(_SCRIPT)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    }
    proc = subprocess.run(
        [str(python), str(script), str(smollm2_dir), QUESTION],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    got = json.loads(lines[-1].removeprefix("RESULT "))

    from memsifter.llm import BackendSpec, SamplingParams, build_backend

    hf = build_backend(
        BackendSpec(kind="transformers", model=str(smollm2_dir), batch_size=1, threads=2)
    )
    prompt = hf.tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTION}], tokenize=False, add_generation_prompt=True
    )
    ref = hf.generate([prompt], SamplingParams(max_new_tokens=24))[0][0]
    assert got["text"] == ref.text and got["finish_reason"] == "stop"
    assert got["prompt_tokens"] == ref.prompt_tokens
