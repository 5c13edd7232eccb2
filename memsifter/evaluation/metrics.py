"""Ranking metrics through ``ir-measures`` (pytrec_eval underneath), never hand-written NDCG.

Rankings are handed over as rank-derived scores (n - rank) so that pytrec_eval's own tie-breaking
(by document id) can never reorder what a ranker actually returned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import ir_measures
from ir_measures import RR, R, nDCG

DEFAULT_CUTOFFS = (1, 5, 10)


def _measures(cutoffs: Sequence[int]) -> dict[str, object]:
    out: dict[str, object] = {}
    for k in cutoffs:
        out[f"ndcg@{k}"] = nDCG @ k
    for k in cutoffs:
        out[f"recall@{k}"] = R @ k
    out["mrr"] = RR
    return out


def rankings_to_run(rankings: Mapping[str, Sequence[str]]) -> dict[str, dict[str, float]]:
    return {
        qid: {sid: float(len(ids) - r) for r, sid in enumerate(ids)}
        for qid, ids in rankings.items()
    }


def qrels_from_gold(gold: Mapping[str, Sequence[str]]) -> dict[str, dict[str, int]]:
    return {qid: {sid: 1 for sid in ids} for qid, ids in gold.items() if ids}


def _means(
    measures: Sequence[object],
    gold: Mapping[str, Sequence[str]],
    rankings: Mapping[str, Sequence[str]],
) -> dict[object, float]:
    qrels = qrels_from_gold(gold)
    if not qrels:
        return {m: 0.0 for m in measures}
    run = rankings_to_run({q: rankings.get(q, ()) for q in qrels})
    sums = dict.fromkeys(measures, 0.0)
    for metric in ir_measures.iter_calc(list(measures), qrels, run):
        sums[metric.measure] += metric.value
    # iter_calc skips queries with an empty run; dividing by all of them counts those as zeros,
    # so a ranker cannot raise its mean by returning nothing on hard queries.
    return {m: v / len(qrels) for m, v in sums.items()}


def evaluate_rankings(
    rankings: Mapping[str, Sequence[str]],
    gold: Mapping[str, Sequence[str]],
    cutoffs: Sequence[int] = DEFAULT_CUTOFFS,
) -> dict[str, float]:
    """Mean metrics over the queries that have gold sessions (others are not scoreable)."""
    measures = _measures(cutoffs)
    means = _means(list(measures.values()), gold, rankings)
    return {name: means[m] for name, m in measures.items()}


def recall_curve(
    rankings: Mapping[str, Sequence[str]], gold: Mapping[str, Sequence[str]], max_k: int = 20
) -> dict[int, float]:
    measures = {k: R @ k for k in range(1, max_k + 1)}
    means = _means(list(measures.values()), gold, rankings)
    return {k: means[m] for k, m in measures.items()}
