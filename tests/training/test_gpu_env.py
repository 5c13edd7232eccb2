"""The GPU environment (memsifter.training.gpu_env): our vLLM range is TRL's own, the ``gpu``
extra pins it, a run asking for vLLM outside it is refused naming both versions, and (slow, the
package index) ``train`` + ``gpu`` resolve together for Linux x86-64 with nothing installed."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

from memsifter.errors import DataError
from memsifter.training.gpu_env import TRL_VLLM_RANGE, check_vllm

ROOT = Path(__file__).resolve().parents[2]
PROBES = [
    "0.10.2",
    "0.21.0",
    "0.22.0",
    "0.24.0+cu129",
    "0.31.0",
    "0.31.0.post1",
    "0.31.1",
    "0.32.0",
]


def _in_range(v: str) -> bool:
    return Version(Version(v).base_version) in TRL_VLLM_RANGE


def test_the_range_is_trls_own(monkeypatch: pytest.MonkeyPatch) -> None:
    import trl.import_utils as iu

    for version in PROBES:
        monkeypatch.setattr(iu, "_is_package_available", lambda *_a, v=version, **_k: (True, v))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            iu.is_vllm_available()
        warned = any("supports vLLM versions" in str(w.message) for w in caught)
        assert warned == (not _in_range(version)), version


def test_the_gpu_extra_pins_that_range() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (req,) = [
        r for r in map(Requirement, extras["optional-dependencies"]["gpu"]) if r.name == "vllm"
    ]
    for version in PROBES:
        if "+" in version:  # a local build tag: pip matches its base release
            continue
        assert req.specifier.contains(version) == _in_range(version), version


def test_a_run_with_vllm_outside_the_range_is_refused_naming_both() -> None:
    with pytest.raises(DataError, match="not installed"):
        check_vllm(None, "1.16.0")
    with pytest.raises(DataError, match=r"vLLM 0\.32\.0 is outside the range TRL 1\.16\.0"):
        check_vllm("0.32.0", "1.16.0")
    check_vllm("0.24.0+cu129", "1.16.0")
    check_vllm("0.31.0", "1.16.0")


def test_the_run_start_checks_it_before_any_model_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from memsifter.training import config as train_config
    from memsifter.training import gpu_env

    cfg = train_config.load_train_config(ROOT / "configs/train/smollm2_cpu.yaml")
    cfg = dataclasses.replace(cfg, grpo=dataclasses.replace(cfg.grpo, use_vllm=True))
    versions = {"vllm": "0.34.0", "trl": "1.16.0"}
    monkeypatch.setattr(gpu_env, "installed", versions.get)
    with pytest.raises(DataError, match="vLLM 0.34.0 is outside"):
        train_config.check_hardware(cfg, cuda=True)
    versions["vllm"] = "0.31.0"
    train_config.check_hardware(cfg, cuda=True)


@pytest.mark.slow
def test_train_and_gpu_resolve_together_for_linux_x86_64(tmp_path: Path) -> None:
    uv = Path(sys.executable).parent / "uv"
    assert uv.is_file(), "uv comes with the dev extra"
    lock = tmp_path / "gpu.txt"
    done = subprocess.run(
        [str(uv), "pip", "compile", str(ROOT / "pyproject.toml"), "--extra", "train"]
        + ["--extra", "gpu", "--python-version", "3.11", "--python-platform"]
        + ["x86_64-manylinux_2_28", "--no-header", "-q", "-o", str(lock)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    pins = dict(line.split("==", 1) for line in lock.read_text().splitlines() if "==" in line)
    assert _in_range(pins["vllm"]), pins["vllm"]
    train = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (trl,) = [
        r for r in map(Requirement, train["optional-dependencies"]["train"]) if r.name == "trl"
    ]
    assert trl.specifier.contains(pins["trl"]) and "torch" in pins and "deepspeed" in pins
