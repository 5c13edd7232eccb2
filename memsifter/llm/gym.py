"""The memory gym's working LLM: a deterministic careful reader behind the ordinary
:class:`~memsifter.llm.base.Backend` protocol (``kind: gym``).

The reward service, the QA eval and anything else that builds an
:class:`~memsifter.qa.answerer.Answerer` send it the same rendered prompts they send a real model;
it reads them as text. From the prompt it takes the question and each ``[Memory i]`` block (its
``Date:`` line and its turns), extracts the user's attribute statements with the gym's own
grammar (:func:`memsifter.data.gym.parse_statements`), and answers as a careful reader would:

* ``current``: the value of the latest-dated update it sees; a stale mention ("where I used to
  live") or someone else's value ("my sister lives in ...") is never taken for the user's own;
* ``earlier`` ("before X"): the value the update to X says it replaced;
* a no-memory question: its own knowledge, whatever memory it is shown;
* ``unknown`` when nothing it sees fits.

Questions of the ``read`` level (:mod:`memsifter.data.gym_read_grammar`, a grammar of its own
whose questions the older grammar does not read) are answered from that grammar's statements,
of which only the user's own ``first`` and ``change`` updates count (plans, hypotheticals,
denials, stale mentions and other people's changes never do): ``current`` as above but, when
no update fits, the attribute's **prior** (a popular value, so s_0 > 0 where the user's value
is that prior); ``earlier`` as above; ``when`` ("What did I work as when I moved to Lisbon?"):
the asked attribute's latest update dated before the anchor update, ``unknown`` unless both
are shown. The prior applies to read-level ``current`` questions only: on the older levels'
questions the reader answers exactly as it always did.

It never raises on odd input: a prompt it cannot read, a question outside the grammar or a
session without a readable date gives ``unknown`` (or skips the session), and each is counted in
:attr:`GymReader.stats`. It is a pure function of the prompt text, so the reward service's
sharing and caching are exact for it; it costs a regex pass per prompt.

Its tokenizer counts words and punctuation (the answerer's window is measured in those) and
renders a plain chat template, so :meth:`Answerer.render` works unchanged.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from memsifter.data.gym_grammar import (
    ASSISTANT,
    UNKNOWN,
    GymQuestion,
    Statement,
    parse_date,
    parse_question,
    parse_statements,
)
from memsifter.data.gym_read_grammar import (
    READ_BY_NAME,
    UPDATE_KINDS,
    ReadQuestion,
    ReadStatement,
    parse_read_question,
    parse_read_statements,
)
from memsifter.llm.base import Generation, SamplingParams

MODEL_NAME = "gym-reader"
_TOKEN = re.compile(r"\w+|[^\w\s]")
_USER = re.compile(r"<\|user\|>\n(.*?)\n<\|assistant\|>\n?$", re.DOTALL)
_PROMPT = re.compile(
    r"^Memory:\n(?P<memory>.*)\n\nQuestion: (?P<question>[^\n]*)"
    r"(?:\nQuestion date: [^\n]*)?\nAnswer:$",
    re.DOTALL,
)
_BLOCK = re.compile(r"^\[Memory \d+\]\n", re.MULTILINE)


class GymTokenizer:
    """Words and punctuation marks as tokens; a ChatML-like template without thinking."""

    chat_template = "gym: <|system|> / <|user|> / <|assistant|>"
    eos_token = "<|end|>"
    pad_token = "<|end|>"

    def __call__(self, text: str, add_special_tokens: bool = False, **_: Any) -> dict[str, Any]:
        return {"input_ids": list(range(len(_TOKEN.findall(text))))}

    def encode(self, text: str, add_special_tokens: bool = False, **_: Any) -> list[int]:
        return self(text)["input_ids"]

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, str]],
        tokenize: bool = False,
        add_generation_prompt: bool = True,
        **_: Any,
    ) -> str:
        text = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages)
        if add_generation_prompt:
            text += "<|assistant|>\n"
        if tokenize:
            return self.encode(text)  # type: ignore[return-value]
        return text


# A training step reads the same sessions in many top-k sets (64 rankings a prompt, 5 cut-offs
# each): parsing each line once cuts the reward's time by about two thirds. Both parsers are
# pure and their statements frozen, so a cached answer is the answer.
@lru_cache(maxsize=1 << 17)
def _parsed(parse: Callable[[str], list[Any]], text: str) -> tuple[Any, ...]:
    return tuple(parse(text))


@lru_cache(maxsize=1 << 14)
def _date(text: str) -> datetime | None:
    return parse_date(text)


class GymReader:
    """The careful reader (see the module docstring). ``stats`` counts calls, ``unknown``
    answers and each kind of input it could not read."""

    def __init__(self) -> None:
        self.stats: Counter[str] = Counter()

    def read(self, prompt: str) -> str:
        """The answer to one rendered answerer prompt."""
        self.stats["calls"] += 1
        user = _USER.search(prompt)
        body = user.group(1) if user else prompt
        m = _PROMPT.match(body)
        if m is None:
            self.stats["unreadable_prompts"] += 1
            return self._unknown()
        question = parse_question(m.group("question"))
        if question is None:
            read_question = parse_read_question(m.group("question"))
            if read_question is None:
                self.stats["unknown_questions"] += 1
                return self._unknown()
            read = self._dated(m.group("memory"), parse_read_statements)
            answer = self.answer_read(read_question, read)
            return answer if answer is not None else self._unknown()
        if question.kind == "none":
            return question.answer or self._unknown()
        dated = self._dated(m.group("memory"), parse_statements)
        answer = self.answer(question, dated)
        return answer if answer is not None else self._unknown()

    def _dated(self, memory: str, parse: Any) -> list[tuple[datetime, Any]]:
        """The user's own statements (``parse``'s grammar) of every memory block, dated."""
        dated: list[tuple[datetime, Any]] = []
        if memory != "(no memory)":
            for block in _BLOCK.split(memory)[1:]:
                dated += self._statements(block, parse)
        return dated

    def _unknown(self) -> str:
        self.stats["unknown_answers"] += 1
        return UNKNOWN

    def _statements(self, block: str, parse: Any) -> list[tuple[datetime, Any]]:
        lines = block.strip("\n").split("\n")
        date = _date(lines[0][len("Date: ") :]) if lines[0].startswith("Date: ") else None
        if date is None:
            self.stats["undated_sessions"] += 1
            return []  # without a date, an update cannot be placed in time: not used
        out = []
        for line in lines[1:]:
            speaker, sep, text = line.partition(": ")
            if not sep or speaker == ASSISTANT:
                continue
            out += [(date, s) for s in _parsed(parse, text) if s.subject == "self"]
        return out

    @staticmethod
    def answer_read(q: ReadQuestion, dated: list[tuple[datetime, ReadStatement]]) -> str | None:
        """A read-level answer from the user's own dated statements (module docstring)."""

        def updates(attribute: str | None) -> list[tuple[datetime, ReadStatement]]:
            mine = [(d, s) for d, s in dated if s.attribute == attribute and s.kind in UPDATE_KINDS]
            return sorted(mine, key=lambda x: x[0])

        asked = updates(q.attribute)
        target = (q.value or "").lower()
        if q.kind == "current":
            return asked[-1][1].value if asked else READ_BY_NAME[q.attribute].prior
        if q.kind == "earlier":
            for _, s in asked:
                if s.kind == "change" and s.value.lower() == target:
                    return s.prev
            to_target = [d for d, s in asked if s.value.lower() == target]
            before = [s for d, s in asked if to_target and d < to_target[0]]
            return before[-1].value if before else None
        # when: the asked attribute's value in force at the anchor update's date
        anchors = [d for d, s in updates(q.anchor) if s.value.lower() == target]
        before = [s for d, s in asked if anchors and d < anchors[0]]
        return before[-1].value if before else None

    @staticmethod
    def answer(question: GymQuestion, dated: list[tuple[datetime, Statement]]) -> str | None:
        """The answer from the user's own dated statements, or None when none fits."""
        updates = sorted(
            (
                (d, s)
                for d, s in dated
                if s.attribute == question.attribute and s.kind in ("first", "change")
            ),
            key=lambda x: x[0],
        )
        if question.kind == "current":
            return updates[-1][1].value if updates else None
        target = (question.value or "").lower()
        for _, s in updates:
            if s.kind == "change" and s.value.lower() == target:
                return s.prev
        # no change names the value it replaced: the latest update dated before the one to X
        to_target = [d for d, s in updates if s.value.lower() == target]
        if to_target:
            before = [s for d, s in updates if d < to_target[0]]
            if before:
                return before[-1].value
        return None


