"""Build eval/results/longmemeval_retrieval/longmemeval_retrieval.md: every offline coarse filter
on the real
LongMemEval (LongMemEval-S, a seeded sample of it, and the oracle set), with the benchmark's own
metrics by question type beside ours. Runs `memsifter eval retrieval` per split and retriever
(or, with --reuse, reads the ``<out>/longmemeval_<split>/<retriever>/metrics.json`` such runs
wrote) and renders the tables with the machine they ran on. A retriever without results is
listed as not run, with --skip's reason (``SPLIT:RETRIEVER=REASON`` or ``RETRIEVER=REASON``).

MiniLM embeds LongMemEval-S's ~158K unique user-turn passages at 20-30 a second on 2 cores
(about 1.5 h); dense filters share ``outputs/embedding_cache``, so a killed run loses at most one
question's passages and ``--resume`` picks up where it stopped. The seeded sample of 100
questions stays as the quick table every filter is scored on.

    python -m eval.reports.longmemeval_retrieval --resume     # run what is missing, render the file
    python -m eval.reports.longmemeval_retrieval --reuse      # render from existing outputs only
"""

from __future__ import annotations

import dataclasses
import json
from datetime import date
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from eval.common import machine, machine_line
from memsifter.config import load_config
from memsifter.data.locations import LONGMEMEVAL_FILES, SHARED_DATA
from memsifter.evaluation.proxy_eval import paired_bootstrap
from memsifter.evaluation.retrieval import (
    RetrievalEvalConfig,
    RetrieverResult,
    render_longmemeval_table,
    render_table,
    run_retrieval_eval,
    slug,
)
from memsifter.ir_metrics import per_query, read_trec_qrels, read_trec_run

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_QUESTIONS = 100  # the seeded sample of LongMemEval-S (seed: the config's)
SPLITS = {
    "s": ("LongMemEval-S", f"{SHARED_DATA}/{LONGMEMEVAL_FILES['s']}"),
    "s_sample": (
        f"LongMemEval-S, a seeded sample of {SAMPLE_QUESTIONS} questions",
        f"{SHARED_DATA}/{LONGMEMEVAL_FILES['s']}",
    ),
    "oracle": ("LongMemEval oracle", f"{SHARED_DATA}/{LONGMEMEVAL_FILES['oracle']}"),
}
SAMPLED = {"s_sample": SAMPLE_QUESTIONS}
TYPES = (
    "single-session-user",
    "single-session-assistant",
    "single-session-preference",
    "multi-session",
    "knowledge-update",
    "temporal-reasoning",
)
# In the oracle set every haystack session is an evidence session.
ORACLE_NOTE = {
    "oracle": (
        "Every haystack session here is an evidence session, so the session level is nearly "
        "trivial (it only shows the relabelling, and haystacks of six sessions at k = 5); the "
        "turn level, ranking a question's user turns, is the informative part.",
        "",
    )
}
BY_TYPE = (
    "session/recall_any@5",
    "session/recall_all@5",
    "session/ndcg_any@5",
    "session/recall_all@10",
    "turn/recall_all@10",
    "turn/ndcg_any@10",
    "ndcg@1",
    "ndcg@5",
)


def _load(folder: Path, retrievers: list[str]) -> tuple[list[RetrieverResult], list[str]]:
    found, missing = [], []
    for r in retrievers:
        path = folder / slug(r) / "metrics.json"
        if path.exists():
            found.append(RetrieverResult(r, json.loads(path.read_text()), {}))
        else:
            missing.append(r)
    return found, missing


