"""The tiny random Qwen3 stand-in: deterministic, loadable through the Auto classes, ChatML with
the thinking switch, and the ranking tags surviving a decode that skips special tokens."""

from __future__ import annotations

from pathlib import Path

import torch

from memsifter.testing import build_tiny_qwen3

torch.set_num_threads(2)

MESSAGES = [
    {"role": "system", "content": "You rank sessions."},
    {"role": "user", "content": "Where did I travel last month? 我上个月去北京旅游。"},
]


def test_builds_are_byte_identical(tiny_qwen3: Path, tmp_path: Path) -> None:
    again = build_tiny_qwen3(tmp_path / "again")
    names = sorted(p.name for p in tiny_qwen3.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json"} <= set(
        names
    )
    for name in names:
        assert (tiny_qwen3 / name).read_bytes() == (again / name).read_bytes(), name


def test_seed_changes_weights(tiny_qwen3: Path, tmp_path: Path) -> None:
    other = build_tiny_qwen3(tmp_path / "seed1", seed=1)
    assert (other / "tokenizer.json").read_bytes() == (tiny_qwen3 / "tokenizer.json").read_bytes()
    assert (other / "model.safetensors").read_bytes() != (
        tiny_qwen3 / "model.safetensors"
    ).read_bytes()


def test_tokenizer_keeps_tags_and_drops_chat_tokens(tiny_qwen3: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    answer = "<think>用户问 the trip</think><ranking>27, 15, 3</ranking>"
    ids = tok(f"<|im_start|>assistant\n{answer}<|im_end|><|endoftext|>", add_special_tokens=False)
    assert tok.decode(ids["input_ids"], skip_special_tokens=True) == f"assistant\n{answer}"
    for tag in ("<think>", "</think>", "<ranking>", "</ranking>", "<|im_start|>", "<|im_end|>"):
        assert len(tok(tag, add_special_tokens=False)["input_ids"]) == 1, tag
    # English and Chinese split into learned pieces, not one token per byte.
    text = "I adopted a golden retriever. 我的猫叫小白。"
    assert len(tok(text, add_special_tokens=False)["input_ids"]) < len(text.encode()) // 2


def test_chat_template_thinking_switch(tiny_qwen3: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    assert "enable_thinking" in tok.chat_template
    thinking = tok.apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=False, enable_thinking=True
    )
    assert thinking.startswith("<|im_start|>system\nYou rank sessions.<|im_end|>\n")
    assert thinking.endswith("<|im_end|>\n<|im_start|>assistant\n")
    plain = tok.apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=False, enable_thinking=False
    )
    assert plain == thinking + "<think>\n\n</think>\n\n"
    default = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert default == thinking


def test_generate_runs_and_stops_on_eos(tiny_qwen3: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3).eval()
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.config.vocab_size == len(tok)
    assert model.generation_config.eos_token_id[0] == tok.eos_token_id
    text = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    enc = tok(text, return_tensors="pt", add_special_tokens=False)
    out = model.generate(**enc, max_new_tokens=6)
    again = model.generate(**enc, max_new_tokens=6)
    assert 0 < out.shape[1] - enc["input_ids"].shape[1] <= 6
    assert torch.equal(out, again)  # greedy by default


def test_build_leaves_global_rng_alone(tmp_path: Path) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_qwen3(tmp_path / "m")
    assert torch.equal(torch.rand(3), expected)
