"""A Qwen3 working LLM (and judge) is prompted with thinking off, and think text never reaches
the task score. With thinking on, Qwen3 spends ``max_new_tokens: 48`` inside ``<think>`` and the
reward read the reasoning as the answer (R_ans ~ 0)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from memsifter.data.types import Session, Turn
from memsifter.llm import Generation
from memsifter.qa.answerer import Answerer, chat_template_kwargs, extract_answer, without_thinking

EMPTY_THINK = "<think>\n\n</think>\n\n"  # Qwen3's template with enable_thinking=False


class _Canned:
    """A backend with a real tokenizer that replies with fixed texts."""

    def __init__(self, tokenizer: Any, replies: list[str] | None = None) -> None:
        self.tokenizer = tokenizer
        self.replies = replies or []
        self.prompts: list[str] = []

    def generate(self, prompts: list[str], sampling: Any) -> list[list[Generation]]:
        self.prompts.extend(prompts)
        return [[Generation(r, 1, 1, "stop", 0.0)] for r in self.replies[: len(prompts)]]


@pytest.fixture(scope="module")
def qwen3_tokenizer(tiny_qwen3: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_qwen3))


def _session() -> Session:
    return Session(id="s1", turns=(Turn(speaker="user", text="I adopted a dog named Max."),))


def test_qwen3_answerer_prompt_has_thinking_off(qwen3_tokenizer: Any) -> None:
    assert chat_template_kwargs(qwen3_tokenizer) == {"enable_thinking": False}
    answerer = Answerer(_Canned(qwen3_tokenizer), window_tokens=512, max_new_tokens=8)
    prompt = answerer.render("What is my dog's name?", [_session()])
    assert prompt.endswith("<|im_start|>assistant\n" + EMPTY_THINK)


def test_a_template_without_the_switch_is_left_alone(qwen3_tokenizer: Any) -> None:
    import copy

    plain = copy.deepcopy(qwen3_tokenizer)
    plain.chat_template = plain.chat_template.replace(
        "{%- if enable_thinking is defined and enable_thinking is false %}"
        "{{- '<think>\\n\\n</think>\\n\\n' }}"
        "{%- endif %}",
        "",
    )
    assert "enable_thinking" not in plain.chat_template
    assert chat_template_kwargs(plain) == {}
    prompt = Answerer(_Canned(plain), window_tokens=512).render("Q?", [_session()])
    assert prompt.endswith("<|im_start|>assistant\n")


def test_think_text_is_stripped_before_the_answer_is_read(qwen3_tokenizer: Any) -> None:
    replies = [
        "<think>maybe <answer>Rex</answer>?</think>\n<answer>Max</answer>",
        "<think>the user adopted a dog named",  # ran out of tokens while thinking
        "<think>\n\n</think>\n\nMax",
    ]
    answerer = Answerer(_Canned(qwen3_tokenizer, replies), window_tokens=512)
    assert answerer.answer_texts(["a", "b", "c"]) == ["Max", "", "Max"]
    locomo = Answerer(_Canned(qwen3_tokenizer, replies), window_tokens=512, style="locomo")
    assert locomo.answer_texts(["a", "b", "c"]) == ["<answer>Max</answer>", "", "Max"]


def test_without_thinking() -> None:
    assert without_thinking("plain answer") == "plain answer"
    assert without_thinking("<think>a</think>b<think>c</think>d") == "d"
    assert without_thinking("<think>unfinished") == ""
    assert extract_answer("<think>x</think><answer>y</answer>") == "y"


def test_qwen3_judge_prompt_has_thinking_off(qwen3_tokenizer: Any) -> None:
    from memsifter.qa.judge import LLMJudge

    judge = LLMJudge(_Canned(qwen3_tokenizer, ["<think>\n\n</think>\n\nyes"]))
    assert judge.render("Q?", "Max", "Max").endswith(EMPTY_THINK)
    assert judge.score("Q?", "Max", "Max") == 1.0
