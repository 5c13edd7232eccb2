"""The ranker inside the service: coarse filter (fused with bookmark hits) -> proxy, or the
coarse stage alone when the service runs ``coarse-only``.

* **Coarse.** One coarse filter (``memsifter.coarse.build_filter``) shared by every user behind a
  lock: its caches are plain dicts, and scoring is milliseconds. The memory store's pages of a
  user are loaded once per *version* of that user (bumped by every ingest and delete, in the
  database, so every replica sees it) and kept in an LRU of ``index_cache_users`` users; the
  coarse index is built when that happens, at ingest on the replica that ingested and lazily on
  the others. bm25s has no incremental update, so this in-memory per-user index, rebuilt only
  when that user's pages changed, stands in for a persisted one.
* **Bookmarks.** Pages whose keywords share a term with the question form a second ranking;
  the two are fused by reciprocal rank (``1/(k + rank)``, k = 60).
* **Proxy.** The fused top ``max_candidates`` go through ``memsifter.ranker.proxy.Proxy``: the
  one prompt builder and the one parser, so session text cannot steer how the answer is read.
  The proxy's order comes first, then the rest in fused order. A backend failure is a 503, not a
  silent fall back to coarse-only: every response says which ranker produced it.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from memsifter.coarse import build_filter
from memsifter.coarse.base import CoarseFilter, Selection
from memsifter.data.tokens import SessionTokenCache, TokenCounter
from memsifter.data.types import Ranking, Session
from memsifter.errors import MemSifterError, PromptBudgetError
from memsifter.ranker.backends.base import Backend
from memsifter.ranker.proxy import Proxy, ProxyConfig
from memsifter.serving.config import ServeConfig
from memsifter.serving.errors import ServeError, UnavailableError
from memsifter.serving.store import Store, StoredPage

COARSE_ONLY = "coarse-only"


class LockedCoarse(CoarseFilter):
    """A coarse filter safe to share between request threads (and with the proxy)."""

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
    ) -> Selection:
        with self._lock:
            return self.inner.select(query, sessions, budget_tokens, counter)


def rrf(rankings: Sequence[Sequence[str]], k: int = 60) -> dict[str, float]:
    """Reciprocal-rank fusion: id -> sum of 1/(k + rank), rank from 1."""
    fused: dict[str, float] = {}
    for ranking in rankings:
        for rank, sid in enumerate(ranking, start=1):
            fused[sid] = fused.get(sid, 0.0) + 1.0 / (k + rank)
    return fused


@dataclass(frozen=True)
class ParseReport:
    status: str  # ok | failed | not_applicable (coarse-only)
    error: str | None = None
    completed: bool = False  # the proxy's ranking was filled from the coarse order
    n_from_model: int = 0
    dropped: int = 0
    duplicates: int = 0


@dataclass(frozen=True)
class RankOutcome:
    ids: tuple[str, ...]  # every candidate, best first
    score: dict[str, float]  # the fused coarse(+bookmark) score; the proxy orders, not scores
    coarse_score: dict[str, float]
    bookmark_score: dict[str, float]
    ranker: str
    think: str | None
    parse: ParseReport
    timings_ms: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class UserIndex:
    version: int
    pages: tuple[StoredPage, ...]
    sessions: tuple[Session, ...]  # the pages as the coarse filter and proxy see them
    by_id: dict[str, StoredPage]


class ServiceRanker:
    def __init__(
        self,
        coarse: CoarseFilter,
        backend: Backend | None = None,
        proxy_config: ProxyConfig | None = None,
        *,
        max_candidates: int = 40,
        max_concurrency: int = 1,
        rrf_k: int = 60,
        index_cache_users: int = 256,
        name: str | None = None,
    ) -> None:
        cache_size = getattr(coarse, "cache_size", None)
        if isinstance(cache_size, int):
            # The filter's own LRU of built indexes must outlive ours, or a cached user would
            # have the index rebuilt on a query; the headroom is for stateless /v1/rank calls.
            setattr(coarse, "cache_size", max(cache_size, index_cache_users + 64))  # noqa: B010
        self.coarse = LockedCoarse(coarse)
        self.backend = backend
        self.proxy = (
            Proxy(backend, self.coarse, proxy_config or ProxyConfig())
            if backend is not None
            else None
        )
        self.max_candidates = max_candidates
        self.rrf_k = rrf_k
        self.name = name or (COARSE_ONLY if backend is None else f"proxy:{backend.name}")
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self._indexes: OrderedDict[tuple[str, str], UserIndex] = OrderedDict()
        self._index_lock = threading.Lock()
        self._index_cache_users = index_cache_users
        self.on_proxy: Callable[[float, ParseReport], None] | None = None  # metrics hook

    @classmethod
    def from_config(cls, config: ServeConfig) -> ServiceRanker:
        p = config.proxy
        backend: Backend | None = None
        if p.backend == "transformers":
            from memsifter.ranker.backends import build_backend

            backend = build_backend("transformers", p.model)
        elif p.backend == "openai":
            from memsifter.ranker.backends import build_backend

            backend = build_backend(
                "openai",
                p.model,
                base_url=p.base_url,
                served_model_name=p.served_model_name,
                max_concurrency=p.max_concurrency,
                timeout_s=p.timeout_s,
            )
        proxy_config = ProxyConfig(
            window_tokens=p.window_tokens,
            completion_tokens=p.completion_tokens,
            temperature=p.temperature,
            language=p.language,
        )
        return cls(
            build_filter(config.coarse),
            backend,
            proxy_config,
            max_candidates=p.max_candidates,
            max_concurrency=p.max_concurrency,
            rrf_k=config.bookmarks.rrf_k,
            index_cache_users=config.index_cache_users,
            name=config.ranker_name,
        )

    @property
    def coarse_only(self) -> bool:
        return self.proxy is None

    # -- per-user page indexes

    def user_index(self, store: Store, tenant: str, user: str) -> UserIndex | None:
        """The user's pages, reloaded (and re-indexed) only when their version moved on."""
        key = (tenant, user)
        version = store.user_version(tenant, user)
        if version is None:
            return None
        with self._index_lock:
            cached = self._indexes.get(key)
            if cached is not None and cached.version == version:
                self._indexes.move_to_end(key)
                return cached
        loaded_version, pages = store.load_pages(tenant, user)
        if loaded_version is None:
            return None
        sessions = tuple(p.page for p in pages)
        if sessions:
            self.coarse.index(sessions)
        index = UserIndex(loaded_version, tuple(pages), sessions, {p.page.id: p for p in pages})
        with self._index_lock:
            current = self._indexes.get(key)
            # A concurrent request may have loaded a newer version meanwhile; keep the newest.
            if current is None or current.version <= index.version:
                self._indexes[key] = index
                self._indexes.move_to_end(key)
            while len(self._indexes) > self._index_cache_users:
                self._indexes.popitem(last=False)
        return index

    def forget_user(self, tenant: str, user: str) -> None:
        with self._index_lock:
            self._indexes.pop((tenant, user), None)

    # -- ranking

    def rank(
        self,
        question: str,
        sessions: Sequence[Session],
        *,
        question_date: str | None = None,
        bookmark_score: dict[str, float] | None = None,
    ) -> RankOutcome:
        """Rank ``sessions`` (pages or sessions) for ``question``; see the module doc."""
        start = time.perf_counter()
        if not sessions:
            return RankOutcome((), {}, {}, {}, self.name, None, ParseReport("not_applicable"))
        coarse = self.coarse.score(question, sessions)
        coarse_ms = (time.perf_counter() - start) * 1000
        coarse_score = dict(zip(coarse.ids, coarse.scores, strict=False))
        bookmark_score = {k: v for k, v in (bookmark_score or {}).items() if k in coarse_score}
        if bookmark_score:
            marks = sorted(bookmark_score, key=lambda sid: -bookmark_score[sid])
            # Only matches take part: a page BM25 scored 0 has no rank to fuse, and giving it
            # one would rate "no evidence" above zero.
            matched = [sid for sid in coarse.ids if coarse_score[sid] > 0]
            fused = {sid: 0.0 for sid in coarse.ids} | rrf([matched, marks], self.rrf_k)
            order = sorted(coarse.ids, key=lambda sid: -fused[sid])  # stable: coarse breaks ties
        else:
            fused = coarse_score
            order = list(coarse.ids)
        timings = {"coarse_ms": coarse_ms}
        if self.proxy is None:
            timings["total_ms"] = (time.perf_counter() - start) * 1000
            report = ParseReport("not_applicable")
            return RankOutcome(
                tuple(order), fused, coarse_score, bookmark_score, self.name, None, report, timings
            )

        by_id = {s.id: s for s in sessions}
        shown = [by_id[sid] for sid in order[: self.max_candidates]]
        proxy_start = time.perf_counter()
        try:
            with self._slots:
                result = self.proxy.rank(question, shown, question_date)
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
        )
        if self.on_proxy is not None:
            self.on_proxy(proxy_s, report)
        ranked = list(result.ranking.ids)
        seen = set(ranked)
        ranked += [sid for sid in order if sid not in seen]
        timings["proxy_ms"] = proxy_s * 1000
        # proxy_ms also holds prompt building, parsing and the wait for a slot; the model's own
        # share is what the backend timed, so "overhead over the model call" can be measured.
        timings["model_ms"] = result.generation.latency_s * 1000
        timings["total_ms"] = (time.perf_counter() - start) * 1000
        return RankOutcome(
            tuple(ranked),
            fused,
            coarse_score,
            bookmark_score,
            self.name,
            parsed.think,
            report,
            timings,
        )
