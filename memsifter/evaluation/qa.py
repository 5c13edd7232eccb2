"""The QA benchmark: retrieve (a coarse filter, the proxy, the full history, or nothing), let the
working LLM answer from the top-k sessions, and score the answers.

Retriever names: any coarse filter spec, ``memsifter`` (coarse -> proxy, as in eval retrieval),
``full`` (the whole history, most recent first, cut to the answerer's window), ``none`` (no
memory: the s_0 of the marginal-utility reward).

``answer_prompt`` (``--prompt``) is ``ours`` (:mod:`memsifter.qa.answerer`) or, on LoCoMo,
``locomo``: the benchmark's published prompting (:mod:`memsifter.qa.locomo`: category-5 forced
choice, category-2 date hint), the setting the LoCoMo paper's F1 was measured in.

Scores, per question and averaged (``metrics.json``, ``predictions.jsonl``, ``report.md``):

* LoCoMo: ``locomo``, the benchmark's own score (:func:`memsifter.qa.scores.score_locomo`): F1
  with its rules for categories 1-4, abstention accuracy for category 5. Reported per category
  and overall with and without category 5, as the LoCoMo paper tabulates it. ``f1`` is that F1
  on categories 1-4 only and ``em`` our exact match on them: a right answer to an adversarial
  question is an abstention, so its F1 against the false premise means nothing and never enters
  ``f1``/``em``.
* Other data: ``f1``/``em`` are our CJK-aware token F1 and exact match over every question.
* ``judge`` (J), only when a judge model is given: an LLM judge with a named public rubric
  (default ``mem0``, the Mem0 paper's prompt; :mod:`memsifter.qa.judge`). On LoCoMo it is asked of
  categories 1-4, as Mem0 and the papers that copy its table do.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from rich.markup import escape

from memsifter.coarse import build_filter
from memsifter.data import load_dataset
from memsifter.data.locomo import CATEGORY_NAMES
from memsifter.data.types import Query, Session
from memsifter.errors import MemSifterError
from memsifter.evaluation.config import QAEvalConfig
from memsifter.progress import make_progress
from memsifter.qa.answerer import PROMPT_STYLES, Answerer
from memsifter.qa.judge import RUBRICS, LLMJudge, get_rubric
from memsifter.qa.locomo import LocomoQuestion, locomo_question, resolve_choice
from memsifter.qa.scores import exact_match, score_locomo, token_f1


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


def _judge_longmemeval(
    cfg: QAEvalConfig, queries: list[Query], rows: list[dict[str, Any]]
) -> dict[str, Any]:
    """LongMemEval's own judge (one prompt per question type; ``judge_rubric`` does not apply)
    sets every row's ``judge``. The offline SmolLM2 judge is reported as a pipeline check."""
    from memsifter import llm
    from memsifter.qa.longmemeval_judge import OFFLINE_JUDGE, LongMemEvalJudge, judge_qa_rows

    judge = LongMemEvalJudge(llm.build_backend(cfg.judge_spec()))
    report = judge_qa_rows(
        rows,
        [bool(q.meta.get("abstention")) for q in queries],
        judge,
        pipeline_check=cfg.judge_model == OFFLINE_JUDGE,
    )
    return {"judge_model": cfg.judge_model, **report}


def _check(cfg: QAEvalConfig) -> None:
    if cfg.answer_prompt not in PROMPT_STYLES:
        raise MemSifterError(
            f"answer prompt must be one of {', '.join(PROMPT_STYLES)}, got {cfg.answer_prompt!r}"
        )
    if cfg.answer_prompt == "locomo" and cfg.dataset != "locomo":
        raise MemSifterError(
            f"--prompt locomo is LoCoMo's own prompting (its categories 2 and 5); dataset "
            f"{cfg.dataset!r} has neither, use --prompt ours"
        )
    if cfg.judge_rubric not in RUBRICS:
        raise MemSifterError(
            f"judge rubric must be one of {', '.join(RUBRICS)}, got {cfg.judge_rubric!r}"
        )
    if cfg.judge_model and cfg.judge_backend == "openai" and not cfg.judge_base_url:
        raise MemSifterError(
            f"judge model {cfg.judge_model!r} on the openai backend needs --judge-base-url"
        )


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def _is_adversarial(cfg: QAEvalConfig, q: Query) -> bool:
    return cfg.dataset == "locomo" and q.category == "5"


def _build_judge(cfg: QAEvalConfig) -> LLMJudge | None:
    if not cfg.judge_model or cfg.dataset == "longmemeval":  # its own judge: _judge_longmemeval
        return None
    from memsifter import llm

    rubric = get_rubric(cfg.judge_rubric)
    return LLMJudge(
        llm.build_backend(cfg.judge_spec()),
        max_new_tokens=cfg.judge_max_new_tokens or rubric.max_new_tokens,
        rubric=rubric,
    )


