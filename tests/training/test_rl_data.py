"""RL data prep on the synthetic LoCoMo and LongMemEval fixtures with the tiny Qwen3 tokenizer:
the three-way split (train / validation / test) is by conversation and stated in the card and
split.json, parquet round-trips the rendered prompt text (the PromptSpec's builder's, byte for
byte) and the candidates in prompt order, prompts fit the budget, ``prompt_spec.json`` and the
whole train pool are written, ``order: coarse`` shows candidates best first, the recipes parse,
and the CLI writes everything or fails with a named error."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from memsifter.cli import app
from memsifter.data import load_locomo
from memsifter.data.splits import SPLITS
from memsifter.data.types import Query
from memsifter.errors import DataError, UnknownNameError
from memsifter.ranker.checkpoint import SPEC_FILE, read_spec
from memsifter.ranker.spec import PromptSpec
from memsifter.rewards.columns import REWARD_COLUMNS, sessions_from_column
from memsifter.training.rldata.build import (
    POOL_FILE,
    RLDataConfig,
    RLDataResult,
    SourceSettings,
    build_rl_dataset,
    load_rl_data_config,
    load_rl_dataset,
    parse_data_overrides,
    plan_sources,
    prepare_rl_data,
    split_conversations,
    with_data_paths,
)

ROOT = Path(__file__).resolve().parents[2]
WINDOW, COMPLETION = 1536, 64  # small enough that the coarse filter must cut most prompts


def _prompt(tiny_qwen3: Path, **kw: Any) -> dict[str, Any]:
    return {
        "model": str(tiny_qwen3),
        "window_tokens": WINDOW,
        "completion_tokens": COMPLETION,
        "coarse": "bm25",
        **kw,
    }


def _recipe(
    tiny_qwen3: Path, fixtures_dir: Path, prompt: dict[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    return {
        "prompt": _prompt(tiny_qwen3, **(prompt or {})),
        "seed": 0,
        "sources": [
            {
                "name": "locomo",
                "dataset": "locomo",
                "path": str(fixtures_dir / "locomo_mini.json"),
                "count": 4,
                "validation_conversations": ["conv-m3"],
                "test_conversations": [],  # the three-conversation fixture has none to spare
            },
            {
                "name": "lme",
                "dataset": "longmemeval",
                "path": str(fixtures_dir / "longmemeval_mini.json"),
                "count": 1,
                # With seed 0: 2 questions test, 1 validation, 3 train (one without gold).
                "validation_fraction": 0.1,
                "test_fraction": 0.4,
            },
        ],
        **extra,
    }


def _config(recipe: dict[str, Any]) -> RLDataConfig:
    return RLDataConfig(
        prompt=PromptSpec(**recipe["prompt"]),
        sources=[SourceSettings(**s) for s in recipe["sources"]],
        seed=recipe.get("seed", 0),
    )


def _write_recipe(path: Path, recipe: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.fixture(scope="module")
def built(
    tiny_qwen3: Path, fixtures_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[RLDataResult, Path]:
    out = tmp_path_factory.mktemp("rl")
    recipe = _write_recipe(out.parent / "recipe.yaml", _recipe(tiny_qwen3, fixtures_dir))
    result = prepare_rl_data(load_rl_data_config(recipe), out)
    return result, out


def test_files_and_counts(built: tuple[RLDataResult, Path]) -> None:
    result, out = built
    for name in (
        "train.parquet",
        "validation.parquet",
        "test.parquet",
        POOL_FILE,
        SPEC_FILE,
        "split.json",
        "README.md",
        "recipe.yaml",
        "curriculum.json",
        "curriculum_ndcg.png",
    ):
        assert (out / name).is_file(), name
    counts = {s.source: s.counts for s in result.sources}
    # LoCoMo mini: 2 questions without evidence in the train conversations, dropped and counted.
    assert counts["locomo"]["train"]["dropped_no_evidence"] == 2
    assert counts["locomo"]["train"]["rows"] == 14 and counts["locomo"]["train"]["selected"] == 4
    assert counts["locomo"]["test"] == {
        **counts["locomo"]["test"],
        "conversations": 0,
        "questions": 0,
        "rows": 0,
    }
    # LongMemEval mini: the abstention question has no gold, wherever the hash put it.
    assert sum(counts["lme"][s]["dropped_no_evidence"] for s in SPLITS) == 1
    assert counts["lme"]["train"]["rows"] >= 2  # the curriculum chooses 1 of several
    ds = load_rl_dataset(out)
    assert set(ds) == set(SPLITS)
    assert len(ds["train"]) == 4 + 1
    for split in ("validation", "test"):
        assert len(ds[split]) == sum(c[split]["rows"] for c in counts.values())
    assert len(ds["test"]) > 0  # the hash split put some LongMemEval questions in test
    assert all(g for s in SPLITS for g in ds[s]["gold_ids"])


def test_no_conversation_in_two_splits(built: tuple[RLDataResult, Path]) -> None:
    _, out = built
    ds = load_rl_dataset(out)
    split = json.loads((out / "split.json").read_text())
    for source, info in split["sources"].items():
        seen = {s: {r["conversation"] for r in ds[s] if r["source"] == source} for s in SPLITS}
        # The train rows are the curriculum's selection; the pool has every train row.
        seen["train"] |= {
            r["conversation"]
            for r in load_rl_dataset(out, pool=True)["train"]
            if r["source"] == source
        }
        assert seen["train"] and seen["validation"]
        for a, b in (("train", "validation"), ("train", "test"), ("validation", "test")):
            assert not seen[a] & seen[b], (source, a, b)
            assert not set(info[a]) & set(info[b]), (source, a, b)
        for s in SPLITS:
            assert seen[s] <= set(info[s])
    assert split["sources"]["locomo"]["validation"] == ["conv-m3"]
    assert split["sources"]["locomo"]["test"] == []
    assert split["sources"]["locomo"]["train"] == ["conv-m1", "conv-m2"]
    assert split["sources"]["locomo"]["method"] == "listed"
    assert split["sources"]["locomo"]["fractions"] is None
    assert split["sources"]["lme"]["method"] == "hash"
    assert split["sources"]["lme"]["fractions"] == {"validation": 0.1, "test": 0.4}
    assert split["sources"]["lme"]["test"]
    assert "heldout_fraction" not in json.dumps(split)
    # LongMemEval's "conversation" is the question's own haystack: its question id.
    assert all(
        r["conversation"] == r["qid"].split("/", 1)[1]
        for s in SPLITS
        for r in ds[s]
        if r["source"] == "lme"
    )


def test_card_states_the_split(built: tuple[RLDataResult, Path]) -> None:
    _, out = built
    card = (out / "README.md").read_text()
    assert card.startswith("---\nconfigs:")
    for split in SPLITS:
        assert f"path: {split}.parquet" in card
    assert "## Split" in card and "By conversation, never by question" in card
    assert "`test` is only reported and never used to choose anything" in card
    assert "validation: `conv-m3`" in card and "`conv-m1`, `conv-m2`" in card
    assert "  - test: none" in card  # locomo lists no test conversation
    assert "held-out fractions {'validation': 0.1, 'test': 0.4}" in card
    assert "## Curriculum" in card and "scored by `coarse`" in card
    assert "| locomo | train | 2 | 16 | 2 | 14 |" in card
    assert "| locomo | test | 0 | 0 | 0 | 0 |" in card
    assert "`prompt_spec.json`" in card and "shown in chronological order" in card


def test_prompt_spec_is_written_and_round_trips(built: tuple[RLDataResult, Path]) -> None:
    result, out = built
    spec = read_spec(out)
    assert spec == result.config.prompt
    assert (spec.window_tokens, spec.completion_tokens, spec.coarse) == (WINDOW, COMPLETION, "bm25")
    assert spec.order == "chronological" and spec.ask_think and spec.unit == "session"
    assert json.loads((out / SPEC_FILE).read_text()) == spec.to_dict()
    # recipe.yaml is the resolved recipe, with the spec nested under `prompt`.
    recipe = yaml.safe_load((out / "recipe.yaml").read_text())
    assert recipe["prompt"] == spec.to_dict()
    assert PromptSpec.from_dict(recipe["prompt"]) == spec


def test_pool_holds_every_train_row(built: tuple[RLDataResult, Path], tmp_path: Path) -> None:
    result, out = built
    ds, pooled = load_rl_dataset(out), load_rl_dataset(out, pool=True)
    counts = {s.source: s.counts for s in result.sources}
    assert len(pooled["train"]) == sum(c["train"]["rows"] for c in counts.values())
    assert len(pooled["train"]) > len(ds["train"])
    for split in ("validation", "test"):
        assert pooled[split]["qid"] == ds[split]["qid"]
    by_qid = {r["qid"]: r for r in pooled["train"]}
    for row in ds["train"]:  # the selection is a subset of the pool, row for row
        assert by_qid[row["qid"]] == row
    assert result.pool["qid"] == pooled["train"]["qid"]
    for name in ("train", "validation", "test"):
        (tmp_path / f"{name}.parquet").write_bytes((out / f"{name}.parquet").read_bytes())
    assert len(load_rl_dataset(tmp_path)["train"]) == len(ds["train"])
    with pytest.raises(DataError, match=f"missing {POOL_FILE}"):
        load_rl_dataset(tmp_path, pool=True)


def _blocks(user: str) -> dict[int, str]:
    """``[Session i]`` header and first turn line of each block in a prompt."""
    found = {}
    for m in re.finditer(r"^\[Session (\d+)\][^\n]*\n([^\n]*)", user, flags=re.M):
        found[int(m.group(1))] = m.group(0)
    return found


def test_round_trip_keeps_prompt_and_candidates_in_order(
    built: tuple[RLDataResult, Path], tiny_qwen3: Path, fixtures_dir: Path
) -> None:
    from transformers import AutoTokenizer

    result, out = built
    ds = load_rl_dataset(out)
    tok = AutoTokenizer.from_pretrained(str(tiny_qwen3))
    # The RL data's one renderer: the spec written next to the data, on the spec's tokenizer.
    builder = read_spec(out).builder(tok, _bm25())
    queries: dict[str, Query] = {
        q.qid: q for q in load_locomo(fixtures_dir / "locomo_mini.json").queries
    }
    assert set(REWARD_COLUMNS) <= set(ds["train"].column_names)
    assert "prompt_messages" in ds["train"].column_names
    checked = 0
    for split in SPLITS:
        for row in ds[split]:
            assert isinstance(row["prompt"], str)
            # The text is the messages rendered with the chat template, generation prompt on.
            assert row["prompt"] == builder.render(row["prompt_messages"])
            assert row["prompt"].endswith("<|im_start|>assistant\n")
            candidates = sessions_from_column(row["candidates"])
            assert len(candidates) == row["n_candidates"]
            user = row["prompt_messages"][-1]["content"]
            assert user in row["prompt"]
            blocks = _blocks(user)
            assert sorted(blocks) == list(range(len(candidates)))
            for i, s in enumerate(candidates):
                head = f"[Session {i}] Date: {s.date_text}" if s.date_text else f"[Session {i}]"
                assert blocks[i] == f"{head}\n{s.turns[0].render()}"
            assert sorted(row["coarse_order"]) == list(range(len(candidates)))
            gold = set(row["gold_ids"])
            assert row["gold_positions"] == [i for i, s in enumerate(candidates) if s.id in gold]
            assert row["gold_in_prompt"] == len(row["gold_positions"])
            if row["source"] == "locomo":
                # The stored prompt is what the spec's builder makes for that question.
                q = queries[row["qid"].split("/", 1)[1]]
                built_prompt = builder.build(q.question, q.haystack, q.question_date)
                assert row["prompt"] == built_prompt.text
                assert row["prompt_messages"] == built_prompt.messages
                assert row["prompt_tokens"] == built_prompt.n_tokens
                assert [s.id for s in candidates] == list(built_prompt.candidate_ids)
                checked += 1
    assert checked >= 4
    # The in-memory result and the files agree.
    assert result.dataset["validation"]["prompt"] == ds["validation"]["prompt"]
    assert result.dataset["test"]["prompt"] == ds["test"]["prompt"]


def _bm25() -> Any:
    from memsifter.coarse import build_filter

    return build_filter("bm25")


def test_prompts_respect_the_budget(built: tuple[RLDataResult, Path], tiny_qwen3: Path) -> None:
    from transformers import AutoTokenizer

    _, out = built
    ds = load_rl_dataset(out)
    builder = read_spec(out).builder(AutoTokenizer.from_pretrained(str(tiny_qwen3)), _bm25())
    rows = [r for s in SPLITS for r in ds[s]]
    assert any(r["n_dropped"] for r in rows)  # the budget did cut
    for row in rows:
        n = builder.counter.count(row["prompt"])
        assert n == row["prompt_tokens"] <= WINDOW - COMPLETION


def test_coarse_order_when_everything_fits(tiny_qwen3: Path, fixtures_dir: Path) -> None:
    cfg = _config(_recipe(tiny_qwen3, fixtures_dir, prompt={"window_tokens": 32768}))
    result = build_rl_dataset(cfg)
    rows = list(result.dataset["validation"])
    assert rows and all(r["n_dropped"] == 0 for r in rows)
    for r in rows:
        assert sorted(r["coarse_order"]) == list(range(r["n_candidates"]))
    # Chronological order: the coarse filter's opinion is not the shown order.
    assert any(list(r["coarse_order"]) != list(range(r["n_candidates"])) for r in rows)


@pytest.mark.parametrize("window", [WINDOW, 32768], ids=["cut", "all-fit"])
def test_coarse_order_shows_candidates_best_first(
    window: int, tiny_qwen3: Path, fixtures_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    recipe = _recipe(
        tiny_qwen3,
        fixtures_dir,
        prompt={"window_tokens": window, "order": "coarse", "ask_think": False},
    )
    recipe["sources"] = recipe["sources"][:1]
    cfg = _config(recipe)
    result = prepare_rl_data(cfg, tmp_path / "rl")
    assert read_spec(tmp_path / "rl") == cfg.prompt and cfg.prompt.order == "coarse"
    tok = AutoTokenizer.from_pretrained(str(tiny_qwen3))
    builder = cfg.prompt.builder(tok, _bm25())
    queries = {q.qid: q for q in load_locomo(fixtures_dir / "locomo_mini.json").queries}
    rows = [r for s in SPLITS for r in result.dataset[s]] + list(result.pool)
    assert rows and any(r["n_candidates"] > 2 for r in rows)
    if window == WINDOW:
        assert any(r["n_dropped"] for r in rows)
    else:
        assert all(r["n_dropped"] == 0 for r in rows)
    for r in rows:
        # Position i is the coarse filter's i-th best: the shown order is the coarse order.
        assert list(r["coarse_order"]) == list(range(r["n_candidates"]))
        q = queries[r["qid"].split("/", 1)[1]]
        built_prompt = builder.build(q.question, q.haystack, q.question_date)
        assert r["prompt"] == built_prompt.text
        assert "<think>" not in r["prompt_messages"][-1]["content"]  # ask_think: false
    card = (tmp_path / "rl" / "README.md").read_text()
    assert "shown in coarse order" in card and "ask_think False" in card


def _locomo_ten(src: Path, dst: Path) -> Path:
    """A LoCoMo file with 10 conversations (the mini fixture's three, repeated and renamed)."""
    mini = json.loads(src.read_text())
    records = []
    for i in range(10):
        rec = json.loads(json.dumps(mini[i % len(mini)]))
        rec["sample_id"] = f"conv-{i}"
        records.append(rec)
    dst.write_text(json.dumps(records))
    return dst


def test_locomo_default_split_is_three_way(fixtures_dir: Path, tmp_path: Path) -> None:
    path = _locomo_ten(fixtures_dir / "locomo_mini.json", tmp_path / "locomo10.json")
    ds = load_locomo(path)
    split = split_conversations(ds, SourceSettings("locomo", path=str(path)))
    assert split.method == "locomo-default"
    assert split.train == tuple(f"conv-{i}" for i in range(7))
    assert split.validation == ("conv-7",) and split.test == ("conv-8", "conv-9")
    assert split.unused == () and split.fractions is None
    assert split.assignment() == {
        **{f"conv-{i}": "train" for i in range(7)},
        "conv-7": "validation",
        "conv-8": "test",
        "conv-9": "test",
    }
    (plan,) = plan_sources(RLDataConfig(sources=[SourceSettings("locomo", path=str(path))]))
    for name, convs in (("train", range(7)), ("validation", [7]), ("test", [8, 9])):
        assert {q.conversation_id for q in plan.queries[name]} == {f"conv-{i}" for i in convs}
    assert plan.counts()["test"]["conversations"] == 2


def _many_conversations(n: int) -> Any:
    from memsifter.data.dataset import LoadReport, MemoryDataset

    return MemoryDataset(
        queries=[], conversations={f"c{i:05d}": () for i in range(n)}, report=LoadReport("x")
    )


def test_hash_split_is_three_way_deterministic_and_stable() -> None:
    ds = _many_conversations(4000)
    source = SourceSettings(
        "lme", dataset="longmemeval", validation_fraction=0.15, test_fraction=0.2
    )
    a = split_conversations(ds, source, seed=7)
    assert a.method == "hash" and a.fractions == {"validation": 0.15, "test": 0.2}
    assert a == split_conversations(ds, source, seed=7)  # deterministic
    parts = [set(a.train), set(a.validation), set(a.test)]
    assert sum(map(len, parts)) == 4000 and set().union(*parts) == set(ds.conversations)
    assert not parts[0] & parts[1] and not parts[0] & parts[2] and not parts[1] & parts[2]
    assert abs(len(a.validation) / 4000 - 0.15) < 0.03
    assert abs(len(a.test) / 4000 - 0.2) < 0.03
    assert a.unused == ()
    # Another seed deals the conversations differently.
    assert split_conversations(ds, source, seed=8).test != a.test
    # Adding data never moves a conversation: the split depends on the seed and the id only.
    small = split_conversations(_many_conversations(500), source, seed=7)
    assignment = a.assignment()
    assert all(assignment[c] == where for c, where in small.assignment().items())
    # One fraction alone: the other held-out split is empty.
    only_test = split_conversations(
        ds, SourceSettings("lme", dataset="longmemeval", test_fraction=0.1), seed=7
    )
    assert only_test.validation == () and 0.07 < len(only_test.test) / 4000 < 0.13
    assert only_test.fractions == {"validation": 0.0, "test": 0.1}


def test_split_rules(fixtures_dir: Path) -> None:
    ds = load_locomo(fixtures_dir / "locomo_mini.json")
    by_index = split_conversations(
        ds,
        SourceSettings(
            "x", train_conversations=[0], validation_conversations=[1], test_conversations=[2]
        ),
    )
    assert by_index.train == ("conv-m1",) and by_index.validation == ("conv-m2",)
    assert by_index.test == ("conv-m3",) and by_index.method == "listed"
    rest = split_conversations(
        ds, SourceSettings("x", validation_conversations=[1], test_conversations=["conv-m3"])
    )
    assert rest.train == ("conv-m1",)  # no train list: train is the rest
    listed = split_conversations(
        ds, SourceSettings("x", train_conversations=["conv-m1"], test_conversations=[2])
    )
    assert listed.unused == ("conv-m2",) and listed.validation == ()
    with pytest.raises(DataError, match="10 conversations of locomo10.json, but this file has 3"):
        split_conversations(ds, SourceSettings("x"))  # the default: 0-6 train, 7 val, 8-9 test
    with pytest.raises(DataError, match="in both train and validation"):
        split_conversations(
            ds,
            SourceSettings(
                "x", train_conversations=[0], validation_conversations=[0], test_conversations=[]
            ),
        )
    with pytest.raises(DataError, match="in both validation and test"):
        split_conversations(
            ds, SourceSettings("x", validation_conversations=[1], test_conversations=["conv-m2"])
        )
    with pytest.raises(UnknownNameError, match="unknown conversation 'conv-9'"):
        split_conversations(
            ds, SourceSettings("x", validation_conversations=["conv-9"], test_conversations=[])
        )
    h1 = split_conversations(
        ds, SourceSettings("x", validation_fraction=0.3, test_fraction=0.3), seed=3
    )
    assert h1 == split_conversations(
        ds, SourceSettings("x", validation_fraction=0.3, test_fraction=0.3), seed=3
    )
    assert set(h1.train) | set(h1.validation) | set(h1.test) == set(ds.conversations)
    with pytest.raises(ValueError, match="say how to split"):
        SourceSettings("lme", dataset="longmemeval")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"train_conversations": [0], "validation_conversations": [1]}, "list test_conversations"),
        ({"validation_conversations": [1]}, "list test_conversations"),
        ({"train_conversations": [0, 1]}, "list test_conversations"),
        (
            {"validation_conversations": [1], "test_conversations": [2], "test_fraction": 0.2},
            "lists or fractions, not both",
        ),
        ({"validation_fraction": 0.6, "test_fraction": 0.5}, "sum to at most 1"),
        ({"test_fraction": -0.1}, r"must be in \[0, 1\]"),
    ],
)
def test_split_settings_refused(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SourceSettings("x", **kwargs)


def test_recipe_without_test_list_is_refused_naming_the_file(
    tmp_path: Path, tiny_qwen3: Path, fixtures_dir: Path
) -> None:
    recipe = _recipe(tiny_qwen3, fixtures_dir)
    del recipe["sources"][0]["test_conversations"]
    with pytest.raises(DataError, match="list test_conversations") as e:
        load_rl_data_config(_write_recipe(tmp_path / "r.yaml", recipe))
    assert "r.yaml" in str(e.value)


def test_missing_data_file_names_it(tmp_path: Path) -> None:
    cfg = RLDataConfig(sources=[SourceSettings("locomo", path=str(tmp_path / "nope.json"))])
    with pytest.raises(DataError, match="nope.json") as e:
        plan_sources(cfg)
    assert "sources[0].path" in str(e.value) and "--data locomo=PATH" in str(e.value)


@pytest.mark.parametrize("name", ["locomo_smollm2_cpu.yaml", "qwen3_4b.yaml"])
def test_shipped_recipes_parse(name: str) -> None:
    cfg = load_rl_data_config(ROOT / "configs" / "data" / name)
    assert cfg.sources and cfg.curriculum.anchor == 0.2 and cfg.curriculum.k == 10
    assert cfg.curriculum.scale == "attainable"
    assert all(s.count for s in cfg.sources)
    assert cfg.budget_tokens > 0 and cfg.budget_tokens == cfg.prompt.budget_tokens
    assert isinstance(cfg.prompt, PromptSpec)
    for s in cfg.sources:  # every source says how its test split is made
        assert s.test_conversations or s.test_fraction


def test_smollm2_recipe_is_the_cpu_prompt() -> None:
    cfg = load_rl_data_config(ROOT / "configs" / "data" / "locomo_smollm2_cpu.yaml")
    p = cfg.prompt
    assert (p.model, p.window_tokens, p.completion_tokens) == ("smollm2-135m-instruct", 1024, 48)
    assert (p.order, p.ask_think, p.unit, p.turns_per_page) == ("coarse", False, "page", 2)
    (locomo,) = cfg.sources
    assert locomo.train_conversations == [0, 1, 2, 3, 4, 5, 6]
    assert locomo.validation_conversations == [7] and locomo.test_conversations == [8, 9]


def test_qwen3_recipe_dry_builds(fixtures_dir: Path) -> None:

    cfg = load_rl_data_config(ROOT / "configs" / "data" / "qwen3_4b.yaml")
    # The mini LoCoMo file has 3 conversations, not 10.
    small = dataclasses.replace(
        cfg.sources[0],
        train_conversations=None,
        validation_conversations=[1],
        test_conversations=[2],
    )
    cfg = dataclasses.replace(cfg, sources=[small, *cfg.sources[1:]])
    p = cfg.prompt
    assert (p.model, p.window_tokens, p.completion_tokens) == (
        "Qwen/Qwen3-4B-Thinking-2507",
        131072,
        16384,
    )
    assert (p.coarse, p.order, p.ask_think, p.unit) == ("bge-m3", "chronological", True, "session")
    lme = str(fixtures_dir / "longmemeval_mini.json")
    paths = parse_data_overrides(
        [
            f"locomo={fixtures_dir / 'locomo_mini.json'}",
            f"longmemeval_s={lme}",
            f"longmemeval_m={lme}",
        ],
        cfg,
    )
    plans = plan_sources(with_data_paths(cfg, paths))
    s, m = plans[1].split, plans[2].split
    assert plans[0].split.train == ("conv-m1",)
    assert plans[0].split.validation == ("conv-m2",) and plans[0].split.test == ("conv-m3",)
    # The hash puts a question in the same split in S and M.
    assert s.method == "hash" and s.fractions == {"validation": 0.15, "test": 0.15}
    assert s.validation == m.validation and s.test == m.test and s.train == m.train
    with pytest.raises(DataError, match="write NAME=PATH"):
        parse_data_overrides(["x.json"], cfg)
    with pytest.raises(DataError, match="no source named 'nope'"):
        parse_data_overrides(["nope=x.json"], cfg)


def test_bad_recipe_keys(tmp_path: Path, tiny_qwen3: Path, fixtures_dir: Path) -> None:
    bad = _recipe(tiny_qwen3, fixtures_dir, windw_tokens=3)
    with pytest.raises(DataError, match="windw_tokens"):
        load_rl_data_config(_write_recipe(tmp_path / "r.yaml", bad))
    nested = _recipe(tiny_qwen3, fixtures_dir, prompt={"windw_tokens": 3})
    with pytest.raises(DataError, match="windw_tokens") as e:
        load_rl_data_config(_write_recipe(tmp_path / "r.yaml", nested))
    assert "prompt.windw_tokens" in str(e.value)
    order = _recipe(tiny_qwen3, fixtures_dir, prompt={"order": "random"})
    with pytest.raises(DataError, match="order must be one of") as e:
        load_rl_data_config(_write_recipe(tmp_path / "r.yaml", order))
    assert "r.yaml" in str(e.value)
    thinking = _recipe(
        tiny_qwen3, fixtures_dir, prompt={"chat_template_kwargs": {"enable_thinking": False}}
    )
    with pytest.raises(DataError, match="derived from ask_think"):
        load_rl_data_config(_write_recipe(tmp_path / "r.yaml", thinking))
    # The old flat layout (model, window_tokens, ... at the top) is refused, pointing at prompt.
    flat = _recipe(tiny_qwen3, fixtures_dir)
    flat.update(flat.pop("prompt"))
    with pytest.raises(DataError, match="'prompt'") as e:
        load_rl_data_config(_write_recipe(tmp_path / "r.yaml", flat))
    assert "unknown key" in str(e.value)
    dup = _recipe(tiny_qwen3, fixtures_dir)
    dup["sources"][1]["name"] = "locomo"
    with pytest.raises(DataError, match="unique") as e:
        load_rl_data_config(_write_recipe(tmp_path / "r.yaml", dup))
    assert "r.yaml" in str(e.value)


def test_cli(tmp_path: Path, tiny_qwen3: Path, fixtures_dir: Path) -> None:
    recipe = _recipe(tiny_qwen3, fixtures_dir)
    recipe["sources"] = recipe["sources"][:1]
    recipe["sources"][0]["path"] = str(tmp_path / "missing.json")
    path = _write_recipe(tmp_path / "r.yaml", recipe)
    runner = CliRunner()
    res = runner.invoke(app, ["data", "rl", "--recipe", str(path), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "missing.json" in res.output
    data = str(fixtures_dir / "locomo_mini.json")
    res = runner.invoke(
        app,
        ["data", "rl", "--recipe", str(path), "--out", str(tmp_path / "o"), "--data", data],
    )
    assert res.exit_code == 0, res.output
    assert "curriculum: curriculum, scored by coarse" in res.output
    for name in ("train.parquet", "validation.parquet", "test.parquet", POOL_FILE, SPEC_FILE):
        assert (tmp_path / "o" / name).is_file(), name
    assert read_spec(tmp_path / "o") == PromptSpec(**recipe["prompt"])
    res = runner.invoke(
        app,
        ["data", "rl", "--recipe", str(path), "--out", str(tmp_path / "o2"), "--data", data,
         "--rankings", str(tmp_path / "none.jsonl")],
    )  # fmt: skip
    assert res.exit_code == 2 and "rankings file not found" in res.output


def test_next_round_scores_the_pool_with_a_previous_model(
    tiny_qwen3: Path, fixtures_dir: Path, tmp_path: Path
) -> None:
    """`data rank` ranks every train candidate with a model; `data rl --rankings` then runs the
    curriculum on those rankings instead of the coarse order."""
    recipe = _recipe(tiny_qwen3, fixtures_dir)
    recipe["sources"] = recipe["sources"][:1]
    path = _write_recipe(tmp_path / "r.yaml", recipe)
    runner = CliRunner()
    rankings = tmp_path / "rankings.jsonl"
    res = runner.invoke(
        app,
        ["data", "rank", "--recipe", str(path), "--model", str(tiny_qwen3),
         "--out", str(rankings), "--max-new-tokens", "8", "--threads", "1"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    lines = [json.loads(line) for line in rankings.read_text().splitlines()]
    pool = load_rl_data_config(path)
    n_train = sum(
        1
        for q in load_locomo(fixtures_dir / "locomo_mini.json").queries
        if q.conversation_id != "conv-m3" and q.gold_session_ids
    )
    assert len(lines) == n_train and pool.sources[0].count == 4  # the whole pool was ranked
    res = runner.invoke(
        app,
        ["data", "rl", "--recipe", str(path), "--out", str(tmp_path / "o"),
         "--rankings", str(rankings)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "scored by rankings" in res.output


HEAD = {"ranking_head": "first_token", "ask_think": False}


def test_rank_with_another_recipes_prompts_carries_the_ranking_by_session_id(
    tiny_qwen3: Path, fixtures_dir: Path, tmp_path: Path
) -> None:
    """`data rank --model-recipe`: the model reads its own recipe's prompts (a first-token
    head's, newest first) and the rankings land in `--recipe`'s positions (a written
    ranking's, date order), the same sessions in the same order, for every train
    question of the pool."""
    recipe = _recipe(tiny_qwen3, fixtures_dir)
    recipe["sources"] = recipe["sources"][:1]
    path = _write_recipe(tmp_path / "r.yaml", recipe)
    head = {**recipe, "prompt": {**recipe["prompt"], "order": "newest_first", **HEAD}}
    reads = _write_recipe(tmp_path / "m.yaml", head)
    out = tmp_path / "rankings.jsonl"
    res = CliRunner().invoke(
        app,
        ["data", "rank", "--recipe", str(path), "--model-recipe", str(reads),
         "--model", str(tiny_qwen3), "--out", str(out), "--max-new-tokens", "8",
         "--threads", "1"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "carried to" in res.output

    def pool(p: Path) -> dict[str, list[str]]:
        cfg = load_rl_data_config(p)
        whole = dataclasses.replace(cfg, sources=[dataclasses.replace(cfg.sources[0], count=None)])
        rows = build_rl_dataset(whole).dataset["train"]
        return {r["qid"]: [s.id for s in sessions_from_column(r["candidates"])] for r in rows}

    def read(f: Path, ids: dict[str, list[str]]) -> dict[str, list[str]]:
        lines = [json.loads(line) for line in f.read_text().splitlines()]
        return {o["qid"]: [ids[o["qid"]][p] for p in o["ranking"]] for o in lines}

    dates, newest = pool(path), pool(reads)
    assert any(dates[q] != newest[q] for q in dates)  # the positions do differ
    carried, own = read(out, dates), read(out.with_suffix(".ranked.jsonl"), newest)
    assert set(carried) == set(dates) and all(own.values())  # a head ranks every prompt
    assert carried == {q: [s for s in own[q] if s in dates[q]] for q in dates}


def test_train_shuffle_shows_the_same_candidates_in_another_order(
    built: tuple[RLDataResult, Path], tiny_qwen3: Path, fixtures_dir: Path
) -> None:
    """``train_shuffle_share: 1``: every train row holds the candidates the date-order build
    chose (what the budget cut stays cut), shown in a seeded random order with its gold and
    coarse order moved along and the same prompt length; validation and test are untouched."""

    plain, _ = built
    cfg = dataclasses.replace(_config(_recipe(tiny_qwen3, fixtures_dir)), train_shuffle_share=1.0)
    shuffled = build_rl_dataset(cfg)
    for split in ("validation", "test"):
        assert list(shuffled.dataset[split]) == list(plain.dataset[split])
    before = {r["qid"]: r for r in plain.pool}
    moved = 0
    for r in shuffled.pool:
        b = before[r["qid"]]
        ids = [s.id for s in sessions_from_column(r["candidates"])]
        was = [s.id for s in sessions_from_column(b["candidates"])]
        assert sorted(ids) == sorted(was) and r["n_dropped"] == b["n_dropped"]
        assert r["prompt_tokens"] == b["prompt_tokens"] <= WINDOW - COMPLETION
        assert {ids[p] for p in r["gold_positions"]} == {was[p] for p in b["gold_positions"]}
        assert [ids[p] for p in r["coarse_order"]] == [was[p] for p in b["coarse_order"]]
        moved += ids != was
    assert moved >= len(shuffled.pool) // 2  # a random order, not the date order again
    # Seeded: the same recipe shows the same orders.
    again = build_rl_dataset(cfg)
    assert [r["prompt"] for r in again.pool] == [r["prompt"] for r in shuffled.pool]
    total = sum(s.counts["train"]["shuffled"] for s in shuffled.sources)
    assert total == sum(r["n_candidates"] > 1 for r in shuffled.pool)


def test_train_shuffle_share_is_a_share(tiny_qwen3: Path, fixtures_dir: Path) -> None:
    with pytest.raises(ValueError, match="train_shuffle_share must be a share"):
        RLDataConfig(
            prompt=PromptSpec(**_prompt(tiny_qwen3)),
            sources=[SourceSettings(name="gym", dataset="gym")],
            train_shuffle_share=1.5,
        )
