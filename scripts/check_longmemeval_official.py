"""Check our LongMemEval metrics against the benchmark's own functions on a finished run.

Re-scores an `eval retrieval --dataset longmemeval` output folder (its ``run.trec`` and
``run_turn.trec``) with ``evaluate_retrieval`` from the official repository's
``src/retrieval/eval_utils.py``, building the corpus ids, the relabelling (``answer`` ->
``noans``) and the question filter exactly as its ``run_retrieval.py`` does, and prints the
largest difference between its means (over every non-abstention question, as
``run_retrieval.py`` averages) and our ``metrics.json`` over every ``session/…`` and ``turn/…``
metric, and how many of the averaged questions have no target.
Nothing of the benchmark's code is copied here: it is imported from a checkout you point at.

    git clone https://github.com/xiaowu0162/LongMemEval /tmp/LongMemEval
    python scripts/check_longmemeval_official.py --official /tmp/LongMemEval \\
        --data ../shared/data/longmemeval/longmemeval_s_cleaned_498.json.gz \\
        --run outputs/longmemeval_s/bm25
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from memsifter.data._json import read_json
from memsifter.evaluation.longmemeval import CUTOFFS


def _official_evaluate(repo: Path) -> Any:
    path = repo / "src/retrieval/eval_utils.py"
    if not path.exists():
        raise typer.BadParameter(f"{path} not found: --official must be a LongMemEval checkout")
    if not hasattr(np, "asfarray"):  # removed in NumPy 2; the official dcg still calls it
        np.asfarray = lambda x: np.asarray(x, dtype=float)  # type: ignore[attr-defined]
    spec = importlib.util.spec_from_file_location("lme_eval_utils", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.evaluate_retrieval


def _read_run(path: Path) -> dict[str, list[str]]:
    run: dict[str, list[str]] = defaultdict(list)
    for line in path.read_text().splitlines():
        qid, _, doc, *_ = line.split()
        run[qid].append(doc)
    return run


def _corpus(entry: dict, level: str) -> tuple[list[str], list[str]]:
    """(the benchmark's corpus ids, ours) in corpus order, as run_retrieval.py keys them."""
    official, ours = [], []
    for sid, sess in zip(entry["haystack_session_ids"], entry["haystack_sessions"], strict=True):
        users = [(i, t) for i, t in enumerate(sess) if t["role"] == "user"]
        if level == "session":
            relabel = "answer" in sid and not any(t.get("has_answer") for _, t in users)
            official.append(sid.replace("answer", "noans") if relabel else sid)
            ours.append(sid)
            continue
        for i, t in users:
            doc = f"{sid}_{i + 1}"
            ours.append(doc)
            relabel = "answer" in sid and not t.get("has_answer")
            official.append(doc.replace("answer", "noans") if relabel else doc)
    return official, ours


def main(
    official: Annotated[Path, typer.Option(help="a checkout of xiaowu0162/LongMemEval")],
    data: Annotated[Path, typer.Option(help="the LongMemEval file the run used")],
    run: Annotated[Path, typer.Option(help="the eval retrieval output folder")],
    tolerance: Annotated[float, typer.Option(help="largest difference allowed")] = 1e-9,
) -> None:
    evaluate = _official_evaluate(official)
    runs = {"session": _read_run(run / "run.trec")}
    if (run / "run_turn.trec").exists():
        runs["turn"] = _read_run(run / "run_turn.trec")
    values: dict[str, list[float]] = defaultdict(list)
    not_ranked = no_target = 0
    for entry in read_json(data):
        if entry["question_id"] not in runs["session"]:
            not_ranked += 1  # a sampled run (--sample-questions) ranked only some questions
            continue
        # run_retrieval.py's averaging: every question but the abstention ones, including those
        # whose answer sessions the relabelling turns into noans (they stay in the mean).
        if "_abs" in entry["question_id"]:
            continue
        for level, ranked in runs.items():
            ids, ours = _corpus(entry, level)
            position = {d: i for i, d in enumerate(ours)}
            rankings = [position[d] for d in ranked[entry["question_id"]]]
            correct = sorted({d for d in ids if "answer" in d})
            if level == "session" and not correct:
                no_target += 1
            for k in CUTOFFS:
                r_any, r_all, ndcg = evaluate(rankings, correct, ids, k=k)
                values[f"{level}/recall_any@{k}"].append(r_any)
                values[f"{level}/recall_all@{k}"].append(r_all)
                values[f"{level}/ndcg_any@{k}"].append(ndcg)
    metrics = json.loads((run / "metrics.json").read_text())
    diffs = {name: abs(float(np.mean(v)) - metrics[name]) for name, v in values.items()}
    worst = max(diffs, key=diffs.__getitem__)
    n = len(next(iter(values.values())))
    typer.echo(
        f"{run}: {n} questions ({no_target} with no target; {not_ranked} of the file not in "
        f"the run), ours n = {metrics['longmemeval']['n_scored']}, {len(diffs)} metrics, "
        f"largest |official - ours| {diffs[worst]:.1e} ({worst})"
    )
    if diffs[worst] > tolerance:
        sys.exit(1)


if __name__ == "__main__":
    typer.run(main)
