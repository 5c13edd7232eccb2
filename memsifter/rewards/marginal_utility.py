"""The answer reward: how much a ranking's top sessions raise the working LLM's task score.

    R_ans = sum_n w_n * (s_{F_n} - s_0)

``s_k`` is the working LLM's task score (token F1, exact match, LoCoMo's score or an LLM judge)
when it answers from the top-k sessions of the ranking, ``s_0`` its score with no memory at
all, and ``w_n`` the Fibonacci tier weights (:mod:`memsifter.rewards.tiers`). Subtracting s_0
rewards only what the memory adds: a question the working LLM answers from general knowledge
earns the ranking nothing.

With the paper's weights (the default), a score that rises from s_0 to s_0 + d at tier k and
stays there earns d * (C(k) - C(F_{N+1})): the same improvement is worth more the higher up the
ranking it happens, and nothing below the last tier counts. With ``tail`` weights (the official
code's) it earns d * C(k) (:mod:`memsifter.rewards.tiers`).

Difference from the official implementation: its loop over tiers starts at the second tier and
so never scores k = 1, the tier with the heaviest weight (0.3691 of 1 with tiers 1…8). Here
every tier is scored, k = 1 included.
"""

from __future__ import annotations

from collections.abc import Mapping

from memsifter.rewards.tiers import tier_weights


def marginal_utility(
    tier_scores: Mapping[int, float], subtract_s0: bool = True, weights: str = "paper"
) -> float:
    """R_ans from ``tier_scores``, which maps k to s_k; key 0 is s_0 (no memory).

    The tiers are the other keys, in increasing order (normally ``fibonacci_tiers(...)``). The sum
    runs in that order so the same scores always give the same float. ``subtract_s0=False`` is
    the ablation that scores the answers alone, sum_n w_n s_{F_n}; s_0 is still required (the
    reward service measures it either way). ``weights`` is ``paper`` or ``tail``
    (:func:`memsifter.rewards.tiers.tier_weights`)."""
    return marginal_utility_to_go(tier_scores, 1, subtract_s0, weights)[0]


def marginal_utility_to_go(
    tier_scores: Mapping[int, float],
    depth: int,
    subtract_s0: bool = True,
    weights: str = "paper",
) -> list[float]:
    """R_ans's part that each of the first ``depth`` places can still change: entry j (0-based
    place) sums the tiers k > j, since tier k reads the top k and a tier k <= j is settled by
    the places above j. Entry 0 is R_ans itself (the same sum in the same order, so the same
    float); past the deepest tier an entry is 0. The Plackett–Luce trainer credits each place
    with its entry (``grpo.pl_credit: tiers``): the tiers above a place are noise to it."""
    if 0 not in tier_scores:
        raise ValueError("tier_scores needs key 0, the score with no memory (s_0)")
    tiers = sorted(k for k in tier_scores if k != 0)
    if not tiers:
        raise ValueError("tier_scores has s_0 but no tier")
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    s0 = tier_scores[0] if subtract_s0 else 0.0
    terms = [
        (k, w * (tier_scores[k] - s0))
        for k, w in zip(tiers, tier_weights(tiers, weights), strict=True)
    ]
    out = []
    for place in range(depth):
        total = 0.0
        for k, term in terms:
            if k > place:
                total += term
        out.append(total)
    return out
