"""Coarse filters: cheap rankers that cut a long history down to the proxy's window.

Build one from a spec string (CLI, YAML configs and the server all use this):

* ``bm25``; ``minilm``; ``wordllama``; ``bge-m3`` / ``bge-m3-sparse`` (``:/local/folder``);
* ``st:<model>`` for any sentence-transformers model (hub id or folder);
* ``hybrid:bm25+minilm`` for reciprocal-rank fusion of any of the above.

``embedding_cache`` (a folder) keeps the dense filters' passage vectors on disk across runs
(``memsifter.coarse.dense.EmbeddingCache``); members of a hybrid share it.

Variants for a long-lived process (the recall service): ``LockedCoarse`` shares any filter
between threads, ``ByteBoundedBM25`` bounds a BM25 filter's ``HaystackCache`` in bytes, and
``IncrementalBM25`` scores like ``BM25Filter`` over documents added and removed one at a time;
``cache_scope(name)`` (``memsifter.scopes``) keeps what one caller caches, haystacks and passage
vectors alike, out of every other's.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from memsifter.coarse.base import CoarseFilter, Selection, rank_by_scores
from memsifter.coarse.bm25 import BM25Filter, ByteBoundedBM25
from memsifter.coarse.cache import Haystack, HaystackCache, haystack_bytes
from memsifter.coarse.hybrid import HybridFilter
from memsifter.coarse.incremental import IncrementalBM25
from memsifter.coarse.locked import LockedCoarse
from memsifter.errors import UnknownNameError
from memsifter.scopes import cache_scope

if TYPE_CHECKING:
    from memsifter.coarse.dense import EmbeddingCache

OFFLINE_FILTERS = ("bm25", "minilm", "wordllama", "hybrid:bm25+minilm")


def build_filter(
    spec: str, *, embedding_cache: str | Path | EmbeddingCache | None = None, **options: Any
) -> CoarseFilter:
    spec = spec.strip()
    if isinstance(embedding_cache, str | Path):
        from memsifter.coarse.dense import EmbeddingCache

        embedding_cache = EmbeddingCache(embedding_cache)
    if spec.startswith("hybrid:"):
        members = [
            build_filter(m, embedding_cache=embedding_cache, **options)
            for m in spec.removeprefix("hybrid:").split("+")
        ]
        return HybridFilter(members)
    name, _, arg = spec.partition(":")
    if name == "bm25":
        return BM25Filter()
    if name == "minilm":
        from memsifter.coarse.dense import SentenceTransformerFilter

        return SentenceTransformerFilter("minilm", cache=embedding_cache)
    if name == "st" and arg:
        from memsifter.coarse.dense import SentenceTransformerFilter

        return SentenceTransformerFilter(arg, cache=embedding_cache)
    if name == "wordllama":
        from memsifter.coarse.dense import WordLlamaFilter

        return WordLlamaFilter(cache=embedding_cache)
    if name in ("bge-m3", "bge-m3-sparse"):
        from memsifter.coarse.bge_m3 import BGEM3Filter

        return BGEM3Filter(
            arg or options.get("bge_m3_model", "BAAI/bge-m3"), use_sparse=name == "bge-m3-sparse"
        )
    raise UnknownNameError(
        f"unknown coarse filter {spec!r}; use bm25, minilm, wordllama, bge-m3[-sparse][:PATH], "
        "st:MODEL or hybrid:A+B"
    )


__all__ = [
    "BM25Filter",
    "ByteBoundedBM25",
    "CoarseFilter",
    "Haystack",
    "HaystackCache",
    "HybridFilter",
    "IncrementalBM25",
    "LockedCoarse",
    "OFFLINE_FILTERS",
    "Selection",
    "build_filter",
    "cache_scope",
    "haystack_bytes",
    "rank_by_scores",
]
