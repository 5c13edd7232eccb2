"""The LLM-judge task score: a working LLM's answer is right (1) or wrong (0) by a judge model.

Token F1 undervalues correct paraphrases and long-form answers (LongMemEval's questions above
all), so a dataset can choose this score instead (``task_score(..., metric="judge")``, or
``task_metrics`` in the reward config). The judge is any backend, in practice an
OpenAI-compatible server (:class:`memsifter.ranker.backends.openai_http.OpenAIBackend`), and it
decodes greedily so the same answer always gets the same verdict.

The rubric asks for a single word, ``yes`` or ``no``. Anything else is a :class:`JudgeError`, never
a silent 0: a judge that stops following the format would otherwise read as a working LLM that
stopped answering, and the proxy would be trained on it. A leading ``<think>…</think>`` (reasoning
models) is skipped, and case, surrounding whitespace, markdown emphasis and a final full stop are
forgiven; nothing else is.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from memsifter.errors import MemSifterError
from memsifter.ranker.backends.base import Backend, SamplingConfig

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


def parse_verdict(text: str) -> float:
    """1.0 for ``yes``, 0.0 for ``no``; :class:`JudgeError` for anything else."""
    close = text.rfind("</think>")
    reply = text[close + len("</think>") :] if close >= 0 else text
    match = _VERDICT.fullmatch(reply)
    if match is None:
        raise JudgeError(f"judge reply is not 'yes' or 'no': {text[:200]!r}")
    return 1.0 if match.group(1).lower() == "yes" else 0.0


@dataclass
class LLMJudge:
    """Greedy yes/no judge. ``judge_many`` sends one batch (concurrent requests over HTTP) and
    caches verdicts by the hash of the exact judge prompt, so a repeated answer costs nothing."""

    backend: Backend
    max_new_tokens: int = 16
    cache_size: int = 200_000
    calls: int = 0
    _cache: OrderedDict[str, float] = field(default_factory=OrderedDict, repr=False)

    def render(self, question: str, gold: str, prediction: str) -> str:
        return self.backend.tokenizer.apply_chat_template(
            build_judge_messages(question, str(gold), prediction),
            tokenize=False,
            add_generation_prompt=True,
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
                SamplingConfig(max_new_tokens=self.max_new_tokens, temperature=0.0),
            )
            self.calls += len(todo)
            # Parse everything before caching anything, so one bad reply cannot leave half a
            # batch cached and the error unreproducible.
            verdicts = [parse_verdict(g[0].text) for g in gens]
            known.update(zip(todo, verdicts, strict=True))
            self._cache.update(zip(todo, verdicts, strict=True))
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return [known[k] for k in keys]

    def score(self, question: str, gold: str, prediction: str) -> float:
        return self.judge_many([(question, gold, prediction)])[0]
