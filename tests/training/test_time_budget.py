"""epochs.max_minutes: a wall-clock budget that stops an epoch after a step and saves it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from memsifter.errors import DataError
from memsifter.training.config import EpochSettings
from memsifter.training.time_budget import TimeBudget, check_time_budget, time_budget_callback


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_budget_expires_once_its_minutes_have_passed_and_never_without_one() -> None:
    clock = Clock()
    budget, unbounded = TimeBudget(1.0, clock), TimeBudget(None, clock)
    clock.now += 59.9
    assert not budget.expired()
    clock.now += 0.1
    assert budget.expired()
    clock.now += 1e9
    assert not unbounded.expired()
    assert "max_minutes (1)" in budget.note(7) and "step 7" in budget.note(7)


@pytest.mark.parametrize("bad", [0, -1.0])
def test_a_budget_that_is_not_positive_is_refused_by_name(bad: float) -> None:
    with pytest.raises(ValueError, match="epochs.max_minutes must be > 0"):
        EpochSettings(max_minutes=bad)


def test_several_processes_refuse_a_budget_one_process_allows_it() -> None:
    check_time_budget(None, 8)
    check_time_budget(5.0, 1)
    with pytest.raises(DataError, match="2 processes would stop at different steps"):
        check_time_budget(5.0, 2)


def test_the_trl_callback_stops_and_saves_after_the_step_past_the_budget() -> None:
    clock = Clock()
    lines: list[str] = []
    cb = time_budget_callback(0.5, log=lines.append, clock=clock)
    control = SimpleNamespace(should_training_stop=False, should_save=False)
    cb.on_train_begin(None, SimpleNamespace(global_step=0), control)
    clock.now += 29.0
    cb.on_step_end(None, SimpleNamespace(global_step=3), control)
    assert not control.should_training_stop and not control.should_save
    clock.now += 1.0
    cb.on_step_end(None, SimpleNamespace(global_step=4), control)
    assert control.should_training_stop and control.should_save
    assert lines == ["stopped at step 4: epochs.max_minutes (0.5) has passed"]
