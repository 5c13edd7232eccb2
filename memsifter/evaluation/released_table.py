"""The paper's retrieval table for the authors' released proxy, rendered from the runs that
``scripts/eval_released_proxy.sh`` writes (``OUT/<dataset>/<retriever>/{metrics.json,run.trec,
qrels.txt}``): NDCG@1 and NDCG@5 (%) of BGE-M3 and the proxy on the same questions, the paper's
numbers beside them, and the proxy − BGE-M3 difference with a paired bootstrap CI that resamples
conversations (questions over one haystack are drawn together).

    python -m memsifter.evaluation.released_table OUT locomo split_longmemeval_s personamem_128k
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from memsifter.data.memsifter_release import load_memsifter_datasets
from memsifter.errors import DataError
from memsifter.evaluation.bootstrap import paired_bootstrap
from memsifter.ir_metrics import per_query, read_trec_qrels, read_trec_run

# The paper's "Retrieval quality (NDCG, %)" table (../shared/PAPER.md): (NDCG@1, NDCG@5).
PAPER: dict[str, dict[str, tuple[float, float]]] = {
    "locomo": {"bge-m3": (43.57, 69.59), "memsifter": (70.00, 78.11)},
    "longmemeval": {"bge-m3": (43.33, 73.16), "memsifter": (67.33, 89.67)},
    "personamem": {"bge-m3": (45.83, 64.82), "memsifter": (60.00, 75.63)},
}
PROXY = "memsifter"
METRICS = ("ndcg@1", "ndcg@5")


def paper_column(dataset: str) -> str | None:
    """The paper's column for a release dataset (``split_longmemeval_s`` → ``longmemeval``)."""
    return next((c for c in PAPER if c in dataset), None)


def _runs(folder: Path) -> tuple[Path, Path]:
    """The coarse filter's and the proxy's run folders under one dataset's output."""
    coarse = [p for p in sorted(folder.iterdir()) if p.is_dir() and p.name != PROXY]
    if len(coarse) != 1 or not (folder / PROXY).is_dir():
        raise DataError(
            f"expected one coarse filter's folder and {PROXY}/ (eval retrieval with two "
            f"retrievers), found {[p.name for p in folder.iterdir() if p.is_dir()]}",
            file=str(folder),
        )
    return coarse[0], folder / PROXY


def dataset_row(folder: Path) -> dict:
    """One dataset's numbers, with the paired CI of proxy − coarse."""
    coarse_dir, proxy_dir = _runs(folder)
    gold = read_trec_qrels(proxy_dir / "qrels.txt")
    scores = {
        name: per_query(read_trec_run(d / "run.trec"), gold, cutoffs=(1, 5))
        for name, d in (("coarse", coarse_dir), ("proxy", proxy_dir))
    }
    meta = json.loads((proxy_dir / "metrics.json").read_text(encoding="utf-8"))
    conversation = {q.qid: q.conversation_id for q in load_memsifter_datasets(meta["data"]).queries}
    qids = sorted(scores["proxy"]["ndcg@1"])
    arrays = {
        name: {m: np.array([s[m][q] for q in qids]) for m in METRICS} for name, s in scores.items()
    }
    ci = paired_bootstrap(
        arrays["proxy"], arrays["coarse"], clusters=[conversation.get(q, q) for q in qids]
    )
    return {
        "coarse": coarse_dir.name,
        "n": len(qids),
        "n_conversations": len({conversation.get(q, q) for q in qids}),
        **{f"{name}_{m}": float(a[m].mean()) for name, a in arrays.items() for m in METRICS},
        "diff": ci,
    }


def render(out: Path, datasets: list[str]) -> str:
    lines = [
        "| dataset | n (conversations) | BGE-M3 NDCG@1 / @5 | paper | released proxy NDCG@1 / @5 "
        "| paper | proxy − BGE-M3 NDCG@1 [95% CI] |",
        "|---|---|---|---|---|---|---|",
    ]

    def pair(a: float, b: float) -> str:
        return f"{100 * a:.2f} / {100 * b:.2f}"

    for ds in datasets:
        row = dataset_row(out / ds)
        paper = PAPER.get(paper_column(ds) or "", {})
        d = row["diff"]["ndcg@1"]
        lo, hi = d["ci95"]
        lines.append(
            f"| {ds} | {row['n']} ({row['n_conversations']}) "
            f"| {pair(row['coarse_ndcg@1'], row['coarse_ndcg@5'])} "
            f"| {' / '.join(f'{x:.2f}' for x in paper['bge-m3']) if paper else '–'} "
            f"| {pair(row['proxy_ndcg@1'], row['proxy_ndcg@5'])} "
            f"| {' / '.join(f'{x:.2f}' for x in paper['memsifter']) if paper else '–'} "
            f"| {100 * d['mean']:+.2f} [{100 * lo:+.2f}, {100 * hi:+.2f}] |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit("usage: python -m memsifter.evaluation.released_table OUT DATASET...")
    print(render(Path(argv[0]), argv[1:]), end="")


if __name__ == "__main__":
    main(sys.argv[1:])


__all__ = ["PAPER", "dataset_row", "paper_column", "render"]
