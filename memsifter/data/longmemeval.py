"""Loader for the official LongMemEval JSON (Wu et al., 2024).

Each record carries its own haystack: ``haystack_session_ids``, ``haystack_dates`` and
``haystack_sessions`` (lists of ``{role, content, has_answer?}``) in parallel. Gold sessions are
``answer_session_ids``; abstention questions (``question_id`` ending in ``_abs``) have an
unanswerable question by design, so their gold is kept for reference but they are excluded from
retrieval metrics, like the benchmark's own retrieval eval does.

The file may be ``.json`` or gzipped ``.json.gz`` (LongMemEval-S is shipped compressed). Each
query's ``meta["answer_turn_ids"]`` lists the user turns of its answer sessions that carry
``has_answer: true``: the benchmark's own retrieval labels, which
:mod:`memsifter.evaluation.longmemeval` scores against.
"""

from __future__ import annotations

from pathlib import Path

from memsifter.data._json import need, read_json
from memsifter.data.dataset import LoadReport, MemoryDataset
from memsifter.data.dates import parse_date_field
from memsifter.data.types import Query, Session, Turn
from memsifter.errors import DataError


def _answer_turns(sid: str, raw: object, *, file: str, record: str) -> list[str]:
    """Turn ids of the user turns marked ``has_answer: true`` (assistant turns never count: the
    benchmark keys its labels by user turns)."""
    out: list[str] = []
    for k, t in enumerate(raw if isinstance(raw, list) else ()):
        flag = t.get("has_answer", False) if isinstance(t, dict) else False
        if not isinstance(flag, bool):
            raise DataError(
                f"has_answer must be true or false, got {flag!r}",
                file=file,
                record=f"{record}/turn_{k}",
                field="has_answer",
            )
        if flag and t.get("role") == "user":  # type: ignore[union-attr]
            out.append(f"{sid}:{k}")
    return out


def session_of(sid: str, date_text: str | None, raw: object, *, file: str, record: str) -> Session:
    """One haystack session from its ``{role, content}`` turns (LongMemEval's shape, which the
    MemSifter release shares); turn ids are ``{sid}:{k}``."""
    if not isinstance(raw, list):
        raise DataError(
            f"expected a list of turns, got {type(raw).__name__}",
            file=file,
            record=record,
            field="haystack_sessions",
        )
    turns = []
    for k, t in enumerate(raw):
        rec = f"{record}/turn_{k}"
        turns.append(
            Turn(
                speaker=need(t, "role", str, file=file, record=rec),
                text=need(t, "content", str, file=file, record=rec),
                turn_id=f"{sid}:{k}",
            )
        )
    date = parse_date_field(date_text, file=file, record=record, field="haystack_dates")
    return Session(id=sid, turns=tuple(turns), date=date, date_text=date_text)


def check_answer_ids(answer_ids: list, ids: list, *, file: str, record: str) -> None:
    """Every gold session id names a session of the haystack."""
    known = set(ids)
    unknown = [a for a in answer_ids if a not in known]
    if unknown:
        raise DataError(
            f"answer session ids not in the haystack: {unknown}",
            file=file,
            record=record,
            field="answer_session_ids",
        )


def load_longmemeval(path: str | Path) -> MemoryDataset:
    file = str(path)
    data = read_json(path)
    if not isinstance(data, list):
        raise DataError(f"expected a list of records, got {type(data).__name__}", file=file)
    report = LoadReport(source="longmemeval")
    queries: list[Query] = []
    # Keyed by (id, date): the release reuses filler sessions across records on different dates,
    # and each record's haystack must carry its own timeline.
    pool: dict[tuple[str, str | None], Session] = {}
    for i, r in enumerate(data):
        qid = need(r, "question_id", str, file=file, record=i)
        ids = need(r, "haystack_session_ids", list, file=file, record=qid)
        dates = need(r, "haystack_dates", list, file=file, record=qid)
        raw_sessions = need(r, "haystack_sessions", list, file=file, record=qid)
        if not (len(ids) == len(dates) == len(raw_sessions)):
            raise DataError(
                f"haystack lists differ in length: {len(ids)} ids, {len(dates)} dates, "
                f"{len(raw_sessions)} sessions",
                file=file,
                record=qid,
                field="haystack_session_ids",
            )
        haystack = []
        for sid, date_text, raw in zip(ids, dates, raw_sessions, strict=True):
            key = (str(sid), date_text)
            s = pool.get(key) or session_of(
                str(sid), date_text, raw, file=file, record=f"{qid}/{sid}"
            )
            pool[key] = s
            haystack.append(s)
        answer_ids = need(r, "answer_session_ids", list, file=file, record=qid, default=[])
        check_answer_ids(answer_ids, ids, file=file, record=qid)
        answer_set = set(answer_ids)
        answer_turns = [
            tid
            for sid, raw in zip(ids, raw_sessions, strict=True)
            if sid in answer_set
            for tid in _answer_turns(str(sid), raw, file=file, record=f"{qid}/{sid}")
        ]
        abstention = qid.endswith("_abs")
        gold = () if abstention else tuple(dict.fromkeys(str(a) for a in answer_ids))
        if not gold:
            report.no_evidence_qids.append(qid)
        queries.append(
            Query(
                qid=qid,
                question=need(r, "question", str, file=file, record=qid),
                answer=str(need(r, "answer", (str, int, float), file=file, record=qid)),
                haystack=tuple(haystack),
                gold_session_ids=gold,
                question_date=need(r, "question_date", str, file=file, record=qid, default=None),
                category=need(r, "question_type", str, file=file, record=qid),
                source="longmemeval",
                conversation_id=qid,
                meta={
                    "abstention": abstention,
                    "answer_session_ids": list(answer_ids),
                    "answer_turn_ids": answer_turns,
                },
            )
        )
    report.n_questions = len(queries)
    report.n_sessions = len({sid for sid, _ in pool})
    # Each LongMemEval question is its own "conversation": its haystack.
    conversations = {q.qid: q.haystack for q in queries}
    return MemoryDataset(queries=queries, conversations=conversations, report=report)
