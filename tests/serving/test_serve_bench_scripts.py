"""The recall-service benchmark scripts in ``eval/`` run end to end in a tiny mode and write
reports of the committed shape: each starts a real ``memsifter serve`` subprocess, so this also
covers starting, killing (``kill -9``) and restarting the server on the same database.

The durability run is also on PostgreSQL when ``MEMSIFTER_TEST_PG_DSN`` names a server (the
script creates and drops a database of its own there).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from eval.common import percentile, summarize
from memsifter.coarse import build_filter
from memsifter.data.types import Session, Turn
from memsifter.ranker.parse import parse_ranking
from memsifter.ranker.prompt import PromptBuilder
from memsifter.ranker.spec import PromptSpec
from memsifter.serving.app import create_app
from memsifter.serving.config import ApiKeySettings, ServeConfig
from memsifter.serving.ranking import ServiceRanker
from memsifter.testing.backends import FakeTokenizer, ScriptedBackend, reverse_ranking
from memsifter.testing.stub_proxy import answer

ROOT = Path(__file__).resolve().parents[2]
PG_DSN = os.environ.get("MEMSIFTER_TEST_PG_DSN")


def _run(module: str, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """``python -m eval.<module>`` from the repository root, as the docs run it."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, "-m", f"eval.{module}", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result


def _json(md: Path) -> dict[str, Any]:
    return json.loads(md.with_suffix(".json").read_text())


@pytest.mark.slow
def test_bench_load_tiny(tmp_path: Path) -> None:
    out = tmp_path / "bench_load.md"
    _run(
        "bench.bench_load",
        *("--sessions", "50", "--clients", "2", "--duration", "2"),
        *("--single-requests", "10", "--warmup", "2", "--seed-batch", "20"),
        *("--out", str(out)),
    )
    run = _json(out)["runs"]["coarse-only"]
    assert run["params"]["sessions"] == 50 and run["ranker_reported"] == "coarse-only"
    assert run["machine"]["cores"] and run["machine"]["cpu"]
    single = run["single_user"]
    assert single["requests"] == 10 and single["errors"] == 0
    for key in ("latency_ms", "overhead_ms", "coarse_ms", "outside_ranker_ms"):
        assert single[key]["p50_ms"] is not None
    # Coarse-only has no model call: the overhead is the whole latency.
    assert single["overhead_ms"] == single["latency_ms"] and single["model_ms"] is None
    endpoints = run["load"]["endpoints"]
    assert set(endpoints) == {"recall", "ingest"}
    for row in endpoints.values():
        assert row["requests"] > 0 and row["errors"] == 0 and row["req_per_s"] > 0
        lat = row["latency_ms"]
        assert lat["p50_ms"] <= lat["p95_ms"] <= lat["p99_ms"] <= lat["max_ms"]
    assert run["load"]["errors"] == 0
    cpu = run["load"]["cpu"]  # where the cores went during the load phase
    assert cpu["server_processes"] >= 1 and cpu["server_cpu_s"] > 0 and cpu["client_cpu_s"] > 0
    assert 0 < cpu["machine_busy_cores"] <= cpu["machine_cores"] + 0.1

    md = out.read_text()
    assert "CPU over the load phase" in md
    assert "full run pending" in md and "SMOKE RUN" in md  # a tiny run must say so
    assert "python -m eval.bench.bench_load" in md and " cores, " in md
    assert "| endpoint | requests | req/s | p50 ms | p95 ms | p99 ms |" in md
    assert "**overhead over the model call**" in md and "Goal: 0 errors" in md


def test_bench_request_cpu_tiny(tmp_path: Path) -> None:
    out = tmp_path / "bench_request_cpu.md"
    _run("bench.bench_request_cpu", "--sessions", "20", "--requests", "5", "--out", str(out))
    rows = {r["op"]: r for r in _json(out)["rows"]}
    assert set(rows) == {"recall", "ingest"}
    for row in rows.values():
        # /proc counts CPU in 10 ms ticks: 5 requests may read as 0.
        assert row["requests"] == 5 and row["errors"] == 0 and row["server_cpu_ms"] >= 0
        assert row["wall_ms"] > 0
    assert "| request | n | server CPU ms | wall ms | errors |" in out.read_text()


