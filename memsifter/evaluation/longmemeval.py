"""LongMemEval's own retrieval metrics (Wu et al., ICLR 2025), named as the benchmark names them.

Implemented from the benchmark's definitions (``src/retrieval/eval_utils.py`` and
``run_retrieval.py`` in xiaowu0162/LongMemEval), not from its code:

* **Documents are user turns.** A session is indexed by its user turns only; a turn-level run
  ranks single user turns, the turn at position ``k`` (0-based, counting assistant turns) of
  session ``S`` being ``S_{k+1}``.
* **Labels.** A turn is relevant when it is a user turn of an answer session marked
  ``has_answer``. An answer session none of whose user turns is marked is relabelled as not an
  answer (its evidence is on the assistant side, which the benchmark does not index).
* **Who is averaged.** Every non-abstention question, as ``run_retrieval.py`` takes its means
  (``'_abs' not in question_id``). That includes the questions left with no relevant document
  after the relabelling (51 of the 470 non-abstention oracle questions, 50 of 468 in
  LongMemEval-S, mostly single-session-assistant): ``eval_utils`` gives them ``recall_any`` 0,
  ``recall_all`` 1 (all of nothing is found) and ``ndcg_any`` 0, and they stay in the mean. They
  are counted in ``n_no_target``; the means over only the questions with a target are kept
  apart, as ``with_target``, never as the benchmark's numbers. Abstention questions are left out.
* **Metrics at k.** ``recall_any@k``: some relevant document is in the top k. ``recall_all@k``:
  every one is. ``ndcg_any@k``: binary-relevance NDCG whose DCG weighs the first two positions
  alike, ``rel[0] + sum_{i>=1} rel[i] / log2(i + 1)`` (ir-measures and trec_eval use
  ``log2(i + 2)`` for every position, so their nDCG differs), over the ideal ordering of all
  relevant documents in the corpus.

Session-level numbers come from ranking sessions, turn-level ones from ranking user turns (the
benchmark's ``session`` and ``turn`` granularities); cutoffs are the benchmark's
1, 3, 5, 10, 30, 50.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from memsifter.data.types import Query

CUTOFFS: tuple[int, ...] = (1, 3, 5, 10, 30, 50)
LEVELS: tuple[str, ...] = ("session", "turn")
NAMES: tuple[str, ...] = ("recall_any", "recall_all", "ndcg_any")
USER = "user"


def dcg(relevances: Sequence[float], k: int) -> float:
    """The benchmark's DCG of the first ``k`` relevances: position 0 and 1 both weigh 1."""
    rel = list(relevances)[:k]
    if not rel:
        return 0.0
    return rel[0] + sum(r / math.log2(i + 1) for i, r in enumerate(rel[1:], start=1))


def ndcg_any(ranking: Sequence[str], relevant: Collection[str], k: int) -> float:
    """DCG of ``ranking``'s top ``k`` over the DCG of the ideal ranking; 0 without relevant
    documents. ``relevant`` must be documents of the ranked corpus (the ideal puts them all
    first)."""
    ideal = dcg([1.0] * len(relevant), k)
    if ideal == 0.0:
        return 0.0
    return dcg([1.0 if d in relevant else 0.0 for d in ranking[:k]], k) / ideal


def query_metrics(
    ranking: Sequence[str], relevant: Collection[str], cutoffs: Sequence[int] = CUTOFFS
) -> dict[str, float]:
    """``recall_any@k``, ``recall_all@k``, ``ndcg_any@k`` of one ranking, for every cutoff."""
    if isinstance(relevant, str):
        raise TypeError("relevant must be a collection of document ids, not one string")
    relevant = set(relevant)
    out: dict[str, float] = {}
    for k in cutoffs:
        if k < 1:
            raise ValueError(f"cutoffs must be >= 1, got {k}")
        top = set(ranking[:k])
        out[f"recall_any@{k}"] = float(any(d in top for d in relevant))
        out[f"recall_all@{k}"] = float(all(d in top for d in relevant))
        out[f"ndcg_any@{k}"] = ndcg_any(ranking, relevant, k)
    return out


def turn_doc_id(turn_id: str) -> str:
    """Our turn id ``<session>:<k>`` (0-based) as the benchmark's ``<session>_<k+1>``."""
    sid, sep, k = turn_id.rpartition(":")
    if not sep or not k.isdigit():
        raise ValueError(f"not a LongMemEval turn id '<session>:<index>': {turn_id!r}")
    return f"{sid}_{int(k) + 1}"


def _need_labels(q: Query) -> list[str]:
    if q.source != "longmemeval" or "answer_turn_ids" not in q.meta:
        raise ValueError(
            f"question {q.qid!r} has no LongMemEval turn labels (meta['answer_turn_ids']); "
            "load it with memsifter.data.load_longmemeval"
        )
    return list(q.meta["answer_turn_ids"])


