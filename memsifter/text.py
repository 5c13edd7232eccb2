"""Lexical analysis shared by BM25, keyword bookmarks and topic segmentation.

English: lowercase, ``\\w\\w+`` words, English stopwords, Snowball stemming (PyStemmer).
Chinese: CJK runs are cut with jieba and filtered with a Chinese stopword list. Mixed text gets
both. Stems (and stopword-ness) are memoised per word because per-token work, not the regex,
dominates on big corpora.

The memo is keyed by the ``cache_scope`` in force (``memsifter.scopes``): a word another tenant
taught the process is new to this one. Shared, the memo and PyStemmer's own word cache were a
signal: 40 documents of rare words (about 4,500 distinct) were indexed in a median 17 ms by a
tenant after another had sent them, and 24 ms when nobody had (PyStemmer's cache, now off); 14
and 16 ms with only the memo shared. Outside every scope there is one memo, unbounded, as before
scopes (a training or eval run); the scoped memos hold at most ``MAX_SCOPED_WORDS`` words
together, the least recently used scope's dropped first.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Iterable
from functools import lru_cache

import Stemmer
from bm25s.stopwords import STOPWORDS_CHINESE, STOPWORDS_EN

from memsifter.scopes import current_scope

_WORD = re.compile(r"(?u)\b\w\w+\b")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
_STOP_EN = frozenset(STOPWORDS_EN)
_STOP_ZH = frozenset(STOPWORDS_CHINESE)
# Words the scoped memos hold together (~150 B each: ~40 MB), a few tenants' vocabularies.
MAX_SCOPED_WORDS = 250_000
# Bumped whenever a text's terms change (the word pattern, stopwords, stemming): terms stored
# under an older ``Analyzer.identity`` (the recall service's postings) are then indexed again.
ANALYZER_VERSION = 1


class Analyzer:
    def __init__(self, language: str = "english", max_scoped_words: int = MAX_SCOPED_WORDS) -> None:
        self.language = language
        self.max_scoped_words = max_scoped_words
        # Without PyStemmer's own word cache (size 0): only words our memo lacks reach the
        # stemmer, which makes its cache dead weight, and one cache for every scope would tell
        # a tenant which words another had sent (a third off stemming them).
        self._stemmer = Stemmer.Stemmer(language, 0)
        # word -> stem, or "" for a stopword: one C-level dict lookup per token does both the
        # stopword test and the stemming (a Python call per token was most of indexing time).
        self._memo: dict[str, str] = {}  # outside every scope
        self._scoped: OrderedDict[str, dict[str, str]] = OrderedDict()  # scope -> its memo
        self._lock = threading.Lock()  # request threads pick and drop scoped memos

    @property
    def identity(self) -> str:
        """What decides a text's terms: stored terms are valid while this is unchanged."""
        return f"{self.language}/v{ANALYZER_VERSION}/{Stemmer.version()}"

    def _current_memo(self) -> dict[str, str]:
        scope = current_scope()
        if scope is None:
            return self._memo
        with self._lock:
            memo = self._scoped.get(scope)
            if memo is None:
                memo = self._scoped[scope] = {}
            self._scoped.move_to_end(scope)
        return memo

    def _learn(self, memo: dict[str, str], words: Iterable[str]) -> dict[str, str]:
        """A memo holding ``words``: ``memo`` with the new ones added, or the scope's new memo
        when the old one had to go to stay within ``max_scoped_words`` (``_room``)."""
        unique = set(words)
        if memo is not self._memo:
            memo = self._room(memo, len(unique.difference(memo)))
        new = list(unique.difference(memo))
        stems = self._stemmer.stemWords(new)
        memo.update((w, "" if w in _STOP_EN else st) for w, st in zip(new, stems, strict=True))
        return memo

    def _room(self, memo: dict[str, str], n: int) -> dict[str, str]:
        """The memo of the current scope to learn ``n`` more words into: ``memo``, once the least
        recently used other scopes' memos are dropped until the words fit, or a new one in its
        place when ``memo`` alone is too big. A memo is replaced, never emptied: another thread
        may have just learned into it, and reads its words back."""
        with self._lock:
            held = sum(map(len, self._scoped.values()))
            for scope in list(self._scoped):
                if held + n <= self.max_scoped_words:
                    return memo
                if self._scoped[scope] is not memo:
                    held -= len(self._scoped.pop(scope))
            if held + n <= self.max_scoped_words:
                return memo
            fresh: dict[str, str] = {}
            scope = current_scope()
            if scope is not None:
                self._scoped[scope] = fresh
            return fresh

    def _english(self, words: list[str], memo: dict[str, str]) -> list[str]:
        try:
            return list(filter(None, map(memo.__getitem__, words)))
        except KeyError:
            memo = self._learn(memo, words)
            return list(filter(None, map(memo.__getitem__, words)))

    def __call__(self, text: str) -> list[str]:
        text = text.lower()
        memo = self._current_memo()
        if _plain(text):
            return self._english(_WORD.findall(text), memo)
        return self._mixed(text, memo)

    def term_ids(self, texts: Iterable[str]) -> tuple[list[list[int]], dict[str, int]]:
        """Each text's terms (those ``__call__`` gives) as ids, and the term -> id vocabulary.

        For indexing a corpus: each distinct word is analysed once and every token costs one
        C-level dict lookup, with no per-token term strings. Id 0 is the empty term ``""``, which
        no text produces (bm25s uses it as its empty token); stopwords map to it and are dropped.
        """
        memo = self._current_memo()
        vocab: dict[str, int] = {"": 0}
        word_ids: dict[str, int] = {}
        lookup = word_ids.__getitem__
        out: list[list[int]] = []
        for text in texts:
            text = text.lower()
            if not _plain(text):
                out.append([vocab.setdefault(t, len(vocab)) for t in self._mixed(text, memo)])
                continue
            words = _WORD.findall(text)
            try:
                out.append(list(filter(None, map(lookup, words))))
            except KeyError:
                # New words of this text in first-seen order, so ids are reproducible.
                new = [w for w in dict.fromkeys(words) if w not in word_ids]
                memo = self._learn(memo, new)
                for w in new:
                    term = memo[w]
                    word_ids[w] = vocab.setdefault(term, len(vocab)) if term else 0
                out.append(list(filter(None, map(lookup, words))))
        return out, vocab

    def _mixed(self, text: str, memo: dict[str, str]) -> list[str]:
        import jieba

        out: list[str] = []
        pos = 0
        for m in _CJK.finditer(text):
            out.extend(self._english(_WORD.findall(text[pos : m.start()]), memo))
            out.extend(
                w for w in jieba.lcut(m.group(), HMM=True) if w.strip() and w not in _STOP_ZH
            )
            pos = m.end()
        out.extend(self._english(_WORD.findall(text[pos:]), memo))
        return out


def _plain(lowered: str) -> bool:
    """No CJK in the text. isascii() is a flag check; the CJK regex scans the whole text."""
    return lowered.isascii() or _CJK.search(lowered) is None


@lru_cache(maxsize=4)
def get_analyzer(language: str = "english") -> Analyzer:
    return Analyzer(language)


def analyze(text: str) -> list[str]:
    return get_analyzer()(text)
