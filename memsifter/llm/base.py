"""The one protocol every inference backend implements, so the proxy, the answerer, the reward
service and the server never care whether tokens come from transformers, a vLLM server or an
in-process vLLM engine.

Prompts are *rendered text* (the chat template already applied by our prompt builders with the
model's own tokenizer), not chat messages: every backend then sees byte-identical prompts, which
is what makes greedy outputs comparable across backends and cacheable by prompt hash.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 512
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    n: int = 1  # completions per prompt (GRPO groups)
    seed: int | None = None
    stop: tuple[str, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(frozen=True)
class Generation:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" | "length"
    latency_s: float  # wall time of the call (batch or request) that produced it


@runtime_checkable
class Backend(Protocol):
    name: str
    model_name: str

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer: prompt builders render chat templates and count with it."""

    def generate(self, prompts: Sequence[str], sampling: SamplingParams) -> list[list[Generation]]:
        """``sampling.n`` generations for each prompt, in prompt order."""
