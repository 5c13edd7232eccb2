"""The ranker inside the service: coarse filter (fused with bookmark hits) -> proxy, or the
coarse stage alone when the service runs ``coarse-only``.

* **Coarse.** With ``coarse: bm25`` (the default) a user's index is held by the database: each
  page's postings are written with the page (``store.postings``), so no replica rebuilds an
  index from text. A replica keeps a ``StoredIndex`` per user (the pages' pks and lengths in
  chronological order, and the postings of the terms queries asked for) in an LRU bounded by
  ``index_cache_users`` and ``index_cache_bytes``, and follows the user's *version* (bumped in
  the database by every ingest and delete, so every replica sees it): an ingest appends the new
  pages and their postings of cached terms; anything else (a delete, a page older than the
  newest) reads the pks and lengths again. A recall scores the pages with evidence, reads only
  its top pages from the store, and ranks exactly like BM25 over all the pages (ties
  chronological). Any other coarse filter ranks page text: its ``UserIndex`` holds the pages
  and the filter is shared by every user behind a lock and keeps its own caches (dense filters
  embed each page once, by content fingerprint).
* **Bookmarks.** Pages whose keywords share a term with the question form a second ranking,
  read with the postings (the bookmark rows of the question's terms); the two are fused by
  reciprocal rank (``1/(k + rank)``, k = 60).
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
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, overload

import numpy as np

from memsifter.coarse import (
    BM25Filter,
    ByteBoundedBM25,
    CoarseFilter,
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
from memsifter.serving.store.records import (
    IndexedPage,
    PageDelta,
    PagesWritten,
    StoredPage,
    TermArrays,
    UserState,
)
from memsifter.serving.stored_index import Evidence, StoredIndex, values_at

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


LoadKind = Literal["warm", "waited", "caught_up", "opened", "reindexed", "rebuilt"]


@dataclass(frozen=True)
class IndexLoad:
    """What finding a user's index cost a request: ``warm`` (cached and current, nothing read),
    ``waited`` (another request was loading it; this one waited for that), ``caught_up`` (a
    cached index read the pages changed since its version), ``opened`` (a stored BM25 index
    read: every page's pk and length, no text), ``reindexed`` (the user's postings written
    again from their pages' text, then opened: pages stored before postings existed, or by
    another analyzer) or ``rebuilt`` (an in-memory index of a non-BM25 filter: every page read
    and indexed). ``ms`` is the time spent reading, indexing or waiting (0 when warm);
    ``pages`` the pages this request read."""

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
    """One user's pages on this replica, for a coarse filter that ranks page text itself (a
    dense or hybrid filter): the snapshot and the bookmark terms, caught up by
    ``apply(delta)``. With BM25 the service keeps a ``StoredIndex`` instead."""

    def __init__(self, tenant: str, user: str, epoch: str) -> None:
        self.tenant, self.user = tenant, user
        self.epoch = epoch  # the user's incarnation this index belongs to
        self.view = _pages_view(-1, ())
        self._lock = threading.Lock()
        self._pages: dict[int, IndexedPage] = {}  # pk -> page
        self._marks: dict[str, dict[str, float]] = {}  # term -> page id -> summed weight
        self._last_order: tuple[bool, datetime, int, int] | None = None  # the newest page's
        self._page_bytes = 0  # the pages' estimated share of nbytes
        self.refreshing = threading.Lock()  # one catch-up with the store at a time

    def __len__(self) -> int:
        return len(self.view.pages)

    @property
    def nbytes(self) -> int:
        """The estimated memory this index holds (its pages: text, records, snapshot): what
        the ranker's byte-bounded cache of users charges it."""
        return self._page_bytes

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
                self.view = _pages_view(version, tuple(p.stored for p in ordered))
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
        return UserPages(
            version,
            old.pages + pages,
            old.sessions + tuple(p.page for p in pages),
            by_id,
            positions,
            np.concatenate([old.ids, np.array(new_ids, dtype=object)]),
        )

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
        index_cache_bytes: int | None = 512_000_000,
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
        self._indexes: OrderedDict[tuple[str, str], UserIndex | StoredIndex] = OrderedDict()
        # With Lucene BM25 (the default) users' indexes are the store's postings, analysed
        # by this filter's analyzer; any other filter ranks page text (UserIndex).
        inner = self.coarse.inner
        self._bm25: BM25Filter | None = (
            inner if isinstance(inner, BM25Filter) and inner.method == "lucene" else None
        )
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

    @property
    def index_analyzer(self) -> str | None:
        """The ``Analyzer.identity`` whose terms this service's users' postings hold; None when
        the coarse filter is not BM25 (it keeps no postings)."""
        return self._bm25.analyzer.identity if self._bm25 is not None else None

    def index_terms(self, text: str) -> tuple[tuple[str, int], ...] | None:
        """``text``'s postings (term, count) for ``put_sessions``; None without BM25."""
        if self._bm25 is None:
            return None
        return tuple(Counter(self._bm25.analyzer(text)).items())

    def warm(self, tenant: str, pages: Sequence[Session]) -> None:
        """Tokenize ingested pages for the proxy now, so a query's prompt budget and token ids
        come from the builder's caches instead of tokenizing 40 pages a request. (Another
        replica tokenizes a page the first time a prompt shows it.)"""
        if self.proxy is None:
            return
        with cache_scope(tenant):
            for page in pages:
                self.proxy.builder.warm(page)

    def user_index(
        self, store: Store, tenant: str, user: str, *, written: PagesWritten | None = None
    ) -> tuple[UserIndex | StoredIndex | None, IndexLoad]:
        """The user's index, caught up with the store when their version moved on, and what
        that cost (``IndexLoad``; also handed to ``on_index_load``). After this replica's own
        write, ``written`` (what ``put_sessions`` returned) brings a stored index that was one
        version behind up to it without reading the pages back. All it caches (terms stemmed,
        pages embedded and tokenized) is cached in the tenant's scope, where its queries
        look."""
        with cache_scope(tenant):
            index, load = self._user_index(store, tenant, user, written)
        if load.kind not in ("warm", "waited") and self.on_index_load is not None:
            self.on_index_load(load)
        return index, load

    def _user_index(
        self, store: Store, tenant: str, user: str, written: PagesWritten | None = None
    ) -> tuple[UserIndex | StoredIndex | None, IndexLoad]:
        key = (tenant, user)
        # A write says the user's state as it left it; a later write shows on the next read.
        state = (
            UserState(written.state.epoch, written.state.version)
            if written is not None
            else store.user_state(tenant, user)
        )
        if state is None:
            self.forget_user(tenant, user)
            return None, IndexLoad()
        over = 0
        with self._index_lock:
            index = self._indexes.get(key)
            if index is None or index.epoch != state.epoch:  # new, or deleted and created again
                index = self._indexes[key] = self._new_index(tenant, user, state.epoch)
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
            if isinstance(index, StoredIndex):
                loaded = self._load_stored(store, index, written)
            else:
                loaded = self._load_pages(store, index)
        if loaded is None:
            # Deleted (and maybe created again) since user_state: the next request starts from
            # the new incarnation; this one answers as for an unknown user.
            self.forget_user(tenant, user)
            if store.user_state(tenant, user) is None:
                return None, IndexLoad()
            return self._user_index(store, tenant, user)
        kind, pages = loaded
        cached = self._fit(key, index)
        ms = (time.perf_counter() - start) * 1000
        return index, IndexLoad(kind, ms, pages, cached)

    def _new_index(self, tenant: str, user: str, epoch: str) -> UserIndex | StoredIndex:
        if self._bm25 is None:
            return UserIndex(tenant, user, epoch)
        return StoredIndex(tenant, user, epoch, self._bm25.k1, self._bm25.b)

    def _load_stored(
        self, store: Store, index: StoredIndex, written: PagesWritten | None = None
    ) -> tuple[LoadKind, int] | None:
        """Bring ``index`` to the store's state: the new pages appended (``caught_up``: from
        ``written`` when it is the one write since ``index``'s version, else read), or every
        page's pk and length read (``opened``), after writing the user's postings again when
        another analyzer (or none) wrote them (``reindexed``). None: the user is gone or was
        created again."""
        tenant, user = index.tenant, index.user
        analyzer = self.index_analyzer
        if written is not None:
            delta = written.state
            if (
                index.version == delta.version - 1
                and index.appends(delta)
                and delta.analyzer == analyzer
            ):
                index.catch_up(delta, written.postings, written.marks)
                return "caught_up", len(delta.pks)
        if index.version >= 0:
            delta = store.index_state(tenant, user, since=index.version)
            if delta is None or delta.epoch != index.epoch:
                return None
            if index.appends(delta) and delta.analyzer == analyzer:
                postings, marks = ({}, {})
                if len(delta.pks) and index.caches_terms:
                    postings, marks = store.page_terms(delta.pks.tolist())
                index.catch_up(delta, postings, marks)
                return "caught_up", len(delta.pks)
        state = store.index_state(tenant, user)
        if state is None or state.epoch != index.epoch:
            return None
        kind: LoadKind = "opened"
        if state.analyzer != analyzer:
            assert self._bm25 is not None and analyzer is not None
            counted = self._bm25.analyzer
            n = store.reindex_user(tenant, user, analyzer, lambda text: Counter(counted(text)))
            logger.warning(
                "a user's postings were written again from their pages",
                extra={"user": user, "pages": n, "was": state.analyzer, "analyzer": analyzer},
            )
            state = store.index_state(tenant, user)
            if state is None or state.epoch != index.epoch:
                return None
            kind = "reindexed"
        index.open(state)
        return kind, len(state.pks)

    def _load_pages(self, store: Store, index: UserIndex) -> tuple[LoadKind, int] | None:
        """Bring ``index`` to the store's state by reading the pages it lacks (``caught_up``),
        or all of them (``rebuilt``), and index them in the coarse filter."""
        tenant, user = index.tenant, index.user
        since = index.version if index.version >= 0 else None
        delta = store.load_pages(tenant, user, since=since, known=index.pks)
        if delta is None or delta.state.epoch != index.epoch:
            return None
        index.apply(delta)
        if index.view.sessions:
            self.coarse.index(index.view.sessions)
        return ("rebuilt" if since is None else "caught_up"), len(delta.pages)

    def _fit(self, key: tuple[str, str], index: UserIndex | StoredIndex) -> bool:
        """After a load grew ``index``: evict the least recently used users until the cache is
        within ``index_cache_bytes``. An index over the whole budget is not kept (this request
        still uses it). Whether ``index`` stays. Queries' cached postings grow a stored index
        between loads; ``_evidence`` fits the cache again after it grows one."""
        budget = self._index_cache_bytes
        if budget is None:
            return True
        evicted: dict[str, int] = {}
        with self._index_lock:
            if self._indexes.get(key) is not index:
                return False  # evicted meanwhile, or served uncached: nothing to fit
            if index.nbytes > budget and isinstance(index, StoredIndex):
                index.shed()  # its cached postings first: they are read again as needed
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
        user's in-memory ``index`` bookmark hits come from it; without one (the stateless
        ``/v1/rank``) there are none. The shared coarse filter scores. ``tenant`` scopes every
        cached index the ranking builds or finds (the module doc)."""
        with cache_scope(tenant):
            return self._rank(question, sessions, question_date, index)

    def recall(
        self,
        store: Store,
        index: UserIndex | StoredIndex,
        question: str,
        *,
        top_k: int,
        question_date: str | None = None,
        exclude: Sequence[str] = (),
    ) -> tuple[RankOutcome, dict[str, StoredPage]]:
        """The user's pages ranked for ``question`` (but ``exclude``), at least the top
        ``top_k`` (and every candidate the proxy is shown), and those pages by id."""
        with cache_scope(index.tenant):
            if isinstance(index, StoredIndex):
                return self._recall_stored(store, index, question, top_k, question_date, exclude)
            view = index.view
            skip = set(exclude)
            pages = [s for s in view.sessions if s.id not in skip] if skip else view.sessions
            outcome = self._rank(question, pages, question_date, index)
            return outcome, {pid: view.by_id[pid] for pid in outcome.ids[:top_k]}

    def rank_pages(
        self,
        store: Store,
        index: UserIndex | StoredIndex,
        question: str,
        page_ids: Sequence[str],
        *,
        question_date: str | None = None,
    ) -> RankOutcome:
        """The user's pages ``page_ids`` (those that exist) ranked for ``question``, alone."""
        with cache_scope(index.tenant):
            if isinstance(index, UserIndex):
                by_id = index.view.by_id
                pages = [by_id[pid].page for pid in page_ids if pid in by_id]
                return self._rank(question, pages, question_date, index)
            start = time.perf_counter()
            chosen = store.indexed_pages(index.tenant, index.user, page_ids=list(page_ids))
            found = self._evidence(store, index, question)
            at = found.positions_of([p.pk for p in chosen])
            held = sorted(
                ((pos, page) for pos, page in zip(at.tolist(), chosen, strict=True) if pos >= 0),
                key=lambda x: x[0],
            )
            where = np.asarray([pos for pos, _ in held], dtype=np.int64)
            coarse = values_at(found.positions, found.coarse, where)
            marks = values_at(found.positions, found.marks, where)
            fused, order = _fuse(coarse, np.argsort(-coarse, kind="stable"), marks, self.rrf_k)
            sessions = [p.stored.page for _, p in held]
            return self._finish(
                question, sessions, coarse, marks, fused, order, question_date, start
            )

    def user_pages(
        self, store: Store, index: UserIndex | StoredIndex, page_ids: Sequence[str]
    ) -> dict[str, StoredPage]:
        """The user's pages with these ids (those that exist), by id."""
        if isinstance(index, UserIndex):
            by_id = index.view.by_id
            return {pid: by_id[pid] for pid in page_ids if pid in by_id}
        found = store.indexed_pages(index.tenant, index.user, page_ids=list(page_ids))
        return {p.stored.page.id: p.stored for p in found}

    def _evidence(
        self,
        store: Store,
        index: StoredIndex,
        question: str,
        top: tuple[int, int] | None = None,
    ) -> Evidence:
        """``question``'s evidence over the user's pages: its BM25 tokens (repeats count) and
        bookmark terms, scored from the postings ``index`` caches, after reading those it lacks
        (what it could not cache, read at another version, serves this query only). Caching
        postings or their weights grows the index: the cache is fitted again. With ``top``, the
        pages that can change the top suffice (``StoredIndex.evidence``)."""
        assert self._bm25 is not None
        tokens, mark_terms = self._bm25.analyzer(question), query_terms(question)
        held = index.nbytes
        extra: tuple[TermArrays, TermArrays] = ({}, {})
        asked = index.missing(tokens, mark_terms)
        if asked[0] or asked[1]:
            read = store.read_terms(index.tenant, index.user, asked[0], asked[1])
            if read is not None:
                version, postings, marks = read
                extra = index.take(version, postings, marks, asked)
        found = index.evidence(tokens, mark_terms, extra, top)
        if index.nbytes > held:
            self._fit((index.tenant, index.user), index)
        return found

    def _recall_stored(
        self,
        store: Store,
        index: StoredIndex,
        question: str,
        top_k: int,
        question_date: str | None,
        exclude: Sequence[str],
    ) -> tuple[RankOutcome, dict[str, StoredPage]]:
        start = time.perf_counter()
        n = top_k if self.proxy is None else max(top_k, self.max_candidates)
        # What ``_fused_top`` ranks: the first n, or with bookmark hits each ranking's head
        # (``depth``); once the excluded pages are out, they lie among so many more.
        depth = int(np.ceil(self.rrf_k)) + 2 * n
        found = self._evidence(store, index, question, (n + len(exclude), depth + len(exclude)))
        where, coarse, marks = found.positions, found.coarse, found.marks
        excluded = np.zeros(0, dtype=np.int64)
        if exclude:
            skipped = store.indexed_pages(index.tenant, index.user, page_ids=list(exclude))
            excluded = found.positions_of([p.pk for p in skipped])
            keep = ~np.isin(where, excluded)
            where, coarse, marks = where[keep], coarse[keep], marks[keep]
        # Fused over every page with evidence (chronological, so ties fall as in a full
        # ranking); the rest of a ranking would follow in chronological order with score 0.
        top, top_fused = _fused_top(coarse, marks, self.rrf_k, n)
        best = where[top]
        by_position = np.argsort(best)  # fused scores are read at the top pages only
        if len(best) < n:  # fewer pages with evidence than n: every one was scored
            assert found.complete
            rest = np.ones(len(found.pks), dtype=bool)
            rest[where] = False
            rest[excluded[excluded >= 0]] = False
            best = np.concatenate([best, np.flatnonzero(rest)[: n - len(best)]])
        read = store.indexed_pages(index.tenant, index.user, pks=found.pks[best].tolist())
        pages = {p.pk: p for p in read}
        # Chronological again, as a full ranking hands pages to the proxy; a page deleted
        # since the index's version is left out.
        chosen = np.sort(best)
        chosen = chosen[np.isin(found.pks[chosen], list(pages))]
        rank_of = {int(pos): r for r, pos in enumerate(best.tolist())}
        local = np.argsort([rank_of[int(p)] for p in chosen], kind="stable")
        stored = [pages[int(found.pks[i])].stored for i in chosen]
        outcome = self._finish(
            question,
            [p.page for p in stored],
            values_at(where, coarse, chosen),
            values_at(where, marks, chosen),
            values_at(best[by_position], top_fused[by_position], chosen),
            local,
            question_date,
            start,
        )
        return outcome, {p.page.id: p for p in stored}

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
        ranking = self.coarse.score(question, sessions)
        coarse_order = np.array([positions[sid] for sid in ranking.ids], dtype=np.int64)
        coarse = np.zeros(len(sessions), dtype=np.float64)
        coarse[coarse_order] = ranking.scores if ranking.scores else 0.0
        marks = np.zeros(len(sessions), dtype=np.float64)
        if index is not None:
            for pid, weight in index.bookmark_hits(query_terms(question)).items():
                i = positions.get(pid)
                if i is not None:
                    marks[i] = weight
        fused, order = _fuse(coarse, coarse_order, marks, self.rrf_k)
        return self._finish(
            question, sessions, coarse, marks, fused, order, question_date, start, ids, positions
        )

    def _finish(
        self,
        question: str,
        sessions: Sequence[Session],
        coarse: np.ndarray,
        marks: np.ndarray,
        fused: np.ndarray,
        order: np.ndarray,
        question_date: str | None,
        start: float,
        ids: np.ndarray | None = None,
        positions: Mapping[str, int] | None = None,
    ) -> RankOutcome:
        """The outcome for ``sessions`` (chronological) in fused ``order``: the coarse-only one,
        or the proxy's ranking of the top ``max_candidates`` followed by the rest."""
        if not sessions:
            return RankOutcome((), self.name, None, ParseReport("not_applicable"))
        if ids is None:
            ids = np.array([s.id for s in sessions], dtype=object)
        if positions is None:
            positions = {s.id: i for i, s in enumerate(sessions)}
        coarse_ms = (time.perf_counter() - start) * 1000
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


