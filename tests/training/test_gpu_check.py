"""The one-GPU check (scripts/gpu_check.sh, eval/bench/bench_gpu_step.py) without a GPU: its dry run
takes every code path (both heads, LoRA and full fine-tuning with float32 masters, the recall
prefill) on a tiny model of the same architecture on CPU and writes its table; the real check
refuses cleanly where there is no CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "CUDA_VISIBLE_DEVICES": "",
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_the_dry_run_takes_every_code_path_on_cpu(tmp_path: Path) -> None:
    done = _run("--dry-run", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "bench_gpu_step.json").read_text())
    rows = {(r["head"], r["mode"], r["prompt_tokens"]): r["status"] for r in report["rows"]}
    for head in ("first_token", "generate"):
        for mode in ("lora", "full"):
            assert rows[(head, mode, 64)] == rows[(head, mode, 128)] == "ok"
    assert rows[("recall", "prefill", 128)] == "ok"
    assert report["verdict"].startswith("DRY RUN (code paths ok")
    assert "| first_token | lora | 64 | ok |" in (tmp_path / "bench_gpu_step.md").read_text()


def test_without_a_gpu_the_check_refuses_by_name(tmp_path: Path) -> None:
    done = _run(str(tmp_path))
    assert done.returncode == 2
    assert "no CUDA GPU" in done.stderr and "FAIL (not started)" in done.stdout
    assert not (tmp_path / "bench_gpu_step.md").exists()
