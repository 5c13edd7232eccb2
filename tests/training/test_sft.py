"""Cold-start SFT and LoRA settings: targets with and without ``<think>``, the rows SFT trains on
(plain-text prompts, gold targets only where the prompt shows gold, a seeded shuffle before
``max_examples``), ``lora_config``'s ``top_layers``, and ``run_sft`` with LoRA on a tiny Qwen3
(the adapter is kept, ``final`` is the merged model, the frozen lower layers are unchanged)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

from memsifter.ranker.parse import parse_ranking  # noqa: E402
from memsifter.training.config import (  # noqa: E402
    LoraSettings,
    ModelSettings,
    SFTSettings,
    TrainConfig,
)
from memsifter.training.grpo import lora_config  # noqa: E402
from memsifter.training.sft import run_sft, sft_rows, sft_target  # noqa: E402

MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _row(i: int, gold: list[int], n: int = 4) -> dict[str, Any]:
    order = [(i + j) % n for j in range(n)]  # some coarse order of n candidates
    return {"prompt": f"prompt {i}", "coarse_order": order, "gold_positions": gold}


# --- targets -------------------------------------------------------------------------------------


@pytest.mark.parametrize("think", [True, False])
def test_targets_with_and_without_think(think: bool) -> None:
    coarse = [3, 0, 2, 1]
    for target, expected in (("coarse", [3, 0, 2, 1]), ("gold", [2, 1, 3, 0])):
        text = sft_target(coarse, [1, 2], target, think=think)
        parsed = parse_ranking(text, 4)
        assert parsed.ok and list(parsed.ids) == expected  # gold in coarse order, then the rest
        if think:
            assert text.startswith("<think>") and "</think><ranking>" in text
        else:
            assert text == f"<ranking>{', '.join(map(str, expected))}</ranking>"
    # Gold positions absent from the shown candidates are ignored; no candidates is an error.
    assert sft_target([1, 0], [5], "gold", think=False) == "<ranking>1, 0</ranking>"
    with pytest.raises(ValueError, match="at least one candidate"):
        sft_target([], [], "coarse")


# --- rows ---------------------------------------------------------------------------------------


def test_gold_rows_skip_prompts_without_gold() -> None:
    rows = [_row(i, [i % 4] if i % 3 else []) for i in range(12)]
    out = sft_rows(rows, SFTSettings(target="gold"), think=False, seed=0)
    with_gold = {r["prompt"] for r in rows if r["gold_positions"]}
    assert {r["prompt"] for r in out} == with_gold and len(out) == len(with_gold) == 8
    by_prompt = {r["prompt"]: r for r in rows}
    for r in out:
        src = by_prompt[r["prompt"]]
        assert isinstance(r["prompt"], str) and isinstance(r["completion"], str)
        assert r["completion"] == sft_target(
            src["coarse_order"], src["gold_positions"], "gold", think=False
        )
        assert parse_ranking(r["completion"], 4).ids[0] == src["gold_positions"][0]
    # Coarse targets are a format lesson: every row, gold or not.
    coarse = sft_rows(rows, SFTSettings(target="coarse"), seed=0)
    assert len(coarse) == 12 and all(r["completion"].startswith("<think>") for r in coarse)


def test_rows_are_shuffled_by_seed_then_cut() -> None:
    rows = [_row(i, [0]) for i in range(40)]
    settings = SFTSettings(target="gold")
    a = [r["prompt"] for r in sft_rows(rows, settings, seed=0)]
    assert a == [r["prompt"] for r in sft_rows(rows, settings, seed=0)]  # reproducible
    assert sorted(a) == sorted(r["prompt"] for r in rows)  # a permutation
    assert a != [r["prompt"] for r in rows]  # not file order
    assert a != [r["prompt"] for r in sft_rows(rows, settings, seed=1)]
    # max_examples takes a seeded sample: the shuffle's head, not the file's first rows.
    cut = [r["prompt"] for r in sft_rows(rows, SFTSettings(target="gold", max_examples=6), seed=0)]
    assert cut == a[:6] and cut != [r["prompt"] for r in rows[:6]]
    # The skip happens before the cut: max_examples gold rows, when there are that many.
    mixed = [_row(i, [0] if i % 2 else []) for i in range(40)]
    sample = sft_rows(mixed, SFTSettings(target="gold", max_examples=15), seed=0)
    assert len(sample) == 15 and all(
        r["prompt"] in {f"prompt {i}" for i in range(1, 40, 2)} for r in sample
    )


def test_rankings_targets_teach_the_files_order_and_refuse_what_it_lacks(tmp_path: Path) -> None:
    """``target: rankings``: another ranker's positions first (here a partial ranking), then the
    rest in the coarse order; a train prompt the file does not rank is refused, not skipped."""
    from memsifter.errors import DataError
    from memsifter.training.rldata.curriculum import write_rankings

    rows = [{**_row(i, [i % 4]), "qid": f"q{i}", "n_candidates": 4} for i in range(6)]
    given = {f"q{i}": [(i + 2) % 4, (i + 3) % 4] for i in range(6)}
    path = write_rankings(tmp_path / "rankings.jsonl", given.items())
    settings = SFTSettings(target="rankings", rankings=str(path))
    out = sft_rows(rows, settings, think=False, seed=0)
    by_prompt = {r["prompt"]: r for r in rows}
    assert len(out) == 6
    for r in out:
        src = by_prompt[r["prompt"]]
        ids = list(parse_ranking(r["completion"], 4).ids)
        first = given[src["qid"]]
        assert ids[:2] == first  # the file's order, not the coarse filter's
        assert ids[2:] == [p for p in src["coarse_order"] if p not in first]
        assert ids[:2] != src["coarse_order"][:2]
    # Every train prompt must be ranked: one missing is named.
    write_rankings(path, list(given.items())[:5])
    with pytest.raises(DataError, match="1 of 6 train prompts have no ranking.*q5"):
        sft_rows(rows, settings, think=False)
    # The file's positions must fit the prompt (the curriculum reader's checks).
    write_rankings(path, [*list(given.items())[:5], ("q5", [7])])
    with pytest.raises(DataError, match="outside the prompt"):
        sft_rows(rows, settings, think=False)
    # The target and its file go together.
    for bad in ({"target": "rankings"}, {"target": "coarse", "rankings": str(path)}):
        with pytest.raises(ValueError, match="sft.rankings names the rankings file"):
            SFTSettings(**bad)


def test_rows_need_the_rendered_prompt_text() -> None:
    row = {**_row(0, [0]), "prompt": [{"role": "user", "content": "hi"}]}
    with pytest.raises(ValueError, match="rendered prompt text"):
        sft_rows([row], SFTSettings())


# --- LoRA ---------------------------------------------------------------------------------------


def _cfg(lora: LoraSettings | None) -> TrainConfig:
    return TrainConfig(model=ModelSettings(lora=lora))


def test_lora_config_top_layers() -> None:
    assert lora_config(_cfg(None), 30) is None
    every = lora_config(_cfg(LoraSettings(r=8, alpha=16, dropout=0.0)), 30)
    assert every.layers_to_transform is None and every.target_modules == "all-linear"
    assert (every.r, every.lora_alpha, every.lora_dropout) == (8, 16, 0.0)
    top = lora_config(_cfg(LoraSettings(target_modules=MODULES, top_layers=10)), 30)
    assert top.layers_to_transform == list(range(20, 30))
    assert set(top.target_modules) == set(MODULES)
    assert lora_config(_cfg(LoraSettings(target_modules=MODULES, top_layers=30)), 30)
    with pytest.raises(ValueError, match="top_layers is 31 but the model has 30 layers"):
        lora_config(_cfg(LoraSettings(target_modules=MODULES, top_layers=31)), 30)
    with pytest.raises(ValueError, match="needs target_modules as a list"):
        lora_config(_cfg(LoraSettings(top_layers=2)), 30)  # all-linear
    with pytest.raises(ValueError, match="top_layers must be >= 1"):
        LoraSettings(top_layers=0)


def test_lora_top_layers_adapt_only_the_top(tiny_qwen3: Path) -> None:
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3)
    n = model.config.num_hidden_layers
    peft = get_peft_model(
        model, lora_config(_cfg(LoraSettings(target_modules=MODULES, top_layers=1)), n)
    )
    adapted = {
        name.split(".layers.")[1].split(".")[0]
        for name, _ in peft.named_parameters()
        if "lora_" in name
    }
    assert adapted == {str(n - 1)}
    trainable = [name for name, p in peft.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)


@pytest.fixture(scope="module")
def sft_rows_text(tiny_qwen3: Path) -> list[dict[str, Any]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    rows = []
    for i in range(6):
        messages = [{"role": "user", "content": f"Rank sessions 0-3 for question {i}."}]
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        rows.append(
            {"prompt": text, "coarse_order": [0, 1, 2, 3], "gold_positions": [i % 4] if i else []}
        )
    return rows


def test_run_sft_with_lora_keeps_the_adapter_and_merges(
    tiny_qwen3: Path, sft_rows_text: list[dict[str, Any]], tmp_path: Path
) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    n = AutoModelForCausalLM.from_pretrained(tiny_qwen3).config.num_hidden_layers
    peft_config = lora_config(
        _cfg(LoraSettings(r=4, alpha=8, dropout=0.0, target_modules=MODULES, top_layers=1)), n
    )
    torch.manual_seed(0)
    final = run_sft(
        str(tiny_qwen3),
        sft_rows_text,
        SFTSettings(target="gold", learning_rate=5e-2, per_device_train_batch_size=2),
        tmp_path / "sft",
        use_cpu=True,
        bf16=False,
        tracking={"report_to": []},
        think=False,
        peft_config=peft_config,
    )
    assert final == tmp_path / "sft" / "final"
    adapter = tmp_path / "sft" / "adapter"
    assert (adapter / "adapter_config.json").is_file()
    assert not (final / "adapter_config.json").exists()  # an ordinary model folder
    assert (final / "config.json").is_file() and (final / "tokenizer_config.json").is_file()
    assert (tmp_path / "sft" / "trainer_state.json").is_file()
    base = load_file(tiny_qwen3 / "model.safetensors")
    merged = load_file(final / "model.safetensors")
    assert set(merged) == set(base)  # no lora_ tensors left
    top = f"model.layers.{n - 1}."
    changed = {k for k in base if not torch.equal(base[k], merged[k])}
    assert changed and all(k.startswith(top) for k in changed)  # only the adapted top layer
    assert AutoModelForCausalLM.from_pretrained(final).config.num_hidden_layers == n


def test_run_sft_refuses_no_rows(tiny_qwen3: Path, tmp_path: Path) -> None:
    rows = [{"prompt": "p", "coarse_order": [0, 1], "gold_positions": []}]
    with pytest.raises(ValueError, match="no training rows"):
        run_sft(
            str(tiny_qwen3),
            rows,
            SFTSettings(target="gold"),
            tmp_path,
            use_cpu=True,
            bf16=False,
            tracking={"report_to": []},
        )
