"""LongMemEval's QA judge: one prompt per question type, and one for abstention questions.

The benchmark (Wu et al., ICLR 2025; xiaowu0162/LongMemEval ``src/evaluation/evaluate_qa.py``,
MIT licence) asks a judge model whether a response is correct with a prompt chosen by question
type: one shared by single-session-user, single-session-assistant and multi-session; one for
temporal-reasoning that forgives off-by-one day counts; one for knowledge-update that accepts
earlier information beside the updated answer; one for single-session-preference that reads the
gold answer as a rubric; and, for every ``_abs`` question whatever its type, one that asks whether
the response identifies the question as unanswerable. The prompt texts below are the benchmark's,
verbatim (spacing included), so an accuracy measured here used its exact prompts. It sends them
as a single user message with temperature 0 and at most 10 new tokens.

**Verdict rule.** The benchmark counts a reply as correct when ``yes`` occurs anywhere in it
(case-insensitive), otherwise wrong, and so does :func:`parse_verdict_longmemeval`: scores stay
comparable with published ones. Because that rule turns any reply into a score, the replies that
say neither ``yes`` nor ``no`` are counted (``judge_replies_without_verdict``) so a judge that
stopped answering the question shows up beside its accuracy instead of reading as a 0.

Any OpenAI-compatible judge works (``--judge-backend openai --judge-base-url ...``). The offline
default, SmolLM2-135M, only proves the pipeline runs: its verdicts are not a result.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

from memsifter.llm import Backend
from memsifter.qa.judge import LLMJudge, Rubric

SOURCE = "LongMemEval src/evaluation/evaluate_qa.py (xiaowu0162/LongMemEval, MIT)"
MAX_NEW_TOKENS = 10  # the benchmark's max_tokens for the judge
ABSTENTION = "abstention"

# The benchmark's judge prompts, verbatim; {question}, {answer}, {response} fill them in order.
_GENERAL = (
    "I will give you a question, a correct answer, and a response from a model. Please answer yes "
    "if the response contains the correct answer. Otherwise, answer no. If the response is "
    "equivalent to the correct answer or contains all the intermediate steps to get the correct "
    "answer, you should also answer yes. If the response only contains a subset of the "
    "information required by the answer, answer no. \n\nQuestion: {question}\n\nCorrect Answer: "
    "{answer}\n\nModel Response: {response}\n\nIs the model response correct? Answer yes or no "
    "only."
)
_TEMPORAL = (
    "I will give you a question, a correct answer, and a response from a model. Please answer yes "
    "if the response contains the correct answer. Otherwise, answer no. If the response is "
    "equivalent to the correct answer or contains all the intermediate steps to get the correct "
    "answer, you should also answer yes. If the response only contains a subset of the "
    "information required by the answer, answer no. In addition, do not penalize off-by-one "
    "errors for the number of days. If the question asks for the number of days/weeks/months, "
    "etc., and the model makes off-by-one errors (e.g., predicting 19 days when the answer is "
    "18), the model's response is still correct. \n\nQuestion: {question}\n\nCorrect Answer: "
    "{answer}\n\nModel Response: {response}\n\nIs the model response correct? Answer yes or no "
    "only."
)
_KNOWLEDGE_UPDATE = (
    "I will give you a question, a correct answer, and a response from a model. Please answer yes "
    "if the response contains the correct answer. Otherwise, answer no. If the response contains "
    "some previous information along with an updated answer, the response should be considered "
    "as correct as long as the updated answer is the required answer.\n\nQuestion: {question}\n\n"
    "Correct Answer: {answer}\n\nModel Response: {response}\n\nIs the model response correct? "
    "Answer yes or no only."
)
_PREFERENCE = (
    "I will give you a question, a rubric for desired personalized response, and a response from "
    "a model. Please answer yes if the response satisfies the desired response. Otherwise, answer "
    "no. The model does not need to reflect all the points in the rubric. The response is "
    "correct as long as it recalls and utilizes the user's personal information correctly.\n\n"
    "Question: {question}\n\nRubric: {answer}\n\nModel Response: {response}\n\nIs the model "
    "response correct? Answer yes or no only."
)
_ABSTENTION = (
    "I will give you an unanswerable question, an explanation, and a response from a model. "
    "Please answer yes if the model correctly identifies the question as unanswerable. The model "
    "could say that the information is incomplete, or some other information is given but the "
    "asked information is not.\n\nQuestion: {question}\n\nExplanation: {answer}\n\nModel "
    "Response: {response}\n\nDoes the model correctly identify the question as unanswerable? "
    "Answer yes or no only."
)
TEMPLATES: dict[str, str] = {
    "single-session-user": _GENERAL,
    "single-session-assistant": _GENERAL,
    "multi-session": _GENERAL,
    "temporal-reasoning": _TEMPORAL,
    "knowledge-update": _KNOWLEDGE_UPDATE,
    "single-session-preference": _PREFERENCE,
    ABSTENTION: _ABSTENTION,
}
_NO = re.compile(r"\bno\b")


def rubric_key(question_type: str | None, abstention: bool) -> str:
    """Which prompt judges a question: ``abstention`` for every ``_abs`` question, else its
    type. An unknown type is an error (the benchmark has no prompt for it)."""
    if abstention:
        return ABSTENTION
    if question_type not in TEMPLATES or question_type == ABSTENTION:
        known = ", ".join(k for k in TEMPLATES if k != ABSTENTION)
        raise ValueError(
            f"no LongMemEval judge prompt for question type {question_type!r}; {known}"
        )
    return question_type


def judge_messages(key: str, question: str, answer: str, response: str) -> list[dict[str, str]]:
    """The benchmark's judge request for one answer: a single user message."""
    text = TEMPLATES[key].format(question=question, answer=answer, response=response)
    return [{"role": "user", "content": text}]


