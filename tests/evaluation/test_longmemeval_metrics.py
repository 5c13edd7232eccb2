"""LongMemEval's own retrieval metrics against hand-computed cases (its DCG weighs the first two
positions alike), its labelling rules (user turns only, the relabelling of answer sessions
without a marked user turn, abstention left out), and the loader's ``.json.gz`` support."""

from __future__ import annotations

import copy
import gzip
import json
import math
from pathlib import Path

import ir_measures
import pytest
from ir_measures import R, Success

from memsifter.data import load_longmemeval
from memsifter.errors import DataError
from memsifter.evaluation import longmemeval as lme
from memsifter.evaluation.retrieval import RetrievalEvalConfig, run_retrieval_eval

LOG3 = math.log2(3)


@pytest.mark.parametrize(
    ("ranking", "relevant", "k", "expected"),
    [
        # The benchmark's quirk: a hit at position 2 weighs as much as one at position 1
        # (ir-measures would give 1/log2(3) = 0.631 here).
        (["x", "a"], {"a"}, 2, 1.0),
        (["x", "y", "a"], {"a"}, 3, 1 / LOG3),
        # DCG 1 + 0 + 1/log2(3) over the ideal 1 + 1.
        (["a", "x", "b"], {"a", "b"}, 3, (1 + 1 / LOG3) / 2),
        # Three relevant, k = 2: the ideal holds two of them (1 + 1).
        (["a", "b", "c"], {"a", "b", "c"}, 2, 1.0),
        (["x", "a", "y", "b"], {"a", "b", "c"}, 4, (1 + 1 / 2) / (1 + 1 + 1 / LOG3)),
        (["x", "y", "a"], {"a"}, 2, 0.0),
        (["a", "b"], set(), 2, 0.0),
    ],
)
def test_ndcg_any_hand_computed(ranking, relevant, k, expected) -> None:
    assert lme.ndcg_any(ranking, relevant, k) == pytest.approx(expected, abs=1e-12)


def test_dcg_first_two_positions_weigh_alike() -> None:
    assert lme.dcg([1, 1], 2) == pytest.approx(2.0)
    assert lme.dcg([0, 1], 2) == lme.dcg([1, 0], 2) == 1.0
    assert lme.dcg([0, 0, 1, 1], 4) == pytest.approx(1 / LOG3 + 1 / 2)
    assert lme.dcg([1, 1, 1], 1) == 1.0 and lme.dcg([], 5) == 0.0


def test_recall_any_and_all() -> None:
    m = lme.query_metrics(["a", "x", "b", "y"], ["a", "b"], cutoffs=(1, 2, 3))
    assert (m["recall_any@1"], m["recall_all@1"]) == (1.0, 0.0)
    assert (m["recall_any@2"], m["recall_all@2"]) == (1.0, 0.0)
    assert (m["recall_any@3"], m["recall_all@3"]) == (1.0, 1.0)
    # No relevant document: recall_all is vacuously 1, recall_any 0 (why such questions are
    # left out of the means).
    empty = lme.query_metrics(["a"], [], cutoffs=(1,))
    assert empty == {"recall_any@1": 0.0, "recall_all@1": 1.0, "ndcg_any@1": 0.0}
    with pytest.raises(TypeError, match="not one string"):
        lme.query_metrics(["a"], "a")
    with pytest.raises(ValueError, match="cutoffs must be >= 1"):
        lme.query_metrics(["a"], ["a"], cutoffs=(0,))


def _record(qid: str, sessions: dict[str, list[dict]], answers: list[str]) -> dict:
    return {
        "question_id": qid,
        "question_type": "multi-session",
        "question": "What did I buy?",
        "answer": "a kettle",
        "question_date": "2023/05/30 (Tue) 23:40",
        "haystack_session_ids": list(sessions),
        "haystack_dates": [f"2023/05/0{i + 1} (Mon) 10:00" for i in range(len(sessions))],
        "haystack_sessions": list(sessions.values()),
        "answer_session_ids": answers,
    }


def _turn(role: str, text: str, has_answer: bool | None = None) -> dict:
    t = {"role": role, "content": text}
    if has_answer is not None:
        t["has_answer"] = has_answer
    return t


