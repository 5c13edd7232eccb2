"""Where a reading-gym ranker puts its first place: position or content?

For each model (the start, or a checkpoint folder whose adapter is merged first) ranks the first
``--n`` validation memory questions of a rung's data and reports how often its first place is
the useful session, the newest candidate, and the histogram of the first place's relative
position (0 the oldest session, 1 the newest) beside the useful session's own. A policy that
has learned recency rather than reading puts its first place late whatever the question.
Validation users only (test users choose nothing)::

    python -m eval.probes.gym_first_place --rung small-marker smollm2-135m-instruct \\
        outputs/gym_reading/small-marker/train/outcome/epoch-0/checkpoint-40
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

ROOT = Path(__file__).resolve().parents[2]

BINS = 5


def rel_histogram(positions: list[int], sizes: list[int]) -> list[int]:
    rel = [p / max(k - 1, 1) for p, k in zip(positions, sizes, strict=True)]
    return np.histogram(rel, bins=BINS, range=(0.0, 1.0))[0].tolist()


def first_place_report(ranks: list[list[int]], rows: list[dict[str, Any]]) -> dict[str, Any]:
    first = [r[0] for r in ranks]
    sizes = [int(r["n_candidates"]) for r in rows]
    useful = [{int(x) for x in r["useful_positions"]} for r in rows]
    return {
        "n": len(rows),
        "first_is_useful": float(np.mean([f in u for f, u in zip(first, useful, strict=True)])),
        "first_is_newest": float(np.mean([f == k - 1 for f, k in zip(first, sizes, strict=True)])),
        "first_rel_position_mean": float(
            np.mean([f / max(k - 1, 1) for f, k in zip(first, sizes, strict=True)])
        ),
        "first_rel_position_hist": rel_histogram(first, sizes),
    }


def mergeable(name: str, rung: str) -> str | Path:
    """A model name or folder as the rankers read it: a checkpoint's adapter merged first, into
    the rung's scratch folder."""
    from memsifter.training.loop import merged_for_eval

    if not (Path(name) / "adapter_config.json").is_file():
        return name
    # merged_for_eval reuses a merged folder by its checkpoint's name: one folder a run, or two
    # runs' checkpoint-40 would read as one model.
    scratch = ROOT / "outputs/gym_reading" / rung / "first_place_scratch"
    return merged_for_eval(Path(name), scratch / "_".join(Path(name).resolve().parts[-3:]))


def main(
    models: Annotated[
        list[str], typer.Argument(help="a model name or folder, or a checkpoint folder")
    ],
    rung: Annotated[str, typer.Option(help="the reading gym's rung (its data folder)")] = (
        "small-marker"
    ),
    n: Annotated[int, typer.Option(help="validation memory questions ranked")] = 60,
    out: Annotated[
        str | None, typer.Option(help="JSON file (default: beside the rung's logs)")
    ] = None,
) -> None:
    """Where each model's first place lands, by relative position, against the useful session."""

    import eval.probes.gym_reading as G
    from memsifter.ranker.checkpoint import read_spec

    data = ROOT / "outputs/gym_reading" / rung / "data"
    rows = [r for r in G.load_split(data, "validation") if len(r["useful_positions"])][:n]
    spec = read_spec(data)
    sizes = [int(r["n_candidates"]) for r in rows]
    newest_useful = [max(int(x) for x in r["useful_positions"]) for r in rows]
    report: dict[str, Any] = {
        "rung": rung,
        "split": "validation",
        "bins": f"{BINS} equal bins of the relative position, oldest first",
        "useful_rel_position_hist": rel_histogram(newest_useful, sizes),
        "useful_is_newest": float(
            np.mean([u == k - 1 for u, k in zip(newest_useful, sizes, strict=True)])
        ),
        "models": {},
        "command": "python -m eval.probes.gym_first_place " + " ".join(sys.argv[1:]),
        "code_version": G.code_version(),
    }
    for name in models:
        report["models"][name] = first_place_report(
            G.rank_with(mergeable(name, rung), rows, spec), rows
        )
        print(name, json.dumps(report["models"][name]), flush=True)
    out = Path(out) if out else G.RUNS / rung / "first_place.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    typer.run(main)
