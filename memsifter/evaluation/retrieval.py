"""The retrieval benchmark: rank each question's haystack with a coarse filter and score the
ranking against gold sessions (NDCG@k, recall@k, MRR), overall and by category, with latency.

Output of ``run_retrieval_eval`` (one folder per call):

* ``metrics.json``: flat metrics for one retriever (``n_questions``, ``ndcg@1`` ...), or one
  sub-folder per retriever when several are run, each with its own ``metrics.json``;
* ``report.md``: a table of every retriever run;
* ``recall_at_k.png``: recall@k against k for every retriever run;
* ``run.trec`` and ``qrels.txt`` beside each ``metrics.json``: the rankings as a TREC run and the
  judgments the metrics used, so trec_eval or ir-measures re-score the run to the same numbers.

On LongMemEval the benchmark's own metrics (:mod:`memsifter.evaluation.longmemeval`) are added,
at session level from the same ranking and at turn level from ranking user turns (coarse filters
only), with ``run_turn.trec``, ``qrels_turn.txt`` and ``qrels_benchmark.txt`` (the session labels
after the benchmark's relabelling).
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.markup import escape
from rich.progress import Progress

from memsifter.coarse import CoarseFilter, build_filter
from memsifter.data import MemoryDataset, load_dataset
from memsifter.data.haystack import HaystackBuilder, HaystackStats, parse_budget
from memsifter.data.locomo import CATEGORY_NAMES
from memsifter.data.tokens import get_counter
from memsifter.data.types import Query
from memsifter.data.units import to_units
from memsifter.errors import MemSifterError
from memsifter.evaluation import longmemeval as lme
from memsifter.evaluation.config import RetrievalEvalConfig
from memsifter.ir_metrics import (
    evaluate_rankings,
    recall_curve,
    write_trec_qrels,
    write_trec_run,
)
from memsifter.progress import make_progress

if TYPE_CHECKING:
    from memsifter.ranker.spec import PromptSpec


@dataclass
class RetrieverResult:
    retriever: str
    metrics: dict[str, Any]
    recall_curve: dict[int, float]
    rankings: dict[str, tuple[str, ...]] = field(default_factory=dict)  # qid -> ids, best first


def _percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else 0.0


def prepare_queries(
    dataset: MemoryDataset, cfg: RetrievalEvalConfig
) -> tuple[list[Query], list[HaystackStats]]:
    queries = [q for q in dataset.queries if q.has_evidence]
    if cfg.sample_questions is not None and cfg.sample_questions < len(queries):
        keep = set(random.Random(cfg.seed).sample(range(len(queries)), cfg.sample_questions))
        queries = [q for i, q in enumerate(queries) if i in keep]
    if cfg.max_questions:
        queries = queries[: cfg.max_questions]
    budget = parse_budget(cfg.haystack)
    if budget is None:
        return queries, []
    builder = HaystackBuilder(dataset, get_counter(cfg.tokenizer), seed=cfg.seed)
    built = [builder.build(q, budget) for q in queries]
    return [q for q, _ in built], [s for _, s in built]


def _by_category(
    queries: list[Query], rankings: dict[str, tuple[str, ...]]
) -> dict[str, dict[str, Any]]:
    by_cat: dict[str, list[Query]] = defaultdict(list)
    for q in queries:
        by_cat[q.category or "none"].append(q)
    return {
        cat: {
            "name": CATEGORY_NAMES.get(cat, cat) if qs[0].source == "locomo" else cat,
            "n_questions": len(qs),
            **evaluate_rankings(
                {q.qid: rankings[q.qid] for q in qs}, {q.qid: q.gold_session_ids for q in qs}
            ),
        }
        for cat, qs in sorted(by_cat.items())
    }


def rank_queries(
    filt: CoarseFilter, queries: list[Query], progress: Progress | None, label: str | None = None
) -> tuple[dict[str, tuple[str, ...]], list[float], float]:
    """Every question's ranking, per-query scoring latencies (ms) and total indexing seconds."""
    rankings: dict[str, tuple[str, ...]] = {}
    latencies: list[float] = []
    index_s = 0.0
    task = progress.add_task(escape(label or filt.name), total=len(queries)) if progress else None
    for q in queries:
        t0 = time.perf_counter()
        filt.index(q.haystack)  # cached per haystack: pays once per conversation
        t1 = time.perf_counter()
        rankings[q.qid] = filt.score(q.question, q.haystack).ids
        latencies.append((time.perf_counter() - t1) * 1000)
        index_s += t1 - t0
        if progress is not None and task is not None:
            progress.advance(task)
    return rankings, latencies, index_s


