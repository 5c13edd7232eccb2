"""Parse the date spellings of LoCoMo ("1:56 pm on 8 May, 2023") and LongMemEval
("2023/05/20 (Sat) 02:21") into datetimes, keeping the original text for prompts."""

from __future__ import annotations

from datetime import datetime

from dateutil import parser as _dateparser

from memsifter.errors import DataError


def parse_date(text: str | None) -> datetime | None:
    """Best-effort parse; ``None`` for an empty value. Raises ValueError on garbage so the loader
    can attach the file/record/field to the message."""
    if text is None or not str(text).strip():
        return None
    cleaned = str(text).replace(" on ", " ")
    return _dateparser.parse(cleaned, fuzzy=True)


def parse_date_field(
    text: str | None, *, file: str, record: str | int, field: str
) -> datetime | None:
    """``parse_date`` for loaders: garbage becomes a DataError naming file, record and field."""
    try:
        return parse_date(text)
    except (ValueError, OverflowError) as e:
        raise DataError(f"unparseable date {text!r}", file=file, record=record, field=field) from e
