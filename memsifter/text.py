"""Lexical analysis shared by BM25, keyword bookmarks and topic segmentation.

English: lowercase, ``\\w\\w+`` words, English stopwords, Snowball stemming (PyStemmer).
Chinese: CJK runs are cut with jieba and filtered with a Chinese stopword list. Mixed text gets
both. Stems (and stopword-ness) are memoised per word because per-token work, not the regex,
dominates on big corpora.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

import Stemmer
from bm25s.stopwords import STOPWORDS_CHINESE, STOPWORDS_EN

_WORD = re.compile(r"(?u)\b\w\w+\b")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
_STOP_EN = frozenset(STOPWORDS_EN)
_STOP_ZH = frozenset(STOPWORDS_CHINESE)


class Analyzer:
    def __init__(self, language: str = "english") -> None:
        self.language = language
        self._stemmer = Stemmer.Stemmer(language)
        # word -> stem, or "" for a stopword: one C-level dict lookup per token does both the
        # stopword test and the stemming (a Python call per token was most of indexing time).
        self._memo: dict[str, str] = {}

    def _learn(self, words: Iterable[str]) -> None:
        new = list(set(words).difference(self._memo))
        stems = self._stemmer.stemWords(new)
        self._memo.update(
            (w, "" if w in _STOP_EN else st) for w, st in zip(new, stems, strict=True)
        )

    def _english(self, words: list[str]) -> list[str]:
        try:
            return list(filter(None, map(self._memo.__getitem__, words)))
        except KeyError:
            self._learn(words)
            return list(filter(None, map(self._memo.__getitem__, words)))

    def __call__(self, text: str) -> list[str]:
        text = text.lower()
        return self._english(_WORD.findall(text)) if _plain(text) else self._mixed(text)

    def term_ids(self, texts: Iterable[str]) -> tuple[list[list[int]], dict[str, int]]:
        """Each text's terms (those ``__call__`` gives) as ids, and the term -> id vocabulary.

        For indexing a corpus: each distinct word is analysed once and every token costs one
        C-level dict lookup, with no per-token term strings. Id 0 is the empty term ``""``, which
        no text produces (bm25s uses it as its empty token); stopwords map to it and are dropped.
        """
        vocab: dict[str, int] = {"": 0}
        word_ids: dict[str, int] = {}
        lookup = word_ids.__getitem__
        out: list[list[int]] = []
        for text in texts:
            text = text.lower()
            if not _plain(text):
                out.append([vocab.setdefault(t, len(vocab)) for t in self._mixed(text)])
                continue
            words = _WORD.findall(text)
            try:
                out.append(list(filter(None, map(lookup, words))))
            except KeyError:
                # New words of this text in first-seen order, so ids are reproducible.
                new = [w for w in dict.fromkeys(words) if w not in word_ids]
                self._learn(new)
                for w in new:
                    term = self._memo[w]
                    word_ids[w] = vocab.setdefault(term, len(vocab)) if term else 0
                out.append(list(filter(None, map(lookup, words))))
        return out, vocab

    def _mixed(self, text: str) -> list[str]:
        import jieba

        out: list[str] = []
        pos = 0
        for m in _CJK.finditer(text):
            out.extend(self._english(_WORD.findall(text[pos : m.start()])))
            out.extend(
                w for w in jieba.lcut(m.group(), HMM=True) if w.strip() and w not in _STOP_ZH
            )
            pos = m.end()
        out.extend(self._english(_WORD.findall(text[pos:])))
        return out


def _plain(lowered: str) -> bool:
    """No CJK in the text. isascii() is a flag check; the CJK regex scans the whole text."""
    return lowered.isascii() or _CJK.search(lowered) is None


@lru_cache(maxsize=4)
def get_analyzer(language: str = "english") -> Analyzer:
    return Analyzer(language)


def analyze(text: str) -> list[str]:
    return get_analyzer()(text)