@pytest.fixture
def relabel_file(tmp_path: Path) -> Path:
    sessions = {
        "filler_1": [_turn("user", "hello"), _turn("assistant", "hi")],
        # Marked user turn at position 2 (after an assistant turn): benchmark id answer_q_1_3.
        "answer_q_1": [
            _turn("user", "I need a kettle", False),
            _turn("assistant", "Which kind?", False),
            _turn("user", "I bought the steel kettle", True),
            _turn("assistant", "Nice", False),
        ],
        # Evidence only on the assistant side: relabelled as not an answer.
        "answer_q_2": [
            _turn("user", "Recommend a kettle", False),
            _turn("assistant", "The steel one", True),
        ],
    }
    recs = [
        _record("q", sessions, ["answer_q_1", "answer_q_2"]),
        _record(
            "q_only_assistant", {k: sessions[k] for k in ("filler_1", "answer_q_2")}, ["answer_q_2"]
        ),
        _record("q_abs", sessions, ["answer_q_1"]),
    ]
    path = tmp_path / "lme.json"
    path.write_text(json.dumps(recs))
    return path


def test_relabelling_and_turn_ids(relabel_file: Path) -> None:
    q, only_assistant, abstention = load_longmemeval(relabel_file).queries
    assert q.gold_session_ids == ("answer_q_1", "answer_q_2")  # our usual gold: the dataset's
    assert lme.session_targets(q) == ("answer_q_1",)  # the benchmark's, after relabelling
    assert lme.turn_targets(q) == ("answer_q_1_3",)
    assert lme.session_targets(only_assistant) == () == lme.turn_targets(only_assistant)
    assert abstention.meta["abstention"] and lme.session_targets(abstention) == ()

    turns = lme.user_turns(q)
    assert [s.id for s in turns.haystack] == [
        "filler_1_1",
        "answer_q_1_1",
        "answer_q_1_3",
        "answer_q_2_1",
    ]
    assert all(t.speaker == "user" for s in turns.haystack for t in s.turns)
    assert turns.gold_session_ids == ("answer_q_1_3",)
    users = lme.user_sessions(q)
    assert [s.id for s in users.haystack] == [s.id for s in q.haystack]
    assert [len(s.turns) for s in users.haystack] == [1, 2, 1]


def test_report_averages_every_question_as_the_benchmark_and_refuses_abstention(
    relabel_file: Path,
) -> None:
    """run_retrieval.py's means: every non-abstention question, the one whose answer session
    the relabelling turned into noans included (recall_any 0, recall_all 1, ndcg_any 0)."""
    q, only_assistant, abstention = load_longmemeval(relabel_file).queries
    rankings = {
        "q": ("filler_1", "answer_q_2", "answer_q_1"),
        "q_only_assistant": ("answer_q_2", "filler_1"),
    }
    turn_rankings = {
        "q": ("answer_q_1_1", "answer_q_1_3", "filler_1_1", "answer_q_2_1"),
        "q_only_assistant": ("answer_q_2_1", "filler_1_1"),
    }
    rep = lme.benchmark_report([q, only_assistant], rankings, turn_rankings, cutoffs=(1, 2, 3))
    assert rep["n_questions"] == 2 and rep["no_target_qids"] == ["q_only_assistant"]
    m = rep["metrics"]
    # q: its one relevant session at position 3, its one relevant turn at 2; the no-target
    # question adds recall_any 0, recall_all 1, ndcg_any 0 to each mean.
    assert m["session/recall_any@2"] == 0.0 and m["session/recall_any@3"] == 0.5
    assert m["session/recall_all@1"] == 0.5 and m["session/recall_all@3"] == 1.0
    assert m["session/ndcg_any@3"] == pytest.approx(1 / LOG3 / 2)
    assert m["turn/recall_any@1"] == 0.0 and m["turn/ndcg_any@2"] == 0.5
    # The figure over questions with a target stays apart, under its own name.
    w = rep["with_target"]
    assert w["n_questions"] == 1 and w["session/ndcg_any@3"] == pytest.approx(1 / LOG3)
    assert w["session/recall_all@1"] == 0.0 and w["turn/ndcg_any@2"] == 1.0
    assert rep["by_category"]["multi-session"]["n_no_target"] == 1
    with pytest.raises(ValueError, match="abstention"):
        lme.benchmark_report([abstention], {"q_abs": ()})
    with pytest.raises(ValueError, match="no ranking"):
        lme.benchmark_report([q], {})


