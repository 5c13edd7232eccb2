"""Long-term facts: what they are, how they age, and how they are ranked for a question.

A fact is a short statement about a user (``type``: entity, preference, event or task) with an
``importance`` in 0..1. Its **subject** is the supersede key: storing a new fact about a subject
marks the live one superseded (kept for history, never returned), so "I moved to Lisbon"
replaces "lives in Berlin" rather than contradicting it. ``forget`` hard-deletes a fact and the
history it replaced; ``sweep`` hard-deletes facts past ``expires_at`` (expired facts are hidden
from reads even before a sweep runs).

Ranking: ``score = importance * decay(days) * (1 + relevance)``, where
``decay(days) = 1 / (1 + rate * days)`` (rate 0.01 by default: a fact untouched for 100 days
counts half) and ``days`` run from the fact's last access, so facts the assistant keeps using
stay fresh. ``relevance`` in 0..1 is the share of the question's analysed terms found in the
fact's subject and text; without a question it is 0 and the order is importance times decay.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from memsifter.serving.store.records import Fact
from memsifter.text import analyze

_SPACE = re.compile(r"\s+")


def normalize_subject(subject: str) -> str:
    """Case and spacing never make two subjects different facts."""
    return _SPACE.sub(" ", subject).strip().lower()


def decay(days: float, rate: float = 0.01) -> float:
    return 1.0 / (1.0 + rate * max(days, 0.0))


def relevance(question_terms: set[str], fact: Fact) -> float:
    if not question_terms:
        return 0.0
    fact_terms = set(analyze(f"{fact.subject} {fact.text}"))
    return len(question_terms & fact_terms) / len(question_terms)


@dataclass(frozen=True)
class ScoredFact:
    fact: Fact
    score: float
    decay: float
    relevance: float


def rank_facts(
    facts: Sequence[Fact], now: datetime, question: str | None = None, rate: float = 0.01
) -> list[ScoredFact]:
    """Best first; ties keep the input order (newest first, as the store lists them)."""
    terms = set(analyze(question)) if question else set()
    scored = []
    for fact in facts:
        days = (now - fact.last_accessed_at).total_seconds() / 86400.0
        d = decay(days, rate)
        rel = relevance(terms, fact)
        scored.append(ScoredFact(fact, fact.importance * d * (1.0 + rel), d, rel))
    return sorted(scored, key=lambda s: -s.score)


def render_fact(fact: Fact) -> str:
    return f"- ({fact.type}) {fact.text}"
