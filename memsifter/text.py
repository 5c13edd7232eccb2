"""Lexical analysis shared by BM25, keyword bookmarks and topic segmentation.

English: lowercase, ``\\w\\w+`` words, English stopwords, Snowball stemming (PyStemmer).
Chinese: CJK runs are cut with jieba and filtered with a Chinese stopword list. Mixed text gets
both. Stems are memoised because the stemmer call, not the regex, dominates on big corpora.
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
        self._stems: dict[str, str] = {}

    def _stem(self, word: str) -> str:
        s = self._stems.get(word)
        if s is None:
            s = self._stems[word] = self._stemmer.stemWord(word)
        return s

    def __call__(self, text: str) -> list[str]:
        text = text.lower()
        if _CJK.search(text) is None:
            return [self._stem(w) for w in _WORD.findall(text) if w not in _STOP_EN]
        return self._mixed(text)

    def _mixed(self, text: str) -> list[str]:
        import jieba

        out: list[str] = []
        pos = 0
        for m in _CJK.finditer(text):
            out.extend(self._stem(w) for w in _WORD.findall(text[pos : m.start()])
                       if w not in _STOP_EN)
            out.extend(w for w in jieba.lcut(m.group(), HMM=True)
                       if w.strip() and w not in _STOP_ZH)
            pos = m.end()
        out.extend(self._stem(w) for w in _WORD.findall(text[pos:]) if w not in _STOP_EN)
        return out


@lru_cache(maxsize=4)
def get_analyzer(language: str = "english") -> Analyzer:
    return Analyzer(language)


def analyze(text: str) -> list[str]:
    return get_analyzer()(text)
