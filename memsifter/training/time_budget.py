"""A wall-clock budget for an epoch's training (``epochs.max_minutes``).

``max_steps`` is the plan: it sizes the warm-up's decay and the schedule. ``max_minutes`` is the
machine's share of it: an epoch stops after the first step that ends past the budget, saves
that step as a checkpoint, and the epoch loop validates and averages as after any last step.
A borrowed accelerator that is lent for minutes then ends with a model and its curve, not a
killed process. The clock is this process's, from the start of its ``train()`` (a resumed run
gets a fresh budget), so several processes would stop at different steps and wait on each
other's collectives: a multi-process run refuses it (:func:`check_time_budget`).
"""

from __future__ import annotations

import time
from typing import Any

from memsifter.errors import DataError


class TimeBudget:
    """``expired()`` once ``minutes`` have passed since construction; never with ``None``."""

    def __init__(self, minutes: float | None, clock: Any = time.monotonic) -> None:
        self.minutes = minutes
        self.clock = clock
        self.t0 = clock()

    def expired(self) -> bool:
        return self.minutes is not None and self.clock() - self.t0 >= self.minutes * 60.0

    def note(self, step: int) -> str:
        return f"stopped at step {step}: epochs.max_minutes ({self.minutes:g}) has passed"


def check_time_budget(minutes: float | None, processes: int) -> None:
    if minutes is not None and processes > 1:
        raise DataError(
            f"epochs.max_minutes stops on one process's clock; {processes} processes would stop "
            "at different steps and wait on each other: leave it unset for a multi-process run",
            field="epochs.max_minutes",
        )


def time_budget_callback(minutes: float, log: Any = print, clock: Any = time.monotonic) -> Any:
    """A ``TrainerCallback`` for TRL's trainer: stop and save after the step that ends past the
    budget (the epoch loop then validates that checkpoint)."""
    from transformers import TrainerCallback

    class _TimeBudget(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.budget = TimeBudget(minutes, clock)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.budget.expired() and not control.should_training_stop:
                control.should_training_stop = True
                control.should_save = True
                log(self.budget.note(state.global_step))

    return _TimeBudget()
