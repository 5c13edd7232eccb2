"""Task scores for a working LLM's answer: LoCoMo's own score, a multilingual token F1, exact
match, and (through :mod:`memsifter.qa.judge`) an LLM judge.

Two F1s live here on purpose, because a published number is only comparable when it is computed
the benchmark's way, and the benchmark's way is wrong for Chinese:

* **LoCoMo's score** (``score_locomo``, ``locomo_f1``, ``locomo_multi_f1``) equals, question by
  question, ``eval_question_answering`` in ``task_eval/evaluation.py`` of snap-research/locomo
  (branch ``code``): commas deleted (so "24 August,2023" is the token ``august2023``), then
  lowercase, only ``string.punctuation`` removed, ``a/an/the/and`` removed, whitespace split, NLTK's
  ``PorterStemmer`` (its default NLTK extensions) on each token. Nothing in common scores 0, even
  when both sides are empty. Categories: 1 (multi-hop) splits both sides on commas, keeps empty
  parts, and averages over gold parts the best F1 of any predicted part; 3 (open-domain) scores
  against the gold before its first ``;``; 2 and 4 are plain F1; 5 (adversarial) is 1 when the
  answer says "no information available" or "not mentioned", else 0. ``tests/fixtures/
  locomo_official_scores.jsonl`` holds pairs scored by the official code
  (``scripts/make_locomo_score_fixture.py``) and a test requires equality on every one.
* **Our token F1** (``token_f1``, ``exact_match``) for Chinese and other non-LoCoMo data: commas
  become spaces, CJK and curly punctuation are removed too, each CJK character is a token (word
  segmentation would make the score depend on the segmenter), Latin words are Porter-stemmed with
  PyStemmer, and two empty answers agree (1.0). Never report it as LoCoMo's F1.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np
import regex
import Stemmer

if TYPE_CHECKING:
    from memsifter.qa.judge import LLMJudge

# --- LoCoMo's score ------------------------------------------------------------------------------

# The `regex` module, not `re`, because LoCoMo's code uses it and the two disagree on what a word
# character is (combining marks, superscript digits: ~30K code points), which moves \b.
_LOCOMO_ARTICLES = regex.compile(r"\b(a|an|the|and)\b")
_LOCOMO_PUNCT = str.maketrans("", "", string.punctuation)
LOCOMO_CATEGORIES = ("1", "2", "3", "4", "5")
ADVERSARIAL_MARKERS = ("no information available", "not mentioned")


@lru_cache(maxsize=1)
def _nltk_porter() -> Any:
    # Built on first use: importing nltk pulls in scipy and scikit-learn (~1.4 s), which every
    # command that only reads a reward or data config would otherwise pay at import.
    from nltk.stem import PorterStemmer

    return PorterStemmer()  # default mode: NLTK_EXTENSIONS, as LoCoMo's code uses


@lru_cache(maxsize=200_000)
def _locomo_stem(word: str) -> str:
    # NLTK's stemmer is pure Python; the reward service scores the same words over and over.
    return _nltk_porter().stem(word)


def locomo_normalize(text: str) -> str:
    """LoCoMo's ``normalize_answer``: the comma is deleted before anything else."""
    text = text.replace(",", "").lower().translate(_LOCOMO_PUNCT)
    return " ".join(_LOCOMO_ARTICLES.sub(" ", text).split())


def locomo_tokens(text: str) -> list[str]:
    return [_locomo_stem(w) for w in locomo_normalize(text).split()]


def locomo_f1(prediction: str, gold: str) -> float:
    """LoCoMo's ``f1_score``: 0 when nothing is shared, both-empty included."""
    pred, ref = locomo_tokens(prediction), locomo_tokens(gold)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return (2 * precision * recall) / (precision + recall)


def locomo_multi_f1(prediction: str, gold: str) -> float:
    """LoCoMo's multi-answer ``f1``: comma-separated parts (empty ones kept), each gold part
    matched by its best predicted part, averaged with numpy as theirs is (its pairwise sum is
    what makes a long list agree to the last bit)."""
    preds = [p.strip() for p in prediction.split(",")]
    golds = [g.strip() for g in gold.split(",")]
    return float(np.mean([max(locomo_f1(p, g) for p in preds) for g in golds]))


def _locomo_category(category: str | int | None) -> str:
    cat = str(category) if category is not None else None
    if cat not in LOCOMO_CATEGORIES:
        raise ValueError(
            f"LoCoMo category must be one of {', '.join(LOCOMO_CATEGORIES)}, got {category!r}"
        )
    return cat


def score_locomo(prediction: str, answer: str | int | float, category: str | int | None) -> float:
    """LoCoMo's per-question score (``eval_question_answering``). ``answer`` is the gold as the
    dataset stores it (an int year is read as its string, as theirs does); for category 5 it is
    not used. An unknown category is a ``ValueError``, as it is there."""
    if not isinstance(prediction, str):
        raise TypeError(f"prediction must be a string, got {type(prediction).__name__}")
    cat = _locomo_category(category)
    gold = str(answer)
    if cat == "3":
        gold = gold.split(";")[0].strip()
    if cat == "5":
        low = prediction.lower()
        return float(any(m in low for m in ADVERSARIAL_MARKERS))
    if cat == "1":
        return locomo_multi_f1(prediction, gold)
    return locomo_f1(prediction, gold)


# --- our multilingual token F1 -------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the|and)\b")
_PUNCT = str.maketrans("", "", string.punctuation + "，。！？；：、“”‘’（）《》【】")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
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
    """Our CJK-aware token F1 (Chinese by characters); not LoCoMo's, see the module docstring."""
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

    ``f1``/``em`` are our CJK-aware scores; ``locomo`` is LoCoMo's own per-category score (it
    needs the ``category``). ``judge`` needs the ``question`` and an
    :class:`~memsifter.qa.judge.LLMJudge`; it raises :class:`~memsifter.qa.judge.JudgeError` on a
    reply that is not a verdict. Scoring many answers at once is cheaper through
    ``LLMJudge.judge_many`` (one batch, one round of requests)."""
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
