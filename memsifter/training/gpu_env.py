"""The GPU environment the recipe needs: the vLLM releases TRL supports, checked before a run
that generates with vLLM starts, and the one range ``pyproject.toml``'s ``gpu`` extra pins.

TRL only warns when it meets a vLLM outside its range (``trl.import_utils.is_vllm_available``)
and then fails somewhere inside generation or weight sync; a run that asks for vLLM
(``grpo.use_vllm``) is refused at start instead, naming both versions. The range is TRL 1.16's
(tests/training/test_gpu_env.py checks it against TRL's own check, and the extra's pin against it;
the same test resolves ``train`` + ``gpu`` for Linux x86-64 without installing a CUDA wheel).
"""

from __future__ import annotations

from importlib import metadata

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from memsifter.errors import DataError

# TRL 1.16 accepts 0.22.0 <= base version <= 0.31.0 (a local tag such as +cu129 dropped).
TRL_VLLM_RANGE = SpecifierSet(">=0.22.0,<=0.31.0")
INSTALL_HINT = "pip install -e '.[train,gpu]' (docs/training.md, \"The GPU environment\")"


def installed(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def check_vllm(vllm: str | None, trl: str | None) -> None:
    """Refuse a vLLM TRL does not support (or none at all), naming both versions."""
    if vllm is None:
        raise DataError(f"grpo.use_vllm needs vLLM, which is not installed: {INSTALL_HINT}",
                        field="grpo.use_vllm")  # fmt: skip
    base = Version(Version(vllm).base_version)
    if base not in TRL_VLLM_RANGE:
        raise DataError(
            f"vLLM {vllm} is outside the range TRL {trl or '(not installed)'} supports "
            f"({TRL_VLLM_RANGE}); {INSTALL_HINT}",
            field="grpo.use_vllm",
        )


__all__ = ["INSTALL_HINT", "TRL_VLLM_RANGE", "check_vllm", "installed"]
