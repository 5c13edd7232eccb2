"""MemSifter's own JSONL format for users' data: one JSON object per line, two record types.

    {"type": "session", "id": "s1", "conversation_id": "u42", "date": "2024-05-01 09:30",
     "turns": [{"speaker": "user", "text": "..."}, ...]}
    {"type": "query", "id": "q1", "conversation_id": "u42", "question": "...", "answer": "...",
     "question_date": "2024-06-01", "gold_session_ids": ["s1"], "category": "single-hop",
     "haystack": ["s1", "s2"]}

A query's ``haystack`` defaults to every session of its ``conversation_id``, in file order.
Sessions must appear before the queries that name them. Errors name the file and line.
"""

from __future__ import annotations

import json
from pathlib import Path

from memsifter.data._json import need
from memsifter.data.dataset import LoadReport, MemoryDataset
from memsifter.data.dates import parse_date_field
from memsifter.data.types import Query, Session, Turn
from memsifter.errors import DataError


def load_jsonl(path: str | Path) -> MemoryDataset:
    file = str(path)
    p = Path(path)
    if not p.exists():
        raise DataError("file not found", file=file)
    sessions: dict[str, Session] = {}
    by_conv: dict[str, list[str]] = {}
    queries: list[Query] = []
    report = LoadReport(source="jsonl")
    with p.open(encoding="utf-8", errors="strict") as fh:
        try:
            lines = list(fh)
        except UnicodeDecodeError as e:
            raise DataError(f"file is not UTF-8: {e}", file=file) from e
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        rec = f"line {lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"invalid JSON: {e.msg}", file=file, record=rec) from e
        kind = need(obj, "type", str, file=file, record=rec)
        if kind == "session":
            s = _session(obj, file=file, record=rec)
            if s.id in sessions:
                raise DataError(f"duplicate session id {s.id!r}", file=file, record=rec, field="id")
            sessions[s.id] = s
            by_conv.setdefault(s.conversation_id or "", []).append(s.id)
        elif kind == "query":
            queries.append(_query(obj, sessions, by_conv, file=file, record=rec, report=report))
        else:
            raise DataError(
                f"unknown record type {kind!r} (expected 'session' or 'query')",
                file=file,
                record=rec,
                field="type",
            )
    report.n_questions = len(queries)
    report.n_sessions = len(sessions)
    conversations = {c: tuple(sessions[i] for i in ids) for c, ids in by_conv.items()}
    return MemoryDataset(queries=queries, conversations=conversations, report=report)


def _session(obj: dict, *, file: str, record: str) -> Session:
    sid = need(obj, "id", str, file=file, record=record)
    date_text = need(obj, "date", str, file=file, record=record, default=None)
    date = parse_date_field(date_text, file=file, record=record, field="date")
    turns = []
    for k, t in enumerate(need(obj, "turns", list, file=file, record=record)):
        r = f"{record} turn {k}"
        ts = need(t, "timestamp", str, file=file, record=r, default=None)
        tdate = parse_date_field(ts, file=file, record=r, field="timestamp")
        turns.append(
            Turn(
                speaker=need(t, "speaker", str, file=file, record=r),
                text=need(t, "text", str, file=file, record=r),
                turn_id=need(t, "id", str, file=file, record=r, default=None),
                timestamp=tdate,
            )
        )
    return Session(
        id=sid,
        turns=tuple(turns),
        date=date,
        date_text=date_text,
        conversation_id=need(obj, "conversation_id", str, file=file, record=record, default=None),
    )


def _query(
    obj: dict,
    sessions: dict[str, Session],
    by_conv: dict[str, list[str]],
    *,
    file: str,
    record: str,
    report: LoadReport,
) -> Query:
    qid = need(obj, "id", str, file=file, record=record)
    conv = need(obj, "conversation_id", str, file=file, record=record, default=None)
    hay_ids = need(obj, "haystack", list, file=file, record=record, default=None)
    if hay_ids is None:
        hay_ids = by_conv.get(conv or "", [])
    missing = [h for h in hay_ids if h not in sessions]
    if missing:
        raise DataError(
            f"unknown session ids {missing}", file=file, record=record, field="haystack"
        )
    gold = [
        str(g) for g in need(obj, "gold_session_ids", list, file=file, record=record, default=[])
    ]
    not_in = [g for g in gold if g not in set(hay_ids)]
    if not_in:
        raise DataError(
            f"gold session ids not in the haystack: {not_in}",
            file=file,
            record=record,
            field="gold_session_ids",
        )
    if not gold:
        report.no_evidence_qids.append(qid)
    return Query(
        qid=qid,
        question=need(obj, "question", str, file=file, record=record),
        answer=str(need(obj, "answer", (str, int, float), file=file, record=record, default="")),
        haystack=tuple(sessions[h] for h in hay_ids),
        gold_session_ids=tuple(gold),
        question_date=need(obj, "question_date", str, file=file, record=record, default=None),
        category=need(obj, "category", str, file=file, record=record, default=None),
        source="jsonl",
        conversation_id=conv,
    )


def dump_jsonl(dataset: MemoryDataset, path: str | Path) -> None:
    """Write any loaded dataset in our JSONL format (e.g. to hand-edit or extend LoCoMo)."""
    lines: list[str] = []
    seen: set[str] = set()
    for conv_id, conv in dataset.conversations.items():
        for s in conv:
            if s.id in seen:
                continue
            seen.add(s.id)
            lines.append(
                json.dumps(
                    {
                        "type": "session",
                        "id": s.id,
                        "conversation_id": s.conversation_id or conv_id,
                        "date": s.date_text,
                        "turns": [_turn_obj(t) for t in s.turns],
                    },
                    ensure_ascii=False,
                )
            )
    for q in dataset.queries:
        lines.append(
            json.dumps(
                {
                    "type": "query",
                    "id": q.qid,
                    "conversation_id": q.conversation_id,
                    "question": q.question,
                    "answer": q.answer,
                    "question_date": q.question_date,
                    "gold_session_ids": list(q.gold_session_ids),
                    "category": q.category,
                    "haystack": [s.id for s in q.haystack],
                },
                ensure_ascii=False,
            )
        )
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def _turn_obj(t: Turn) -> dict:
    out: dict = {"speaker": t.speaker, "text": t.text}
    if t.turn_id:
        out["id"] = t.turn_id
    if t.timestamp:
        out["timestamp"] = t.timestamp.isoformat()
    return out
