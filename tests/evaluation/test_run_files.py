"""Every `eval retrieval` leaves a TREC run and qrels that an independent tool (ir-measures,
reading the files back from disk) re-scores to exactly the numbers in metrics.json."""

from __future__ import annotations

import json
from pathlib import Path

import ir_measures
import pytest
from ir_measures import RR, R, nDCG

from memsifter.evaluation.retrieval import RetrievalEvalConfig, run_retrieval_eval
from memsifter.ir_metrics import write_trec_qrels, write_trec_run

MEASURES = {
    "ndcg@1": nDCG @ 1,
    "ndcg@5": nDCG @ 5,
    "ndcg@10": nDCG @ 10,
    "recall@1": R @ 1,
    "recall@5": R @ 5,
    "recall@10": R @ 10,
    "mrr": RR,
}


def _rescore(folder: Path) -> dict[str, float]:
    qrels = list(ir_measures.read_trec_qrels(str(folder / "qrels.txt")))
    run = list(ir_measures.read_trec_run(str(folder / "run.trec")))
    agg = ir_measures.calc_aggregate(list(MEASURES.values()), qrels, run)
    return {name: agg[m] for name, m in MEASURES.items()}


def test_run_files_rescore_to_metrics(tmp_path: Path, locomo_mini_path: Path) -> None:
    cfg = RetrievalEvalConfig(
        dataset="locomo",
        data=str(locomo_mini_path),
        # Two filters that disagree, so a run file mixed up between them would show.
        retrievers=["bm25", "wordllama"],
        haystack="32k",
        out=str(tmp_path),
    )
    results = run_retrieval_eval(cfg)
    for res, folder in zip(results, ("bm25", "wordllama"), strict=True):
        out = tmp_path / folder
        m = json.loads((out / "metrics.json").read_text())
        rescored = _rescore(out)
        for name, value in rescored.items():
            assert m[name] == pytest.approx(value, abs=1e-9), name
        lines = (out / "run.trec").read_text().splitlines()
        qid, q0, doc, rank, score, tag = lines[0].split()
        assert (q0, rank, tag) == ("Q0", "1", folder)
        # The file keeps the ranker's order, whatever the document ids sort like.
        assert [ln.split()[2] for ln in lines if ln.split()[0] == qid] == list(res.rankings[qid])
        qrels_qids = {r.query_id for r in ir_measures.read_trec_qrels(str(out / "qrels.txt"))}
        assert len(qrels_qids) == m["n_questions"]
    assert results[0].rankings != results[1].rankings  # the files above are not one run twice


def test_writers_refuse_ids_that_break_the_format(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="document id 'a b'"):
        write_trec_run(tmp_path / "run.trec", {"q1": ["a b"]}, "bm25")
    with pytest.raises(ValueError, match="question id ''"):
        write_trec_qrels(tmp_path / "qrels.txt", {"": ["d"]})
    with pytest.raises(ValueError, match="run tag"):
        write_trec_run(tmp_path / "run.trec", {"q1": ["d"]}, "my tag")
    # Questions without gold are not judged (they are not in the means either).
    write_trec_qrels(tmp_path / "qrels.txt", {"q1": ["d1", "d2"], "q2": []})
    assert (tmp_path / "qrels.txt").read_text() == "q1 0 d1 1\nq1 0 d2 1\n"


def test_run_files_read_back_and_per_query_means(tmp_path: Path) -> None:
    from memsifter.ir_metrics import (
        evaluate_rankings,
        per_query,
        read_trec_qrels,
        read_trec_run,
        write_trec_qrels,
        write_trec_run,
    )

    rankings = {"q1": ("s3", "s1", "s2"), "q2": ("s2", "s1"), "q3": ()}
    gold = {"q1": ("s1",), "q2": ("s2", "s9"), "q3": ("s1",), "q4": ()}
    write_trec_run(tmp_path / "run.trec", rankings, "t")
    write_trec_qrels(tmp_path / "qrels.txt", gold)
    assert read_trec_run(tmp_path / "run.trec") == {q: r for q, r in rankings.items() if r}
    assert read_trec_qrels(tmp_path / "qrels.txt") == {q: g for q, g in gold.items() if g}
    each = per_query(rankings, gold)
    assert set(each["ndcg@1"]) == {"q1", "q2", "q3"}  # q4 has no gold: not scoreable
    assert each["ndcg@1"] == {"q1": 0.0, "q2": 1.0, "q3": 0.0}  # q3 ranked nothing: 0
    means = evaluate_rankings(rankings, gold)
    for name, values in each.items():
        assert abs(sum(values.values()) / len(values) - means[name]) < 1e-12
