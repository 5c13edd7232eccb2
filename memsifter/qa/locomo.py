"""LoCoMo's published QA prompting, for ``eval qa --prompt locomo``: the way the benchmark's own
runs ask (``task_eval/evaluate_gpts.py`` in snap-research/locomo, branch ``code``, one question
per call as its RAG runs do), so that an F1 measured here sits next to the LoCoMo paper's.

What differs from our own prompt (``--prompt ours``, :mod:`memsifter.qa.answerer`):

* one user turn and no system prompt: the memory, then "Based on the above context, write an
  answer in the form of a short phrase …" and ``Question: … Short answer:``; the answer is the
  whole reply, stripped (a leading ``<think>…</think>`` is dropped), not an ``<answer>`` tag;
* each session is shown as LoCoMo shows a conversation: ``DATE: …``, ``CONVERSATION:``, then
  ``<speaker> said, "<text>"`` per turn;
* category 2 (temporal) questions end with "Use DATE of CONVERSATION to answer with an
  approximate date.";
* category 5 (adversarial) is a forced choice between "Not mentioned in the conversation" and
  the adversarial answer, asked with the shorter instruction "Based on the above context, answer
  the following question.". A reply of one letter (``a``/``b``) or of three characters
  (``(a)``/``(b)``) is read as that option's text, as the official ``get_cat_5_answer`` does; any
  other reply is scored as written (lowercased and stripped, as theirs). LoCoMo's score then gives
  1 when the result says "not mentioned".

**Option order.** The official script puts the adversarial answer second or first at random
(``random.random() < 0.5``, unseeded), so a model that always picks one letter scores about half.
A fixed order would let "always (a)" score 1 on every adversarial question; an unseeded one
would make the prompt, which the answer cache keys on, change between runs. Here each question's
order is fixed by the sha256 of its id: half the questions each way, the same order every run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from memsifter.data.types import Session

NOT_MENTIONED = "Not mentioned in the conversation"
DATE_HINT = " Use DATE of CONVERSATION to answer with an approximate date."
CHOICE = " Select the correct answer: (a) {} (b) {}. "
INSTRUCTION = (
    "Based on the above context, write an answer in the form of a short phrase for the "
    "following question. Answer with exact words from the context whenever possible.\n\n"
    "Question: {} Short answer:"
)
INSTRUCTION_CHOICE = (
    "Based on the above context, answer the following question.\n\nQuestion: {} Short answer:"
)


@dataclass(frozen=True)
class LocomoQuestion:
    """A question as the official runs ask it; ``options`` only for a forced choice."""

    text: str
    options: dict[str, str] | None = None


def adversarial_first(qid: str) -> bool:
    """Whether the adversarial answer is option (a) for this question (see the docstring)."""
    return hashlib.sha256(qid.encode("utf-8")).digest()[0] % 2 == 1


def locomo_question(qid: str, question: str, category: str | None, answer: str) -> LocomoQuestion:
    """``answer`` is the dataset's gold; for category 5 that is the adversarial answer."""
    if category == "2":
        return LocomoQuestion(question + DATE_HINT)
    if category == "5":
        if adversarial_first(qid):
            options = {"a": answer, "b": NOT_MENTIONED}
        else:
            options = {"a": NOT_MENTIONED, "b": answer}
        return LocomoQuestion(question + CHOICE.format(options["a"], options["b"]), options)
    return LocomoQuestion(question)


def render_session(session: Session) -> str:
    date = session.date_text or (session.date.isoformat() if session.date else "unknown")
    turns = "".join(f'{t.speaker} said, "{t.text}"\n' for t in session.turns)
    return f"DATE: {date}\nCONVERSATION:\n{turns}"


def build_locomo_messages(
    question: LocomoQuestion, sessions: Sequence[Session]
) -> list[dict[str, str]]:
    context = "\n\n".join(render_session(s) for s in sessions)
    template = INSTRUCTION_CHOICE if question.options else INSTRUCTION
    # The official layout: the context, a blank line, then the instruction block.
    return [{"role": "user", "content": f"{context}\n\n\n{template.format(question.text)}\n"}]


def locomo_reply(text: str) -> str:
    """The reply as the official runs keep it: the whole text, stripped."""
    close = text.rfind("</think>")
    return (text[close + len("</think>") :] if close >= 0 else text).strip()


def resolve_choice(reply: str, options: dict[str, str]) -> str:
    """A forced-choice reply read as the official ``get_cat_5_answer`` reads it."""
    if set(options) != {"a", "b"}:
        raise ValueError(f"a forced choice needs options 'a' and 'b', got {sorted(options)}")
    text = reply.strip().lower()
    if len(text) == 1:
        return options["a"] if "a" in text else options["b"]
    if len(text) == 3:
        return options["a"] if "(a)" in text else options["b"]
    return text
