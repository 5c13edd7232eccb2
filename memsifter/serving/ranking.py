"""The ranker inside the service: coarse filter (fused with bookmark hits) -> proxy, or the
coarse stage alone when the service runs ``coarse-only``.

* **Coarse.** Each user has a ``UserIndex`` on each replica, kept in an LRU of
  ``index_cache_users`` users and caught up whenever the user's *version* (bumped in the database
  by every ingest and delete, so every replica sees it) moves on: only pages this replica does
  not hold are loaded, pages that are gone are dropped. With ``coarse: bm25`` (the default) the
  index is an ``IncrementalBM25``, so an ingest costs the new pages' terms, never a rebuild of
  the user's history, and a query reads the postings of its terms. Any other coarse filter is
  shared by every user behind a lock and keeps its own caches (dense filters embed each page
  once, by content fingerprint).
* **Bookmarks.** Pages whose keywords share a term with the question form a second ranking,
  read from the same in-memory index (term -> page -> weight); the two are fused by reciprocal
  rank (``1/(k + rank)``, k = 60).
* **Proxy.** The fused top ``max_candidates`` go through ``memsifter.ranker.proxy.Proxy``: the
  one prompt builder and the one parser, so session text cannot steer how the answer is read.
  The prompt is the model's :class:`~memsifter.ranker.spec.PromptSpec` (``proxy.prompt_spec()``),
  rendered by ``spec.builder`` exactly as the RL data was.
  The proxy's order comes first, then the rest in fused order; a partial or unparseable answer
  is completed in fused order too (the proxy is handed that order), so a failed parse returns
  exactly the coarse-only ranking. A backend failure is a 503, not a silent fall back to
  coarse-only: every response says which ranker produced it.
* **Stateless haystacks.** ``/v1/rank`` and ``/v1/rerank`` (and the proxy's prompt, when its
  candidates overflow the window) index whatever sessions a request brings. A BM25 filter caches
  those indexes by content, so a client asking many questions over one haystack builds it once;
  the cache is bounded in (estimated) bytes, ``rank_cache_bytes``, not only in entries, since one
  haystack can be megabytes (``ByteBoundedBM25``). Every ranking, and every catch-up of a
  user's index (its pages embedded, tokenized for the proxy), runs in its tenant's
  ``cache_scope`` (``memsifter.scopes``), so every content-keyed cache on the way (BM25
  indexes, dense vectors, the prompt builder's page counts and ids) keys by tenant: keyed by
  content alone, a cache hit (a 0.3 ms coarse stage where a build took 37) told one tenant that
  another had sent the same documents. The bounds stay one each, over all tenants.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, overload

import numpy as np

from memsifter.coarse import (
    BM25Filter,
    ByteBoundedBM25,
    CoarseFilter,
    IncrementalBM25,
    LockedCoarse,
    build_filter,
)
from memsifter.coarse.hybrid import rrf
from memsifter.data.types import Session
from memsifter.errors import MemSifterError, PromptBudgetError
from memsifter.llm import Backend
from memsifter.ranker.proxy import Proxy, ProxyParams
from memsifter.ranker.spec import PromptSpec
from memsifter.scopes import cache_scope
from memsifter.serving.bookmarks import query_terms
from memsifter.serving.config import ServeConfig
from memsifter.serving.errors import ServeError, UnavailableError
from memsifter.serving.store import Store
from memsifter.serving.store.records import IndexedPage, PageDelta, StoredPage

logger = logging.getLogger(__name__)
COARSE_ONLY = "coarse-only"


@dataclass(frozen=True)
class ParseReport:
    status: str  # ok | failed | not_applicable (coarse-only)
    error: str | None = None
    completed: bool = False  # the proxy's ranking was filled from the coarse order
    n_from_model: int = 0
    dropped: int = 0
    duplicates: int = 0
    # Candidates the proxy's prompt showed, and those handed to it that the coarse filter cut
    # from the prompt (its window, or the first-token head's label count): they follow the
    # model's ranking in coarse order.
    shown: int = 0
    cut: int = 0


@dataclass(frozen=True)
class RankOutcome:
    """Every candidate, best first, and per candidate the fused coarse(+bookmark) score (the
    proxy orders, it does not score), the coarse score and the bookmark score. Scores are kept
    as arrays over the candidates: a user with 10K pages is ranked without 10K-entry dicts."""

    ids: Sequence[str]  # a tuple, or an IdOrder over the coarse order
    ranker: str
    think: str | None
    parse: ParseReport
    timings_ms: dict[str, float] = field(default_factory=dict)
    positions: Mapping[str, int] = field(default_factory=dict)  # candidate id -> array index
    fused: np.ndarray = field(default_factory=lambda: np.zeros(0))
    coarse: np.ndarray = field(default_factory=lambda: np.zeros(0))
    bookmarks: np.ndarray = field(default_factory=lambda: np.zeros(0))  # 0: no bookmark hit

    def score(self, sid: str) -> float:
        return float(self.fused[self.positions[sid]])

    def coarse_score(self, sid: str) -> float:
        return float(self.coarse[self.positions[sid]])

    def bookmark_score(self, sid: str) -> float | None:
        value = float(self.bookmarks[self.positions[sid]])
        return value if value > 0 else None


class IdOrder(Sequence[str]):
    """Candidate ids best first, read through the ranking's order array: a recall over 10K
    pages converts only the ids a caller reads (the top k) into a Python sequence."""

    __slots__ = ("_ids", "_order")

    def __init__(self, ids: np.ndarray, order: np.ndarray) -> None:
        self._ids = ids
        self._order = order

    def __len__(self) -> int:
        return len(self._order)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[str, ...]: ...
    def __getitem__(self, i: int | slice) -> str | tuple[str, ...]:
        if isinstance(i, slice):
            return tuple(self._ids[self._order[i]].tolist())
        return str(self._ids[self._order[i]])

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids[self._order].tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (IdOrder, tuple, list)):
            return tuple(self) == tuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"IdOrder({tuple(self)!r})"


LoadKind = Literal["warm", "waited", "caught_up", "rebuilt"]


@dataclass(frozen=True)
class IndexLoad:
    """What finding a user's index cost a request: ``warm`` (cached and current, nothing read),
    ``waited`` (another request was loading it; this one waited for that), ``caught_up`` (a
    cached index read the pages changed since its version) or ``rebuilt`` (no index on this
    replica: every page read from the store and indexed). ``ms`` is the time spent reading,
    indexing or waiting (0 when warm); ``pages`` the pages this request read."""

    kind: LoadKind = "warm"
    ms: float = 0.0
    pages: int = 0
    # False: the index is larger than the cache's byte budget by itself, so it served this
    # request and was not kept (the next one loads it again).
    cached: bool = True


@dataclass(frozen=True)
class IndexCacheReport:
    """The cache of users' indexes after a change: its estimated bytes, its users, and the
    users it evicted, by why (``bytes``: the budget; ``users``: the count bound; ``too_large``:
    an index over the whole budget, not kept)."""

    bytes: int
    users: int
    evicted: Mapping[str, int]


@dataclass(frozen=True)
class UserPages:
    """A consistent snapshot of one user's pages: a request reads one and keeps it, while a
    concurrent ingest swaps in the next."""

    version: int
    pages: tuple[StoredPage, ...]  # chronological
    sessions: tuple[Session, ...]  # the pages as the coarse filter and proxy see them
    by_id: dict[str, StoredPage]
    positions: dict[str, int]  # page id -> index in ``sessions``
    ids: np.ndarray  # object array of the page ids, in ``sessions`` order


# What a page held in a replica's index costs besides its text (its records, the snapshot's
# entries) and what each turn and bookmark row adds, in CPython, as tracemalloc measured the
# recall benchmarks' sessions (the coarse index's own share: IncrementalBM25.nbytes).
PAGE_BYTES, TURN_BYTES, MARK_BYTES = 900, 200, 200


def _held_bytes(page: IndexedPage) -> int:
    turns = page.stored.page.turns
    return (
        PAGE_BYTES
        + TURN_BYTES * len(turns)
        + sum(len(t.text) for t in turns)
        + MARK_BYTES * len(page.bookmark_terms)
    )


def _pages_view(version: int, pages: tuple[StoredPage, ...]) -> UserPages:
    sessions = tuple(p.page for p in pages)
    ids = np.array([s.id for s in sessions], dtype=object)
    return UserPages(
        version,
        pages,
        sessions,
        {p.page.id: p for p in pages},
        {s.id: i for i, s in enumerate(sessions)},
        ids,
    )


class UserIndex:
    """One user's pages on this replica: the snapshot, the incremental BM25 index (when the
    coarse filter is BM25) and the bookmark terms, caught up by ``apply(delta)``."""

    def __init__(self, epoch: str, bm25: IncrementalBM25 | None) -> None:
        self.epoch = epoch  # the user's incarnation this index belongs to
        self.view = _pages_view(-1, ())
        self.bm25 = bm25
        self._lock = threading.Lock()
        self._pages: dict[int, IndexedPage] = {}  # pk -> page
        self._marks: dict[str, dict[str, float]] = {}  # term -> page id -> summed weight
        self._view_slots = np.zeros(0, dtype=np.int64)  # view position -> BM25 slot
        self._last_order: tuple[bool, datetime, int, int] | None = None  # the newest page's
        self._page_bytes = 0  # the pages' estimated share of nbytes
        self.refreshing = threading.Lock()  # one catch-up with the store at a time

    @property
    def nbytes(self) -> int:
        """The estimated memory this index holds: its pages (text, records, snapshot) and the
        coarse index. What the ranker's byte-bounded cache of users charges it."""
        return self._page_bytes + (self.bm25.nbytes() if self.bm25 is not None else 0)

    @property
    def version(self) -> int:
        return self.view.version

    @property
    def pks(self) -> frozenset[int]:
        return frozenset(self._pages)

    def apply(self, delta: PageDelta) -> None:
        """Catch up with ``delta`` (from ``Store.load_pages``, since this index's version)."""
        with self._lock:
            if delta.state.version <= self.view.version:
                return  # a concurrent request caught up first
            live = delta.live
            gone = {pk for pk in self._pages if pk not in live} if live is not None else set()
            # A page whose pk is back was deleted and its pk reused (SQLite does): the new row
            # replaces the old one.
            gone |= {p.pk for p in delta.pages if p.pk in self._pages}
            for pk in gone:
                page = self._pages.pop(pk)
                self._page_bytes -= _held_bytes(page)
                pid = page.stored.page.id
                if self.bm25 is not None:
                    self.bm25.remove(pid)
                for term, _ in page.bookmark_terms:
                    marks = self._marks.get(term)
                    if marks is not None:
                        marks.pop(pid, None)
                        if not marks:
                            del self._marks[term]
            added = []
            for page in delta.pages:  # read in the same transaction as live: all live
                added.append(page)
                self._pages[page.pk] = page
                self._page_bytes += _held_bytes(page)
                pid = page.stored.page.id
                if self.bm25 is not None:
                    self.bm25.add(pid, page.stored.page.render())
                for term, weight in page.bookmark_terms:
                    marks = self._marks.setdefault(term, {})
                    marks[pid] = marks.get(pid, 0.0) + weight
            added.sort(key=lambda p: p.order)
            last = self._last_order
            version = delta.state.version
            if not gone and (last is None or not added or added[0].order > last):
                self.view = self._appended(version, added)
                self._last_order = added[-1].order if added else last
            else:  # a delete, or pages older than the newest: rebuild the snapshot
                ordered = sorted(self._pages.values(), key=lambda p: p.order)
                view = _pages_view(version, tuple(p.stored for p in ordered))
                if self.bm25 is not None:
                    self._view_slots = self.bm25.slots(view.ids.tolist())
                self.view = view
                self._last_order = ordered[-1].order if ordered else None

    def _appended(self, version: int, added: list[IndexedPage]) -> UserPages:
        """The common ingest, newer pages only and nothing deleted: the snapshot grows at its
        end with C-level copies, instead of a sort and dict rebuild over the whole history."""
        old = self.view
        pages = tuple(p.stored for p in added)
        new_ids = [p.page.id for p in pages]
        by_id = dict(old.by_id)
        by_id.update(zip(new_ids, pages, strict=True))
        positions = dict(old.positions)
        positions.update((pid, len(old.pages) + i) for i, pid in enumerate(new_ids))
        if self.bm25 is not None:  # no remove ran, so no compaction moved a slot
            self._view_slots = np.concatenate([self._view_slots, self.bm25.slots(new_ids)])
        return UserPages(
            version,
            old.pages + pages,
            old.sessions + tuple(p.page for p in pages),
            by_id,
            positions,
            np.concatenate([old.ids, np.array(new_ids, dtype=object)]),
        )

    def coarse_scores(
        self, question: str, view: UserPages, ids: Sequence[str] | None
    ) -> np.ndarray:
        """BM25 of ``ids`` (pages of ``view``; None: all of them, in view order). A page deleted
        since the caller took ``view`` scores 0."""
        assert self.bm25 is not None
        with self._lock:
            bm25 = self.bm25
            if ids is None and view is self.view:  # the hot path: no per-page Python work
                return bm25.slot_scores(question)[self._view_slots]
            ids = view.ids.tolist() if ids is None else ids
            live = np.array([sid in bm25 for sid in ids], dtype=bool)
            scores = np.zeros(len(ids), dtype=np.float64)
            scores[live] = bm25.scores(question, [sid for sid in ids if sid in bm25])
            return scores

    def bookmark_hits(self, terms: Sequence[str]) -> dict[str, float]:
        """Page id -> summed weight of the bookmark rows sharing a term with ``terms``."""
        hits: dict[str, float] = {}
        with self._lock:
            for term in dict.fromkeys(terms):
                for pid, weight in self._marks.get(term, {}).items():
                    hits[pid] = hits.get(pid, 0.0) + weight
        return hits


