"""Does the recall service's coarse stage rank LoCoMo and LongMemEval as the retrieval
benchmarks' BM25 does? Each haystack is ingested as one user of a scratch service (a page per
session, no bookmarks, so recall is the coarse ranking alone), every question is recalled over
the whole haystack, and the service's ranking is compared with ``BM25Filter`` (bm25s) over the
same sessions: identical rankings, and the benchmark metrics of both with their paired
difference. Writes ``eval/results/service_coarse_parity/service_coarse_parity.{json,md}``.

    python -m eval.probes.service_coarse_parity --locomo ../shared/data/locomo/locomo10.json \
        --longmemeval ../shared/data/longmemeval/longmemeval_s_cleaned_498.json.gz
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from eval.common import git_head, machine, machine_line
from memsifter.coarse import build_filter
from memsifter.data import load_dataset
from memsifter.data.types import Query, Session
from memsifter.evaluation import longmemeval as lme
from memsifter.ir_metrics import evaluate_rankings
from memsifter.serving.config import PagingSettings, ServeConfig
from memsifter.serving.memory import MemoryService
from memsifter.serving.ranking import ServiceRanker
from memsifter.serving.store import Principal, Store, to_naive_utc

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "eval" / "results" / "service_coarse_parity" / "service_coarse_parity.md"
METRICS = ("ndcg@1", "ndcg@5", "recall@5", "recall@10")


class NoKeywords:
    """No bookmarks: the service's recall is then its coarse ranking alone."""

    name = "none"

    def extract(self, pages: Sequence[Session]) -> list[list[tuple[str, float]]]:
        return [[] for _ in pages]


def _queries(dataset: str, path: str, limit: int | None) -> list[Query]:
    data = load_dataset(dataset, path)
    queries = [q for q in data.queries if q.has_evidence]
    if dataset == "longmemeval":  # the benchmark ranks user turns (its own default)
        queries = [lme.user_sessions(q) for q in queries]
    return queries[:limit] if limit else queries


TOP = 5


