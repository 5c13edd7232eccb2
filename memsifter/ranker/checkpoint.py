"""A trained proxy's prompt contract on disk: saved with every checkpoint, read back, resolved
against explicit settings, and compared, all here.

A proxy is only right on the prompt it was trained on, so its
:class:`~memsifter.ranker.spec.PromptSpec` travels with the weights as ``prompt_spec.json``:
``memsifter data rl`` writes it next to the data, training into every model folder it makes (each
checkpoint, average, SFT result and exported adapter), all through :func:`save_spec`.
:func:`resolve_spec` is how every reader (validation, ``memsifter eval``, the benchmarks, the
recall service, through :meth:`~memsifter.ranker.proxy.Proxy.from_pretrained`) settles which
prompt a model is shown: its own spec, as is, or for a model without one (an untrained base) the
settings the caller states. A model with neither is refused, and so are explicit settings that
contradict its own spec; :func:`spec_differences` is the one comparison behind every such refusal.

:mod:`memsifter.models` opens models and never reads this file; it only keeps it in the merged
copy of an adapter (``memsifter.models.CARRIED_FILES``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memsifter.errors import DataError, MemSifterError
from memsifter.ranker.official import PRESET as OFFICIAL_PRESET
from memsifter.ranker.official import SETTINGS as OFFICIAL_SETTINGS
from memsifter.ranker.official import looks_released
from memsifter.ranker.spec import DEFAULT_LABELS, DEFAULT_TEMPLATE, PromptSpec

logger = logging.getLogger(__name__)

SPEC_FILE = "prompt_spec.json"
# Settable besides the spec's own fields: the prompt budget, window - completion (the
# ``--coarse-budget`` of eval), checked against the spec like any field.
PROMPT_KEYS: tuple[str, ...] = (*(f.name for f in dataclasses.fields(PromptSpec)), "budget_tokens")

# Explicit prompt settings: a mapping of fields, a whole spec, or a prompt_spec.json (the file
# or the folder holding it: an RL data folder, a checkpoint).
PromptSettings = Mapping[str, Any] | PromptSpec | str | Path | None


class PromptSpecError(MemSifterError, ValueError):
    """No prompt spec for a model, or explicit prompt settings that contradict its own."""


def save_spec(spec: PromptSpec, folder: str | Path) -> Path:
    """Write ``spec`` into ``folder`` (made if missing): the one writer of ``prompt_spec.json``."""
    path = Path(folder) / SPEC_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spec.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def has_spec(folder: str | Path) -> bool:
    return (Path(folder) / SPEC_FILE).is_file()


def read_spec(folder: str | Path) -> PromptSpec:
    """The spec a folder (checkpoint, adapter, RL data folder) was made with. A folder without
    one is refused: serving or evaluating a model on a prompt it was not trained on is silently
    wrong."""
    path = Path(folder) / SPEC_FILE
    if not path.is_file():
        raise DataError(
            f"{folder} has no {SPEC_FILE}: a proxy checkpoint must carry the prompt it was "
            "trained on (pass an explicit prompt spec for an untrained model)",
            file=str(folder),
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(f"{SPEC_FILE} is not valid JSON: {e}", file=str(path)) from e
    if not isinstance(data, dict):
        raise DataError(f"{SPEC_FILE} must hold an object", file=str(path))
    return PromptSpec.from_dict(data, str(path))


BASE_OF_FILE = "base_of.json"


def as_base(checkpoint: str | Path, out: str | Path) -> Path:
    """``checkpoint``'s weights as an untrained base for a new ranker, in ``out``: its files
    without its prompt spec, so a run that starts there is shown its own data's prompt (a
    written ranking on a first-token head's weights, say), and ``base_of.json`` naming the
    checkpoint and the spec it was trained with. Starting a new form from trained weights is
    the caller's choice, made here by name; a checkpoint's spec is never dropped elsewhere."""
    import shutil

    src, dst = Path(checkpoint), Path(out)
    if not (src / "config.json").is_file():
        raise DataError("not a model folder (no config.json)", file=str(src))
    if (src / "adapter_config.json").is_file():
        raise DataError("an adapter: merge or average it into a model folder first", file=str(src))
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name not in (SPEC_FILE, BASE_OF_FILE):
            shutil.copy2(f, dst / f.name)
    record = {
        "checkpoint": str(src.resolve()),
        "spec": read_spec(src).to_dict() if has_spec(src) else None,
    }
    (dst / BASE_OF_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return dst


def spec_file(name_or_path: str | Path) -> Path | None:
    """The ``prompt_spec.json`` a model carries (a trained checkpoint, an adapter, the shipped
    proxy), or None (hub ids and the untrained built-ins carry none). A built-in proxy missing
    from this install raises, as :func:`memsifter.models.resolve_model` does."""
    from memsifter.models import BUILTIN_MODELS, SHIPPED_PROXIES, resolve_model

    name = str(name_or_path)
    if name in BUILTIN_MODELS and name not in SHIPPED_PROXIES:
        return None  # no spec, and resolving would convert or load the model
    resolved = resolve_model(name)
    if resolved.local and has_spec(resolved.path):
        return Path(resolved.path) / SPEC_FILE
    return None


def model_spec(name_or_path: str | Path) -> PromptSpec | None:
    """The spec a model carries (see :func:`spec_file`), or None."""
    path = spec_file(name_or_path)
    return None if path is None else read_spec(path.parent)


def _value(spec: PromptSpec, key: str) -> Any:
    return spec.budget_tokens if key == "budget_tokens" else getattr(spec, key)


def spec_differences(
    spec: PromptSpec, given: Mapping[str, Any] | PromptSpec
) -> dict[str, tuple[Any, Any]]:
    """The keys of ``given`` whose value ``spec`` does not have: ``{key: (spec's, given)}``.
    ``model`` only names whose tokenizer renders, and a checkpoint's folder is another name for
    the same tokenizer, so it is never compared."""
    # A whole spec is compared field by field, the default labelling included (to_dict drops it).
    settings = given.fields() if isinstance(given, PromptSpec) else given
    return {
        k: (_value(spec, k), v)
        for k, v in settings.items()
        if k != "model" and _value(spec, k) != v
    }


def _as_settings(given: PromptSettings, where: str) -> dict[str, Any]:
    """Explicit prompt settings as a mapping of the keys actually given."""
    if given is None:
        return {}
    if isinstance(given, PromptSpec):
        return given.fields()
    if isinstance(given, str) and given == OFFICIAL_PRESET and not Path(given).exists():
        return dict(OFFICIAL_SETTINGS)  # the released model's prompt (memsifter.ranker.official)
    if isinstance(given, str | Path):
        path = Path(given).expanduser()
        if path.is_dir():
            path = path / SPEC_FILE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise PromptSpecError(f"{where}: cannot read the prompt spec {path}: {e}") from e
        if not isinstance(data, dict):
            raise PromptSpecError(f"{where}: {path} must hold an object")
        data.setdefault("labels", DEFAULT_LABELS)  # a spec file without the key is digits
        return _as_settings(data, str(path))
    settings = {k: v for k, v in dict(given).items() if v is not None}
    unknown = sorted(set(settings) - set(PROMPT_KEYS))
    if unknown:
        raise PromptSpecError(
            f"{where}: unknown prompt setting(s) {unknown}; valid: {', '.join(PROMPT_KEYS)}"
        )
    return settings


def merge_settings(*sources: tuple[str, PromptSettings]) -> dict[str, Any]:
    """Explicit settings from several places (a ``prompt:`` block, legacy flags), merged; the
    same key given twice with different values is refused, naming both places."""
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    clashes = []
    for where, given in sources:
        for k, v in _as_settings(given, where).items():
            if k in merged and merged[k] != v:
                clashes.append(f"{k}: {merged[k]!r} ({origin[k]}) vs {v!r} ({where})")
            merged.setdefault(k, v)
            origin.setdefault(k, where)
    if clashes:
        raise PromptSpecError("conflicting prompt settings: " + "; ".join(clashes))
    return merged


def resolve_spec(
    model: str | Path,
    given: PromptSettings = None,
    *,
    hint: str = "a `prompt:` block in the config",
) -> PromptSpec:
    """The prompt ``model`` is to be shown.

    * Its folder has ``prompt_spec.json`` (a trained checkpoint, an adapter, the shipped proxy):
      that spec, as is. ``given`` may repeat its values but not contradict them: a difference is
      an error listing every differing field.
    * It has none (an untrained base, a hub id): ``given`` is the spec; fields it leaves out take
      :class:`PromptSpec`'s defaults, ``budget_tokens`` sets the window as budget + completion.
      No ``given`` either: refused, naming the model; ``hint`` says where to give one.
    """
    model = str(model)
    settings = _as_settings(given, "prompt")
    own = model_spec(model)
    if own is not None:
        diff = spec_differences(own, settings)
        if diff:
            listed = "; ".join(
                f"{k}: {v!r} (the model's spec: {o!r})" for k, (o, v) in diff.items()
            )
            raise PromptSpecError(
                f"model {model!r} carries its own {SPEC_FILE}, and the explicit prompt settings "
                f"contradict it: {listed}. Drop them (the model is served the prompt it was "
                "trained on) or change them to match"
            )
        return own
    if not settings:
        raise PromptSpecError(
            f"model {model!r} has no {SPEC_FILE} (an untrained model?), so nothing says which "
            f"prompt to show it: give a prompt spec explicitly ({hint})"
        )
    fields = {k: v for k, v in settings.items() if k != "budget_tokens"}
    fields.setdefault("model", model)
    if looks_released(model) and fields.get("template", DEFAULT_TEMPLATE) != "official":
        logger.warning(
            "model %r is named like the released MemSifter proxy, which was trained on its "
            "authors' prompt: give it prompt 'official' (template: official); it is being shown "
            "template %r",
            model,
            fields.get("template", DEFAULT_TEMPLATE),
        )
    if "budget_tokens" in settings:
        completion = fields.get("completion_tokens", PromptSpec.completion_tokens)
        window = settings["budget_tokens"] + completion
        if "window_tokens" in fields and fields["window_tokens"] != window:
            raise PromptSpecError(
                f"prompt budget_tokens {settings['budget_tokens']} + completion_tokens "
                f"{completion} != window_tokens {fields['window_tokens']}"
            )
        fields["window_tokens"] = window
    try:
        return PromptSpec(**fields)
    except (TypeError, ValueError) as e:
        raise PromptSpecError(f"invalid prompt spec for model {model!r}: {e}") from e


__all__ = [
    "PROMPT_KEYS",
    "SPEC_FILE",
    "PromptSettings",
    "PromptSpecError",
    "has_spec",
    "merge_settings",
    "model_spec",
    "read_spec",
    "resolve_spec",
    "save_spec",
    "spec_differences",
    "spec_file",
]
