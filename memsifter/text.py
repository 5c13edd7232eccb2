"""Lexical analysis shared by BM25, keyword bookmarks and topic segmentation.

English: lowercase, ``\\w\\w+`` words, English stopwords, Snowball stemming (PyStemmer).
Chinese: CJK runs are cut with jieba and filtered with a Chinese stopword list. Mixed text gets
both. Stems (and stopword-ness) are memoised per word because per-token work, not the regex,
dominates on big corpora.
"""

from __future__ import annotations

import re
from functools import lru_cache

import Stemmer
from bm25s.stopwords import STOPWORDS_CHINESE, STOPWORDS_EN

_WORD = re.compile(r"(?u)\b\w\w+\b")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
_STOP_EN = frozenset(STOPWORDS_EN)
_STOP_ZH = frozenset(STOPWORDS_CHINESE)


class Analyzer:
    def __init__(self, language: str = "english") -> None:
        self._stemmer = Stemmer.Stemmer(language)
        # word -> stem, or "" for a stopword: one C-level dict lookup per token does both the
        # stopword test and the stemming (a Python call per token was most of indexing time).
        self._memo: dict[str, str] = {}

    def _english(self, words: list[str]) -> list[str]:
        memo = self._memo
        try:
            return list(filter(None, map(memo.__getitem__, words)))
        except KeyError:
            new = list(set(words).difference(memo))
            stems = self._stemmer.stemWords(new)
            memo.update((w, "" if w in _STOP_EN else st) for w, st in zip(new, stems, strict=True))
            return list(filter(None, map(memo.__getitem__, words)))

    def __call__(self, text: str) -> list[str]:
        text = text.lower()
        # isascii() is a flag check; the CJK regex scans the whole text.
        if text.isascii() or _CJK.search(text) is None:
            return self._english(_WORD.findall(text))
        return self._mixed(text)

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


@lru_cache(maxsize=4)
def get_analyzer(language: str = "english") -> Analyzer:
    return Analyzer(language)


def analyze(text: str) -> list[str]:
    return get_analyzer()(text)
