"""The LLM-judge task score: a working LLM's answer is right (1) or wrong (0) by a judge model.

Token F1 undervalues correct paraphrases and long-form answers (LongMemEval's questions above
all), so a dataset can choose this score instead (``task_score(..., metric="judge")``, or
``task_metrics`` in the reward config). The judge is any backend, in practice an
OpenAI-compatible server (:class:`memsifter.llm.openai_http.OpenAIBackend`), and it
decodes greedily so the same answer always gets the same verdict.

A judge follows a :class:`Rubric` (its prompt and the parser of its verdict):

* ``memsifter`` (the default, the reward's judge): a strict rubric that asks for a single word,
  ``yes`` or ``no``. Case, surrounding whitespace, markdown emphasis and a final full stop are
  forgiven; nothing else is.
* ``mem0``: the LLM-as-a-judge prompt of the Mem0 paper (Chhikara et al., 2025, "Mem0: Building
  Production-Ready AI Agents with Scalable Long-Term Memory", arXiv:2504.19413), verbatim from
  ``evaluation/metrics/llm_judge.py`` of mem0ai/mem0 (Apache-2.0). Its score J is what Mem0,
  Zep, LangMem and later LoCoMo papers report: generous on paraphrase and date format, asked of
  categories 1-4 only. The reply is JSON ``{"label": "CORRECT" | "WRONG"}``, optionally after a
  one-sentence reason or inside a code fence; without JSON, a reply that names exactly one of the
  two labels is read as that label.

A reply that is not a verdict is a :class:`JudgeError`, never a silent 0: a judge that stops
following the format would otherwise read as a working LLM that stopped answering, and the proxy
would be trained on it. A leading ``<think>…</think>`` (reasoning models) is skipped.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from memsifter.errors import MemSifterError
from memsifter.llm import Backend, SamplingParams
from memsifter.qa.answerer import chat_template_kwargs

JUDGE_SYSTEM = (
    "You grade answers to questions about a user's past conversations. You compare a response "
    "with the gold answer and reply with exactly one word: yes or no."
)
JUDGE_USER = (
    "Question: {question}\n"
    "Gold answer: {gold}\n"
    "Response: {prediction}\n\n"
    "Is the response correct? Rules:\n"
    "- yes if it states the same fact as the gold answer, even in other words, in another "
    "language, or with extra detail that does not contradict it;\n"
    "- dates, times, numbers and names must match the gold answer (a relative date counts only "
    "if it clearly refers to the same date);\n"
    "- no if it is wrong, contradicts the gold answer, misses its key point, hedges between "
    "options, or says the information is not available while the gold answer gives it;\n"
    "- if the gold answer says the information is not available, yes only if the response says "
    "so too.\n\n"
    "Reply with exactly one word, yes or no."
)
_VERDICT = re.compile(r"[*_`\"'\s]*(yes|no)[*_`\"'\s]*\.?[*_`\"'\s]*", re.IGNORECASE)


class JudgeError(MemSifterError):
    """The judge's reply is not a verdict."""


def build_judge_messages(question: str, gold: str, prediction: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": JUDGE_SYSTEM},
        {
            "role": "user",
            "content": JUDGE_USER.format(question=question, gold=gold, prediction=prediction),
        },
    ]


def _after_think(text: str) -> str:
    close = text.rfind("</think>")
    return text[close + len("</think>") :] if close >= 0 else text


def parse_verdict(text: str) -> float:
    """1.0 for ``yes``, 0.0 for ``no``; :class:`JudgeError` for anything else."""
    match = _VERDICT.fullmatch(_after_think(text))
    if match is None:
        raise JudgeError(f"judge reply is not 'yes' or 'no': {text[:200]!r}")
    return 1.0 if match.group(1).lower() == "yes" else 0.0


# The Mem0 paper's judge prompt, verbatim (see the module docstring); its typographic quotes and
# trailing spaces are theirs and stay, so a J measured here used the same prompt text.
MEM0_JUDGE_PROMPT = """
Your task is to label an answer to a question as ’CORRECT’ or ’WRONG’. You will be given the following data:
    (1) a question (posed by one user to another user), 
    (2) a ’gold’ (ground truth) answer, 
    (3) a generated answer
which you will score as CORRECT/WRONG.

The point of the question is to ask about something one user should know about the other user based on their prior conversations.
The gold answer will usually be a concise and short answer that includes the referenced topic, for example:
Question: Do you remember what I got the last time I went to Hawaii?
Gold answer: A shell necklace
The generated answer might be much longer, but you should be generous with your grading - as long as it touches on the same topic as the gold answer, it should be counted as CORRECT. 

For time related questions, the gold answer will be a specific date, month, year, etc. The generated answer might be much longer or use relative time references (like "last Tuesday" or "next month"), but you should be generous with your grading - as long as it refers to the same date or time period as the gold answer, it should be counted as CORRECT. Even if the format differs (e.g., "May 7th" vs "7 May"), consider it CORRECT if it's the same date.

Now it's time for the real question:
Question: {question}
Gold answer: {gold_answer}
Generated answer: {generated_answer}

First, provide a short (one sentence) explanation of your reasoning, then finish with CORRECT or WRONG. 
Do NOT include both CORRECT and WRONG in your response, or it will break the evaluation script.

Just return the label CORRECT or WRONG in a json format with the key as "label".
"""  # noqa: E501
_JSON_OBJECT = re.compile(r"\{[^{}]*\}")
_LABEL = re.compile(r"\b(CORRECT|WRONG)\b")


