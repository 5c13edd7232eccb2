"""Task scores for a working LLM's answer: LoCoMo-style token F1, exact match, and (through
:mod:`memsifter.qa.judge`) an LLM judge.

Normalisation follows the LoCoMo evaluation: lowercase, drop punctuation and the articles
``a/an/the`` (and ``and``), collapse whitespace, then Porter-stem each token. Chinese text is
scored by characters (each CJK character is a token), the usual choice for Chinese QA F1 since
word segmentation would make the score depend on the segmenter.

``score_locomo`` applies LoCoMo's per-category rules (multi-hop answers are lists, open-domain
golds keep the part before ``;``, adversarial questions are right when the answer says the
information is not available).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from functools import lru_cache
from typing import TYPE_CHECKING

import Stemmer

if TYPE_CHECKING:
    from memsifter.qa.judge import LLMJudge

_ARTICLES = re.compile(r"\b(a|an|the|and)\b")
_PUNCT = str.maketrans("", "", string.punctuation + "，。！？；：、“”‘’（）《》【】")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
ADVERSARIAL_MARKERS = ("no information available", "not mentioned")
TASK_METRICS: tuple[str, ...] = ("f1", "em", "locomo", "judge")


@lru_cache(maxsize=1)
def _porter() -> Stemmer.Stemmer:
    return Stemmer.Stemmer("porter")


def normalize_answer(text: str) -> str:
    text = str(text).lower().replace(",", " ")
    text = text.translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def answer_tokens(text: str) -> list[str]:
    norm = normalize_answer(text)
    if _CJK.search(norm):
        # Characters for CJK, stemmed words for any Latin runs between them.
        out: list[str] = []
        for piece in re.findall(
            r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]|[^\s\u3400-\u9fff]+", norm
        ):
            out.append(piece if _CJK.match(piece) else _porter().stemWord(piece))
        return out
    return _porter().stemWords(norm.split())


def token_f1(prediction: str, gold: str) -> float:
    pred, ref = answer_tokens(prediction), answer_tokens(gold)
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, gold: str) -> float:
    return float(answer_tokens(prediction) == answer_tokens(gold))


def multi_answer_f1(prediction: str, gold: str) -> float:
    """Each comma-separated gold part is matched by its best predicted part; the mean is taken."""
    preds = [p for p in str(prediction).split(",") if p.strip()] or [""]
    golds = [g for g in str(gold).split(",") if g.strip()] or [""]
    return sum(max(token_f1(p, g) for p in preds) for g in golds) / len(golds)


def score_locomo(prediction: str, gold: str, category: str | None) -> float:
    if category == "5":
        low = prediction.lower()
        return float(any(m in low for m in ADVERSARIAL_MARKERS))
    if category == "1":
        return multi_answer_f1(prediction, gold)
    if category == "3":
        gold = str(gold).split(";")[0]
    return token_f1(prediction, gold)


def task_score(
    prediction: str,
    gold: str,
    metric: str = "f1",
    category: str | None = None,
    *,
    question: str | None = None,
    judge: LLMJudge | None = None,
) -> float:
    """The one entry point the eval and the reward service call; ``metric`` comes from config.

    ``judge`` needs the ``question`` and an :class:`~memsifter.qa.judge.LLMJudge`; it raises
    :class:`~memsifter.qa.judge.JudgeError` on a reply that is not a verdict. Scoring many answers
    at once is cheaper through ``LLMJudge.judge_many`` (one batch, one round of requests)."""
    if metric == "f1":
        return token_f1(prediction, gold)
    if metric == "em":
        return exact_match(prediction, gold)
    if metric == "locomo":
        return score_locomo(prediction, gold, category)
    if metric == "judge":
        if judge is None or question is None:
            raise ValueError("metric 'judge' needs question= and judge= (an LLMJudge)")
        return judge.score(question, str(gold), prediction)
    raise ValueError(f"unknown task metric {metric!r}; use one of {', '.join(TASK_METRICS)}")
