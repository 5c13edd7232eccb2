"""The FlagEmbedding shim: it must make the package importable under transformers 5, fail loudly
if the unsupported rerankers ever run, and leave a real (or already-present) module alone."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import pytest

from memsifter._compat import flagembedding as shim
from memsifter._compat.flagembedding import (
    MASK_UTILS,
    SHIM_ATTR,
    import_flagembedding,
    install_mask_utils_shim,
)

STUB_NAMES = (
    "_prepare_4d_attention_mask",
    "_prepare_4d_causal_attention_mask",
    "_prepare_4d_causal_attention_mask_for_sdpa",
)


def _real_mask_utils_installed() -> bool:
    module = sys.modules.get(MASK_UTILS)
    if module is not None:
        return not getattr(module, SHIM_ATTR, False)
    return importlib.util.find_spec(MASK_UTILS) is not None


needs_transformers_5 = pytest.mark.skipif(
    _real_mask_utils_installed(), reason="this transformers still ships modeling_attn_mask_utils"
)


def _assert_named_error(call: object) -> None:
    with pytest.raises(NotImplementedError, match="MemSifter shim") as info:
        call()  # type: ignore[operator]
    assert "decoder-only rerankers are unsupported under transformers 5" in str(info.value)


@needs_transformers_5
def test_shim_stubs_raise_named_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    # delitem restores whatever was there (e.g. a shim another test installed) afterwards.
    monkeypatch.delitem(sys.modules, MASK_UTILS, raising=False)
    assert install_mask_utils_shim() is True
    module = sys.modules[MASK_UTILS]
    assert getattr(module, SHIM_ATTR) is True
    for name in STUB_NAMES:
        stub = getattr(module, name)
        assert stub.__name__ == name  # torch.fx.wrap registers FlagEmbedding's use by this name
        _assert_named_error(lambda stub=stub: stub(None, (1, 1), None, 0))
    converter = module.AttentionMaskConverter
    _assert_named_error(lambda: converter(is_causal=True))
    _assert_named_error(lambda: converter._make_causal_mask)
    assert not hasattr(converter, "__wrapped__")  # introspection still gets AttributeError

    # A second call keeps the module it installed instead of stacking another one.
    assert install_mask_utils_shim() is True
    assert sys.modules[MASK_UTILS] is module


def test_shim_leaves_a_real_module_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    real = ModuleType(MASK_UTILS)
    monkeypatch.setitem(sys.modules, MASK_UTILS, real)
    fake_flagembedding = ModuleType("FlagEmbedding")
    monkeypatch.setitem(sys.modules, "FlagEmbedding", fake_flagembedding)

    assert install_mask_utils_shim() is False
    assert import_flagembedding() is fake_flagembedding
    assert sys.modules[MASK_UTILS] is real
    assert vars(real).keys() == vars(ModuleType(MASK_UTILS)).keys()  # nothing was added to it


def test_shim_not_installed_when_spec_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    # The transformers-4 case: the module exists on disk but nobody has imported it yet.
    monkeypatch.delitem(sys.modules, MASK_UTILS, raising=False)
    monkeypatch.setattr(shim.importlib.util, "find_spec", lambda name: object())
    assert install_mask_utils_shim() is False
    assert MASK_UTILS not in sys.modules


@pytest.mark.slow
@needs_transformers_5
def test_flagembedding_imports_through_the_shim() -> None:
    flag_embedding = import_flagembedding()
    assert flag_embedding.__name__ == "FlagEmbedding"
    assert hasattr(flag_embedding, "BGEM3FlagModel")
    module = sys.modules[MASK_UTILS]
    assert getattr(module, SHIM_ATTR) is True
    # The rerankers really imported the stubs, so using one fails with our message.
    from FlagEmbedding.inference.reranker.decoder_only.models import modeling_minicpm_reranker

    _assert_named_error(
        lambda: modeling_minicpm_reranker._prepare_4d_causal_attention_mask(None, (1, 1), None, 0)
    )
