"""The QA benchmark: retrieve (a coarse filter, the proxy, the full history, or nothing), let the
working LLM answer from the top-k sessions, and score the answers (token F1, exact match and
LoCoMo's category-aware score).

Retriever names: any coarse filter spec, ``memsifter`` (coarse -> proxy, as in eval retrieval),
``full`` (the whole history, most recent first, cut to the answerer's window), ``none`` (no
memory: the s_0 of the marginal-utility reward).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.markup import escape

from memsifter.coarse import build_filter
from memsifter.data import load_dataset
from memsifter.data.locomo import CATEGORY_NAMES
from memsifter.data.types import Query, Session
from memsifter.errors import MemSifterError
from memsifter.evaluation.retrieval import make_progress
from memsifter.qa.answerer import Answerer
from memsifter.qa.scores import exact_match, score_locomo, token_f1


@dataclass
class QAEvalConfig:
    dataset: str = "locomo"
    data: str = "../shared/data/locomo/locomo10.json"
    retriever: str = "bm25"  # coarse spec | memsifter | full | none
    top_k: int = 5
    answerer: str = "smollm2-135m-instruct"
    answerer_backend: str = "transformers"
    answerer_base_url: str | None = None
    answerer_window: int = 8192
    answer_tokens: int = 48
    memory_order: str = "rank"  # rank | chronological: how the answerer shows the top k
    batch_size: int = 4
    conversations: list[str] | None = None
    max_questions: int | None = None
    include_no_evidence: bool = True  # QA scores every question; retrieval metrics cannot
    out: str = "outputs/qa"
    # the proxy, when retriever == "memsifter" (same fields as eval retrieval): its prompt is the
    # model's own prompt_spec.json, or for a model without one the explicit settings below
    model: str = "smollm2-135m-instruct"
    backend: str = "transformers"
    base_url: str | None = None
    prompt: dict[str, Any] | str | None = None  # PromptSpec fields, or a prompt_spec.json path
    coarse: str | None = None  # spec.coarse (None: not given)
    coarse_budget: int | None = None  # spec.budget_tokens
    proxy_completion_tokens: int | None = None  # spec.completion_tokens
    extra: dict[str, Any] = field(default_factory=dict)


def _retrieve(cfg: QAEvalConfig, queries: list[Query]) -> tuple[list[Query], list[list[Session]]]:
    """The queries as ranked (the proxy's unit: sessions or pages) and each one's top k."""
    if cfg.retriever == "none":
        return queries, [[] for _ in queries]
    if cfg.retriever == "full":
        # Most recent first, so the answerer's window cut drops the oldest sessions.
        return queries, [
            sorted(q.haystack, key=lambda s: (s.date is not None, s.date), reverse=True)
            for q in queries
        ]
    if cfg.retriever == "memsifter":
        from memsifter.evaluation.retrieval import (
            RetrievalEvalConfig,
            build_proxy,
            proxy_spec,
            proxy_units,
        )
        from memsifter.ranker.proxy import RankRequest

        rcfg = RetrievalEvalConfig(
            model=cfg.model,
            backend=cfg.backend,
            base_url=cfg.base_url,
            prompt=cfg.prompt,
            coarse=cfg.coarse,
            coarse_budget=cfg.coarse_budget,
            proxy_completion_tokens=cfg.proxy_completion_tokens,
            proxy_batch_size=cfg.batch_size,
        )
        spec = proxy_spec(rcfg)
        queries = proxy_units(queries, spec)
        ranked = build_proxy(rcfg, spec).rank_many(
            [RankRequest(q.question, q.haystack, q.question_date) for q in queries]
        )
        ids = [r.ranking.ids for r in ranked]
    else:
        filt = build_filter(cfg.retriever)
        ids = [filt.score(q.question, q.haystack).ids for q in queries]
    out = []
    for q, ranked_ids in zip(queries, ids, strict=True):
        by_id = {s.id: s for s in q.haystack}
        out.append([by_id[i] for i in ranked_ids[: cfg.top_k]])
    return queries, out


def run_qa_eval(cfg: QAEvalConfig, console: Any = None) -> dict[str, Any]:
    from memsifter.ranker.backends import build_backend

    dataset = load_dataset(cfg.dataset, cfg.data).filter_conversations(cfg.conversations)
    queries = [q for q in dataset.queries if cfg.include_no_evidence or q.has_evidence]
    if cfg.max_questions:
        queries = queries[: cfg.max_questions]
    if not queries:
        raise MemSifterError("no questions to evaluate (check --conversations/--max-questions)")
    t0 = time.perf_counter()
    queries, contexts = _retrieve(cfg, queries)
    retrieve_s = time.perf_counter() - t0

    options = {"base_url": cfg.answerer_base_url} if cfg.answerer_backend == "openai" else {}
    answerer = Answerer(
        build_backend(cfg.answerer_backend, cfg.answerer, **options),
        window_tokens=cfg.answerer_window,
        max_new_tokens=cfg.answer_tokens,
        memory_order=cfg.memory_order,
    )
    prompts = []
    for q, ctx in zip(queries, contexts, strict=True):
        # The haystack (sessions, or the proxy's pages) is chronological.
        when = {s.id: i for i, s in enumerate(q.haystack)}
        prompts.append(
            answerer.render(q.question, ctx, q.question_date, times=[when[s.id] for s in ctx])
        )
    predictions: list[str] = []
    latencies: list[float] = []
    with make_progress(console) as progress:
        task = progress.add_task(escape(f"answer ({cfg.retriever})"), total=len(prompts))
        for start in range(0, len(prompts), cfg.batch_size):
            chunk = prompts[start : start + cfg.batch_size]
            t1 = time.perf_counter()
            predictions += answerer.answer_texts(chunk)
            latencies += [(time.perf_counter() - t1) * 1000 / len(chunk)] * len(chunk)
            progress.advance(task, len(chunk))

    rows = []
    for q, ctx, pred in zip(queries, contexts, predictions, strict=True):
        rows.append(
            {
                "qid": q.qid,
                "category": q.category,
                "question": q.question,
                "gold": q.answer,
                "prediction": pred,
                "retrieved": [s.id for s in ctx],
                "f1": token_f1(pred, q.answer),
                "em": exact_match(pred, q.answer),
                "locomo": score_locomo(pred, q.answer, q.category),
            }
        )
    metrics: dict[str, Any] = {
        "n_questions": len(rows),
        "retriever": cfg.retriever,
        "top_k": cfg.top_k,
        "answerer": cfg.answerer,
        "f1": float(np.mean([r["f1"] for r in rows])),
        "em": float(np.mean([r["em"] for r in rows])),
        "locomo_score": float(np.mean([r["locomo"] for r in rows])),
        "prompt_tokens_mean": float(
            np.mean(
                [
                    len(answerer.backend.tokenizer(p, add_special_tokens=False)["input_ids"])
                    for p in prompts
                ]
            )
        ),
        "latency_ms": {
            "answer_p50": float(np.percentile(latencies, 50)),
            "answer_p95": float(np.percentile(latencies, 95)),
            "retrieve_total_s": retrieve_s,
        },
    }
    by_cat: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_cat[r["category"] or "none"].append(r)
    metrics["by_category"] = {
        c: {
            "name": CATEGORY_NAMES.get(c, c) if cfg.dataset == "locomo" else c,
            "n": len(rs),
            "f1": float(np.mean([r["f1"] for r in rs])),
            "em": float(np.mean([r["em"] for r in rs])),
            "locomo_score": float(np.mean([r["locomo"] for r in rs])),
        }
        for c, rs in sorted(by_cat.items())
    }
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    (out / "config.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")
    with (out / "predictions.jsonl").open("w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    return metrics
