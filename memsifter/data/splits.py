"""The splits: their names, and LoCoMo's default assignment of conversations to them.

LoCoMo has ten conversations; the default split trains on 0-6, chooses checkpoints and recipe
options on 7 (validation), and reports on 8-9 (test, never used to choose). RL data building,
training, evaluation and the benchmarks all read it from here, so "held out" means one thing.
"""

from __future__ import annotations

SPLITS: tuple[str, ...] = ("train", "validation", "test")
HELDOUT_SPLITS: tuple[str, ...] = ("validation", "test")  # never trained on

LOCOMO_TRAIN: tuple[str, ...] = ("0", "1", "2", "3", "4", "5", "6")
LOCOMO_VALIDATION: tuple[str, ...] = ("7",)
LOCOMO_TEST: tuple[str, ...] = ("8", "9")  # the benchmarks' held-out conversations
LOCOMO_HELDOUT: tuple[str, ...] = LOCOMO_VALIDATION + LOCOMO_TEST

__all__ = [
    "HELDOUT_SPLITS",
    "LOCOMO_HELDOUT",
    "LOCOMO_TEST",
    "LOCOMO_TRAIN",
    "LOCOMO_VALIDATION",
    "SPLITS",
]
