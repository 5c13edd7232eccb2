"""Small helpers that turn a missing or mistyped JSON field into a DataError naming it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from memsifter.errors import DataError

_MISSING = object()


def read_json(path: str | Path) -> Any:
    """The JSON in ``path``; a ``.gz`` file is gunzipped first (LongMemEval-S ships compressed:
    277 MB of JSON, about a tenth of that gzipped)."""
    p = Path(path)
    if not p.exists():
        raise DataError("file not found", file=str(p))
    try:
        raw = gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
        return json.loads(raw.decode("utf-8"))
    except (gzip.BadGzipFile, EOFError) as e:
        raise DataError(f"not a complete gzip file: {e}", file=str(p)) from e
    except UnicodeDecodeError as e:
        raise DataError(f"file is not UTF-8: {e}", file=str(p)) from e
    except json.JSONDecodeError as e:
        raise DataError(
            f"invalid JSON at line {e.lineno} col {e.colno}: {e.msg}", file=str(p)
        ) from e


def need(
    obj: Any,
    key: str,
    typ: type | tuple[type, ...],
    *,
    file: str,
    record: str | int,
    default: Any = _MISSING,
) -> Any:
    """``obj[key]`` checked against ``typ``; a DataError names file, record and field otherwise."""
    if not isinstance(obj, dict):
        raise DataError(f"expected an object, got {type(obj).__name__}", file=file, record=record)
    if key not in obj or obj[key] is None:
        if default is not _MISSING:
            return default
        raise DataError("missing required field", file=file, record=record, field=key)
    val = obj[key]
    if not isinstance(val, typ) or (isinstance(val, bool) and bool not in _as_tuple(typ)):
        names = "/".join(t.__name__ for t in _as_tuple(typ))
        raise DataError(
            f"expected {names}, got {type(val).__name__}", file=file, record=record, field=key
        )
    return val


def _as_tuple(typ: type | tuple[type, ...]) -> tuple[type, ...]:
    return typ if isinstance(typ, tuple) else (typ,)
