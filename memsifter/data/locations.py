"""Where the datasets live: one resolver for the shared data folder beside the checkout and the
environment variables that point elsewhere.

The real LoCoMo and LongMemEval files are licensed for research and never committed; a machine
that has them keeps them in ``../shared/data`` (next to this repository). Two forms exist because
two kinds of caller need them:

* config defaults and command-line defaults are *relative* paths (``DEFAULT_LOCOMO``), resolved
  against the working directory like every path a user types;
* tests and benchmarks, which may run from anywhere, ask for the *absolute* path beside the
  checkout (:func:`shared_data`, :func:`locomo_file`).

``$MEMSIFTER_LOCOMO`` and ``$MEMSIFTER_LONGMEMEVAL`` override either form.
"""

from __future__ import annotations

import os
from pathlib import Path

LOCOMO_ENV = "MEMSIFTER_LOCOMO"
LONGMEMEVAL_ENV = "MEMSIFTER_LONGMEMEVAL"
SHARED_DATA = "../shared/data"  # relative to the repository root (the usual working directory)
LOCOMO_FILE = "locomo/locomo10.json"
LONGMEMEVAL_FILES = {
    "s": "longmemeval/longmemeval_s_cleaned_498.json.gz",
    "oracle": "longmemeval/longmemeval_oracle.json",
}
DEFAULT_LOCOMO = f"{SHARED_DATA}/{LOCOMO_FILE}"
DEFAULT_LONGMEMEVAL = f"{SHARED_DATA}/{LONGMEMEVAL_FILES['s']}"
REPO_ROOT = Path(__file__).resolve().parents[2]


def locomo_path() -> str:
    """The LoCoMo file a command defaults to: ``$MEMSIFTER_LOCOMO``, else ``DEFAULT_LOCOMO``."""
    return os.environ.get(LOCOMO_ENV) or DEFAULT_LOCOMO


def shared_data(relative: str) -> Path:
    """``relative`` inside the shared data folder beside the checkout, as an absolute path."""
    return (REPO_ROOT / SHARED_DATA / relative).resolve()


def locomo_file() -> Path:
    """The real LoCoMo as an absolute path: ``$MEMSIFTER_LOCOMO``, else the shared folder's."""
    env = os.environ.get(LOCOMO_ENV)
    return Path(env) if env else shared_data(LOCOMO_FILE)


__all__ = [
    "DEFAULT_LOCOMO",
    "DEFAULT_LONGMEMEVAL",
    "LOCOMO_ENV",
    "LOCOMO_FILE",
    "LONGMEMEVAL_ENV",
    "LONGMEMEVAL_FILES",
    "SHARED_DATA",
    "locomo_file",
    "locomo_path",
    "shared_data",
]
