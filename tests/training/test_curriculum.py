"""Curriculum sampling: the priority formula (on the absolute and on the attainable NDCG scale),
per-source top-priority selection with a seeded tie-break, the explicit random fallback, the
rankings file (format and errors), and the report."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from memsifter.errors import DataError
from memsifter.rewards.retrieval import retrieval_reward
from memsifter.training.rldata.curriculum import (
    CurriculumSettings,
    Example,
    attainable,
    carry_rankings,
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


@pytest.mark.parametrize("scale", ["attainable", "absolute"])
def test_selection_takes_top_priority_per_source(scale: str) -> None:
    # 20 candidates, one gold: gold last scores NDCG@10 = 0, so both scales are the same here.
    ranks = [0, 1, 2, 3, 5, 7, 9, 15, None]
    exs = [_example(f"a{r}", r, "a") for r in ranks] + [_example(f"b{r}", r, "b") for r in ranks]
    keep, report = select(exs, {"a": 3, "b": 5}, CurriculumSettings(scale=scale), seed=0)
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
    # Source a's pool (with gold) has the coarse top-1 gold once in 8; near tau = 0.2 the
    # selection keeps none of it: the position prior the selection shows the policy.
    assert by["a"].coarse_top1_gold_before == pytest.approx(1 / 8)
    assert by["a"].coarse_top1_gold_after == 0.0
    # The formula over every row picks the gold-less example (priority 0.8) over rank 3 (0.77).
    loose, _ = select(
        exs, {"a": 5, "b": 0}, CurriculumSettings(require_gold=False, scale=scale), seed=0
    )
    strict, _ = select(exs, {"a": 5, "b": 0}, CurriculumSettings(scale=scale), seed=0)
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
    cfg = CurriculumSettings(strategy="random")
    a0, rep = select(exs, {"a": 10}, cfg, seed=0)
    assert a0 == select(exs, {"a": 10}, cfg, seed=0)[0]
    assert a0 != select(exs, {"a": 10}, cfg, seed=1)[0]
    assert len(a0) == 10 and rep.strategy == "random" and "random sampling" in rep.note
    # Not the curriculum's choice.
    assert a0 != select(exs, {"a": 10}, CurriculumSettings(), seed=0)[0]


def test_unknown_strategy_is_an_error() -> None:
    with pytest.raises(ValueError, match="strategy"):
        CurriculumSettings(strategy="anchor")
    with pytest.raises(ValueError, match="curriculum.scale must be one of"):
        CurriculumSettings(scale="relative")
    assert CurriculumSettings().scale == "attainable"


# --- the attainable scale ----------------------------------------------------------------------


def test_attainable_hand_values() -> None:
    # n = 4, one gold: gold first is 1, gold last is the floor 1/log2(5) and rescales to 0.
    floor = 1 / math.log2(5)
    assert attainable(1.0, 4, [2], 10) == 1.0
    assert attainable(floor, 4, [2], 10) == pytest.approx(0.0)
    mid = _ndcg_at(1)
    assert attainable(mid, 4, [2], 10) == pytest.approx((mid - floor) / (1 - floor))
    # Below the floor (a ranking that leaves gold out) clamps to 0.
    assert attainable(0.0, 4, [2], 10) == 0.0
    # Long lists: gold last is beyond k, the floor is 0 and the scale is the raw NDCG.
    assert attainable(_ndcg_at(3), 20, [7], 10) == pytest.approx(_ndcg_at(3))
    # Nothing to get wrong (every candidate gold, or one candidate): always 1.
    assert attainable(1.0, 2, [0, 1], 10) == 1.0 and attainable(1.0, 1, [0], 10) == 1.0
    # Two gold of 5: the worst ranking puts both last.
    worst = retrieval_reward([0, 2, 4, 1, 3], [1, 3], 10)
    assert attainable(worst, 5, [1, 3], 10) == pytest.approx(0.0)
    assert attainable(retrieval_reward([1, 3, 0, 2, 4], [1, 3], 10), 5, [3, 1], 10) == 1.0


@pytest.mark.parametrize("n", [2, 4, 7, 11, 30])
def test_gold_last_scores_zero_and_gold_first_one(n: int) -> None:
    last, first = _example("last", n - 1, n=n), _example("first", 0, n=n)
    a_last, a_first = score_examples([last, first], scale="attainable")
    assert a_last.priority == pytest.approx(priority(0.0))  # d = 0: 1 - tau
    assert a_first.priority == pytest.approx(priority(1.0))
    # The report's NDCG is raw NDCG either way.
    b_last, b_first = score_examples([last, first], scale="absolute")
    assert (a_last.ndcg, a_first.ndcg) == (b_last.ndcg, b_first.ndcg)
    assert b_first.ndcg == 1.0
    assert b_last.priority == pytest.approx(priority(b_last.ndcg))
    if n <= 10:  # gold last is still inside the cutoff: raw NDCG cannot reach 0
        assert b_last.ndcg >= 1 / math.log2(11) and b_last.priority != a_last.priority
    # A prompt without gold in it scores 0 on both scales.
    (none,) = score_examples([_example("none", None, n=n)], scale="attainable")
    assert none.ndcg == 0.0 and none.priority == pytest.approx(priority(0.0))


def test_short_lists_no_longer_simply_pick_the_worst_ranked() -> None:
    """With 4 candidates every raw NDCG@10 is >= 0.43 > tau, so the paper's formula prefers the
    prompts whose gold the coarse filter ranks last; on the attainable scale "near the bottom of
    what the prompt allows" (gold third of four) is preferred, and gold last is no longer first."""
    # Three prompts each with the gold candidate at coarse rank 0, 1, 2 and 3 of 4.
    exs = [Example(f"r{r}-{i}", "a", (r,), (0, 1, 2, 3)) for i in range(3) for r in range(4)]

    def qids(keep: list[int]) -> set[str]:
        return {exs[i].qid.split("-")[0] for i in keep}

    absolute, _ = select(exs, {"a": 3}, CurriculumSettings(scale="absolute"), seed=0)
    assert qids(absolute) == {"r3"}  # the worst-ranked prompts, and nothing else
    scaled, rep = select(exs, {"a": 3}, CurriculumSettings(), seed=0)
    assert qids(scaled) == {"r2"}  # d = 0.12, the closest to tau = 0.2
    six, _ = select(exs, {"a": 6}, CurriculumSettings(), seed=0)
    assert qids(six) == {"r2", "r1"}  # then d = 0.35 (priority 0.85) before gold last (0.8)
    # The report keeps raw NDCG: the selection's mean is that of gold third of four.
    (sel,) = rep.sources
    assert sel.ndcg_mean_after == pytest.approx(_ndcg_at(2))


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


def test_rankings_are_carried_to_another_build_by_session_id() -> None:
    """A ranking of one build's prompts, in another build's positions: the same sessions in
    the same order whatever each prompt's order; a session the other prompt lacks is dropped
    and counted, one it shows that was never ranked is counted; a question with no ranking is
    refused by count and qid."""

    def row(qid: str, ids: list[str]) -> dict[str, object]:
        return {"qid": qid, "candidates": json.dumps([{"id": i, "turns": []} for i in ids])}

    ranked = [row("q0", ["a", "b", "c", "d"]), row("q1", ["x", "y"])]
    # The other build: newest first, and its smaller budget cut "a"; q1 shows one more.
    rows = [row("q0", ["d", "c", "b"]), row("q1", ["z", "y", "x"])]
    carried = carry_rankings({"q0": [2, 0, 3, 1], "q1": [1, 0]}, ranked, rows)
    assert carried.rankings == {"q0": (1, 0, 2), "q1": (1, 2)}  # c, d, b and y, x
    assert (carried.dropped, carried.unranked) == (1, 1)
    with pytest.raises(DataError, match=r"1 question\(s\) have no ranking to carry .*'q1'"):
        carry_rankings({"q0": [0]}, ranked, rows)
