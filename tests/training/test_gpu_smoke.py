"""scripts/gpu_smoke.sh (issue 14, item 7): the GPU smoke test of vLLM server mode across epochs.
It cannot run here (no GPU); these checks keep it parseable and make sure that, without a CUDA
GPU, it refuses at once with a clear message before building or starting anything."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_smoke.sh"


def test_script_parses() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True, timeout=30)


def _run(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    work = tmp_path / "work"
    full = {**os.environ, "MEMSIFTER_PY": sys.executable, "MEMSIFTER_SMOKE_DIR": str(work), **env}
    t0 = time.monotonic()
    proc = subprocess.run(
        ["bash", str(SCRIPT)], env=full, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    elapsed = time.monotonic() - t0
    assert not work.exists(), "it created its work folder before refusing"
    return proc, elapsed


def test_refuses_when_cuda_visible_devices_hides_every_gpu(tmp_path: Path) -> None:
    proc, elapsed = _run(tmp_path, CUDA_VISIBLE_DEVICES="")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no CUDA GPU" in proc.stderr and "refusing to start" in proc.stderr
    assert "FAIL (not started)" in proc.stdout and "PASS" not in proc.stdout
    assert elapsed < 10


def test_refuses_when_torch_sees_no_gpu(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible: the script would run for real")
    # CUDA_VISIBLE_DEVICES names a device, but torch finds none (a CPU box): the torch check.
    proc, elapsed = _run(tmp_path, CUDA_VISIBLE_DEVICES="0")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "torch.cuda.is_available() is False" in proc.stderr
    assert "refusing to start" in proc.stderr and "PASS" not in proc.stdout
    assert elapsed < 90