def _summary(cfg: QAEvalConfig, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over ``rows``; a score a row does not have (None) is left out of its mean."""

    def mean_of(key: str) -> float | None:
        return _mean([r[key] for r in rows if r.get(key) is not None])

    out: dict[str, Any] = {"n": len(rows), "f1": mean_of("f1"), "em": mean_of("em")}
    if cfg.dataset == "locomo":
        out["locomo"] = mean_of("locomo")
    if cfg.judge_model:
        out["judge"] = mean_of("judge")
        out["n_judged"] = sum(r.get("judge") is not None for r in rows)
    return out


def _locomo_table(rows: list[dict[str, Any]], judged: bool) -> dict[str, Any]:
    """The LoCoMo paper's breakdown of its own score, plus J where a judge ran."""
    by_cat = {c: [r for r in rows if r["category"] == c] for c in ("1", "2", "3", "4", "5")}
    main = [r for r in rows if r["category"] != "5"]
    table: dict[str, Any] = {
        "f1_by_category": {c: _mean([r["locomo"] for r in by_cat[c]]) for c in "1234"},
        "adversarial_accuracy": _mean([r["locomo"] for r in by_cat["5"]]),
        "overall": _mean([r["locomo"] for r in rows]),
        "overall_without_adversarial": _mean([r["locomo"] for r in main]),
        "n_by_category": {c: len(rs) for c, rs in by_cat.items()},
    }
    if judged:
        table["j_by_category"] = {c: _mean([r["judge"] for r in by_cat[c]]) for c in "1234"}
        table["j_overall_without_adversarial"] = _mean([r["judge"] for r in main])
    return table


def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def _rubric_name(cfg: QAEvalConfig) -> str:
    return "longmemeval (per question type)" if cfg.dataset == "longmemeval" else cfg.judge_rubric


def _report(cfg: QAEvalConfig, metrics: dict[str, Any]) -> str:
    lines = [
        f"# QA: {cfg.retriever} top-{cfg.top_k}, answerer {cfg.answerer}",
        "",
        f"{metrics['n_questions']} questions of {cfg.dataset} ({cfg.data}), prompt "
        f"`{cfg.answer_prompt}`"
        + (f", judge {cfg.judge_model} (rubric `{_rubric_name(cfg)}`)" if cfg.judge_model else "")
        + ".",
        "",
    ]
    lo = metrics.get("locomo")
    if lo:
        judged = "j_by_category" in lo
        lines += [
            "| category | n | LoCoMo score | J |" if judged else "| category | n | LoCoMo score |",
            "|---|---:|---:|---:|" if judged else "|---|---:|---:|",
        ]
        for c in "12345":
            name = CATEGORY_NAMES[c] + (" (accuracy)" if c == "5" else " (F1)")
            score = lo["adversarial_accuracy"] if c == "5" else lo["f1_by_category"][c]
            row = f"| {c} {name} | {lo['n_by_category'][c]} | {_fmt(score)} |"
            if judged:
                row += f" {_fmt(lo['j_by_category'].get(c))} |"
            lines.append(row)
        n_main = sum(lo["n_by_category"][c] for c in "1234")
        row = f"| overall without 5 | {n_main} | {_fmt(lo['overall_without_adversarial'])} |"
        lines.append(row + (f" {_fmt(lo['j_overall_without_adversarial'])} |" if judged else ""))
        row = f"| overall | {metrics['n_questions']} | {_fmt(lo['overall'])} |"
        lines.append(row + (" – |" if judged else ""))
        lines += [
            "",
            "The LoCoMo score is the benchmark's own (`task_eval/evaluation.py`): comparable to "
            "the LoCoMo paper's F1 table when run with `--prompt locomo`. J (Mem0 rubric, "
            "categories 1-4) is comparable to Mem0-style tables only with the same judge model.",
        ]
    else:
        lines += [
            "| category | n | F1 | EM |" + (" J |" if cfg.judge_model else ""),
            "|---|---:|---:|---:|" + ("---:|" if cfg.judge_model else ""),
        ]
        for c, m in metrics["by_category"].items():
            row = f"| {c} | {m['n']} | {_fmt(m['f1'])} | {_fmt(m['em'])} |"
            lines.append(row + (f" {_fmt(m.get('judge'))} |" if cfg.judge_model else ""))
    return "\n".join(lines) + "\n"


def run_qa_eval(cfg: QAEvalConfig, console: Any = None) -> dict[str, Any]:
    from memsifter import llm

    _check(cfg)
    dataset = load_dataset(cfg.dataset, cfg.data).filter_conversations(cfg.conversations)
    queries = [q for q in dataset.queries if cfg.include_no_evidence or q.has_evidence]
    if cfg.max_questions:
        queries = queries[: cfg.max_questions]
    if not queries:
        raise MemSifterError("no questions to evaluate (check --conversations/--max-questions)")
    judge = _build_judge(cfg)  # before any answering: a bad judge setting fails fast
    t0 = time.perf_counter()
    queries, contexts = _retrieve(cfg, queries)
    retrieve_s = time.perf_counter() - t0

    answerer = Answerer(
        llm.build_backend(cfg.answerer_spec()),
        window_tokens=cfg.answerer_window,
        max_new_tokens=cfg.answer_tokens,
        memory_order=cfg.memory_order,
        style=cfg.answer_prompt,
    )
    asked: list[str | LocomoQuestion] = [
        locomo_question(q.qid, q.question, q.category, q.answer)
        if cfg.answer_prompt == "locomo"
        else q.question
        for q in queries
    ]
    prompts = []
    for q, question, ctx in zip(queries, asked, contexts, strict=True):
        # The haystack (sessions, or the proxy's pages) is chronological.
        when = {s.id: i for i, s in enumerate(q.haystack)}
        prompts.append(
            answerer.render(question, ctx, q.question_date, times=[when[s.id] for s in ctx])
        )
    replies: list[str] = []
    latencies: list[float] = []
    with make_progress(console) as progress:
        task = progress.add_task(escape(f"answer ({cfg.retriever})"), total=len(prompts))
        for start in range(0, len(prompts), cfg.batch_size):
            chunk = prompts[start : start + cfg.batch_size]
            t1 = time.perf_counter()
            replies += answerer.answer_texts(chunk)
            latencies += [(time.perf_counter() - t1) * 1000 / len(chunk)] * len(chunk)
            progress.advance(task, len(chunk))

    rows = []
    for q, question, ctx, reply in zip(queries, asked, contexts, replies, strict=True):
        row: dict[str, Any] = {"qid": q.qid, "category": q.category, "question": q.question}
        pred = reply
        if isinstance(question, LocomoQuestion):
            row["asked"] = question.text
            if question.options:
                # Scored as the official runs score it: the chosen option's text.
                pred = resolve_choice(reply, question.options)
                row["options"] = question.options
                row["reply"] = reply
        adversarial = _is_adversarial(cfg, q)
        row |= {"gold": q.answer, "prediction": pred, "retrieved": [s.id for s in ctx]}
        if cfg.dataset == "locomo":
            row["locomo"] = score_locomo(pred, q.answer, q.category)
            row["f1"] = None if adversarial else row["locomo"]
        else:
            row["f1"] = token_f1(pred, q.answer)
        row["em"] = None if adversarial else exact_match(pred, q.answer)
        if judge is not None:
            row["judge"] = None
        rows.append(row)
    if judge is not None:
        # Mem0's J leaves LoCoMo's adversarial category out; every other question is judged.
        todo = [r for r, q in zip(rows, queries, strict=True) if not _is_adversarial(cfg, q)]
        verdicts = judge.judge_many([(r["question"], r["gold"], r["prediction"]) for r in todo])
        for r, v in zip(todo, verdicts, strict=True):
            r["judge"] = v
    lme_judge = None
    if cfg.dataset == "longmemeval" and cfg.judge_model:
        lme_judge = _judge_longmemeval(cfg, queries, rows)

    metrics: dict[str, Any] = {
        "n_questions": len(rows),
        "dataset": cfg.dataset,
        "retriever": cfg.retriever,
        "top_k": cfg.top_k,
        "answerer": cfg.answerer,
        "prompt": cfg.answer_prompt,
        **{k: v for k, v in _summary(cfg, rows).items() if k != "n"},
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
    if judge is not None:
        metrics["judge_model"] = cfg.judge_model
        metrics["judge_rubric"] = {"name": judge.rubric.name, "source": judge.rubric.source}
    if lme_judge is not None:
        metrics["judge_model"] = cfg.judge_model
        metrics["judge_rubric"] = {"name": "longmemeval", "source": lme_judge["judge_prompts"]}
        metrics["longmemeval"] = lme_judge
    if cfg.dataset == "locomo":
        metrics["locomo"] = _locomo_table(rows, judge is not None)
    by_cat: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_cat[r["category"] or "none"].append(r)
    metrics["by_category"] = {
        c: {"name": CATEGORY_NAMES.get(c, c) if cfg.dataset == "locomo" else c} | _summary(cfg, rs)
        for c, rs in sorted(by_cat.items())
    }
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    (out / "config.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")
    (out / "report.md").write_text(_report(cfg, metrics), encoding="utf-8")
    with (out / "predictions.jsonl").open("w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    return metrics
