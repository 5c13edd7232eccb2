"""Stand-ins for a model: a tokenizer with a chat template, and a scripted backend that
implements ``memsifter.llm.Backend``, for testing the proxy and the service without weights.

``FakeTokenizer`` splits text into word, space and punctuation pieces (decoding joins them back
exactly), renders ChatML, and has ``<|im_start|>``/``<|im_end|>`` as special tokens, so the
shared prompt builder runs its real code paths (budgeting, defanging) against it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from memsifter.llm import Generation, SamplingParams

_PIECE = re.compile(r"\s+|\w+|[^\w\s]")
_SPECIALS = ("<|im_start|>", "<|im_end|>")
# The proxy prompt's instructions name the last candidate before any session text, as the prompt
# builder writes them (memsifter/ranker/prompt.py), so their count cannot be spoofed.
_LAST = re.compile(r"from \[Session 0\] to \[Session (\d+)\]")


def n_candidates(prompt: str) -> int:
    """How many candidates a proxy prompt lists (0 when it is not a proxy prompt)."""
    match = _LAST.search(prompt)
    return int(match.group(1)) + 1 if match else 0


class FakeTokenizer:
    """Word, space and punctuation pieces; ChatML with ``<|im_start|>``/``<|im_end|>`` specials."""

    name_or_path = "fake-tokenizer"
    chat_template = "chatml"  # no enable_thinking switch: the builder asks for <think> in words
    all_special_tokens = list(_SPECIALS)
    added_tokens_decoder: dict[int, Any] = {}

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._pieces: list[str] = []

    def _id(self, piece: str) -> int:
        i = self._ids.get(piece)
        if i is None:
            i = self._ids[piece] = len(self._pieces)
            self._pieces.append(piece)
        return i

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        pieces: list[str] = []
        for part in re.split(r"(<\|im_start\|>|<\|im_end\|>)", text):
            pieces.extend([part] if part in _SPECIALS else _PIECE.findall(part))
        return {"input_ids": [self._id(p) for p in pieces if p]}

    def decode(self, ids: Sequence[int], **_kwargs: Any) -> str:
        return "".join(self._pieces[i] for i in ids)

    def apply_chat_template(
        self,
        messages: list[dict[str, str]],
        add_generation_prompt: bool = True,
        tokenize: bool = False,
        **_kwargs: Any,
    ) -> str:
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


class ScriptedBackend:
    """Answers every prompt with ``respond(prompt)``; records the prompts it was given. Its
    tokenizer is a :class:`FakeTokenizer` unless one is given."""

    name = "scripted"
    model_name = "scripted"

    def __init__(self, respond: Callable[[str], str], tokenizer: Any = None) -> None:
        self._tok = FakeTokenizer() if tokenizer is None else tokenizer
        self.respond = respond
        self.prompts: list[str] = []
        self.calls = 0

    @classmethod
    def replying(cls, outputs: Sequence[str], tokenizer: Any = None) -> ScriptedBackend:
        """Answers the prompts it is sent with ``outputs``, in order, one each."""
        queue = list(outputs)
        return cls(lambda _prompt: queue.pop(0), tokenizer)

    @property
    def tokenizer(self) -> Any:
        return self._tok

    def generate(self, prompts: Sequence[str], sampling: SamplingParams) -> list[list[Generation]]:
        self.calls += 1
        self.prompts.extend(prompts)
        return [
            [Generation(self.respond(p), len(p) // 4, 8, "stop", 0.001)] * sampling.n
            for p in prompts
        ]


def reverse_ranking(prompt: str) -> str:
    """A proxy that ranks the prompt's candidates last to first: easy to tell from BM25."""
    ids = ", ".join(str(i) for i in reversed(range(n_candidates(prompt))))
    return f"<think>the newest look best</think><ranking>{ids}</ranking>"
