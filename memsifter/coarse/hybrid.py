"""Reciprocal-rank fusion (Cormack et al., 2009) of any coarse filters: score(d) = sum over
members of w_m / (k + rank_m(d)), rank 1-based, k = 60 by default."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from memsifter.coarse.base import CoarseFilter, rank_by_scores
from memsifter.data.types import Ranking, Session
from memsifter.errors import MemSifterError


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
        fused = np.zeros(len(sessions), dtype=np.float64)
        for member, w in zip(self.members, self.weights, strict=True):
            for rank, sid in enumerate(member.score(query, sessions).ids, start=1):
                fused[pos[sid]] += w / (self.k + rank)
        return rank_by_scores(sessions, fused, self.name)
