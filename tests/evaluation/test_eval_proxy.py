"""`memsifter eval proxy` on a tiny hand-made RL data folder with a fake backend (no model):
hand-computed metrics, failed parses scoring 0, the spec checks, RRF rows, the paired bootstrap,
the json shape and the CLI end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from memsifter.cli import app
from memsifter.errors import DataError, MemSifterError
from memsifter.evaluation.proxy_eval import (
    ProxyEvalConfig,
    fuse_order,
    load_eval_data,
    paired_bootstrap,
    per_question_metrics,
    read_split_lists,
    run_proxy_eval,
    saved_run,
    split_pair,
)
from memsifter.ir_metrics import evaluate_rankings
from memsifter.llm import Generation
from memsifter.ranker.checkpoint import save_spec
from memsifter.ranker.spec import PromptSpec

SPEC = PromptSpec(window_tokens=1024, completion_tokens=64)

# (qid, prompt, coarse_order, gold_positions); q3's gold was cut from the prompt.
ROWS = [
    ("s/q0", "P0", [0, 1, 2, 3], [1]),
    ("s/q1", "P1", [2, 0, 1, 3], [2]),
    ("s/q2", "P2", [0, 1, 2, 3], [3]),
    ("s/q3", "P3", [1, 0, 2, 3], []),
]
# The "trained" model: right on q0, unparseable on q1, right on q2 with a partial ranking.
TRAINED = {
    "P0": "<think>1 mentions it</think><ranking>1, 0</ranking>",
    "P1": "<think>I am not sure",
    "P2": "<ranking>3</ranking>",
    "P3": "<ranking>0</ranking>",
}
BASE = {p: "<ranking>0, 1, 2, 3</ranking>" for p in TRAINED}


class FakeBackend:
    name = "fake"

    def __init__(self, model: str, answers: dict[str, str]) -> None:
        self.model_name = model
        self.answers = answers
        self.calls: list[tuple[list[str], object]] = []

    @property
    def tokenizer(self):
        return None

    def generate(self, prompts, sampling):
        self.calls.append((list(prompts), sampling))
        return [[Generation(self.answers[p], 10, 5, "stop", 0.01)] for p in prompts]


def _write_split(folder: Path, name: str, rows) -> None:
    from datasets import Dataset

    Dataset.from_dict(
        {
            "prompt": [r[1] for r in rows],
            "prompt_messages": [[{"role": "user", "content": r[1]}] for r in rows],
            "qid": [r[0] for r in rows],
            "conversation": ["c8" for _ in rows],
            "category": ["1" for _ in rows],
            "n_candidates": [4 for _ in rows],
            "coarse_order": [r[2] for r in rows],
            "gold_positions": [r[3] for r in rows],
            "gold_in_prompt": [len(r[3]) for r in rows],
        }
    ).to_parquet(str(folder / f"{name}.parquet"))


@pytest.fixture
def rl_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "rl"
    folder.mkdir()
    _write_split(folder, "train", ROWS[:1])
    _write_split(folder, "validation", ROWS[:1])
    _write_split(folder, "test", ROWS)
    save_spec(SPEC, folder)
    split = {
        "seed": 0,
        "sources": {
            "locomo": {
                "method": "locomo-default",
                "train": ["c0", "c1"],
                "validation": ["c7"],
                "test": ["c8", "c9"],
                "unused": [],
            }
        },
    }
    (folder / "split.json").write_text(json.dumps(split))
    return folder


@pytest.fixture
def models(tmp_path: Path) -> dict[str, Path]:
    trained = tmp_path / "trained"
    save_spec(SPEC.with_model("memsifter-smollm2-135m-locomo"), trained)  # model may differ
    other = tmp_path / "other"
    save_spec(PromptSpec(window_tokens=1024, completion_tokens=128, order="coarse"), other)
    base = tmp_path / "base"
    base.mkdir()
    return {"trained": trained, "other": other, "base": base}


def _factory(answers_by_path: dict[str, dict[str, str]], made: list[FakeBackend] | None = None):
    def factory(path, batch_size, threads):
        backend = FakeBackend(path, answers_by_path[path])
        if made is not None:
            made.append(backend)
        return backend

    return factory


def _cfg(rl_folder: Path, tmp_path: Path, **kw) -> ProxyEvalConfig:
    # These rows are prompts alone, with no candidates to permute: the order-invariance check
    # has its own tests (test_eval_invariance.py).
    kw.setdefault("invariance", False)
    return ProxyEvalConfig(data=str(rl_folder), out=str(tmp_path / "out"), **kw)


def test_per_question_metrics_match_hand_and_evaluate_rankings() -> None:
    rankings = [[0, 1, 2], [1, 0], []]
    gold = [[0, 2], [0], [1]]
    v = per_question_metrics(rankings, gold)
    ndcg5_q0 = (1 + 1 / math.log2(4)) / (1 + 1 / math.log2(3))
    assert v["ndcg@1"].tolist() == [1.0, 0.0, 0.0]
    assert v["ndcg@5"] == pytest.approx([ndcg5_q0, 1 / math.log2(3), 0.0])
    assert v["recall@1"].tolist() == [0.5, 0.0, 0.0]
    assert v["recall@5"].tolist() == [1.0, 1.0, 0.0]
    assert v["mrr"].tolist() == [1.0, 0.5, 0.0]
    # The means are exactly what the shared metrics module reports (empty run counts as 0).
    means = evaluate_rankings(
        {str(i): [str(p) for p in r] for i, r in enumerate(rankings)},
        {str(i): [str(p) for p in g] for i, g in enumerate(gold)},
    )
    for name, values in v.items():
        assert values.mean() == pytest.approx(means[name])


def test_load_eval_data_keeps_gold_in_prompt_and_samples(rl_folder: Path) -> None:
    data = load_eval_data(rl_folder, "test")
    assert [q.qid for q in data.questions] == ["s/q0", "s/q1", "s/q2"]
    assert (data.n_questions, data.n_with_gold_in_prompt, data.sampled) == (4, 3, False)
    assert data.spec == SPEC
    a = load_eval_data(rl_folder, "test", max_questions=2, seed=3)
    b = load_eval_data(rl_folder, "test", max_questions=2, seed=3)
    assert a.sampled and len(a.questions) == 2
    assert [q.qid for q in a.questions] == [q.qid for q in b.questions]
    with pytest.raises(MemSifterError, match="no split 'dev'"):
        load_eval_data(rl_folder, "dev")


def test_rankers_hand_computed(rl_folder: Path, models, tmp_path: Path) -> None:
    made: list[FakeBackend] = []
    cfg = _cfg(
        rl_folder,
        tmp_path,
        models=[("trained", str(models["trained"]))],
        fuse=["trained"],
        batch_size=2,
    )
    res = run_proxy_eval(cfg, backend_factory=_factory({str(models["trained"]): TRAINED}, made))
    rows = res.rows
    assert list(rows) == ["bm25", "trained", "trained+bm25"]

    # Greedy, capped at the spec's completion budget, on the scored prompts only.
    (backend,) = made
    assert [p for call in backend.calls for p in call[0]] == ["P0", "P1", "P2"]
    sampling = backend.calls[0][1]
    assert sampling.temperature == 0.0 and sampling.max_new_tokens == SPEC.completion_tokens

    # bm25: gold at ranks 2, 1, 4.
    bm25 = rows["bm25"]
    assert bm25["n"] == 3 and bm25["parse_rate"] is None
    assert bm25["ndcg@1"] == pytest.approx(1 / 3)
    assert bm25["mrr"] == pytest.approx((0.5 + 1 + 0.25) / 3)
    assert bm25["recall@1"] == pytest.approx(1 / 3)
    assert bm25["ndcg@5"] == pytest.approx((1 / math.log2(3) + 1 + 1 / math.log2(5)) / 3)

    # trained: right on q0 and q2 (partial ranking, not completed), a failed parse on q1 = 0.
    t = rows["trained"]
    assert t["parse_rate"] == pytest.approx(2 / 3)
    assert t["ndcg@1"] == pytest.approx(2 / 3)
    assert t["ndcg@10"] == pytest.approx(2 / 3)
    assert t["recall@5"] == pytest.approx(2 / 3)
    assert t["mrr"] == pytest.approx(2 / 3)
    assert t["parse_errors"] == {"missing_ranking": 1}
    assert t["latency_ms_p50"] is not None
    run = next(r for r in res.runs if r.name == "trained")
    assert run.rankings == [[1, 0], [], [3]]

    # trained+bm25: q0 ties (1/61 + 1/62 each) keep the coarse order, q1 is the coarse order,
    # q2 lifts 3 to the top.
    fused = next(r for r in res.runs if r.name == "trained+bm25")
    assert fused.rankings == [[0, 1, 2, 3], [2, 0, 1, 3], [3, 0, 1, 2]]
    f = rows["trained+bm25"]
    assert f["parse_rate"] is None
    assert f["ndcg@1"] == pytest.approx(2 / 3)
    assert f["mrr"] == pytest.approx((0.5 + 1 + 1) / 3)

    # Run files: one JSONL per ranker.
    lines = (Path(cfg.out) / "runs" / "trained.jsonl").read_text().splitlines()
    recs = [json.loads(x) for x in lines]
    assert recs[1] == {
        "qid": "s/q1",
        "ranking": [],
        "parsed_ok": False,
        "completion": TRAINED["P1"],
        "latency_ms": run.latency_ms[1],
    }
    assert (Path(cfg.out) / "runs" / "bm25.jsonl").is_file()
    assert (Path(cfg.out) / "runs" / "trained+bm25.jsonl").is_file()

    # The saved run re-scores to the same row without generating (--run), and fuses the same.
    again = _cfg(
        rl_folder,
        tmp_path / "again",
        runs=[("trained", str(Path(cfg.out) / "runs" / "trained.jsonl"))],
        fuse=["trained"],
        pairs=["trained-bm25"],
    )
    res2 = run_proxy_eval(again, backend_factory=_factory({}))
    for name in ("trained", "trained+bm25"):
        for metric in ("ndcg@1", "ndcg@5", "mrr", "parse_rate"):
            assert res2.rows[name][metric] == rows[name][metric], (name, metric)
    assert res2.rows["trained"]["latency_ms_p50"] == rows["trained"]["latency_ms_p50"]
    assert res2.rows["trained"]["spec"] == "saved run"
    assert "--run trained=" in res2.command


def test_saved_run_must_cover_the_questions_and_match_its_completions(
    rl_folder: Path, tmp_path: Path
) -> None:
    data = load_eval_data(rl_folder, "test")
    good = [
        {"qid": "s/q0", "ranking": [1, 0], "completion": "<ranking>1, 0</ranking>"},
        {"qid": "s/q1", "ranking": [], "completion": "nothing"},
        {"qid": "s/q2", "ranking": [3], "completion": "<ranking>3</ranking>"},
    ]

    def write(recs: list[dict]) -> Path:
        path = tmp_path / "run.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in recs))
        return path

    run = saved_run("t", write(good), data)
    assert run.rankings == [[1, 0], [], [3]] and run.parsed_ok == [True, False, True]
    assert run.latency_ms is None  # not recorded: the row shows none rather than 0
    with pytest.raises(DataError, match="1 of the 3 scored questions are not in the run"):
        saved_run("t", write(good[:2]), data)
    edited = [dict(good[0], ranking=[0, 1]), *good[1:]]
    with pytest.raises(DataError, match="not what its completion parses to"):
        saved_run("t", write(edited), data)
    with pytest.raises(DataError, match="line 1"):
        saved_run("t", write([{"ranking": []}]), data)
    with pytest.raises(DataError, match="not found"):
        saved_run("t", tmp_path / "missing.jsonl", data)


def test_fuse_order_uses_rrf_over_all_candidates() -> None:
    assert fuse_order([], [2, 0, 1]) == [2, 0, 1]
    assert fuse_order([1], [0, 1, 2]) == [1, 0, 2]
    assert sorted(fuse_order([3, 2], [0, 1, 2, 3])) == [0, 1, 2, 3]


def test_spec_mismatch_refused(rl_folder: Path, models, tmp_path: Path) -> None:
    cfg = _cfg(rl_folder, tmp_path, models=[("other", str(models["other"]))])
    with pytest.raises(MemSifterError) as e:
        run_proxy_eval(cfg, backend_factory=_factory({}))
    msg = str(e.value)
    assert "other" in msg and str(models["other"]) in msg and str(rl_folder) in msg
    assert "completion_tokens" in msg and "order" in msg and "model:" not in msg
    # explicit-spec does not override a spec that contradicts the data
    cfg.explicit_spec = ["other"]
    with pytest.raises(MemSifterError, match="another prompt"):
        run_proxy_eval(cfg, backend_factory=_factory({}))


def test_missing_spec_needs_explicit_spec(rl_folder: Path, models, tmp_path: Path) -> None:
    base = str(models["base"])
    cfg = _cfg(rl_folder, tmp_path, models=[("untrained", base)])
    with pytest.raises(MemSifterError, match="--explicit-spec untrained"):
        run_proxy_eval(cfg, backend_factory=_factory({base: BASE}))
    cfg.explicit_spec = ["untrained"]
    res = run_proxy_eval(cfg, backend_factory=_factory({base: BASE}))
    assert res.rows["untrained"]["parse_rate"] == 1.0
    assert res.rows["untrained"]["spec"] == "explicit"
    # the untrained "model" answered the prompt order, which is bm25's order on q0 and q2
    assert res.rows["untrained"]["ndcg@1"] == pytest.approx(0.0)


def test_bootstrap_contains_true_mean_and_is_degenerate_for_constant() -> None:
    rng = np.random.default_rng(1)
    a = {"ndcg@1": rng.normal(0.6, 0.2, 400), "mrr": np.full(400, 0.7)}
    b = {"ndcg@1": rng.normal(0.3, 0.2, 400), "mrr": np.full(400, 0.45), "only_b": np.ones(400)}
    out = paired_bootstrap(a, b, n_resamples=10_000, seed=0)
    assert set(out) == {"ndcg@1", "mrr"}
    lo, hi = out["ndcg@1"]["ci95"]
    d = a["ndcg@1"] - b["ndcg@1"]
    assert lo < 0.3 < hi and lo < d.mean() < hi
    se = d.std(ddof=1) / math.sqrt(len(d))
    assert hi - lo == pytest.approx(2 * 1.96 * se, rel=0.1)
    assert out["mrr"]["ci95"] == [0.7 - 0.45, 0.7 - 0.45]
    assert out["mrr"]["mean"] == pytest.approx(0.25)
    # seeded: the same call gives the same interval
    assert paired_bootstrap(a, b, n_resamples=10_000, seed=0)["ndcg@1"]["ci95"] == [lo, hi]


def test_cluster_bootstrap_resamples_users_and_widens_for_shared_questions() -> None:
    # 100 users x 4 questions that succeed or fail together: the per-question bootstrap
    # treats 400 draws as independent and is about twice too narrow; the cluster bootstrap
    # resamples the 100 users and is not.
    rng = np.random.default_rng(3)
    per_user = rng.normal(0.2, 0.5, 100)
    d = np.repeat(per_user, 4)
    users = np.repeat(np.arange(100), 4).tolist()
    a, b = {"m": d}, {"m": np.zeros_like(d)}
    flat = paired_bootstrap(a, b, n_resamples=4000, seed=0)["m"]
    clus = paired_bootstrap(a, b, n_resamples=4000, seed=0, clusters=users)["m"]
    assert flat["n_clusters"] == 400 and clus["n_clusters"] == 100 and clus["n"] == 400
    assert clus["mean"] == pytest.approx(d.mean())
    width = lambda v: v["ci95"][1] - v["ci95"][0]  # noqa: E731
    se_users = per_user.std(ddof=1) / math.sqrt(100)
    assert width(clus) == pytest.approx(2 * 1.96 * se_users, rel=0.15)
    assert width(clus) > 1.7 * width(flat)
    # unequal cluster sizes: the statistic stays the mean over questions
    sizes = paired_bootstrap(
        {"m": np.array([1.0, 1.0, 1.0, 0.0])}, {"m": np.zeros(4)}, 200, 0, clusters="aaab"
    )["m"]
    assert sizes["mean"] == pytest.approx(0.75) and sizes["n_clusters"] == 2
    assert 0.0 <= sizes["ci95"][0] <= sizes["ci95"][1] <= 1.0
    with pytest.raises(ValueError, match="3 cluster labels for 4 questions"):
        paired_bootstrap({"m": np.ones(4)}, {"m": np.zeros(4)}, 10, 0, clusters="abc")


def test_split_pair_with_hyphenated_names() -> None:
    names = ["bm25", "qwen3-4b", "qwen3-4b+bm25"]
    assert split_pair("qwen3-4b-bm25", names) == ("qwen3-4b", "bm25")
    assert split_pair("qwen3-4b+bm25-qwen3-4b", names) == ("qwen3-4b+bm25", "qwen3-4b")
    with pytest.raises(MemSifterError, match="--pair"):
        split_pair("nope-bm25", names)


def test_json_shape_and_report(rl_folder: Path, models, tmp_path: Path) -> None:
    trained = str(models["trained"])
    cfg = _cfg(
        rl_folder,
        tmp_path,
        models=[("trained", trained)],
        fuse=["trained"],
        pairs=["trained-bm25", "trained+bm25-trained"],
        model_name="memsifter-smollm2-135m-locomo",
        start="sft",
        n_bootstrap=500,
    )
    res = run_proxy_eval(cfg, backend_factory=_factory({trained: TRAINED}))
    out = json.loads(cfg.json_path.read_text())
    required = {
        "split",
        "n_questions",
        "n_with_gold_in_prompt",
        "model",
        "rankers",
        "start",
        "paired_ci95",
    }
    assert required <= set(out)
    assert out["split"] == {"train": ["c0", "c1"], "validation": ["c7"], "test": ["c8", "c9"]}
    assert (out["n_questions"], out["n_with_gold_in_prompt"]) == (4, 3)
    assert out["model"] == "memsifter-smollm2-135m-locomo" and out["start"] == "sft"
    assert set(out["rankers"]) == {"bm25", "trained", "trained+bm25"}  # untrained not run
    for row in out["rankers"].values():
        for k in ("ndcg@1", "ndcg@5", "ndcg@10", "recall@1", "recall@5", "mrr", "parse_rate"):
            assert k in row
    assert out["rankers"]["bm25"]["parse_rate"] is None
    assert set(out["paired_ci95"]) == {"trained-bm25", "trained+bm25-trained"}
    ci = out["paired_ci95"]["trained-bm25"]
    assert set(ci) == {"ndcg@1", "ndcg@5", "ndcg@10", "recall@1", "recall@5", "mrr"}
    assert all(isinstance(v, list) and len(v) == 2 and v[0] <= v[1] for v in ci.values())
    assert out["sample"] is None
    # The code that made it (memsifter.provenance), in the JSON and the report's text.
    from memsifter.provenance import code_version

    assert out["code_version"] == code_version() and out["code_version"]

    md = cfg.md_path.read_text()
    assert "Failed parses score 0" in md
    assert "machine:" in md and "memsifter eval proxy --data" in md
    assert f"at code version `{out['code_version']}`" in md
    assert "split `test`" in md and "`c8`, `c9`" in md
    assert "| trained-bm25 | ndcg@1 |" in md
    assert "| trained+bm25 | 3 |" in md
    assert res.files and all(p.is_file() for p in res.files)
    # The slices: one category ("1", not a LoCoMo qid), one candidate bin.
    assert out["slices"]["metric"] == "ndcg@1"
    cat = out["slices"]["category"]["1"]
    assert cat["n"] == 3 and cat["means"]["trained"] == pytest.approx(2 / 3)
    assert cat["vs_coarse"]["trained"]["mean"] == pytest.approx(1 / 3)
    assert list(out["slices"]["candidates"]) == ["1-4"]
    assert "## Where it wins and loses" in md


def test_slices_pair_each_group_against_the_coarse_row() -> None:
    from memsifter.evaluation.breakdown import breakdown, render_breakdown
    from memsifter.evaluation.proxy_data import Question

    def q(i: int, cat: str, n: int, conv: str) -> Question:
        return Question(f"locomo/q{i}", "P", n, tuple(range(n)), (0,), conv, cat)

    qs = [q(0, "4", 3, "c8"), q(1, "4", 9, "c9"), q(2, "2", 40, "c8"), q(3, "4", 9, "c8")]
    values = {
        "bm25": {"ndcg@1": np.array([1.0, 0.0, 0.0, 1.0])},
        "m": {"ndcg@1": np.array([0.0, 1.0, 1.0, 1.0])},
    }
    got = breakdown(qs, values, "bm25", n_bootstrap=200)
    single = got["category"]["single-hop"]
    assert single["n"] == 3
    assert single["means"] == {"bm25": pytest.approx(2 / 3), "m": pytest.approx(2 / 3)}
    assert single["vs_coarse"]["m"]["mean"] == pytest.approx(0.0)
    assert single["vs_coarse"]["m"]["n_clusters"] == 2  # conversations are resampled
    temporal = got["category"]["temporal"]
    assert temporal["n"] == 1 and temporal["vs_coarse"]["m"]["ci95"] == [1.0, 1.0]
    assert list(got["candidates"]) == ["1-4", "9-16", "33-64"]
    assert got["candidates"]["9-16"]["means"]["m"] == 1.0
    text = render_breakdown(got, "bm25", "ndcg@1")
    assert "| temporal | 1 | 0.000 | 1.000 (+1.000 [+1.000, +1.000]) |" in text


def test_split_lists_with_several_sources(tmp_path: Path) -> None:
    split = {
        "sources": {
            "a": {"train": ["1"], "validation": ["2"], "test": ["3"], "unused": []},
            "b": {"train": ["x"], "validation": [], "test": ["y"]},
        }
    }
    (tmp_path / "split.json").write_text(json.dumps(split))
    assert read_split_lists(tmp_path) == {
        "a": {"train": ["1"], "validation": ["2"], "test": ["3"]},
        "b": {"train": ["x"], "validation": [], "test": ["y"]},
    }


def test_cli_end_to_end(
    rl_folder: Path, models, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    answers = {str(models["trained"]): TRAINED, str(models["base"]): BASE}
    seen: dict[str, dict] = {}

    def fake_build_backend(spec):
        assert spec.kind == "transformers"
        seen[spec.model] = spec.kwargs()
        return FakeBackend(spec.model, answers[spec.model])

    monkeypatch.setattr("memsifter.llm.build_backend", fake_build_backend)
    out = tmp_path / "cli"
    args = [
        "eval",
        "proxy",
        "--data",
        str(rl_folder),
        "--model",
        f"trained={models['trained']}",
        "--model",
        f"untrained={models['base']}",
        "--explicit-spec",
        "untrained",
        "--fuse",
        "trained",
        "--pair",
        "trained-bm25",
        "--pair",
        "trained-untrained",
        "--max-questions",
        "2",
        "--batch-size",
        "3",
        "--threads",
        "1",
        "--no-invariance",
        "--out",
        str(out),
        "--out-json",
        str(tmp_path / "proxy.json"),
        "--model-name",
        "m",
        "--start",
        "base",
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "trained+bm25" in res.output
    assert seen[str(models["trained"])] == {"batch_size": 3, "threads": 1}
    data = json.loads((tmp_path / "proxy.json").read_text())
    assert set(data["rankers"]) == {"bm25", "trained", "untrained", "trained+bm25"}
    assert data["sample"] == {"max_questions": 2, "seed": 0}
    assert data["rankers"]["trained"]["n"] == 2
    assert "parse_rate" in data["paired_ci95"]["trained-untrained"]
    md = (out / "report.md").read_text()
    assert "seeded random sample of 2" in md

    # a model without a spec and without --explicit-spec: a named error, exit 2
    bad = CliRunner().invoke(
        app,
        ["eval", "proxy", "--data", str(rl_folder), "--model", f"u={models['base']}"],
    )
    assert bad.exit_code == 2
    assert "--explicit-spec u" in bad.output
    bad = CliRunner().invoke(
        app, ["eval", "proxy", "--data", str(rl_folder), "--model", "no-equals-sign"]
    )
    assert bad.exit_code == 2 and "NAME=PATH" in bad.output


def test_pair_start_alias_names_the_start_model() -> None:
    from memsifter.evaluation.proxy_eval import split_pair

    names = ["bm25", "sft", "trained", "trained+bm25"]
    assert split_pair("trained-start", names, "sft") == ("trained", "sft")
    assert split_pair("trained-sft", names, "sft") == ("trained", "sft")
    with pytest.raises(MemSifterError):
        split_pair("trained-start", names, None)


def test_a_start_that_names_no_ranker_is_refused_before_any_model_loads(tmp_path: Path) -> None:
    from memsifter.evaluation.proxy_eval import validate

    def cfg(**kw: object) -> ProxyEvalConfig:
        return ProxyEvalConfig(data="d", out=str(tmp_path), **kw)  # type: ignore[arg-type]

    models = [("start", "m0"), ("cold", "m1")]
    # A ranker may be named start when --start is left out (a pair's start is that ranker) ...
    assert validate(cfg(models=models, pairs=["cold-start"]), "bm25")[1] == "start"
    # ... but --start must name a ranker, and not one beside another named start.
    with pytest.raises(MemSifterError, match=r"'cold-start': no way to read it as A-B"):
        validate(cfg(models=[("cold", "m1")], pairs=["cold-start"], start="base"), "bm25")
    assert validate(cfg(models=[("cold", "m1")], pairs=["cold-bm25"], start="base"), "bm25")
    with pytest.raises(MemSifterError, match=r"a pair's `start` would mean both"):
        validate(cfg(models=models, pairs=["cold-start"], start="cold"), "bm25")