def evaluate_filter(
    filt: CoarseFilter, queries: list[Query], cfg: RetrievalEvalConfig, progress: Progress | None
) -> RetrieverResult:
    rankings, latencies, index_s = rank_queries(filt, queries, progress)
    gold = {q.qid: q.gold_session_ids for q in queries}
    metrics: dict[str, Any] = {"n_questions": len(queries)}
    metrics.update(evaluate_rankings(rankings, gold))
    by_cat: dict[str, list[Query]] = defaultdict(list)
    for q in queries:
        by_cat[q.category or "none"].append(q)
    metrics["by_category"] = {
        cat: {
            "name": CATEGORY_NAMES.get(cat, cat) if queries[0].source == "locomo" else cat,
            "n_questions": len(qs),
            **evaluate_rankings(
                {q.qid: rankings[q.qid] for q in qs}, {q.qid: q.gold_session_ids for q in qs}
            ),
        }
        for cat, qs in sorted(by_cat.items())
    }
    metrics["latency_ms"] = {
        "p50": _percentile(latencies, 50),
        "p95": _percentile(latencies, 95),
        "mean": float(np.mean(latencies)) if latencies else 0.0,
    }
    metrics["index_seconds_total"] = index_s
    return RetrieverResult(
        filt.name, metrics, recall_curve(rankings, gold, cfg.recall_max_k), rankings
    )


def proxy_spec(cfg: RetrievalEvalConfig) -> PromptSpec:
    """The proxy's prompt: the model's own spec, or the explicit one the config gives."""
    from memsifter.ranker.checkpoint import merge_settings, resolve_spec

    given = merge_settings(
        ("prompt", cfg.prompt),
        (
            "flags",
            {
                "coarse": cfg.coarse,
                "budget_tokens": cfg.coarse_budget,
                "completion_tokens": cfg.proxy_completion_tokens,
                "language": cfg.proxy_language,
            },
        ),
    )
    return resolve_spec(
        cfg.model,
        given,
        hint="--prompt-spec FILE, or --coarse-budget / --completion-tokens / --coarse; in a "
        "config, prompt: {window_tokens, completion_tokens, ...}",
    )


def build_proxy(cfg: RetrievalEvalConfig, spec: PromptSpec | None = None):
    from memsifter.ranker.proxy import Proxy, ProxyParams

    spec = spec or proxy_spec(cfg)  # before the model loads: a refusal costs nothing
    if cfg.backend == "openai" and not cfg.base_url:
        raise MemSifterError("--backend openai needs --base-url http://host:port/v1")
    return Proxy.from_pretrained(
        cfg.model,
        backend=cfg.backend_spec(),
        params=ProxyParams(batch_size=cfg.proxy_batch_size, temperature=cfg.proxy_temperature),
        prompt=spec,
    )


def proxy_units(queries: list[Query], spec: PromptSpec) -> list[Query]:
    """The queries in the candidates the proxy was trained on: sessions, or with ``unit: page``
    pages of ``turns_per_page`` turns (gold: the pages holding the evidence)."""
    if spec.unit == "session":
        return queries
    return [to_units(q, spec.unit, spec.turns_per_page) for q in queries]  # type: ignore[arg-type]


