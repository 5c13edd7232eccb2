"""Ranking metrics through ``ir-measures`` (pytrec_eval underneath), never hand-written NDCG.

Rankings are handed over as rank-derived scores (n - rank) so that pytrec_eval's own tie-breaking
(by document id) can never reorder what a ranker actually returned. ``write_trec_run`` and
``write_trec_qrels`` write exactly that run and those judgments, so any TREC tool re-scores an
eval to our numbers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

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


def per_query(
    rankings: Mapping[str, Sequence[str]],
    gold: Mapping[str, Sequence[str]],
    cutoffs: Sequence[int] = DEFAULT_CUTOFFS,
) -> dict[str, dict[str, float]]:
    """``{metric: {qid: value}}`` over the queries that have gold, as :func:`evaluate_rankings`
    averages them (a query with an empty run scores 0): the input of paired comparisons."""
    measures = _measures(cutoffs)
    qrels = qrels_from_gold(gold)
    out: dict[str, dict[str, float]] = {name: dict.fromkeys(qrels, 0.0) for name in measures}
    if not qrels:
        return out
    names = {m: name for name, m in measures.items()}
    run = rankings_to_run({q: rankings.get(q, ()) for q in qrels})
    for metric in ir_measures.iter_calc(list(measures.values()), qrels, run):
        out[names[metric.measure]][metric.query_id] = metric.value
    return out


def read_trec_run(path: str | Path) -> dict[str, tuple[str, ...]]:
    """A run file :func:`write_trec_run` wrote, back as ``{qid: ids best first}``."""
    rows: dict[str, list[tuple[int, str]]] = {}
    for doc in ir_measures.read_trec_run(str(path)):
        rows.setdefault(doc.query_id, []).append((-doc.score, doc.doc_id))
    return {q: tuple(d for _, d in sorted(r)) for q, r in rows.items()}


def read_trec_qrels(path: str | Path) -> dict[str, tuple[str, ...]]:
    """A qrels file :func:`write_trec_qrels` wrote, back as ``{qid: relevant ids}``."""
    gold: dict[str, list[str]] = {}
    for q in ir_measures.read_trec_qrels(str(path)):
        if q.relevance > 0:
            gold.setdefault(q.query_id, []).append(q.doc_id)
    return {q: tuple(ids) for q, ids in gold.items()}


def recall_curve(
    rankings: Mapping[str, Sequence[str]], gold: Mapping[str, Sequence[str]], max_k: int = 20
) -> dict[int, float]:
    measures = {k: R @ k for k in range(1, max_k + 1)}
    means = _means(list(measures.values()), gold, rankings)
    return {k: means[m] for k, m in measures.items()}


def _check_trec_id(kind: str, value: str) -> str:
    # TREC files are whitespace-separated: an id with a space would shift every later column.
    if not value or any(c.isspace() for c in value):
        raise ValueError(f"{kind} {value!r} cannot go in a TREC file (empty or has whitespace)")
    return value


def write_trec_run(path: str | Path, rankings: Mapping[str, Sequence[str]], tag: str) -> None:
    """``rankings`` as a TREC run (``qid Q0 docid rank score tag``), the score ``n - rank`` as
    in :func:`rankings_to_run`, so trec_eval and ir-measures re-score exactly the order we
    scored (the retriever's own scores can tie, and ties are broken by document id there)."""
    tag = _check_trec_id("run tag", tag)
    with Path(path).open("w", encoding="utf-8") as fh:
        for qid, ids in rankings.items():
            _check_trec_id("question id", qid)
            for r, doc in enumerate(ids):
                fh.write(f"{qid} Q0 {_check_trec_id('document id', doc)} {r + 1} ")
                fh.write(f"{len(ids) - r} {tag}\n")


def write_trec_qrels(path: str | Path, gold: Mapping[str, Sequence[str]]) -> None:
    """The judgments our metrics used (``qid 0 docid 1``, relevant documents only); questions
    without gold are left out, as :func:`evaluate_rankings` leaves them out of the means."""
    with Path(path).open("w", encoding="utf-8") as fh:
        for qid, docs in qrels_from_gold(gold).items():
            _check_trec_id("question id", qid)
            for doc, rel in docs.items():
                fh.write(f"{qid} 0 {_check_trec_id('document id', doc)} {rel}\n")
