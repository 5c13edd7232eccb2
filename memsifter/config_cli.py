"""Command-line options generated from a config dataclass, as TRL's ``TrlParser`` builds its
arguments from a trainer's config: one ``--kebab-name`` option per field, with the field's type,
default and help (``metadata["help"]``, :func:`memsifter.config.setting`). A field added to a
config is a flag of every command built from it, with no edit to :mod:`memsifter.cli`.

A command's config is built in the order a reader expects: the dataclass's defaults, then the
``--config`` YAML file, then every option the user typed. "Typed" is click's parameter source, so
``--seed 0`` overrides a file's ``seed: 3`` even though 0 is the default, and an option left out
keeps the file's value. A typed value is checked as a YAML line for the same key would be
(:func:`memsifter.config.check_value`), and the whole mapping goes through
:func:`memsifter.config.from_dict`, so the file's unknown keys and wrong types are named errors.

Types a flag can carry: ``str``, ``int``, ``float``, ``bool`` (``--x/--no-x``), ``Path``, a
``Literal`` of choices, each optional, or a ``list`` of one (a repeatable flag). In a union with a
mapping (``dict | str``) the flag takes the scalar arm. Anything else (a mapping, a nested
dataclass) has no flag; the command's help names those fields, and the YAML sets them. Where a
command's flag predates this module and differs from the field, a :class:`Flag` keeps it: another
name (``--retriever`` for ``retrievers``), one comma-separated value for a list
(``--conversations 8,9``), a parser for each value (``--model NAME=PATH``), its own help, or no
flag at all (a field the command fills itself).

A command may keep options that are no field (``serve --port``): the decorated function's own
parameters after ``cfg``, declared as typer parameters, are passed through to it; a parameter
named ``config`` receives the config file's path. ``config_param`` declares the config itself
differently (``train CONFIG`` is positional, ``data rl --recipe`` required), and ``load`` reads
it (a default file, ``--set`` overrides applied).
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn, TypeVar

import typer

from memsifter.config import check_value, from_dict, read_yaml
from memsifter.errors import DataError, MemSifterError

T = TypeVar("T")
SCALARS = (str, int, float, bool, Path)
COMMAND_LINE = "command line"  # the "file" that errors in a typed value name
_RESERVED = ("ctx", "config")  # the wrapper's own parameters
_UNSET: Any = object()  # Flag.default not given (dataclasses.MISSING would mean "no default")


@dataclass(frozen=True)
class Flag:
    """How a command shows one config field, where it differs from ``--field-name``."""

    name: str | None = None  # the flag, e.g. "--retriever" for the field retrievers
    comma: bool = False  # a list given as one comma-separated value: --conversations 8,9
    parse: Callable[[str, str], Any] | None = None  # (value, flag) -> an item of the field
    default: Any = _UNSET  # the command's default, under the --config file's value
    help: str | None = None  # instead of the field's metadata["help"]
    off: bool = False  # no flag: the command sets this field itself (train's source)


@dataclass(frozen=True)
class ConfigOption:
    """One config field's option on a command."""

    field: str
    flag: str
    item: Any  # the type click parses each value as
    repeatable: bool
    default: Any  # click's default: shown in --help, never applied (see module docstring)
    help: str
    spec: Flag

    def parameter(self) -> inspect.Parameter:
        annotation: Any = list[self.item] if self.repeatable else self.item
        toggle = self.item is bool and not self.repeatable
        decls = [f"{self.flag}/--no-{self.flag[2:]}"] if toggle else [self.flag]
        return inspect.Parameter(
            self.field,
            inspect.Parameter.KEYWORD_ONLY,
            default=self.default,
            annotation=Annotated[annotation | None, typer.Option(*decls, help=self.help)],
        )

    def value(self, raw: Any) -> Any:
        """The field's value from what click parsed."""
        if self.spec.comma:
            return [part.strip() for part in raw.split(",")]
        if self.spec.parse:
            parse = self.spec.parse
            return [parse(v, self.flag) for v in raw] if self.repeatable else parse(raw, self.flag)
        return list(raw) if self.repeatable else raw


