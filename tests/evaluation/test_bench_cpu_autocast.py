"""The autocast bench keeps one record per kind of CPU: whether bf16 pays is the CPU's question."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

import eval.bench.bench_cpu_autocast as bench


def test_records_are_kept_per_cpu_and_the_table_is_rendered_from_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    committed = json.loads(bench.OUT.with_suffix(".json").read_text(encoding="utf-8"))
    keys = [bench.cpu_key(r) for r in committed["records"]]
    assert len(set(keys)) == len(keys) >= 2
    # The committed table is the rendering of the committed JSON, never typed twice.
    assert bench.OUT.with_suffix(".md").read_text(encoding="utf-8") == bench.render(committed)

    first, second = committed["records"][:2]
    # A file from before there were several records holds one: it becomes the first.
    monkeypatch.setattr(bench, "OUT", tmp_path / "bench")
    assert bench.load_records() == {"records": []}
    (tmp_path / "bench.json").write_text(json.dumps(first), encoding="utf-8")
    assert bench.load_records() == {"records": [first]}

    # A rerun on the same kind of CPU replaces its record; another kind is added beside it.
    again = copy.deepcopy(first)
    again["rows"][0]["step_s"] = 123.0
    both = bench.merged(bench.merged({"records": [first]}, second), again)
    assert [bench.cpu_key(r) for r in both["records"]] == [bench.cpu_key(second), keys[0]]
    assert both["records"][1]["rows"][0]["step_s"] == 123.0
    text = bench.render(both)
    assert text.count("\n## ") == 2 and "| 123.0 |" in text
