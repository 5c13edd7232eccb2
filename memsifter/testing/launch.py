"""``accelerate launch`` of a test driver on CPU: N processes under torchrun with gloo.

``accelerate launch --cpu`` starts a single process in accelerate 1.x (more CPU processes go
through mpirun), so the driver is launched ``--multi_gpu`` with no GPU visible: torchrun starts
the processes and accelerate picks gloo."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def accelerate_launch(
    script: Path | str,
    args: Sequence[str],
    *,
    processes: int,
    root: Path,
    timeout: float = 900,
    module: bool = False,
    fsdp: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``script args`` on ``processes`` CPU processes from ``root`` (on ``PYTHONPATH``);
    with ``module``, ``script`` is a module name run as ``python -m``; with ``fsdp``, launched
    as ``configs/accelerate/fsdp.yaml`` launches (FSDP2, full sharding) instead of DDP."""
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent))
    assert accelerate, "accelerate is not installed next to this Python"
    env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": "",  # CPU and gloo, even on a GPU machine
        # One thread a process, whatever the caller's pool: torch sizes it from MKL_NUM_THREADS
        # too (the test suite sets 2), and a thread count changes how a CPU's matmuls sum.
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONPATH": str(root),
        "TOKENIZERS_PARALLELISM": "false",
    }
    cmd = [
        accelerate, "launch",
        *(["--use_fsdp", "--fsdp_version", "2", "--fsdp_reshard_after_forward", "true"]
          if fsdp else ["--multi_gpu"]),
        "--num_processes", str(processes),
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(free_port()), *(["-m"] if module else []), str(script),
        *args,
    ]  # fmt: skip
    return subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, timeout=timeout)


__all__ = ["accelerate_launch", "free_port"]
