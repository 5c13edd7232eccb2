"""``StoredIndex``: one user's BM25 index on a replica, read from the postings the database
holds (``memsifter.serving.store.postings``) instead of rebuilt from the pages' text.

What a replica keeps of a user is small and bounded: the pages' pks and BM25 lengths in
chronological order (16 bytes a page, plus 16 for the pk lookup), and the postings and bookmark
rows of the terms queries have asked for (with their BM25 weights), as arrays grown in place by
doubling. Opening a user reads the first (one indexed scan, no text); a query reads the
postings of the terms it lacks; an ingest appends the new pages and the cached terms' new
postings, copying nothing already held. Nothing holds the pages' text: a recall reads its
top pages by pk.

Scores are ``IncrementalBM25``'s, from the same formula (``lucene_weights``) and the same
statistics (live pages, their summed lengths, a term's document frequency = its postings),
added in the same order (query tokens as the analyzer gives them, repeats included), so a
ranking equals the in-memory index's one, ties included (pages tied on score keep
chronological order).
"""

from __future__ import annotations

import threading
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from memsifter.coarse.incremental import lucene_weights
from memsifter.serving.store.packs import count_type
from memsifter.serving.store.postings import term_key
from memsifter.serving.store.records import IndexState, TermArrays

# What a cached term costs besides its arrays (its key, the dict slot, the array headers).
TERM_BYTES = 400
# A table of pk -> chronological position is kept while the user's pks span at most this many
# times their count (a user's pages interleave with other users' in one pk sequence): looking
# a common term's 500K postings up in it takes a tenth of the binary searches' time.
SLOT_SPAN = 4
_SLICE = 1 << 16
# A query term on more than 1/COMMON_SHARE of a user's pages is scored only at the pages that
# can make a recall's top (``StoredIndex._pruned``).
COMMON_SHARE = 8
PRUNE_MARGIN = 1e-9
PRUNE_GAIN = 2


class _Column:
    """An array that grows at its end in amortized O(1) a value, so that an ingest into a
    100K-page history copies nothing of it. Views of what it held stay as they were: an append
    writes past them, and a full buffer is copied into one twice its size, never changed in
    place. (A query's ``Evidence`` holds such views while an ingest appends.)"""

    __slots__ = ("_buffer", "_n")

    def __init__(self, values: np.ndarray) -> None:
        self._buffer, self._n = values, len(values)

    @property
    def array(self) -> np.ndarray:
        return self._buffer[: self._n]

    @property
    def nbytes(self) -> int:
        return int(self._buffer.nbytes)

    def extend(self, values: np.ndarray) -> None:
        kind = np.result_type(self._buffer.dtype, values.dtype)
        if kind != self._buffer.dtype:  # held narrow (a pack's counts): widened, never wrapped
            self._buffer = self._buffer.astype(kind)
        end = self._n + len(values)
        if end > len(self._buffer):
            grown = np.empty(max(end, 2 * len(self._buffer)), dtype=self._buffer.dtype)
            grown[: self._n] = self._buffer[: self._n]
            self._buffer = grown
        self._buffer[self._n : end] = values
        self._n = end


class _Cached:
    """A term's rows held by the index: values (tf, or bookmark weights) at the pages'
    chronological positions, and for postings their BM25 weights (valid while the index's
    statistics are at ``stats``: a warm query adds them instead of computing them again).
    Postings come in by pk (ascending) and their positions are looked up when a query first
    needs them: a common term that ``StoredIndex._pruned`` scores at a few pages is looked
    up there by pk instead. Positions move only when the index is opened again, which drops
    every cached term."""

    __slots__ = ("_values", "_positions", "_pks", "weights", "stats")

    def __init__(
        self,
        values: np.ndarray,
        *,
        positions: np.ndarray | None = None,
        pks: np.ndarray | None = None,
    ) -> None:
        self._values = _Column(values)
        self._positions = None if positions is None else _Column(positions)
        self._pks = None if pks is None else _Column(pks)
        self.weights: np.ndarray | None = None
        self.stats = -1

    @property
    def values(self) -> np.ndarray:
        return self._values.array

    @property
    def pks(self) -> np.ndarray | None:
        """The pages' pks (ascending) until positions are looked up; then None."""
        return None if self._pks is None else self._pks.array

    @property
    def positions(self) -> np.ndarray:
        assert self._positions is not None, "positions not looked up"
        return self._positions.array

    def locate(self, positions: np.ndarray) -> None:
        """Hold ``positions`` (of ``pks``, in their order) instead of the pks."""
        self._positions, self._pks = _Column(positions), None

    def extend(self, values: np.ndarray, keys: np.ndarray) -> None:
        """Append rows: ``keys`` are positions, or pks (above every pk held, ascending)
        while the positions are not looked up."""
        self._values.extend(values)
        held = self._positions if self._pks is None else self._pks
        assert held is not None
        held.extend(keys)
        self.weights = None

    @property
    def nbytes(self) -> int:
        keys = self._positions if self._pks is None else self._pks
        held = self._values.nbytes + (keys.nbytes if keys is not None else 0)
        return TERM_BYTES + held + (self.weights.nbytes if self.weights is not None else 0)


