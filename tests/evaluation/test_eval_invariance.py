"""The order-invariance check of `memsifter eval proxy`: each prompt rendered again under seeded
permutations of its candidates, each ranker's answers mapped back to sessions. A scripted ranker
that reads the sessions keeps its choice (agreement 1, no constant label); the control, a ranker
that answers one fixed permutation, shows the habit (constant label 1, agreement near 1/n)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from memsifter.data.types import Session, Turn
from memsifter.errors import DataError, MemSifterError
from memsifter.evaluation.invariance import (
    PermutedAnswer,
    check_permutations,
    invariance,
    permutations_for,
)
from memsifter.evaluation.proxy_eval import ProxyEvalConfig, run_proxy_eval
from memsifter.ranker.checkpoint import save_spec
from memsifter.ranker.spec import PromptSpec
from memsifter.rewards.columns import sessions_to_column
from memsifter.testing.backends import FakeTokenizer, ScriptedBackend

SPEC = PromptSpec(
    model="fake-tokenizer", window_tokens=2048, completion_tokens=32, ask_think=False,
    order="coarse",
)  # fmt: skip
N = 6
_BLOCK = re.compile(r"\[Session (\d+)\]")


def test_permutations_are_seeded_by_question_and_never_the_identity() -> None:
    a = permutations_for("q1", 5, 4, seed=0)
    assert a == permutations_for("q1", 5, 4, seed=0)
    assert a != permutations_for("q2", 5, 4, seed=0)
    assert a != permutations_for("q1", 5, 4, seed=1)
    assert len(a) == 4 and all(sorted(o) == list(range(5)) and o != tuple(range(5)) for o in a)
    assert permutations_for("q1", 2, 3, seed=0) == [(1, 0)] * 3  # the only other order
    assert permutations_for("q1", 1, 3, seed=0) == []


def test_fewer_than_two_permutations_are_refused_by_name() -> None:
    check_permutations(2)
    for k in (1, 0, -3):
        with pytest.raises(MemSifterError, match=rf"--permutations {k}: .*at least 2"):
            check_permutations(k)


def test_invariance_by_hand() -> None:
    orders = [(2, 0, 1), (1, 2, 0)]
    # Session 1 first whatever the order: shown at labels 2 and 0.
    content = [PermutedAnswer(o, (1, 0, 2)) for o in orders]
    # Label 0 first whatever the order: sessions 2 and 1.
    fixed = [PermutedAnswer(o, (o[0], o[1], o[2])) for o in orders]
    assert invariance([[1, 0, 2]], [content]) == {
        "top1_agreement": 1.0,
        "constant_share": 0.0,
        "permutations": 2,
        "n": 1,
    }
    assert invariance([[0, 1, 2]], [fixed]) == {
        "top1_agreement": 0.0,
        "constant_share": 1.0,
        "permutations": 2,
        "n": 1,
    }
    # A failed parse agrees with nothing; an unpermuted question is left out.
    empty = [PermutedAnswer(o, ()) for o in orders]
    got = invariance([[1, 0, 2], [], [0]], [content, empty, []])
    assert got == {"top1_agreement": 0.5, "constant_share": 0.0, "permutations": 2, "n": 2}
    assert invariance([[0]], [[]]) is None


# --------------------------------------------------------------------------- end to end


def _sessions(q: int) -> list[Session]:
    """Six dated sessions; the one with the key fact differs per question."""
    key = (q * 5 + 1) % N
    out = []
    for i in range(N):
        fact = f"the gold key is in drawer {q}" if i == key else f"we talked about topic {i} {q}"
        out.append(
            Session(
                id=f"c{q}_s{i}",
                turns=(Turn("alice", f"hello, {fact}"), Turn("bob", "noted, thanks")),
                date_text=f"{i + 1} May 2023",
            )
        )
    return out


def _write_folder(folder: Path, with_candidates: bool = True) -> None:
    from datasets import Dataset

    from memsifter.coarse import build_filter

    builder = SPEC.builder(FakeTokenizer(), build_filter("bm25"))
    rows = []
    for q in range(8):
        question = f"where is the gold key {q}?"
        sessions = _sessions(q)
        built = builder.build(question, sessions, "9 May 2023")
        by_id = {s.id: s for s in sessions}
        gold = f"c{q}_s{(q * 5 + 1) % N}"
        row = {
            "prompt": built.text,
            "qid": f"locomo/q{q}",
            "conversation": f"c{q % 2}",
            "category": "1",
            "n_candidates": built.num_candidates,
            "coarse_order": list(built.coarse_order or range(built.num_candidates)),
            "gold_positions": [built.candidate_ids.index(gold)],
            "gold_in_prompt": 1,
            "truncated": False,
        }
        if with_candidates:
            row["question"] = question
            row["question_date"] = "9 May 2023"
            row["candidates"] = sessions_to_column([by_id[s] for s in built.candidate_ids])
        rows.append(row)
    folder.mkdir(parents=True)
    for split in ("train", "validation", "test"):
        Dataset.from_dict({k: [r[k] for r in rows] for k in rows[0]}).to_parquet(
            str(folder / f"{split}.parquet")
        )
    save_spec(SPEC, folder)


def reads(prompt: str) -> str:
    """Ranks first the session that holds the gold key, the rest by label."""
    n = len(set(_BLOCK.findall(prompt))) - 2  # the instructions name the first and last label
    parts = _BLOCK.split(prompt.split("Question")[0])
    key = next(int(parts[i]) for i in range(1, len(parts), 2) if "gold key" in parts[i + 1])
    return (
        "<ranking>" + ", ".join(map(str, [key, *(i for i in range(n) if i != key)])) + "</ranking>"
    )


def fixed(prompt: str) -> str:
    return "<ranking>0, 1, 2, 3, 4, 5</ranking>"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    data = tmp_path / "rl"
    _write_folder(data)
    for name in ("reads", "fixed"):
        save_spec(SPEC, tmp_path / name)
    return data


def _factory(tmp_path: Path, seen: dict[str, list[str]]):
    answer = {str(tmp_path / "reads"): reads, str(tmp_path / "fixed"): fixed}

    def factory(path, batch_size, threads):
        backend = ScriptedBackend(answer[path])
        seen[path] = backend.prompts
        return backend

    return factory


def test_a_content_ranker_keeps_its_choice_and_a_fixed_permutation_is_caught(
    folder: Path, tmp_path: Path
) -> None:
    seen: dict[str, list[str]] = {}
    cfg = ProxyEvalConfig(
        data=str(folder),
        out=str(tmp_path / "out"),
        models=[("reads", str(tmp_path / "reads")), ("fixed", str(tmp_path / "fixed"))],
        fuse=["fixed"],
        permutations=3,
    )
    res = run_proxy_eval(cfg, backend_factory=_factory(tmp_path, seen))
    rows = res.rows
    assert {r["order"] for r in rows.values()} == {"coarse"}

    # Every prompt asked once as the data holds it, then in 3 other orders of the same blocks.
    prompts = seen[str(tmp_path / "reads")]
    assert len(prompts) == 8 * 4
    originals = [q.prompt for q in res.data.questions]
    assert prompts[:8] == originals
    assert all(p not in originals for p in prompts[8:])
    assert sorted(prompts[8].split("\n")) != sorted(originals[0].split("\n"))  # labels moved
    assert len(prompts[8]) == len(originals[0])  # same blocks, same labels, other pairing

    assert rows["reads"]["invariance"] == {
        "top1_agreement": 1.0,
        "constant_share": 0.0,
        "permutations": 3,
        "n": 8,
    }
    assert rows["reads"]["ndcg@1"] == 1.0
    # The control answers label 0 whatever it is shown: the check must flag it.
    inv = rows["fixed"]["invariance"]
    assert inv["constant_share"] == 1.0
    assert inv["top1_agreement"] < 0.5
    # BM25 ranks the same candidates whatever their order.
    assert rows["bm25"]["invariance"]["top1_agreement"] == 1.0
    assert rows["bm25"]["invariance"]["constant_share"] < 0.5
    # Fusion with the coarse order softens the habit but is measured, not assumed.
    assert rows["fixed+bm25"]["invariance"]["n"] == 8

    js = json.loads(cfg.json_path.read_text())
    assert js["rankers"]["fixed"]["invariance"] == inv
    assert js["invariance"] == {"permutations": 3, "max_questions": None, "seed": 0}
    report = cfg.md_path.read_text()
    assert "top-1 agreement" in report and "shown in `coarse` order" in report
    assert "--permutations 3" in res.command

    # The run file keeps the permuted answers; re-scored from it, the row is the same.
    again = ProxyEvalConfig(
        data=str(folder),
        out=str(tmp_path / "again"),
        runs=[("fixed", str(Path(cfg.out) / "runs" / "fixed.jsonl"))],
        permutations=3,
    )
    res2 = run_proxy_eval(again, backend_factory=_factory(tmp_path, {}))
    assert res2.rows["fixed"]["invariance"] == inv


def test_the_check_can_be_sampled_or_skipped(folder: Path, tmp_path: Path) -> None:
    seen: dict[str, list[str]] = {}
    cfg = ProxyEvalConfig(
        data=str(folder),
        out=str(tmp_path / "out"),
        models=[("fixed", str(tmp_path / "fixed"))],
        permutations=2,
        invariance_questions=3,
    )
    res = run_proxy_eval(cfg, backend_factory=_factory(tmp_path, seen))
    assert len(seen[str(tmp_path / "fixed")]) == 8 + 3 * 2
    assert res.rows["fixed"]["invariance"]["n"] == 3
    off = ProxyEvalConfig(
        data=str(folder),
        out=str(tmp_path / "off"),
        models=[("fixed", str(tmp_path / "fixed"))],
        invariance=False,
    )
    seen.clear()
    res = run_proxy_eval(off, backend_factory=_factory(tmp_path, seen))
    assert len(seen[str(tmp_path / "fixed")]) == 8
    assert res.rows["fixed"]["invariance"] is None and res.rows["bm25"]["invariance"] is None
    assert "--no-invariance" in res.command


def test_bad_settings_and_old_folders_are_refused_before_a_model_loads(tmp_path: Path) -> None:
    old = tmp_path / "old"
    _write_folder(old, with_candidates=False)
    save_spec(SPEC, tmp_path / "fixed")
    loaded: list[str] = []

    def factory(path, batch_size, threads):
        loaded.append(path)
        return ScriptedBackend(fixed)

    models = [("fixed", str(tmp_path / "fixed"))]
    with pytest.raises(DataError, match="no candidates column.*--no-invariance"):
        run_proxy_eval(
            ProxyEvalConfig(data=str(old), out=str(tmp_path / "o"), models=models),
            backend_factory=factory,
        )
    with pytest.raises(MemSifterError, match="--permutations 1"):
        run_proxy_eval(
            ProxyEvalConfig(data=str(old), out=str(tmp_path / "o"), models=models, permutations=1),
            backend_factory=factory,
        )
    assert loaded == []
    # Without the check the old folder still evaluates.
    res = run_proxy_eval(
        ProxyEvalConfig(data=str(old), out=str(tmp_path / "o"), models=models, invariance=False),
        backend_factory=factory,
    )
    assert res.rows["fixed"]["n"] == 8


def test_a_model_that_renders_the_prompt_differently_is_refused(
    folder: Path, tmp_path: Path
) -> None:
    class Other(FakeTokenizer):
        def apply_chat_template(self, messages, **kw) -> str:
            return "SYSTEM\n" + super().apply_chat_template(messages, **kw)

    def factory(path, batch_size, threads):
        return ScriptedBackend(fixed, tokenizer=Other())

    cfg = ProxyEvalConfig(
        data=str(folder), out=str(tmp_path / "o"), models=[("fixed", str(tmp_path / "fixed"))]
    )
    with pytest.raises(MemSifterError, match="renders differently from its row's prompt"):
        run_proxy_eval(cfg, backend_factory=factory)
