"""Loader for the MemSifter authors' released data (``zstanjj/MemSifter-Datasets``, MIT), read from
a local copy. The format is the one the official code reads (plageon/MemSifter: ``ray_emb.py``
opens ``{data_dir}/{dataset}/{split}.parquet``, ``data/rl_train_data_propare.py`` turns a row into
a prompt, ``data/test_memory.json`` is a sample); the dataset card itself lists no files or
fields, so docs/official_proxy.md ("Its data") states what this loader takes as the contract.

**Layout.** A path is any of:

* the release's root, one folder per dataset (``locomo/``, ``split_longmemeval_s/``, …), each
  holding ``train`` and ``test`` files;
* one dataset's folder;
* one file.

Files are ``.parquet`` (the release), ``.jsonl`` or ``.json`` (a list of rows, the official
sample's form). A file named ``train`` or ``test`` puts its questions in that split
(``MemoryDataset.splits``); the release has no validation split, so a recipe that needs one says
how to carve it. Any other file name leaves the split to the recipe.

**A row** (LongMemEval's shape, without its question id, type and date):

* ``question``, and ``answer`` (or ``gold_answer``), kept as text;
* ``haystack_sessions``: a list of sessions, each a list of ``{role, content}`` turns (any role
  name; other keys ignored), or that list JSON-encoded in a string, as the official pipeline
  writes it to parquet;
* ``haystack_session_ids`` and, optionally, ``haystack_dates`` and ``similarities`` (the
  authors' BGE-M3 cosine of the question with each session), parallel to the sessions;
* ``answer_session_ids``: the gold sessions, by id (the official scripts find them by id).

**Ids.** A row names no question id, so a question is ``{dataset}/{split}/{row}`` (the row's
0-based index in its file; a ``question_id`` column, where present, replaces the row number).
Session ids are prefixed with the dataset (``locomo:session_3``). The same session id with
another date or other turns elsewhere in a dataset (LoCoMo's ``session_3`` in two
conversations) becomes ``…#2``, ``…#3`` in the order met, counted in the report; the gold ids of
a row follow its own sessions.

**Conversations.** Questions over the same haystack (LoCoMo's: one conversation, many
questions) share a conversation id, so a paired bootstrap resamples them together; a haystack
that appears in both a train and a test file is counted in the report (``notes``), because the
release's split then does not hold its conversations apart.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memsifter.data._json import need, read_json
from memsifter.data.dataset import LoadReport, MemoryDataset
from memsifter.data.longmemeval import check_answer_ids, session_of
from memsifter.data.types import Query, Session
from memsifter.errors import DataError

SOURCE = "memsifter-datasets"
RELEASE_SPLITS: tuple[str, ...] = ("train", "test")
SUFFIXES: tuple[str, ...] = (".parquet", ".jsonl", ".json")


def _in_order(files: list[Path]) -> list[Path]:
    """Train before test, then any other file by name: ids are given in the order met, so a
    dataset's ids do not depend on which split's file sorts first."""
    rank = {s: i for i, s in enumerate(RELEASE_SPLITS)}
    return sorted(files, key=lambda p: (rank.get(p.stem, len(rank)), p.name))


def _files(path: Path) -> list[tuple[str, Path]]:
    """``(dataset name, file)`` for every data file under ``path`` (module doc, "Layout")."""
    if not path.exists():
        raise DataError("file or folder not found", file=str(path))
    if path.is_file():
        if path.suffix not in SUFFIXES:
            raise DataError(
                f"not a data file of the release: expected one of {', '.join(SUFFIXES)}",
                file=str(path),
            )
        return [(path.parent.name, path)]
    own = _in_order([p for p in path.iterdir() if p.is_file() and p.suffix in SUFFIXES])
    if own:
        return [(path.name, p) for p in own]
    nested = [
        (d.name, p)
        for d in sorted(x for x in path.iterdir() if x.is_dir())
        for p in _in_order([f for f in d.iterdir() if f.is_file() and f.suffix in SUFFIXES])
    ]
    if not nested:
        raise DataError(
            f"no data files ({', '.join(SUFFIXES)}) here or in its dataset folders",
            file=str(path),
        )
    return nested


def _rows(file: Path) -> Iterator[dict[str, Any]]:
    if file.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as e:  # pyarrow comes with the train extra (datasets)
            raise DataError(
                "reading parquet needs pyarrow (pip install 'memsifter[train]')", file=str(file)
            ) from e
        try:
            table = pq.read_table(file)
        except Exception as e:  # pyarrow raises its own errors for a damaged file
            raise DataError(f"not a readable parquet file: {e}", file=str(file)) from e
        yield from table.to_pylist()
    elif file.suffix == ".jsonl":
        for n, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"invalid JSON: {e.msg}", file=str(file), record=f"line {n}") from e
    else:
        data = read_json(file)
        if not isinstance(data, list):
            raise DataError(f"expected a list of rows, got {type(data).__name__}", file=str(file))
        yield from data


def _parallel(row: dict[str, Any], key: str, n: int, *, file: str, record: str) -> list | None:
    """An optional column parallel to the sessions; its length must match theirs."""
    val = need(row, key, list, file=file, record=record, default=None)
    if val is not None and len(val) != n:
        raise DataError(
            f"{len(val)} entries for {n} haystack sessions", file=file, record=record, field=key
        )
    return val


class _Pool:
    """Session ids made unique within a dataset (module doc, "Ids")."""

    def __init__(self) -> None:
        self.by_id: dict[str, list[Session]] = {}
        self.renamed = 0

    def session(
        self, dataset: str, sid: str, date_text: str | None, raw: Any, *, file: str, record: str
    ) -> Session:
        base = f"{dataset}:{sid}"
        session = session_of(base, date_text, raw, file=file, record=record)
        seen = self.by_id.setdefault(base, [])
        content = [(t.speaker, t.text) for t in session.turns]
        for s in seen:
            if s.date_text == date_text and [(t.speaker, t.text) for t in s.turns] == content:
                return s
        if seen:  # another session under this id: its own, numbered in the order met
            self.renamed += 1
            session = session_of(f"{base}#{len(seen) + 1}", date_text, raw, file=file,
                                 record=record)  # fmt: skip
        seen.append(session)
        return session


def _sessions_of(row: dict[str, Any], *, file: str, record: str) -> list:
    raw = row.get("haystack_sessions")
    if isinstance(raw, str):  # the official pipeline JSON-encodes the sessions for parquet
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as e:
            raise DataError(
                f"haystack_sessions is a string but not JSON: {e.msg}",
                file=file,
                record=record,
                field="haystack_sessions",
            ) from e
        row = {**row, "haystack_sessions": raw}
    return need(row, "haystack_sessions", list, file=file, record=record)


def load_memsifter_datasets(path: str | Path) -> MemoryDataset:
    """Every question under ``path`` (module doc)."""
    report = LoadReport(source=SOURCE)
    queries: list[Query] = []
    splits: dict[str, str] = {}
    pools: dict[str, _Pool] = {}
    haystack_splits: dict[str, set[str]] = {}
    for dataset, file_path in _files(Path(path)):
        file = str(file_path)
        split = file_path.stem if file_path.stem in RELEASE_SPLITS else None
        pool = pools.setdefault(dataset, _Pool())
        for i, row in enumerate(_rows(file_path)):
            qid = f"{dataset}/{file_path.stem}/{row.get('question_id', i)}"
            raw_sessions = _sessions_of(row, file=file, record=qid)
            n = len(raw_sessions)
            ids = [str(x) for x in need(row, "haystack_session_ids", list, file=file, record=qid)]
            if len(ids) != n:
                raise DataError(
                    f"{len(ids)} session ids for {n} haystack sessions",
                    file=file,
                    record=qid,
                    field="haystack_session_ids",
                )
            dates = _parallel(row, "haystack_dates", n, file=file, record=qid) or [None] * n
            sims = _parallel(row, "similarities", n, file=file, record=qid)
            haystack = [
                pool.session(dataset, sid, d, raw, file=file, record=f"{qid}/{sid}")
                for sid, d, raw in zip(ids, dates, raw_sessions, strict=True)
            ]
            answer_ids = [
                str(a) for a in need(row, "answer_session_ids", list, file=file, record=qid)
            ]
            check_answer_ids(answer_ids, ids, file=file, record=qid)
            ours = dict(zip(ids, (s.id for s in haystack), strict=True))
            gold = tuple(dict.fromkeys(ours[a] for a in answer_ids))
            if not gold:
                report.no_evidence_qids.append(qid)
            answer = row.get("answer", row.get("gold_answer"))
            if answer is None:
                raise DataError("missing required field", file=file, record=qid, field="answer")
            fingerprint = hashlib.sha1("\0".join(s.id for s in haystack).encode()).hexdigest()
            conversation = f"{dataset}:{fingerprint[:12]}"
            haystack_splits.setdefault(conversation, set()).add(split or "-")
            meta: dict[str, Any] = {"dataset": dataset, "answer_session_ids": answer_ids}
            if sims is not None:
                meta["similarities"] = {s.id: float(x) for s, x in zip(haystack, sims, strict=True)}
            queries.append(
                Query(
                    qid=qid,
                    question=need(row, "question", str, file=file, record=qid),
                    answer=str(answer),
                    haystack=tuple(haystack),
                    gold_session_ids=gold,
                    question_date=need(
                        row, "question_date", str, file=file, record=qid, default=None
                    ),
                    category=need(row, "question_type", str, file=file, record=qid, default=None),
                    source=SOURCE,
                    conversation_id=conversation,
                    meta=meta,
                )
            )
            if split is not None:
                splits[conversation] = split
    shared = sorted(c for c, where in haystack_splits.items() if {"train", "test"} <= where)
    for c in shared:
        splits.pop(c, None)  # neither split can claim it: the recipe must say
    if shared:
        report.notes.append(
            f"{len(shared)} haystacks appear in both a train and a test file; their questions "
            "are left without a split"
        )
    renamed = sum(p.renamed for p in pools.values())
    if renamed:
        report.notes.append(
            f"{renamed} sessions share an id with another session of their dataset and were "
            "renamed id#k"
        )
    report.n_questions = len(queries)
    report.n_sessions = sum(len(v) for p in pools.values() for v in p.by_id.values())
    conversations: dict[str, tuple[Session, ...]] = {}
    for q in queries:
        conversations.setdefault(q.conversation_id or q.qid, q.haystack)
    return MemoryDataset(queries=queries, conversations=conversations, report=report, splits=splits)


__all__ = ["RELEASE_SPLITS", "SOURCE", "load_memsifter_datasets"]
