"""The released MemSifter proxy's prompt contract (``template: official``), as its authors trained
it: ``zstanjj/MemSifter-4B-Thinking``, from the official repository (plageon/MemSifter).

Established from the training-data script (``data/rl_train_data_propare.py`` with
``configs/gen_retrieve_instruct_prompt.yaml`` and ``utils/session_process.py``), not from the
toolkit (``memsifter/toolkit.py``), whose shorter prompt the model never saw in training; where
the two disagree this module follows the training script (docs/official_proxy.md names both):

* **One user message**, no system prompt (the YAML holds one; the script never sends it), the
  model's own chat template with the generation prompt and no template arguments.
* **The user text** is :data:`USER_PROMPT` with ``{history}`` and ``{current}``: the bare question
  (no question date: no official function reads one).
* **History**: the candidates in the order given (the training script shows them by date), each
  ``<session{i}> <date>{date}</date>`` (``<session{i}>`` when no session has a date; a missing
  date among dated ones is written ``None``, as the script writes it), numbered from 0, then one
  line a turn, ``<{role}{n}>{text}</{role}>`` with a counter per role in the session (``user``,
  ``assistant``, or a speaker's name as given), then ``</session>``; the whole stripped.
* **Parse** (``utils/eval_utils.robust_session_ranking_parse``, then the toolkit's completion):
  the text after the first ``</think>``; in it the first ``<ranking>`` and the first
  ``</ranking>`` after it; the text between split on ``,`` and every piece read as a Python
  ``int`` after stripping, all or nothing. Of those, ids in range are kept first-seen; the
  sessions left out follow in the coarse filter's order (the toolkit shows them in that order
  and appends the rest by index).

Fixtures produced by running the official functions (tests/fixtures/official_memsifter/) pin
the rendering byte for byte and the parse case by case.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memsifter.data.types import Session
from memsifter.errors import DataError
from memsifter.ranker.parse import (
    RANKING_CLOSE,
    RANKING_OPEN,
    THINK_CLOSE,
    ParsedRanking,
    ParseErrorKind,
    first_in_range,
)
from memsifter.resources import OFFICIAL_USER_PROMPT

SOURCE = "plageon/MemSifter@5ff63779a7b800d553c5b777c902dfc835163e79"  # the prompt YAML
# configs/gen_retrieve_instruct_prompt.yaml's prompt_template.user_prompt_text, verbatim (package
# data: its lines are longer than code's).
USER_PROMPT = OFFICIAL_USER_PROMPT.read_text(encoding="utf-8")


# The released checkpoint's prompt settings (``prompt: official``), as its training script used
# them: chronological sessions cut by BGE-M3 to a ~130K-token prompt, a 16K-token answer.
PRESET = "official"
SETTINGS: dict[str, Any] = {
    "template": "official",
    "ranking_head": "generate",
    "ask_think": True,
    "unit": "session",
    "language": "en",
    "order": "chronological",
    "coarse": "bge-m3",
    "window_tokens": 131_072 + 16_384,
    "completion_tokens": 16_384,
}
# How the released checkpoint is named (the hub id, or a folder named after it).
RELEASED_NAME = re.compile(r"memsifter-\d+(\.\d+)?b", re.IGNORECASE)


def looks_released(model: str) -> bool:
    """Whether ``model`` is named like the authors' released proxy (``…/MemSifter-4B-…``)."""
    return RELEASED_NAME.search(str(model).rstrip("/").rsplit("/", 1)[-1]) is not None


