"""The LLM-judge task score: a strict yes/no verdict (anything else raises, never a silent 0),
cached by prompt, reachable through task_score, and sent through the OpenAI-compatible backend."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from memsifter.llm.openai_http import OpenAIBackend
from memsifter.qa.judge import JudgeError, LLMJudge, parse_verdict
from memsifter.qa.scores import task_score


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ("yes", 1.0),
        ("Yes.", 1.0),
        (" **NO** \n", 0.0),
        ("no", 0.0),
        ("<think>the dates match</think>\nyes", 1.0),
    ],
)
def test_parse_verdict(text: str, verdict: float) -> None:
    assert parse_verdict(text) == verdict


@pytest.mark.parametrize("text", ["", "maybe", "yes, mostly", "Yes and no", "The answer is yes"])
def test_parse_verdict_refuses(text: str) -> None:
    with pytest.raises(JudgeError):
        parse_verdict(text)


def test_judge_over_http(tiny_qwen3: Path) -> None:
    bodies: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        text = "yes" if "Response: Lisbon" in body["prompt"] else "no"
        return httpx.Response(200, json={"choices": [{"index": 0, "text": text}]})

    backend = OpenAIBackend(
        "http://judge:1",
        model="judge",
        tokenizer=str(tiny_qwen3),
        transport=httpx.MockTransport(handler),
    )
    judge = LLMJudge(backend, max_new_tokens=4)
    items = [("Where?", "Lisbon", "Lisbon"), ("Where?", "Lisbon", "Paris")] * 2
    assert judge.judge_many(items) == [1.0, 0.0, 1.0, 0.0]
    assert judge.calls == len(bodies) == 2  # repeated answers are judged once
    assert all(b["temperature"] == 0.0 and b["max_tokens"] == 4 for b in bodies)
    assert "Gold answer: Lisbon" in bodies[0]["prompt"]
    assert task_score("Lisbon", "Lisbon", "judge", question="Where?", judge=judge) == 1.0
    assert len(bodies) == 2  # cached
    with pytest.raises(ValueError, match="judge"):
        task_score("Lisbon", "Lisbon", "judge")
