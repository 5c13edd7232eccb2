"""The one parser of the proxy's answer, ``<think>…</think><ranking>27, 15, 34, 5</ranking>``.

Rewards, evaluation and the serving endpoint all read the model through ``parse_ranking``, so a
reward can never score an output that evaluation would read differently. It is given the
model's completion only, never the prompt: session texts in the prompt may contain the very tags
it looks for, and they must not be able to smuggle in a ranking.

Rules, in order:

* **Reasoning.** ``<think>`` is optional. With ``</think>`` present the reasoning is the text up to
  its *last* occurrence (starting after the first ``<think>``, or at the start when the chat
  template opened ``<think>`` in the prompt, as DeepSeek-R1-style templates do). A ``<think>``
  that is never closed is tolerated when a complete ranking follows it: the reasoning then runs up
  to that ranking and ``unclosed_think`` is set, so a format reward can still penalise it.
* **Which ranking.** Only the text after the last ``</think>`` is searched, and in it the last
  complete ``<ranking>…</ranking>`` block wins. Models often draft a ranking while reasoning and
  revise it; the answer is what comes after the reasoning, and the last block is the final word.
* **Ids.** Tokens are separated by commas, semicolons (ASCII or full-width), ``、``, or
  whitespace; brackets, braces and parentheses are ignored (``[3, 1]``), and a ``Session`` prefix is
  accepted (``Session 3``), since that is how the prompt labels candidates. Ids are 0-based
  positions in the prompt's candidate list. Tokens that are not plain non-negative integers, or
  fall outside ``0 … num_sessions-1``, are dropped and counted in ``dropped``; repeats are dropped
  keeping the first and counted in ``duplicates``.
* **Errors** are values, never exceptions (see ``ParseErrorKind``). Whenever ``error`` is set,
  ``ids`` is empty: a truncated or malformed answer earns no partial credit from a reward. Eval and
  serving call ``complete`` to fill the ranking from the coarse order and keep the error visible.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
RANKING_OPEN, RANKING_CLOSE = "<ranking>", "</ranking>"


class ParseErrorKind(str, Enum):
    """Why an answer has no usable ranking. Values are stable strings for metrics and logs."""

    MISSING_RANKING = "missing_ranking"
    """No ``<ranking>`` after the reasoning (or the reasoning never ended and nothing followed)."""
    UNCLOSED_RANKING = "unclosed_ranking"
    """``<ranking>`` opened but never closed: usually generation hit its token limit."""
    EMPTY_RANKING = "empty_ranking"
    """A complete block with nothing in it but separators."""
    NO_VALID_IDS = "no_valid_ids"
    """A complete block whose tokens were all out of range or not integers (see ``dropped``)."""


# One complete block with no nested tag inside, so that ``<ranking>a<ranking>b</ranking>`` yields
# ``b``, the block that actually closes.
_BLOCK = re.compile(
    rf"{RANKING_OPEN}((?:(?!{RANKING_OPEN}|{RANKING_CLOSE}).)*){RANKING_CLOSE}", re.DOTALL
)
_TOKEN = re.compile(r"(?:[Ss]ession\s*)?[^\s,;，；、\[\](){}]+")
_ID = re.compile(r"(?:[Ss]ession\s*)?([0-9]+)")


@dataclass(frozen=True)
class ParsedRanking:
    """The reading of one completion. ``ids`` are 0-based candidate positions, best first."""

    ids: tuple[int, ...]
    num_sessions: int
    think: str | None = None
    error: ParseErrorKind | None = None
    dropped: int = 0
    duplicates: int = 0
    unclosed_think: bool = False
    n_from_model: int = 0
    """How many leading ``ids`` the model itself gave; the rest were appended by ``complete``."""
    completed_from: str | None = None

    @property
    def ok(self) -> bool:
        """The answer has a usable ranking. Rewards treat ``not ok`` as a failure, completed or
        not."""
        return self.error is None

    @property
    def clean(self) -> bool:
        """Usable and tidy: no dropped or repeated tokens and no unclosed ``<think>``."""
        return self.ok and not (self.dropped or self.duplicates or self.unclosed_think)

    def complete(self, fallback_order: Sequence[int], source: str = "coarse") -> ParsedRanking:
        """Append the positions the model left out, in ``fallback_order`` (the coarse filter's
        ranking), then any still missing in prompt order, so the result is a full permutation.

        ``error``, ``n_from_model`` and the counts are kept, so metrics can still see that the
        model failed or was partial. A ranking that is already complete is returned unchanged.
        """
        seen = set(self.ids)
        extra: list[int] = []
        for pos in fallback_order:
            if not 0 <= pos < self.num_sessions:
                raise ValueError(
                    f"fallback position {pos} is outside 0..{self.num_sessions - 1}; "
                    "pass positions in the prompt's candidate list, not session ids"
                )
            if pos not in seen:
                seen.add(pos)
                extra.append(pos)
        extra.extend(pos for pos in range(self.num_sessions) if pos not in seen)
        if not extra:
            return self
        return replace(self, ids=self.ids + tuple(extra), completed_from=source)


def first_in_range(ids: Sequence[int], num_sessions: int) -> tuple[list[int], int, int]:
    """The ids within ``0 … num_sessions-1``, each at its first place, with how many were out
    of range (dropped) and how many repeated (duplicates)."""
    kept: list[int] = []
    seen: set[int] = set()
    dropped = duplicates = 0
    for pos in ids:
        if not 0 <= pos < num_sessions:
            dropped += 1
        elif pos in seen:
            duplicates += 1
        else:
            seen.add(pos)
            kept.append(pos)
    return kept, dropped, duplicates


def parse_ranking(text: str, num_sessions: int) -> ParsedRanking:
    """Read the model's completion ``text`` (never the prompt) for a prompt of ``num_sessions``
    candidates. Never raises on any ``text``."""
    if num_sessions < 0:
        raise ValueError(f"num_sessions must be >= 0, got {num_sessions}")
    think, tail, unclosed = _split_think(text)

    blocks = list(_BLOCK.finditer(tail))
    if not blocks:
        kind = (
            ParseErrorKind.UNCLOSED_RANKING
            if RANKING_OPEN in tail
            else ParseErrorKind.MISSING_RANKING
        )
        if unclosed:  # the reasoning never ended: all of it is reasoning, nothing is an answer
            think = tail.strip()
        return ParsedRanking((), num_sessions, think=think, error=kind, unclosed_think=unclosed)
    block = blocks[-1]
    if unclosed:
        think = tail[: block.start()].strip()

    tokens = _TOKEN.findall(block.group(1))
    matches = (_ID.fullmatch(token) for token in tokens)
    ids, dropped, duplicates = first_in_range(
        [int(m.group(1)) if m else -1 for m in matches], num_sessions
    )

    error = None
    if not tokens:
        error = ParseErrorKind.EMPTY_RANKING
    elif not ids:
        error = ParseErrorKind.NO_VALID_IDS
    return ParsedRanking(
        ids=tuple(ids) if error is None else (),
        num_sessions=num_sessions,
        think=think,
        error=error,
        dropped=dropped,
        duplicates=duplicates,
        unclosed_think=unclosed,
        n_from_model=len(ids) if error is None else 0,
    )


def _split_think(text: str) -> tuple[str | None, str, bool]:
    """``(reasoning, text to search for the ranking, think left unclosed)``; with an unclosed
    think the reasoning is not known yet (it ends where the ranking starts)."""
    close = text.rfind(THINK_CLOSE)
    open_ = text.find(THINK_OPEN)
    if close >= 0:
        start = open_ + len(THINK_OPEN) if 0 <= open_ < close else 0
        return text[start:close].strip(), text[close + len(THINK_CLOSE) :], False
    if open_ >= 0:
        return None, text[open_ + len(THINK_OPEN) :], True
    return None, text, False
