"""Loader for the official LoCoMo ``locomo10.json`` (Maharana et al., ACL 2024).

Gold sessions come from evidence dialogue ids ``DN:M`` (session N, turn M). The released file has
malformed evidence that we repair or count, never drop silently:

* several ids in one string (``"D8:6; D9:17"``, ``"D9:1 D4:4 D4:6"``): every id is used;
* a stray colon (``"D:11:26"``): read as ``D11:26``;
* a bare ``"D"`` or an id naming a session the conversation does not have: unusable, counted.

Category 5 is adversarial: its gold answer is ``adversarial_answer``.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from memsifter.data._json import need, read_json
from memsifter.data.dataset import LoadReport, MemoryDataset
from memsifter.data.dates import parse_date_field
from memsifter.data.types import Query, Session, Turn
from memsifter.errors import DataError

CATEGORY_NAMES = {
    "1": "multi-hop",
    "2": "temporal",
    "3": "open-domain",
    "4": "single-hop",
    "5": "adversarial",
}

_STRICT_ID = re.compile(r"D(\d+):(\d+)")
# Accepts the strict form and the "D:11:26" typo; one string may hold several ids.
_LOOSE_ID = re.compile(r"D:?(\d+):(\d+)")
_SESSION_KEY = re.compile(r"session_(\d+)$")


def session_id(sample_id: str, n: int) -> str:
    return f"{sample_id}/session_{n}"


def parse_evidence(items: list[str]) -> tuple[list[int], Counter[str], Counter[str]]:
    """Session numbers named by evidence strings, plus counters of repaired and unusable strings."""
    sessions: list[int] = []
    repaired: Counter[str] = Counter()
    unusable: Counter[str] = Counter()
    for raw in items:
        raw_s = str(raw).strip()
        try:
            if _STRICT_ID.fullmatch(raw_s):
                sessions.append(int(_STRICT_ID.fullmatch(raw_s).group(1)))  # type: ignore[union-attr]
                continue
            found = [int(s) for s, _ in _LOOSE_ID.findall(raw_s)]
        except ValueError:  # a number past int()'s digit limit names no session we could have
            found = []
        if found:
            repaired[raw_s] += 1
            sessions.extend(found)
        else:
            unusable[raw_s] += 1
    return sessions, repaired, unusable


def _turn(raw: object, *, file: str, record: str) -> Turn:
    speaker = need(raw, "speaker", str, file=file, record=record)
    text = need(raw, "text", str, file=file, record=record, default="")
    caption = need(raw, "blip_caption", str, file=file, record=record, default=None)
    if caption:
        # Images are part of what was said; the caption is the only text we have of them.
        text = f"{text} [shares an image: {caption}]".strip()
    return Turn(
        speaker=speaker,
        text=text,
        turn_id=need(raw, "dia_id", str, file=file, record=record, default=None),
    )


def load_locomo(path: str | Path) -> MemoryDataset:
    file = str(path)
    data = read_json(path)
    if not isinstance(data, list):
        raise DataError(f"expected a list of samples, got {type(data).__name__}", file=file)

    conversations: dict[str, tuple[Session, ...]] = {}
    queries: list[Query] = []
    report = LoadReport(source="locomo")

    for i, sample in enumerate(data):
        sample_id = need(sample, "sample_id", str, file=file, record=i)
        conv = need(sample, "conversation", dict, file=file, record=sample_id)
        qa = need(sample, "qa", list, file=file, record=sample_id)

        numbers = sorted(int(m.group(1)) for k in conv if (m := _SESSION_KEY.fullmatch(k)))
        sessions = []
        for n in numbers:
            rec = f"{sample_id}/session_{n}"
            raw_turns = need(conv, f"session_{n}", list, file=file, record=sample_id)
            date_text = need(
                conv, f"session_{n}_date_time", str, file=file, record=sample_id, default=None
            )
            date = parse_date_field(
                date_text, file=file, record=sample_id, field=f"session_{n}_date_time"
            )
            turns = tuple(
                _turn(t, file=file, record=f"{rec}/turn_{j}") for j, t in enumerate(raw_turns)
            )
            sessions.append(
                Session(
                    id=session_id(sample_id, n),
                    turns=turns,
                    date=date,
                    date_text=date_text,
                    conversation_id=sample_id,
                )
            )
        conversations[sample_id] = tuple(sessions)
        known = set(numbers)

        for j, q in enumerate(qa):
            rec = f"{sample_id}/qa_{j}"
            category = need(q, "category", int, file=file, record=rec)
            question = need(q, "question", str, file=file, record=rec)
            if category == 5 and "adversarial_answer" in q:
                answer = q["adversarial_answer"]
            else:
                answer = need(q, "answer", (str, int, float), file=file, record=rec)
            evidence = need(q, "evidence", list, file=file, record=rec, default=[])
            nums, repaired, unusable = parse_evidence(evidence)
            for n in nums:
                if n not in known:
                    unusable[f"D{n}:* (no such session)"] += 1
            report.repaired_evidence.update(repaired)
            report.unusable_evidence.update(unusable)
            gold = tuple(dict.fromkeys(session_id(sample_id, n) for n in nums if n in known))
            qid = f"{sample_id}/q{j}"
            if not gold:
                report.no_evidence_qids.append(qid)
            queries.append(
                Query(
                    qid=qid,
                    question=question,
                    answer=str(answer),
                    haystack=tuple(sessions),
                    gold_session_ids=gold,
                    question_date=None,
                    category=str(category),
                    source="locomo",
                    conversation_id=sample_id,
                    meta={"evidence": list(evidence)},
                )
            )

    report.n_questions = len(queries)
    report.n_sessions = sum(len(v) for v in conversations.values())
    return MemoryDataset(queries=queries, conversations=conversations, report=report)
