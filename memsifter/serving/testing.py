"""Stand-ins for testing the service without a model: a tokenizer with a chat template, and a
scripted proxy backend that implements ``memsifter.llm.Backend``.

``scratch_postgres`` makes a throwaway database on a PostgreSQL server, so a test module or a
benchmark run neither sees nor clobbers anyone else's tables.

``FakeTokenizer`` splits text into word, space and punctuation pieces (decoding joins them back
exactly), renders ChatML, and has ``<|im_start|>``/``<|im_end|>`` as special tokens, so the
shared prompt builder runs its real code paths (budgeting, defanging) against it.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from memsifter.llm import Generation, SamplingConfig

_PIECE = re.compile(r"\s+|\w+|[^\w\s]")
_SPECIALS = ("<|im_start|>", "<|im_end|>")


class FakeTokenizer:
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
    """Answers every prompt with ``respond(prompt)``; records the prompts it was given."""

    name = "scripted"
    model_name = "scripted"

    def __init__(self, respond: Callable[[str], str]) -> None:
        self._tok = FakeTokenizer()
        self.respond = respond
        self.prompts: list[str] = []
        self.calls = 0

    @property
    def tokenizer(self) -> Any:
        return self._tok

    def generate(self, prompts: Sequence[str], sampling: SamplingConfig) -> list[list[Generation]]:
        self.calls += 1
        self.prompts.extend(prompts)
        return [
            [Generation(self.respond(p), len(p) // 4, 8, "stop", 0.001)] * sampling.n
            for p in prompts
        ]


def reverse_ranking(prompt: str) -> str:
    """A proxy that ranks the prompt's candidates last to first: easy to tell from BM25."""
    # The instructions come before any session text, so their count cannot be spoofed.
    match = re.search(r"from \[Session 0\] to \[Session (\d+)\]", prompt)
    n = int(match.group(1)) + 1 if match else 0
    ids = ", ".join(str(i) for i in reversed(range(n)))
    return f"<think>the newest look best</think><ranking>{ids}</ranking>"


def scratch_postgres(dsn: str, prefix: str = "memsifter_test") -> tuple[str, Callable[[], None]]:
    """A new, empty database on ``dsn``'s server (``postgresql+psycopg://user@host:port/db``;
    the user may create databases): its SQLAlchemy URL and a function that drops it."""
    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    parts = urlsplit(dsn)
    admin = urlunsplit(parts._replace(scheme="postgresql"))  # psycopg's own form
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return urlunsplit(parts._replace(path=f"/{name}")), drop
