"""The public data types every stage shares: data -> coarse filter -> proxy -> reward/eval/serve.

They are frozen dataclasses so that a `Session` can be hashed, cached and shared between the
coarse filter's embedding cache, the prompt builder and the memory store without copies drifting.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any


@dataclass(frozen=True)
class Turn:
    """One utterance. Image shares are kept as text (``[shares an image: ...]``) in ``text``."""

    speaker: str
    text: str
    turn_id: str | None = None
    timestamp: datetime | None = None

    def render(self) -> str:
        return f"{self.speaker}: {self.text}"


@dataclass(frozen=True)
class Session:
    """A contiguous chat session: the unit the proxy ranks and the store pages in and out.

    ``id`` is globally unique within a dataset (LoCoMo: ``conv-26/session_3``) so that
    distractor sessions from other conversations never collide with a question's own.
    ``date_text`` keeps the dataset's own spelling of the date for prompts; ``date`` is the
    parsed value used for ordering.
    """

    id: str
    turns: tuple[Turn, ...]
    date: datetime | None = None
    date_text: str | None = None
    conversation_id: str | None = None

    def render(self, with_date: bool = True) -> str:
        lines = []
        if with_date and (self.date_text or self.date):
            lines.append(f"Date: {self.date_text or self.date.isoformat()}")  # type: ignore[union-attr]
        lines.extend(t.render() for t in self.turns)
        return "\n".join(lines)

    @property
    def text(self) -> str:
        return self.render()

    @cached_property
    def fingerprint(self) -> str:
        """Content hash: caches key on it so an edited session is never served a stale vector.
        Computed once per (immutable) session: hot paths look it up on every query."""
        return hashlib.sha1(self.render().encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Page(Session):
    """A few consecutive turns of one chat session: the finer unit the proxy can rank and the
    store pages in and out (``memsifter.data.units.page_session`` cuts them).

    It is a ``Session`` to every ranker (same ``render``, date and fingerprint), so coarse
    filters, the prompt and the parser take pages and sessions alike; its type and
    ``session_id`` say which chat session it came from, rather than a parsed ``#`` in its id.
    """

    session_id: str = ""  # the chat session cut into this page
    first_turn: int = 0  # position of the page's first turn in that session


@dataclass(frozen=True)
class Query:
    """A question over a haystack of sessions, with its gold answer and gold sessions.

    ``gold_session_ids`` may be empty (LoCoMo questions whose evidence names no session, or
    LongMemEval abstention questions); retrieval metrics skip those and report how many.
    """

    qid: str
    question: str
    answer: str
    haystack: tuple[Session, ...]
    gold_session_ids: tuple[str, ...] = ()
    question_date: str | None = None
    category: str | None = None
    source: str = "custom"
    conversation_id: str | None = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def has_evidence(self) -> bool:
        return bool(self.gold_session_ids)


@dataclass(frozen=True)
class Ranking:
    """Session ids best first, with the scores that ordered them (higher is better)."""

    ids: tuple[str, ...]
    scores: tuple[float, ...] = ()
    source: str = ""

    def top(self, k: int) -> tuple[str, ...]:
        return self.ids[:k]

    def __len__(self) -> int:
        return len(self.ids)
