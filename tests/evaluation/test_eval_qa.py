"""`eval qa` end to end with an oracle answerer (answers right exactly when a gold session is in
its prompt): the retriever, top-k and scoring plumbing must turn that into the expected F1."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from memsifter.data import load_locomo
from memsifter.evaluation.qa import QAEvalConfig, run_qa_eval
from memsifter.llm import Generation, SamplingParams


class OracleBackend:
    name = "oracle"
    model_name = "oracle"

    def __init__(self, tokenizer: Any, gold: dict[str, tuple[str, list[str]]]) -> None:
        self._tok = tokenizer
        self.gold = gold  # question -> (answer, [first turn text of each gold session])

    @property
    def tokenizer(self) -> Any:
        return self._tok

    def generate(self, prompts: Sequence[str], sampling: SamplingParams) -> list[list[Generation]]:
        out = []
        for p in prompts:
            answer = "No information available"
            for question, (gold, needles) in self.gold.items():
                if f"Question: {question}" in p and any(n in p for n in needles):
                    answer = gold
            out.append([Generation(f"<answer>{answer}</answer>", 1, 1, "stop", 0.0)])
        return out


@pytest.fixture()
def oracle(monkeypatch: pytest.MonkeyPatch, tiny_qwen3: Path, locomo_mini_path: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    ds = load_locomo(locomo_mini_path)
    sessions = ds.sessions
    gold = {
        q.question: (q.answer, [sessions[g].turns[0].text for g in q.gold_session_ids])
        for q in ds.queries
        if q.has_evidence
    }
    monkeypatch.setattr("memsifter.llm.build_backend", lambda *a, **k: OracleBackend(tok, gold))
    return ds


def _run(tmp_path: Path, data: Path, retriever: str, top_k: int = 3) -> dict:
    return run_qa_eval(
        QAEvalConfig(
            data=str(data),
            retriever=retriever,
            top_k=top_k,
            include_no_evidence=False,
            out=str(tmp_path / retriever),
        )
    )


def test_retrievers_order_by_oracle_f1(oracle, tmp_path: Path, locomo_mini_path: Path) -> None:
    none = _run(tmp_path, locomo_mini_path, "none")
    bm25 = _run(tmp_path, locomo_mini_path, "bm25")
    full = _run(tmp_path, locomo_mini_path, "full")
    assert full["f1"] == 1.0  # the whole (small) history fits: every gold session is shown
    assert none["f1"] < bm25["f1"] <= full["f1"] + 1e-9
    assert none["em"] == 0.0
    rows = [json.loads(line) for line in (tmp_path / "bm25/predictions.jsonl").open()]
    assert all(len(r["retrieved"]) == 3 for r in rows)
    assert {"f1", "em", "by_category", "n_questions"} <= set(bm25)


@pytest.mark.slow
def test_eval_qa_cli_with_tiny_answerer(
    tmp_path: Path, tiny_qwen3: Path, locomo_mini_path: Path
) -> None:
    from memsifter.cli import app

    res = CliRunner().invoke(
        app,
        [
            "eval",
            "qa",
            "--data",
            str(locomo_mini_path),
            "--retriever",
            "bm25",
            "--answerer",
            str(tiny_qwen3),
            "--top-k",
            "2",
            "--max-questions",
            "3",
            "--out",
            str(tmp_path),
        ],
    )
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["n_questions"] == 3 and 0.0 <= m["f1"] <= 1.0 and 0.0 <= m["em"] <= 1.0


def test_memsifter_retriever_ranks_the_models_units(
    oracle, tmp_path: Path, tiny_qwen3: Path, locomo_mini_path: Path
) -> None:
    """The proxy's prompt comes from the model's prompt_spec.json; with unit: page the answerer
    gets the top pages. A model without a spec and no explicit settings is refused."""
    import shutil

    from memsifter.ranker.checkpoint import PromptSpecError, save_spec
    from memsifter.ranker.spec import PromptSpec

    def cfg(model: Path, **kw) -> QAEvalConfig:
        return QAEvalConfig(
            data=str(locomo_mini_path),
            retriever="memsifter",
            model=str(model),
            top_k=2,
            max_questions=2,
            include_no_evidence=False,
            out=str(tmp_path / "qa"),
            **kw,
        )

    with pytest.raises(PromptSpecError, match="has no prompt_spec.json"):
        run_qa_eval(cfg(tiny_qwen3))
    assert run_qa_eval(cfg(tiny_qwen3, coarse_budget=1500))["n_questions"] == 2
    model = tmp_path / "ckpt"
    shutil.copytree(tiny_qwen3, model)
    save_spec(PromptSpec(window_tokens=900, completion_tokens=8, unit="page"), model)
    run_qa_eval(cfg(model))
    rows = [json.loads(line) for line in (tmp_path / "qa/predictions.jsonl").open()]
    assert all(len(r["retrieved"]) == 2 and "#" in r["retrieved"][0] for r in rows)