@dataclass(frozen=True)
class Evidence:
    """A query's scores over the pages that have any: ``positions`` (chronological, ascending)
    and per position the BM25 score and the summed bookmark weight; with the index's pages as
    they were when it was scored (``pks``, chronological), which an ingest or reopen running
    meanwhile does not change (the index swaps in new arrays, it never writes into these)."""

    positions: np.ndarray
    coarse: np.ndarray
    marks: np.ndarray
    pks: np.ndarray
    _order_pks: np.ndarray
    _order_pos: np.ndarray | None  # None: pk order is chronological
    # False: only the pages that can make the top asked for (``StoredIndex.evidence``)
    complete: bool = True

    def positions_of(self, pks: Sequence[int]) -> np.ndarray:
        """Chronological positions of ``pks`` in ``self.pks``; -1 for a page not there."""
        return _lookup(self._order_pks, self._order_pos, np.asarray(pks, dtype=np.int64))


def _lookup(order_pks: np.ndarray, order_pos: np.ndarray | None, pks: np.ndarray) -> np.ndarray:
    if not len(order_pks):
        return np.full(len(pks), -1, dtype=np.int64)
    at = np.searchsorted(order_pks, pks).clip(max=len(order_pks) - 1)
    return np.where(order_pks[at] == pks, at if order_pos is None else order_pos[at], -1)


