"""Typed YAML configs: defaults, overrides, and errors that name the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

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


def test_a_config_inherits_its_base_and_states_only_what_differs(tmp_path: Path) -> None:
    from memsifter.config import read_yaml

    (tmp_path / "recipes").mkdir()
    (tmp_path / "base.yaml").write_text("a: 1\nnested:\n  x: 1\n  y: [1, 2]\nname: base\n")
    (tmp_path / "recipes" / "mid.yaml").write_text("base: ../base.yaml\nnested:\n  x: 2\n")
    (tmp_path / "recipes" / "leaf.yaml").write_text("base: mid.yaml\nnested:\n  y: [3]\na: 5\n")
    assert read_yaml(tmp_path / "recipes" / "leaf.yaml") == {
        "a": 5,
        "nested": {"x": 2, "y": [3]},  # mappings merge key by key; lists are replaced
        "name": "base",
    }


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"c.yaml": "base: nope.yaml\na: 1\n"}, "base config 'nope.yaml' not found"),
        ({"c.yaml": "base: d.yaml\n", "d.yaml": "base: c.yaml\n"}, "circular base"),
        ({"c.yaml": "base: c.yaml\n"}, "circular base"),
        ({"c.yaml": "base: b.yaml\nb: 2\n", "b.yaml": "a: 1\n"}, "b is not in the base config"),
        (
            {"c.yaml": "base: b.yaml\nm:\n  z: 1\n", "b.yaml": "m:\n  x: 1\n"},
            "m.z is not in the base config",
        ),
        ({"c.yaml": "base: b.yaml\n", "b.yaml": "- 1\n"}, "is not a mapping"),
        ({"c.yaml": "base: 3\n"}, "base must be a config file's path"),
    ],
)
def test_a_bad_base_is_refused_naming_the_file_and_key(
    tmp_path: Path, files: dict[str, str], message: str
) -> None:
    from memsifter.config import read_yaml

    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(DataError, match=message) as e:
        read_yaml(tmp_path / "c.yaml")
    assert "c.yaml" in str(e.value)


def test_the_shipped_ablations_inherit_and_load() -> None:
    from memsifter.config import read_yaml
    from memsifter.rewards.config import load_reward_config
    from memsifter.training.config import load_train_config
    from memsifter.training.rldata.recipe import load_rl_data_config

    root = Path(__file__).resolve().parents[1]
    children = [
        p for p in sorted((root / "configs").rglob("*.yaml")) if "\nbase:" in "\n" + p.read_text()
    ]
    assert len(children) >= 7
    for child in children:
        raw = yaml.safe_load(child.read_text())
        base = read_yaml(child.parent / raw.pop("base"))
        merged = read_yaml(child)
        # Every key it states differs from its base's (nothing restated), the rest is the base's.
        assert set(merged) == set(base), child
        for key, value in raw.items():
            assert value != base[key], f"{child.name} restates {key}"
        loaders = {"rewards": load_reward_config, "train": load_train_config,
                   "data": load_rl_data_config}  # fmt: skip
        loaders[child.parent.name](child)
