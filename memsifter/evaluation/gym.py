"""Scoring rankings in the memory gym: how often the useful session comes first, and how often
the gym's working LLM answers right from a ranking's top-k.

Rankings are prompt positions of an RL data split (``memsifter data rl`` on a gym world), as a
model's greedy completion parses (never completed from the coarse order: a failed parse ranks
nothing). Per question:

* ``ndcg@1_useful``: 1 when the first id is the useful session (one relevant session, so NDCG@1
  is a hit at 1); only questions that have one (not the no-memory ones);
* ``answer_acc@k`` for k in 1, 2, 3, 5, 8: exact match of the gym reader's answer from the top-k
  sessions the ranking names (fewer when it names fewer), shown in the answerer's configured
  order; ``answer_acc@1`` and ``@3`` are the headline, the rest are the reward's tiers;
* ``s_0``: the answer with no memory (1 on no-memory questions, 0 on the rest);
* ``parsed``: whether the completion gave a ranking.

The reader is :mod:`memsifter.llm.gym` behind an ordinary :class:`~memsifter.qa.answerer.Answerer`,
the same prompt the reward service renders, so eval and reward cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from memsifter.llm.gym import GymBackend
from memsifter.qa.answerer import Answerer
from memsifter.qa.scores import task_score
from memsifter.rewards.columns import sessions_from_column

TIERS: tuple[int, ...] = (1, 2, 3, 5, 8)


def gym_answerer(memory_order: str = "chronological") -> Answerer:
    return Answerer(GymBackend(), window_tokens=4096, max_new_tokens=16, memory_order=memory_order)


def score_rankings(
    rows: Sequence[Mapping[str, Any]],
    rankings: Sequence[Sequence[int]],
    parsed: Sequence[bool] | None = None,
    answerer: Answerer | None = None,
) -> dict[str, np.ndarray]:
    """Per-question values (module docstring) for ``rankings[i]`` of ``rows[i]``; the useful
    metric is NaN on rows without a useful session."""
    answerer = answerer or gym_answerer()
    if len(rows) != len(rankings):
        raise ValueError(f"{len(rows)} rows but {len(rankings)} rankings")
    out: dict[str, list[float]] = {"ndcg@1_useful": [], "s_0": [], "parsed": []}
    for k in TIERS:
        out[f"answer_acc@{k}"] = []
    prompts: list[str] = []
    for i, (row, ranking) in enumerate(zip(rows, rankings, strict=True)):
        cands = sessions_from_column(row["candidates"])
        useful = set(row["useful_positions"] or ())
        out["ndcg@1_useful"].append(
            float(bool(ranking) and ranking[0] in useful) if useful else float("nan")
        )
        out["parsed"].append(float(parsed[i]) if parsed is not None else 1.0)
        for prefix in [(), *(tuple(ranking[:k]) for k in TIERS)]:
            prompts.append(
                answerer.render(
                    row["question"],
                    [cands[p] for p in prefix],
                    row["question_date"],
                    times=list(prefix),
                )
            )
    answers = iter(answerer.answer_texts(prompts))
    for row in rows:
        out["s_0"].append(task_score(next(answers), row["answer"], "em"))
        for k in TIERS:
            out[f"answer_acc@{k}"].append(task_score(next(answers), row["answer"], "em"))
    return {k: np.asarray(v, dtype=float) for k, v in out.items()}


def means(values: Mapping[str, np.ndarray]) -> dict[str, float]:
    return {
        k: float(np.nanmean(v)) if np.isfinite(v).any() else float("nan") for k, v in values.items()
    }


__all__ = ["TIERS", "gym_answerer", "means", "score_rankings"]
