"""How a short ranking is scored: omission must never pay.

The proxy may name fewer candidates than its prompt showed. Serving and evaluation complete such a
ranking with the coarse order (``ParsedRanking.complete``), so what the model left out still
reaches the working LLM, in an order the model did not choose. The reward must not let omission
beat ranking: if a one-id ranking were shown whole at every tier, it would earn s_1 - s_0 on every
tier and never be judged on what a deeper tier would have shown.

So, **for scoring only** (``CompletionReward.ranking`` and the logs keep the model's own ids), a
short ranking is completed with the candidates it omitted:

* **R_ans** (:func:`answer_ranking`): the omitted candidates follow in a fixed order that carries
  no information about the question's answer: candidate positions sorted by
  ``sha256(f"{question}\\n{position}")`` (UTF-8, compared as bytes), which
  :func:`omission_order` computes. The order depends only on the question text and the number of
  candidates, never on the ranking or the sessions' content, so it is as good as a random draw
  for the working LLM, and the same for every completion of a group (which keeps their shared
  prefixes sharing working-LLM calls). Every tier k then shows k sessions, as it does for a full
  ranking.
* **R_ret** (:func:`retrieval_ranking`): the omitted candidates follow in the order worst for the
  ranking: non-gold first (in prompt order), gold last. With binary relevance NDCG is then the
  minimum over every way of ranking the omitted candidates after the given prefix, so naming
  fewer candidates never scores above naming them all.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence


def omission_order(question: str, n: int) -> tuple[int, ...]:
    """All candidate positions ``0 … n-1`` ordered by ``sha256(f"{question}\\n{position}")``:
    the fixed, uninformative order in which omitted candidates are appended for R_ans."""
    return tuple(
        sorted(range(n), key=lambda i: hashlib.sha256(f"{question}\n{i}".encode()).digest())
    )


def answer_ranking(
    ids: Sequence[int], question: str, n: int, order: Sequence[int] | None = None
) -> tuple[int, ...]:
    """``ids`` followed by every candidate position in ``0 … n-1`` it omitted, in
    :func:`omission_order` (pass ``order`` to reuse one already computed for this question)."""
    ranked = tuple(ids)
    if len(ranked) >= n:
        return ranked
    given = set(ranked)
    tail = order if order is not None else omission_order(question, n)
    return ranked + tuple(i for i in tail if i not in given)


def retrieval_ranking(ids: Sequence[int], n: int, gold: Collection[int]) -> tuple[int, ...]:
    """``ids`` followed by the candidate positions it omitted, worst first for NDCG: the non-gold
    ones in prompt order, then the gold ones."""
    ranked = tuple(ids)
    if len(ranked) >= n:
        return ranked
    given, gold_set = set(ranked), set(gold)
    omitted = [i for i in range(n) if i not in given]
    return (
        ranked
        + tuple(i for i in omitted if i not in gold_set)
        + tuple(i for i in omitted if i in gold_set)
    )
