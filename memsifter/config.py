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


BASE_KEY = "base"


def _read_one(p: Path) -> Any:
    if not p.exists():
        raise DataError("config file not found", file=str(p))
    try:
        return yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise DataError(f"invalid YAML: {e}", file=str(p)) from e


def _merge_onto(base: dict[str, Any], child: dict[str, Any], *, file: str, at: str) -> dict:
    """``child``'s values over ``base``'s: mappings merge key by key, anything else replaces. A
    key the base lacks is refused: an inheriting recipe only states how it differs."""
    out = dict(base)
    for key, value in child.items():
        where = f"{at}.{key}" if at else key
        if key not in base:
            raise DataError(
                f"{where} is not in the base config: an inheriting config may only change what "
                f"its base states (base keys here: {', '.join(map(str, base)) or 'none'})",
                file=file,
                field=where,
            )
        if isinstance(base[key], dict) and isinstance(value, dict):
            out[key] = _merge_onto(base[key], value, file=file, at=where)
        else:
            out[key] = value
    return out


def read_yaml(path: str | Path, _chain: tuple[Path, ...] = ()) -> Any:
    """A config file's YAML (an empty file reads as ``{}``); a missing file or bad YAML is a
    :class:`DataError` naming the file.

    A mapping with ``base: OTHER.yaml`` (a path relative to this file's folder) inherits: it is
    the base's values with this file's merged over them (:func:`_merge_onto`), so an ablation
    states only what it changes. A missing or circular base, and a key the base lacks, are
    errors naming the file and the key."""
    p = Path(path)
    data = _read_one(p)
    if not isinstance(data, dict) or BASE_KEY not in data:
        return data
    raw = data.pop(BASE_KEY)
    if not isinstance(raw, str) or not raw:
        raise DataError("base must be a config file's path", file=str(p), field=BASE_KEY)
    base_path = (p.parent / raw).resolve()
    chain = (*_chain, p.resolve())
    if base_path in chain:
        loop = " -> ".join(str(c) for c in (*chain, base_path))
        raise DataError(f"circular base: {loop}", file=str(p), field=BASE_KEY)
    if not base_path.is_file():
        raise DataError(f"base config {raw!r} not found ({base_path})", file=str(p), field=BASE_KEY)
    base = read_yaml(base_path, chain)
    if not isinstance(base, dict):
        raise DataError(f"base config {raw!r} is not a mapping", file=str(p), field=BASE_KEY)
    return _merge_onto(base, data, file=str(p), at="")


def load_config(cls: type[T], path: str | Path, overrides: Sequence[str] = ()) -> T:
    p = Path(path)
    data = read_yaml(p)
    if overrides:
        if not isinstance(data, dict):
            raise DataError(f"expected a mapping for {cls.__name__}", file=str(p))
        data = apply_overrides(data, overrides, file=str(p))
    return from_dict(cls, data, file=str(p))
