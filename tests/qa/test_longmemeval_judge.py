"""LongMemEval's QA judge: the prompt chosen per question type (abstention over type), the
benchmark's verdict rule with non-verdicts counted, and `eval qa --dataset longmemeval` end to end
with a fake answerer and judge."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from memsifter.evaluation.qa import QAEvalConfig, run_qa_eval
from memsifter.llm import Generation, SamplingParams
from memsifter.qa import longmemeval_judge as lj
from memsifter.testing.rewards import WhitespaceTokenizer

_JUDGED = re.compile(r"(?:Correct Answer|Rubric|Explanation): (.*?)\n\nModel Response: (.*?)\n\n")


class ScriptedBackend:
    """Answers ``Pepper`` to every question; as a judge, says ``yes`` when the response equals
    the gold answer, ``I cannot tell`` (no verdict) to the response ``???``, ``no`` otherwise."""

    name = model_name = "scripted"

    def __init__(self) -> None:
        self._tok = WhitespaceTokenizer()
        self.judge_prompts: list[str] = []
        self.samplings: list[SamplingParams] = []

    @property
    def tokenizer(self) -> WhitespaceTokenizer:
        return self._tok

    def generate(self, prompts: Sequence[str], sampling: SamplingParams) -> list[list[Generation]]:
        out = []
        for p in prompts:
            if "Answer yes or no only." in p:
                self.judge_prompts.append(p)
                self.samplings.append(sampling)
                gold, response = _JUDGED.search(p).groups()  # type: ignore[union-attr]
                if response == "???":
                    text = "I cannot tell"
                else:
                    text = "Yes." if response == gold else "no"
            else:
                text = "<answer>Pepper</answer>"
            out.append([Generation(text, 1, 1, "stop", 0.0)])
        return out


def test_prompt_per_type_and_abstention() -> None:
    assert lj.rubric_key("temporal-reasoning", abstention=False) == "temporal-reasoning"
    assert lj.rubric_key("temporal-reasoning", abstention=True) == lj.ABSTENTION
    with pytest.raises(ValueError, match="no LongMemEval judge prompt for question type 'trivia'"):
        lj.rubric_key("trivia", abstention=False)
    with pytest.raises(ValueError, match="question type None"):
        lj.rubric_key(None, abstention=False)

    def text(key: str) -> str:
        (msg,) = lj.judge_messages(key, "Q?", "A", "R")
        assert msg["role"] == "user"  # one user message, no system prompt, as the benchmark
        return msg["content"]

    shared = {text(k) for k in ("single-session-user", "single-session-assistant", "multi-session")}
    assert len(shared) == 1
    assert "off-by-one" in text("temporal-reasoning") and "off-by-one" not in shared.pop()
    assert "updated answer" in text("knowledge-update")
    assert "\n\nRubric: A\n\n" in text("single-session-preference")
    assert "unanswerable" in text(lj.ABSTENTION) and "\n\nExplanation: A\n\n" in text(lj.ABSTENTION)
    assert text("multi-session").endswith(
        "Question: Q?\n\nCorrect Answer: A\n\nModel Response: R\n\n"
        "Is the model response correct? Answer yes or no only."
    )


@pytest.mark.parametrize(
    ("reply", "verdict", "neither"),
    [
        ("Yes", 1.0, False),
        ("yes, it contains the answer", 1.0, False),
        ("No.", 0.0, False),
        ("The response is not correct", 0.0, True),  # the benchmark's 0, but no verdict
        ("<think>yes? check</think>no", 0.0, False),
        ("Yes and no", 1.0, False),  # the benchmark's rule: any "yes" is correct
    ],
)
def test_verdict_rule(reply: str, verdict: float, neither: bool) -> None:
    assert lj.parse_verdict_longmemeval(reply) == verdict
    assert lj.says_neither(reply) is neither


def test_judge_batches_by_prompt_and_counts_non_verdicts() -> None:
    backend = ScriptedBackend()
    judge = lj.LongMemEvalJudge(backend)
    items = [
        lj.JudgeItem("Dog?", "Pepper", "Pepper", "single-session-user", False),
        lj.JudgeItem("Days?", "18", "20 days", "temporal-reasoning", False),
        lj.JudgeItem("Cat?", "Not mentioned", "???", "single-session-user", True),
        lj.JudgeItem("Dog?", "Pepper", "Pepper", "single-session-user", False),  # cached
    ]
    assert judge.judge_many(items) == [1.0, 0.0, 0.0, 1.0]
    assert judge.without_verdict == 1
    assert len(backend.judge_prompts) == 3
    assert all(s.max_new_tokens == 10 and s.greedy for s in backend.samplings)
    assert "off-by-one" in backend.judge_prompts[1]
    assert "identifies the question as unanswerable" in backend.judge_prompts[2]


def test_eval_qa_longmemeval_judged(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, longmemeval_mini_path: Path
) -> None:
    backend = ScriptedBackend()
    monkeypatch.setattr("memsifter.llm.build_backend", lambda *a, **k: backend)
    m = run_qa_eval(
        QAEvalConfig(
            dataset="longmemeval",
            data=str(longmemeval_mini_path),
            retriever="bm25",
            top_k=2,
            judge_model=lj.OFFLINE_JUDGE,
            judge_backend="transformers",
            out=str(tmp_path),
        )
    )
    j = m["longmemeval"]
    # Every question is judged, the abstention one with the abstention prompt.
    assert j["n"] == 6 and len(backend.judge_prompts) == 6
    assert sum("unanswerable" in p for p in backend.judge_prompts) == 1
    assert j["by_type"][lj.ABSTENTION]["n"] == 1
    # Only the question whose gold is Pepper is right.
    assert j["accuracy"] == pytest.approx(1 / 6)
    assert j["by_type"]["single-session-user"] == {"accuracy": 0.5, "n": 2}
    assert j["pipeline_check"] is True and j["judge_model"] == lj.OFFLINE_JUDGE
    rows = [json.loads(line) for line in (tmp_path / "predictions.jsonl").open()]
    assert [r["judge"] for r in rows] == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["longmemeval"]["n"] == 6 and saved["judge"] == pytest.approx(1 / 6)
    assert saved["judge_rubric"]["name"] == "longmemeval"
    assert "longmemeval (per question type)" in (tmp_path / "report.md").read_text()

    # Without a judge model nothing is judged (and nothing claims to be).
    n_prompts = len(backend.judge_prompts)
    m = run_qa_eval(
        QAEvalConfig(dataset="longmemeval", data=str(longmemeval_mini_path), out=str(tmp_path))
    )
    assert "longmemeval" not in m and len(backend.judge_prompts) == n_prompts


def test_cli_labels_the_offline_judge_a_pipeline_check(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, longmemeval_mini_path: Path
) -> None:
    from typer.testing import CliRunner

    from memsifter.cli import app

    backend = ScriptedBackend()
    monkeypatch.setattr("memsifter.llm.build_backend", lambda *a, **k: backend)
    args = ["eval", "qa", "--dataset", "longmemeval", "--data", str(longmemeval_mini_path)]
    args += ["--judge-model", lj.OFFLINE_JUDGE, "--judge-backend", "transformers"]
    res = CliRunner().invoke(app, [*args, "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "accuracy=0.167 (PIPELINE CHECK: offline judge, not a result)" in res.output
    res = CliRunner().invoke(app, [*args[:-1], "openai", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "--judge-base-url" in res.output
