"""Haystack builder for "LoCoMo 32K / 128K / 1M": pad a question's own sessions with distractor
sessions from *other* conversations up to a token budget.

How distractors are chosen and ordered (also in docs/data.md):

1. The question's own sessions are always all kept, even if they alone exceed the budget.
2. Candidate distractors are every session of every other conversation in the pool. They are
   shuffled with ``random.Random(f"{seed}:{conversation_id}")``: deterministic under the seed, the
   same for every question of one conversation, and independent of the order questions are built.
3. Walking that shuffled list, a session is added if it still fits in the remaining budget;
   sessions that do not fit are skipped (a later, shorter one may still fit).
4. The final haystack is sorted by session date (undated sessions last), ties broken by id, so
   the proxy sees a plausible timeline rather than the question's sessions in one block.

When the pool is smaller than the budget (LoCoMo has ~270K approx tokens in all, so "1m" cannot
be reached), the haystack is the whole pool and ``HaystackStats.filled`` says so.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from datetime import datetime

from memsifter.data.dataset import MemoryDataset
from memsifter.data.tokens import SessionTokenCache, TokenCounter
from memsifter.data.types import Query, Session
from memsifter.errors import MemSifterError

HAYSTACK_BUDGETS = {"32k": 32_000, "128k": 128_000, "1m": 1_000_000}


@dataclass(frozen=True)
class HaystackStats:
    budget: int
    tokens: int
    n_own: int
    n_distractors: int
    filled: bool  # False when the pool ran out before the budget


def parse_budget(name: str) -> int | None:
    """``native`` -> None (no padding); ``32k``/``128k``/``1m`` or a plain integer -> tokens."""
    key = name.lower()
    if key == "native":
        return None
    if key in HAYSTACK_BUDGETS:
        return HAYSTACK_BUDGETS[key]
    if key.isdigit():
        return int(key)
    raise MemSifterError(
        f"unknown haystack {name!r}: use native, {', '.join(HAYSTACK_BUDGETS)} or a token count"
    )


def _date_key(s: Session) -> tuple[int, datetime, str]:
    return (0, s.date, s.id) if s.date else (1, datetime.min, s.id)


class HaystackBuilder:
    def __init__(self, dataset: MemoryDataset, counter: TokenCounter, seed: int = 0) -> None:
        self.dataset = dataset
        self.seed = seed
        self.tokens = SessionTokenCache(counter)
        self._distractors: dict[str, list[Session]] = {}

    def _shuffled_distractors(self, conversation_id: str) -> list[Session]:
        if conversation_id not in self._distractors:
            # One entry per id: LongMemEval haystacks share sessions, and a session listed by two
            # other conversations must not be added to a haystack twice.
            unique: dict[str, Session] = {}
            for cid, conv in self.dataset.conversations.items():
                if cid != conversation_id:
                    for s in conv:
                        unique.setdefault(s.id, s)
            pool = list(unique.values())
            random.Random(f"{self.seed}:{conversation_id}").shuffle(pool)
            self._distractors[conversation_id] = pool
        return self._distractors[conversation_id]

    def build(self, query: Query, budget: int) -> tuple[Query, HaystackStats]:
        own = list(query.haystack)
        used = sum(self.tokens(s) for s in own)
        own_ids = {s.id for s in own}
        extra: list[Session] = []
        pool = self._shuffled_distractors(query.conversation_id or query.qid)
        exhausted = True
        for s in pool:
            if s.id in own_ids:
                continue
            n = self.tokens(s)
            if used + n <= budget:
                extra.append(s)
                used += n
            else:
                exhausted = False
        haystack = tuple(sorted(own + extra, key=_date_key))
        stats = HaystackStats(
            budget=budget,
            tokens=used,
            n_own=len(own),
            n_distractors=len(extra),
            filled=not exhausted or used >= budget,
        )
        return replace(query, haystack=haystack), stats
