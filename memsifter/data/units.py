"""Memory units finer than a session: pages of a few consecutive turns.

A LoCoMo session is ~750 SmolLM2 tokens, so a CPU-sized proxy window (about 1K tokens) holds
one of them, and a working-LLM prompt for eight tiers of them does not fit a small answerer.
Splitting sessions into pages of ``turns_per_page`` consecutive turns keeps several candidates
per prompt and every tier affordable. Each page keeps its session's date (the prompt shows it)
and gets the id ``<session id>#<first turn id>``.

Gold pages: where the dataset names evidence turns (LoCoMo ``DN:M`` in ``meta["evidence"]``),
the pages holding one of them; otherwise every page of a gold session (coarser, and recorded as
``meta["session_level_gold"]``).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Literal

from memsifter.data.types import Page, Query, Session

Unit = Literal["session", "page"]
UNITS: tuple[str, ...] = ("session", "page")
_DIA = re.compile(r"D\d+:\d+")


def page_session(session: Session, turns_per_page: int) -> list[Page]:
    """``session`` cut into pages of at most ``turns_per_page`` consecutive turns."""
    if turns_per_page < 1:
        raise ValueError(f"turns_per_page must be >= 1, got {turns_per_page}")
    pages = []
    for start in range(0, len(session.turns), turns_per_page):
        turns = session.turns[start : start + turns_per_page]
        first = turns[0].turn_id or str(start)
        pages.append(
            Page(
                id=f"{session.id}#{first}",
                turns=turns,
                date=session.date,
                date_text=session.date_text,
                conversation_id=session.conversation_id,
                session_id=session.id,
                first_turn=start,
            )
        )
    return pages


def to_units(query: Query, unit: Unit = "session", turns_per_page: int = 4) -> Query:
    """``query`` with its haystack (and gold ids) in ``unit``s, order kept."""
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {UNITS}, got {unit!r}")
    if unit == "session":
        return query
    pages = [p for s in query.haystack for p in page_session(s, turns_per_page)]
    evidence = {d for e in query.meta.get("evidence", []) for d in _DIA.findall(str(e))}
    gold_sessions = set(query.gold_session_ids)
    if evidence:
        gold = [
            p.id
            for p in pages
            if p.session_id in gold_sessions and any(t.turn_id in evidence for t in p.turns)
        ]
    else:
        gold = []
    session_level = not gold
    if session_level:  # no usable turn-level evidence: the session label, recorded in meta
        gold = [p.id for p in pages if p.session_id in gold_sessions]
    meta = {**query.meta, "unit": unit, "session_level_gold": session_level}
    return replace(query, haystack=tuple(pages), gold_session_ids=tuple(gold), meta=meta)
