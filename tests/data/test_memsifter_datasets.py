"""The MemSifter authors' released data as a source (``dataset: memsifter``,
memsifter.data.memsifter_release): the release's folder layout in parquet with its sessions
JSON-encoded, the same rows as JSON lines and as a JSON list, splits by file, ids, gold by id,
conversations by haystack, and every bad row refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from memsifter.data import load_dataset
from memsifter.data.memsifter_release import SOURCE, load_memsifter_datasets
from memsifter.errors import DataError, MemSifterError

ROWS = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "memsifter_datasets" / "rows.json").read_text("utf-8")
)["datasets"]


def _parquet_row(row: dict[str, Any]) -> dict[str, Any]:
    # The official pipeline stores the sessions as one JSON string per row
    # (utils/ray_gen_utils.py), and parquet wants one type per column: answers as text.
    out = {**row, "haystack_sessions": json.dumps(row["haystack_sessions"], ensure_ascii=False)}
    if "answer" in out:
        out["answer"] = str(out["answer"])
    return out


def _write(root: Path, kind: str, rows: dict = ROWS) -> Path:
    for dataset, splits in rows.items():
        (root / dataset).mkdir(parents=True, exist_ok=True)
        for split, data in splits.items():
            path = root / dataset / f"{split}.{kind}"
            if kind == "parquet":
                import pyarrow as pa
                import pyarrow.parquet as pq

                pq.write_table(pa.Table.from_pylist([_parquet_row(r) for r in data]), path)
            elif kind == "jsonl":
                path.write_text("".join(json.dumps(r) + "\n" for r in data), encoding="utf-8")
            else:
                path.write_text(json.dumps(data), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(tmp_path_factory.mktemp("MemSifter-Datasets"), "parquet")


def test_the_release_folder_loads_with_its_splits_ids_and_gold(release: Path) -> None:
    ds = load_dataset("memsifter", release)
    by_id = {q.qid: q for q in ds.queries}
    # Train before test within a dataset, so ids do not depend on how file names sort.
    assert list(by_id) == [
        "locomo/train/0",
        "locomo/train/1",
        "locomo/test/0",
        "split_longmemeval_s/train/0",
        "split_longmemeval_s/test/0",
    ]
    assert all(q.source == SOURCE for q in ds.queries)
    first = by_id["locomo/train/0"]
    assert [s.id for s in first.haystack] == [
        "locomo:session_1",
        "locomo:session_2",
        "locomo:session_3",
    ]
    assert first.gold_session_ids == ("locomo:session_1",)
    assert first.haystack[0].turns[0].speaker == "Caroline"
    assert first.haystack[0].date is not None and first.haystack[0].date.month == 5
    assert first.meta["similarities"]["locomo:session_1"] == pytest.approx(0.61)
    # An answer stored as a number reads as text; duplicate gold ids once.
    second = by_id["locomo/train/1"]
    assert second.answer == "1" and second.gold_session_ids == ("locomo:session_2",)
    # Two questions on one haystack are one conversation, so a bootstrap resamples them together.
    assert first.conversation_id == second.conversation_id
    assert first.haystack == second.haystack
    # Another conversation's session_1 is another session: renamed, its gold follows it.
    test = by_id["locomo/test/0"]
    assert [s.id for s in test.haystack] == ["locomo:session_1#2", "locomo:session_2#2"]
    assert test.gold_session_ids == ("locomo:session_2#2",)
    assert test.conversation_id != first.conversation_id
    # LongMemEval's rows: dates optional, gold_answer read where answer is absent.
    lme = by_id["split_longmemeval_s/test/0"]
    assert lme.answer == "The information provided is not enough."
    assert all(s.date is None for s in lme.haystack) and not lme.has_evidence
    assert by_id["split_longmemeval_s/train/0"].gold_session_ids == (
        "split_longmemeval_s:answer_280352e9",
    )
    # Each file's split, by conversation; the release has no validation split.
    assert ds.splits == {
        q.conversation_id: q.qid.split("/")[1] for q in ds.queries if q.conversation_id
    }
    assert set(ds.splits.values()) == {"train", "test"}
    summary = ds.report.summary()
    assert ds.report.n_questions == 5 and "2 sessions share an id" in summary
    assert ds.report.no_evidence_qids == ["split_longmemeval_s/test/0"]


@pytest.mark.parametrize("kind", ["jsonl", "json"])
def test_json_lines_and_json_lists_read_the_same_rows(
    release: Path, tmp_path: Path, kind: str
) -> None:
    want = load_memsifter_datasets(release)
    got = load_memsifter_datasets(_write(tmp_path, kind))
    # The parquet answers were written as text; the JSON ones keep the row's own value.
    assert got.queries == want.queries and got.splits == want.splits


def test_one_dataset_folder_or_one_file(release: Path) -> None:
    one = load_memsifter_datasets(release / "locomo")
    assert [q.qid for q in one.queries] == ["locomo/train/0", "locomo/train/1", "locomo/test/0"]
    file = load_memsifter_datasets(release / "locomo" / "test.parquet")
    assert [q.qid for q in file.queries] == ["locomo/test/0"]
    assert set(file.splits.values()) == {"test"}


def test_a_haystack_in_both_splits_is_left_to_the_recipe(tmp_path: Path) -> None:
    leaked = {"locomo": {"train": ROWS["locomo"]["train"], "test": ROWS["locomo"]["train"][:1]}}
    ds = load_memsifter_datasets(_write(tmp_path, "jsonl", leaked))
    assert ds.splits == {}
    assert "1 haystacks appear in both a train and a test file" in ds.report.summary()


def _bad(tmp_path: Path, change: dict[str, Any]) -> Path:
    row = {**ROWS["locomo"]["train"][0], **change}
    row = {k: v for k, v in row.items() if v is not None}
    return _write(tmp_path, "jsonl", {"locomo": {"train": [row]}})


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"haystack_session_ids": ["session_1"]}, "haystack_session_ids", "1 session ids for 3"),
        ({"haystack_dates": ["1 May 2023"]}, "haystack_dates", "1 entries for 3"),
        ({"similarities": [0.1, 0.2]}, "similarities", "2 entries for 3"),
        ({"answer_session_ids": ["session_9"]}, "answer_session_ids", "not in the haystack"),
        ({"haystack_sessions": "[[{"}, "haystack_sessions", "not JSON"),
        ({"haystack_sessions": [{"role": "user"}, [], []]}, "haystack_sessions", "list of turns"),
        ({"haystack_sessions": [[{"role": "user"}], [], []]}, "content", "missing"),
        ({"answer": None}, "answer", "missing"),
        ({"question": 3}, "question", "expected str"),
    ],
)
def test_bad_rows_are_refused_naming_file_row_and_field(
    tmp_path: Path, change: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(DataError, match=message) as e:
        load_memsifter_datasets(_bad(tmp_path, change))
    assert e.value.field == field and "locomo/train/0" in str(e.value)
    assert "train.jsonl" in str(e.value)


def test_paths_that_hold_no_release_are_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not found"):
        load_memsifter_datasets(tmp_path / "nope")
    with pytest.raises(DataError, match="no data files"):
        load_memsifter_datasets(tmp_path)
    (tmp_path / "rows.csv").write_text("question\n")
    with pytest.raises(DataError, match="expected one of .parquet"):
        load_memsifter_datasets(tmp_path / "rows.csv")
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(DataError, match="not a readable parquet file"):
        load_memsifter_datasets(tmp_path / "broken.parquet")
    (tmp_path / "train.jsonl").write_text('{"question": \n')
    with pytest.raises(MemSifterError, match="invalid JSON"):
        load_memsifter_datasets(tmp_path / "train.jsonl")


def test_the_cli_and_the_retrieval_eval_read_it(release: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from memsifter.cli import app

    runner = CliRunner()
    out = runner.invoke(app, ["data", "stats", "--dataset", "memsifter", "--data", str(release)])
    assert out.exit_code == 0, out.output
    assert "memsifter-datasets: 5 questions" in out.output
    args = ["eval", "retrieval", "--dataset", "memsifter", "--data", str(release / "locomo")]
    out = runner.invoke(app, [*args, "--retriever", "bm25", "--out", str(tmp_path)])
    assert out.exit_code == 0, out.output
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert (metrics["dataset"], metrics["n_questions"], metrics["retriever"]) == (
        "memsifter",
        3,
        "bm25",
    )


def test_a_recipe_keeps_the_release_split_and_carves_validation_from_its_train(
    release: Path,
) -> None:
    from memsifter.training.rldata.recipe import SourceSettings
    from memsifter.training.rldata.split import split_conversations

    ds = load_memsifter_datasets(release)
    own = split_conversations(ds, SourceSettings(name="r", dataset="memsifter", path=str(release)))
    assert own.method == "dataset" and own.validation == ()
    assert set(own.test) == {c for c, s in ds.splits.items() if s == "test"}
    carved = split_conversations(
        ds, SourceSettings(name="r", dataset="memsifter", path=str(release), validation_fraction=1)
    )
    # Every train conversation to validation at fraction 1; test never moves.
    assert carved.method == "dataset+hash" and carved.train == () and carved.test == own.test
    assert set(carved.validation) == set(own.train)


def test_the_paper_table_script_checks_the_data_dry_and_refuses_without_a_gpu(
    release: Path, tmp_path: Path
) -> None:
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "DATA": str(release),
        "DATASETS": "locomo split_longmemeval_s",
        "MODEL": "/models/MemSifter-4B-Thinking",
        "BGE": "/models/bge-m3",
        "MEMSIFTER_PYTHON": sys.executable,
        "PATH": "/usr/bin:/bin",  # no nvidia-smi, no vllm
    }
    script = str(root / "scripts/eval_released_proxy.sh")
    dry = subprocess.run(
        ["bash", script, "--dry-run", str(tmp_path)], env=env, capture_output=True, text=True
    )
    assert dry.returncode == 0, dry.stderr
    # Each dataset's test file loaded, as the run will read it.
    assert dry.stdout.count("memsifter-datasets: 1 questions") == 2
    assert "vllm serve /models/MemSifter-4B-Thinking --max-model-len 147456" in dry.stdout
    runs = [line for line in dry.stdout.splitlines() if " eval retrieval " in line]
    assert len(runs) == 2 and all("--retriever bge-m3:/models/bge-m3" in r for r in runs)
    spec = json.loads((tmp_path / "prompt_spec.json").read_text())
    assert spec["template"] == "official" and spec["coarse"] == "bge-m3:/models/bge-m3"
    real = subprocess.run(["bash", script, str(tmp_path)], env=env, capture_output=True, text=True)
    assert real.returncode == 2 and "no GPU here" in real.stderr
    env["DATASETS"] = "personamem_128k"
    missing = subprocess.run(
        ["bash", script, str(tmp_path)], env=env, capture_output=True, text=True
    )
    assert missing.returncode == 2 and "personamem_128k/test.parquet not found" in missing.stderr


def test_the_paper_table_renders_from_the_runs_with_a_conversation_bootstrap(
    release: Path, tmp_path: Path
) -> None:
    import shutil

    from typer.testing import CliRunner

    from memsifter.cli import app
    from memsifter.evaluation.released_table import dataset_row, paper_column, render

    # The runs as eval retrieval writes them; a second coarse filter stands in for the proxy.
    out = tmp_path / "locomo"
    args = ["eval", "retrieval", "--dataset", "memsifter", "--data", str(release / "locomo")]
    args += ["--retriever", "bm25", "--retriever", "wordllama", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    shutil.move(out / "wordllama", out / "memsifter")
    row = dataset_row(out)
    # 3 questions over 2 haystacks: the bootstrap draws 2 conversations.
    assert (row["coarse"], row["n"], row["n_conversations"]) == ("bm25", 3, 2)
    assert row["diff"]["ndcg@1"]["n_clusters"] == 2
    assert row["diff"]["ndcg@1"]["mean"] == pytest.approx(
        row["proxy_ndcg@1"] - row["coarse_ndcg@1"]
    )
    table = render(tmp_path, ["locomo"])
    assert "| locomo | 3 (2) |" in table and "| 43.57 / 69.59 |" in table
    assert paper_column("split_longmemeval_s") == "longmemeval"
    (out / "memsifter").rename(out / "other")
    with pytest.raises(DataError, match="one coarse filter's folder and memsifter/"):
        dataset_row(out)


def test_the_released_proxy_is_evaluated_on_the_release_with_its_own_prompt(
    release: Path, tiny_qwen3: Path, tmp_path: Path
) -> None:
    """RL data from the release with ``template: official``, then ``eval proxy`` on a model in the
    released layout: the rows hold the official prompt, the model is scored on it (and under
    permuted orders), beside BM25 on the same candidates."""
    from typer.testing import CliRunner

    from memsifter.cli import app
    from memsifter.ranker.official import USER_PROMPT

    model = tmp_path / "MemSifter-4B-Thinking"
    shutil.copytree(tiny_qwen3, model)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"prompt:\n  template: official\n  model: {model}\n  window_tokens: 4096\n"
        "  completion_tokens: 16\n  coarse: bm25\n  order: chronological\n  ask_think: true\n"
        f"  unit: session\nsources:\n  - name: release\n    dataset: memsifter\n"
        f"    path: {release}\n    validation_fraction: 0.5\n"
        "curriculum:\n  strategy: random\n"
    )
    runner = CliRunner()
    data = tmp_path / "rl"
    out = runner.invoke(app, ["data", "rl", "--recipe", str(recipe), "--out", str(data)])
    assert out.exit_code == 0, out.output
    import pyarrow.parquet as pq

    row = pq.read_table(data / "test.parquet").to_pylist()[0]
    assert USER_PROMPT.split("{history}")[0] in row["prompt"]
    args = ["eval", "proxy", "--data", str(data), "--split", "test", "--model", f"rel={model}"]
    args += ["--explicit-spec", "rel", "--permutations", "2", "--out", str(tmp_path / "eval")]
    args += ["--out-json", str(tmp_path / "eval.json"), "--out-md", str(tmp_path / "eval.md")]
    out = runner.invoke(app, args)
    assert out.exit_code == 0, out.output
    result = json.loads((tmp_path / "eval.json").read_text())
    assert set(result["rankers"]) == {"bm25", "rel"}
    assert result["prompt_spec"]["template"] == "official"
    assert result["rankers"]["rel"]["invariance"]["permutations"] == 2
