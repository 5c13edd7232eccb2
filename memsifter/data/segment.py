"""Segment a raw stream of turns into sessions: by time gap, then by topic shift.

A new session starts when

* the gap since the previous turn exceeds ``max_gap`` (when both turns have timestamps), or
* a topic shift is detected TextTiling-style: the similarity between the last ``window`` turns
  and the next ``window`` turns drops below ``topic_threshold``, and the current session already
  has ``min_turns`` turns. Similarity is cosine over stemmed bags of words by default, or over
  embeddings from ``embed`` (any callable mapping texts to vectors, e.g. a coarse filter's
  encoder).

The memory store uses this to turn an app's raw turn log into pages it can rank and evict.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

import numpy as np

from memsifter.data.types import Session, Turn
from memsifter.text import analyze


@dataclass(frozen=True)
class SegmentParams:
    max_gap: timedelta = timedelta(hours=4)
    topic_threshold: float | None = 0.05
    window: int = 3
    min_turns: int = 4


def _bow_cos(a: Counter[str], b: Counter[str]) -> float:
    dot = sum(v * b.get(k, 0) for k, v in a.items())
    na = math.sqrt(sum(v * v for v in a.values()))
    nb = math.sqrt(sum(v * v for v in b.values()))
    return dot / (na * nb) if na and nb else 0.0


def segment_turns(
    turns: Sequence[Turn],
    config: SegmentParams = SegmentParams(),
    *,
    id_prefix: str = "seg",
    conversation_id: str | None = None,
    embed: Callable[[list[str]], np.ndarray] | None = None,
) -> list[Session]:
    if not turns:
        return []
    texts = [t.text for t in turns]
    vecs = None
    bows: list[Counter[str]] = []
    if config.topic_threshold is not None:
        if embed is not None:
            vecs = np.asarray(embed(texts), dtype=np.float32)
            vecs = vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
        else:
            bows = [Counter(analyze(t)) for t in texts]

    def similarity(left: range, right: range) -> float:
        if vecs is not None:
            a, b = vecs[list(left)].mean(0), vecs[list(right)].mean(0)
            return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-12))
        a_bow: Counter[str] = Counter()
        b_bow: Counter[str] = Counter()
        for i in left:
            a_bow.update(bows[i])
        for i in right:
            b_bow.update(bows[i])
        return _bow_cos(a_bow, b_bow)

    cuts = [0]
    for i in range(1, len(turns)):
        prev, cur = turns[i - 1].timestamp, turns[i].timestamp
        if prev and cur and cur - prev > config.max_gap:
            cuts.append(i)
            continue
        if config.topic_threshold is None or i - cuts[-1] < config.min_turns:
            continue
        if i + config.window > len(turns):
            continue  # not enough lookahead to call a shift near the end
        left = range(max(cuts[-1], i - config.window), i)
        right = range(i, i + config.window)
        if similarity(left, right) < config.topic_threshold:
            cuts.append(i)
    cuts.append(len(turns))

    sessions = []
    for n, (a, b) in enumerate(zip(cuts[:-1], cuts[1:], strict=True)):
        chunk = tuple(turns[a:b])
        date = chunk[0].timestamp
        sessions.append(
            Session(
                id=f"{id_prefix}_{n}",
                turns=chunk,
                date=date,
                date_text=date.strftime("%Y-%m-%d %H:%M") if date else None,
                conversation_id=conversation_id,
            )
        )
    return sessions
