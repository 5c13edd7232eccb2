"""Do two backends produce the same greedy completions? And when they do not, why?

Greedy decoding is deterministic per backend, but two implementations (transformers vs vLLM's CPU
kernels) sum floating-point numbers in different orders, so at a step where the top two logits
are nearly tied they may pick different tokens, and the texts diverge from there. A divergence
is *explained* when, at the first differing token, the reference model's top-2 logit margin is
below ``near_tie`` and the two chosen tokens are its top two; anything else is a real mismatch
(a different prompt, template, dtype or sampling setting) and must not be waved away.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Divergence:
    index: int  # prompt index
    position: int  # first differing completion token
    margin: float  # reference top-1 minus top-2 logit at that position
    tokens: tuple[str, str]  # (reference token, other token)
    top2: tuple[str, str]
    explained: bool


@dataclass(frozen=True)
class AgreementReport:
    n: int
    identical: int
    divergences: list[Divergence]

    @property
    def rate(self) -> float:
        return self.identical / self.n if self.n else 1.0

    @property
    def unexplained(self) -> list[Divergence]:
        return [d for d in self.divergences if not d.explained]

    def to_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "identical": self.identical,
            "rate": self.rate,
            "divergences": [asdict(d) for d in self.divergences],
        }


def compare_greedy(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    reference: Sequence[str],
    other: Sequence[str],
    near_tie: float = 0.05,
) -> AgreementReport:
    """``reference`` comes from ``model`` (transformers), ``other`` from another backend."""
    import torch

    divergences: list[Divergence] = []
    identical = 0
    for i, (prompt, ref, oth) in enumerate(zip(prompts, reference, other, strict=True)):
        if ref == oth:
            identical += 1
            continue
        a = tokenizer(ref, add_special_tokens=False)["input_ids"]
        b = tokenizer(oth, add_special_tokens=False)["input_ids"]
        pos = next(
            (k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
        )
        prefix = tokenizer(prompt, add_special_tokens=False)["input_ids"] + a[:pos]
        with torch.inference_mode():
            logits = model(torch.tensor([prefix])).logits[0, -1].float()
        top = torch.topk(logits, 2)
        margin = float(top.values[0] - top.values[1])
        chosen = (
            a[pos] if pos < len(a) else tokenizer.eos_token_id,
            b[pos] if pos < len(b) else tokenizer.eos_token_id,
        )
        top2 = tuple(int(t) for t in top.indices)
        explained = margin < near_tie and set(chosen) == set(top2)
        divergences.append(
            Divergence(
                index=i,
                position=pos,
                margin=margin,
                tokens=(tokenizer.decode([chosen[0]]), tokenizer.decode([chosen[1]])),
                top2=(tokenizer.decode([top2[0]]), tokenizer.decode([top2[1]])),
                explained=explained,
            )
        )
    return AgreementReport(n=len(prompts), identical=identical, divergences=divergences)