def evaluate_proxy(
    proxy, queries: list[Query], cfg: RetrievalEvalConfig, progress: Progress | None
) -> RetrieverResult:
    """Like ``evaluate_filter`` plus the proxy's own health: parse rate, how often the coarse
    order had to complete its ranking, prompt sizes and generation latency."""
    from memsifter.ranker.proxy import RankRequest

    task = progress.add_task(escape(proxy.name), total=len(queries)) if progress else None
    results = []
    step = max(cfg.proxy_batch_size, 1)
    for start in range(0, len(queries), step):
        batch = queries[start : start + step]
        results += proxy.rank_many(
            [RankRequest(q.question, q.haystack, q.question_date) for q in batch]
        )
        if progress is not None and task is not None:
            progress.advance(task, len(batch))
    rankings = {q.qid: r.ranking.ids for q, r in zip(queries, results, strict=True)}
    gold = {q.qid: q.gold_session_ids for q in queries}
    metrics: dict[str, Any] = {"n_questions": len(queries)}
    metrics.update(evaluate_rankings(rankings, gold))
    metrics["by_category"] = _by_category(queries, rankings)
    n = max(len(results), 1)
    # A batch's latency is shared by its prompts: report it amortised per question.
    per_q = [r.generation.latency_s * 1000 / min(step, len(queries)) for r in results]
    metrics["latency_ms"] = {
        "p50": _percentile(per_q, 50),
        "p95": _percentile(per_q, 95),
        "mean": float(np.mean(per_q)) if per_q else 0.0,
    }
    metrics["proxy"] = {
        "model": proxy.backend.model_name,
        "backend": proxy.backend.name,
        "coarse": proxy.coarse.name,
        "prompt_budget_tokens": proxy.spec.budget_tokens,
        "prompt_spec": proxy.spec.to_dict(),
        "parse_rate": sum(r.parsed.ok for r in results) / n,
        "clean_rate": sum(r.parsed.clean for r in results) / n,
        "completed_rate": sum(r.completed for r in results) / n,
        "errors": {str(k): v for k, v in _count(r.parsed.error for r in results).items()},
        "prompt_tokens_mean": float(np.mean([r.prompt.n_tokens for r in results])),
        "completion_tokens_mean": float(np.mean([r.generation.completion_tokens for r in results])),
        "coarse_cut_rate": sum(bool(r.prompt.dropped_ids) for r in results) / n,
    }
    return RetrieverResult(
        proxy.name, metrics, recall_curve(rankings, gold, cfg.recall_max_k), rankings
    )


def _count(values) -> dict[Any, int]:
    out: dict[Any, int] = defaultdict(int)
    for v in values:
        if v is not None:
            out[v.value if hasattr(v, "value") else v] += 1
    return dict(out)


def run_retrieval_eval(cfg: RetrievalEvalConfig, console: Any = None) -> list[RetrieverResult]:
    pspec = proxy_spec(cfg) if "memsifter" in cfg.retrievers else None
    dataset = load_dataset(cfg.dataset, cfg.data).filter_conversations(cfg.conversations)
    queries, hay_stats = prepare_queries(dataset, cfg)
    if pspec is not None:
        # Every retriever ranks what the proxy ranks, so the table compares like with like.
        queries = proxy_units(queries, pspec)
    # LongMemEval's own metrics are defined on sessions and user turns, not on pages.
    benchmark = cfg.dataset == "longmemeval" and (pspec is None or pspec.unit == "session")
    turn_queries: list[Query] = []
    if benchmark:
        if cfg.longmemeval_text not in ("user", "all"):
            raise MemSifterError(
                f"longmemeval_text must be 'user' or 'all', got {cfg.longmemeval_text!r}"
            )
        # The turn corpus is cut from whole sessions: a turn's id counts the assistant turns.
        turn_queries = [lme.user_turns(q) for q in queries]
        if cfg.longmemeval_text == "user":
            queries = [lme.user_sessions(q) for q in queries]
    if console is not None:
        console.print(dataset.report.summary())
    context = {
        "dataset": cfg.dataset,
        "data": cfg.data,
        "haystack": cfg.haystack,
        "seed": cfg.seed,
        "token_counter": get_counter(cfg.tokenizer).name,
        "conversations": cfg.conversations or "all",
        "unit": "session" if pspec is None else pspec.unit,
        **({"longmemeval_text": cfg.longmemeval_text} if benchmark else {}),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "unset"),
        "n_questions_total": dataset.report.n_questions,
        "n_questions_without_evidence": dataset.report.n_no_evidence,
        # The questions ranked: fewer than the scoreable ones with a sample or --max-questions.
        "n_questions_ranked": len(queries),
        **({"sample_questions": cfg.sample_questions} if cfg.sample_questions else {}),
        "haystack_sessions_mean": float(np.mean([len(q.haystack) for q in queries]))
        if queries
        else 0.0,
    }
    if hay_stats:
        context["haystack_tokens_mean"] = float(np.mean([s.tokens for s in hay_stats]))
        context["haystack_filled_fraction"] = float(np.mean([s.filled for s in hay_stats]))
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    results: list[RetrieverResult] = []
    with make_progress(console) as progress:
        for spec in cfg.retrievers:
            t0 = time.perf_counter()
            if spec == "memsifter":
                proxy = build_proxy(cfg, pspec)
                load_s = time.perf_counter() - t0
                res = evaluate_proxy(proxy, queries, cfg, progress)
            else:
                filt = build_filter(spec, embedding_cache=cfg.embedding_cache)
                load_s = time.perf_counter() - t0
                res = evaluate_filter(filt, queries, cfg, progress)
            turn_rankings = None
            if benchmark and spec != "memsifter":
                turn_rankings, _, _ = rank_queries(
                    filt, turn_queries, progress, f"{filt.name} (user turns)"
                )
            res.metrics.update(context, retriever=res.retriever, model_load_seconds=load_s)
            if benchmark:
                add_benchmark_metrics(res, queries, turn_rankings)
            results.append(res)
            target = out if len(cfg.retrievers) == 1 else out / slug(res.retriever)
            target.mkdir(parents=True, exist_ok=True)
            (target / "metrics.json").write_text(json.dumps(res.metrics, indent=2) + "\n")
            write_run_files(target, res, queries, turn_rankings if benchmark else None)
    (out / "config.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")
    (out / "report.md").write_text(render_report(results, context))
    plot_recall(results, out / "recall_at_k.png", title=f"{cfg.dataset} ({cfg.haystack})")
    return results


