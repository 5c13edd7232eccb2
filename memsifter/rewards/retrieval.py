"""The retrieval reward R_ret: NDCG@k of the gold sessions in a ranking, in [0, 1].

It is the warm-up signal of reward shaping (:mod:`memsifter.rewards.shaping`): labels are cheap
and dense early in training, when the answer reward of an untrained proxy is mostly noise. Gold
relevance is binary and the ideal ranking puts every gold session first, so 1 means all gold
sessions lead the ranking.

NDCG comes from ``ir-measures`` (pytrec_eval), the same code as the retrieval benchmark, never a
hand-written DCG. Rankings are handed over with rank-derived scores, so pytrec_eval cannot reorder
them (see :mod:`memsifter.ir_metrics`). Measured cost: about 0.1 ms per ranking, nothing
next to one working-LLM call. A ranking that names no gold session, an empty ranking, and an empty
gold set all score 0.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Sequence

import ir_measures
from ir_measures import nDCG

from memsifter.ir_metrics import qrels_from_gold, rankings_to_run

DEFAULT_RETRIEVAL_K = 10


def retrieval_rewards(
    rankings: Sequence[Sequence[Hashable]],
    gold: Collection[Hashable],
    k: int = DEFAULT_RETRIEVAL_K,
) -> list[float]:
    """NDCG@k of each ranking against one gold set, in one ir-measures call.

    Items may be session ids or prompt positions, as long as rankings and gold use the same
    kind; they are compared by ``str``. Every gold item counts towards the ideal DCG, so the
    caller decides which gold sessions the ranking could have shown (the reward service passes
    the gold sessions that are among the prompt's candidates)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not gold or not rankings:
        return [0.0] * len(rankings)
    qids = [str(i) for i in range(len(rankings))]
    run = rankings_to_run(
        {q: [str(x) for x in ranking] for q, ranking in zip(qids, rankings, strict=True)}
    )
    qrels = qrels_from_gold({q: [str(g) for g in gold] for q in qids})
    out = dict.fromkeys(qids, 0.0)
    for metric in ir_measures.iter_calc([nDCG @ k], qrels, run):
        out[metric.query_id] = float(metric.value)
    return [out[q] for q in qids]


def retrieval_reward(
    ranking: Sequence[Hashable], gold: Collection[Hashable], k: int = DEFAULT_RETRIEVAL_K
) -> float:
    """NDCG@k of one ranking (best first) against the gold items."""
    return retrieval_rewards([ranking], gold, k)[0]