def parse_mem0_label(text: str) -> float:
    """1.0 for ``CORRECT``, 0.0 for ``WRONG`` (see the module docstring); else JudgeError."""
    reply = _after_think(text)
    for candidate in reversed(_JSON_OBJECT.findall(reply)):
        try:
            obj = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        label = obj.get("label") if isinstance(obj, dict) else None
        if isinstance(label, str) and label.strip().upper() in ("CORRECT", "WRONG"):
            return 1.0 if label.strip().upper() == "CORRECT" else 0.0
    named = set(_LABEL.findall(reply))
    if len(named) == 1:
        return 1.0 if named == {"CORRECT"} else 0.0
    raise JudgeError(f"judge reply has no CORRECT/WRONG label: {text[:200]!r}")


def _memsifter_messages(question: str, gold: str, prediction: str) -> list[dict[str, str]]:
    return build_judge_messages(question, gold, prediction)


def _mem0_messages(question: str, gold: str, prediction: str) -> list[dict[str, str]]:
    # One user turn and no system prompt, as Mem0 sends it.
    text = MEM0_JUDGE_PROMPT.format(
        question=question, gold_answer=gold, generated_answer=prediction
    )
    return [{"role": "user", "content": text}]


@dataclass(frozen=True)
class Rubric:
    """A judge's prompt and the parser of its reply. ``max_new_tokens`` is what its reply needs
    (Mem0's asks for a reason before the label)."""

    name: str
    messages: Callable[[str, str, str], list[dict[str, str]]]
    parse: Callable[[str], float]
    max_new_tokens: int
    source: str


RUBRICS: dict[str, Rubric] = {
    "memsifter": Rubric(
        "memsifter", _memsifter_messages, parse_verdict, 16, "memsifter/qa/judge.py (yes/no)"
    ),
    "mem0": Rubric(
        "mem0",
        _mem0_messages,
        parse_mem0_label,
        256,
        "Mem0 paper's LLM-as-a-judge (arXiv:2504.19413), "
        "mem0ai/mem0 evaluation/metrics/llm_judge.py",
    ),
}


def get_rubric(name: str) -> Rubric:
    if name not in RUBRICS:
        raise ValueError(f"unknown judge rubric {name!r}; choose one of {', '.join(RUBRICS)}")
    return RUBRICS[name]


@dataclass
class LLMJudge:
    """Greedy yes/no judge. ``judge_many`` sends one batch (concurrent requests over HTTP) and
    caches verdicts by the hash of the exact judge prompt, so a repeated answer costs nothing."""

    backend: Backend
    max_new_tokens: int = 16
    cache_size: int = 200_000
    calls: int = 0
    rubric: Rubric = field(default_factory=lambda: RUBRICS["memsifter"])
    _cache: OrderedDict[str, float] = field(default_factory=OrderedDict, repr=False)

    def render(self, question: str, gold: str, prediction: str) -> str:
        # Thinking off for a Qwen3 judge: a verdict needs a few tokens, a <think> block hundreds.
        return self.backend.tokenizer.apply_chat_template(
            self.rubric.messages(question, str(gold), prediction),
            tokenize=False,
            add_generation_prompt=True,
            **chat_template_kwargs(self.backend.tokenizer),
        )

    def judge_many(self, items: Sequence[tuple[str, str, str]]) -> list[float]:
        """Verdicts for ``(question, gold, prediction)`` triples, in order."""
        prompts = [self.render(q, g, p) for q, g, p in items]
        keys = [hashlib.sha256(p.encode("utf-8")).hexdigest() for p in prompts]
        known = {k: self._cache[k] for k in keys if k in self._cache}
        for key in known:
            self._cache.move_to_end(key)
        todo: dict[str, str] = {}
        for key, prompt in zip(keys, prompts, strict=True):
            if key not in known:
                todo.setdefault(key, prompt)
        if todo:
            gens = self.backend.generate(
                list(todo.values()),
                SamplingParams(max_new_tokens=self.max_new_tokens, temperature=0.0),
            )
            self.calls += len(todo)
            # Parse everything before caching anything, so one bad reply cannot leave half a
            # batch cached and the error unreproducible.
            verdicts = [self.rubric.parse(g[0].text) for g in gens]
            known.update(zip(todo, verdicts, strict=True))
            self._cache.update(zip(todo, verdicts, strict=True))
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return [known[k] for k in keys]

    def score(self, question: str, gold: str, prediction: str) -> float:
        return self.judge_many([(question, gold, prediction)])[0]
