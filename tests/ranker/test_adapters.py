"""PEFT LoRA adapter folders load wherever a model name is accepted: onto their base (a folder,
or a built-in name resolved offline), merged; vLLM-style servers get a merged plain folder; the
built-in trained proxy resolves to the adapter shipped in the package, or says it is missing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import memsifter.models as models
from memsifter.errors import MemSifterError
from memsifter.models import (
    SHIPPED_PROXIES,
    load_causal_lm,
    load_tokenizer,
    plain_model_folder,
    resolve_model,
)
from memsifter.ranker.checkpoint import model_spec, read_spec, save_spec
from memsifter.ranker.spec import PromptSpec

pytest.importorskip("peft")

SPEC = PromptSpec(model="tiny", window_tokens=1200, completion_tokens=40, order="coarse")


def make_adapter(base: Path | str, out: Path, base_name: str | None = None) -> Path:
    """A tiny LoRA adapter on ``base`` with non-zero weights (so merging changes the model);
    ``base_name`` overrides the base recorded in adapter_config.json."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    config = LoraConfig(
        r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        peft_model = get_peft_model(model, config)
    peft_model.save_pretrained(str(out))
    if base_name is not None:
        path = out / "adapter_config.json"
        cfg = json.loads(path.read_text())
        cfg["base_model_name_or_path"] = base_name
        path.write_text(json.dumps(cfg))
    return out


def _logits(model, tok) -> object:
    import torch

    ids = tok("I adopted a golden retriever named Max", return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        return model(ids).logits


@pytest.fixture(scope="module")
def adapter(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_adapter(tiny_qwen3, tmp_path_factory.mktemp("lora") / "adapter")


def test_adapter_loads_merged_onto_its_base_folder(adapter: Path, tiny_qwen3: Path) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    assert resolve_model(str(adapter)).adapter and not resolve_model(str(tiny_qwen3)).adapter
    merged = load_causal_lm(str(adapter))
    assert not isinstance(merged, PeftModel)
    assert not any("lora" in name for name, _ in merged.named_parameters())
    tok = load_tokenizer(str(adapter))  # no tokenizer files in the adapter: the base's
    assert tok.name_or_path == str(tiny_qwen3)
    base = AutoModelForCausalLM.from_pretrained(str(tiny_qwen3), dtype=torch.float32)
    reference = PeftModel.from_pretrained(base, str(adapter)).eval()
    got, want = _logits(merged.eval(), tok), _logits(reference, tok)
    assert torch.allclose(got, want, atol=1e-5)
    plain = AutoModelForCausalLM.from_pretrained(str(tiny_qwen3), dtype=torch.float32).eval()
    assert not torch.allclose(got, _logits(plain, tok), atol=1e-3)  # the adapter did something


def test_adapter_with_a_builtin_base_name_and_its_own_tokenizer(
    tiny_qwen3: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``base_model_name_or_path`` is a built-in name (as training writes for SmolLM2): it is
    resolved offline through resolve_model; a tokenizer saved with the adapter is used."""
    monkeypatch.setitem(models.BUILTIN_MODELS, "tiny-builtin", lambda: str(tiny_qwen3))
    out = make_adapter(tiny_qwen3, tmp_path / "adapter", base_name="tiny-builtin")
    load_tokenizer(str(tiny_qwen3)).save_pretrained(str(out))
    assert models.adapter_base(out).path == str(tiny_qwen3)
    assert models.tokenizer_folder(str(out)) == str(out)
    assert load_causal_lm(str(out)) is not None


def test_adapter_errors_are_clear(tiny_qwen3: Path, tmp_path: Path) -> None:
    out = make_adapter(tiny_qwen3, tmp_path / "a", base_name="")
    with pytest.raises(MemSifterError, match="names no base model"):
        load_causal_lm(str(out))
    out = make_adapter(tiny_qwen3, tmp_path / "b", base_name=str(tmp_path / "gone"))
    with pytest.raises(MemSifterError, match="base model of adapter .* does not exist"):
        load_causal_lm(str(out))


def test_transformers_backend_serves_an_adapter(adapter: Path) -> None:
    from memsifter.llm import BackendSpec, SamplingParams, build_backend

    be = build_backend(BackendSpec(kind="transformers", model=str(adapter), threads=1))
    prompt = be.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    out = be.generate([prompt], SamplingParams(max_new_tokens=4))
    assert out[0][0].completion_tokens > 0


def test_plain_model_folder_merges_once_into_the_cache(
    adapter: Path, tiny_qwen3: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("MEMSIFTER_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "adapter"
    shutil.copytree(adapter, src)
    save_spec(SPEC, src)
    assert plain_model_folder(str(tiny_qwen3)) == str(tiny_qwen3)  # not an adapter: as is
    folder = Path(plain_model_folder(str(src)))
    assert folder.parent == tmp_path / "cache" / "models" / "merged"
    assert (folder / "config.json").is_file() and not (folder / "adapter_config.json").exists()
    assert read_spec(folder) == SPEC  # the spec travels with the merged copy
    tok = load_tokenizer(str(folder))
    merged = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    assert torch.allclose(_logits(merged, tok), _logits(load_causal_lm(str(src)).eval(), tok))
    stamp = (folder / "config.json").stat().st_mtime_ns
    assert plain_model_folder(str(src)) == str(folder)  # reused, not merged again
    assert (folder / "config.json").stat().st_mtime_ns == stamp


def test_builtin_proxy_resolves_to_the_shipped_adapter(
    adapter: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = SHIPPED_PROXIES[0]
    assert name == "memsifter-smollm2-135m-locomo"
    monkeypatch.setattr(models, "PROXIES_DIR", tmp_path / "proxies")
    with pytest.raises(MemSifterError, match="is not in this install"):
        resolve_model(name)
    with pytest.raises(MemSifterError, match="is not in this install"):
        model_spec(name)
    shipped = tmp_path / "proxies" / name
    shutil.copytree(adapter, shipped)
    save_spec(SPEC, shipped)
    resolved = resolve_model(name)
    assert resolved.builtin and resolved.adapter and resolved.path == str(shipped)
    assert model_spec(name) == SPEC
    assert model_spec("smollm2-135m-instruct") is None  # an untrained built-in: no spec


def test_package_data_ships_the_proxies() -> None:
    import tomllib

    root = Path(__file__).resolve().parents[2]
    data = tomllib.loads((root / "pyproject.toml").read_text())
    globs = data["tool"]["setuptools"]["package-data"]["memsifter"]
    assert "proxies/*/*" in globs
    assert models.PROXIES_DIR == root / "memsifter" / "proxies"