def _by_type_table(results: list[RetrieverResult]) -> str:
    head = ["type", "retriever", "n", "of which no target", *BY_TYPE]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for t in TYPES:
        for r in results:
            m: dict[str, Any] = r.metrics["by_category"].get(t)
            if m is None:
                continue
            cells = [t, r.retriever, str(m["n_questions"]), str(m.get("n_no_target", 0))]
            cells += [f"{m[c]:.3f}" if c in m else "-" for c in BY_TYPE]
            rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def _paired_table(folder: Path, results: list[RetrieverResult]) -> str:
    """Each filter minus BM25 on the same questions: per-question NDCG from the runs' own
    run.trec and qrels.txt, paired bootstrap 95% CIs (10,000 resamples, seed 0)."""
    names = [r.retriever for r in results]
    if "bm25" not in names or len(names) < 2:
        return ""

    def scores(r: str) -> dict[str, dict[str, float]]:
        d = folder / slug(r)
        gold = read_trec_qrels(d / "qrels.txt")
        return per_query(read_trec_run(d / "run.trec"), gold)

    base = scores("bm25")
    qids = sorted(base["ndcg@1"])
    rows = [
        "| filter − bm25 | n | NDCG@1 diff [95% CI] | NDCG@5 diff [95% CI] |",
        "|---|---|---|---|",
    ]
    for r in names:
        if r == "bm25":
            continue
        other = scores(r)
        if sorted(other["ndcg@1"]) != qids:
            raise typer.BadParameter(f"{r} and bm25 ranked different questions under {folder}")
        ci = paired_bootstrap(
            {m: np.array([other[m][q] for q in qids]) for m in ("ndcg@1", "ndcg@5")},
            {m: np.array([base[m][q] for q in qids]) for m in ("ndcg@1", "ndcg@5")},
        )
        cells = [
            f"{ci[m]['mean']:+.3f} [{ci[m]['ci95'][0]:+.3f}, {ci[m]['ci95'][1]:+.3f}]"
            for m in ("ndcg@1", "ndcg@5")
        ]
        rows.append(f"| {r} | {len(qids)} | {cells[0]} | {cells[1]} |")
    return (
        "Paired against BM25 on the same questions (ours, gold = `answer_session_ids`; "
        "per-question values re-scored from each run's `run.trec`/`qrels.txt`, paired bootstrap "
        "95% CI, 10,000 resamples):\n\n" + "\n".join(rows) + "\n"
    )


def _section(
    split: str, results: list[RetrieverResult], missing: list[str], skip: dict, folder: Path
) -> str:
    name, _ = SPLITS[split]
    ctx = results[0].metrics
    info = ctx["longmemeval"]
    if split in SAMPLED:
        head = (
            f"{ctx['n_questions']} of LongMemEval-S's {ctx['n_questions_total']} questions, drawn "
            f"at random (seed {ctx['seed']}) from the "
            f"{ctx['n_questions_total'] - ctx['n_questions_without_evidence']} "
            "that are not abstention questions; every row below ranks these same questions."
        )
    else:
        head = (
            f"{ctx['n_questions_total']} questions, {ctx['n_questions_without_evidence']} of them "
            "abstention (not scored)."
        )
    lines = [
        f"## {name}",
        "",
        f"{head} {ctx['haystack_sessions_mean']:.1f} sessions per haystack on "
        f"average. The benchmark's metrics average over all {info['n_scored']} of them, as its "
        f"`run_retrieval.py` does: {info['n_no_target']} have no relevant document after the "
        "relabelling (their evidence is on the assistant side) and score recall_any 0, "
        "recall_all 1 and ndcg_any 0 in that mean. Over only the "
        f"{info['with_target']['n_questions']} with a target (not the benchmark's figure): "
        f"session/recall_any@5 {info['with_target']['session/recall_any@5']:.3f} (first "
        "row's retriever).",
        "",
        *ORACLE_NOTE.get(split, ()),
        "### The benchmark's metrics",
        "",
        render_longmemeval_table(results),
        "### Ours (ir-measures, gold = `answer_session_ids`)",
        "",
        render_table(results, "native"),
        _paired_table(folder, results),
    ]
    for r in missing:
        lines.append(f"- **{r}: not run.** {skip.get(r, 'No results in the output folder.')}")
    if missing:
        lines.append("")
    no_target = ", ".join(
        f"{t} {m['n_no_target']}" for t, m in ctx["by_category"].items() if m.get("n_no_target")
    )
    lines += [
        "### By question type",
        "",
        "`n`: the type's non-abstention questions, all of them in both our metrics and the "
        "benchmark's; `of which no target`: those without a relevant document after the "
        f"relabelling, in the benchmark's means by its definitions. Per type: {no_target}.",
        "",
        _by_type_table(results),
    ]
    return "\n".join(lines)