def _reply(text: str) -> str:
    close = text.rfind("</think>")  # reasoning judges: only the final reply counts
    return (text[close + len("</think>") :] if close >= 0 else text).lower()


def parse_verdict_longmemeval(text: str) -> float:
    """The benchmark's rule: 1.0 when ``yes`` occurs in the reply, else 0.0."""
    return 1.0 if "yes" in _reply(text) else 0.0


def says_neither(text: str) -> bool:
    """The reply contains neither ``yes`` nor the word ``no``: scored 0 by the benchmark's rule,
    but not a verdict."""
    reply = _reply(text)
    return "yes" not in reply and _NO.search(reply) is None


@dataclass(frozen=True)
class JudgeItem:
    question: str
    answer: str
    response: str
    question_type: str | None
    abstention: bool


@dataclass
class LongMemEvalJudge:
    """The benchmark's judge over any backend: one :class:`LLMJudge` (greedy, cached by prompt)
    per prompt. ``without_verdict`` counts the replies that said neither yes nor no."""

    backend: Backend
    without_verdict: int = 0
    _judges: dict[str, LLMJudge] = field(default_factory=dict, repr=False)

    def _parse(self, text: str) -> float:
        self.without_verdict += says_neither(text)
        return parse_verdict_longmemeval(text)

    def _judge(self, key: str) -> LLMJudge:
        if key not in self._judges:
            rubric = Rubric(
                name=f"longmemeval:{key}",
                messages=partial(judge_messages, key),
                parse=self._parse,
                max_new_tokens=MAX_NEW_TOKENS,
                source=SOURCE,
            )
            self._judges[key] = LLMJudge(self.backend, max_new_tokens=MAX_NEW_TOKENS, rubric=rubric)
        return self._judges[key]

    def judge_many(self, items: Sequence[JudgeItem]) -> list[float]:
        """Verdicts in order; each prompt's questions go to the backend as one batch."""
        groups: dict[str, list[int]] = defaultdict(list)
        for i, it in enumerate(items):
            groups[rubric_key(it.question_type, it.abstention)].append(i)
        out = [0.0] * len(items)
        for key, idx in groups.items():
            verdicts = self._judge(key).judge_many(
                [(items[i].question, items[i].answer, items[i].response) for i in idx]
            )
            for i, v in zip(idx, verdicts, strict=True):
                out[i] = v
        return out


def accuracy_report(
    items: Sequence[JudgeItem], verdicts: Sequence[float], *, pipeline_check: bool
) -> dict[str, object]:
    """Accuracy overall and per question type (abstention questions also on their own line, as
    the benchmark's type label keeps them inside their type)."""
    by_type: dict[str, list[float]] = defaultdict(list)
    for it, v in zip(items, verdicts, strict=True):
        by_type[it.question_type or "none"].append(v)
        if it.abstention:
            by_type[ABSTENTION].append(v)
    n = max(len(verdicts), 1)
    return {
        "accuracy": sum(verdicts) / n,
        "n": len(verdicts),
        "by_type": {
            t: {"accuracy": sum(v) / len(v), "n": len(v)} for t, v in sorted(by_type.items())
        },
        "judge_prompts": SOURCE,
        # SmolLM2 offline proves the pipeline runs; its verdicts are no measurement.
        "pipeline_check": pipeline_check,
    }


OFFLINE_JUDGE = "smollm2-135m-instruct"


def judge_qa_rows(
    rows: list[dict[str, object]],
    abstention: Sequence[bool],
    judge: LongMemEvalJudge,
    *,
    pipeline_check: bool,
) -> dict[str, object]:
    """Judge ``eval qa``'s prediction rows (``question``, ``gold``, ``prediction``,
    ``category``) in place (``row["judge"]``) and return the accuracy report."""
    items = [
        JudgeItem(
            question=str(r["question"]),
            answer=str(r["gold"]),
            response=str(r["prediction"]),
            question_type=None if r.get("category") is None else str(r["category"]),
            abstention=abs_,
        )
        for r, abs_ in zip(rows, abstention, strict=True)
    ]
    verdicts = judge.judge_many(items)
    for r, v in zip(rows, verdicts, strict=True):
        r["judge"] = v
    report = accuracy_report(items, verdicts, pipeline_check=pipeline_check)
    report["judge_replies_without_verdict"] = judge.without_verdict
    return report
