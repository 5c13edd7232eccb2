"""``memsifter.scopes``: inside ``cache_scope(name)`` every content-keyed cache keys by the name
too. Each cache that honours it (BM25's ``HaystackCache``, the dense filter's vectors and its
rows on disk, the token counts per page, the prompt's page ids, the analyzer's stem memo) is
counted in the work a miss does: a scope pays for what another scope cached exactly as for
what nobody sent, in either order, its own repeat is free, and outside every scope a key is the
content alone. The bounds stay one per cache. The service's tenants:
tests/serving/test_serve_ranking.py and tests/serving/test_serve_isolation.py."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import NamedTuple

import pytest

from memsifter.coarse import BM25Filter
from memsifter.coarse.dense import EmbeddingCache
from memsifter.data.tokens import ApproxCounter, SessionTokenCache
from memsifter.data.types import Session, Turn
from memsifter.ranker.prompt_ids import PageIds
from memsifter.scopes import cache_scope, current_scope
from memsifter.testing.coarse import LetterFilter
from memsifter.text import Analyzer

QUERY = "zebra"
N_PAGES = 4


def _pages(tag: str) -> list[Session]:
    """New objects each call, as every request parses its own: only content can match. Every
    word holds the tag, so two sets share no word either."""
    return [
        Session(id=f"{tag}-{i}", turns=(Turn("user", f"{tag}page{i} {tag}zebra{i} {tag}"),))
        for i in range(N_PAGES)
    ]


class Probe(NamedTuple):
    use: Callable[[list[Session]], object]  # what one request does with the cache
    work: Callable[[], int]  # what it computed so far (pages indexed, embedded ..., words stemmed)
    per_set: int = N_PAGES  # what a set of _pages costs when nothing is cached


def _bm25(_tmp: Path) -> Probe:
    bm25 = BM25Filter()
    built: list[int] = []
    build = bm25.build_index

    def counted_build(sessions: list[Session]) -> object:
        built.append(len(sessions))
        return build(sessions)

    bm25.build_index = counted_build  # type: ignore[method-assign]
    return Probe(lambda pages: bm25.score(QUERY, pages), lambda: sum(built))


def _dense(_tmp: Path) -> Probe:
    dense = LetterFilter()
    return Probe(
        lambda pages: dense.score(QUERY, pages), lambda: sum(t != QUERY for t in dense.encoded)
    )


def _dense_rows_on_disk(tmp: Path) -> Probe:
    # A new filter per request, as a new process: only the rows on disk can be found again.
    embedded: list[str] = []

    def use(pages: list[Session]) -> None:
        dense = LetterFilter(cache=EmbeddingCache(tmp))
        dense.score(QUERY, pages)
        embedded.extend(t for t in dense.encoded if t != QUERY)

    return Probe(use, lambda: len(embedded))


class _Counting(ApproxCounter):
    def __init__(self) -> None:
        self.texts: list[str] = []

    def count(self, text: str) -> int:
        self.texts.append(text)
        return super().count(text)


def _token_counts(_tmp: Path) -> Probe:
    counter = _Counting()
    counts = SessionTokenCache(counter)
    return Probe(lambda pages: [counts(p) for p in pages], lambda: len(counter.texts))


def _page_ids(_tmp: Path) -> Probe:
    encoded: list[str] = []

    def encode(texts: list[str]) -> list[list[int]]:
        encoded.extend(texts)
        return [[len(t)] for t in texts]

    ids = PageIds(encode, Session.render)
    return Probe(lambda pages: [ids(p) for p in pages], lambda: len(encoded))


class _CountingStemmer:
    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.words: list[str] = []

    def stemWords(self, words: list[str]) -> list[str]:  # noqa: N802 - PyStemmer's name
        self.words.extend(words)
        return self.inner.stemWords(words)  # type: ignore[attr-defined]


def _stems(_tmp: Path) -> Probe:
    analyzer = Analyzer()
    stemmer = analyzer._stemmer = _CountingStemmer(analyzer._stemmer)  # type: ignore[assignment]
    return Probe(
        lambda pages: analyzer.term_ids(p.turns[0].text for p in pages),
        lambda: len(stemmer.words),
        per_set=2 * N_PAGES + 1,
    )


PROBES: dict[str, Callable[[Path], Probe]] = {
    "bm25": _bm25,
    "dense": _dense,
    "dense-on-disk": _dense_rows_on_disk,
    "token-counts": _token_counts,
    "page-ids": _page_ids,
    "stems": _stems,
}


@pytest.mark.parametrize("first, second", [("acme", "globex"), ("globex", "acme")])
@pytest.mark.parametrize("cache", PROBES)
def test_a_scope_pays_for_what_another_cached_as_for_what_nobody_sent(
    cache: str, first: str, second: str, tmp_path: Path
) -> None:
    probe = PROBES[cache](tmp_path)

    def work(scope: str | None, tag: str) -> int:
        before = probe.work()
        with nullcontext() if scope is None else cache_scope(scope):
            probe.use(_pages(tag))
        return probe.work() - before

    miss = probe.per_set
    assert work(first, "sent") == miss
    assert work(second, "sent") == work(second, "unsent") == miss
    assert work(first, "sent") == work(second, "sent") == 0  # each scope's own repeat hits
    # Outside every scope the key is the content alone: no scope's entry, and one for all.
    assert work(None, "sent") == miss
    assert work(None, "sent") == 0


def test_the_bounds_hold_every_scope_together() -> None:
    counts = SessionTokenCache(ApproxCounter(), max_size=3)
    ids = PageIds(lambda texts: [[len(t)] for t in texts], Session.render, max_size=3)
    for scope in ("acme", "globex"):
        with cache_scope(scope):
            for page in _pages("sent")[:2]:
                counts(page)
                ids(page)
    assert len(counts) == len(ids) == 3


def test_the_analyzers_scoped_memos_stay_within_their_bound() -> None:
    analyzer = Analyzer(max_scoped_words=10)
    stemmer = analyzer._stemmer = _CountingStemmer(analyzer._stemmer)  # type: ignore[assignment]
    plain = Analyzer()  # the terms to expect

    def stems(scope: str, text: str) -> int:
        before = len(stemmer.words)
        with cache_scope(scope):
            assert analyzer(text) == plain(text)
        return len(stemmer.words) - before

    four = "running dogs jumped quickly"
    assert stems("acme", four) == 4 and stems("acme", four) == 0
    # globex's 8 words do not fit beside acme's 4: acme's memo, the least recently used, goes.
    assert stems("globex", "one two three four five six seven eight") == 8
    assert stems("acme", four) == 4
    # 12 words are over the bound alone: learned all the same (the call reads them back) ...
    twelve = " ".join(f"word{i}" for i in range(12))
    assert stems("initech", twelve) == 12 and stems("initech", "word0 word1") == 0
    # ... until the next miss, which starts the scope's memo over.
    assert stems("initech", "another") == 1 and stems("initech", "word0") == 1
    assert analyzer("running") == plain("running")  # outside every scope: its own memo


def test_scopes_nest_and_end_with_their_block() -> None:
    assert current_scope() is None
    with cache_scope("acme"):
        with cache_scope("globex"):
            assert current_scope() == "globex"
        assert current_scope() == "acme"
    assert current_scope() is None


def test_embedding_rows_outside_every_scope_keep_the_keys_written_before_scopes() -> None:
    # A benchmark's cache folder from before scopes existed is read, not re-embedded.
    assert EmbeddingCache.key("letters", "a passage") == (
        hashlib.sha1(b"letters\x00a passage").hexdigest()
    )
    keys = {
        EmbeddingCache.key("letters", text, scope)
        for scope, text in [(None, "b"), ("a", "b"), ("a\x00b", ""), ("", "a\x00b"), ("ab", "")]
    }
    assert len(keys) == 5
