"""Import FlagEmbedding under transformers 5.

FlagEmbedding 1.4.2's package ``__init__`` eagerly imports its decoder-only rerankers, and those
import ``transformers.modeling_attn_mask_utils``, a module transformers 5 removed. That makes
``import FlagEmbedding`` fail even though the BGE-M3 encoder we use never touches those helpers.

``import_flagembedding`` registers a stand-in for the missing module (only when it is really
missing) whose names raise a clear ``NotImplementedError`` if anything ever calls them, so the
encoder imports and the unsupported rerankers fail loudly instead of silently misbehaving.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType
from typing import Any, NoReturn

MASK_UTILS = "transformers.modeling_attn_mask_utils"
SHIM_ATTR = "__memsifter_shim__"
_FUNCTION_NAMES = (
    "_prepare_4d_attention_mask",
    "_prepare_4d_causal_attention_mask",
    "_prepare_4d_causal_attention_mask_for_sdpa",
)


def _unsupported(name: str) -> NoReturn:
    raise NotImplementedError(
        f"{MASK_UTILS}.{name} is a MemSifter shim (memsifter._compat.flagembedding): "
        "transformers 5 removed that module, and FlagEmbedding's decoder-only rerankers are "
        "unsupported under transformers 5. MemSifter only uses FlagEmbedding's BGE-M3 encoder "
        "(BGEM3FlagModel)."
    )


def _make_function(name: str) -> Any:
    def stub(*args: Any, **kwargs: Any) -> NoReturn:
        _unsupported(name)

    # FlagEmbedding passes one of these through torch.fx.wrap at import time, which registers
    # the function under its __name__; keep the real name so that registration stays coherent.
    stub.__name__ = stub.__qualname__ = name
    stub.__module__ = MASK_UTILS
    return stub


class _UnsupportedMeta(type):
    # FlagEmbedding calls AttentionMaskConverter's static methods on the class itself, so class
    # attribute access must raise the named error too, not a bare AttributeError.
    def __getattr__(cls, attr: str) -> Any:
        if attr.startswith("__"):  # leave introspection (copy, pickle, inspect) its usual answer
            raise AttributeError(attr)
        _unsupported(f"AttentionMaskConverter.{attr}")


class AttentionMaskConverter(metaclass=_UnsupportedMeta):
    """Stand-in for the removed transformers class; any use raises ``NotImplementedError``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _unsupported("AttentionMaskConverter")


AttentionMaskConverter.__module__ = MASK_UTILS


def _mask_utils_present() -> bool:
    """True if the module is importable or already registered (ours or the real one)."""
    if MASK_UTILS in sys.modules:
        return True
    try:
        return importlib.util.find_spec(MASK_UTILS) is not None
    except ModuleNotFoundError:  # the parent package itself is missing
        return False


def _build_stub() -> ModuleType:
    module = ModuleType(MASK_UTILS, "MemSifter stand-in for a module transformers 5 removed.")
    module.AttentionMaskConverter = AttentionMaskConverter  # type: ignore[attr-defined]
    for name in _FUNCTION_NAMES:
        setattr(module, name, _make_function(name))
    setattr(module, SHIM_ATTR, True)
    return module


def install_mask_utils_shim() -> bool:
    """Register the stand-in module if the real one is missing; return whether a shim is active."""
    if _mask_utils_present():
        return bool(getattr(sys.modules.get(MASK_UTILS), SHIM_ATTR, False))
    sys.modules[MASK_UTILS] = _build_stub()
    return True


def import_flagembedding() -> ModuleType:
    """Import and return the ``FlagEmbedding`` package, shimming transformers 5 first if needed."""
    install_mask_utils_shim()
    return importlib.import_module("FlagEmbedding")