def session_targets(q: Query) -> tuple[str, ...]:
    """The answer sessions that keep their label: those with a ``has_answer`` user turn."""
    if q.meta.get("abstention"):
        return ()
    marked = {t.rpartition(":")[0] for t in _need_labels(q)}
    return tuple(s for s in q.meta.get("answer_session_ids", ()) if s in marked)


def turn_targets(q: Query) -> tuple[str, ...]:
    """The relevant user turns, as benchmark turn ids."""
    if q.meta.get("abstention"):
        return ()
    return tuple(turn_doc_id(t) for t in _need_labels(q))


def user_sessions(q: Query) -> Query:
    """``q`` with every session reduced to its user turns (ids kept): what the benchmark indexes
    at session level. A session without user turns stays, empty, so the corpus keeps its size."""
    haystack = tuple(
        replace(s, turns=tuple(t for t in s.turns if t.speaker == USER)) for s in q.haystack
    )
    return replace(q, haystack=haystack)


def user_turns(q: Query) -> Query:
    """``q`` with one candidate per user turn (id ``<session>_<k+1>``, the session's date):
    the benchmark's turn-level corpus. Gold: the relevant turns."""
    haystack = tuple(
        replace(s, id=turn_doc_id(t.turn_id or f"{s.id}:{k}"), turns=(t,))
        for s in q.haystack
        for k, t in enumerate(s.turns)
        if t.speaker == USER
    )
    return replace(
        q,
        haystack=haystack,
        gold_session_ids=turn_targets(q),
        meta={**q.meta, "unit": "turn"},
    )


def mean_metrics(
    rankings: Mapping[str, Sequence[str]],
    relevant: Mapping[str, Collection[str]],
    level: str,
    cutoffs: Sequence[int] = CUTOFFS,
) -> dict[str, float]:
    """Means over every question of ``relevant``, named ``<level>/<metric>@k``: the benchmark's
    averaging, in which a question without relevant documents counts (recall_any 0, recall_all
    1, ndcg_any 0). Pass only the questions with a target for the ``with_target`` figure."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    if not relevant:
        raise ValueError("mean_metrics needs at least one question")
    missing = [qid for qid in relevant if qid not in rankings]
    if missing:
        raise ValueError(f"no ranking for {len(missing)} scored questions, e.g. {missing[:3]}")
    sums: dict[str, float] = defaultdict(float)
    for qid, rel in relevant.items():
        for name, v in query_metrics(rankings[qid], rel, cutoffs).items():
            sums[name] += v
    n = len(relevant)
    return {f"{level}/{name}@{k}": sums[f"{name}@{k}"] / n for name in NAMES for k in cutoffs}


def benchmark_report(
    queries: Sequence[Query],
    session_rankings: Mapping[str, Sequence[str]],
    turn_rankings: Mapping[str, Sequence[str]] | None = None,
    cutoffs: Sequence[int] = CUTOFFS,
) -> dict[str, Any]:
    """The benchmark's metrics for one retriever: flat means over every question
    (``session/recall_any@5`` ...), the same per question type, how many of them have no target,
    and apart from those (``with_target``) the means over the questions that have one.
    Abstention questions must already be out (they have no gold; eval retrieval drops them)."""
    abstention = [q.qid for q in queries if q.meta.get("abstention")]
    if abstention:
        raise ValueError(f"abstention questions are not scored, got {abstention[:3]}")
    if not queries:
        raise ValueError("benchmark_report needs at least one question")
    sessions = {q.qid: session_targets(q) for q in queries}
    turns = {q.qid: turn_targets(q) for q in queries}

    def means(qids: Collection[str]) -> dict[str, float]:
        if not qids:
            return {}
        out = mean_metrics(session_rankings, {q: sessions[q] for q in qids}, "session", cutoffs)
        if turn_rankings is not None:
            out.update(mean_metrics(turn_rankings, {q: turns[q] for q in qids}, "turn", cutoffs))
        return out

    no_target = [q for q in queries if not sessions[q.qid]]
    with_target = [q.qid for q in queries if sessions[q.qid]]
    by_type: dict[str, list[str]] = defaultdict(list)
    for q in queries:
        by_type[q.category or "none"].append(q.qid)
    return {
        "metrics": means(sessions),
        "n_questions": len(queries),
        "n_no_target": len(no_target),
        "no_target_qids": [q.qid for q in no_target],
        "with_target": {"n_questions": len(with_target), **means(with_target)},
        "by_category": {
            cat: {
                "n_no_target": sum(not sessions[q] for q in qids),
                **means(qids),
            }
            for cat, qids in sorted(by_type.items())
        },
    }
