"""``LockedCoarse``: any coarse filter made safe to share between threads."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from memsifter.coarse.base import CoarseFilter, Selection
from memsifter.data.tokens import SessionTokenCache, TokenCounter
from memsifter.data.types import Ranking, Session


class LockedCoarse(CoarseFilter):
    """``inner`` behind one re-entrant lock: filters keep unsynchronised caches (``BM25Filter``'s
    ``HaystackCache``, the dense filters' embeddings), so request threads, and the proxy's prompt
    builder, take turns."""

    def __init__(self, inner: CoarseFilter) -> None:
        self.inner = inner
        self.name = inner.name
        self._lock = threading.RLock()

    def index(self, sessions: Sequence[Session]) -> None:
        with self._lock:
            self.inner.index(sessions)

    def score(self, query: str, sessions: Sequence[Session]) -> Ranking:
        with self._lock:
            return self.inner.score(query, sessions)

    def select(
        self,
        query: str,
        sessions: Sequence[Session],
        budget_tokens: int,
        counter: TokenCounter | SessionTokenCache | None = None,
        max_sessions: int | None = None,
    ) -> Selection:
        with self._lock:
            return self.inner.select(query, sessions, budget_tokens, counter, max_sessions)