def _fuse(
    coarse: np.ndarray, coarse_order: np.ndarray, marks: np.ndarray, rrf_k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Fused scores and the fused order of candidates with ``coarse`` scores (ranked in
    ``coarse_order``) and bookmark weights ``marks``: reciprocal-rank fusion of the two when
    any bookmark hit, else the coarse ranking itself."""
    if not marks.any():
        return coarse, coarse_order
    # Only matches take part: a page the coarse filter scored 0 has no rank to fuse, and
    # giving it one would rate "no evidence" above zero.
    matched = coarse_order[coarse[coarse_order] > 0]
    marked = np.flatnonzero(marks)
    mark_order = marked[np.argsort(-marks[marked], kind="stable")]
    fused = rrf([matched, mark_order], len(coarse), rrf_k)
    # Pages in neither list keep their coarse order after every fused one.
    return fused, coarse_order[np.argsort(-fused[coarse_order], kind="stable")]


def _ranks_of(values: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The 1-based ranks of ``values[at]`` in ``values`` ranked largest first, ties in index
    order (their places in ``np.argsort(-values, kind="stable")``), without sorting
    ``values``: each value is placed among the few distinct values asked about, so a recall
    ranks a handful of its 50K candidates in O(50K log handful)."""
    asked = np.unique(values[at])  # ascending
    place = np.searchsorted(asked, values)  # how many asked values lie below each value
    # Values above asked[m] are those placed above m.
    above = np.cumsum(np.bincount(place, minlength=len(asked) + 1)[::-1])[::-1][1:]
    # Ties: each value equal to an asked one counts, for the later ones, in index order.
    tied = np.flatnonzero(np.append(asked, np.inf)[place] == values)
    group = place[tied].astype(np.uint16 if len(asked) < 2**16 else np.int64)  # radix sort
    by_group = np.argsort(group, kind="stable")
    grouped = group[by_group]
    before = np.empty(len(tied), dtype=np.int64)
    before[by_group] = np.arange(len(tied)) - np.searchsorted(grouped, grouped)
    return 1 + above[np.searchsorted(asked, values[at])] + before[np.searchsorted(tied, at)]


def _head(values: np.ndarray, depth: int) -> np.ndarray:
    """Indices of the first ``depth`` of ``values`` in stable order (largest first, ties in
    index order), ascending."""
    if len(values) <= depth:
        return np.arange(len(values))
    floor = np.partition(values, len(values) - depth)[len(values) - depth]
    above = np.flatnonzero(values > floor)
    tied = np.flatnonzero(values == floor)[: depth - len(above)]
    return np.sort(np.concatenate([above, tied]))


def _fused_top(
    coarse: np.ndarray, marks: np.ndarray, rrf_k: int, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """The first ``n`` of ``_fuse``'s order (fused score, then coarse score, then index) of
    candidates with ``coarse`` scores and bookmark weights ``marks``, and their fused scores,
    without ranking every candidate: a recall over a 100K-page history has tens of thousands
    of candidates and wants five.

    With bookmarks, only pages among the first ``depth = rrf_k + 2n`` of either ranking can
    be in the top ``n``: any other page scores at most ``2 / (rrf_k + depth + 1)``, below the
    ``1 / (rrf_k + n)`` that each of the first ``n`` pages of the longer ranking (which has at
    least ``n`` matches, or every candidate is ranked) holds. Those pages' exact ranks in both
    rankings give their exact fused scores."""
    if not marks.any():
        head = np.arange(len(coarse))
        if len(coarse) > n:
            # Every candidate at or above the n-th best score, ties at the boundary included.
            floor = np.partition(coarse, len(coarse) - n)[len(coarse) - n]
            head = np.flatnonzero(coarse >= floor)
        order = head[np.lexsort((head, -coarse[head]))][:n]
        return order, coarse[order]
    # Each ranking holds its matches only (rrf's lists): their positions and scores.
    hits = (np.flatnonzero(coarse > 0), np.flatnonzero(marks > 0))
    rankings = [(hit, values[hit]) for hit, values in zip(hits, (coarse, marks), strict=True)]
    depth = int(np.ceil(rrf_k)) + 2 * n
    if max(len(hit) for hit, _ in rankings) < n or len(coarse) <= 4 * depth:
        head = np.arange(len(coarse))
    else:
        head = np.union1d(*(hit[_head(held, depth)] for hit, held in rankings))
    fused = np.zeros(len(head), dtype=np.float64)
    for hit, held in rankings:  # rrf's order of additions: coarse, then bookmarks
        at = np.searchsorted(hit, head).clip(max=max(len(hit) - 1, 0))
        inside = hit[at] == head if len(hit) else np.zeros(len(head), dtype=bool)
        fused[inside] += 1.0 / (rrf_k + _ranks_of(held, at[inside]))
    best = np.lexsort((head, -coarse[head], -fused))[:n]
    return head[best], fused[best]


def _bounded(coarse: CoarseFilter, max_bytes: int) -> CoarseFilter:
    """A BM25 filter with its cache bounded in bytes; other filters as they are (a dense
    filter's cache holds one embedding per page, bounded by its own rules)."""
    if type(coarse) is BM25Filter:
        return ByteBoundedBM25(coarse, max_bytes)
    return coarse
