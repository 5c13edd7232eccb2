"""Segmentation of a raw turn log into sessions: time gaps, topic shifts, and their guards.

The memory store pages whole segments in and out, so a spurious cut splits one memory in two and
a missed cut glues unrelated ones; both are tested on streams whose right answer is obvious.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np

from memsifter.data import Turn
from memsifter.data.segment import SegmentParams, segment_turns

T0 = datetime(2024, 5, 1, 9, 0)

HIKING = [
    "We hiked the mountain trail up to the summit this morning.",
    "The mountain trail was steep near the summit ridge.",
    "My hiking boots got muddy on the trail to the summit.",
    "Next weekend we hike the mountain trail again, maybe the north summit.",
    "I packed trail mix and water for the summit hike.",
    "The view from the mountain summit after the hike was worth it.",
]
BAKING = [
    "I baked sourdough bread with my starter and a hot oven.",
    "The sourdough dough rose overnight before it went in the oven.",
    "My bread crust from the oven was crackly, the sourdough crumb airy.",
    "Feeding the sourdough starter flour every day keeps the bread tangy.",
    "Next bread I bake in the dutch oven with more sourdough starter.",
    "Slicing warm sourdough bread straight from the oven is the best.",
]


def _turns(texts: list[str], *, minutes: int | None = 5, gap_at: int | None = None) -> list[Turn]:
    out, t = [], T0
    for i, text in enumerate(texts):
        if gap_at is not None and i == gap_at:
            t += timedelta(hours=6)
        out.append(
            Turn(
                speaker="user" if i % 2 == 0 else "friend",
                text=text,
                turn_id=f"t{i}",
                timestamp=t if minutes is not None else None,
            )
        )
        t += timedelta(minutes=minutes or 0)
    return out


def _lengths(sessions) -> list[int]:
    return [len(s.turns) for s in sessions]


def test_empty() -> None:
    assert segment_turns([]) == []


def test_time_gap_splits_even_within_one_topic() -> None:
    turns = _turns(HIKING, gap_at=2)
    sessions = segment_turns(turns, id_prefix="u1", conversation_id="user-1")
    # A gap cut ignores min_turns: two turns is a session if the user then left for six hours.
    assert _lengths(sessions) == [2, 4]
    assert [s.id for s in sessions] == ["u1_0", "u1_1"]
    assert all(s.conversation_id == "user-1" for s in sessions)
    assert sessions[1].date == turns[2].timestamp
    assert sessions[1].date_text == turns[2].timestamp.strftime("%Y-%m-%d %H:%M")  # type: ignore[union-attr]


def test_gap_at_exactly_max_gap_does_not_split() -> None:
    turns = _turns(HIKING[:4], minutes=240)
    cfg = SegmentParams(max_gap=timedelta(hours=4), topic_threshold=None)
    assert _lengths(segment_turns(turns, cfg)) == [4]
    cfg = SegmentParams(max_gap=timedelta(hours=3, minutes=59), topic_threshold=None)
    assert _lengths(segment_turns(turns, cfg)) == [1, 1, 1, 1]


def test_topic_shift_splits_two_topic_stream() -> None:
    turns = _turns(HIKING + BAKING)
    sessions = segment_turns(turns)
    assert _lengths(sessions) == [6, 6]
    assert sessions[1].turns[0].text == BAKING[0]
    # Turns keep their order and nothing is lost or duplicated.
    assert [t for s in sessions for t in s.turns] == turns


def test_topic_shift_without_timestamps() -> None:
    sessions = segment_turns(_turns(HIKING + BAKING, minutes=None))
    assert _lengths(sessions) == [6, 6]
    assert all(s.date is None and s.date_text is None for s in sessions)


def test_no_split_within_one_topic() -> None:
    assert _lengths(segment_turns(_turns(HIKING + HIKING[::-1]))) == [12]


def test_topic_detection_can_be_switched_off() -> None:
    cfg = SegmentParams(topic_threshold=None)
    assert _lengths(segment_turns(_turns(HIKING + BAKING), cfg)) == [12]


def test_min_turns_respected() -> None:
    texts = HIKING[:2] + BAKING
    # The topic changes after two turns; a session needs four before a topic cut.
    sessions = segment_turns(_turns(texts), SegmentParams(min_turns=4))
    assert all(n >= 4 for n in _lengths(sessions)[:-1])
    assert _lengths(sessions) == [8]
    # With min_turns=2 the same stream is cut right at the shift.
    assert _lengths(segment_turns(_turns(texts), SegmentParams(min_turns=2))) == [2, 6]


def test_no_cut_without_enough_lookahead() -> None:
    # The shift sits two turns before the end, with window=3 there is no right-hand window.
    sessions = segment_turns(_turns(HIKING + BAKING[:2]), SegmentParams(window=3))
    assert _lengths(sessions) == [8]


def test_embedding_callable_is_used() -> None:
    # Lexically one topic (identical text), but the embedding says the stream changes at 5.
    texts = ["we talked about it again"] * 10
    calls: list[list[str]] = []

    def embed(batch: list[str]) -> np.ndarray:
        calls.append(batch)
        vecs = np.zeros((len(batch), 4), dtype=np.float32)
        vecs[:5, 0] = 3.0  # unnormalised on purpose: the segmenter normalises
        vecs[5:, 1] = 0.5
        return vecs

    turns = _turns(texts)
    assert _lengths(segment_turns(turns)) == [10]
    sessions = segment_turns(turns, embed=embed)
    assert _lengths(sessions) == [5, 5]
    assert calls == [texts], "all turns embedded in one batch"


def test_embedding_similar_vectors_no_split() -> None:
    def embed(batch: list[str]) -> np.ndarray:
        rng = np.random.default_rng(0)
        return np.ones((len(batch), 8)) + 0.01 * rng.standard_normal((len(batch), 8))

    assert _lengths(segment_turns(_turns(HIKING + BAKING), embed=embed)) == [12]
