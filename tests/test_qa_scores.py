"""LoCoMo-style answer scores: hand-computed F1/EM, Chinese by characters, category rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memsifter.qa.answerer import build_answer_messages, extract_answer
from memsifter.qa.scores import (
    answer_tokens,
    exact_match,
    multi_answer_f1,
    score_locomo,
    task_score,
    token_f1,
)


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
    assert multi_answer_f1("pottery", "painting, pottery") == pytest.approx(0.5)
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
