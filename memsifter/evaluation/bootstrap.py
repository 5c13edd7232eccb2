"""Paired bootstrap confidence intervals: how sure a benchmark can be that ranker A beats ranker B
on the same questions. Shared by ``memsifter eval proxy`` and the scripts under ``eval/``.

Questions that share a user or a conversation are not independent draws: two questions about
one user's history succeed or fail together. Resampling them one by one then gives intervals
that are too narrow. Pass ``clusters`` (the user or conversation of each question) and the
bootstrap resamples whole clusters instead (the cluster bootstrap), keeping each cluster's
questions together; the statistic is still the mean over questions (a ratio estimator:
the resampled clusters' summed differences over their summed question counts)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from memsifter.evaluation.config import N_BOOTSTRAP


def paired_bootstrap(
    a: Mapping[str, np.ndarray],
    b: Mapping[str, np.ndarray],
    n_resamples: int = N_BOOTSTRAP,
    seed: int = 0,
    chunk: int = 1000,
    clusters: Sequence[Hashable] | None = None,
) -> dict[str, dict[str, Any]]:
    """Paired bootstrap of per-question differences a − b, for every metric both have:
    ``{metric: {"mean": d, "ci95": [lo, hi], "n": questions, "n_clusters": units}}``. Every
    metric is resampled with the same draws (seeded); the CI is numpy's 2.5 and 97.5
    percentiles of the resampled means. With ``clusters`` (one label a question), whole
    clusters are drawn with replacement (module doc); without, questions are. A constant
    difference gives exactly ``[d, d]``."""
    names = [m for m in a if m in b]
    if not names:
        return {}
    diffs = np.stack([np.asarray(a[m], float) - np.asarray(b[m], float) for m in names], axis=1)
    n = diffs.shape[0]
    if clusters is not None and len(clusters) != n:
        raise ValueError(f"{len(clusters)} cluster labels for {n} questions")
    if n == 0:
        return {m: {"mean": None, "ci95": None, "n": 0, "n_clusters": 0} for m in names}
    if clusters is None:
        sums, sizes = diffs, np.ones(n)
    else:
        index: dict[Hashable, int] = {}
        member = np.array([index.setdefault(c, len(index)) for c in clusters])
        sums = np.zeros((len(index), diffs.shape[1]))
        np.add.at(sums, member, diffs)
        sizes = np.bincount(member, minlength=len(index)).astype(float)
    units = sums.shape[0]
    rng = np.random.default_rng(seed)
    means = []
    for start in range(0, n_resamples, chunk):
        size = min(chunk, n_resamples - start)
        # Resampling `units` units with replacement = multinomial counts over the units.
        counts = rng.multinomial(units, np.full(units, 1.0 / units), size=size)
        means.append((counts @ sums) / (counts @ sizes)[:, None])
    boot = np.concatenate(means)
    out = {}
    for j, m in enumerate(names):
        col = diffs[:, j]
        if np.all(col == col[0]):
            lo = hi = float(col[0])
        else:
            lo, hi = (float(x) for x in np.percentile(boot[:, j], [2.5, 97.5]))
        out[m] = {"mean": float(col.mean()), "ci95": [lo, hi], "n": n, "n_clusters": units}
    return out


__all__ = ["paired_bootstrap"]