def _check_durability(out: Path, db: str) -> None:
    run = _json(out)["runs"][db]
    assert run["lost"] == 0 and run["acked"] >= 200
    assert len(run["checks"]) == 2  # one kill during the writes, one after the last
    assert run["server_starts"] == 3
    kill = run["checks"][0]
    assert kill["after"] == "kill 1" and kill["missing"] == [] and kill["mismatched"] == []
    assert kill["stored"] >= kill["acked_so_far"] and kill["sampled"] > 0
    assert run["checks"][-1]["stored"] >= run["acked"]
    md = out.read_text()
    assert f"## {db}" in md and f"**Result: 0 of {run['acked']} acknowledged writes lost**" in md


@pytest.mark.slow
def test_bench_durability_tiny_sqlite(tmp_path: Path) -> None:
    out = tmp_path / "bench_durability.md"
    _run(
        "bench.bench_durability",
        *("--db", "sqlite", "--writes", "200", "--kills", "1"),
        *("--writers", "4", "--users", "4", "--sample", "50", "--out", str(out)),
    )
    _check_durability(out, "sqlite")


@pytest.mark.slow
@pytest.mark.skipif(not PG_DSN, reason="set MEMSIFTER_TEST_PG_DSN to run on Postgres")
def test_bench_durability_tiny_postgres(tmp_path: Path) -> None:
    out = tmp_path / "bench_durability.md"
    _run(
        "bench.bench_durability",
        *("--db", "postgres", "--pg-dsn", str(PG_DSN), "--writes", "200", "--kills", "1"),
        *("--writers", "4", "--users", "4", "--sample", "50", "--out", str(out)),
    )
    _check_durability(out, "postgres")


def test_percentiles_interpolate() -> None:
    assert percentile([], 50) is None
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    s = summarize([float(x) for x in range(1, 101)])
    assert s["n"] == 100 and s["p50_ms"] == 50.5 and s["p99_ms"] == 99.01 and s["max_ms"] == 100


def test_stub_proxy_answers_the_real_prompt() -> None:
    """The stub reads the candidate count from the proxy's own prompt, so its answer must
    parse cleanly and rank every candidate; a reworded prompt would break it here first."""
    sessions = [
        Session(id=f"s{i}", turns=(Turn(speaker="user", text=f"note {i} about the dog"),))
        for i in range(4)
    ]
    built = PromptBuilder(FakeTokenizer(), 4000, 100).build("the dog?", sessions)
    parsed = parse_ranking(answer(built.text), len(built.candidate_ids))
    assert parsed.ok and parsed.n_from_model == 4 and parsed.ids == (0, 1, 2, 3)


