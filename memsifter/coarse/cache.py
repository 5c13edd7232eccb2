"""``HaystackCache``: the indexes a filter built, one per haystack, found again by content.

A haystack's key is its sessions' content fingerprints, so a question over the same history reuses
the index however the sessions reach the filter. Computing that key hashes each whole rendered
session, which on a 1M-token haystack costs ~50x a BM25 query, so ``resolve`` also memoises the key
by the identity of the (frozen) Session objects: every question over one haystack then costs
microseconds before scoring.

Bounds, each least recently used first: ``max_entries`` indexes and as many identity memos. With
``max_bytes`` the indexes are bounded by their estimated size too (``sizeof``, by default
``haystack_bytes``), and since a memo holds its sessions, the bytes the bound is about, memos
count against it: one per haystack, however often its content comes back as new objects, and
dropped with its index. The index in use is always kept, even when it alone is over the bound.

Scopes: inside ``cache_scope(name)`` (``memsifter.scopes``, the one switch every content-keyed
cache reads) a key is preceded by the scope's name, so each scope builds and finds only its own
indexes while the bounds stay those of the one cache; a tenant's timing then cannot tell that
another sent a haystack. Keys made outside any scope are the content alone.

The cache is generic in the index type and knows nothing of how one is built: its owner asks
``get(key)``, builds on a miss and hands the index to ``put``. One cache serves one filter, since
its key is the content alone, not the parameters an index was built with. Not thread-safe:
callers serialise (``LockedCoarse``).
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Generic, NamedTuple, TypeVar

import numpy as np

from memsifter.data.types import Session

# Kept importable from here, its home before every content-keyed cache shared it.
from memsifter.scopes import cache_scope as cache_scope
from memsifter.scopes import current_scope

IndexT = TypeVar("IndexT")
# The content fingerprints of a haystack's sessions, in order; inside a cache_scope, preceded by
# "scope:<name>", which no fingerprint (a hex digest) can equal.
Key = tuple[str, ...]


class Haystack(NamedTuple):
    """Sessions as ``resolve`` saw them, with their content key and ids."""

    # Holding the Session objects keeps their id()s from being reused by other objects, so an
    # identity hit always means these same frozen sessions and ``key`` is still their content.
    sessions: tuple[Session, ...]
    key: Key
    ids: np.ndarray  # object array of session ids, for vectorised ranking
    scope: str | None = None  # the cache_scope it was resolved in


def haystack_bytes(sessions: Sequence[Session], index: object) -> int:
    """What caching ``sessions``' index holds, roughly: the sessions (their text, and the turn
    and string objects around it) and the index's arrays and vocabulary (a bm25s ``BM25``'s
    ``scores`` and ``vocab_dict``; an index without them counts as the sessions alone)."""
    held = 0
    for session in sessions:
        held += 200 + sys.getsizeof(session.id)
        for turn in session.turns:
            held += 150 + sys.getsizeof(turn.text) + sys.getsizeof(turn.speaker)
    scores = getattr(index, "scores", None) or {}
    held += sum(int(getattr(v, "nbytes", 0)) for v in scores.values())
    held += 120 * len(getattr(index, "vocab_dict", None) or {})  # a dict entry, key and int
    return held


class HaystackCache(Generic[IndexT]):
    """An LRU of built indexes by haystack content, with identity memos in front; see the module
    docstring for the bounds. ``max_entries`` may be changed at any time and binds from the next
    ``resolve``/``put``; ``max_bytes`` is fixed at construction."""

    def __init__(
        self,
        max_entries: int = 64,
        *,
        max_bytes: int | None = None,
        sizeof: Callable[[Sequence[Session], IndexT], int] = haystack_bytes,
    ) -> None:
        self.max_entries = max_entries
        self._max_bytes = max_bytes
        self._sizeof = sizeof
        self._indexes: OrderedDict[Key, IndexT] = OrderedDict()
        # (scope, the sessions' ids) -> haystack: the same objects resolve apart in two scopes.
        self._memos: OrderedDict[tuple[str | None, tuple[int, ...]], Haystack] = OrderedDict()
        self._last: Haystack | None = None
        self._sizes: dict[Key, int] = {}  # only with max_bytes: sizing costs a pass over text
        self._held = 0

    @property
    def max_bytes(self) -> int | None:
        return self._max_bytes

    @property
    def held_bytes(self) -> int:
        """The estimated size of the indexes held (0 without ``max_bytes``, which is not sized)."""
        return self._held

    @property
    def sizes(self) -> Mapping[Key, int]:
        """Key -> estimated size of each index held (empty without ``max_bytes``); read-only."""
        return MappingProxyType(self._sizes)

    @property
    def memo_count(self) -> int:
        return len(self._memos)

    def __len__(self) -> int:
        return len(self._indexes)

    def __contains__(self, key: object) -> bool:
        return key in self._indexes

    def keys(self) -> tuple[Key, ...]:
        """The keys of the indexes held, least recently used first."""
        return tuple(self._indexes)

    def resolve(self, sessions: Sequence[Session]) -> Haystack:
        """``sessions`` with their key (content, and the ``cache_scope`` in force) and ids, from
        the identity memo when these very objects were seen before in this scope."""
        scope = current_scope()
        last = self._last
        # Tuple equality checks identity first, element by element in C: the common case, every
        # question over one haystack, costs microseconds and no hashing of the id tuple.
        if last is not None and last.scope == scope and last.sessions == tuple(sessions):
            return last
        ident = (scope, tuple(map(id, sessions)))
        memo = self._memos.get(ident)
        if memo is None:
            content = tuple(s.fingerprint for s in sessions)
            memo = self._memos[ident] = Haystack(
                tuple(sessions),
                content if scope is None else (f"scope:{scope}", *content),
                np.array([s.id for s in sessions], dtype=object),
                scope,
            )
            while len(self._memos) > self.max_entries:
                self._memos.popitem(last=False)
        else:
            self._memos.move_to_end(ident)
        if self._max_bytes is not None:
            # A client resending one haystack parses it into new objects each time: without
            # this every resend would keep another copy of the sessions alive.
            self._drop_memos(lambda other: other is not memo and other.key == memo.key)
        self._last = memo
        return memo

    def get(self, key: Key) -> IndexT | None:
        """The index cached for ``key`` (now the most recently used), or None."""
        index = self._indexes.get(key)
        if index is not None:
            self._indexes.move_to_end(key)
        return index

    def put(self, haystack: Haystack, index: IndexT) -> None:
        """Cache ``index``, built for ``haystack`` (from ``resolve``), evicting what the bounds
        require; ``haystack.key`` itself stays, whatever its size."""
        key = haystack.key
        if key in self._indexes:
            self._forget_index(key)
        self._indexes[key] = index
        while len(self._indexes) > self.max_entries:
            self._forget_index(next(iter(self._indexes)))
        if self._max_bytes is None:
            return
        size = self._sizeof(haystack.sessions, index)
        self._sizes[key] = size
        self._held += size
        while self._held > self._max_bytes and len(self._indexes) > 1:
            self._forget_index(next(iter(self._indexes)))
        self._drop_memos(lambda memo: memo.key not in self._indexes)

    def evict(self, key: Key) -> bool:
        """Drop the index for ``key`` and every memo of that haystack; False if none was held."""
        held = key in self._indexes
        if held:
            self._forget_index(key)
        self._drop_memos(lambda memo: memo.key == key)
        if self._last is not None and self._last.key == key:
            self._last = None
        return held

    def clear(self) -> None:
        self._indexes.clear()
        self._memos.clear()
        self._sizes.clear()
        self._last = None
        self._held = 0

    def _forget_index(self, key: Key) -> None:
        del self._indexes[key]
        self._held -= self._sizes.pop(key, 0)

    def _drop_memos(self, doomed: Callable[[Haystack], bool]) -> None:
        for ident, memo in list(self._memos.items()):
            if doomed(memo):
                del self._memos[ident]
