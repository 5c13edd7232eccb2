"""Fibonacci tiers and their weights: where the marginal-utility reward looks along a ranking.

The working LLM is asked to answer from the top-k sessions of a ranking for k in the Fibonacci
tiers 1, 2, 3, 5, 8, 13, … (the duplicate leading 1 of the sequence is dropped: top-1 is one
tier). Tiers thin out down the ranking because a session's position matters less the lower it
sits, so dense probing at the top and sparse probing below spends working-LLM calls where the
ranking's quality is decided.

Each tier is weighted by how much position value it adds, with the DCG discount
C(k) = 1 / log2(k + 1) as the value of position k. Two weightings (``TIER_WEIGHTS``):

``paper`` (the default: the paper's text and its published w_1…w_8)
    w_n = C(F_n) - C(F_{n+1})   for every tier, the last against the next Fibonacci number.

    With tiers (1, 2, 3, 5, 8): 0.3691, 0.1309, 0.1131, 0.0714, 0.0528 (C(8) - C(13)). They sum
    to C(1) - C(F_{N+1}) (0.7374 here), and the top-1 tier weighs 7x the top-8 tier.

``tail`` (the official code's weights)
    the same for every tier but the last, which takes C(F_N): 0.3691, 0.1309, 0.1131, 0.0714,
    0.3155. These telescope to C(1) = 1, and the last tier carries the whole tail of the discount
    curve, so the top-8 tier weighs almost as much as the top-1 (R_ans then hardly cares whether
    the useful session is first or eighth; eval/results/bench_rewards/bench_rewards.md).

"The next Fibonacci number" after the last tier is the sum of the last two tiers (2 after a lone
tier 1), which is F_{N+1} for Fibonacci tiers and a Fibonacci-like continuation for the ablation
tiers ``tier_weights`` also accepts.

Tiers that cannot be filled. When the working LLM's window holds fewer sessions than a tier asks
for, the tier's prompt repeats the previous one (the lowest-ranked sessions are cut first), so the
repeated tier's score equals the tier it copies. The reward config may then drop those tiers for
a data source (``tier_max_k``): the tiers stop at the last one the window can fill, and the
weights are those of the shorter tier list. What that does to R_ans:

- ``tail``: the weights telescope, so a repeated tier adds its weight to the tier it copies and
  dropping exact repeats leaves R_ans unchanged;
- ``paper``: they do not telescope. Kept, the repeats credit the last fillable tier m with
  C(F_{m+1}) - C(F_{N+1}) more than its own weight, as if the deeper tiers had been measured and
  added nothing; dropped, R_ans is exactly the reward of the tiers the window can show, and
  smaller by that credit times (s_m - s_0). Dropping is the honest choice: the reward stops
  claiming depth it cannot see (:func:`repeat_credit` gives the difference).

The reward service reports and warns about every repeat it meets (``RewardStats.tier_repeats``).
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


TIER_WEIGHTS = ("paper", "tail")


def _next_tier(tiers: Sequence[int]) -> int:
    """The tier after the last: the sum of the last two (the next Fibonacci number), 2 after 1."""
    return tiers[-1] + (tiers[-2] if len(tiers) > 1 else 1)


def tier_weights(tiers: Sequence[int], mode: str = "paper") -> tuple[float, ...]:
    """``w_n = C(F_n) - C(F_{n+1})`` for each tier; the last tier is measured against the next
    Fibonacci number (``paper``) or takes ``C(F_N)`` (``tail``, the official code's).

    ``tiers`` must be strictly increasing positive ranks; they need not be Fibonacci numbers (the
    definition only uses the discount at each tier), which keeps this usable for ablations.
    """
    if mode not in TIER_WEIGHTS:
        raise ValueError(f"tier weights must be one of {TIER_WEIGHTS}, got {mode!r}")
    if not tiers:
        raise ValueError("tier_weights needs at least one tier")
    if tiers[0] < 1 or any(b <= a for a, b in zip(tiers, tiers[1:], strict=False)):
        raise ValueError(f"tiers must be strictly increasing positive ranks, got {tuple(tiers)}")
    values = [position_value(k) for k in tiers]
    last = values[-1] - position_value(_next_tier(tiers)) if mode == "paper" else values[-1]
    return tuple([values[i] - values[i + 1] for i in range(len(values) - 1)] + [last])


def repeat_credit(tiers: Sequence[int], kept: int, mode: str = "paper") -> float:
    """How much more weight tier ``tiers[kept - 1]`` carries when the tiers after it are kept as
    exact repeats of it than when they are dropped (``tier_max_k``): R_ans(kept repeats) -
    R_ans(dropped) = this x (s_m - s_0). 0 for ``tail`` weights (they telescope)."""
    if not 1 <= kept <= len(tiers):
        raise ValueError(f"kept must be in 1..{len(tiers)}, got {kept}")
    full = tier_weights(tiers, mode)
    short = tier_weights(tiers[:kept], mode)
    return sum(full[kept - 1 :]) - short[-1]
