"""Fakes shared by the reward tests: a whitespace tokenizer and a deterministic working LLM that
answers with the facts it sees, so rewards depend on the ranking without loading a model."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from memsifter.data.types import Session, Turn
from memsifter.llm import Generation, SamplingConfig

FACTS = ["blue", "Lisbon", "violin", "nurse", "Max", "Seattle", "chess", "October", "tea", "rain"]


class FakeTokenizer:
    """Whitespace tokens and a plain-text chat template: enough for Answerer.render."""

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[str]]:
        return {"input_ids": text.split()}

    def apply_chat_template(self, messages: list[dict], tokenize: bool = False, **_: Any) -> str:
        return "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages) + "<a>"


class FakeWorkingLLM:
    """Answers with every fact it sees in its memory, plus a filler word per memory beyond two
    (so more memory is not always better), and counts every prompt it is sent."""

    name = "fake"
    model_name = "fake"

    def __init__(self) -> None:
        self._tok = FakeTokenizer()
        self.seen: Counter[str] = Counter()
        self.batches: list[int] = []

    @property
    def tokenizer(self) -> FakeTokenizer:
        return self._tok

    def generate(self, prompts: Sequence[str], sampling: SamplingConfig) -> list[list[Generation]]:
        assert sampling.greedy
        self.batches.append(len(prompts))
        out = []
        for p in prompts:
            self.seen[p] += 1
            facts = re.findall(r"fact is (\w+)", p)
            n_mem = len(re.findall(r"\[Memory \d+\]", p))
            words = facts + ["perhaps"] * max(0, n_mem - 2)
            out.append(
                [Generation(f"<answer>{' '.join(words) or 'unknown'}</answer>", 1, 1, "stop", 0.0)]
            )
        return out


def fact_sessions(n: int, tag: str = "c") -> tuple[Session, ...]:
    return tuple(
        Session(
            id=f"{tag}/s{i}",
            turns=(
                Turn("A", f"session {i} of {tag}: the fact is {FACTS[i % len(FACTS)]}"),
                Turn("B", "ok"),
            ),
            date_text=f"{i + 1} May 2023",
        )
        for i in range(n)
    )


def ranking_text(ids: Sequence[int]) -> str:
    return f"<think>hm</think><ranking>{', '.join(map(str, ids))}</ranking>"
