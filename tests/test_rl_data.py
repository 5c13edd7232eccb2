"""RL data prep on the synthetic LoCoMo and LongMemEval fixtures with the tiny Qwen3 tokenizer:
the split is by conversation and stated in the card and split.json, parquet round-trips the
prompts and candidates in prompt order, prompts fit the budget, the recipes parse, and the CLI
writes everything or fails with a named error."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from memsifter.cli import app
from memsifter.data import load_locomo
from memsifter.data.types import Query
from memsifter.errors import DataError, UnknownNameError
from memsifter.ranker.prompt import PromptBuilder
from memsifter.rewards.columns import REWARD_COLUMNS, sessions_from_column
from memsifter.training.rl_data import (
    RLDataConfig,
    RLDataResult,
    SourceConfig,
    load_rl_data_config,
    load_rl_dataset,
    parse_data_overrides,
    plan_sources,
    prepare_rl_data,
    split_conversations,
    with_data_paths,
)

ROOT = Path(__file__).resolve().parents[1]
WINDOW, COMPLETION = 1536, 64  # small enough that the coarse filter must cut most prompts


def _recipe(tiny_qwen3: Path, fixtures_dir: Path, **extra: Any) -> dict[str, Any]:
    return {
        "model": str(tiny_qwen3),
        "window_tokens": WINDOW,
        "completion_tokens": COMPLETION,
        "coarse": "bm25",
        "seed": 0,
        "sources": [
            {
                "name": "locomo",
                "dataset": "locomo",
                "path": str(fixtures_dir / "locomo_mini.json"),
                "count": 4,
                "heldout_conversations": ["conv-m3"],
            },
            {
                "name": "lme",
                "dataset": "longmemeval",
                "path": str(fixtures_dir / "longmemeval_mini.json"),
                "count": 1,
                "heldout_fraction": 0.5,
            },
        ],
        **extra,
    }


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
    # LongMemEval mini: the abstention question has no gold, wherever the hash put it.
    assert sum(counts["lme"][s]["dropped_no_evidence"] for s in ("train", "validation")) == 1
    ds = load_rl_dataset(out)
    assert len(ds["train"]) == 4 + 1
    assert len(ds["validation"]) == sum(c["validation"]["rows"] for c in counts.values())
    assert all(list(ds[s]["gold_ids"]) for s in ("train", "validation"))
    assert all(g for s in ("train", "validation") for g in ds[s]["gold_ids"])


def test_no_conversation_in_both_splits(built: tuple[RLDataResult, Path]) -> None:
    _, out = built
    ds = load_rl_dataset(out)
    split = json.loads((out / "split.json").read_text())
    for source, info in split["sources"].items():
        train = {r["conversation"] for r in ds["train"] if r["source"] == source}
        val = {r["conversation"] for r in ds["validation"] if r["source"] == source}
        assert train and val
        assert not train & val
        assert not set(info["train"]) & set(info["validation"])
        assert train <= set(info["train"]) and val <= set(info["validation"])
    assert split["sources"]["locomo"]["validation"] == ["conv-m3"]
    assert split["sources"]["locomo"]["method"] == "listed"
    assert split["sources"]["lme"]["method"] == "hash"
    # LongMemEval's "conversation" is the question's own haystack: its question id.
    assert all(
        r["conversation"] == r["qid"].split("/", 1)[1] for r in ds["train"] if r["source"] == "lme"
    )


def test_card_states_the_split(built: tuple[RLDataResult, Path]) -> None:
    _, out = built
    card = (out / "README.md").read_text()
    assert card.startswith("---\nconfigs:")
    assert "path: train.parquet" in card and "path: validation.parquet" in card
    assert "## Split" in card and "By conversation, never by question" in card
    assert "validation: `conv-m3`" in card and "`conv-m1`, `conv-m2`" in card
    assert "held-out fraction 0.5" in card
    assert "## Curriculum" in card and "scored by `coarse`" in card
    assert "| locomo | train | 2 | 16 | 2 | 14 |" in card


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
    builder = PromptBuilder(tok, WINDOW, COMPLETION, coarse=_bm25())
    queries: dict[str, Query] = {
        q.qid: q for q in load_locomo(fixtures_dir / "locomo_mini.json").queries
    }
    assert set(REWARD_COLUMNS) <= set(ds["train"].column_names)
    checked = 0
    for split in ("train", "validation"):
        for row in ds[split]:
            candidates = sessions_from_column(row["candidates"])
            assert len(candidates) == row["n_candidates"]
            user = row["prompt"][-1]["content"]
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
                # The stored prompt is what the shared builder makes for that question.
                built_prompt = builder.build_query(queries[row["qid"].split("/", 1)[1]])
                assert row["prompt"] == built_prompt.messages
                assert [s.id for s in candidates] == list(built_prompt.candidate_ids)
                checked += 1
    assert checked >= 4
    # The in-memory result and the files agree.
    assert result.dataset["validation"]["prompt"] == ds["validation"]["prompt"]


def _bm25() -> Any:
    from memsifter.coarse import build_filter

    return build_filter("bm25")


def test_prompts_respect_the_budget(built: tuple[RLDataResult, Path], tiny_qwen3: Path) -> None:
    from transformers import AutoTokenizer

    _, out = built
    ds = load_rl_dataset(out)
    builder = PromptBuilder(AutoTokenizer.from_pretrained(str(tiny_qwen3)), WINDOW, COMPLETION)
    rows = list(ds["train"]) + list(ds["validation"])
    assert any(r["n_dropped"] for r in rows)  # the budget did cut
    for row in rows:
        n = builder.counter.count(builder.render(row["prompt"]))
        assert n == row["prompt_tokens"] <= WINDOW - COMPLETION


def test_coarse_order_when_everything_fits(tiny_qwen3: Path, fixtures_dir: Path) -> None:
    recipe = _recipe(tiny_qwen3, fixtures_dir, window_tokens=32768)
    cfg = RLDataConfig(
        **{**recipe, "sources": [SourceConfig(**s) for s in recipe["sources"]]}  # type: ignore[arg-type]
    )
    from memsifter.training.rl_data import build_rl_dataset

    result = build_rl_dataset(cfg)
    rows = list(result.dataset["validation"])
    assert rows and all(r["n_dropped"] == 0 for r in rows)
    for r in rows:
        assert sorted(r["coarse_order"]) == list(range(r["n_candidates"]))


def test_split_rules(fixtures_dir: Path) -> None:
    ds = load_locomo(fixtures_dir / "locomo_mini.json")
    by_index = split_conversations(ds, SourceConfig("x", train_conversations=[0]))
    assert by_index.train == ("conv-m1",) and by_index.validation == ("conv-m2", "conv-m3")
    both = split_conversations(
        ds, SourceConfig("x", train_conversations=["conv-m1"], heldout_conversations=[2])
    )
    assert both.unused == ("conv-m2",)
    with pytest.raises(DataError, match="10 conversations of locomo10.json, but this file has 3"):
        split_conversations(ds, SourceConfig("x"))  # the default: 0-6 train, 7-9 held out
    with pytest.raises(DataError, match="both splits"):
        split_conversations(
            ds, SourceConfig("x", train_conversations=[0], heldout_conversations=[0])
        )
    with pytest.raises(UnknownNameError, match="unknown conversation 'conv-9'"):
        split_conversations(ds, SourceConfig("x", heldout_conversations=["conv-9"]))
    h1 = split_conversations(ds, SourceConfig("x", heldout_fraction=0.5), seed=3)
    assert h1 == split_conversations(ds, SourceConfig("x", heldout_fraction=0.5), seed=3)
    assert set(h1.train) | set(h1.validation) == set(ds.conversations)
    with pytest.raises(ValueError, match="say how to split"):
        SourceConfig("lme", dataset="longmemeval")


def test_missing_data_file_names_it(tmp_path: Path) -> None:
    cfg = RLDataConfig(sources=[SourceConfig("locomo", path=str(tmp_path / "nope.json"))])
    with pytest.raises(DataError, match="nope.json") as e:
        plan_sources(cfg)
    assert "sources[0].path" in str(e.value) and "--data locomo=PATH" in str(e.value)


@pytest.mark.parametrize("name", ["locomo_smollm2_cpu.yaml", "qwen3_4b.yaml"])
def test_shipped_recipes_parse(name: str) -> None:
    cfg = load_rl_data_config(ROOT / "configs" / "data" / name)
    assert cfg.sources and cfg.curriculum.anchor == 0.2 and cfg.curriculum.k == 10
    assert all(s.count for s in cfg.sources)
    assert cfg.budget_tokens > 0


def test_qwen3_recipe_dry_builds(fixtures_dir: Path) -> None:
    import dataclasses

    cfg = load_rl_data_config(ROOT / "configs" / "data" / "qwen3_4b.yaml")
    # The mini LoCoMo file has 3 conversations, not 10.
    small = dataclasses.replace(cfg.sources[0], train_conversations=None, heldout_conversations=[2])
    cfg = dataclasses.replace(cfg, sources=[small, *cfg.sources[1:]])
    assert (cfg.model, cfg.window_tokens, cfg.completion_tokens) == ("Qwen/Qwen3-4B", 131072, 16384)
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
    assert plans[0].split.validation == ("conv-m3",)
    # The hash puts a question in the same split in S and M.
    assert s.validation == m.validation and s.train == m.train
    with pytest.raises(DataError, match="write NAME=PATH"):
        parse_data_overrides(["x.json"], cfg)
    with pytest.raises(DataError, match="no source named 'nope'"):
        parse_data_overrides(["nope=x.json"], cfg)


def test_bad_recipe_keys(tmp_path: Path, tiny_qwen3: Path, fixtures_dir: Path) -> None:
    bad = _recipe(tiny_qwen3, fixtures_dir, windw_tokens=3)
    with pytest.raises(DataError, match="windw_tokens"):
        load_rl_data_config(_write_recipe(tmp_path / "r.yaml", bad))
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
    assert (tmp_path / "o" / "train.parquet").is_file()
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
