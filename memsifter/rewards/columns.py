"""The dataset columns the reward reads: one place that writes them and one that reads them.

The GRPO dataset (one row per question) carries, next to TRL's ``prompt``:

``question`` (str), ``answer`` (str, the gold answer), ``question_date`` (str or None),
``candidates`` (str: the proxy prompt's candidate sessions **in prompt order**, so that
``[Session i]`` is ``candidates[i]``, serialised by :func:`sessions_to_column`), ``gold_ids``
(list[str]: gold **session ids**, not positions; ids the prompt did not show are allowed and
ignored), ``category`` (str or None) and ``data_source`` (str, e.g. ``locomo``; it selects the
task score).

Candidates are a JSON string rather than nested records so that a datasets/Arrow table never has
to agree on one schema for turns, dates and missing fields across rows. Gold is given by session
id because ids survive reordering and budget cuts; the reward maps them to prompt positions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from memsifter.data.types import Query, Session, Turn
from memsifter.errors import DataError
from memsifter.ranker.prompt import BuiltPrompt

REWARD_COLUMNS: tuple[str, ...] = (
    "question",
    "answer",
    "question_date",
    "candidates",
    "gold_ids",
    "category",
    "data_source",
)
REQUIRED_COLUMNS: tuple[str, ...] = ("question", "answer", "candidates")


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _date(value: Any, where: str) -> datetime | None:
    if value is None:
        return None
    try:
        return datetime.fromisoformat(value)
    except (TypeError, ValueError) as e:
        raise DataError(f"not an ISO date: {value!r}", field=where) from e


def session_to_dict(session: Session) -> dict[str, Any]:
    return {
        "id": session.id,
        "date": _iso(session.date),
        "date_text": session.date_text,
        "conversation_id": session.conversation_id,
        "turns": [
            {
                "speaker": t.speaker,
                "text": t.text,
                "turn_id": t.turn_id,
                "timestamp": _iso(t.timestamp),
            }
            for t in session.turns
        ],
    }


def session_from_dict(data: Mapping[str, Any], where: str = "candidates") -> Session:
    try:
        return Session(
            id=str(data["id"]),
            turns=tuple(
                Turn(
                    speaker=t["speaker"],
                    text=t["text"],
                    turn_id=t.get("turn_id"),
                    timestamp=_date(t.get("timestamp"), f"{where}.turns[{j}].timestamp"),
                )
                for j, t in enumerate(data["turns"])
            ),
            date=_date(data.get("date"), f"{where}.date"),
            date_text=data.get("date_text"),
            conversation_id=data.get("conversation_id"),
        )
    except (KeyError, TypeError) as e:
        raise DataError(f"malformed session record: {e!r}", field=where) from e


def sessions_to_column(sessions: Sequence[Session]) -> str:
    """The ``candidates`` value: sessions in prompt order as a JSON string."""
    return json.dumps([session_to_dict(s) for s in sessions], ensure_ascii=False)


def sessions_from_column(value: str | Sequence[Mapping[str, Any]]) -> tuple[Session, ...]:
    """Read a ``candidates`` value back. Already-decoded records (a list of dicts, as a dataset
    with a nested schema would hand them over) are accepted too."""
    records = json.loads(value) if isinstance(value, str) else value
    if not isinstance(records, list | tuple):
        raise DataError("candidates must be a list of session records", field="candidates")
    return tuple(session_from_dict(r, f"candidates[{i}]") for i, r in enumerate(records))


def reward_columns(query: Query, prompt: BuiltPrompt) -> dict[str, Any]:
    """The reward columns of one dataset row: ``query`` asked through the built proxy
    ``prompt`` (its candidates, in the prompt's order)."""
    by_id = {s.id: s for s in query.haystack}
    return {
        "question": query.question,
        "answer": str(query.answer),
        "question_date": query.question_date,
        "candidates": sessions_to_column([by_id[sid] for sid in prompt.candidate_ids]),
        "gold_ids": list(query.gold_session_ids),
        "category": query.category,
        "data_source": query.source,
    }
