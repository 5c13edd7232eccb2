"""Paired bootstrap confidence intervals: how sure a benchmark can be that ranker A beats ranker B
on the same questions. Shared by ``memsifter eval proxy`` and the scripts under ``eval/``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from memsifter.evaluation.config import N_BOOTSTRAP


def paired_bootstrap(
    a: Mapping[str, np.ndarray],
    b: Mapping[str, np.ndarray],
    n_resamples: int = N_BOOTSTRAP,
    seed: int = 0,
    chunk: int = 1000,
) -> dict[str, dict[str, Any]]:
    """Paired bootstrap of per-question differences a − b, for every metric both have:
    ``{metric: {"mean": d, "ci95": [lo, hi]}}``. Every metric is resampled with the same
    question draws (seeded); the CI is numpy's 2.5 and 97.5 percentiles of the resampled means.
    A constant difference gives exactly ``[d, d]``."""
    names = [m for m in a if m in b]
    if not names:
        return {}
    diffs = np.stack([np.asarray(a[m], float) - np.asarray(b[m], float) for m in names], axis=1)
    n = diffs.shape[0]
    if n == 0:
        return {m: {"mean": None, "ci95": None} for m in names}
    rng = np.random.default_rng(seed)
    means = []
    for start in range(0, n_resamples, chunk):
        size = min(chunk, n_resamples - start)
        # Resampling n questions with replacement = multinomial counts over the questions.
        counts = rng.multinomial(n, np.full(n, 1.0 / n), size=size)
        means.append(counts @ diffs / n)
    boot = np.concatenate(means)
    out = {}
    for j, m in enumerate(names):
        col = diffs[:, j]
        if np.all(col == col[0]):
            lo = hi = float(col[0])
        else:
            lo, hi = (float(x) for x in np.percentile(boot[:, j], [2.5, 97.5]))
        out[m] = {"mean": float(col.mean()), "ci95": [lo, hi]}
    return out


__all__ = ["paired_bootstrap"]