class GymBackend:
    """The gym reader as a backend: ``generate`` answers each prompt inside
    ``<answer>…</answer>``, the same text for every one of ``sampling.n`` samples (it is
    deterministic; the answerer asks for greedy decoding anyway)."""

    name = "gym"

    def __init__(self, model: str = MODEL_NAME) -> None:
        if model != MODEL_NAME:
            raise ValueError(f"the gym backend serves only {MODEL_NAME!r}, not {model!r}")
        self.model_name = model
        self._tokenizer = GymTokenizer()
        self.reader = GymReader()

    @property
    def tokenizer(self) -> GymTokenizer:
        return self._tokenizer

    def generate(self, prompts: Sequence[str], sampling: SamplingParams) -> list[list[Generation]]:
        t0 = time.perf_counter()
        answers = [self.reader.read(p) for p in prompts]
        latency = time.perf_counter() - t0
        out = []
        for prompt, answer in zip(prompts, answers, strict=True):
            text = f"<answer>{answer}</answer>"
            g = Generation(
                text, len(_TOKEN.findall(prompt)), len(_TOKEN.findall(text)), "stop", latency
            )
            out.append([g] * sampling.n)
        return out


__all__ = ["MODEL_NAME", "GymBackend", "GymReader", "GymTokenizer"]
