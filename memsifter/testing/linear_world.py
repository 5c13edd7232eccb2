"""A ranking world for a Plackett–Luce learner with nothing but content to go on: each prompt is
``n`` candidates with ``d`` random features, the useful one is ``argmax x · w*`` for a hidden
``w*``, and a linear scorer ``x · θ`` starts at θ = 0 (the uniform policy). Seconds on a CPU, so
a trainer's advantage rule can be checked to learn (and its shuffled control not to) in a test,
and timed over many seeds in ``eval/probes/gym_pl_variance.py``. One generator draws the hidden
weights, the held-out prompts, then the training prompts and whatever the caller draws with it
(its rankings), so two rules run with one seed see the same prompts in the same order."""

from __future__ import annotations

from typing import Any


class LinearWorld:
    def __init__(self, n: int, d: int, seed: int, held_out: int) -> None:
        import torch

        self.n, self.d = n, d
        self.gen = torch.Generator().manual_seed(seed)
        self.w_star = torch.randn(d, generator=self.gen)
        self.val_x, self.val_u = self.prompts(held_out)

    def prompts(self, count: int) -> tuple[Any, Any]:
        """``count`` prompts' features ``[count, n, d]`` and their useful candidates."""
        import torch

        x = torch.randn(count, self.n, self.d, generator=self.gen)
        return x, (x @ self.w_star).argmax(-1)

    def accuracy(self, theta: Any) -> float:
        """Greedy top-1 accuracy (NDCG@1 of the useful candidate) on the held-out prompts."""
        import torch

        with torch.no_grad():
            return float(((self.val_x @ theta).argmax(-1) == self.val_u).float().mean())
