"""Fibonacci tiers and their weights: where the marginal-utility reward looks along a ranking.

The working LLM is asked to answer from the top-k sessions of a ranking for k in the Fibonacci
tiers 1, 2, 3, 5, 8, 13, … (the duplicate leading 1 of the sequence is dropped: top-1 is one
tier). Tiers thin out down the ranking because a session's position matters less the lower it
sits, so dense probing at the top and sparse probing below spends working-LLM calls where the
ranking's quality is decided.

Each tier is weighted by how much position value it adds, with the DCG discount
C(k) = 1 / log2(k + 1) as the value of position k:

    w_n = C(F_n) - C(F_{n+1})   for every tier but the last,
    w_N = C(F_N)                for the last.

The weights telescope, so they sum to C(1) = 1 whatever the tiers. With tiers (1, 2, 3, 5, 8)
they are 0.3691, 0.1309, 0.1131, 0.0714 and 0.3155; the last tier carries the whole tail of the
discount curve (against a next tier of 13 it would get only C(8) - C(13) = 0.0528).

Tiers that cannot be filled. When the working LLM's window holds fewer sessions than a tier asks
for, the tier's prompt repeats the previous one (the lowest-ranked sessions are cut first). The
reward config may then drop those tiers for a data source (``tier_max_k``): they leave the
normalisation here, the last kept tier taking C(F_last). Because the weights telescope, a
repeated tier adds its weight to the tier it copies, so dropping exact repeats leaves R_ans
unchanged; what changes is that the reward stops claiming depth it cannot see. The reward service
reports and warns about every repeat it meets (``RewardStats.tier_repeats``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def fibonacci_tiers(max_k: int) -> tuple[int, ...]:
    """The distinct Fibonacci numbers 1, 2, 3, 5, 8, … up to and including ``max_k``.

    Callers cap ``max_k`` by how many sessions the ranking can show (the reward service passes
    ``min(config.max_k, number of candidates)``)."""
    if max_k < 1:
        raise ValueError(f"max_k must be >= 1, got {max_k}")
    tiers: list[int] = []
    a, b = 1, 2
    while a <= max_k:
        tiers.append(a)
        a, b = b, a + b
    return tuple(tiers)


def position_value(k: int) -> float:
    """C(k) = 1 / log2(k + 1): the DCG discount of rank k (1-based)."""
    if k < 1:
        raise ValueError(f"positions are 1-based, got {k}")
    return 1.0 / math.log2(k + 1)


def tier_weights(tiers: Sequence[int]) -> tuple[float, ...]:
    """``w_n = C(F_n) - C(F_{n+1})`` for each tier but the last, which gets ``C(F_N)``.

    ``tiers`` must be strictly increasing positive ranks; they need not be Fibonacci numbers (the
    definition only uses the discount at each tier), which keeps this usable for ablations.
    """
    if not tiers:
        raise ValueError("tier_weights needs at least one tier")
    if tiers[0] < 1 or any(b <= a for a, b in zip(tiers, tiers[1:], strict=False)):
        raise ValueError(f"tiers must be strictly increasing positive ranks, got {tuple(tiers)}")
    values = [position_value(k) for k in tiers]
    return tuple([values[i] - values[i + 1] for i in range(len(values) - 1)] + [values[-1]])
