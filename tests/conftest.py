"""Shared test fixtures: paths to the committed synthetic data, tiny model builds, and thread
limits.

The thread variables are set when pytest imports this file, before any test module imports torch
or numpy: the CI box has two cores, and oversubscribed BLAS/OpenMP pools make small tests slower.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

for _var, _value in (
    ("OMP_NUM_THREADS", "2"),
    ("MKL_NUM_THREADS", "2"),
    ("TOKENIZERS_PARALLELISM", "false"),
):
    os.environ.setdefault(_var, _value)

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "data" / "fixtures"


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture(scope="session")
def locomo_mini_path() -> Path:
    return FIXTURES / "locomo_mini.json"


@pytest.fixture(scope="session")
def longmemeval_mini_path() -> Path:
    return FIXTURES / "longmemeval_mini.json"


@pytest.fixture(scope="session")
def users_mini_path() -> Path:
    return FIXTURES / "users_mini.jsonl"


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen3 causal LM folder (tokenizer, weights, generation config)."""
    from memsifter.testing import build_tiny_qwen3

    return build_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3"))
