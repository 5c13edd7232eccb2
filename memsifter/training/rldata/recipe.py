"""The RL data recipe: what ``configs/data/*.yaml`` holds and how the command line edits it.

:class:`RLDataConfig` names the proxy's prompt (one :class:`~memsifter.ranker.spec.PromptSpec`),
the curriculum, and one or more sources (:class:`SourceSettings`: LoCoMo, LongMemEval, our JSONL),
each with a train ``count`` and how to split it (:mod:`memsifter.training.rldata.split`).
``--data NAME=PATH`` overrides a source's file (:func:`parse_data_overrides`,
:func:`with_data_paths`). :mod:`memsifter.training.rldata.build` builds the dataset from it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from memsifter.config import load_config
from memsifter.data import LOADERS
from memsifter.data.locations import DEFAULT_LOCOMO
from memsifter.errors import DataError
from memsifter.ranker.spec import PromptSpec
from memsifter.training.rldata.curriculum import CurriculumSettings

# Datasets that split themselves when the recipe lists nothing: LoCoMo by the project's default
# (data/splits.py), the memory gym by the user split its world records.
OWN_SPLITS = ("locomo", "gym", "memsifter")


@dataclass(frozen=True)
class SourceSettings:
    """One dataset in the recipe. Conversations are ids or 0-based indexes in file order."""

    name: str  # the row's ``source`` and the key of --data overrides; unique in the recipe
    dataset: str = "locomo"  # loader: locomo | longmemeval | memsifter | jsonl | gym
    path: str = DEFAULT_LOCOMO
    count: int | None = None  # train rows kept by the curriculum; null keeps every train row
    train_conversations: list[int | str] | None = None
    validation_conversations: list[int | str] | None = None
    test_conversations: list[int | str] | None = None
    # Seeded hash split when no lists are given: the fractions held out for each role.
    validation_fraction: float | None = None
    test_fraction: float | None = None
    # Keep questions without any gold session (the gym's no-memory questions, where s_0 > 0);
    # they train nothing under R_ret, and R_ans gives them the same score for every ranking.
    keep_without_evidence: bool = False

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError(f"source name must be non-empty and without '/', got {self.name!r}")
        if self.dataset not in LOADERS:
            raise ValueError(
                f"source {self.name!r}: dataset must be one of {sorted(LOADERS)}, "
                f"got {self.dataset!r}"
            )
        if self.count is not None and self.count < 0:
            raise ValueError(f"source {self.name!r}: count must be >= 0, got {self.count}")
        listed = any(
            x is not None
            for x in (
                self.train_conversations,
                self.validation_conversations,
                self.test_conversations,
            )
        )
        hashed = self.validation_fraction is not None or self.test_fraction is not None
        if hashed:
            if listed:
                raise ValueError(
                    f"source {self.name!r}: give conversation lists or fractions, not both"
                )
            v, t = self.validation_fraction or 0.0, self.test_fraction or 0.0
            if not (0.0 <= v <= 1.0 and 0.0 <= t <= 1.0 and v + t <= 1.0):
                raise ValueError(
                    f"source {self.name!r}: validation_fraction ({v}) and test_fraction ({t}) "
                    "must be in [0, 1] and sum to at most 1"
                )
        elif listed and self.test_conversations is None:
            raise ValueError(
                f"source {self.name!r}: list test_conversations (the split that is only "
                "reported, never used to choose)"
            )
        elif not listed and self.dataset not in OWN_SPLITS:
            raise ValueError(
                f"source {self.name!r}: say how to split it: validation_conversations / "
                "test_conversations, or validation_fraction / test_fraction"
            )


@dataclass(frozen=True)
class RLDataConfig:
    """A dataset recipe: the proxy's prompt (one :class:`PromptSpec`: tokenizer, window,
    completion budget, coarse filter, language, thinking, candidate unit and order), the sources,
    the curriculum."""

    sources: list[SourceSettings] = field(default_factory=list)
    prompt: PromptSpec = field(default_factory=PromptSpec)
    seed: int = 0  # hash split and curriculum tie-breaks / random sampling
    curriculum: CurriculumSettings = field(default_factory=CurriculumSettings)
    # The share of train prompts shown with their candidates in a seeded random order (the same
    # candidates and blocks, other labels; chosen by a hash of the question id): an augmentation
    # against position habits. The rest of train, validation and test keep the spec's order,
    # which is the order the proxy is served (docs/gym.md, finding 25).
    train_shuffle_share: float = 0.0

    def __post_init__(self) -> None:
        if not self.sources:
            raise ValueError("the recipe names no sources")
        if not 0.0 <= self.train_shuffle_share <= 1.0:
            raise ValueError(
                f"train_shuffle_share must be a share in [0, 1], got {self.train_shuffle_share}"
            )
        names = [s.name for s in self.sources]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"source names must be unique; repeated: {dup}")

    @property
    def budget_tokens(self) -> int:
        return self.prompt.budget_tokens


def load_rl_data_config(path: str | Path) -> RLDataConfig:
    """Load a recipe; unknown keys, wrong types and refused values are errors naming the file."""
    # memsifter.config turns a dataclass's own ValueError into a DataError naming the file.
    return load_config(RLDataConfig, path)


def parse_data_overrides(values: Sequence[str], cfg: RLDataConfig) -> dict[str, str]:
    """``--data`` values: ``NAME=PATH`` per source, or a bare ``PATH`` when there is one source."""
    out: dict[str, str] = {}
    names = [s.name for s in cfg.sources]
    for value in values:
        name, sep, path = value.partition("=")
        if not sep:
            if len(names) != 1:
                raise DataError(
                    f"--data {value!r}: the recipe has {len(names)} sources ({', '.join(names)}); "
                    "write NAME=PATH",
                    field="--data",
                )
            name, path = names[0], value
        if name not in names:
            raise DataError(
                f"--data {value!r}: no source named {name!r}; sources: {', '.join(names)}",
                field="--data",
            )
        out[name] = path
    return out


def with_data_paths(cfg: RLDataConfig, paths: Mapping[str, str]) -> RLDataConfig:
    """The recipe with some sources' ``path`` replaced (by source name)."""
    names = {s.name for s in cfg.sources}
    unknown = sorted(set(paths) - names)
    if unknown:
        raise DataError(f"no source named {unknown}; sources: {sorted(names)}", field="sources")
    sources = [
        dataclasses.replace(s, path=paths[s.name]) if s.name in paths else s for s in cfg.sources
    ]
    return dataclasses.replace(cfg, sources=sources)


__all__ = [
    "OWN_SPLITS",
    "RLDataConfig",
    "SourceSettings",
    "load_rl_data_config",
    "parse_data_overrides",
    "with_data_paths",
]
