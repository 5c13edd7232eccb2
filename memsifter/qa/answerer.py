"""The working-LLM answerer: given a question and the sessions a retriever chose, answer inside
``<answer>…</answer>``.

Its prompt is a pure function of (question, question date, the ranked sessions): the reward
service keys its cache on a hash of exactly this text, so nothing random or time-dependent may
enter it. Which sessions fit the window is decided by rank (the lowest-ranked are dropped first);
how the kept ones are shown is ``memory_order``: ``rank`` (best first) or ``chronological``
(oldest first, as a chat history reads). Each is shown with its date.

Reasoning models answer directly: a chat template with Qwen3's ``enable_thinking`` switch is
rendered with it off (a Qwen3 working LLM would otherwise spend its few answer tokens inside
``<think>`` and never reach ``<answer>``), and any ``<think>…</think>`` a model writes anyway is
dropped before the answer is read; an unclosed ``<think>`` means no answer came.

``style`` picks the prompt: ``ours`` (above) or ``locomo``, LoCoMo's published prompting
(:mod:`memsifter.qa.locomo`: its instruction, its session layout, no question date, the whole
reply as the answer), for numbers that sit next to the LoCoMo paper's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from memsifter.data.types import Session
from memsifter.llm import Backend, SamplingParams
from memsifter.qa.locomo import LocomoQuestion, build_locomo_messages, locomo_reply

SYSTEM = (
    "You answer questions about a user's past conversations. Use only the memory given. "
    "Answer briefly (a few words or a short phrase), inside <answer></answer> tags. If the memory "
    "does not contain the answer, write <answer>No information available</answer>."
)
SYSTEM_ZH = (
    "你根据用户过去的对话回答问题，只能使用给出的记忆。"
    "请简短作答，把答案写在 <answer></answer> 中。"
    "如果记忆中没有答案，请写 <answer>No information available</answer>。"
)
MEMORY_ORDERS = ("rank", "chronological")
PROMPT_STYLES = ("ours", "locomo")
_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.DOTALL | re.IGNORECASE)


def build_answer_messages(
    question: str,
    sessions: Sequence[Session],
    question_date: str | None = None,
    language: str = "en",
) -> list[dict[str, str]]:
    if sessions:
        memory = "\n\n".join(f"[Memory {i + 1}]\n{s.render()}" for i, s in enumerate(sessions))
    else:
        memory = "(no memory)"
    when = f"\nQuestion date: {question_date}" if question_date else ""
    user = f"Memory:\n{memory}\n\nQuestion: {question}{when}\nAnswer:"
    return [
        {"role": "system", "content": SYSTEM_ZH if language == "zh" else SYSTEM},
        {"role": "user", "content": user},
    ]


def without_thinking(text: str) -> str:
    """``text`` after its last ``</think>``; empty when a ``<think>`` is never closed (the
    model ran out of tokens while reasoning: it gave no answer)."""
    close = text.rfind("</think>")
    if close >= 0:
        return text[close + len("</think>") :]
    return "" if "<think>" in text else text


def chat_template_kwargs(tokenizer: Any) -> dict[str, Any]:
    """``enable_thinking=False`` for a chat template with Qwen3's switch; nothing otherwise
    (other templates would ignore it, and a prompt's text must not depend on ignored flags)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # several named templates
        template = " ".join(str(t) for t in template.values())
    return {"enable_thinking": False} if "enable_thinking" in str(template or "") else {}


def extract_answer(text: str) -> str:
    """The text inside <answer> (after any thinking); without tags, the first non-empty line
    (small models often answer plainly; scoring that line is fairer than scoring their whole
    ramble)."""
    text = without_thinking(text)
    m = _ANSWER.search(text)
    if m:
        return m.group(1).strip()
    for line in text.strip().splitlines():
        if line.strip():
            return line.strip()
    return ""


@dataclass
class Answerer:
    backend: Backend
    window_tokens: int = 8192
    max_new_tokens: int = 48
    language: str = "en"
    memory_order: str = "rank"
    style: str = "ours"  # ours | locomo (see the module docstring)
    _counts: dict[str, int] = field(default_factory=dict, repr=False)  # fingerprint -> tokens

    def __post_init__(self) -> None:
        if self.memory_order not in MEMORY_ORDERS:
            raise ValueError(
                f"memory_order must be one of {MEMORY_ORDERS}, got {self.memory_order!r}"
            )
        if self.style not in PROMPT_STYLES:
            raise ValueError(f"style must be one of {PROMPT_STYLES}, got {self.style!r}")

    def messages(
        self,
        question: str | LocomoQuestion,
        sessions: Sequence[Session],
        question_date: str | None = None,
    ) -> list[dict[str, str]]:
        """The chat for ``sessions`` in the order shown. ``locomo`` takes the question as
        :func:`memsifter.qa.locomo.locomo_question` phrases it and shows no question date."""
        if self.style == "locomo":
            if not isinstance(question, LocomoQuestion):
                raise TypeError("style 'locomo' needs a LocomoQuestion (see locomo_question)")
            return build_locomo_messages(question, sessions)
        if isinstance(question, LocomoQuestion):
            raise TypeError("a LocomoQuestion needs style='locomo'")
        return build_answer_messages(question, sessions, question_date, self.language)

    def _count(self, text: str) -> int:
        return len(self.backend.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _session_tokens(self, s: Session) -> int:
        # Rendering a group's tier prompts tokenizes the same sessions again and again.
        key = s.fingerprint
        if key not in self._counts:
            self._counts[key] = self._count(s.render())
        return self._counts[key]

    def render(
        self,
        question: str | LocomoQuestion,
        sessions: Sequence[Session],
        question_date: str | None = None,
        times: Sequence[int] | None = None,
    ) -> str:
        """The exact prompt text for ``sessions`` in rank order (best first). Sessions that
        overflow the window are dropped from the end (the lowest-ranked first) so the best
        evidence always fits. ``times`` are sort keys in time order, one per session (e.g.
        positions in a chronological candidate list); ``chronological`` needs them."""
        chronological = self.memory_order == "chronological"
        if chronological and (times is None or len(times) != len(sessions)):
            raise ValueError(
                "memory_order='chronological' needs one time key per session "
                f"({len(sessions)} sessions, {None if times is None else len(times)} keys)"
            )

        template_kwargs = chat_template_kwargs(self.backend.tokenizer)

        def render(kept: int) -> str:
            shown = range(kept)
            if chronological:
                shown = sorted(shown, key=lambda i: times[i])  # type: ignore[index]
            return self.backend.tokenizer.apply_chat_template(
                self.messages(question, [sessions[i] for i in shown], question_date),
                tokenize=False,
                add_generation_prompt=True,
                **template_kwargs,
            )

        budget = self.window_tokens - self.max_new_tokens
        # Estimate the fitting prefix from per-session counts (cached by content), then verify
        # on the exact text; the loop rarely pops more than once.
        used = self._count(render(0))
        n = 0
        for i, s in enumerate(sessions):
            used += self._count(f"[Memory {i + 1}]\n\n\n") + self._session_tokens(s)
            if used > budget:
                break
            n += 1
        text = render(n)
        while n and self._count(text) > budget:
            n -= 1
            text = render(n)
        return text

    def answer_texts(self, prompts: Sequence[str]) -> list[str]:
        gens = self.backend.generate(
            prompts, SamplingParams(max_new_tokens=self.max_new_tokens, temperature=0.0)
        )
        if self.style == "locomo":
            return [locomo_reply(without_thinking(g[0].text)) for g in gens]
        return [extract_answer(g[0].text) for g in gens]
