"""Build tests/fixtures/locomo_official_scores.jsonl: prediction/answer pairs made from the real
LoCoMo answers, each scored by LoCoMo's own ``eval_question_answering``.

    python scripts/make_locomo_score_fixture.py --evaluation PATH/task_eval/evaluation.py \
        --data ../shared/data/locomo/locomo10.json [--pairs 400] [--out FILE]

``--evaluation`` is ``task_eval/evaluation.py`` from snap-research/locomo, branch ``code``. That
file is executed from where it lies, never copied: its code stays out of this repository. It
imports ``bert_score`` at the top for a scorer ``eval_question_answering`` does not call on our
rows (only a row with ``"metric": "bertscore"`` reaches it), so this script registers a stand-in
``bert_score`` module whose ``score`` raises if anything ever calls it; the file's other imports
(``regex``, ``nltk``, ``numpy``) are the real packages. The official function reads a JSON file
``{"qa": [...]}``, so the pairs go through a temporary file, in one call.

The pairs perturb each sampled gold answer the ways our scorer and theirs used to disagree:
commas (deleted there), punctuation outside ``string.punctuation``, case, articles, stemming
(NLTK's Porter groups words differently from the original Porter), partial and padded answers,
empty sides, category-5 abstentions and repeated false premises, multi-hop lists with reordered,
missing and empty parts, and category-3 golds with a ``;``. The pairs are seeded; ``--pairs``
large (e.g. 30000) measures agreement on more than the committed few hundred
(``--check`` compares against ``memsifter.qa.scores.score_locomo`` and prints the agreement).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sys
import tempfile
import types
import warnings
from pathlib import Path
from typing import Any

ABSTENTIONS = (
    "Not mentioned in the conversation",
    "No information available",
    "no information available.",
    "NOT MENTIONED",
    "It is not mentioned.",
    "Nothing about that was mentioned",  # "mentioned" without "not mentioned": not an abstention
    "I don't know",
    "None",
    "",
)
# Word pairs that NLTK's Porter (with its extensions) and the original Porter stem differently,
# plus inflections both stem alike.
STEM_SWAPS = {
    "one": "on",
    "new": "news",
    "playing": "playful",
    "running": "runs",
    "painted": "painting",
    "dogs": "dog",
    "cats": "cat",
    "happily": "happy",
    "families": "family",
    "dying": "dies",
    "generously": "generous",
    "organization": "organize",
}
ODD_PUNCTUATION = ("“", "”", "‘", "’", "，", "。", "！", "—", "…", "«", "»", "¿")
UNICODE_BITS = ("café", "naïve", "x²", "e\u0301", "北京", "½", "Ｈｅｌｌｏ", "İstanbul")


def load_official(path: Path) -> types.ModuleType:
    """Execute LoCoMo's evaluation.py with a stand-in for ``bert_score`` (see the docstring)."""
    if not path.is_file():
        raise SystemExit(f"--evaluation {path} is not a file (want task_eval/evaluation.py)")

    def _no_bertscore(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("bert_score is stubbed by make_locomo_score_fixture.py; not used")

    stub = types.ModuleType("bert_score")
    stub.score = _no_bertscore  # type: ignore[attr-defined]
    sys.modules.setdefault("bert_score", stub)
    spec = importlib.util.spec_from_file_location("locomo_official_evaluation", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def real_answers(data: Path) -> list[tuple[int, Any, str]]:
    """(category, answer as stored, question) for every QA; category 5 answers are the
    adversarial answers (the released file keeps them under ``adversarial_answer``)."""
    out = []
    for sample in json.loads(data.read_text(encoding="utf-8")):
        for qa in sample["qa"]:
            cat = qa["category"]
            answer = qa["adversarial_answer"] if cat == 5 and "adversarial_answer" in qa else None
            if answer is None:
                answer = qa["answer"]
            out.append((cat, answer, qa["question"]))
    return out


def _swap_stems(text: str, rng: random.Random) -> str:
    words = text.split()
    for i, w in enumerate(words):
        low = w.lower()
        if low in STEM_SWAPS:
            words[i] = STEM_SWAPS[low]
        elif low.isalpha() and rng.random() < 0.5:
            words[i] = w + rng.choice(("s", "ing", "ed", "ly", "ness", "er"))
    return " ".join(words)


def perturb(cat: int, answer: Any, rng: random.Random, others: list[Any]) -> list[str]:
    """Candidate predictions for one gold answer; the caller samples among them."""
    gold = str(answer)
    words = gold.split()
    half = " ".join(words[: max(1, len(words) // 2)])
    cands = [
        gold,
        gold.upper(),
        gold.title(),
        gold.replace(",", ""),
        gold.replace(", ", ","),
        gold.replace(" ", ", ", 1),
        gold + ".",
        "The " + gold,
        "a " + gold + " and the rest",
        rng.choice(ODD_PUNCTUATION) + gold + rng.choice(ODD_PUNCTUATION),
        gold.replace(" ", rng.choice(ODD_PUNCTUATION), 1),
        _swap_stems(gold, rng),
        half,
        gold + " " + rng.choice(UNICODE_BITS),
        "It was " + gold + " I think",
        str(rng.choice(others)),
        "",
        " ",
        ",",
        "the",
    ]
    if cat == 1:
        parts = [p.strip() for p in gold.split(",")]
        cands += [
            ", ".join(reversed(parts)),
            ", ".join(parts[:-1]) if len(parts) > 1 else parts[0] + ",",
            ",, ".join(parts),
            " and ".join(parts),
            ", ".join(parts) + ",",
            ", ".join(_swap_stems(p, rng) for p in parts),
        ]
    if cat == 3:
        cands += [gold.split(";")[0], gold.split(";")[-1], gold.replace(";", ",")]
    if cat == 5:
        cands += list(ABSTENTIONS) + [
            f"(b) {gold}",
            f"{gold}; it is not mentioned otherwise",
            "Not Mentioned In The Conversation, but " + gold,
        ]
    return cands


def build_pairs(answers: list[tuple[int, Any, str]], n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    by_cat: dict[int, list[tuple[int, Any, str]]] = {}
    for row in answers:
        by_cat.setdefault(row[0], []).append(row)
    golds = [a for _, a, _ in answers]
    pairs: list[dict[str, Any]] = []
    seen: set[tuple[str, str, int]] = set()
    # Round-robin over categories so every category, and category 3's ';' golds, gets pairs.
    cats = sorted(by_cat)
    edge = [  # both-empty and empty-part behaviour, on top of the real answers
        (4, "", ""),
        (4, "the", "a"),
        (1, "", ""),
        (1, ",", ","),
        (1, "x,", "x"),
        (2, ",", "7 May 2023"),
        (5, "", ""),
    ]
    for cat, pred, gold in edge:
        pairs.append({"category": cat, "answer": gold, "prediction": pred})
        seen.add((pred, gold, cat))
    i = 0
    while len(pairs) < n:
        cat = cats[i % len(cats)]
        i += 1
        _, answer, _ = rng.choice(by_cat[cat])
        pred = rng.choice(perturb(cat, answer, rng, golds))
        key = (pred, str(answer), cat)
        if key in seen:
            continue
        seen.add(key)
        pairs.append({"category": cat, "answer": answer, "prediction": pred})
    return pairs


def official_scores(module: types.ModuleType, pairs: list[dict[str, Any]]) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "qa.json"
        path.write_text(json.dumps({"qa": pairs}), encoding="utf-8")
        with warnings.catch_warnings():
            # Its answer-length mean is over category-1 rows only; an empty mean just warns.
            warnings.simplefilter("ignore", RuntimeWarning)
            scores, _, _ = module.eval_question_answering(str(path), eval_key="prediction")
    return [float(s) for s in scores]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--evaluation", type=Path, required=True, help="LoCoMo evaluation.py")
    parser.add_argument("--data", type=Path, required=True, help="locomo10.json")
    parser.add_argument("--pairs", type=int, default=400)
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument(
        "--out", type=Path, default=Path("tests/fixtures/locomo_official_scores.jsonl")
    )
    parser.add_argument("--check", action="store_true", help="also compare with score_locomo")
    args = parser.parse_args()
    if not args.data.is_file():
        raise SystemExit(f"--data {args.data} is not a file (want locomo10.json)")

    module = load_official(args.evaluation)
    pairs = build_pairs(real_answers(args.data), args.pairs, args.seed)
    scores = official_scores(module, pairs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as fh:
        for pair, score in zip(pairs, scores, strict=True):
            fh.write(json.dumps({**pair, "official_score": score}, ensure_ascii=False) + "\n")
    print(f"wrote {len(pairs)} pairs to {args.out}")
    if args.check:
        from memsifter.qa.scores import score_locomo

        ours = [score_locomo(p["prediction"], p["answer"], p["category"]) for p in pairs]
        same = sum(a == b for a, b in zip(ours, scores, strict=True))
        print(f"score_locomo equals the official score on {same}/{len(pairs)} pairs")
        for p, a, b in zip(pairs, ours, scores, strict=True):
            if a != b:
                print(f"  differs: {p} ours={a} official={b}")


if __name__ == "__main__":
    main()
