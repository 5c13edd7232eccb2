"""BM25 coarse filter on ``bm25s`` (Lucene BM25, k1=1.5, b=0.75), over whole rendered sessions
(date line plus ``speaker: text`` turns), with English stemming/stopwords and jieba for Chinese.

The index of a haystack is built once and kept in the filter's ``HaystackCache``
(``memsifter.coarse.cache``), keyed by the sessions' content fingerprints and memoised by their
identity, so every question over the same haystack reuses it; only the query is analysed per
call. The cache is the filter's one extension point for caching: pass ``cache=`` to bound it
differently (``ByteBoundedBM25`` bounds it in bytes), read it as ``filter.cache``.
"""

from __future__ import annotations

from collections.abc import Sequence

import bm25s
import numpy as np

from memsifter.coarse.base import CoarseFilter
from memsifter.coarse.cache import Haystack, HaystackCache

# Kept importable from here, its home before it had a module of its own.
from memsifter.coarse.incremental import IncrementalBM25 as IncrementalBM25
from memsifter.data.types import Ranking, Session
from memsifter.text import Analyzer, get_analyzer

DEFAULT_CACHE_SIZE = 64


class BM25Filter(CoarseFilter):
    """Ranks sessions by BM25. Indexes are cached in ``cache`` (a ``HaystackCache`` of
    ``cache_size`` entries unless one is given); ``build_index`` is the hook a subclass overrides
    to index differently. Not thread-safe: share one behind ``LockedCoarse``."""

    name = "bm25"

    def __init__(
        self,
        k1: float = 1.5,
        b: float = 0.75,
        method: str = "lucene",
        language: str = "english",
        cache_size: int | None = None,
        *,
        cache: HaystackCache[bm25s.BM25] | None = None,
    ) -> None:
        if cache is not None and cache_size is not None:
            raise ValueError("pass cache_size or cache, not both: a cache carries its own bound")
        self.k1, self.b, self.method, self.language = k1, b, method, language
        self.analyzer: Analyzer = get_analyzer(language)
        self.cache: HaystackCache[bm25s.BM25] = (
            cache
            if cache is not None
            else HaystackCache(DEFAULT_CACHE_SIZE if cache_size is None else cache_size)
        )

    @property
    def cache_size(self) -> int:
        """The most indexes (and identity memos) kept: the cache's ``max_entries``."""
        return self.cache.max_entries

    @cache_size.setter
    def cache_size(self, value: int) -> None:
        self.cache.max_entries = value

    def build_index(self, sessions: Sequence[Session]) -> bm25s.BM25:
        """A fresh bm25s index of ``sessions`` (uncached: ``index``/``score`` cache it)."""
        # Term ids straight from the analyzer: bm25s's own path from term strings loops over every
        # token in Python again. Which id a term gets does not change any score.
        ids, vocab = self.analyzer.term_ids(s.render() for s in sessions)
        # bm25s cannot index an empty document; the empty term (id 0) keeps positions aligned.
        ids = [doc or [0] for doc in ids]
        model = bm25s.BM25(k1=self.k1, b=self.b, method=self.method)
        model.index((ids, vocab), show_progress=False)
        return model

    def _cached_index(self, haystack: Haystack) -> bm25s.BM25:
        model = self.cache.get(haystack.key)
        if model is None:
            model = self.build_index(haystack.sessions)
            self.cache.put(haystack, model)
        return model

    def index(self, sessions: Sequence[Session]) -> None:
        self._cached_index(self.cache.resolve(sessions))

    def score(self, query: str, sessions: Sequence[Session]) -> Ranking:
        if not sessions:
            return Ranking(ids=(), source=self.name)
        haystack = self.cache.resolve(sessions)
        model = self._cached_index(haystack)
        vocab = model.vocab_dict
        q = [t for t in self.analyzer(query) if t in vocab]
        scores = model.get_scores(q) if q else np.zeros(len(sessions), dtype=np.float32)
        # The order and values of base.rank_by_scores (stable argsort of float64 scores, ties in
        # input order), without its per-session Python loop, which cost more than the scoring.
        s64 = np.asarray(scores, dtype=np.float64)
        order = np.argsort(-s64, kind="stable")
        return Ranking(
            ids=tuple(haystack.ids[order].tolist()),
            scores=tuple(s64[order].tolist()),
            source=self.name,
        )


class ByteBoundedBM25(BM25Filter):
    """A ``BM25Filter`` like ``like`` whose cache is bounded in (estimated) bytes as well as in
    entries: a ``HaystackCache`` with ``max_bytes``.

    A plain filter keeps up to ``cache_size`` indexes, and identity memos that each hold the
    sessions they were built from. A client sending 1.8 MB haystacks to the service's
    ``/v1/rank`` thus grew the process by over a gigabyte before the entry bound bit; here the
    least recently used indexes go once their estimated size passes ``max_bytes``, memos go with
    their index, and one haystack keeps one memo however often its content is resent as new
    objects. The index in use is always kept, even when it alone is over the bound."""

    def __init__(self, like: BM25Filter, max_bytes: int) -> None:
        super().__init__(
            like.k1,
            like.b,
            like.method,
            like.language,
            cache=HaystackCache(like.cache_size, max_bytes=max_bytes),
        )

    @property
    def max_bytes(self) -> int:
        bound = self.cache.max_bytes
        assert bound is not None  # set by __init__; a HaystackCache's bound never changes
        return bound

    @property
    def held_bytes(self) -> int:
        return self.cache.held_bytes
