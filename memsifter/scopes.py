"""Cache scopes: the one switch that keys every content-keyed cache by its caller too.

A cache keyed by content alone is an oracle when callers who must not learn of each other share
it. A hit answers in a fraction of a miss's time, so a service's tenant B, timing a request,
learns whether anyone sent that exact page or haystack before (a BM25 index found again took
0.3 ms where building it took 37). ``cache_scope(name)`` makes every such cache consulted in its
context (its thread, or its asyncio task: a ``ContextVar``) key by ``name`` as well, so a scope
finds only what it cached itself. Outside every scope a key is the content alone, as before
scopes existed: a training or eval run, the only caller, shares everything it can.

The caches that honour it, each keeping its bounds for all scopes together (a scope changes what
a key is, never how many entries or bytes a cache may hold):

* ``coarse.cache.HaystackCache``: BM25 indexes of whole haystacks;
* ``coarse.dense.EmbeddingFilter`` (and ``BGEM3Filter``): passage vectors per session, the last
  haystack's stacked matrix, and the on-disk ``EmbeddingCache``'s rows;
* ``data.tokens.SessionTokenCache``: token counts per page;
* ``ranker.prompt_ids.PageIds``: a page's prompt token ids;
* ``text.Analyzer``: the word -> stem memo, one per scope (shared, 40 documents of rare words
  were indexed in 14 ms after another tenant had sent them, 16 ms otherwise).

Caches keyed by something other than what a caller sent (the prompt's labels, by position) need
no scope. It lives at the bottom of the package's layers so that a cache on any floor reads the
one scope; the service sets it (``serving.ranking``: every ranking and every catch-up of a user's
index; ``serving.memory``: segmenting, bookmarking and ranking facts).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

# A content key as a cache stores it: the key itself outside every scope, else (scope, key).
ScopedKey = str | tuple[str, str]

_scope: ContextVar[str | None] = ContextVar("memsifter_cache_scope", default=None)


@contextmanager
def cache_scope(name: str) -> Iterator[None]:
    """Key every content-keyed cache consulted in this context by ``name`` too (see the module
    doc): what is cached in one scope is a miss in every other, and outside all of them."""
    token = _scope.set(name)
    try:
        yield
    finally:
        _scope.reset(token)


def current_scope() -> str | None:
    """The name of the ``cache_scope`` in force, or None outside every scope."""
    return _scope.get()


def scoped(key: str) -> ScopedKey:
    """``key`` as a cache in the current scope stores it. A pair never equals a string, so a
    scoped entry is never found outside its scope, nor an unscoped one inside any scope."""
    scope = _scope.get()
    return key if scope is None else (scope, key)
