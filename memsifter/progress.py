"""The rich progress bar every long loop shows (eval, RL data building), in one place so a layer
that needs a bar does not import it from a higher one."""

from __future__ import annotations

from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


def make_progress(console: Any) -> Progress:
    """The rich progress bar every eval loop shows (disabled without a console, e.g. in tests)."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=console is None,
    )
