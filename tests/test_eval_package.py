"""``eval/`` is a package run from the repository root (``python -m eval.bench.bench_load``):
benchmarks, probes and reports each in their folder, what they share in ``eval.common``, one CLI
library, and every output under ``eval/results/<name>/``. These are the layout's rules, checked
on the tree (nothing is run)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EVAL = ROOT / "eval"
KINDS = ("bench", "probes", "reports")
# Runs on a lent GPU whose Python has torch, transformers and peft only (scripts/gpu_check.sh):
# the standard library's argparse, not the project's CLI library.
STDLIB_CLI = {"eval/bench/bench_gpu_step.py"}


def scripts() -> list[Path]:
    return sorted(
        p for kind in KINDS for p in (EVAL / kind).glob("*.py") if p.name != "__init__.py"
    )


def imports(path: Path) -> list[ast.ImportFrom | ast.Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


def test_every_script_is_in_a_kind_folder_and_the_package_imports() -> None:
    loose = sorted(p.name for p in EVAL.glob("*.py") if p.name not in ("__init__.py", "common.py"))
    assert loose == [], f"eval/ scripts outside bench/, probes/ and reports/: {loose}"
    assert all((EVAL / kind / "__init__.py").is_file() for kind in KINDS)
    assert len(scripts()) > 20


@pytest.mark.parametrize("path", scripts(), ids=lambda p: str(p.relative_to(EVAL)))
def test_no_sys_path_edits_and_no_private_imports_across_scripts(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert "sys.path" not in text, f"{path.name} edits sys.path: import eval.common instead"
    for node in imports(path):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("eval."):
            private = [a.name for a in node.names if a.name.startswith("_")]
            assert not private, f"{path.name} imports private {private} from {node.module}"
        if isinstance(node, ast.Import):
            bare = [a.name for a in node.names if (EVAL / f"{a.name}.py").is_file()]
            bare += [
                a.name for a in node.names for k in KINDS if (EVAL / k / f"{a.name}.py").is_file()
            ]
            assert not bare, f"{path.name} imports a script by its bare name: {bare}"
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            top = node.module.split(".")[0]
            sibling = any((EVAL / k / f"{top}.py").is_file() for k in KINDS)
            assert not sibling and top != "benchlib", f"{path.name}: from {node.module} import"


@pytest.mark.parametrize("path", scripts(), ids=lambda p: str(p.relative_to(EVAL)))
def test_one_cli_library(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    if 'if __name__ == "__main__":' not in text:
        return
    rel = str(path.relative_to(ROOT))
    if rel in STDLIB_CLI:
        assert "import typer" not in text and "argparse" in text
        return
    assert "argparse" not in text, f"{rel}: the scripts' CLI library is typer"
    assert "typer.run(main)" in text or "app()" in text, f"{rel} has no typer entry point"


def test_every_output_lives_under_results_by_name() -> None:
    outputs = [p for p in EVAL.rglob("*") if p.is_file() and p.suffix in (".json", ".md", ".png")]
    stray = [str(p.relative_to(ROOT)) for p in outputs if EVAL / "results" not in p.parents]
    assert stray == [], f"outputs outside eval/results/: {stray}"
    flat = [p.name for p in (EVAL / "results").iterdir() if p.is_file()]
    assert flat == [], f"eval/results/ holds files, not <name>/ folders: {flat}"


def test_the_common_command_line_names_the_module(monkeypatch: pytest.MonkeyPatch) -> None:
    import eval.common as common

    monkeypatch.setattr("sys.argv", [str(EVAL / "bench" / "bench_load.py"), "--workers", "2"])
    assert common.command_line() == "python -m eval.bench.bench_load --workers 2"
    monkeypatch.setattr("sys.argv", ["/elsewhere/x.py"])
    assert common.command_line() == "python /elsewhere/x.py"
