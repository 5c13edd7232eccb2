"""The proxy pipeline: prompt -> backend -> parse -> Ranking, with coarse completion, on a
scripted backend (exact control of the output) and on the tiny Qwen3 through transformers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from memsifter.coarse import BM25Filter
from memsifter.data import load_locomo
from memsifter.data.types import Session, Turn
from memsifter.ranker.proxy import Proxy, ProxyParams, RankRequest
from memsifter.ranker.spec import PromptSpec
from memsifter.testing.backends import ScriptedBackend


def _spec(window: int, completion: int, **kw: Any) -> PromptSpec:
    return PromptSpec(window_tokens=window, completion_tokens=completion, **kw)


def _sessions() -> list[Session]:
    topics = [
        "hiking in the alps",
        "adopting a dog named max",
        "pottery class with clay",
        "marathon training plan",
    ]
    return [
        Session(
            id=f"s{i}",
            turns=(Turn("A", f"I talked about {t} today."),),
            date_text=f"{i + 1} May 2023",
        )
        for i, t in enumerate(topics)
    ]


@pytest.fixture(scope="module")
def tok(tiny_qwen3: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_qwen3)


def test_clean_ranking_maps_positions_to_ids(tok: Any) -> None:
    be = ScriptedBackend.replying(["<think>dog</think><ranking>1, 3, 0, 2</ranking>"], tok)
    proxy = Proxy(be, _spec(4000, 200), BM25Filter())
    r = proxy.rank("what is my dog called?", _sessions())
    assert r.ranking.ids == ("s1", "s3", "s0", "s2")
    assert r.parsed.clean and not r.completed


def test_partial_and_failed_rankings_complete_from_coarse(tok: Any) -> None:
    be = ScriptedBackend.replying(["<think>x</think><ranking>2</ranking>", "no tags at all"], tok)
    proxy = Proxy(be, _spec(4000, 200), BM25Filter())
    partial, failed = proxy.rank_many(
        [RankRequest("pottery clay?", _sessions()), RankRequest("dog named max?", _sessions())]
    )
    assert partial.ranking.ids[0] == "s2" and partial.completed and partial.parsed.ok
    assert sorted(partial.ranking.ids) == ["s0", "s1", "s2", "s3"]
    assert not failed.parsed.ok and failed.completed
    assert failed.ranking.ids[0] == "s1"  # the coarse (BM25) order fills a failed parse
    assert failed.parsed.n_from_model == 0


def test_no_completion_when_disabled(tok: Any) -> None:
    be = ScriptedBackend.replying(["garbage"], tok)
    proxy = Proxy(be, _spec(4000, 200), BM25Filter(), ProxyParams(complete_with_coarse=False))
    r = proxy.rank("dog?", _sessions())
    assert r.ranking.ids == () and r.parsed.error is not None


def test_sessions_cut_by_coarse_are_appended_after_proxy_order(tok: Any) -> None:
    long = [
        Session(id=f"s{i}", turns=(Turn("A", f"topic{i} " * 120),), date_text="1 May 2023")
        for i in range(6)
    ]
    be = ScriptedBackend.replying(["<think>.</think><ranking>0</ranking>"], tok)
    proxy = Proxy(be, _spec(1400, 100), BM25Filter())
    r = proxy.rank("topic4 topic2", long)
    assert r.prompt.dropped_ids, "the small window must force a coarse cut"
    assert sorted(r.ranking.ids) == sorted(s.id for s in long)
    assert r.ranking.ids[-len(r.prompt.dropped_ids) :] == r.prompt.dropped_ids


@pytest.mark.slow
def test_eval_retrieval_with_tiny_proxy(
    tmp_path: Path, tiny_qwen3: Path, locomo_mini_path: Path
) -> None:
    from memsifter.cli import app

    out = tmp_path / "run"
    res = CliRunner().invoke(
        app,
        [
            "eval",
            "retrieval",
            "--data",
            str(locomo_mini_path),
            "--retriever",
            "bm25",
            "--retriever",
            "memsifter",
            "--model",
            str(tiny_qwen3),
            "--coarse-budget",
            "1500",
            "--completion-tokens",
            "24",
            "--max-questions",
            "3",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    sub = [p for p in out.iterdir() if p.name.startswith("memsifter")]
    m = json.loads((sub[0] / "metrics.json").read_text())
    assert m["n_questions"] == 3
    assert set(m["proxy"]) >= {"parse_rate", "completed_rate", "prompt_tokens_mean"}
    assert m["proxy"]["prompt_tokens_mean"] <= 1500
    assert 0.0 <= m["proxy"]["parse_rate"] <= 1.0
    assert "## Proxy" in (out / "report.md").read_text()


def test_locomo_haystack_prompt_fits(tok: Any, locomo_mini_path: Path) -> None:
    q = next(q for q in load_locomo(locomo_mini_path).queries if q.has_evidence)
    be = ScriptedBackend.replying(["<ranking>0</ranking>"], tok)
    proxy = Proxy(be, _spec(1600, 100), BM25Filter())
    r = proxy.rank(q.question, q.haystack)
    assert r.prompt.n_tokens <= 1500
    assert len(r.ranking.ids) == len(q.haystack)