class ServiceRanker:
    def __init__(
        self,
        coarse: CoarseFilter,
        backend: Backend | None = None,
        spec: PromptSpec | None = None,
        proxy_config: ProxyParams | None = None,
        *,
        proxy_coarse: CoarseFilter | None = None,
        max_candidates: int = 40,
        max_concurrency: int = 1,
        rrf_k: int = 60,
        index_cache_users: int = 256,
        index_cache_bytes: int | None = 2_000_000_000,
        token_cache_pages: int = 500_000,
        rank_cache_bytes: int | None = 64_000_000,
        name: str | None = None,
    ) -> None:
        if rank_cache_bytes is not None:
            coarse = _bounded(coarse, rank_cache_bytes)
            proxy_coarse = _bounded(proxy_coarse, rank_cache_bytes) if proxy_coarse else None
        cache_size = getattr(coarse, "cache_size", None)
        if isinstance(cache_size, int):
            # The filter's own LRU of built indexes must outlive ours, or a cached user would
            # have the index rebuilt on a query; the headroom is for stateless /v1/rank calls.
            setattr(coarse, "cache_size", max(cache_size, index_cache_users + 64))  # noqa: B010
        self.coarse = LockedCoarse(coarse)
        self.backend = backend
        self.proxy: Proxy | None = None
        if backend is not None:
            if spec is None:
                raise ValueError("a proxy backend needs the PromptSpec it was trained on")
            # The proxy's own coarse filter (spec.coarse) cuts and orders its prompt; it is the
            # service's one unless the spec names another.
            prompt_coarse = self.coarse if proxy_coarse is None else LockedCoarse(proxy_coarse)
            self.proxy = Proxy(backend, spec, prompt_coarse, proxy_config or ProxyParams())
        if self.proxy is not None:
            # The prompt builder's page caches (counts, ids) live as long as the server: bounded.
            self.proxy.builder.session_tokens.max_size = token_cache_pages
            self.proxy.builder.page_ids.max_size = token_cache_pages
        self.max_candidates = max_candidates
        self.rrf_k = rrf_k
        self.name = name or (COARSE_ONLY if backend is None else f"proxy:{backend.name}")
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self._indexes: OrderedDict[tuple[str, str], UserIndex] = OrderedDict()
        self._index_lock = threading.Lock()
        self._index_cache_users = index_cache_users
        if index_cache_bytes is not None and index_cache_bytes <= 0:
            raise ValueError(f"index_cache_bytes must be > 0, got {index_cache_bytes}")
        self._index_cache_bytes = index_cache_bytes
        self.on_index_cache: Callable[[IndexCacheReport], None] | None = None  # metrics hook
        self.on_proxy: Callable[[float, ParseReport], None] | None = None  # metrics hook
        self.on_index_load: Callable[[IndexLoad], None] | None = None  # metrics hook

    @classmethod
    def from_config(cls, config: ServeConfig) -> ServiceRanker:
        p = config.proxy
        backend: Backend | None = None
        spec: PromptSpec | None = None
        if config.ranker == "proxy":
            # Opened by the one front door; the ranker re-wraps its backend and spec with the
            # service's locked coarse filters. ServeConfig checked the spec against paging.
            loaded = Proxy.from_pretrained(
                p.model,
                backend=p.backend_spec(),
                prompt=p.prompt,
                hint="a `proxy.prompt:` block in the config",
            )
            backend, spec = loaded.backend, loaded.spec
        return cls(
            build_filter(config.coarse),
            backend,
            spec,
            ProxyParams(temperature=p.temperature),
            proxy_coarse=build_filter(spec.coarse)
            if spec is not None and spec.coarse != config.coarse
            else None,
            max_candidates=p.max_candidates,
            max_concurrency=p.max_concurrency,
            rrf_k=config.bookmarks.rrf_k,
            index_cache_users=config.index_cache_users,
            index_cache_bytes=config.index_cache_bytes,
            token_cache_pages=config.token_cache_pages,
            rank_cache_bytes=config.rank_cache_bytes,
            name=config.ranker_name,
        )

    @property
    def coarse_only(self) -> bool:
        return self.proxy is None

    # -- per-user page indexes

    def user_index(
        self, store: Store, tenant: str, user: str
    ) -> tuple[UserIndex | None, IndexLoad]:
        """The user's index, caught up with the store when their version moved on, and what
        that cost (``IndexLoad``; also handed to ``on_index_load``). All it caches (terms
        stemmed, pages embedded and tokenized) is cached in the tenant's scope, where its
        queries look."""
        with cache_scope(tenant):
            index, load = self._user_index(store, tenant, user)
        if load.kind in ("caught_up", "rebuilt") and self.on_index_load is not None:
            self.on_index_load(load)
        return index, load

    def _user_index(
        self, store: Store, tenant: str, user: str
    ) -> tuple[UserIndex | None, IndexLoad]:
        key = (tenant, user)
        state = store.user_state(tenant, user)
        if state is None:
            self.forget_user(tenant, user)
            return None, IndexLoad()
        over = 0
        with self._index_lock:
            index = self._indexes.get(key)
            if index is None or index.epoch != state.epoch:  # new, or deleted and created again
                index = self._indexes[key] = UserIndex(state.epoch, self._new_bm25())
            self._indexes.move_to_end(key)
            while len(self._indexes) > self._index_cache_users:
                self._indexes.popitem(last=False)
                over += 1
        if over:
            self._report_cache({"users": over})
        if index.version >= state.version:
            return index, IndexLoad()
        start = time.perf_counter()
        with index.refreshing:  # concurrent requests after an ingest wait for one catch-up
            if index.version >= state.version:  # another request loaded it meanwhile
                return index, IndexLoad("waited", (time.perf_counter() - start) * 1000)
            since = index.version if index.version >= 0 else None
            delta = store.load_pages(tenant, user, since=since, known=index.pks)
            if delta is None or delta.state.epoch != index.epoch:
                # Deleted (and maybe created again) since user_state: the next request starts
                # from the new incarnation; this one answers as for an unknown user.
                self.forget_user(tenant, user)
                if delta is None:
                    return None, IndexLoad()
                return self._user_index(store, tenant, user)
            index.apply(delta)
        if index.bm25 is None and index.view.sessions:
            self.coarse.index(index.view.sessions)
        if self.proxy is not None:
            # Tokenize new pages for the proxy now, at ingest, so a query's prompt budget and
            # token ids come from the builder's caches instead of tokenizing 40 pages a request.
            for page in delta.pages:
                self.proxy.builder.warm(page.stored.page)
        kind: LoadKind = "rebuilt" if since is None else "caught_up"
        cached = self._fit(key, index)
        ms = (time.perf_counter() - start) * 1000
        return index, IndexLoad(kind, ms, len(delta.pages), cached)

    def _fit(self, key: tuple[str, str], index: UserIndex) -> bool:
        """After a load grew ``index``: evict the least recently used users until the cache is
        within ``index_cache_bytes``. An index over the whole budget is not kept (this request
        still uses it). Whether ``index`` stays. Queries' cached posting arrays grow an index
        between loads (at most 16 B a posting); they are charged at its next load."""
        budget = self._index_cache_bytes
        if budget is None:
            return True
        evicted: dict[str, int] = {}
        with self._index_lock:
            too_large = index.nbytes > budget
            if too_large and self._indexes.get(key) is index:
                del self._indexes[key]
                evicted["too_large"] = 1
            total = sum(i.nbytes for i in self._indexes.values())
            while total > budget and len(self._indexes) > 1:
                _, old = self._indexes.popitem(last=False)  # least recently used first
                total -= old.nbytes
                evicted["bytes"] = evicted.get("bytes", 0) + 1
            kept = self._indexes.get(key) is index
            held = (total, len(self._indexes))
        self._report_cache(evicted, held)
        if too_large:
            logger.warning(
                "a user's index is over index_cache_bytes by itself: served, not cached",
                extra={"index_bytes": index.nbytes, "index_cache_bytes": budget},
            )
        return kept

    def _report_cache(
        self, evicted: Mapping[str, int], held: tuple[int, int] | None = None
    ) -> None:
        """Hand the metrics hook the cache's (bytes, users), ``held`` when the caller summed
        them under the lock already."""
        if self.on_index_cache is None:
            return
        if held is None:
            with self._index_lock:
                held = (sum(i.nbytes for i in self._indexes.values()), len(self._indexes))
        self.on_index_cache(IndexCacheReport(*held, evicted))

    def _new_bm25(self) -> IncrementalBM25 | None:
        inner = self.coarse.inner
        if not isinstance(inner, BM25Filter) or inner.method != "lucene":
            return None
        return IncrementalBM25(inner.k1, inner.b, inner.language)

    def forget_user(self, tenant: str, user: str) -> None:
        with self._index_lock:
            self._indexes.pop((tenant, user), None)

    # -- ranking

    def rank(
        self,
        question: str,
        sessions: Sequence[Session],
        *,
        tenant: str,
        question_date: str | None = None,
        index: UserIndex | None = None,
    ) -> RankOutcome:
        """Rank ``sessions`` (pages or sessions) for ``question``; see the module doc. With the
        user's ``index`` the coarse scores and bookmark hits come from it; without one (the
        stateless ``/v1/rank``) the shared coarse filter scores and there are no bookmarks.
        ``tenant`` scopes every cached index the ranking builds or finds (the module doc)."""
        with cache_scope(tenant):
            return self._rank(question, sessions, question_date, index)

    def _rank(
        self,
        question: str,
        sessions: Sequence[Session],
        question_date: str | None,
        index: UserIndex | None,
    ) -> RankOutcome:
        start = time.perf_counter()
        if not sessions:
            return RankOutcome((), self.name, None, ParseReport("not_applicable"))
        view = index.view if index is not None else None
        if view is not None and sessions is view.sessions:  # recall over all of a user's pages
            positions, ids = view.positions, view.ids
        else:
            positions = {s.id: i for i, s in enumerate(sessions)}
            ids = np.array([s.id for s in sessions], dtype=object)
        if index is not None and index.bm25 is not None:
            assert view is not None
            subset = None if ids is view.ids else ids.tolist()
            coarse = index.coarse_scores(question, view, subset)
            coarse_order = np.argsort(-coarse, kind="stable")  # ties: chronological
        else:
            ranking = self.coarse.score(question, sessions)
            coarse_order = np.array([positions[sid] for sid in ranking.ids], dtype=np.int64)
            coarse = np.zeros(len(sessions), dtype=np.float64)
            coarse[coarse_order] = ranking.scores if ranking.scores else 0.0
        coarse_ms = (time.perf_counter() - start) * 1000
        marks = np.zeros(len(sessions), dtype=np.float64)
        if index is not None:
            for pid, weight in index.bookmark_hits(query_terms(question)).items():
                i = positions.get(pid)
                if i is not None:
                    marks[i] = weight
        if marks.any():
            # Only matches take part: a page the coarse filter scored 0 has no rank to fuse,
            # and giving it one would rate "no evidence" above zero.
            matched = coarse_order[coarse[coarse_order] > 0]
            marked = np.flatnonzero(marks)
            mark_order = marked[np.argsort(-marks[marked], kind="stable")]
            fused = rrf([matched, mark_order], len(sessions), self.rrf_k)
            # Pages in neither list keep their coarse order after every fused one.
            order = coarse_order[np.argsort(-fused[coarse_order], kind="stable")]
        else:
            fused, order = coarse, coarse_order
        scores = {"positions": positions, "fused": fused, "coarse": coarse, "bookmarks": marks}
        timings = {"coarse_ms": coarse_ms}
        if self.proxy is None:
            timings["total_ms"] = (time.perf_counter() - start) * 1000
            report = ParseReport("not_applicable")
            return RankOutcome(IdOrder(ids, order), self.name, None, report, timings, **scores)

        # In the caller's (chronological) order, as the RL data hands its haystack to the prompt
        # builder: the builder breaks ties (pages of one date; equal coarse scores) by input
        # order, so passing them in fused order would show the model a different prompt.
        shown_positions = order[: self.max_candidates]
        shown = [sessions[i] for i in sorted(shown_positions.tolist())]
        # The fused order of what is shown: a failed or partial parse is completed from it, so
        # the answer then equals the coarse-only one (bookmarks included), as it claims to.
        prior = ids[shown_positions].tolist()
        proxy_start = time.perf_counter()
        try:
            with self._slots:
                result = self.proxy.rank(question, shown, question_date, prior=prior)
        except PromptBudgetError as e:
            raise ServeError(
                f"the question does not fit the proxy's window: {e}", field="body.question"
            ) from e
        except MemSifterError as e:
            raise UnavailableError(f"the proxy backend failed: {e}") from e
        proxy_s = time.perf_counter() - proxy_start
        parsed = result.parsed
        report = ParseReport(
            status="ok" if parsed.ok else "failed",
            error=parsed.error.value if parsed.error else None,
            completed=result.completed,
            n_from_model=parsed.n_from_model,
            dropped=parsed.dropped,
            duplicates=parsed.duplicates,
            shown=result.prompt.num_candidates,
            cut=len(result.prompt.dropped_ids),
        )
        if self.on_proxy is not None:
            self.on_proxy(proxy_s, report)
        # The proxy ranked (a subset of) the fused top max_candidates; the rest follow in fused
        # order, read lazily like coarse-only's: a 10K-page user's tail is never listed.
        head = [positions[sid] for sid in result.ranking.ids]
        seen = set(head)
        head += [i for i in shown_positions.tolist() if i not in seen]
        proxy_order = np.concatenate(
            [np.asarray(head, dtype=order.dtype), order[self.max_candidates :]]
        )
        timings["proxy_ms"] = proxy_s * 1000
        # proxy_ms also holds prompt building, parsing and the wait for a slot; the model's own
        # share is what the backend timed, so "overhead over the model call" can be measured.
        timings["model_ms"] = result.generation.latency_s * 1000
        timings["total_ms"] = (time.perf_counter() - start) * 1000
        return RankOutcome(
            IdOrder(ids, proxy_order), self.name, parsed.think, report, timings, **scores
        )


def _bounded(coarse: CoarseFilter, max_bytes: int) -> CoarseFilter:
    """A BM25 filter with its cache bounded in bytes; other filters as they are (a dense
    filter's cache holds one embedding per page, bounded by its own rules)."""
    if type(coarse) is BM25Filter:
        return ByteBoundedBM25(coarse, max_bytes)
    return coarse
