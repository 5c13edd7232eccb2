"""PromptSpec, the prompt contract: its validation, ``prompt_spec.json`` written and read back
unchanged, a folder without one refused by name, and ``builder()`` configured from every field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memsifter.errors import DataError
from memsifter.ranker.checkpoint import SPEC_FILE, has_spec, read_spec, save_spec
from memsifter.ranker.spec import CANDIDATE_ORDERS, PromptSpec

CUSTOM = dict(
    model="some/model",
    window_tokens=2048,
    completion_tokens=48,
    language="zh",
    ask_think=False,
    unit="page",
    turns_per_page=3,
    coarse="bm25",
    order="coarse",
    chat_template_kwargs={"persona": "archivist", "nested": {"a": [1, 2]}},
)


def test_defaults_and_budget() -> None:
    spec = PromptSpec()
    assert spec.order == "chronological" and spec.unit == "session" and spec.ask_think
    assert spec.budget_tokens == spec.window_tokens - spec.completion_tokens
    assert PromptSpec(window_tokens=1024, completion_tokens=48).budget_tokens == 976
    assert CANDIDATE_ORDERS == ("chronological", "newest_first", "coarse")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"window_tokens": 100, "completion_tokens": 100}, "must exceed"),
        ({"completion_tokens": -1}, "must exceed"),
        ({"language": "fr"}, "language must be one of"),
        ({"unit": "turn"}, "unit must be one of"),
        ({"turns_per_page": 0}, "turns_per_page must be >= 1"),
        ({"order": "random"}, "order must be one of"),
        ({"chat_template_kwargs": {"enable_thinking": True}}, "derived from ask_think"),
    ],
)
def test_refused_settings(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PromptSpec(**kwargs)


def test_write_and_read_round_trip(tmp_path: Path) -> None:
    spec = PromptSpec(**CUSTOM)  # type: ignore[arg-type]
    folder = tmp_path / "deep" / "ckpt"
    assert not has_spec(folder)
    path = save_spec(spec, folder)  # makes the folder
    assert path == folder / SPEC_FILE and has_spec(folder)
    assert read_spec(folder) == spec
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data == spec.to_dict() and list(data) == sorted(data)
    assert data["chat_template_kwargs"] == {"persona": "archivist", "nested": {"a": [1, 2]}}
    # Writing again is byte-identical (stable key order): checkpoints diff cleanly.
    before = path.read_bytes()
    save_spec(read_spec(folder), folder)
    assert path.read_bytes() == before
    assert PromptSpec.from_dict(spec.to_dict()) == spec
    # A spec's dict is a copy: changing it does not change the spec.
    d = spec.to_dict()
    d["chat_template_kwargs"]["persona"] = "x"
    assert spec.chat_template_kwargs["persona"] == "archivist"


def test_partial_file_takes_defaults(tmp_path: Path) -> None:
    (tmp_path / SPEC_FILE).write_text('{"window_tokens": 1024, "completion_tokens": 48}')
    assert read_spec(tmp_path) == PromptSpec(window_tokens=1024, completion_tokens=48)


def test_missing_spec_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=f"has no {SPEC_FILE}") as e:
        read_spec(tmp_path / "model")
    assert str(tmp_path / "model") in str(e.value)
    assert "pass an explicit prompt spec" in str(e.value)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must hold an object"),
        ('{"window_tokns": 10}', r"unknown prompt spec keys \['window_tokns'\]"),
        ('{"order": "best"}', "invalid prompt spec: order must be one of"),
        ('{"turns_per_page": 2, "bogus": 1, "alpha": 0}', r"\['alpha', 'bogus'\]"),
    ],
)
def test_bad_spec_files_name_the_file(tmp_path: Path, text: str, match: str) -> None:
    (tmp_path / SPEC_FILE).write_text(text)
    with pytest.raises(DataError, match=match) as e:
        read_spec(tmp_path)
    assert str(tmp_path / SPEC_FILE) in str(e.value)


def test_with_model_keeps_the_prompt() -> None:
    spec = PromptSpec(**CUSTOM)  # type: ignore[arg-type]
    other = spec.with_model("outputs/epoch-0/averaged")
    assert other.model == "outputs/epoch-0/averaged" and spec.model == "some/model"
    assert {**other.to_dict(), "model": spec.model} == spec.to_dict()


def test_builder_is_configured_by_every_field(tiny_qwen3: Path) -> None:
    from transformers import AutoTokenizer

    from memsifter.coarse import build_filter

    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    spec = PromptSpec(
        model=str(tiny_qwen3),
        window_tokens=3000,
        completion_tokens=64,
        language="zh",
        ask_think=False,
        order="coarse",
        chat_template_kwargs={"persona": "x"},
    )
    builder = spec.builder(tok)
    assert (builder.window_tokens, builder.completion_tokens) == (3000, 64)
    assert builder.budget_tokens == spec.budget_tokens
    assert (builder.language, builder.ask_think, builder.order) == ("zh", False, "coarse")
    assert builder.chat_template_kwargs == {"persona": "x"}
    assert builder.coarse is not None and builder.coarse.name == "bm25"  # spec.coarse by default
    given = build_filter("bm25")
    assert spec.builder(tok, given).coarse is given
    # Chronological specs build a chronological builder.
    assert PromptSpec(window_tokens=3000, completion_tokens=64).builder(tok).order == (
        "chronological"
    )


def test_a_checkpoint_as_a_base_is_shown_the_new_rankers_prompt(
    tiny_qwen3: Path, tmp_path: Path
) -> None:
    """``as_base``: a first-token head's checkpoint refuses a written ranking's prompt; its
    weights as a base take it, and ``base_of.json`` keeps where they came from and the spec
    they were trained with. An adapter or a folder that is no model is refused by name."""
    import shutil

    from memsifter.ranker.checkpoint import BASE_OF_FILE, PromptSpecError, as_base, resolve_spec

    head = tmp_path / "head"
    shutil.copytree(tiny_qwen3, head)
    trained = PromptSpec(model=str(tiny_qwen3), ranking_head="first_token", ask_think=False)
    save_spec(trained, head)
    pen = {"ranking_head": "generate", "ask_think": False}
    with pytest.raises(PromptSpecError, match="ranking_head: 'generate'"):
        resolve_spec(head, pen)
    base = as_base(head, tmp_path / "base")
    assert not has_spec(base) and resolve_spec(base, pen).ranking_head == "generate"
    record = json.loads((base / BASE_OF_FILE).read_text())
    assert record == {"checkpoint": str(head.resolve()), "spec": trained.to_dict()}
    assert sorted(p.name for p in base.iterdir()) == sorted(
        [BASE_OF_FILE, *(p.name for p in head.iterdir() if p.name != SPEC_FILE)]
    )
    (head / "adapter_config.json").write_text("{}")
    with pytest.raises(DataError, match="an adapter"):
        as_base(head, tmp_path / "again")
    with pytest.raises(DataError, match="no config.json"):
        as_base(tmp_path / "base" / "nothing", tmp_path / "again")