def main(
    out: Annotated[Path, typer.Option(help="parent of longmemeval_<split>/ outputs")] = Path(
        "outputs"
    ),
    reuse: Annotated[bool, typer.Option(help="read existing outputs, run nothing")] = False,
    resume: Annotated[
        bool,
        typer.Option(
            help="run only what has no metrics.json yet (a killed run picks up where it was; "
            "dense filters also keep their vectors in the embedding cache)"
        ),
    ] = False,
    skip: Annotated[
        list[str] | None, typer.Option(help="RETRIEVER=REASON: listed as not run, with why")
    ] = None,
    result: Annotated[Path, typer.Option()] = ROOT
    / "eval/results/longmemeval_retrieval/longmemeval_retrieval.md",
) -> None:
    base = load_config(RetrievalEvalConfig, ROOT / "configs/eval/longmemeval_retrieval.yaml")
    given = dict(s.split("=", 1) for s in skip or [])
    sections = []
    threads: set[str] = set()
    for split, (_, data) in SPLITS.items():
        folder = out / f"longmemeval_{split}"
        # "split:retriever=why" skips one split's run; "retriever=why" every split's.
        reasons = {r: given.get(f"{split}:{r}", given.get(r)) for r in base.retrievers}
        reasons = {r: why for r, why in reasons.items() if why is not None}
        todo = [r for r in base.retrievers if r not in reasons]
        if not reuse:
            for r in todo:
                if resume and (folder / slug(r) / "metrics.json").exists():
                    continue
                cfg = dataclasses.replace(
                    base,
                    data=data,
                    retrievers=[r],
                    out=str(folder / slug(r)),
                    sample_questions=SAMPLED.get(split),
                    embedding_cache=str(out / "embedding_cache"),
                )
                run_retrieval_eval(cfg)
        results, missing = _load(folder, base.retrievers)
        if not results:
            raise typer.BadParameter(f"no metrics.json under {folder}; run without --reuse")
        threads |= {str(r.metrics.get("omp_num_threads", "unset")) for r in results}
        sections.append(_section(split, results, missing, reasons, folder))
    lines = [
        "# LongMemEval retrieval: offline coarse filters, the benchmark's own metrics",
        "",
        "Data: the real LongMemEval (Wu et al., ICLR 2025) from `../shared/data/longmemeval/`: "
        "LongMemEval-S (498 of its 500 questions; `7e00a6cb` and `gpt4_7a0daae1` are missing "
        "from the offline copy) and the oracle set (500 questions, evidence sessions only).",
        f"Machine: {machine_line(machine(), threads=False)}; "
        f"{date.today().isoformat()}; `OMP_NUM_THREADS` {' / '.join(sorted(threads))} per run "
        "(latencies were taken beside other jobs: read them as rough).",
        "",
        "**Metrics.** `session/…` and `turn/…` are LongMemEval's own (`src/retrieval/"
        "eval_utils.py`, reimplemented in `memsifter/evaluation/longmemeval.py`; "
        "`scripts/check_longmemeval_official.py` re-scored every run below with the official "
        "functions, means as `run_retrieval.py` averages them: largest difference 7.8e-16 over "
        "all 12 runs): `recall_any@k` (some relevant document "
        "in the top k), `recall_all@k` (all of them), `ndcg_any@k` (its DCG weighs ranks 1 and 2 "
        "alike: rel[0] + Σ_{i≥1} rel[i]/log2(i+1)). Documents are user turns, as in the "
        "benchmark: a session is indexed by its user turns only (`longmemeval_text: user`), a "
        "turn-level run ranks single user turns; relevant = user turns marked `has_answer` (an "
        "answer session without one is relabelled as not an answer). Abstention questions are "
        "left out. Session numbers come from ranking sessions, turn numbers from ranking turns "
        "(the benchmark's two granularities); a ranker of sessions or pages (the proxy, "
        "`--retriever memsifter`) reports the session level only, since no turn ranking "
        "exists to score. The usual `ndcg@k`/`recall@k`/`mrr` are "
        "ir-measures' on the same session ranking with the dataset's `answer_session_ids` as "
        "gold (no relabelling).",
        "",
        "**Not comparable to the LongMemEval paper's BM25 row as is.** Our `bm25` is bm25s "
        "(Lucene BM25, k1 1.5, b 0.75) over PyStemmer-stemmed, stop-worded, lowercased tokens; "
        "the benchmark's `flat-bm25` is rank_bm25's BM25Okapi over raw whitespace tokens. Our "
        "dense filters score a session by its best ~160-token passage (MaxP). BGE-M3 needs hub "
        "weights and is not in this offline table.",
        "",
        "Made with (each run also writes `run.trec`, `run_turn.trec`, `qrels.txt`, "
        "`qrels_benchmark.txt` and `qrels_turn.txt` beside its `metrics.json`):",
        "",
        "```bash",
        "export OMP_NUM_THREADS=2",
        "python -m eval.reports.longmemeval_retrieval --resume  # every split and filter",
        "# or one run by hand, e.g. the sample's MiniLM:",
        "memsifter eval retrieval --config configs/eval/longmemeval_retrieval.yaml \\",
        f"  --data {SPLITS['s'][1]} \\",
        f"  --retriever minilm --sample-questions {SAMPLE_QUESTIONS} --seed 0 \\",
        "  --embedding-cache outputs/embedding_cache --out outputs/longmemeval_s_sample/minilm",
        "```",
        "",
        "(`bash scripts/eval_longmemeval.sh` runs the config on LongMemEval-S in one go.)",
        "",
    ]
    result.parent.mkdir(parents=True, exist_ok=True)
    result.write_text("\n".join(lines + sections))
    typer.echo(result.read_text())


if __name__ == "__main__":
    typer.run(main)
