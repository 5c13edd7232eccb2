"""Warm-up reward shaping: R = alpha * R_ans + beta(t) * R_ret.

Early in GRPO the proxy's rankings are near random and the working LLM's answers barely change
between them, so the answer reward gives little signal. The retrieval reward (NDCG of gold
sessions) is a dense label-based signal that gets training started; its weight beta decays from
beta_0 to 0 over N optimiser steps, after which the proxy is trained on outcomes alone. alpha
stays constant.

``linear``: beta(t) = beta_0 * (1 - t / N). ``cosine``: beta(t) = beta_0 * (1 + cos(pi t / N)) / 2,
which keeps the labels around longer and then drops them faster. Both are beta_0 at t = 0 and
exactly 0 from t = N on; N = 0 means no warm-up at all.

N is given in one of two ways, never both:

* ``decay_steps``: a fixed count of optimiser steps;
* ``decay_fraction`` (in (0, 1]): a fraction of the run's total optimiser steps, so the warm-up is
  sized to the run. The total is known only once the trainer is built, so such a schedule is
  *unresolved* until :meth:`ShapingSchedule.for_run` turns it into
  ``decay_steps = ceil(decay_fraction * total_steps)``; asking an unresolved schedule for beta
  raises rather than guess.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

Schedule = Literal["linear", "cosine"]
SCHEDULES: tuple[str, ...] = ("linear", "cosine")


@dataclass(frozen=True)
class ShapingSchedule:
    alpha: float = 1.0
    beta0: float = 0.5
    decay_steps: int | None = 200  # None when sized by decay_fraction
    schedule: Schedule = "linear"
    decay_fraction: float | None = None  # beta reaches 0 at this fraction of the run's steps

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; use one of {SCHEDULES}")
        if self.decay_steps is not None and self.decay_fraction is not None:
            raise ValueError(
                f"decay_steps ({self.decay_steps}) and decay_fraction ({self.decay_fraction}) "
                "are both set; give one (set decay_steps to null to size the warm-up by "
                "decay_fraction)"
            )
        if self.decay_steps is None and self.decay_fraction is None:
            raise ValueError("set decay_steps or decay_fraction: the warm-up needs a length")
        if self.decay_steps is not None and self.decay_steps < 0:
            raise ValueError(f"decay_steps must be >= 0, got {self.decay_steps}")
        if self.decay_fraction is not None and not 0.0 < self.decay_fraction <= 1.0:
            raise ValueError(f"decay_fraction must be in (0, 1], got {self.decay_fraction}")
        if self.beta0 < 0:
            raise ValueError(f"beta0 must be >= 0, got {self.beta0}")

    @property
    def resolved(self) -> bool:
        """Whether the warm-up's length in steps is known (always, with ``decay_steps``)."""
        return self.decay_steps is not None

    def for_run(self, total_steps: int) -> ShapingSchedule:
        """This schedule for a run of ``total_steps`` optimiser steps: a ``decay_fraction`` becomes
        ``decay_steps = ceil(decay_fraction * total_steps)``; a ``decay_steps`` schedule is
        returned unchanged."""
        if total_steps < 1:
            raise ValueError(f"total_steps must be >= 1, got {total_steps}")
        if self.decay_fraction is None:
            return self
        # The epsilon keeps e.g. 0.3 * 10 = 3.0000000000000004 from becoming 4 steps.
        steps = math.ceil(self.decay_fraction * total_steps - 1e-9)
        return dataclasses.replace(self, decay_steps=steps, decay_fraction=None)

    def beta(self, step: int) -> float:
        """beta(t) at optimiser step ``step`` (0-based)."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        n = self.decay_steps
        if n is None:
            raise ValueError(
                f"the warm-up is decay_fraction={self.decay_fraction} of the run, but the run's "
                "length is unknown: call ShapingSchedule.for_run(total_steps) (or "
                "RewardFunction.set_total_steps / RewardService.set_total_steps) first"
            )
        if step >= n:
            return 0.0
        frac = step / n
        if self.schedule == "linear":
            return self.beta0 * (1.0 - frac)
        # The factor first: beta(0) is beta_0 exactly, where beta_0 * 0.5 first would round a
        # subnormal beta_0 to 0 (a property test drew 5e-324).
        return self.beta0 * (0.5 * (1.0 + math.cos(math.pi * frac)))

    def combine(self, r_ans: float, r_ret: float, step: int) -> float:
        """alpha * R_ans + beta(step) * R_ret; exactly alpha * R_ans once beta is 0."""
        beta = self.beta(step)
        if beta == 0.0:
            return self.alpha * r_ans
        return self.alpha * r_ans + beta * r_ret


@dataclass
class RunClock:
    """The run's optimiser-step clock, over all epochs: the one the warm-up's beta(t) and dynamic
    sampling's refill seeds read. The epoch loop builds a new trainer per epoch, whose own
    ``global_step`` restarts at 0; ``offset`` is the steps the finished epochs took, so
    ``at(global_step)`` keeps counting across them. The reward function holds the clock, and the
    trainers read it from there: one object, not an offset copied into each."""

    total: int | None = None  # the run's steps over all epochs (sizes ``decay_fraction``)
    offset: int = 0

    def at(self, global_step: int) -> int:
        """The run's step at a trainer's ``global_step``."""
        return self.offset + int(global_step)

    def start_epoch(self, finished_steps: int) -> None:
        """A new epoch's trainer starts after ``finished_steps`` steps of the earlier epochs."""
        self.offset = int(finished_steps)