def check_released_folder(tokenizer: Any) -> None:
    """A local folder in the released layout must hold a tokenizer that fits its model: every
    token id below ``config.json``'s ``vocab_size``, or the model would read ids it has no
    embedding for. Refused naming both files; a hub id (no local folder) is checked by the
    server that loads it."""
    folder = Path(str(getattr(tokenizer, "name_or_path", "") or ""))
    config = folder / "config.json"
    if not folder.is_dir() or not config.is_file():
        return
    try:
        vocab = json.loads(config.read_text(encoding="utf-8")).get("vocab_size")
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read the model's config: {e}", file=str(config)) from e
    size = len(tokenizer)
    if isinstance(vocab, int) and size > vocab:
        raise DataError(
            f"the tokenizer in {folder} has {size} tokens but config.json's vocab_size is "
            f"{vocab}: they are not the same model's (tokenizer.json / tokenizer_config.json "
            "against config.json)",
            file=str(config),
        )


def session_text(session: Session) -> str:
    """A session's turns, one ``<{role}{n}>{text}</{role}>`` line each, ``n`` counted per role."""
    counts: dict[str, int] = {}
    out = []
    for turn in session.turns:
        n = counts.get(turn.speaker, 0)
        counts[turn.speaker] = n + 1
        out.append(f"<{turn.speaker}{n}>{turn.text}</{turn.speaker}>\n")
    return "".join(out)


def session_blocks(sessions: Sequence[Session]) -> list[str]:
    """Each session's block, numbered from 0 in the order given; dated when any session is."""
    dated = any(s.date_text is not None for s in sessions)
    return [
        (f"<session{i}> <date>{s.date_text}</date>\n" if dated else f"<session{i}>\n")
        + session_text(s)
        + "</session>\n"
        for i, s in enumerate(sessions)
    ]


def messages_from_blocks(question: str, blocks: Sequence[str]) -> list[dict[str, str]]:
    """The one user message the released model was trained on, around rendered blocks."""
    history = "".join(blocks).strip()
    return [{"role": "user", "content": USER_PROMPT.format(history=history, current=question)}]


def official_messages(question: str, sessions: Sequence[Session]) -> list[dict[str, str]]:
    """The one user message the released model was trained on."""
    return messages_from_blocks(question, session_blocks(sessions))


def parse_official(text: str, num_sessions: int) -> ParsedRanking:
    """The official reading of a completion, as a :class:`ParsedRanking` (module doc): ids in
    range, first seen; an answer the official parser reads as nothing is an error kind, so
    :meth:`ParsedRanking.complete` fills it from the coarse order as the toolkit does."""
    close = text.find(THINK_CLOSE)
    if close < 0:  # still thinking: the official parser reads nothing
        return ParsedRanking((), num_sessions, think=text, error=ParseErrorKind.MISSING_RANKING)
    think, tail = text[:close], text[close + len(THINK_CLOSE) :]
    start = tail.find(RANKING_OPEN)
    if start < 0:
        return ParsedRanking((), num_sessions, think=think, error=ParseErrorKind.MISSING_RANKING)
    body_start = start + len(RANKING_OPEN)
    end = tail.find(RANKING_CLOSE, body_start)
    if end < 0:
        return ParsedRanking((), num_sessions, think=think, error=ParseErrorKind.UNCLOSED_RANKING)
    body = tail[body_start:end]
    try:
        raw = [int(piece.strip()) for piece in body.split(",")]
    except ValueError:
        kind = ParseErrorKind.EMPTY_RANKING if not body.strip() else ParseErrorKind.NO_VALID_IDS
        return ParsedRanking((), num_sessions, think=think, error=kind)
    ids, dropped, duplicates = first_in_range(raw, num_sessions)
    if not ids:
        return ParsedRanking(
            (), num_sessions, think=think, error=ParseErrorKind.NO_VALID_IDS, dropped=dropped
        )
    return ParsedRanking(
        tuple(ids),
        num_sessions,
        think=think,
        dropped=dropped,
        duplicates=duplicates,
        n_from_model=len(ids),
    )


__all__ = [
    "PRESET",
    "check_released_folder",
    "SETTINGS",
    "SOURCE",
    "USER_PROMPT",
    "looks_released",
    "messages_from_blocks",
    "official_messages",
    "parse_official",
    "session_blocks",
    "session_text",
]