def test_eval_retrieval_benchmark_metrics_rescore(
    tmp_path: Path, longmemeval_mini_path: Path
) -> None:
    """End to end on the fixture: abstention and no-target questions are left out, and the
    benchmark's recall_any / recall_all equal ir-measures' Success@k / R@k == 1 on the run and
    benchmark judgments the eval wrote."""
    cfg = RetrievalEvalConfig(
        dataset="longmemeval", data=str(longmemeval_mini_path), retrievers=["bm25"],
        out=str(tmp_path / "out"),
    )  # fmt: skip
    (res,) = run_retrieval_eval(cfg)
    m = res.metrics
    assert m["n_questions"] == 5  # the abstention question has no gold
    assert m["longmemeval"]["no_target_qids"] == ["58bf7951"]  # evidence on the assistant side
    assert m["longmemeval"]["n_scored"] == 5  # the no-target question stays in the mean
    assert m["longmemeval"]["with_target"]["n_questions"] == 4
    assert "session/recall_any@5" in m and "turn/ndcg_any@10" in m
    # A type whose only question has no target still has the benchmark's numbers for it.
    ssa = m["by_category"]["single-session-assistant"]
    assert ssa["n_no_target"] == 1
    assert ssa["session/recall_any@5"] == 0.0 and ssa["session/recall_all@5"] == 1.0
    out = tmp_path / "out"
    run = list(ir_measures.read_trec_run(str(out / "run.trec")))
    assert "gpt4_0b2f1d8c_abs" not in {r.query_id for r in run}
    for level, run_file, qrels_file in (
        ("session", "run.trec", "qrels_benchmark.txt"),
        ("turn", "run_turn.trec", "qrels_turn.txt"),
    ):
        qrels = list(ir_measures.read_trec_qrels(str(out / qrels_file)))
        assert {r.query_id for r in qrels} == {"e47becba", "2ce6a0f2", "gpt4_93f6379c", "6a1eabeb"}
        per_q = list(
            ir_measures.iter_calc(
                [Success @ 1, R @ 1], qrels, ir_measures.read_trec_run(str(out / run_file))
            )
        )
        found_any = sum(x.value for x in per_q if x.measure == Success @ 1)
        found_all = sum(x.value == 1.0 for x in per_q if x.measure == R @ 1)
        # The benchmark's means are over all 5; the no-target question adds 0 and 1.
        assert m[f"{level}/recall_any@1"] == pytest.approx(found_any / 5)
        assert m[f"{level}/recall_all@1"] == pytest.approx((found_all + 1) / 5)
        w = m["longmemeval"]["with_target"]
        assert w[f"{level}/recall_any@1"] == pytest.approx(found_any / 4)
        assert w[f"{level}/recall_all@1"] == pytest.approx(found_all / 4)
    turn_ids = {r.doc_id for r in ir_measures.read_trec_run(str(out / "run_turn.trec"))}
    assert "answer_a1f3_1_1" in turn_ids and "answer_a1f3_1_2" not in turn_ids  # user turns only


def test_loader_reads_gzip_and_names_bad_input(tmp_path: Path, longmemeval_mini_path: Path) -> None:
    gz = tmp_path / "lme.json.gz"
    gz.write_bytes(gzip.compress(longmemeval_mini_path.read_bytes()))
    plain, packed = load_longmemeval(longmemeval_mini_path), load_longmemeval(gz)
    assert [q.qid for q in packed.queries] == [q.qid for q in plain.queries]
    assert packed.queries[0].haystack == plain.queries[0].haystack
    assert packed.queries[1].meta["answer_turn_ids"] == ["answer_b7c2_1:0", "answer_b7c2_2:0"]

    bad = tmp_path / "cut.json.gz"
    bad.write_bytes(gz.read_bytes()[:100])
    with pytest.raises(DataError, match="not a complete gzip file"):
        load_longmemeval(bad)
    data = json.loads(longmemeval_mini_path.read_text())
    broken = copy.deepcopy(data)
    broken[0]["haystack_sessions"][1][0]["has_answer"] = "yes"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(broken))
    with pytest.raises(DataError, match="has_answer must be true or false") as e:
        load_longmemeval(path)
    assert "field=has_answer" in str(e.value)
