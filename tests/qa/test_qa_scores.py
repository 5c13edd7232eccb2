"""Answer scores: LoCoMo's own score equal to the official code on a committed fixture, its
rules by hand, and our CJK-aware F1/EM (hand-computed, Chinese by characters)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memsifter.qa.answerer import build_answer_messages, extract_answer
from memsifter.qa.scores import (
    answer_tokens,
    exact_match,
    locomo_f1,
    locomo_multi_f1,
    locomo_normalize,
    score_locomo,
    task_score,
    token_f1,
)

FIXTURE = Path(__file__).parents[1] / "fixtures" / "locomo_official_scores.jsonl"


def test_score_locomo_equals_the_official_code_on_every_fixture_pair() -> None:
    """Pairs from the real LoCoMo answers, scored by LoCoMo's task_eval/evaluation.py
    (scripts/make_locomo_score_fixture.py). Equality, not approx: theirs is the definition."""
    rows = [json.loads(line) for line in FIXTURE.open(encoding="utf-8")]
    assert len(rows) >= 300 and {r["category"] for r in rows} == {1, 2, 3, 4, 5}
    differ = [
        (r, got)
        for r in rows
        if (got := score_locomo(r["prediction"], r["answer"], r["category"])) != r["official_score"]
    ]
    assert not differ, f"{len(differ)} of {len(rows)} differ, e.g. {differ[:3]}"


def test_locomo_rules_where_ours_used_to_differ() -> None:
    # The comma is deleted, not a space: "24 August,2023" is one token there.
    assert locomo_normalize("24 August,2023") == "24 august2023"
    assert locomo_f1("24 August,2023", "24 August 2023") == pytest.approx(0.4)
    # Only string.punctuation is removed: a curly quote stays part of the word.
    assert locomo_normalize("“Lisbon”") == "“lisbon”"
    assert locomo_f1("“Lisbon”", "Lisbon") == 0.0
    # Whitespace split, no CJK characters: one token each.
    assert locomo_f1("我喜欢猫", "我喜欢狗") == 0.0
    # NLTK's Porter (with its extensions): "news" and "new" stem differently there.
    assert locomo_f1("news", "new") == 0.0 and locomo_f1("dogs", "dog") == 1.0
    # Both empty is 0 (nothing in common), and empty comma parts are kept.
    assert locomo_f1("", "") == 0.0 and score_locomo("the", "a", 4) == 0.0
    assert locomo_multi_f1("x,", "x") == 1.0
    assert locomo_multi_f1("x", "x,") == pytest.approx(0.5)
    # An int gold (a year) is read as its string; categories may be ints or strings.
    assert score_locomo("2022", 2022, 2) == score_locomo("2022", "2022", "2") == 1.0


def test_locomo_refuses_what_it_cannot_score() -> None:
    with pytest.raises(ValueError, match="LoCoMo category must be one of"):
        score_locomo("a", "a", "6")
    with pytest.raises(ValueError, match="got None"):
        task_score("a", "a", metric="locomo")
    with pytest.raises(TypeError, match="prediction must be a string"):
        score_locomo(None, "a", "4")  # type: ignore[arg-type]


def test_normalisation_articles_punctuation_stemming() -> None:
    assert answer_tokens("The dogs, and a Cat!") == ["dog", "cat"]
    assert exact_match("The dog, Max!", "max the dog") == 0.0  # order matters for EM
    assert exact_match("Max the dog.", "max the dog") == 1.0


def test_token_f1_hand_computed() -> None:
    # pred [went, run, in, park], gold [run, park, daili]: common 2 -> P 2/4, R 2/3, F1 4/7
    assert token_f1("went running in park", "running park daily") == pytest.approx(4 / 7)
    assert token_f1("", "") == 1.0 and token_f1("x", "") == 0.0
    assert token_f1("completely different", "nothing shared") == 0.0


def test_chinese_by_characters() -> None:
    assert answer_tokens("我喜欢猫") == ["我", "喜", "欢", "猫"]
    assert token_f1("我喜欢猫", "我喜欢狗") == pytest.approx(0.75)


def test_locomo_category_rules() -> None:
    assert score_locomo("Not mentioned in the conversation", "anything", "5") == 1.0
    assert score_locomo("pottery", "anything", "5") == 0.0
    assert score_locomo("pottery, painting", "painting, pottery", "1") == 1.0
    assert locomo_multi_f1("pottery", "painting, pottery") == pytest.approx(0.5)
    assert score_locomo("Paris", "Paris; or maybe Lyon", "3") == 1.0
    with pytest.raises(ValueError, match="unknown task metric"):
        task_score("a", "a", metric="bleu")


@given(st.text(max_size=40), st.text(max_size=40))
def test_f1_bounds_and_symmetry(a: str, b: str) -> None:
    f = token_f1(a, b)
    assert 0.0 <= f <= 1.0
    assert f == pytest.approx(token_f1(b, a))
    assert token_f1(a, a) == 1.0


def test_extract_answer_and_prompt_is_pure() -> None:
    assert extract_answer("<think>hm</think><answer> 7 May 2023 </answer>") == "7 May 2023"
    assert extract_answer("<answer>unterminated") == "unterminated"
    assert extract_answer("\n\nParis\nbecause...") == "Paris"
    m1 = build_answer_messages("Q?", [], "2023-01-01")
    assert m1 == build_answer_messages("Q?", [], "2023-01-01")
    assert "(no memory)" in m1[1]["content"] and "2023-01-01" in m1[1]["content"]
