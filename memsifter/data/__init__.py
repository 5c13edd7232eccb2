"""Data layer: types, loaders (LoCoMo, LongMemEval, our JSONL), haystacks and segmentation."""

from __future__ import annotations

from pathlib import Path

from memsifter.data.dataset import LoadReport, MemoryDataset
from memsifter.data.gym import load_gym
from memsifter.data.jsonl import dump_jsonl, load_jsonl
from memsifter.data.locomo import load_locomo
from memsifter.data.longmemeval import load_longmemeval
from memsifter.data.memsifter_release import load_memsifter_datasets
from memsifter.data.types import Page, Query, Ranking, Session, Turn
from memsifter.errors import UnknownNameError

LOADERS = {
    "locomo": load_locomo,
    "longmemeval": load_longmemeval,
    "jsonl": load_jsonl,
    "memsifter": load_memsifter_datasets,  # the MemSifter authors' released data (local copy)
    "gym": load_gym,  # the memory gym: a generated world.json, its folder, or a GymConfig YAML
}


def load_dataset(name: str, path: str | Path) -> MemoryDataset:
    try:
        loader = LOADERS[name]
    except KeyError:
        raise UnknownNameError(
            f"unknown dataset {name!r}; choose one of {', '.join(LOADERS)}"
        ) from None
    return loader(path)


__all__ = [
    "LOADERS",
    "LoadReport",
    "MemoryDataset",
    "Query",
    "Ranking",
    "Page",
    "Session",
    "Turn",
    "dump_jsonl",
    "load_dataset",
    "load_gym",
    "load_jsonl",
    "load_locomo",
    "load_longmemeval",
    "load_memsifter_datasets",
]