def test_recall_reports_the_model_call_apart_from_the_proxy_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench_load's overhead is latency - ``timings.model_ms``; the scripted backend says each
    generation took 1 ms (without taking it), so that is what the service must report, apart
    from ``proxy_ms``, the whole proxy stage as the service timed it."""
    monkeypatch.setenv("MEMSIFTER_BENCH_TEST_KEY", "key-bench-0123456789")
    config = ServeConfig(
        db_url=f"sqlite:///{tmp_path / 'm.db'}",
        api_keys=[ApiKeySettings(tenant="t", key_env="MEMSIFTER_BENCH_TEST_KEY")],
    )
    ranker = ServiceRanker(build_filter("bm25"), ScriptedBackend(reverse_ranking), PromptSpec())
    headers = {"Authorization": "Bearer key-bench-0123456789"}
    with TestClient(create_app(config, ranker), headers=headers) as client:
        turns = [{"speaker": "user", "text": "My dog Max loves the park."}]
        r = client.post("/v1/users/u/sessions", json={"sessions": [{"id": "s1", "turns": turns}]})
        assert r.status_code == 201, r.text
        r = client.post("/v1/users/u/recall", json={"question": "dog?", "top_k": 1})
        assert r.status_code == 200, r.text
        t = r.json()["timings"]
        assert t["model_ms"] == pytest.approx(1.0)
        assert t["proxy_ms"] is not None and t["total_ms"] >= t["proxy_ms"] > 0


def test_bench_prompt_tiny(tmp_path: Path, tiny_qwen3: Path) -> None:
    out = tmp_path / "bench_prompt.md"
    _run(
        "bench.bench_prompt",
        *("--model", str(tiny_qwen3), "--pages", "30", "--candidates", "5"),
        *("--prompts", "5", "--window", "4096", "--completion", "256", "--out", str(out)),
    )
    rows = {r["way"]: r for r in _json(out)["rows"]}
    assert set(rows) == {"token ids", "text"}
    # The same prompts both ways: built from ids or rendered and counted, equal in length.
    assert rows["token ids"]["mean_tokens"] == rows["text"]["mean_tokens"] > 0
    for row in rows.values():
        assert row["prompts"] == 5 and row["build_ms"]["p50_ms"] > 0
    assert "| way | prompts | mean tokens |" in out.read_text()


def test_a_tree_without_git_names_the_commit_its_sender_gave(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy of the tree sent to a lent GPU names the commit the sender put in
    MEMSIFTER_CODE_VERSION, whatever git the copy has; without it, git decides ("unknown"
    outside a checkout)."""
    import eval.common as benchlib
    from memsifter import provenance  # where eval.common's git_head lives

    monkeypatch.setattr(provenance, "REPO", tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    monkeypatch.delenv("MEMSIFTER_CODE_VERSION", raising=False)
    assert benchlib.git_head() == "unknown"
    monkeypatch.setattr(provenance, "REPO", ROOT)
    head = benchlib.git_head()
    assert head not in ("unknown", "abc1234")
    monkeypatch.setenv("MEMSIFTER_CODE_VERSION", "abc1234")
    assert benchlib.git_head() == "abc1234" and not benchlib.git_dirty()
    monkeypatch.setattr(provenance, "REPO", tmp_path)
    assert benchlib.git_head() == "abc1234"


@pytest.mark.slow
def test_bench_scale_tiny(tmp_path: Path) -> None:
    out = tmp_path / "bench_scale.md"
    _run(
        "bench.bench_scale",
        *("--sessions", "20", "--sessions", "45", "--seed-batch", "10", "--questions", "3"),
        *("--warmup", "1", "--ingests", "2", "--restarts", "1", "--out", str(out)),
        timeout=300.0,
    )
    result = _json(out)
    assert result["machine"]["cores"] and result["code_version"]
    rows = result["rows"]
    assert [(r["sessions"], r["sessions_at_end"]) for r in rows] == [(20, 22), (45, 47)]
    for r in rows:  # the keys, each measured
        for key in ("seed_sessions_per_s", "disk_mb", "warm_p50_ms", "warm_p95_ms", "rss_mb"):
            assert r[key] > 0, (key, r)
        assert r["tokens"] > 0 and r["store"] == "sqlite" and r["ingest_p50_ms"] > 0
        # A restarted server holds no index: the first recall opened the stored one, and says
        # what it cost.
        (cold,) = r["cold_first_recall"]
        assert cold["index_load"] == "opened" and 0 < cold["index_ms"] <= 1000 * cold["s"]
    assert rows[1]["tokens"] > rows[0]["tokens"]
    assert "SMOKE RUN" in out.read_text()
    # A size measured again replaces its row; the others stay, each naming its own run. This
    # one is seeded in-process (the path a million sessions take), and says so.
    _run(
        "bench.bench_scale",
        *("--sessions", "20", "--seed-batch", "10", "--questions", "2", "--warmup", "1"),
        *("--ingests", "1", "--restarts", "1", "--out", str(out), "--seed-direct"),
        timeout=300.0,
    )
    again = _json(out)["rows"]
    assert [(r["sessions"], r["sessions_at_end"]) for r in again] == [(20, 21), (45, 47)]
    assert again[0]["run"]["command"] != again[1]["run"]["command"]
    assert [r["seed"] for r in again] == ["direct, no bookmarks", "http"]
    assert again[0]["tokens"] > 0 and again[0]["warm_p50_ms"] > 0
    assert "(direct)" in out.read_text()
    with pytest.raises(AssertionError, match="each must exceed"):  # sizes the ingests overlap
        _run("bench.bench_scale", "--sessions", "20", "--sessions", "21", "--out", str(out))


@pytest.mark.slow
def test_service_coarse_parity_tiny(
    tmp_path: Path, locomo_mini_path: Path, longmemeval_mini_path: Path
) -> None:
    """The service's recall over an ingested haystack ranks as the benchmarks' BM25 does, on
    the mini fixtures of both datasets: every ranking identical, every metric's difference 0,
    and every top-5 recall the ranking's first 5."""
    out = tmp_path / "parity.md"
    _run(
        "probes.service_coarse_parity",
        *("--locomo", str(locomo_mini_path), "--longmemeval", str(longmemeval_mini_path)),
        *("--out", str(out)),
    )
    rows = _json(out)["rows"]
    assert [r["dataset"] for r in rows] == ["locomo", "longmemeval"]
    for r in rows:
        assert r["n_questions"] > 0 and r["identical_rankings"] == r["n_questions"], r
        assert all(d == 0 for d in r["difference"].values()), r
        assert r["identical_over_paged_sessions"] == r["n_questions"], r
        assert r["top5_recall_equals_first_5"] == r["n_questions"], r
