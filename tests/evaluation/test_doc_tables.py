"""Result tables in the README and docs/ are rendered from the committed JSON they quote
(memsifter.evaluation.doc_tables): none has drifted from its JSON, and a hand edit is caught."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from memsifter.errors import DataError
from memsifter.evaluation.doc_tables import MARKER, TABLES, drift, main, render_file, write

ROOT = Path(__file__).resolve().parents[2]


def test_no_table_in_the_docs_differs_from_its_json() -> None:
    assert drift(ROOT) == [], "run: python -m memsifter.evaluation.doc_tables"


def test_every_table_is_quoted_somewhere() -> None:
    used = {
        m["name"]
        for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        for m in MARKER.finditer(p.read_text(encoding="utf-8"))
    }
    assert used == set(TABLES)


def _copy(tmp_path: Path) -> Path:
    (tmp_path / "docs").mkdir()
    for name in {t.source for t in TABLES.values()}:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tmp_path / name)
    shutil.copy2(ROOT / "README.md", tmp_path / "README.md")
    shutil.copy2(ROOT / "docs" / "results.md", tmp_path / "docs" / "results.md")
    return tmp_path


def test_a_hand_edited_number_is_caught_and_rewritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _copy(tmp_path)
    readme = root / "README.md"
    good = readme.read_text(encoding="utf-8")
    readme.write_text(good.replace("| BM25 order | 0.562 |", "| BM25 order | 0.600 |"))
    assert drift(root) == ["README.md: proxy_locomo_test"]
    monkeypatch.chdir(root)
    assert main(["--check"]) == 1 and "stale table: README.md" in capsys.readouterr().out
    assert write(root) == ["README.md"] and readme.read_text(encoding="utf-8") == good
    assert main(["--check"]) == 0


def test_an_unknown_table_or_a_missing_json_is_named(tmp_path: Path) -> None:
    text = "<!-- table: nope -->\n| x |\n<!-- /table: nope -->\n"
    with pytest.raises(DataError, match="unknown table 'nope'"):
        render_file(text, tmp_path, "doc.md")
    name = next(iter(TABLES))
    text = f"<!-- table: {name} -->\n<!-- /table: {name} -->\n"
    with pytest.raises(DataError, match=f"table '{name}': cannot read"):
        render_file(text, tmp_path, "doc.md")
