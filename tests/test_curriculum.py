"""Curriculum sampling: the priority formula, per-source top-priority selection with a seeded
tie-break, the explicit random fallback, the rankings file (format and errors), and the report."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from memsifter.errors import DataError
from memsifter.training.curriculum import (
    CurriculumConfig,
    Example,
    priority,
    read_rankings,
    score_examples,
    select,
    write_rankings,
    write_report,
)


def _example(qid: str, gold_rank: int | None, source: str = "a", n: int = 20) -> Example:
    """One gold session at coarse rank ``gold_rank`` (None: gold not in the prompt)."""
    order = tuple(range(n))
    gold = () if gold_rank is None else (order[gold_rank],)
    return Example(qid, source, gold, order)


def _ndcg_at(rank: int) -> float:
    # One gold item at 0-based rank r: DCG = 1/log2(r+2), ideal DCG = 1 (r < 10).
    return 1.0 / math.log2(rank + 2) if rank < 10 else 0.0


def test_priority_hand_values() -> None:
    assert priority(0.2) == pytest.approx(1.0)
    assert priority(0.7) == pytest.approx(0.5)
    assert priority(0.0) == pytest.approx(0.8)
    assert priority(1.0) == pytest.approx(0.2)
    assert priority(0.5, anchor=0.5) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="NDCG"):
        priority(1.5)


def test_scores_use_the_shared_ndcg() -> None:
    exs = [_example("q0", 0), _example("q3", 3), _example("q12", 12), _example("none", None)]
    scored = score_examples(exs)
    assert [s.ndcg for s in scored] == pytest.approx([1.0, _ndcg_at(3), 0.0, 0.0])
    assert all(s.scored_by == "coarse" for s in scored)
    assert scored[1].priority == pytest.approx(1 - abs(_ndcg_at(3) - 0.2))


def test_selection_takes_top_priority_per_source() -> None:
    ranks = [0, 1, 2, 3, 5, 7, 9, 15, None]
    exs = [_example(f"a{r}", r, "a") for r in ranks] + [_example(f"b{r}", r, "b") for r in ranks]
    keep, report = select(exs, {"a": 3, "b": 5}, CurriculumConfig(), seed=0)
    kept = [exs[i] for i in keep]
    assert keep == sorted(keep)
    for source, count in (("a", 3), ("b", 5)):
        mine = [e for e in exs if e.source == source]
        prio = {
            e.qid: priority(_ndcg_at(r) if r is not None else 0.0)
            for e, r in zip(mine, ranks, strict=True)
        }
        chosen = {e.qid for e in kept if e.source == source}
        assert len(chosen) == count and f"{source}None" not in chosen  # no gold: not eligible
        # Every kept example is at least as good as every dropped eligible one.
        eligible = set(prio) - {f"{source}None"}
        assert min(prio[q] for q in chosen) >= max(prio[q] for q in eligible - chosen) - 1e-9
    # rank 9 (NDCG 0.289) is the closest to 0.2 of these.
    assert "a9" in {e.qid for e in kept}
    assert report.note.startswith("no rankings given") and report.scored_by == "coarse"
    by = {s.source: s for s in report.sources}
    assert by["a"].n_pool == 8 and by["a"].n_selected == 3 and sum(by["a"].hist_after) == 3
    assert sum(report.hist_before) == 16 and sum(report.hist_after) == 8
    # The formula over every row picks the gold-less example (priority 0.8) over rank 3 (0.77).
    loose, _ = select(exs, {"a": 5, "b": 0}, CurriculumConfig(require_gold=False), seed=0)
    strict, _ = select(exs, {"a": 5, "b": 0}, CurriculumConfig(), seed=0)
    assert "aNone" in {exs[i].qid for i in loose} and "a3" not in {exs[i].qid for i in loose}
    assert "a3" in {exs[i].qid for i in strict} and "aNone" not in {exs[i].qid for i in strict}


def test_ties_broken_by_seed_stably() -> None:
    exs = [_example(f"q{i}", 4) for i in range(30)]  # all the same priority
    picks = {seed: select(exs, {"a": 5}, seed=seed)[0] for seed in (0, 1, 2)}
    assert picks[0] == select(exs, {"a": 5}, seed=0)[0]
    assert len({tuple(p) for p in picks.values()}) > 1


def test_count_none_or_above_pool_keeps_everything() -> None:
    exs = [_example(f"q{i}", i % 12) for i in range(6)]
    assert select(exs, {"a": None})[0] == list(range(6))
    assert select(exs, {"a": 100})[0] == list(range(6))
    with pytest.raises(DataError, match="no count"):
        select(exs, {"b": 3})


def test_random_fallback_deterministic_per_seed() -> None:
    exs = [_example(f"q{i}", i % 12) for i in range(50)]
    cfg = CurriculumConfig(strategy="random")
    a0, rep = select(exs, {"a": 10}, cfg, seed=0)
    assert a0 == select(exs, {"a": 10}, cfg, seed=0)[0]
    assert a0 != select(exs, {"a": 10}, cfg, seed=1)[0]
    assert len(a0) == 10 and rep.strategy == "random" and "random sampling" in rep.note
    # Not the curriculum's choice.
    assert a0 != select(exs, {"a": 10}, CurriculumConfig(), seed=0)[0]


def test_unknown_strategy_is_an_error() -> None:
    with pytest.raises(ValueError, match="strategy"):
        CurriculumConfig(strategy="anchor")


def test_rankings_replace_the_coarse_order(tmp_path: Path) -> None:
    exs = [_example("q0", 0), _example("q1", 0)]
    path = write_rankings(tmp_path / "r.jsonl", [("q0", [5, 0]), ("val", [1])])
    rankings = read_rankings(path, {"q0": 20, "q1": 20, "val": 3})
    assert rankings == {"q0": (5, 0), "val": (1,)}
    keep, report = select(exs, {"a": 1}, rankings=rankings, rankings_file=str(path))
    scored = {e["qid"]: e for e in report.examples}
    assert scored["q0"]["scored_by"] == "rankings"
    assert scored["q0"]["ndcg"] == pytest.approx(_ndcg_at(1))
    assert scored["q1"]["scored_by"] == "coarse" and scored["q1"]["ndcg"] == 1.0
    assert report.scored_by == "mixed" and report.n_rankings_ignored == 1
    assert keep == [0]  # NDCG 0.63 is closer to 0.2 than 1.0


def test_empty_ranking_scores_zero(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"qid": "q0", "ranking": [], "step": 3}\n\n')
    rankings = read_rankings(path, {"q0": 20})
    assert score_examples([_example("q0", 0)], rankings)[0].ndcg == 0.0


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ('{"qid": "nope", "ranking": [0]}', "unknown qid 'nope'"),
        ('{"qid": "q0", "ranking": [0, 1', "not a JSON line"),
        ('["q0", [0]]', "expected an object"),
        ('{"ranking": [0]}', "qid must be"),
        ('{"qid": "q0", "ranking": "0, 1"}', "list of integer"),
        ('{"qid": "q0", "ranking": [0, true]}', "list of integer"),
        ('{"qid": "q0", "ranking": [0, 3]}', r"positions \[3\] are outside"),
        ('{"qid": "q0", "ranking": [1, 1]}', "repeats"),
    ],
)
def test_bad_rankings_lines(tmp_path: Path, line: str, match: str) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"qid": "q1", "ranking": [0]}\n' + line + "\n")
    with pytest.raises(DataError, match=match) as e:
        read_rankings(path, {"q0": 3, "q1": 3})
    assert "line 2" in str(e.value) and str(path) in str(e.value)


def test_duplicate_and_missing_rankings_file(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"qid": "q0", "ranking": [0]}\n{"qid": "q0", "ranking": [1]}\n')
    with pytest.raises(DataError, match="twice"):
        read_rankings(path, {"q0": 3})
    with pytest.raises(DataError, match="not found"):
        read_rankings(tmp_path / "missing.jsonl", {"q0": 3})


def test_report_files(tmp_path: Path) -> None:
    exs = [_example(f"q{i}", i % 12, "ab"[i % 2]) for i in range(20)]
    _, report = select(exs, {"a": 4, "b": None})
    js, png = write_report(report, tmp_path)
    data = json.loads(js.read_text())
    assert data["strategy"] == "curriculum" and data["anchor"] == 0.2 and data["k"] == 10
    assert len(data["bin_edges"]) == 11
    assert sum(data["hist_before"]) == 20 and sum(data["hist_after"]) == 14
    assert sum(e["selected"] for e in data["examples"]) == 14
    assert png.read_bytes()[:4] == b"\x89PNG"
