"""The memory gym's tiny proxy: a random Qwen3 whose tokenizer is trained on the gym's grammar.

The learnability benchmark and its CI test need a proxy that starts knowing nothing (so that what
it learns of relevance comes from the reward) and that is cheap on two cores. The tokenizer is
trained on every sentence the grammar can write, the questions and the proxy prompt's own
instructions, so a word is mostly one token and a gym prompt of nine sessions stays near 600
tokens; ids are single digits as in Qwen's own tokenizer.
"""

from __future__ import annotations

from pathlib import Path

from memsifter.data.gym import (
    _ACKS,
    _CLOSERS,
    _FILLERS,
    _GREETINGS,
    _SMALL_TALK,
    ASSISTANT,
    ATTRIBUTES,
    KNOWLEDGE,
    NAMES,
    RELATIONS,
)
from memsifter.testing.tiny_models import build_tiny_qwen3


def gym_corpus() -> tuple[str, ...]:
    """Every template with every value, the fixed phrases, and the proxy prompt's text."""
    from memsifter.ranker.prompt import _TEXT

    lines: list[str] = []
    for a in ATTRIBUTES:
        vals = a.values
        for i, v in enumerate(vals):
            prev = vals[(i + 1) % len(vals)]
            rel = RELATIONS[i % len(RELATIONS)]
            lines += [
                a.first.format(value=v),
                a.change.format(prev=prev, value=v),
                a.former.format(value=v),
                a.other.format(rel=rel, value=v),
                a.earlier_q.format(value=v),
            ]
        lines += [a.current_q, *a.chitchat]
    lines += [q for q, _ in KNOWLEDGE] + [ans for _, ans in KNOWLEDGE]
    lines += [*_GREETINGS, *_ACKS, *_FILLERS, *_CLOSERS, *_SMALL_TALK]
    lines += [f"{n}: hello" for n in (*NAMES, ASSISTANT)]
    lines += [t for t in _TEXT["en"].values()]
    months = "January February March April May June July August September October November December"
    lines += [f"[Session {i}] Date: {i + 1:02d} {m} 2023" for i, m in enumerate(months.split())]
    lines += ["<ranking>3, 0, 8, 1, 7, 2, 6, 4, 5</ranking>"]
    return tuple(lines)


def build_gym_proxy(
    out_dir: Path, seed: int = 0, *, hidden_size: int = 128, layers: int = 4, heads: int = 4
) -> Path:
    """A tiny random Qwen3 for the gym (``build_tiny_qwen3`` with the gym corpus)."""
    return build_tiny_qwen3(
        Path(out_dir),
        seed,
        corpus=gym_corpus(),
        vocab_size=1200,
        hidden_size=hidden_size,
        layers=layers,
        heads=heads,
        kv_heads=max(1, heads // 2),
    )
