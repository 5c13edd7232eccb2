"""memsifter.provenance: which code a result names."""

from __future__ import annotations

import re
import subprocess

import pytest

from memsifter import provenance


def test_a_checkout_names_its_commit_and_says_when_it_is_dirty(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(provenance.ENV, raising=False)
    if provenance.git_head() == "unknown":
        pytest.skip("not a git checkout")
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=provenance.REPO, text=True,
        capture_output=True, check=True,
    ).stdout.strip()  # fmt: skip
    version = provenance.code_version()
    assert re.fullmatch(r"[0-9a-f]{7,40}(\+dirty)?", version)
    assert version.split("+")[0] == head
    monkeypatch.setattr(provenance, "git_dirty", lambda *paths: True)
    assert provenance.code_version() == head + "+dirty"


def test_a_copy_elsewhere_names_the_senders_commit_and_no_git_names_the_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from importlib.metadata import version

    monkeypatch.setenv(provenance.ENV, "8e9c916")
    assert provenance.code_version() == "8e9c916" and not provenance.git_dirty()
    monkeypatch.delenv(provenance.ENV)
    monkeypatch.setattr(provenance, "git_head", lambda: "unknown")
    assert provenance.code_version() == f"memsifter {version('memsifter')} (no git checkout)"
