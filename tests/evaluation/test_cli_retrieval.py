"""End to end: `memsifter eval retrieval` on the synthetic LoCoMo fixture writes the promised
files with the promised keys, and bad input exits with a named error (not a traceback)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from memsifter.cli import app

KEYS = {
    "n_questions",
    "ndcg@1",
    "ndcg@5",
    "ndcg@10",
    "recall@1",
    "recall@5",
    "recall@10",
    "mrr",
    "by_category",
    "latency_ms",
}


def test_eval_retrieval_bm25(tmp_path: Path, locomo_mini_path: Path) -> None:
    out = tmp_path / "run"
    res = CliRunner().invoke(
        app,
        [
            "eval",
            "retrieval",
            "--dataset",
            "locomo",
            "--data",
            str(locomo_mini_path),
            "--retriever",
            "bm25",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    m = json.loads((out / "metrics.json").read_text())
    assert KEYS <= set(m)
    assert m["n_questions"] == m["n_questions_total"] - m["n_questions_without_evidence"]
    for k in ("ndcg@1", "ndcg@5", "recall@10", "mrr"):
        assert 0.0 <= m[k] <= 1.0
    assert m["ndcg@5"] > 0.5  # topical fixture: BM25 must find most gold sessions
    assert set(m["latency_ms"]) >= {"p50", "p95"}
    assert (out / "report.md").read_text().startswith("# Retrieval report")
    assert (out / "recall_at_k.png").read_bytes()[:4] == b"\x89PNG"


def test_eval_retrieval_seeded_sample(tmp_path: Path, locomo_mini_path: Path) -> None:
    """--sample-questions ranks a seeded N of the scoreable questions, kept in file order: the
    same seed picks the same questions (so every filter is scored on one sample)."""

    def run(name: str, seed: int) -> tuple[dict, list[str]]:
        out = tmp_path / name
        args = ["eval", "retrieval", "--data", str(locomo_mini_path), "--out", str(out)]
        res = CliRunner().invoke(app, [*args, "--sample-questions", "3", "--seed", str(seed)])
        assert res.exit_code == 0, res.output
        qids = [ln.split()[0] for ln in (out / "run.trec").read_text().splitlines()]
        return json.loads((out / "metrics.json").read_text()), list(dict.fromkeys(qids))

    m, qids = run("a", 0)
    assert m["n_questions"] == m["n_questions_ranked"] == 3 and m["sample_questions"] == 3
    assert m["n_questions_total"] - m["n_questions_without_evidence"] > 3
    assert len(qids) == 3 and run("b", 0)[1] == qids
    others = {tuple(run(f"s{seed}", seed)[1]) for seed in range(1, 5)}
    assert others - {tuple(qids)}  # another seed, another sample


def test_eval_retrieval_two_retrievers_32k(tmp_path: Path, locomo_mini_path: Path) -> None:
    out = tmp_path / "run"
    # "hybrid:bm25+bm25" keeps this fast (no model) while exercising fusion end to end.
    res = CliRunner().invoke(
        app,
        [
            "eval",
            "retrieval",
            "--data",
            str(locomo_mini_path),
            "--retriever",
            "bm25",
            "--retriever",
            "hybrid:bm25+bm25",
            "--haystack",
            "2000",
            "--conversations",
            "0,1",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    for sub in ("bm25", "hybrid_bm25_bm25"):
        m = json.loads((out / sub / "metrics.json").read_text())
        assert KEYS <= set(m) and m["haystack"] == "2000"
        assert m["conversations"] == ["0", "1"]
    assert "hybrid:bm25+bm25" in (out / "report.md").read_text()


def test_eval_retrieval_bad_input(tmp_path: Path, locomo_mini_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(
        app, ["eval", "retrieval", "--data", str(tmp_path / "nope.json"), "--out", str(tmp_path)]
    )
    assert res.exit_code == 2 and "file not found" in res.output and "nope.json" in res.output
    res = runner.invoke(
        app,
        [
            "eval",
            "retrieval",
            "--data",
            str(locomo_mini_path),
            "--retriever",
            "tfidf",
            "--out",
            str(tmp_path),
        ],
    )
    assert res.exit_code == 2 and "unknown coarse filter 'tfidf'" in res.output
    res = runner.invoke(
        app,
        [
            "eval",
            "retrieval",
            "--data",
            str(locomo_mini_path),
            "--haystack",
            "huge",
            "--out",
            str(tmp_path),
        ],
    )
    assert res.exit_code == 2 and "unknown haystack 'huge'" in res.output


def test_data_stats_reports_repairs(locomo_mini_path: Path) -> None:
    res = CliRunner().invoke(app, ["data", "stats", "--data", str(locomo_mini_path)])
    assert res.exit_code == 0
    assert "without usable evidence" in res.output and "repaired evidence" in res.output
