"""A policy with absolute position embeddings is scored in the positions it was sampled in."""

from __future__ import annotations

import torch

from memsifter.training.grpo import positions_from_mask


def _gpt2(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=50, n_embd=32, n_layer=1, n_head=2, n_positions=64)
    return GPT2LMHeadModel(cfg).eval()


def test_left_padding_no_longer_shifts_an_absolute_position_model(tmp_path) -> None:
    model = _gpt2(tmp_path)
    ids = torch.tensor([[5, 6, 7, 8]])
    padded = torch.tensor([[0, 0, 5, 6, 7, 8]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1]])
    with torch.no_grad():
        alone = model(input_ids=ids).logits[0, -1]
        shifted = model(input_ids=padded, attention_mask=mask).logits[0, -1]
        assert not torch.allclose(alone, shifted, atol=1e-5)  # the defect, without the hook
        assert positions_from_mask(model)
        fixed = model(input_ids=padded, attention_mask=mask).logits[0, -1]
    torch.testing.assert_close(alone, fixed, atol=1e-5, rtol=1e-5)


def test_rope_models_are_left_alone(tiny_qwen3) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3)
    assert not positions_from_mask(model)
