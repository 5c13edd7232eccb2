"""BM25 coarse filter on ``bm25s`` (Lucene BM25, k1=1.5, b=0.75), over whole rendered sessions
(date line plus ``speaker: text`` turns), with English stemming/stopwords and jieba for Chinese.

The index of a haystack is built once and cached by the sessions' content fingerprints, so every
question over the same haystack reuses it; only the query is analysed per call.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import bm25s
import numpy as np

from memsifter.coarse.base import CoarseFilter, rank_by_scores
from memsifter.data.types import Ranking, Session
from memsifter.text import Analyzer, get_analyzer


class BM25Filter(CoarseFilter):
    name = "bm25"

    def __init__(self, k1: float = 1.5, b: float = 0.75, method: str = "lucene",
                 language: str = "english", cache_size: int = 64) -> None:
        self.k1, self.b, self.method = k1, b, method
        self.analyzer: Analyzer = get_analyzer(language)
        self._indexes: OrderedDict[tuple[str, ...], bm25s.BM25] = OrderedDict()
        self.cache_size = cache_size

    def _key(self, sessions: Sequence[Session]) -> tuple[str, ...]:
        return tuple(s.fingerprint for s in sessions)

    def _build(self, sessions: Sequence[Session]) -> bm25s.BM25:
        corpus = [self.analyzer(s.render()) for s in sessions]
        # bm25s cannot index an empty document; a sentinel keeps positions aligned.
        corpus = [toks or ["\x00empty"] for toks in corpus]
        model = bm25s.BM25(k1=self.k1, b=self.b, method=self.method)
        model.index(corpus, show_progress=False)
        return model

    def _get(self, sessions: Sequence[Session]) -> bm25s.BM25:
        key = self._key(sessions)
        model = self._indexes.get(key)
        if model is None:
            model = self._indexes[key] = self._build(sessions)
            if len(self._indexes) > self.cache_size:
                self._indexes.popitem(last=False)
        else:
            self._indexes.move_to_end(key)
        return model

    def index(self, sessions: Sequence[Session]) -> None:
        self._get(sessions)

    def score(self, query: str, sessions: Sequence[Session]) -> Ranking:
        if not sessions:
            return Ranking(ids=(), source=self.name)
        model = self._get(sessions)
        vocab = model.vocab_dict
        q = [t for t in self.analyzer(query) if t in vocab]
        scores = model.get_scores(q) if q else np.zeros(len(sessions), dtype=np.float32)
        return rank_by_scores(sessions, scores, self.name)
