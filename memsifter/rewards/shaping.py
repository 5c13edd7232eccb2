"""Warm-up reward shaping: R = alpha * R_ans + beta(t) * R_ret.

Early in GRPO the proxy's rankings are near random and the working LLM's answers barely change
between them, so the answer reward gives little signal. The retrieval reward (NDCG of gold
sessions) is a dense label-based signal that gets training started; its weight beta decays from
beta_0 to 0 over ``decay_steps`` optimiser steps, after which the proxy is trained on outcomes
alone. alpha stays constant.

``linear``: beta(t) = beta_0 * (1 - t / N). ``cosine``: beta(t) = beta_0 * (1 + cos(pi t / N)) / 2,
which keeps the labels around longer and then drops them faster. Both are beta_0 at t = 0 and
exactly 0 from t = N on; ``decay_steps = 0`` means no warm-up at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Schedule = Literal["linear", "cosine"]
SCHEDULES: tuple[str, ...] = ("linear", "cosine")


@dataclass(frozen=True)
class ShapingSchedule:
    alpha: float = 1.0
    beta0: float = 0.5
    decay_steps: int = 200
    schedule: Schedule = "linear"

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; use one of {SCHEDULES}")
        if self.decay_steps < 0:
            raise ValueError(f"decay_steps must be >= 0, got {self.decay_steps}")
        if self.beta0 < 0:
            raise ValueError(f"beta0 must be >= 0, got {self.beta0}")

    def beta(self, step: int) -> float:
        """beta(t) at optimiser step ``step`` (0-based)."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        if step >= self.decay_steps:
            return 0.0
        frac = step / self.decay_steps
        if self.schedule == "linear":
            return self.beta0 * (1.0 - frac)
        return self.beta0 * 0.5 * (1.0 + math.cos(math.pi * frac))

    def combine(self, r_ans: float, r_ret: float, step: int) -> float:
        """alpha * R_ans + beta(step) * R_ret; exactly alpha * R_ans once beta is 0."""
        beta = self.beta(step)
        if beta == 0.0:
            return self.alpha * r_ans
        return self.alpha * r_ans + beta * r_ret