def compare(dataset: str, path: str, limit: int | None) -> dict[str, Any]:
    asked = _queries(dataset, path, limit)
    # A haystack that repeats a session id cannot be one user's history (the service refuses
    # the second as a conflict): such questions are left out, and counted.
    queries = [q for q in asked if len({s.id for s in q.haystack}) == len(q.haystack)]
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"sqlite:///{Path(tmp) / 'parity.db'}")
        store.migrate()
        store.ensure_tenant("bench")
        # One page per session: the benchmarks rank sessions.
        longest = max(len(s.turns) for q in queries for s in q.haystack)
        config = ServeConfig(db_url=store.url, paging=PagingSettings(turns_per_page=longest))
        memory = MemoryService(config, store, ServiceRanker(build_filter("bm25")), NoKeywords())
        who = Principal("bench")
        users: dict[tuple[str, ...], str] = {}
        service: dict[str, tuple[str, ...]] = {}
        bm25 = build_filter("bm25")
        reference: dict[str, tuple[str, ...]] = {}
        turnless = 0  # questions whose haystack holds sessions without turns
        same_paged = 0  # rankings equal to bm25s over the sessions that have turns
        same_top = 0  # top-5 recalls equal to the whole ranking's first 5, scores included
        start = time.perf_counter()
        for q in queries:
            key = tuple(s.fingerprint for s in q.haystack)
            user = users.get(key)
            if user is None:
                user = users[key] = f"u{len(users)}"
                memory.ingest_sessions(who, user, list(q.haystack))
            hits = memory.recall(who, user, q.question, top_k=len(q.haystack)).hits
            service[q.qid] = tuple(h.page.session_id for h in hits)
            # A recall of the top 5 scores only the pages that can reach it (pruning): the
            # same pages and scores as the whole ranking's first 5.
            top = memory.recall(who, user, q.question, top_k=TOP).hits
            same_top += [(h.page.session_id, h.coarse_score) for h in top] == [
                (h.page.session_id, h.coarse_score) for h in hits[:TOP]
            ]
            # The service breaks ties chronologically: the reference gets the sessions in
            # the order the service stores them (undated last, then by date).
            ordered = sorted(
                q.haystack,
                key=lambda s: (s.date is None, to_naive_utc(s.date) or datetime.min),
            )
            reference[q.qid] = bm25.score(q.question, ordered).ids
            # A session with no turns (LongMemEval's user-turn haystacks have some) makes no
            # page, so the service's BM25 counts fewer documents; bm25s over the sessions that
            # have turns tells that apart from any other difference.
            paged = [s for s in ordered if s.turns]
            turnless += len(paged) < len(ordered)
            over_paged = bm25.score(q.question, paged).ids if len(paged) < len(ordered) else None
            same_paged += service[q.qid] == (over_paged or reference[q.qid])
        seconds = time.perf_counter() - start
        store.close()
    gold = {q.qid: q.gold_session_ids for q in queries}
    ours, theirs = evaluate_rankings(service, gold), evaluate_rankings(reference, gold)
    same = sum(service[q.qid] == reference[q.qid] for q in queries)
    same10 = sum(service[q.qid][:10] == reference[q.qid][:10] for q in queries)
    return {
        "dataset": dataset,
        "data": path,
        "n_questions": len(queries),
        "n_left_out_repeated_ids": len(asked) - len(queries),
        "n_users": len(users),
        "sessions_mean": sum(len(q.haystack) for q in queries) / max(len(queries), 1),
        "identical_rankings": same,
        "identical_top10": same10,
        "service": {m: ours[m] for m in METRICS},
        "bm25": {m: theirs[m] for m in METRICS},
        "difference": {m: ours[m] - theirs[m] for m in METRICS},
        "n_with_turnless_sessions": turnless,
        "identical_over_paged_sessions": same_paged,
        "top5_recall_equals_first_5": same_top,
        "seconds": round(seconds, 1),
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        "# The service's coarse stage against the benchmarks' BM25",
        "",
        f"Generated from `service_coarse_parity.json` by `eval/probes/service_coarse_parity.py`. "
        f"`{result['command']}` at code version `{result['code_version']}`; {result['machine']}.",
        "",
        "Each haystack is ingested as one user of a scratch recall service (SQLite, a page per "
        "session, no bookmarks) and every question recalled over it; `BM25Filter` (bm25s, the "
        "retrieval benchmarks' coarse filter) ranks the same sessions. Native haystacks; "
        "LongMemEval ranks user turns, as its benchmark does.",
        "",
        "A session with no turns makes no page (LongMemEval's user-turn haystacks have some), "
        "so the service's BM25 counts fewer documents than bm25s over the haystack: *with "
        "turnless sessions* counts such questions, and *identical over paged sessions* the "
        "service rankings equal to bm25s's over the sessions that have turns. *Top 5 = first "
        "5* counts questions whose recall of the top 5 (which scores only the pages that can "
        "reach it) returns the whole ranking's first 5 with the same coarse scores.",
        "",
        "| dataset | questions (left out: repeated ids) | users | identical rankings | "
        "identical top 10 | with turnless sessions | identical over paged sessions | "
        "top 5 = first 5 | " + " | ".join(f"{m} service / BM25 (diff)" for m in METRICS) + " |",
        "|---|---|---|---|---|---|---|---|" + "---|" * len(METRICS),
    ]
    for r in result["rows"]:
        cells = [
            f"{r['service'][m]:.4f} / {r['bm25'][m]:.4f} ({r['difference'][m]:+.4f})"
            for m in METRICS
        ]
        lines.append(
            f"| {r['dataset']} | {r['n_questions']} ({r.get('n_left_out_repeated_ids', 0)}) "
            f"| {r['n_users']} | "
            f"{r['identical_rankings']} | {r['identical_top10']} | "
            f"{r.get('n_with_turnless_sessions', '')} | "
            f"{r.get('identical_over_paged_sessions', '')} | "
            f"{r.get('top5_recall_equals_first_5', '')} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines) + "\n"


def main(
    locomo: Annotated[str | None, typer.Option(help="LoCoMo's locomo10.json")] = None,
    longmemeval: Annotated[str | None, typer.Option(help="LongMemEval-S json(.gz)")] = None,
    max_questions: Annotated[int | None, typer.Option(help="first N questions each")] = None,
    out: Annotated[Path, typer.Option(help="the .md; the .json goes beside it")] = OUT,
) -> None:
    rows = []
    if locomo:
        rows.append(compare("locomo", locomo, max_questions))
    if longmemeval:
        rows.append(compare("longmemeval", longmemeval, max_questions))
    if not rows:
        raise typer.BadParameter("name --locomo and/or --longmemeval")
    command = "python -m eval.probes.service_coarse_parity" + (
        f" --locomo {locomo}" if locomo else ""
    )
    command += f" --longmemeval {longmemeval}" if longmemeval else ""
    command += f" --max-questions {max_questions}" if max_questions else ""
    result = {
        "command": command,
        "code_version": git_head(),
        "machine": machine_line(machine()),
        "rows": rows,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    out.write_text(render(result), encoding="utf-8")
    print(render(result))


if __name__ == "__main__":
    typer.run(main)
