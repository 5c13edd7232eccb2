"""The coarse filter's opinion as a feature of each candidate, not as its place in the prompt.

Shown in the coarse filter's order (``order: coarse``), a candidate's *position* carries the
coarse opinion, and the cheapest way for a small model to match the filter is to copy the
position: every LoCoMo ranker trained that way answered one fixed permutation (issue 40). With
``coarse_weight: λ`` in the prompt spec the first-token head's score for candidate i becomes

    s_i = h_i + λ · c_i,    c_i = −ln(1 + r_i),

where h_i is the head's own score (a label logit, or a marker logit), and r_i the candidate's
0-based rank in the coarse order (its ``coarse_order``: the RL row's column, the builder's
ranking, or the caller's prior, e.g. the recall service's fused coarse + bookmark order). The
Plackett–Luce policy is over the fused scores, so with a flat head ``exp(s_i) ∝ (1 + r_i)^−λ``:
a Zipf prior over the coarse ranks, λ its exponent (λ = 1: the coarse top is twice as likely
first as the second). A large λ makes an untrained proxy rank as the coarse filter does;
training then learns the residual h, read from content at any position, which can move a
candidate against the filter by as much as the residual outweighs the prior.

The rank and not the raw score: one λ then means the same for BM25, BGE-M3 and the service's
RRF fusion, whose scores live on unrelated scales. Every path reads the same function: the
trainers (:mod:`memsifter.training.pl_grpo`, :mod:`memsifter.training.listwise_sft`), the
proxy's answer (eval, validation, serving, every engine: the fusion happens in the client, on
the scores the engine returns).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from memsifter.ranker.first_token import RankingHeadError


def prior(coarse_order: Sequence[int], n: int) -> list[float]:
    """``c_i = −ln(1 + r_i)`` for each of ``n`` candidates; a candidate the order leaves out
    ranks after every one it lists."""
    if len(set(coarse_order)) != len(coarse_order) or any(not 0 <= p < n for p in coarse_order):
        raise RankingHeadError(
            f"coarse order {list(coarse_order)} is not a ranking of {n} candidates "
            "(positions repeat or fall outside 0..n-1)"
        )
    rank = {p: r for r, p in enumerate(coarse_order)}
    last = len(rank)
    return [-math.log1p(rank.get(i, last)) for i in range(n)]


def fuse(scores: Sequence[float], coarse_order: Sequence[int] | None, weight: float) -> list[float]:
    """``scores`` plus ``weight`` times the prior of ``coarse_order`` (module doc). With a
    weight of 0 the scores come back as they are; with a weight and no order it is refused,
    naming what is missing, never ranked on the head alone."""
    if not weight or len(scores) < 2:  # one candidate has no order to fuse with
        return list(scores)
    if coarse_order is None:
        raise RankingHeadError(
            f"the prompt spec fuses the head with the coarse order (coarse_weight: {weight}), "
            "but this prompt came without one"
        )
    return [s + weight * c for s, c in zip(scores, prior(coarse_order, len(scores)), strict=True)]


def prior_tensor(
    coarse_orders: Sequence[Sequence[int]], n_candidates: Sequence[int], like: Any
) -> Any:
    """The priors of a batch as a ``[B, width]`` tensor (``like``'s width, device and dtype; 0
    past a row's candidates, whose scores are -inf already)."""
    import torch

    width = like.shape[-1]
    rows = []
    for order, n in zip(coarse_orders, n_candidates, strict=True):
        c = prior(order, n)
        rows.append(c + [0.0] * (width - n))
    return torch.tensor(rows, dtype=like.dtype, device=like.device)


def row_orders(rows: Sequence[Any], weight: float) -> list[list[int]] | None:
    """A batch's coarse orders (each row's ``coarse_order``) when ``weight`` fuses them; None
    without a weight, or when a row lacks one (:func:`fuse_tensor` then refuses by name)."""
    if not weight or any(r.get("coarse_order") is None for r in rows):
        return None
    return [[int(p) for p in r["coarse_order"]] for r in rows]


def fuse_tensor(
    scores: Any,
    coarse_orders: Sequence[Sequence[int]] | None,
    n_candidates: Sequence[int],
    weight: float,
) -> Any:
    """:func:`fuse` for a ``[B, n]`` score tensor (the trainers' policy scores)."""
    if not weight:
        return scores
    if coarse_orders is None:
        raise RankingHeadError(
            f"the prompt spec fuses the head with the coarse order (coarse_weight: {weight}), "
            "but the batch's rows carry no coarse_order"
        )
    return scores + weight * prior_tensor(coarse_orders, n_candidates, scores)


__all__ = ["fuse", "fuse_tensor", "prior", "prior_tensor", "row_orders"]
