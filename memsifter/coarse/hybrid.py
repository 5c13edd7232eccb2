"""Reciprocal-rank fusion (Cormack et al., 2009) of any coarse filters: score(d) = sum over
members of w_m / (k + rank_m(d)), rank 1-based, k = 60 by default."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from memsifter.coarse.base import CoarseFilter, rank_by_scores
from memsifter.data.types import Ranking, Session
from memsifter.errors import MemSifterError


def rrf(
    orders: Sequence[np.ndarray], n: int, k: float = 60.0, weights: Sequence[float] | None = None
) -> np.ndarray:
    """Fused scores of ``n`` items: each order lists item positions best first (an order may
    leave items out: they get nothing from it), and contributes ``w / (k + rank)``, rank from 1.
    The one home of RRF: the hybrid filter and the recall service's bookmark fusion use it."""
    fused = np.zeros(n, dtype=np.float64)
    for i, order in enumerate(orders):
        w = 1.0 if weights is None else weights[i]
        fused[np.asarray(order, dtype=np.int64)] += w / (k + np.arange(1, len(order) + 1))
    return fused


class HybridFilter(CoarseFilter):
    def __init__(
        self,
        members: Sequence[CoarseFilter],
        k: float = 60.0,
        weights: Sequence[float] | None = None,
    ) -> None:
        if len(members) < 2:
            raise MemSifterError("a hybrid filter needs at least two members")
        if weights is not None and len(weights) != len(members):
            raise MemSifterError(f"{len(weights)} weights for {len(members)} hybrid members")
        self.members = list(members)
        self.weights = list(weights) if weights is not None else [1.0] * len(members)
        self.k = k
        self.name = "hybrid:" + "+".join(m.name for m in members)

    def index(self, sessions: Sequence[Session]) -> None:
        for m in self.members:
            m.index(sessions)

    def score(self, query: str, sessions: Sequence[Session]) -> Ranking:
        pos = {s.id: i for i, s in enumerate(sessions)}
        orders = [[pos[sid] for sid in m.score(query, sessions).ids] for m in self.members]
        fused = rrf(
            [np.array(o, dtype=np.int64) for o in orders], len(sessions), self.k, self.weights
        )
        return rank_by_scores(sessions, fused, self.name)
