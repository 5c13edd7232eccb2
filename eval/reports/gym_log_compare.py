"""Training logs of reading-gym runs side by side: means over windows of steps.

Each argument is a committed log (``eval/results/gym_reading/runs/<rung>/<run>_log.jsonl``, one
JSON object a step); runs with the same seed saw the same prompts at each step, so a window's
difference is paired. Prints a markdown table of reward, first-place entropy, gradient norm and
the reward's spread within a group, and the per-step paired reward difference of each run
against the first over the steps they share (mean and standard error)::

    python -m eval.reports.gym_log_compare --window 10 \\
        eval/results/gym_reading/runs/small-marker/outcome_log.jsonl \\
        eval/results/gym_reading/runs/small-marker/outcome-scale-none_log.jsonl
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import typer

KEYS = ("reward", "entropy", "grad_norm", "reward_std")


def load(path: Path) -> dict[int, dict[str, float]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {int(r["step"]): r for r in rows if "reward" in r}


def windows(log: dict[int, dict[str, float]], width: int, last: int) -> list[dict[str, float]]:
    out = []
    for lo in range(1, last + 1, width):
        steps = [s for s in range(lo, min(lo + width, last + 1)) if s in log]
        if steps:
            row = {k: sum(log[s][k] for s in steps) / len(steps) for k in KEYS}
            out.append({"from": lo, "to": steps[-1], **row})
    return out


def paired(
    a: dict[int, dict[str, float]], b: dict[int, dict[str, float]]
) -> tuple[float, float, int]:
    diffs = [b[s]["reward"] - a[s]["reward"] for s in sorted(set(a) & set(b))]
    n = len(diffs)
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1) if n > 1 else float("nan")
    return mean, math.sqrt(var / n), n


def main(
    logs: Annotated[list[Path], typer.Argument(help="committed *_log.jsonl files")],
    window: Annotated[int, typer.Option(help="steps a row")] = 20,
) -> None:
    """Training logs side by side, by windows of steps, and paired against the first."""
    names = [p.name.removesuffix("_log.jsonl") for p in logs]
    # Runs of one recipe on two rungs share a name: the rung's folder tells them apart.
    if len(set(names)) < len(names):
        names = [f"{p.parent.name}/{n}" for p, n in zip(logs, names, strict=True)]
    runs = {n: load(p) for n, p in zip(names, logs, strict=True)}
    last = max(max(log) for log in runs.values())
    print("| run | steps | reward | entropy | grad norm | reward spread in a group |")
    print("|---|---|---|---|---|---|")
    for name, log in runs.items():
        for w in windows(log, window, last):
            print(
                f"| {name} | {w['from']}–{w['to']} | {w['reward']:.3f} | {w['entropy']:.2f} "
                f"| {w['grad_norm']:.2f} | {w['reward_std']:.3f} |"
            )
    first_name, first = next(iter(runs.items()))
    for name, log in list(runs.items())[1:]:
        mean, se, n = paired(first, log)
        print(f"\n{name} − {first_name}: reward {mean:+.3f} a step (se {se:.3f}, {n} shared steps)")


if __name__ == "__main__":
    typer.run(main)