def _counts(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Counts (BM25 lengths, tfs: whole numbers, read as floats from rows) in the narrowest
    unsigned type, as a pack holds them: appending them to a pack's counts widens the column
    only as far as they need (``_Column.extend``)."""
    values = np.asarray(values)
    if values.dtype.kind in "iu" or not len(values):
        return values
    return values.astype(count_type(values))


def _at_least_one(lengths: np.ndarray) -> np.ndarray:
    """BM25 lengths as ``IncrementalBM25`` counts them (a page without terms counts 1),
    copied only when one is below 1."""
    if len(lengths) and lengths.min() < 1:
        return np.maximum(lengths, 1)  # in the lengths' own type
    return lengths


def _slot_table(order_pks: np.ndarray, order_pos: np.ndarray | None) -> _Column | None:
    """pk - ``order_pks[0]`` -> chronological position (-1: no page), or None when the pks
    span more than ``SLOT_SPAN`` times their count."""
    if not len(order_pks):
        return None
    base = int(order_pks[0])
    span = int(order_pks[-1]) - base + 1
    if span > SLOT_SPAN * len(order_pks):
        return None
    if order_pos is None and span == len(order_pks):  # no pk missing: the table counts up
        return _Column(np.arange(span, dtype=np.int32))
    slots = np.full(span, -1, dtype=np.int32)
    # In slices: a cold open of a million pages touches no temporary of a million.
    for lo in range(0, len(order_pks), _SLICE):
        hi = min(lo + _SLICE, len(order_pks))
        at = order_pks[lo:hi] - base
        slots[at] = np.arange(lo, hi) if order_pos is None else order_pos[lo:hi]
    return _Column(slots)


def _slot_lookup(base: int, slots: np.ndarray, pks: np.ndarray) -> np.ndarray:
    at = pks - base
    if not len(at) or (at.min() >= 0 and at.max() < len(slots)):
        return slots[at].astype(np.intp)  # numpy indexes by intp: int32 would be cast per use
    inside = (at >= 0) & (at < len(slots))
    out = np.full(len(pks), -1, dtype=np.intp)
    out[inside] = slots[at[inside]]
    return out


def _merged(ascending: np.ndarray, more: np.ndarray) -> np.ndarray:
    """The union of ``ascending`` (unique) and ``more`` (unique), ascending: ``more`` (a few
    pages) placed by binary search, not the whole sorted again as ``np.union1d`` would."""
    if not len(more) or not len(ascending):
        return np.sort(more) if len(more) else ascending
    at = np.searchsorted(ascending, more)
    new = np.sort(
        more[(at == len(ascending)) | (ascending[at.clip(max=len(ascending) - 1)] != more)]
    )
    return np.insert(ascending, np.searchsorted(ascending, new), new)


def _is_ascending(values: np.ndarray) -> bool:
    return len(values) < 2 or bool(np.all(values[1:] > values[:-1]))


def _ascending(where: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``where`` and ``values`` sorted by ``where`` (as they come, when they are)."""
    if _is_ascending(where):
        return where, values
    order = np.argsort(where, kind="stable")
    return where[order], values[order]


def values_at(where: np.ndarray, values: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """``values`` (given at ascending positions ``where``) at ``positions``; 0 elsewhere."""
    out = np.zeros(len(positions), dtype=np.float64)
    if len(where) and len(positions):
        at = np.searchsorted(where, positions).clip(max=len(where) - 1)
        hit = where[at] == positions
        out[hit] = values[at[hit]]
    return out


class StoredIndex:
    """One user's stored BM25 index on this replica (see the module doc). ``open`` and
    ``catch_up`` move it to the store's state; ``evidence`` scores a query from postings the
    caller read with ``missing`` and handed to ``take``. Thread-safe."""

    def __init__(self, tenant: str, user: str, epoch: str, k1: float, b: float) -> None:
        self.tenant, self.user, self.epoch = tenant, user, epoch
        self.k1, self.b = k1, b
        self.version = -1
        self.analyzer: str | None = None
        self._pks = _Column(np.zeros(0, dtype=np.int64))  # chronological
        self._lengths = _Column(np.zeros(0, dtype=np.float64))
        self._order_pks = _Column(np.zeros(0, dtype=np.int64))  # pks ascending
        # Their chronological positions; None while pk order is chronological (the common
        # case: a history written in order), which a cold open then need not write down.
        self._order_pos: _Column | None = None
        self._slots: _Column | None = None  # the same, as a table by pk (``_slot_table``)
        self._total = 0.0
        self._min_length = 1.0  # the shortest page's BM25 length (``_pruned``'s bound)
        self._last_order: tuple[bool, object, int, int] | None = None
        self._stats = 0  # bumped whenever pages or their lengths change (weights go stale)
        self._terms: dict[str, _Cached] = {}
        self._marks: dict[str, _Cached] = {}
        self._cached_bytes = 0
        self._lock = threading.Lock()
        self.refreshing = threading.Lock()  # one catch-up with the store at a time

    def __len__(self) -> int:
        return len(self.pks)

    @property
    def pks(self) -> np.ndarray:
        """The pages' pks in chronological order."""
        return self._pks.array

    @property
    def lengths(self) -> np.ndarray:
        return self._lengths.array

    @property
    def nbytes(self) -> int:
        held = (self._pks, self._lengths, self._order_pks, self._order_pos, self._slots)
        return sum(c.nbytes for c in held if c is not None) + self._cached_bytes

    # -- following the store

    def open(self, state: IndexState) -> None:
        """Hold every page of ``state`` (``index_state`` without ``since``)."""
        with self._lock:
            pks = np.asarray(state.pks, dtype=np.int64)
            lengths = _at_least_one(_counts(state.lengths))
            order: np.ndarray | None = None
            order_pks = pks  # pages added in pk order (the common case) need no sort
            if not _is_ascending(pks):
                order = np.argsort(pks, kind="stable")
                order_pks = pks[order]
            self._pks, self._lengths = _Column(pks), _Column(lengths)
            self._order_pks = _Column(order_pks)
            self._order_pos = _Column(order) if order is not None else None
            self._slots = _slot_table(order_pks, order)
            self._total = float(lengths.sum())
            self._min_length = float(lengths.min()) if len(lengths) else 1.0
            self._last_order = state.last_order
            self._stats += 1
            # The cached terms lack whatever changed since (pages added out of order, or gone)
            # and their positions moved: queries read them again.
            self._clear()
            self.version, self.analyzer = state.version, state.analyzer

    def appends(self, state: IndexState) -> bool:
        """Whether ``state`` (a catch-up) only adds pages after every page held, with pks above
        every pk held: the common ingest, which ``catch_up`` takes without a reopen."""
        if not state.complete or state.analyzer != self.analyzer:
            return False
        if not len(state.pks):
            return True
        held = self._order_pks.array
        newest = held[-1] if len(held) else -1
        return (
            self._last_order is None
            or state.first_order is None
            or state.first_order > self._last_order
        ) and int(np.min(state.pks)) > newest

    def catch_up(self, state: IndexState, postings: TermArrays, marks: TermArrays) -> None:
        """Append the pages of ``state`` (``appends`` held), and the new pages' ``postings``
        and bookmark rows of the terms this index caches."""
        with self._lock:
            if state.version <= self.version:
                return
            start = len(self.pks)
            new_pks = np.asarray(state.pks, dtype=np.int64)
            lengths = _at_least_one(_counts(state.lengths))
            self._pks.extend(new_pks)
            self._lengths.extend(lengths)
            order = np.argsort(new_pks, kind="stable")
            self._order_pks.extend(new_pks[order])  # above every pk held (``appends``)
            in_order = bool(np.all(order[1:] > order[:-1]))
            if self._order_pos is not None or not in_order:
                if self._order_pos is None:  # pk order stops being chronological here
                    self._order_pos = _Column(np.arange(start))
                self._order_pos.extend(start + order)
            if start:
                self._extend_slots(new_pks[order], start + order)
            else:
                self._slots = _slot_table(self._order_pks.array, self._positions_in_order)
            self._total += float(lengths.sum())
            if len(lengths):
                self._min_length = min(self._min_length, float(lengths.min()))
            self._stats += 1
            if state.last_order is not None:
                self._last_order = state.last_order
            for cache, rows in ((self._terms, postings), (self._marks, marks)):
                for term, (pks, values) in rows.items():
                    entry = cache.get(term)
                    if entry is None:
                        continue
                    self._cached_bytes -= entry.nbytes
                    # Appended pages leave every held position where it was: only the new
                    # postings are looked up.
                    if cache is self._terms:
                        values = _counts(values)
                    if entry.pks is None:
                        entry.extend(values, self._positions(pks))
                    else:
                        order = np.argsort(pks, kind="stable")
                        entry.extend(values[order], pks[order])
                    self._cached_bytes += entry.nbytes
            self.version = state.version

    def _extend_slots(self, pks: np.ndarray, positions: np.ndarray) -> None:
        """Add appended pages (pks ascending, above every pk held) to the table by pk, or drop
        it once the pks span too much for it."""
        if self._slots is None or not len(pks):
            return
        base = int(self._order_pks.array[0])
        held = len(self._slots.array)
        span = int(pks[-1]) - base + 1
        if span > SLOT_SPAN * len(self.pks):
            self._slots = None
            return
        grown = np.full(span - held, -1, dtype=np.int32)
        grown[pks - base - held] = positions
        self._slots.extend(grown)

    @property
    def _positions_in_order(self) -> np.ndarray | None:
        """The chronological positions of the pks in ascending order (None: the same)."""
        return self._order_pos.array if self._order_pos is not None else None

    @property
    def caches_terms(self) -> bool:
        """Whether any term's rows are cached (a catch-up then reads the new pages' rows)."""
        return bool(self._terms or self._marks)

    def shed(self) -> None:
        """Drop the cached postings (an index over the cache's budget by itself)."""
        with self._lock:
            self._clear()

    def _clear(self) -> None:
        self._terms, self._marks, self._cached_bytes = {}, {}, 0

    # -- queries

    def missing(
        self, terms: Sequence[str], mark_terms: Sequence[str]
    ) -> tuple[list[str], list[str]]:
        """Which of ``terms`` (analysed query tokens) and ``mark_terms`` have no cached rows,
        as the store's keys."""
        with self._lock:
            keys = dict.fromkeys(term_key(t) for t in terms)
            return (
                [k for k in keys if k not in self._terms],
                [t for t in dict.fromkeys(mark_terms) if t not in self._marks],
            )

    def take(
        self,
        version: int,
        postings: TermArrays,
        marks: TermArrays,
        asked: tuple[Sequence[str], Sequence[str]],
    ) -> tuple[TermArrays, TermArrays]:
        """Cache terms read from the store at ``version`` (``asked``: the keys read, found or
        not) when it is this index's version; otherwise (an ingest between) hand them back for
        this query only, restricted to the pages this index holds."""
        with self._lock:
            if version == self.version:
                empty = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64))
                for cache, rows, keys in (
                    (self._terms, postings, asked[0]),
                    (self._marks, marks, asked[1]),
                ):
                    for key in keys:
                        pks, values = rows.get(key, empty)
                        self._put(cache, key, pks, values)
                return {}, {}
            return postings, marks

    def _put(
        self, cache: dict[str, _Cached], key: str, pks: np.ndarray, values: np.ndarray
    ) -> None:
        old = cache.pop(key, None)
        if old is not None:
            self._cached_bytes -= old.nbytes
        if cache is self._terms:  # postings: positions when a query needs them
            pks, values = _ascending(pks, values)
            entry = _Cached(values, pks=pks)
        else:
            entry = _Cached(values, positions=self._positions(pks))
        cache[key] = entry
        self._cached_bytes += entry.nbytes

    def _located(self, entry: _Cached) -> np.ndarray:
        """A cached term's positions, looked up now if they were not."""
        pks = entry.pks
        if pks is not None:
            self._cached_bytes -= entry.nbytes
            entry.locate(self._positions(pks))
            self._cached_bytes += entry.nbytes
        return entry.positions

    def _positions(self, pks: np.ndarray) -> np.ndarray:
        """Chronological positions of ``pks``; -1 for a page this index does not hold."""
        if self._slots is not None:
            return _slot_lookup(int(self._order_pks.array[0]), self._slots.array, pks)
        return _lookup(self._order_pks.array, self._positions_in_order, pks)

    def _rows(
        self,
        cache: dict[str, _Cached],
        extra: Mapping[str, tuple[np.ndarray, np.ndarray]],
        key: str,
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """A term's (positions, values) over held pages, from the cache or ``extra``."""
        entry = cache.get(key)
        if entry is not None:
            return self._located(entry), entry.values
        rows = extra.get(key)
        if rows is None:
            return None
        positions = self._positions(rows[0])
        keep = positions >= 0
        return positions[keep], rows[1][keep]

    def _weights(
        self, key: str, extra: Mapping[str, tuple[np.ndarray, np.ndarray]], n: int, avgdl: float
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """A term's (positions, BM25 weights) over held pages; None when it has no postings.
        A cached term keeps its weights until the statistics change."""
        entry = self._terms.get(key)
        if entry is not None and entry.stats == self._stats:
            assert entry.weights is not None
            return (entry.positions, entry.weights) if len(entry.values) else None
        rows = self._rows(self._terms, extra, key)
        if rows is None or not len(rows[0]):
            return None
        where, tf = rows
        weights = lucene_weights(tf, self.lengths[where], len(where), n, avgdl, self.k1, self.b)
        entry = self._terms.get(key)
        if entry is not None:  # cached: keep the weights with it
            self._cached_bytes -= entry.nbytes
            entry.weights, entry.stats = weights, self._stats
            self._cached_bytes += entry.nbytes
        return where, weights

    def evidence(
        self,
        terms: Sequence[str],
        mark_terms: Sequence[str],
        extra: tuple[TermArrays, TermArrays] = ({}, {}),
        top: tuple[int, int] | None = None,
    ) -> Evidence:
        """BM25 of the query tokens ``terms`` (repeats count) and the summed bookmark weights
        of ``mark_terms``, over the pages with any of either. With ``top`` (how many pages
        the caller ranks without a bookmark hit, and with one), over the pages that can
        change that ranking only (``_pruned``; the evidence is then not ``complete``)."""
        with self._lock:
            n = len(self.pks)
            marks = self._mark_sums(mark_terms, extra[1]) if n else None
            if top is not None and n:
                pruned = self._pruned(terms, extra[0], n, top[marks is not None], marks)
                if pruned is not None:
                    return self._found(pruned[0], pruned[1], marks, complete=False)
            coarse = np.zeros(n, dtype=np.float64)
            if n:
                self._accumulate(coarse, terms, extra[0], n)
            hit = coarse > 0  # faster than on the floats
            if marks is not None:
                hit[marks[0]] = True
            positions = np.flatnonzero(hit)
            return self._found(positions, coarse[positions], marks)

    def _mark_sums(
        self, mark_terms: Sequence[str], extra: Mapping[str, tuple[np.ndarray, np.ndarray]]
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """The pages with bookmark hits (ascending positions) and their summed weights, added
        in the terms' order; None for no hit."""
        found = [self._rows(self._marks, extra, t) for t in dict.fromkeys(mark_terms)]
        rows = [r for r in found if r is not None and len(r[0])]
        if not rows:
            return None
        marked, at = np.unique(np.concatenate([r[0] for r in rows]), return_inverse=True)
        sums = np.zeros(len(marked), dtype=np.float64)
        np.add.at(sums, at, np.concatenate([r[1] for r in rows]))
        hit = sums > 0
        return (marked[hit], sums[hit]) if hit.any() else None

    def _found(
        self,
        positions: np.ndarray,
        coarse: np.ndarray,
        marks: tuple[np.ndarray, np.ndarray] | None,
        complete: bool = True,
    ) -> Evidence:
        # No bookmark hit: zeros that take no memory (read-only, as ``Evidence`` is).
        if marks is None:
            held = np.broadcast_to(0.0, len(positions))
        else:
            held = values_at(marks[0], marks[1], positions)
        return Evidence(
            positions,
            coarse,
            held,
            self.pks,
            self._order_pks.array,
            self._positions_in_order,
            complete,
        )

    def _accumulate(
        self,
        coarse: np.ndarray,
        terms: Sequence[str],
        extra: Mapping[str, tuple[np.ndarray, np.ndarray]],
        n: int,
        skip: Container[str] = (),
    ) -> None:
        """Add the BM25 weights of ``terms`` (but ``skip``) into ``coarse`` (zeros), in the
        query's order: the order ``IncrementalBM25`` adds them in, so sums are equal."""
        avgdl = self._total / n
        first = True
        for term in terms:
            key = term_key(term)
            scored = None if key in skip else self._weights(key, extra, n, avgdl)
            if scored is None:
                continue
            # 0.0 + w is w exactly: the first term's weights are written, not added (a
            # common term's postings gathered and scattered once, not twice).
            if first:
                coarse[scored[0]] = scored[1]
            else:
                coarse[scored[0]] += scored[1]
            first = False

    def _pruned(
        self,
        terms: Sequence[str],
        extra: Mapping[str, tuple[np.ndarray, np.ndarray]],
        n: int,
        top: int,
        marks: tuple[np.ndarray, np.ndarray] | None,
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """The pages (ascending positions) whose exact scores decide the ``top`` best for
        ``terms`` and their ranks among every page, with those scores, without scoring every
        posting of the common terms (on more than 1/``COMMON_SHARE`` of the pages): MaxScore
        (Turtle and Flood, 1995). The other terms' sums make ``top`` pages score at least
        ``floor``; a common term adds at most its ``lucene_weights`` at its largest tf and the
        shortest page. With bookmark hits (``marks``: positions and summed weights), fusion
        ranks the first ``top`` bookmarked pages among every page by score, so the bar is the
        lowest of ``floor`` and their scores. A page whose sum plus those bounds stays below
        the bar is below every page that is ranked, ties included, and is left out; the rest
        are scored with every term, in the query's order. The other bookmarked pages are held
        as scoring 0: below every page ranked by score, and outside the head of theirs, no
        fused score of theirs can reach the top (``ranking._fused_top``). None when nothing
        would be saved: no common term, no other term, too few pages, bounds that rule nothing
        out, or so many pages left that scoring them costs more than scoring every posting
        (``PRUNE_GAIN``)."""
        keys = [term_key(t) for t in terms]
        tfs: dict[str, np.ndarray] = {}  # a term's tf over held pages (no positions needed)
        for key in dict.fromkeys(keys):
            entry = self._terms.get(key)
            rows = self._rows(self._terms, extra, key) if entry is None else None
            tf = entry.values if entry is not None else rows[1] if rows is not None else None
            if tf is not None and len(tf):
                tfs[key] = tf
        common = {k for k, tf in tfs.items() if len(tf) * COMMON_SHARE > n}
        if not common or len(common) == len(tfs):
            return None
        partial = np.zeros(n, dtype=np.float64)
        self._accumulate(partial, terms, extra, n, skip=common)
        hit = np.flatnonzero(partial > 0)
        if len(hit) <= top:
            return None
        sums = partial[hit]
        bar = float(np.partition(sums, len(hit) - top)[len(hit) - top])
        avgdl = self._total / n
        shortest = np.array([self._min_length], dtype=np.float64)
        bound = 0.0
        for key in keys:
            if key in common:
                most = np.array([tfs[key].max()], dtype=np.float64)
                weight = lucene_weights(most, shortest, len(tfs[key]), n, avgdl, self.k1, self.b)
                bound += float(weight[0])
        head = np.zeros(0, dtype=np.int64)  # the bookmarked pages fusion ranks by score
        if marks is not None:
            head = marks[0][np.lexsort((marks[0], -marks[1]))[:top]]
            scored = self._exact(keys, tfs, common, extra, n, head)
            head = head[scored > 0]
            if len(head):
                bar = min(bar, float(scored[scored > 0].min()))
        # Rounding in either sum moves it by far less than this margin.
        if bound >= bar * (1 - PRUNE_MARGIN):
            return None
        keep = sums + bound >= bar * (1 - PRUNE_MARGIN)
        # A page looked up costs a binary search per term, a posting scored a few passes (and
        # fusion then ranks every page): past half the common postings (measured on the scale
        # benchmark's million pages), the full scoring is the cheaper.
        if (np.count_nonzero(keep) + len(head)) * PRUNE_GAIN > sum(len(tfs[k]) for k in common):
            return None
        chosen = _merged(hit[keep], head)
        scores = self._exact(keys, tfs, common, extra, n, chosen)
        if marks is None:
            return chosen, scores
        # Every bookmarked page takes part in their ranking; below the bar, as no coarse match
        # (it is below every page ranked by score, and outside the bookmarks' head).
        positions = _merged(chosen, marks[0])
        return positions, values_at(chosen, scores, positions)

    def _exact(
        self,
        keys: Sequence[str],
        tfs: Mapping[str, np.ndarray],
        common: Container[str],
        extra: Mapping[str, tuple[np.ndarray, np.ndarray]],
        n: int,
        chosen: np.ndarray,
    ) -> np.ndarray:
        """BM25 of the query's term ``keys`` at positions ``chosen``, equal to the full
        scoring's bit for bit: the same weights, added in the same order (0.0 where a term
        has no posting: x + 0.0 is x)."""
        avgdl = self._total / n
        at: dict[str, np.ndarray] = {}
        for key in dict.fromkeys(k for k in keys if k in tfs):
            if key in common:
                found = self._tf_at(key, extra, chosen)
                inside = found > 0
                weights = np.zeros(len(chosen), dtype=np.float64)
                weights[inside] = lucene_weights(
                    found[inside],
                    self.lengths[chosen[inside]],
                    len(tfs[key]),
                    n,
                    avgdl,
                    self.k1,
                    self.b,
                )
            else:
                scored = self._weights(key, extra, n, avgdl)
                assert scored is not None
                weights = values_at(*_ascending(*scored), chosen)
            at[key] = weights
        scores = np.zeros(len(chosen), dtype=np.float64)
        for key in keys:
            if key in at:
                scores += at[key]
        return scores

    def _tf_at(
        self, key: str, extra: Mapping[str, tuple[np.ndarray, np.ndarray]], chosen: np.ndarray
    ) -> np.ndarray:
        """A term's tf at positions ``chosen`` (0: no posting), by pk while its positions
        are not looked up (a common term's 500K postings are never mapped to positions)."""
        entry = self._terms.get(key)
        if entry is not None and entry.pks is not None:
            return values_at(entry.pks, entry.values, self.pks[chosen])
        rows = self._rows(self._terms, extra, key)
        assert rows is not None
        return values_at(*_ascending(*rows), chosen)
