"""Typed errors. Bad input must say *where* it is bad: the file, the record and the field."""

from __future__ import annotations


class MemSifterError(Exception):
    """Base class for every error this package raises on purpose."""


class DataError(MemSifterError, ValueError):
    """A data file or record is malformed.

    The message always names the file (or ``<memory>``), the record and the field, so a user
    can find the bad line in a 3 MB JSON without a debugger.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        record: str | int | None = None,
        field: str | None = None,
    ) -> None:
        self.file = file or "<memory>"
        self.record = record
        self.field = field
        where = [f"file={self.file}"]
        if record is not None:
            where.append(f"record={record}")
        if field is not None:
            where.append(f"field={field}")
        super().__init__(f"{message} [{', '.join(where)}]")


class UnknownNameError(MemSifterError, KeyError):
    """A retriever, model or session id that does not exist was asked for."""

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return str(self.args[0]) if self.args else ""


class PromptBudgetError(MemSifterError, ValueError):
    """A proxy prompt cannot fit its token window; the message names every size involved."""
