"""Keyword bookmarks: a few keyphrases per page, extracted once at ingest and indexed by their
analysed terms, so recall can find a page by what it is *about* without re-reading it.

The offline default is YAKE (statistical, no model). With ``bookmarks.extractor: llm`` the
service's proxy backend is asked for keywords instead. Either way a page's keywords become
``Bookmark``s whose ``terms`` are the same stemmed terms BM25 uses (``memsifter.text.analyze``),
so a question matches a bookmark exactly when it shares a term with it. The terms are stored
(indexed by user and term) with their page; a replica reads the rows of a question's terms with
its postings and keeps them with them (``memsifter.serving.stored_index.StoredIndex``; with a
non-BM25 filter, ``memsifter.serving.ranking.UserIndex``), and the hits are fused with the
coarse filter by reciprocal rank.

Speaker names are left out of the text handed to the extractor: they occur in every page of a
conversation, and YAKE would otherwise rank them as each page's top keyword.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any, Protocol

from memsifter.data.types import Session
from memsifter.llm import Backend, SamplingParams
from memsifter.serving.store.records import Bookmark
from memsifter.text import analyze

logger = logging.getLogger(__name__)


class KeywordExtractor(Protocol):
    name: str

    def extract(self, pages: Sequence[Session]) -> list[list[tuple[str, float]]]:
        """For each page, ``(keyword, weight)`` pairs, best first, weights in (0, 1]."""


def page_text(page: Session) -> str:
    return "\n".join(t.text for t in page.turns)


class YakeExtractor:
    name = "yake"

    def __init__(self, max_keywords: int = 8, max_ngram: int = 2, language: str = "en") -> None:
        import yake

        self.max_keywords = max_keywords
        self._yake = yake.KeywordExtractor(lan=language, n=max_ngram, top=max_keywords)

    def extract(self, pages: Sequence[Session]) -> list[list[tuple[str, float]]]:
        out = []
        for page in pages:
            text = page_text(page)
            found = self._yake.extract_keywords(text) if text.strip() else []
            # YAKE scores are lower-is-better and unbounded; 1/(1+s) keeps their order in (0, 1].
            out.append([(str(k), 1.0 / (1.0 + float(s))) for k, s in found])
        return out


_LLM_PROMPT = (
    "List up to {n} short keywords or keyphrases (names, places, objects, activities, dates) "
    "that say what this conversation excerpt is about. Write one per line and nothing else.\n\n"
    "{text}"
)
_BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s*")


class LLMExtractor:
    """Keywords from an LLM backend (the proxy's), one batched call per ingest."""

    name = "llm"

    def __init__(self, backend: Backend, max_keywords: int = 8, max_chars: int = 4000) -> None:
        self.backend = backend
        self.max_keywords = max_keywords
        self.max_chars = max_chars

    def _prompt(self, page: Session) -> str:
        content = _LLM_PROMPT.format(n=self.max_keywords, text=page_text(page)[: self.max_chars])
        tok: Any = self.backend.tokenizer
        return tok.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
        )

    def extract(self, pages: Sequence[Session]) -> list[list[tuple[str, float]]]:
        if not pages:
            return []
        sampling = SamplingParams(max_new_tokens=16 * self.max_keywords, temperature=0.0)
        gens = self.backend.generate([self._prompt(p) for p in pages], sampling)
        out = []
        for gen in gens:
            seen: list[str] = []
            for line in re.split(r"[\n,;]", gen[0].text):
                kw = _BULLET.sub("", line).strip().strip("\"'.")
                if kw and len(kw) <= 80 and kw.lower() not in (s.lower() for s in seen):
                    seen.append(kw)
            seen = seen[: self.max_keywords]
            # Listed best first by the model; rank-based weights in (0, 1].
            out.append([(k, 1.0 / (1 + i)) for i, k in enumerate(seen)])
        return out


def to_bookmarks(keywords: Sequence[tuple[str, float]]) -> tuple[Bookmark, ...]:
    """Keywords with their analysed terms; keywords that analyse to nothing (all stopwords)
    cannot match a query and are dropped."""
    out = []
    for keyword, weight in keywords:
        terms = tuple(dict.fromkeys(analyze(keyword)))
        if terms:
            out.append(Bookmark(keyword=keyword, terms=terms, weight=weight))
    return tuple(out)


def query_terms(question: str) -> list[str]:
    return list(dict.fromkeys(analyze(question)))