def add_benchmark_metrics(
    res: RetrieverResult,
    queries: list[Query],
    turn_rankings: dict[str, tuple[str, ...]] | None,
) -> None:
    """LongMemEval's own metrics into ``res.metrics``: flat (``session/recall_any@5`` ...) over
    every non-abstention question as the benchmark averages them, per question type inside
    ``by_category``, and under ``longmemeval`` the no-target count and, apart, the means over
    the questions with a target (``with_target``)."""
    report = lme.benchmark_report(queries, res.rankings, turn_rankings)
    res.metrics.update(report["metrics"])
    res.metrics["longmemeval"] = {
        "definitions": "LongMemEval src/retrieval/eval_utils.py: recall_any, recall_all, "
        "ndcg_any (DCG rel[0] + sum rel[i]/log2(i+1), i >= 1); documents are user turns",
        "averaging": "run_retrieval.py: every non-abstention question, those with no target "
        "after the relabelling included (recall_any 0, recall_all 1, ndcg_any 0)",
        "turn_level": turn_rankings is not None,
        "n_scored": report["n_questions"],
        "n_no_target": report["n_no_target"],
        "no_target_qids": report["no_target_qids"],
        "with_target": report["with_target"],
    }
    for cat, m in report["by_category"].items():
        res.metrics["by_category"].setdefault(cat, {"name": cat}).update(m)


def write_run_files(
    target: Path,
    res: RetrieverResult,
    queries: list[Query],
    turn_rankings: dict[str, tuple[str, ...]] | None,
) -> None:
    """``run.trec`` and ``qrels.txt`` (what ``ndcg@k``... were computed from) and, on
    LongMemEval, the benchmark's session judgments and the turn-level run."""
    tag = slug(res.retriever)
    write_trec_run(target / "run.trec", res.rankings, tag)
    write_trec_qrels(target / "qrels.txt", {q.qid: q.gold_session_ids for q in queries})
    if "longmemeval" not in res.metrics:
        return
    write_trec_qrels(
        target / "qrels_benchmark.txt", {q.qid: lme.session_targets(q) for q in queries}
    )
    if turn_rankings is not None:
        write_trec_run(target / "run_turn.trec", turn_rankings, tag)
        write_trec_qrels(target / "qrels_turn.txt", {q.qid: lme.turn_targets(q) for q in queries})


def slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


METRIC_COLUMNS = ("ndcg@1", "ndcg@5", "ndcg@10", "recall@1", "recall@5", "recall@10", "mrr")


