"""BM25 coarse filter on ``bm25s`` (Lucene BM25, k1=1.5, b=0.75), over whole rendered sessions
(date line plus ``speaker: text`` turns), with English stemming/stopwords and jieba for Chinese.

The index of a haystack is built once and cached by the sessions' content fingerprints, so every
question over the same haystack reuses it; only the query is analysed per call. Fingerprints hash
each whole rendered session, which on a 1M-token haystack costs ~50x a BM25 query, so the key is
also memoised by the identity of the (frozen) Session objects scored.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple

import bm25s
import numpy as np

from memsifter.coarse.base import CoarseFilter
from memsifter.data.types import Ranking, Session
from memsifter.text import Analyzer, get_analyzer


class _Seen(NamedTuple):
    # Holding the Session objects keeps their id()s from being reused by other objects, so an
    # identity hit always means these same frozen sessions and ``key`` is still their content.
    sessions: tuple[Session, ...]
    key: tuple[str, ...]
    ids: np.ndarray  # object array of session ids, for vectorised ranking


class BM25Filter(CoarseFilter):
    name = "bm25"

    def __init__(
        self,
        k1: float = 1.5,
        b: float = 0.75,
        method: str = "lucene",
        language: str = "english",
        cache_size: int = 64,
    ) -> None:
        self.k1, self.b, self.method = k1, b, method
        self.analyzer: Analyzer = get_analyzer(language)
        self._indexes: OrderedDict[tuple[str, ...], bm25s.BM25] = OrderedDict()
        self._seen: OrderedDict[tuple[int, ...], _Seen] = OrderedDict()
        self._last: _Seen | None = None
        self.cache_size = cache_size

    def _key(self, sessions: Sequence[Session]) -> tuple[str, ...]:
        return tuple(s.fingerprint for s in sessions)

    def _build(self, sessions: Sequence[Session]) -> bm25s.BM25:
        # Term ids straight from the analyzer: bm25s's own path from term strings loops over every
        # token in Python again. Which id a term gets does not change any score.
        ids, vocab = self.analyzer.term_ids(s.render() for s in sessions)
        # bm25s cannot index an empty document; the empty term (id 0) keeps positions aligned.
        ids = [doc or [0] for doc in ids]
        model = bm25s.BM25(k1=self.k1, b=self.b, method=self.method)
        model.index((ids, vocab), show_progress=False)
        return model

    def _resolve(self, sessions: Sequence[Session]) -> _Seen:
        last = self._last
        # Tuple equality checks identity first, element by element in C: the common case, every
        # question over one haystack, costs microseconds and no hashing of the id tuple.
        if last is not None and last.sessions == tuple(sessions):
            return last
        ident = tuple(map(id, sessions))
        seen = self._seen.get(ident)
        if seen is None:
            seen = self._seen[ident] = _Seen(
                tuple(sessions),
                self._key(sessions),
                np.array([s.id for s in sessions], dtype=object),
            )
            if len(self._seen) > self.cache_size:
                self._seen.popitem(last=False)
        else:
            self._seen.move_to_end(ident)
        self._last = seen
        return seen

    def _get(self, sessions: Sequence[Session], key: tuple[str, ...]) -> bm25s.BM25:
        model = self._indexes.get(key)
        if model is None:
            model = self._indexes[key] = self._build(sessions)
            if len(self._indexes) > self.cache_size:
                self._indexes.popitem(last=False)
        else:
            self._indexes.move_to_end(key)
        return model

    def index(self, sessions: Sequence[Session]) -> None:
        self._get(sessions, self._resolve(sessions).key)

    def score(self, query: str, sessions: Sequence[Session]) -> Ranking:
        if not sessions:
            return Ranking(ids=(), source=self.name)
        seen = self._resolve(sessions)
        model = self._get(sessions, seen.key)
        vocab = model.vocab_dict
        q = [t for t in self.analyzer(query) if t in vocab]
        scores = model.get_scores(q) if q else np.zeros(len(sessions), dtype=np.float32)
        # The order and values of base.rank_by_scores (stable argsort of float64 scores, ties in
        # input order), without its per-session Python loop, which cost more than the scoring.
        s64 = np.asarray(scores, dtype=np.float64)
        order = np.argsort(-s64, kind="stable")
        return Ranking(
            ids=tuple(seen.ids[order].tolist()), scores=tuple(s64[order].tolist()), source=self.name
        )
