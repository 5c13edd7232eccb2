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
        self.k1, self.b, self.method, self.language = k1, b, method, language
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


class IncrementalBM25:
    """BM25 over a document set that grows and shrinks, for the recall service's per-user index.

    bm25s bakes IDF and length normalisation into its score matrix at ``index`` time, so it cannot
    take one more document without a full rebuild (xhluca/bm25s#5, #98). Here the same analyzer
    fills postings (term -> documents and term frequencies) and the same formula
    ``BM25Filter`` uses (bm25s ``lucene``: ``idf = ln(1 + (N - df + 0.5) / (df + 0.5))`` and
    ``tf / (tf + k1 (1 - b + b dl / avgdl))``, summed over query tokens, repeats included) is
    evaluated at query time from live statistics. Adding or removing a document costs its own
    terms; a query costs the postings of its terms. Scores agree with a ``BM25Filter`` built on
    the same live documents (tested), up to float32 rounding in bm25s.

    Not thread-safe: the caller serialises ``add``/``remove`` against ``scores``.
    """

    def __init__(self, k1: float = 1.5, b: float = 0.75, language: str = "english") -> None:
        self.k1, self.b = k1, b
        self.analyzer: Analyzer = get_analyzer(language)
        self._slot: dict[str, int] = {}  # live document id -> slot
        self._ids: list[str] = []  # slot -> id (dead slots keep theirs until compaction)
        self._terms: list[dict[str, int] | None] = []  # slot -> term counts; None once removed
        self._length = np.zeros(16, dtype=np.float64)  # slot -> length (empty documents: 1)
        self._postings: dict[str, dict[int, int]] = {}  # term -> {slot: tf}, live slots only
        self._arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # term -> (slots, tfs)
        self._total_length = 0.0

    def __len__(self) -> int:
        return len(self._slot)

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self._slot

    def add(self, doc_id: str, text: str) -> None:
        """Index ``text`` as ``doc_id``; an id already present is replaced."""
        if doc_id in self._slot:
            self.remove(doc_id)
        counts: dict[str, int] = {}
        for term in self.analyzer(text):
            counts[term] = counts.get(term, 0) + 1
        slot = len(self._ids)
        if slot == len(self._length):
            self._length = np.concatenate([self._length, np.zeros_like(self._length)])
        length = float(max(sum(counts.values()), 1))  # bm25s gives an empty document one token
        self._length[slot] = length
        self._total_length += length
        self._ids.append(doc_id)
        self._terms.append(counts)
        self._slot[doc_id] = slot
        for term, tf in counts.items():
            self._postings.setdefault(term, {})[slot] = tf
            self._arrays.pop(term, None)

    def remove(self, doc_id: str) -> bool:
        slot = self._slot.pop(doc_id, None)
        if slot is None:
            return False
        counts = self._terms[slot] or {}
        self._terms[slot] = None
        self._total_length -= self._length[slot]
        for term in counts:
            postings = self._postings[term]
            del postings[slot]
            if not postings:
                del self._postings[term]
            self._arrays.pop(term, None)
        if len(self._ids) > 64 and len(self._slot) < len(self._ids) // 2:
            self._compact()
        return True

    def _compact(self) -> None:
        live = [(doc_id, self._terms[slot]) for doc_id, slot in self._slot.items()]
        lengths = {doc_id: self._length[slot] for doc_id, slot in self._slot.items()}
        self._slot, self._ids, self._terms, self._postings, self._arrays = {}, [], [], {}, {}
        self._length = np.zeros(max(16, 2 * len(live)), dtype=np.float64)
        for new, (doc_id, counts) in enumerate(live):
            self._slot[doc_id] = new
            self._ids.append(doc_id)
            self._terms.append(counts)
            self._length[new] = lengths[doc_id]
            for term, tf in (counts or {}).items():
                self._postings.setdefault(term, {})[new] = tf

    def _posting_arrays(self, term: str) -> tuple[np.ndarray, np.ndarray] | None:
        arrays = self._arrays.get(term)
        if arrays is None:
            postings = self._postings.get(term)
            if not postings:
                return None
            arrays = self._arrays[term] = (
                np.fromiter(postings.keys(), dtype=np.int64, count=len(postings)),
                np.fromiter(postings.values(), dtype=np.float64, count=len(postings)),
            )
        return arrays

    def slots(self, doc_ids: Sequence[str]) -> np.ndarray:
        """The slots of live ``doc_ids`` (an unknown id is a KeyError); valid until the next
        ``remove``, which may compact."""
        return np.fromiter((self._slot[d] for d in doc_ids), dtype=np.int64, count=len(doc_ids))

    def slot_scores(self, query: str) -> np.ndarray:
        """BM25 of ``query`` for every slot (dead slots score 0); index it with ``slots``."""
        acc = np.zeros(len(self._ids), dtype=np.float64)
        n = len(self._slot)
        if n == 0:
            return acc
        avgdl = self._total_length / n
        for term in self.analyzer(query):
            arrays = self._posting_arrays(term)
            if arrays is None:
                continue
            where, tf = arrays
            df = len(where)
            idf = np.log(1.0 + (n - df + 0.5) / (df + 0.5))
            norm = self.k1 * (1.0 - self.b + self.b * self._length[where] / avgdl)
            acc[where] += idf * tf / (tf + norm)
        return acc

    def scores(self, query: str, doc_ids: Sequence[str]) -> np.ndarray:
        """BM25 of ``query`` for each of ``doc_ids`` (live ids; an unknown id is a KeyError)."""
        return self.slot_scores(query)[self.slots(doc_ids)]