def render_table(results: list[RetrieverResult], haystack: str | None = None) -> str:
    head = (
        ["retriever"]
        + (["haystack"] if haystack else [])
        + ["n"]
        + list(METRIC_COLUMNS)
        + ["p50 ms", "p95 ms"]
    )
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        m = r.metrics
        cells = [r.retriever] + ([haystack] if haystack else []) + [str(m["n_questions"])]
        cells += [f"{m[c]:.3f}" for c in METRIC_COLUMNS]
        cells += [f"{m['latency_ms']['p50']:.2f}", f"{m['latency_ms']['p95']:.2f}"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


# The metrics LongMemEval's print_retrieval_metrics.py reports, plus session recall_any@5.
LONGMEMEVAL_COLUMNS = (
    "session/recall_any@5",
    "session/recall_all@5",
    "session/ndcg_any@5",
    "session/recall_all@10",
    "session/ndcg_any@10",
    "turn/recall_all@5",
    "turn/ndcg_any@5",
    "turn/recall_all@10",
    "turn/ndcg_any@10",
    "turn/recall_all@50",
    "turn/ndcg_any@50",
)


BY_TYPE_COLUMNS = ("session/recall_all@5", "session/ndcg_any@5", "turn/recall_all@10")


def render_longmemeval_table(
    results: list[RetrieverResult], columns: tuple[str, ...] = LONGMEMEVAL_COLUMNS
) -> str:
    """One row per retriever; ``-`` where a level was not run (the proxy has no turn level)."""
    head = ["retriever", "n", "of which no target"] + list(columns)
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        m, info = r.metrics, r.metrics["longmemeval"]
        cells = [r.retriever, str(info["n_scored"]), str(info["n_no_target"])]
        cells += [f"{m[c]:.3f}" if c in m else "-" for c in columns]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def render_report(results: list[RetrieverResult], context: dict[str, Any]) -> str:
    lines = [f"# Retrieval report: {context['dataset']}, haystack {context['haystack']}", ""]
    lines += [f"- {k}: {v}" for k, v in context.items()]
    lines += ["", render_table(results)]
    proxies = [r for r in results if "proxy" in r.metrics]
    if proxies:
        lines += [
            "## Proxy",
            "",
            "| retriever | parse rate | clean rate | completed from coarse | "
            "coarse cut | prompt tokens | completion tokens | ms/question p50 |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in proxies:
            p = r.metrics["proxy"]
            lines.append(
                f"| {r.retriever} | {p['parse_rate']:.3f} | {p['clean_rate']:.3f} | "
                f"{p['completed_rate']:.3f} | {p['coarse_cut_rate']:.3f} | "
                f"{p['prompt_tokens_mean']:.0f} | {p['completion_tokens_mean']:.0f} | "
                f"{r.metrics['latency_ms']['p50']:.0f} |"
            )
        lines.append("")
    benchmark = [r for r in results if "longmemeval" in r.metrics]
    if benchmark:
        lines += ["## LongMemEval's own metrics", "", render_longmemeval_table(benchmark)]
    lines += ["## By category", ""]
    for r in results:
        lines.append(f"### {r.retriever}")
        lines.append("")
        extra = BY_TYPE_COLUMNS if "longmemeval" in r.metrics else ()
        head = ["category", "n", "ndcg@1", "ndcg@5", "recall@5", "mrr", *extra]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for cat, m in r.metrics["by_category"].items():
            name = cat if m["name"] == cat else f"{cat} {m['name']}"
            cells = [name, str(m["n_questions"])]
            cells += [f"{m[c]:.3f}" for c in ("ndcg@1", "ndcg@5", "recall@5", "mrr")]
            cells += [f"{m[c]:.3f}" if c in m else "-" for c in extra]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def plot_recall(results: list[RetrieverResult], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for r in results:
        ks = sorted(r.recall_curve)
        ax.plot(ks, [r.recall_curve[k] for k in ks], marker="o", ms=3, label=r.retriever)
    ax.set_xlabel("k (sessions)")
    ax.set_ylabel("recall@k")
    ax.set_ylim(0, 1.0)
    ax.set_title(f"Recall@k, {title}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
