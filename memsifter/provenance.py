"""Which code made a result: the checkout's commit, ``+dirty`` when tracked files differ from
it, so that every committed number (a benchmark's table, an evaluation report) names the code
version it was measured on and anyone can check out that version and rerun it.

A copy of the tree sent to another machine (a lent GPU) has no git of its own, or one that is
not the sender's: ``MEMSIFTER_CODE_VERSION`` names the sender's commit there. Outside a git
checkout (an installed wheel) the version is the package's, said as such.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENV = "MEMSIFTER_CODE_VERSION"


def git_head() -> str:
    """The repository's short HEAD, or ``MEMSIFTER_CODE_VERSION`` when set (one copy's own git
    reported its base commit "+dirty"); "unknown" outside git."""
    named = os.environ.get(ENV)
    if named:
        return named
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            text=True,
            capture_output=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def git_dirty(*paths: str) -> bool:
    """Whether tracked files (only ``paths``, when given) differ from HEAD: a result measured
    on uncommitted code says so. With ``MEMSIFTER_CODE_VERSION`` the sender's name says it."""
    if os.environ.get(ENV):
        return False
    try:
        return bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no", "--", *paths],
                cwd=REPO,
                text=True,
                capture_output=True,
            ).stdout.strip()
        )
    except OSError:
        return False


def code_version() -> str:
    """``<commit>`` or ``<commit>+dirty``; ``memsifter <version> (no git checkout)`` where there
    is no repository to ask."""
    head = git_head()
    if head == "unknown":
        from importlib.metadata import PackageNotFoundError, version

        try:
            installed = version("memsifter")
        except PackageNotFoundError:
            installed = "(not installed)"
        return f"memsifter {installed} (no git checkout)"
    return head + ("+dirty" if git_dirty() else "")