def _arms(hint: Any) -> tuple[Any, ...]:
    """A union's arms other than None; ``(hint,)`` for anything else."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return tuple(a for a in typing.get_args(hint) if a is not type(None))
    return (hint,)


def _scalar(hint: Any) -> Any | None:
    """The one scalar type a flag can give a value of ``hint`` as, or None."""
    found = [a for a in _arms(hint) if a in SCALARS or typing.get_origin(a) is Literal]
    return found[0] if len(found) == 1 else None


def _is_list(hint: Any) -> bool:
    arms = _arms(hint)
    return len(arms) == 1 and typing.get_origin(arms[0]) in (list, tuple)


def _flag_type(hint: Any) -> tuple[Any, bool] | None:
    """``(item type, repeatable)`` of a field a flag can set, or None (the YAML only)."""
    if not _is_list(hint):
        item = _scalar(hint)
        return None if item is None else (item, False)
    (container,) = _arms(hint)
    args = typing.get_args(container)
    if typing.get_origin(container) is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        return None  # a fixed-length tuple is a record, not a list
    item = _scalar(args[0]) if args else str
    return None if item is None else (item, True)


def _field_default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def _click_default(value: Any, spec: Flag, is_list: bool) -> Any:
    if value is MISSING or value is None or spec.parse:
        return None
    if spec.comma:
        return ",".join(map(str, value)) or None
    if is_list:
        return list(value) or None
    return value


def config_flags(
    cls: type[Any], flags: Mapping[str, Flag] | None = None
) -> tuple[list[ConfigOption], list[str]]:
    """The options a command built from ``cls`` shows, and the fields only its YAML can set."""
    flags = dict(flags or {})
    fields = dataclasses.fields(cls)
    unknown = sorted(set(flags) - {f.name for f in fields})
    if unknown:
        raise ValueError(f"flags for unknown fields of {cls.__name__}: {unknown}")
    hints = typing.get_type_hints(cls)
    options, yaml_only = [], []
    for f in fields:
        if f.name in _RESERVED:
            raise ValueError(f"{cls.__name__}.{f.name}: the name of the command's own parameter")
        spec = flags.get(f.name, Flag())
        if spec.off:
            continue
        hint = hints[f.name]
        kind = (str, _is_list(hint)) if spec.parse else _flag_type(hint)
        if kind is None:
            yaml_only.append(f.name)
            continue
        item, is_list = kind
        if spec.comma and not is_list:
            raise ValueError(f"{cls.__name__}.{f.name}: a comma flag needs a list field")
        default = spec.default if spec.default is not _UNSET else _field_default(f)
        text = spec.help if spec.help is not None else f.metadata.get("help", "")
        if spec.comma:
            text = f"comma-separated: {text}"
        elif is_list:
            text += " (repeatable)"
        if default is MISSING:
            text += " (required, here or in --config)"
        options.append(
            ConfigOption(
                field=f.name,
                flag=spec.name or "--" + f.name.replace("_", "-"),
                item=str if spec.comma else item,
                repeatable=is_list and not spec.comma,
                default=_click_default(default, spec, is_list),
                help=text,
                spec=spec,
            )
        )
    return options, yaml_only


def build_config(
    cls: type[T],
    config: str | Path | None,
    given: Mapping[str, Any],
    *,
    defaults: Mapping[str, Any] | None = None,
    flags: Mapping[str, str] | None = None,
    load: Callable[[Path | None], Any] | None = None,
) -> T:
    """The config a command runs: ``cls``'s defaults, the command's own ``defaults``, the YAML
    file ``config`` (read by ``load`` when given), then ``given`` (field -> a typed value), each
    over the one before."""
    hints = typing.get_type_hints(cls)
    data: dict[str, Any] = dict(defaults or {})
    if config is not None or load is not None:
        loaded = load(Path(config) if config is not None else None) if load else read_yaml(config)
        if not isinstance(loaded, dict):
            raise DataError(f"expected a mapping for {cls.__name__}", file=str(config))
        data.update(loaded)
    for name, value in given.items():
        data[name] = check_value(value, hints[name], file=COMMAND_LINE, key=name)
    flags = flags or {}
    missing = [
        f.name
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if _field_default(f) is MISSING and f.name not in data
    ]
    if missing:
        wanted = ", ".join(flags.get(m, m) for m in missing)
        raise DataError(f"missing {wanted} (give it, or set {missing[0]} in --config)")
    return from_dict(cls, data, file=str(config) if config is not None else COMMAND_LINE)


def _typed(ctx: typer.Context, option: ConfigOption, values: Mapping[str, Any]) -> bool:
    """Whether the user gave ``option`` (click's parameter source, not a comparison with the
    default)."""
    source = ctx.get_parameter_source(option.field)
    if source is None or source.name in ("DEFAULT", "DEFAULT_MAP"):
        return False
    # An empty --conversations "" is no list at all: not given, as before this module.
    return not (option.spec.comma and not values[option.field])


def config_options(
    cls: type[T],
    *,
    flags: Mapping[str, Flag] | None = None,
    config_help: str = "YAML config: any field by name; the flags override it",
    on_error: Callable[[MemSifterError], NoReturn] | None = None,
    config_param: Any = None,
    config_default: Any = None,
    load: Callable[[Path | None, Mapping[str, Any]], Any] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate ``fn(cfg, **own)`` into a typer command whose options are ``cls``'s fields (see
    the module docstring) and ``fn``'s own parameters; ``on_error`` gets a config that cannot be
    built (exit, usually). ``config_param`` (an ``Annotated`` typer type) and ``config_default``
    (``inspect.Parameter.empty``: required) replace the ``--config`` option; ``load(path, own)``
    reads the file's mapping instead of :func:`memsifter.config.read_yaml`."""
    options, yaml_only = config_flags(cls, flags)
    defaults = {
        name: spec.default for name, spec in (flags or {}).items() if spec.default is not _UNSET
    }
    flag_names = {o.field: o.flag for o in options}

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        # The function's own options, resolved here: cli.py's annotations are strings.
        hints = typing.get_type_hints(fn, include_extras=True)
        own = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints[p.name])
            for p in list(inspect.signature(fn).parameters.values())[1:]
            if p.name != "config"
        ]
        clash = sorted({p.name for p in own} & ({o.field for o in options} | {"ctx"}))
        if clash:
            raise ValueError(f"{fn.__name__}: parameters that are also fields: {clash}")
        wants_path = "config" in inspect.signature(fn).parameters

        def command(ctx: typer.Context, config: Path | None = None, **values: Any) -> Any:
            extra = {p.name: values.pop(p.name) for p in own}
            try:
                given = {
                    o.field: o.value(values[o.field]) for o in options if _typed(ctx, o, values)
                }
                reader = None if load is None else (lambda path: load(path, extra))
                cfg = build_config(
                    cls, config, given, defaults=defaults, flags=flag_names, load=reader
                )
            except MemSifterError as e:
                if on_error is None:
                    raise
                on_error(e)
            return fn(cfg, **extra, **({"config": config} if wants_path else {}))

        params = [
            inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context),
            inspect.Parameter(
                "config",
                inspect.Parameter.KEYWORD_ONLY,
                default=config_default,
                annotation=config_param or Annotated[Path | None, typer.Option(help=config_help)],
            ),
            *(o.parameter() for o in options),
            *own,
        ]
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__name__ = fn.__name__
        command.__qualname__ = fn.__qualname__
        command.__module__ = fn.__module__
        doc = inspect.cleandoc(fn.__doc__ or "")
        if yaml_only:
            doc += f"\n\nSet in the config file only (no flag): {', '.join(yaml_only)}."
        command.__doc__ = doc
        return command

    return decorate


__all__ = ["ConfigOption", "Flag", "build_config", "config_flags", "config_options"]
