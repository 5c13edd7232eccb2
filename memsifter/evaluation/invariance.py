"""Order invariance: does a ranker rank the candidates by what they say, or by where they stand?

A ranker that answers one fixed permutation (label 0 first, whatever the sessions hold) can still
score well when the shown order carries an opinion (``order: coarse`` shows the coarse filter's
best first). The check asks every question again with the same candidates shown in ``k`` seeded
random orders (:func:`permutations_for`, the same for every ranker, so the rows are paired) and
maps each answer back to the candidates it named. Two numbers a ranker:

* ``top1_agreement``: the share of the permuted answers whose first *session* is the one the
  ranker put first on the original order (a content ranker: 1; a constant permutation: its chance
  that the permutation left that session where it was, about 1/n);
* ``constant_share``: the share of questions whose first *label* is the same on the original
  order and on every permutation (a constant permutation: 1; a content ranker: about
  ``(1/n)^k``, the chance that every permutation left its choice in place).

An empty answer (a failed parse) agrees with nothing. Questions with one candidate have no other
order and are left out; ``n`` says how many were checked.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memsifter.errors import MemSifterError

MIN_PERMUTATIONS = 2
Order = tuple[int, ...]


@dataclass(frozen=True)
class PermutedAnswer:
    """One answer to a question shown in another order. ``order[j]`` is the original position
    of the candidate shown at position j; ``ranking`` is the answer in original positions."""

    order: Order
    ranking: tuple[int, ...]
    completion: str | None = None

    @property
    def top_label(self) -> int | None:
        """The shown position (label) the answer put first; None for an empty answer."""
        return self.order.index(self.ranking[0]) if self.ranking else None

    def to_record(self) -> dict[str, Any]:
        return {
            "order": list(self.order),
            "ranking": list(self.ranking),
            "completion": self.completion,
        }


def check_permutations(k: int) -> None:
    if k < MIN_PERMUTATIONS:
        raise MemSifterError(
            f"--permutations {k}: the order-invariance check needs at least "
            f"{MIN_PERMUTATIONS} permutations to tell a content ranker from a lucky one "
            "(--no-invariance skips the check)"
        )


def permutations_for(qid: str, n: int, k: int, seed: int) -> list[Order]:
    """``k`` seeded random orders of ``n`` candidates, none the identity (repeats allowed, so
    two candidates still give ``k``); none for ``n < 2``. Seeded by question id, so every ranker
    and every rerun is shown the same orders."""
    if n < 2:
        return []
    rng = random.Random(f"invariance:{seed}:{qid}")
    identity = tuple(range(n))
    orders: list[Order] = []
    while len(orders) < k:
        order = list(identity)
        rng.shuffle(order)
        if tuple(order) != identity:
            orders.append(tuple(order))
    return orders


def to_original(order: Order, shown_ranking: Sequence[int]) -> tuple[int, ...]:
    """An answer given in shown positions, in original positions."""
    return tuple(order[j] for j in shown_ranking)


def invariance(
    rankings: Sequence[Sequence[int]], permuted: Sequence[Sequence[PermutedAnswer]]
) -> dict[str, Any] | None:
    """The two numbers of the module doc over the questions that were permuted (None when none
    was). ``rankings`` are the answers on the original orders, aligned with ``permuted``."""
    agreement: list[float] = []
    constant: list[bool] = []
    counts: set[int] = set()
    for base, answers in zip(rankings, permuted, strict=True):
        if not answers:
            continue
        counts.add(len(answers))
        top = base[0] if base else None
        agreement.append(
            sum(top is not None and bool(a.ranking) and a.ranking[0] == top for a in answers)
            / len(answers)
        )
        # On the original order a candidate's label is its position.
        labels = {top, *(a.top_label for a in answers)}
        constant.append(len(labels) == 1 and top is not None)
    if not agreement:
        return None
    return {
        "top1_agreement": sum(agreement) / len(agreement),
        "constant_share": sum(constant) / len(constant),
        "permutations": max(counts),
        "n": len(agreement),
    }


__all__ = [
    "MIN_PERMUTATIONS",
    "PermutedAnswer",
    "check_permutations",
    "invariance",
    "permutations_for",
    "to_original",
]
