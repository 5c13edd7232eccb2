"""What machine a benchmark ran on, for the tables committed next to each benchmark: the one
description every benchmark and eval report uses (``eval/common.py`` hands it to the scripts
in ``eval/``; ``memsifter eval proxy`` writes it into its report).

``machine_facts()`` is the record (stored in a report's JSON); ``machine_line(facts)`` renders
it as one line, e.g. ``AMD EPYC, 2 cores, 23.5 GiB, no GPU, OMP_NUM_THREADS=1``, with the run's
state (Python, load average at the start, nice) after it when ``run=True``. The CPU model and
the memory are read from /proc where it exists (Linux), else from what ``platform`` knows.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


# CPU flags (Linux /proc/cpuinfo) of the units that compute bfloat16 natively; without them
# torch emulates bf16 matmuls and a forward pass is slower than in float32.
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags (the first ``flags`` line), empty where they cannot be read."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def cpu_bf16_units(flags: frozenset[str] | None = None) -> tuple[str, ...]:
    """Which of :data:`BF16_CPU_FLAGS` this CPU has (none: bf16 is emulated, so slower)."""
    have = cpu_flags() if flags is None else flags
    return tuple(f for f in BF16_CPU_FLAGS if f in have)


def emulated_bf16_text(asked: str, instead: str) -> str:
    """What a run says when ``asked`` (a bf16 setting) meets a CPU without bf16 units: it is
    kept (chosen, never inferred), and ``instead`` names the float32 setting. One wording for
    every place that says it (the transformers backend, the training loop, the gym probe)."""
    return (
        f"{asked} on a CPU without bf16 units (no amx_bf16 or avx512_bf16 flag): torch emulates "
        f"it and it is far slower than float32 (a head step 13x on an avx2-only CPU, "
        f"eval/results/bench_cpu_autocast); {instead}"
    )


def memory_gib() -> float | None:
    """Total memory in GiB (one decimal), or None where /proc/meminfo is missing."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def gpu_names() -> list[str]:
    """The GPUs this process can use: torch's view when a model already imported torch (it is
    never imported just to ask), else ``nvidia-smi``'s; empty when there are none."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return []
    torch = sys.modules.get("torch")
    if torch is not None:
        if not torch.cuda.is_available():
            return []
        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [name.strip() for name in out.splitlines() if name.strip()]


def machine_facts() -> dict[str, Any]:
    """The machine, and how busy it was when the run started: on a shared box the load average
    says more about the numbers than the CPU model does."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    cores = os.cpu_count()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    return {
        "cpu": cpu_model(),
        "cores": cores,
        "usable_cores": usable,
        "memory_gib": memory_gib(),
        "gpus": gpu_names(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_1_5_15": [round(x, 2) for x in load],
        "nice": os.nice(0) if hasattr(os, "nice") else None,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }


def machine_line(m: Mapping[str, Any], *, threads: bool = True, run: bool = False) -> str:
    """``m`` (``machine_facts()``) as one line: CPU, cores, memory and GPUs; then
    ``OMP_NUM_THREADS`` (``threads``: leave it out where the runs set their own); then, with
    ``run``, the Python version, the load average at the start and the nice level."""
    cores = f"{m['cores']} cores"
    if m.get("usable_cores") not in (None, m["cores"]):
        cores += f" ({m['usable_cores']} usable)"
    gpus = Counter(m.get("gpus") or ())
    gpu = (
        "GPU " + ", ".join(name if n == 1 else f"{n}x {name}" for name, n in gpus.items())
        if gpus
        else "no GPU"
    )
    line = f"{m['cpu']}, {cores}, {m['memory_gib'] or '?'} GiB, {gpu}"
    if threads:
        line += f", OMP_NUM_THREADS={m['omp_num_threads'] or 'unset'}"
    if run:
        load = ", ".join(str(x) for x in m["loadavg_1_5_15"])
        line += f"; Python {m['python']}; load average at start {load}; nice {m['nice']}"
    return line
