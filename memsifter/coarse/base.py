"""The coarse-filter interface shared by eval, training data prep and the recall endpoint.

``score(query, sessions)`` ranks the given sessions (all of them, best first). ``select`` is the
production step in front of the proxy: when the whole history fits the proxy's window it passes
everything through untouched (as the paper does); otherwise it keeps the top-ranked sessions that
fit the budget.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from memsifter.data.tokens import SessionTokenCache, TokenCounter, get_counter
from memsifter.data.types import Ranking, Session


@dataclass(frozen=True)
class Selection:
    sessions: tuple[Session, ...]
    ranking: Ranking | None  # None when everything fit and no ranking was needed
    tokens: int
    dropped_ids: tuple[str, ...] = ()

    @property
    def cut(self) -> bool:
        return bool(self.dropped_ids)


def rank_by_scores(sessions: Sequence[Session], scores: np.ndarray, source: str) -> Ranking:
    """Descending by score; ties keep the input order so rankings are deterministic."""
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    return Ranking(
        ids=tuple(sessions[i].id for i in order),
        scores=tuple(float(scores[i]) for i in order),
        source=source,
    )


class CoarseFilter(ABC):
    name: str = "coarse"

    def index(self, sessions: Sequence[Session]) -> None:  # noqa: B027 - optional hook
        """Precompute whatever ``score`` needs for these sessions (embeddings, an inverted index).
        Calling it is optional: ``score`` computes and caches on first use."""

    @abstractmethod
    def score(self, query: str, sessions: Sequence[Session]) -> Ranking:
        """Rank ``sessions`` for ``query``, best first. Every input session appears once."""

    def select(
        self,
        query: str,
        sessions: Sequence[Session],
        budget_tokens: int,
        counter: TokenCounter | SessionTokenCache | None = None,
        max_sessions: int | None = None,
    ) -> Selection:
        """The best-scored sessions that fit ``budget_tokens`` (and, with ``max_sessions``, at
        most that many: the first-token head labels at most so many candidates)."""
        tokens = (
            counter
            if isinstance(counter, SessionTokenCache)
            else SessionTokenCache(counter or get_counter())
        )
        total = sum(tokens(s) for s in sessions)
        if total <= budget_tokens and (max_sessions is None or len(sessions) <= max_sessions):
            return Selection(sessions=tuple(sessions), ranking=None, tokens=total)
        ranking = self.score(query, sessions)
        by_id = {s.id: s for s in sessions}
        kept: list[Session] = []
        used = 0
        for sid in ranking.ids:
            if max_sessions is not None and len(kept) >= max_sessions:
                break
            n = tokens(by_id[sid])
            if used + n <= budget_tokens:
                kept.append(by_id[sid])
                used += n
        kept_ids = {s.id for s in kept}
        return Selection(
            sessions=tuple(kept),
            ranking=ranking,
            tokens=used,
            dropped_ids=tuple(s for s in ranking.ids if s not in kept_ids),
        )
