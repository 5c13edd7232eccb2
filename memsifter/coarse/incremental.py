"""``IncrementalBM25``: BM25 over a document set that grows and shrinks (the recall service's
per-user index), scored like ``BM25Filter`` without ever rebuilding."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from memsifter.text import Analyzer, get_analyzer


def lucene_weights(
    tf: np.ndarray, length: np.ndarray, df: int, n: int, avgdl: float, k1: float, b: float
) -> np.ndarray:
    """One query term's BM25 contribution to the documents in its postings (bm25s ``lucene``:
    ``idf = ln(1 + (N - df + 0.5) / (df + 0.5))`` times ``tf / (tf + k1 (1 - b + b dl /
    avgdl))``), for ``tf`` and document ``length`` arrays over those documents."""
    idf = np.log(1.0 + (n - df + 0.5) / (df + 0.5))
    # In place, in the expression's own order (IEEE + and * commute exactly, so the values are
    # bit-identical): a common term's 500K postings make two arrays, not six.
    norm = b * length
    norm /= avgdl
    norm += 1.0 - b
    norm *= k1
    norm += tf
    weights = idf * tf
    weights /= norm
    return weights


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
            self._drop_arrays(term)

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
            self._drop_arrays(term)
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

    def _drop_arrays(self, term: str) -> None:
        self._arrays.pop(term, None)

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
            length = self._length[where]
            acc[where] += lucene_weights(tf, length, len(where), n, avgdl, self.k1, self.b)
        return acc

    def scores(self, query: str, doc_ids: Sequence[str]) -> np.ndarray:
        """BM25 of ``query`` for each of ``doc_ids`` (live ids; an unknown id is a KeyError)."""
        return self.slot_scores(query)[self.slots(doc_ids)]
