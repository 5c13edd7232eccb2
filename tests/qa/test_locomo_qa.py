"""LoCoMo QA as published: the official prompting (category-5 forced choice, category-2 date
hint), the forced choice read and scored as the official runs do, the published breakdown, and
J with the Mem0 rubric (never asked of category 5)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from memsifter.data import load_locomo
from memsifter.errors import MemSifterError
from memsifter.evaluation.qa import QAEvalConfig, run_qa_eval
from memsifter.llm import BackendSpec, Generation, SamplingParams
from memsifter.qa.judge import JudgeError, LLMJudge, get_rubric, parse_mem0_label
from memsifter.qa.locomo import (
    DATE_HINT,
    NOT_MENTIONED,
    adversarial_first,
    locomo_question,
    locomo_reply,
    resolve_choice,
)


def test_official_question_forms() -> None:
    assert locomo_question("q", "When?", "2", "May").text == "When?" + DATE_HINT
    assert locomo_question("q", "Who?", "4", "Kai").text == "Who?"
    q = locomo_question("conv-1/q6", "What lens?", "5", "a 50mm lens")
    assert q.options is not None and sorted(q.options.values()) == sorted(
        [NOT_MENTIONED, "a 50mm lens"]
    )
    assert f"(a) {q.options['a']} (b) {q.options['b']}" in q.text
    # Seeded by the question id: stable across runs, and about half each way (the official
    # order is a coin flip per question; a fixed one would reward always picking one letter).
    assert q == locomo_question("conv-1/q6", "What lens?", "5", "a 50mm lens")
    firsts = [adversarial_first(f"conv-{i}/q{j}") for i in range(10) for j in range(40)]
    assert 0.4 < sum(firsts) / len(firsts) < 0.6


@pytest.mark.parametrize(
    ("reply", "chosen"),
    [
        ("a", "A"),
        (" B\n", "B"),
        ("(a)", "A"),
        ("(b)", "B"),
        ("(c)", "B"),  # three characters without "(a)": the official reading picks (b)
        ("(b) Not mentioned in the conversation", "(b) not mentioned in the conversation"),
        ("I am not sure", "i am not sure"),
    ],
)
def test_forced_choice_read_as_official(reply: str, chosen: str) -> None:
    assert resolve_choice(reply, {"a": "A", "b": "B"}) == chosen


def test_forced_choice_needs_two_options() -> None:
    with pytest.raises(ValueError, match="options 'a' and 'b'"):
        resolve_choice("a", {"a": "A"})
    assert locomo_reply("<think>hm</think>\n  7 May 2023 \n") == "7 May 2023"


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ('{"label": "CORRECT"}', 1.0),
        ('The dates match.\n```json\n{"label": "CORRECT"}\n```', 1.0),
        ('{"reasoning": "different city", "label": "WRONG"}', 0.0),
        ("<think>CORRECT? no</think>It names another city. WRONG", 0.0),
        ('{"label": "correct"}', 1.0),
    ],
)
def test_mem0_label(text: str, verdict: float) -> None:
    assert parse_mem0_label(text) == verdict


@pytest.mark.parametrize("text", ["", "yes", "CORRECT or WRONG", '{"label": "maybe"}'])
def test_mem0_label_refuses(text: str) -> None:
    with pytest.raises(JudgeError):
        parse_mem0_label(text)


class Scripted:
    """Answerer and judge in one fake backend, scripted on the prompt text."""

    def __init__(self, tokenizer: Any, gold: dict[str, str], pick: str | None) -> None:
        self._tok = tokenizer
        self.gold = gold  # question -> gold answer
        self.pick = pick  # a fixed letter for forced choices; None picks "not mentioned"
        self.prompts: list[str] = []
        self.name = self.model_name = "scripted"

    @property
    def tokenizer(self) -> Any:
        return self._tok

    def _answer(self, p: str) -> str:
        if "Select the correct answer" in p:
            if self.pick is not None:
                return self.pick
            return "(a)" if f"(a) {NOT_MENTIONED}" in p else "(b)"
        for question, gold in self.gold.items():
            if f"Question: {question}" in p:
                return gold
        return "unknown"

    def generate(self, prompts: Sequence[str], sampling: SamplingParams) -> list[list[Generation]]:
        out = []
        for p in prompts:
            self.prompts.append(p)
            if "Generated answer:" in p:  # the Mem0 judge
                # The last "Gold answer:" (the rubric's own example comes first).
                gold = p.split("Gold answer: ")[-1].split("\n")[0]
                pred = p.split("Generated answer: ")[-1].split("\n")[0]
                text = '{"label": "%s"}' % ("CORRECT" if gold == pred else "WRONG")
            else:
                text = self._answer(p)
            out.append([Generation(text, 1, 1, "stop", 0.0)])
        return out


@pytest.fixture()
def scripted(monkeypatch: pytest.MonkeyPatch, tiny_qwen3: Path, locomo_mini_path: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    gold = {q.question: q.answer for q in load_locomo(locomo_mini_path).queries}
    made: dict[str, Scripted] = {}

    def build(spec: BackendSpec) -> Scripted:
        model = spec.model
        made[model] = Scripted(tok, gold, None if model == "oracle" else model)
        return made[model]

    monkeypatch.setattr("memsifter.llm.build_backend", build)
    return made


def _cfg(tmp_path: Path, data: Path, **kw: Any) -> QAEvalConfig:
    settings: dict[str, Any] = {
        "data": str(data),
        "retriever": "full",
        "answerer": "oracle",
        "answer_prompt": "locomo",
        "out": str(tmp_path),
    }
    return QAEvalConfig(**(settings | kw))


def test_eval_qa_locomo_prompting_and_breakdown(
    scripted: dict[str, Scripted], tmp_path: Path, locomo_mini_path: Path
) -> None:
    m = run_qa_eval(
        _cfg(tmp_path, locomo_mini_path, judge_model="judge", judge_base_url="http://judge:1")
    )
    prompts = scripted["oracle"].prompts
    assert any(DATE_HINT in p for p in prompts) and any("DATE: " in p for p in prompts)
    assert not any("<answer>" in p for p in prompts)
    lo = m["locomo"]
    # The oracle answers the gold and always abstains on the forced choice.
    assert lo["f1_by_category"] == {"1": 1.0, "2": 1.0, "3": 1.0, "4": 1.0}
    assert lo["adversarial_accuracy"] == 1.0 and lo["n_by_category"]["5"] == 6
    assert lo["overall"] == lo["overall_without_adversarial"] == 1.0
    assert m["f1"] == 1.0 and m["by_category"]["5"]["f1"] is None
    assert m["by_category"]["5"]["em"] is None and m["by_category"]["5"]["locomo"] == 1.0
    # J: the Mem0 rubric, categories 1-4 only (18 questions; none of category 5 judged).
    judge_prompts = scripted["judge"].prompts
    assert len(judge_prompts) == 18
    assert all("Your task is to label an answer" in p for p in judge_prompts)
    assert lo["j_overall_without_adversarial"] == 1.0 and m["judge_rubric"]["name"] == "mem0"
    rows = [json.loads(line) for line in (tmp_path / "predictions.jsonl").open()]
    assert len(rows) == 24
    assert {"qid", "category", "prediction", "gold", "locomo", "f1", "em", "judge"} <= set(rows[0])
    adv = [r for r in rows if r["category"] == "5"]
    assert all(r["judge"] is None and r["prediction"] == NOT_MENTIONED for r in adv)
    assert all(r["reply"] in ("(a)", "(b)") and set(r["options"]) == {"a", "b"} for r in adv)
    report = (tmp_path / "report.md").read_text()
    assert "overall without 5" in report and "adversarial (accuracy)" in report


def test_always_picking_one_letter_scores_the_seeded_share(
    scripted: dict[str, Scripted], tmp_path: Path, locomo_mini_path: Path
) -> None:
    m = run_qa_eval(_cfg(tmp_path, locomo_mini_path, answerer="a"))
    adv = [q for q in load_locomo(locomo_mini_path).queries if q.category == "5"]
    # "a" is right exactly where "not mentioned" is option (a).
    expected = sum(not adversarial_first(q.qid) for q in adv) / len(adv)
    assert m["locomo"]["adversarial_accuracy"] == pytest.approx(expected)
    assert "judge" not in m and "j_by_category" not in m["locomo"]


def test_bad_settings_are_refused(tmp_path: Path, locomo_mini_path: Path) -> None:
    with pytest.raises(MemSifterError, match="answer prompt must be one of"):
        run_qa_eval(_cfg(tmp_path, locomo_mini_path, answer_prompt="paper"))
    with pytest.raises(MemSifterError, match="judge rubric must be one of"):
        run_qa_eval(_cfg(tmp_path, locomo_mini_path, judge_model="j", judge_rubric="gpt"))
    with pytest.raises(MemSifterError, match="needs --judge-base-url"):
        run_qa_eval(_cfg(tmp_path, locomo_mini_path, judge_model="j", judge_backend="openai"))


def test_judge_rubrics_are_named() -> None:
    with pytest.raises(ValueError, match="unknown judge rubric"):
        get_rubric("gpt")

    class Echo:
        tokenizer = None

    judge = LLMJudge(Echo(), rubric=get_rubric("mem0"))  # type: ignore[arg-type]
    assert judge.rubric.parse('{"label": "WRONG"}') == 0.0
    assert "arXiv:2504.19413" in judge.rubric.source


def test_cli_prompt_locomo_prints_the_breakdown(
    scripted: dict[str, Scripted], tmp_path: Path, locomo_mini_path: Path
) -> None:
    from typer.testing import CliRunner

    from memsifter.cli import app

    args = ["eval", "qa", "--data", str(locomo_mini_path), "--retriever", "full"]
    args += ["--answerer", "oracle", "--prompt", "locomo", "--out", str(tmp_path)]
    args += ["--judge-model", "judge", "--judge-base-url", "http://judge:1"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "locomo=1.000 locomo_without_5=1.000 adversarial_acc=1.000 J=1.000 (mem0)" in res.output
    assert json.loads((tmp_path / "config.json").read_text())["answer_prompt"] == "locomo"
    bad = CliRunner().invoke(app, [*args[:-4], "--dataset", "jsonl", "--out", str(tmp_path)])
    assert bad.exit_code != 0 and "--prompt locomo is LoCoMo's own prompting" in bad.output


def test_answerer_style_and_question_must_agree() -> None:
    from memsifter.qa.answerer import Answerer

    with pytest.raises(ValueError, match="style must be one of"):
        Answerer(None, style="paper")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="needs a LocomoQuestion"):
        Answerer(None, style="locomo").messages("Who?", [])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="needs style='locomo'"):
        Answerer(None).messages(locomo_question("q", "Who?", "4", "Kai"), [])  # type: ignore[arg-type]
    (msg,) = Answerer(None, style="locomo").messages(  # type: ignore[arg-type]
        locomo_question("q", "When?", "2", "May"), []
    )
    assert msg["role"] == "user" and msg["content"].rstrip().endswith("Short answer:")
