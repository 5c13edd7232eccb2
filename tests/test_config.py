"""Typed YAML configs: defaults, overrides, and errors that name the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from memsifter.config import load_config
from memsifter.errors import DataError
from memsifter.evaluation.retrieval import RetrievalEvalConfig

ROOT = Path(__file__).resolve().parents[1]


def test_shipped_eval_config_loads() -> None:
    cfg = load_config(RetrievalEvalConfig, ROOT / "configs/eval/locomo_retrieval.yaml")
    assert cfg.dataset == "locomo"
    assert "bm25" in cfg.retrievers and cfg.haystack == "native"


def test_unknown_key_and_wrong_type_are_named(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("retreivers: [bm25]\n")
    with pytest.raises(DataError, match=r"retreivers.*c\.yaml|c\.yaml.*retreivers"):
        load_config(RetrievalEvalConfig, p)
    p.write_text("seed: fast\n")
    with pytest.raises(DataError, match="field=seed"):
        load_config(RetrievalEvalConfig, p)
    p.write_text("retrievers: bm25\n")
    with pytest.raises(DataError, match="field=retrievers"):
        load_config(RetrievalEvalConfig, p)
    p.write_text("seed: [1\n")
    with pytest.raises(DataError, match="invalid YAML"):
        load_config(RetrievalEvalConfig, p)


def test_optional_and_float_coercion(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("conversations: null\nmax_questions: 3\n")
    cfg = load_config(RetrievalEvalConfig, p)
    assert cfg.conversations is None and cfg.max_questions == 3


def test_prompt_spec_loads_with_named_errors(tmp_path: Path) -> None:
    """The PromptSpec is a frozen dataclass with a mapping field, loaded by the same loader."""
    from memsifter.ranker.spec import PromptSpec

    p = tmp_path / "spec.yaml"
    p.write_text("window_tokens: 1024\ncompletion_tokens: 48\nchat_template_kwargs: {a: 1}\n")
    spec = load_config(PromptSpec, p)
    assert spec.budget_tokens == 976 and spec.chat_template_kwargs == {"a": 1}
    p.write_text("chat_template_kwargs: [a]\n")
    with pytest.raises(DataError, match="field=chat_template_kwargs"):
        load_config(PromptSpec, p)
    p.write_text("window_tokens: big\n")
    with pytest.raises(DataError, match="field=window_tokens"):
        load_config(PromptSpec, p)
    p.write_text("order: newest\n")  # the dataclass's own check, named with the file
    with pytest.raises(DataError, match=r"order must be one of.*spec\.yaml|spec\.yaml.*order"):
        load_config(PromptSpec, p)
