"""Shared test fixtures: paths to the committed synthetic data, tiny model builds, and thread
limits.

The thread variables are set when pytest imports this file, before any test module imports torch
or numpy: the CI box has two cores, and oversubscribed BLAS/OpenMP pools make small tests slower.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

for _var, _value in (
    ("OMP_NUM_THREADS", "2"),
    ("MKL_NUM_THREADS", "2"),
    ("TOKENIZERS_PARALLELISM", "false"),
):
    os.environ.setdefault(_var, _value)

# Property tests check results, not speed: hypothesis' 200 ms deadline per example fails them
# when the two cores are busy (a training job beside the suite), which says nothing about code.
try:
    from hypothesis import settings as _hyp_settings

    _hyp_settings.register_profile("memsifter", deadline=None)
    _hyp_settings.load_profile("memsifter")
except ImportError:  # hypothesis is a dev extra
    pass

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "data" / "fixtures"
PG_DSN = os.environ.get("MEMSIFTER_TEST_PG_DSN")
SERVE_BACKENDS = [
    "sqlite",
    pytest.param(
        "postgres",
        marks=pytest.mark.skipif(not PG_DSN, reason="set MEMSIFTER_TEST_PG_DSN to run on Postgres"),
    ),
]


@pytest.fixture(scope="module", params=SERVE_BACKENDS)
def serve_db(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str], str]]:
    """Makes fresh, empty recall-service databases: ``serve_db("name")`` -> a SQLAlchemy URL.
    Every module using it runs on SQLite, and again on PostgreSQL when
    ``MEMSIFTER_TEST_PG_DSN`` names a server (each database made there is dropped after)."""
    drops: list[Callable[[], None]] = []

    def make(name: str) -> str:
        if request.param == "sqlite":
            return f"sqlite:///{tmp_path_factory.mktemp(name) / 'memsifter.db'}"
        from memsifter.testing.postgres import scratch_postgres

        url, drop = scratch_postgres(PG_DSN or "")
        drops.append(drop)
        return url

    yield make
    for drop in drops:
        drop()


@pytest.fixture(scope="module")
def store(serve_db: Callable[[str], str], request: pytest.FixtureRequest) -> Iterator[Any]:
    """One migrated recall-service ``Store`` per test module, on each ``serve_db`` backend; a
    module that needs another kind of store defines its own ``store``."""
    from memsifter.serving.store import Store

    s = Store(serve_db(request.module.__name__.rpartition(".")[2]))
    s.migrate()
    yield s
    s.close()


@pytest.fixture()
def tenant(store: Any) -> str:
    """A fresh tenant per test: a module's tests share one database (and on PostgreSQL, runs
    share the server)."""
    t = f"t-{uuid.uuid4().hex[:12]}"
    store.ensure_tenant(t)
    return t


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


@pytest.fixture(scope="session")
def tiny_smollm2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with the shipped proxy's (SmolLM2's) tokenizer."""
    from memsifter.testing import build_tiny_smollm2

    shipped = Path(__file__).parent.parent / "memsifter/proxies/memsifter-smollm2-135m-locomo"
    if not (shipped / "tokenizer.json").is_file():
        pytest.skip("the shipped proxy's tokenizer is not in this checkout")
    return build_tiny_smollm2(tmp_path_factory.mktemp("tiny_smollm2"), shipped)


@pytest.fixture(scope="session")
def smollm2_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A cache root (``$MEMSIFTER_CACHE``) holding this session's own conversion of the built-in
    ``smollm2-135m-instruct`` (~20 s, ~517 MB), so the tests see a real first conversion and never
    write into the user's cache. Shared by every test that needs the model, so it runs once."""
    from memsifter.models import resolve_model

    root = tmp_path_factory.mktemp("memsifter-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MEMSIFTER_CACHE", str(root))
        resolve_model("smollm2-135m-instruct")
    yield root
    # pytest keeps the last three sessions' temp dirs; half a GB each is worth removing.
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_cache: Path) -> Path:
    return smollm2_cache / "models" / "smollm2-135m-instruct"


def _require_build(built: bool, env: str, why: str) -> None:
    """Skip a real-engine test without its build, unless CI said the build must be there (``env``
    set: then a missing build fails instead of passing by skipping)."""
    if not built:
        if os.environ.get(env):
            pytest.fail(f"{env} is set but {why}")
        pytest.skip(why)


@pytest.fixture
def vllm_built() -> None:
    """The vLLM CPU venv (``.venv-vllm``) is there, or the test skips (fails under
    ``MEMSIFTER_REQUIRE_VLLM``)."""
    from memsifter.llm.vllm_cpu import vllm_venv

    why = f"{vllm_venv()} not built (bash scripts/vllm_cpu_server.sh --setup-only)"
    _require_build((vllm_venv() / "bin" / "python").exists(), "MEMSIFTER_REQUIRE_VLLM", why)


@pytest.fixture
def llamacpp_built() -> None:
    """llama.cpp's server is built, or the test skips (fails under
    ``MEMSIFTER_REQUIRE_LLAMACPP``)."""
    from memsifter.llm.llamacpp import is_built, llamacpp_dir

    why = f"llama.cpp not built in {llamacpp_dir()} (bash scripts/llamacpp_server.sh --setup-only)"
    _require_build(is_built(), "MEMSIFTER_REQUIRE_LLAMACPP", why)
