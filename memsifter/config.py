"""YAML configs loaded into typed dataclasses. Unknown keys and wrong types are errors that name
the file and the key, so a typo in a config never silently falls back to a default.

A field documents itself once, with :func:`setting` (``metadata["help"]``, where TRL's and
Hugging Face's argument parsers read it): :mod:`memsifter.config_cli` turns that into the flag's
help, and checks a flag's value with :func:`check_value`, as a YAML line for the key would be."""

from __future__ import annotations

import copy
import dataclasses
import re
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from memsifter.errors import DataError

T = TypeVar("T")
_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def setting(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
) -> Any:
    """A config dataclass field with its help text: the one place the field is documented, for
    readers of the dataclass and of ``--help`` alike."""
    return dataclasses.field(
        default=default, default_factory=default_factory, metadata={"help": help}
    )


def check_value(value: Any, hint: Any, *, file: str, key: str) -> Any:
    """``value`` checked against the type ``hint`` (an int read as a float, a list as a tuple, a
    mapping as a nested dataclass); a mismatch is a :class:`DataError` naming ``file`` and
    ``key``."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arm in typing.get_args(hint):
            try:
                return check_value(value, arm, file=file, key=key)
            except DataError as e:
                errors.append(str(e))
        raise DataError(f"value {value!r} matches none of {hint}", file=file, field=key)
    if hint is type(None):
        if value is None:
            return None
        raise DataError("expected null", file=file, field=key)
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise DataError(f"expected a list, got {type(value).__name__}", file=file, field=key)
        (arm, *_) = typing.get_args(hint) or (Any,)
        items = [check_value(v, arm, file=file, key=f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise DataError(f"expected a mapping, got {type(value).__name__}", file=file, field=key)
        return dict(value)
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, file=file, prefix=f"{key}.")
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if (
        isinstance(hint, type)
        and not isinstance(value, hint)
        or (hint is not bool and isinstance(value, bool))
    ):
        raise DataError(
            f"expected {getattr(hint, '__name__', hint)}, got {type(value).__name__}",
            file=file,
            field=key,
        )
    return value


def from_dict(cls: type[T], data: Any, *, file: str = "<memory>", prefix: str = "") -> T:
    if not isinstance(data, dict):
        raise DataError(f"expected a mapping for {cls.__name__}", file=file, field=prefix or None)
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - fields)
    if unknown:
        raise DataError(
            f"unknown key(s) {unknown}; valid keys: {sorted(fields)}",
            file=file,
            field=prefix + unknown[0],
        )
    kwargs = {k: check_value(v, hints[k], file=file, key=prefix + k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except DataError:
        raise
    except ValueError as e:  # a dataclass's own validation (__post_init__): say which file
        raise DataError(str(e), file=file, field=prefix.rstrip(".") or None) from e


def apply_overrides(data: dict[str, Any], overrides: Sequence[str], *, file: str) -> dict[str, Any]:
    """``KEY=VALUE`` overrides on a loaded YAML mapping: dotted keys reach nested sections
    (``epochs.max_steps=12``) and each value is parsed as YAML (``null``, ``1e-5``, ``[1, 2]``).
    Unknown keys are left for :func:`from_dict` to refuse, naming them."""
    out = copy.deepcopy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise DataError(f"override {item!r} is not KEY=VALUE", file=file)
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as e:
            raise DataError(f"override {item!r}: invalid YAML value: {e}", file=file) from e
        if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
            value = float(value)  # YAML 1.1 reads 2e-5 (no dot) as a string; a shell user won't
        *parents, leaf = key.strip().split(".")
        node = out
        for i, part in enumerate(parents):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise DataError(
                    f"override {item!r}: {'.'.join(parents[: i + 1])} is not a section",
                    file=file,
                    field=key,
                )
            node = child
        node[leaf] = value
    return out


def read_yaml(path: str | Path) -> Any:
    """A config file's YAML (an empty file reads as ``{}``); a missing file or bad YAML is a
    :class:`DataError` naming the file."""
    p = Path(path)
    if not p.exists():
        raise DataError("config file not found", file=str(p))
    try:
        return yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise DataError(f"invalid YAML: {e}", file=str(p)) from e


def load_config(cls: type[T], path: str | Path, overrides: Sequence[str] = ()) -> T:
    p = Path(path)
    data = read_yaml(p)
    if overrides:
        if not isinstance(data, dict):
            raise DataError(f"expected a mapping for {cls.__name__}", file=str(p))
        data = apply_overrides(data, overrides, file=str(p))
    return from_dict(cls, data, file=str(p))
