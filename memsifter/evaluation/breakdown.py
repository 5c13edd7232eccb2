"""Where a ranker wins and loses against the coarse filter: the proxy benchmark's questions split
by category (LoCoMo's single-hop, multi-hop, temporal, open-domain, adversarial) and by how many
candidates the prompt shows, each slice paired against the coarse row on the same questions.

Slices are small, so every difference carries its paired bootstrap CI (resampling
conversations, as the whole table does) and its n; a slice of one conversation has no spread
to resample and says so with the CI of a constant.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from memsifter.data.locomo import CATEGORY_NAMES
from memsifter.evaluation.bootstrap import paired_bootstrap
from memsifter.evaluation.proxy_data import Question

# Candidate counts in powers of two: a window of 10 pages and one of 160 sessions both read.
_BINS: tuple[tuple[int, int], ...] = ((1, 4), (5, 8), (9, 16), (17, 32), (33, 64), (65, 10**9))


def category_of(q: Question) -> str:
    name = CATEGORY_NAMES.get(q.category) if q.qid.startswith("locomo/") else None
    return name or q.category or "none"


def candidates_of(q: Question) -> str:
    lo, hi = next(b for b in _BINS if b[0] <= q.n_candidates <= b[1])
    return f"{lo}+" if hi >= 10**9 else f"{lo}-{hi}"


SLICES: dict[str, Callable[[Question], str]] = {
    "category": category_of,
    "candidates": candidates_of,
}


def breakdown(
    questions: Sequence[Question],
    values: Mapping[str, Mapping[str, np.ndarray]],
    coarse: str,
    metric: str = "ndcg@1",
    n_bootstrap: int = 10_000,
    seed: int = 0,
) -> dict[str, dict[str, Any]]:
    """``{slice: {group: {"n", "means": {ranker: mean}, "vs_coarse": {ranker: {mean, ci95,
    n_clusters}}}}}`` for ``metric``; groups in order of first appearance for categories and of
    size for candidate counts."""
    convs = [q.conversation for q in questions]
    out: dict[str, dict[str, Any]] = {}
    for slice_name, key in SLICES.items():
        labels = [key(q) for q in questions]
        groups = list(dict.fromkeys(labels))
        if slice_name == "candidates":
            groups.sort(key=lambda g: int(g.split("-")[0].rstrip("+")))
        table: dict[str, Any] = {}
        for g in groups:
            idx = np.array([i for i, label in enumerate(labels) if label == g])
            clusters = [convs[i] for i in idx] if all(convs) else None
            base = {metric: np.asarray(values[coarse][metric])[idx]}
            table[g] = {
                "n": len(idx),
                "means": {r: float(np.asarray(v[metric])[idx].mean()) for r, v in values.items()},
                "vs_coarse": {
                    r: paired_bootstrap(
                        {metric: np.asarray(v[metric])[idx]},
                        base,
                        n_bootstrap,
                        seed,
                        clusters=clusters,
                    )[metric]
                    for r, v in values.items()
                    if r != coarse
                },
            }
        out[slice_name] = table
    return out


def render_breakdown(tables: Mapping[str, Mapping[str, Any]], coarse: str, metric: str) -> str:
    """One markdown table a slice: the coarse mean, and each ranker's mean with its difference
    from the coarse row and the 95% CI of that difference."""
    lines: list[str] = []
    for slice_name, table in tables.items():
        if not table:
            continue
        rankers = list(next(iter(table.values()))["vs_coarse"])
        head = [slice_name, "n", coarse, *(f"{r} (− {coarse} [95% CI])" for r in rankers)]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for g, row in table.items():
            cells = [g, str(row["n"]), f"{row['means'][coarse]:.3f}"]
            for r in rankers:
                d = row["vs_coarse"][r]
                lo, hi = d["ci95"]
                cells.append(f"{row['means'][r]:.3f} ({d['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}])")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return f"{metric} by slice.\n\n" + "\n".join(lines) if lines else ""


__all__ = ["SLICES", "breakdown", "candidates_of", "category_of", "render_breakdown"]
