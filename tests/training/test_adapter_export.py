"""Shipping a trained model as a LoRA adapter: the SVD export reproduces the tuned model."""

from __future__ import annotations

import pytest
import torch

from memsifter.testing.tiny_models import build_tiny_qwen3
from memsifter.training.adapter_export import AdapterExportError, export_adapter


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_qwen3(tmp_path_factory.mktemp("tiny") / "qwen3")


def _tuned(base_dir, out, *, layers=(1,), rank=2, touch_norm=False, seed=0):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        in_layer = any(f".layers.{i}." in name for i in layers)
        if in_layer and name.endswith("proj.weight"):
            out_dim, in_dim = p.shape
            b = torch.randn(out_dim, rank, generator=g) * 0.05
            a = torch.randn(rank, in_dim, generator=g) * 0.05
            p.data += b @ a
        if touch_norm and name.endswith("norm.weight"):
            p.data += 0.01
    model.save_pretrained(str(out))
    return out


def test_export_reproduces_tuned_model(tiny, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    tuned = _tuned(tiny, tmp_path / "tuned", layers=(1,), rank=3)
    report = export_adapter(str(tiny), tuned, tmp_path / "adapter", rank=4, probe="hello world")
    assert report.layers == [1]
    assert report.max_rel_error < 1e-5
    assert report.max_logit_diff is not None and report.max_logit_diff < 1e-3
    base = AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, str(tmp_path / "adapter")).merge_and_unload()
    want = AutoModelForCausalLM.from_pretrained(str(tuned), dtype=torch.float32).state_dict()
    for name, t in merged.state_dict().items():
        assert torch.allclose(t, want[name], atol=1e-5), name


def test_export_refuses_a_rank_too_small(tiny, tmp_path):
    tuned = _tuned(tiny, tmp_path / "tuned", rank=6)
    with pytest.raises(AdapterExportError, match="raise --rank"):
        export_adapter(str(tiny), tuned, tmp_path / "adapter", rank=2)
    assert not (tmp_path / "adapter").exists()


def test_export_refuses_changes_an_adapter_cannot_carry(tiny, tmp_path):
    tuned = _tuned(tiny, tmp_path / "tuned", touch_norm=True)
    with pytest.raises(AdapterExportError, match="norm"):
        export_adapter(str(tiny), tuned, tmp_path / "adapter", rank=4)


def test_export_refuses_an_unchanged_model(tiny, tmp_path):
    with pytest.raises(AdapterExportError, match="nothing to export"):
        export_adapter(str(tiny), tiny, tmp_path / "adapter", rank=4)
