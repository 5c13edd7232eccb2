"""Retrieval metrics against hand-computed values (ir-measures does the computing)."""

from __future__ import annotations

import math

import pytest

from memsifter.ir_metrics import evaluate_rankings, recall_curve


def test_hand_computed_case() -> None:
    # q1: gold {a, c}, ranked a, b, c -> rel = 1, 0, 1
    # q2: gold {x}, ranked y, x       -> rel = 0, 1
    rankings = {"q1": ["a", "b", "c"], "q2": ["y", "x"]}
    gold = {"q1": ["a", "c"], "q2": ["x"]}
    m = evaluate_rankings(rankings, gold)
    ndcg5_q1 = (1 + 1 / math.log2(4)) / (1 + 1 / math.log2(3))
    ndcg5_q2 = (1 / math.log2(3)) / 1.0
    assert m["ndcg@1"] == pytest.approx((1 + 0) / 2)
    assert m["ndcg@5"] == pytest.approx((ndcg5_q1 + ndcg5_q2) / 2)
    assert m["ndcg@10"] == pytest.approx(m["ndcg@5"])
    assert m["recall@1"] == pytest.approx((0.5 + 0) / 2)
    assert m["recall@5"] == pytest.approx(1.0)
    assert m["mrr"] == pytest.approx((1 + 0.5) / 2)


def test_rank_order_not_docid_order() -> None:
    # pytrec_eval breaks score ties by doc id; we pass ranks, so "z" (ranked first) must count.
    m = evaluate_rankings({"q": ["z", "a"]}, {"q": ["z"]})
    assert m["ndcg@1"] == 1.0


def test_missing_or_empty_run_counts_as_zero() -> None:
    gold = {"q1": ["a"], "q2": ["b"], "q_noevidence": []}
    m = evaluate_rankings({"q1": ["a"], "q2": []}, gold)
    assert m["ndcg@1"] == pytest.approx(0.5)
    assert m["mrr"] == pytest.approx(0.5)
    assert evaluate_rankings({"q1": ["a"]}, gold)["recall@10"] == pytest.approx(0.5)


def test_recall_curve_monotone_and_hand_computed() -> None:
    curve = recall_curve({"q": ["a", "b", "c", "d"]}, {"q": ["b", "d"]}, max_k=4)
    assert curve == {1: 0.0, 2: 0.5, 3: 0.5, 4: 1.0}
