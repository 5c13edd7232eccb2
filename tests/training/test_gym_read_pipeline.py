"""The reading gym end to end on the tiny proxy, CI's fast check of the pipeline that
``eval/probes/gym_reading.py`` runs with SmolLM2: a ``read`` world, RL data labelled by letters
(one prefill ranks the window), the head's Plackett–Luce GRPO on the gym reader's outcome
reward, validation against the useful session(s), and the test-time rankers of the report.

It checks wiring, not learning: whether a model learns to read is measured by the ladder's
committed runs (``eval/results/gym_reading/gym_reading.md``); the learning tests with negative
controls are ``tests/training/test_gym_learning.py``'s."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def read_world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import yaml

    from memsifter.testing.gym import gym_rl_data, read_corpus

    world = yaml.safe_load((ROOT / "configs/gym/read_ci.yaml").read_text())
    return gym_rl_data(
        tmp_path_factory.mktemp("gym_read"),
        world,
        ROOT / "configs/data/gym_read_first_token.yaml",
        corpus=read_corpus(),
    )


def test_read_data_is_labelled_by_letters_with_both_useful_sessions(
    read_world: dict[str, Path],
) -> None:
    from memsifter.ranker.checkpoint import read_spec
    from memsifter.training.loop import load_rl_data

    spec = read_spec(read_world["data"])
    assert spec.labels == "letters" and spec.ranking_head == "first_token"
    train, held_out = load_rl_data(read_world["data"])
    rows = list(train)
    assert rows and all(r["prompt"].endswith("<ranking>") for r in rows)
    assert all("[Session A]" in r["prompt"] and "[Session 0]" not in r["prompt"] for r in rows)
    sizes = {len(r["useful_positions"]) for r in rows}
    assert sizes == {1, 2}  # `when` questions need two sessions; the rest one
    assert max(int(r["n_candidates"]) for r in rows) >= 10  # past the digits' capacity


def test_read_world_trains_and_validates_on_the_tiny_proxy(read_world: dict[str, Path]) -> None:
    from memsifter.training.config import load_train_config
    from memsifter.training.loop import run_training

    out = read_world["tmp"] / "outcome"
    cfg = load_train_config(
        ROOT / "configs/train/gym_read_pl_outcome.yaml",
        [
            f"output_dir={out}",
            f"data={read_world['data']}",
            f"model.name={read_world['proxy']}",
            "model.lora.top_layers=2",
            "epochs.max_steps=4",
            "epochs.save_steps=2",
            "epochs.validation_max_questions=16",
        ],
    )
    result = run_training(cfg, log=lambda _: None)
    assert Path(result["model"]).is_dir()
    state = json.loads((out / "epoch-0" / "checkpoint-4" / "trainer_state.json").read_text())
    log = state["log_history"]
    assert [e["step"] for e in log] == [1, 2, 3, 4]
    # R_ans reads the top 8 (tiers to 8): only that prefix is drawn and trained
    assert all(e["pl_depth"] == 8 for e in log), log
    assert all(-2.0 <= e["reward"] <= 2.0 and e["entropy"] > 0 for e in log)
    validation = json.loads((out / "epoch-0" / "validation.json").read_text())
    assert all(v["ndcg_1_useful"] is not None for v in validation.values()), validation


def test_the_reports_sample_and_steps_to_learn_choose_by_ids_only() -> None:
    import eval.probes.gym_reading as gym_reading

    rows = [{"conversation": f"u{i % 5}", "qid": f"q{i}"} for i in range(40)]
    sample = gym_reading.sample_per_user(rows, 2)
    assert len(sample) == 10 and {r["conversation"] for r in sample} == {f"u{i}" for i in range(5)}
    assert sample == gym_reading.sample_per_user(list(rows), 2)  # seeded by the user id
    assert gym_reading.sample_per_user(rows, None) == rows
    assert gym_reading.steps_to_learn([(0, 0.1), (20, 0.79), (40, 0.8), (60, 0.95)]) == 40
    assert gym_reading.steps_to_learn([(0, 0.1), (20, 0.5)]) is None


def test_a_variant_is_its_recipe_under_its_own_name() -> None:
    import typer

    import eval.probes.gym_reading as gym_reading

    assert gym_reading.recipe_of("outcome_kl+b32") == "outcome_kl"
    assert gym_reading.recipe_of("labels") == "labels"
    assert gym_reading.run_name("labels+kl") == "labels+kl"
    with pytest.raises(typer.BadParameter, match=r"'label\+kl': a run is a recipe"):
        gym_reading.run_name("label+kl")
    argv = ["--stage", "eval", "--note", "a long note", "--per-user", "2", "--note=another"]
    assert gym_reading.without_notes(argv) == ["--stage", "eval", "--per-user", "2"]


def test_reward_ablations_pair_by_what_was_trained_not_by_name() -> None:
    import eval.probes.gym_reading as gym_reading

    kl = [
        "grpo.beta=0.05",
        "grpo.learning_rate=5e-4",
        "grpo.num_generations=64",
        "grpo.per_device_train_batch_size=512",
        "epochs.max_steps=200",
        "epochs.save_steps=40",
    ]

    def run(recipe: str, *over: str) -> dict[str, Any]:
        return {"config": gym_reading.RECIPES[recipe], "overrides": list(over)}

    records = {
        "outcome_kl": run("outcome_kl"),  # the KL recipe: its values are in its file
        "labels+kl": run("labels", *kl, "threads=4"),  # the same values, set; threads place it
        "outcome_absolute+kl": run("outcome_absolute", *kl[:-1]),  # saves every 80: not a pair
        "labels": run("labels"),  # the plain recipe: another lr, beta and budget
        "outcome": run("outcome"),
        "outcome+lr": run("outcome", "grpo.learning_rate=1e-3"),
        "old": {"overrides": []},  # a record without its config pairs with nothing
    }
    assert gym_reading.ablations(records, list(records)) == {
        "outcome_kl": {"labels": "labels+kl"},
        "outcome": {"labels": "labels"},
    }
    # only the runs being evaluated pair
    assert gym_reading.ablations(records, ["outcome_kl", "labels"]) == {}


def test_same_first_session_follows_the_session_not_the_label() -> None:
    """A content ranker names the same session first in both orders; a position habit (label 0
    first whatever is shown) agrees only where the shuffle left that session at label 0."""
    import eval.probes.gym_reading as gym_reading
    from memsifter.data.types import Session, Turn
    from memsifter.rewards.columns import sessions_to_column

    def column(ids: list[str]) -> str:
        return sessions_to_column([Session(i, (Turn("user", "hi"),)) for i in ids])

    rows = [{"candidates": column(["a", "b", "c"])}] * 3
    prow = [
        {"candidate_ids": ["c", "a", "b"]},  # a moved to label 1
        {"candidate_ids": ["a", "c", "b"]},  # a stayed at label 0
        {"candidate_ids": ["b", "c", "a"]},
    ]
    date_first_a = [[0, 1, 2]] * 3
    content = [[1, 0, 2], [0, 1, 2], [2, 0, 1]]  # a first, wherever it is shown
    habit = [[0, 1, 2]] * 3  # label 0 first
    assert gym_reading.same_first_session(content, date_first_a, prow, rows) == [True] * 3
    assert gym_reading.same_first_session(habit, date_first_a, prow, rows) == [
        False,
        True,
        False,
    ]
    # an empty answer (in either order) agrees with nothing
    assert gym_reading.same_first_session([[], *content[1:]], [[0], [], [0]], prow, rows) == [
        False,
        False,
        True,
    ]
    # The random-order scores a pair of rungs is compared on: a useful first place there (by
    # the permuted prompt's own positions), and the same session first as in date order.
    prow = [{**r, "useful_positions": [1]} for r in prow]  # a is useful in the first only
    scores = gym_reading.permuted_scores(content, date_first_a, prow, rows)
    assert scores["ndcg@1_useful"].tolist() == [1.0, 0.0, 0.0]
    assert scores["same_first_session"].tolist() == [1.0, 1.0, 1.0]
    assert gym_reading.permuted_scores(habit, date_first_a, prow, rows)[
        "same_first_session"
    ].tolist() == [0.0, 1.0, 0.0]


def test_order_augmentation_pairs_with_its_date_order_twin() -> None:
    import eval.probes.gym_reading as gym_reading

    def run(recipe: str, *over: str, share: float = 0.0) -> dict[str, Any]:
        record = {"config": gym_reading.RECIPES[recipe], "overrides": list(over)}
        return {**record, "train_shuffle_share": share} if share else record

    records = {
        "outcome_kl": run("outcome_kl", "epochs.max_steps=120"),
        "outcome_kl+shuffle50": run("outcome_kl", "epochs.max_steps=120", share=0.5),
        "outcome_kl+long": run("outcome_kl", "epochs.max_steps=200"),
        "outcome_kl+long_shuffle": run("outcome_kl", "epochs.max_steps=200", share=1.0),
    }
    assert gym_reading.order_twins(records, list(records)) == {
        "outcome_kl+shuffle50": "outcome_kl",
        "outcome_kl+long_shuffle": "outcome_kl+long",
    }
    # The share is learnt: a labels run with the KL recipe's values pairs with outcome_kl as
    # its reward ablation only when it saw the same orders.
    kl = [
        "grpo.beta=0.05",
        "grpo.learning_rate=5e-4",
        "grpo.num_generations=64",
        "grpo.per_device_train_batch_size=512",
        "epochs.max_steps=120",
        "epochs.save_steps=40",
    ]
    for share, paired in ((0.0, {"outcome_kl": {"labels": "labels+kl"}}), (0.5, {})):
        both = {"outcome_kl": records["outcome_kl"], "labels+kl": run("labels", *kl, share=share)}
        assert gym_reading.ablations(both, list(both)) == paired


def test_a_rung_is_named_by_its_order_only_when_it_is_not_the_dates() -> None:
    """The date-order rungs keep their committed names (and results keys); newest first is
    its own rung beside them."""
    import eval.probes.gym_reading as gym_reading

    name = gym_reading.rung_name
    assert name("small", "restated", "marker") == "small-restated-marker"
    assert name("small", "restated", "marker", "chronological") == "small-restated-marker"
    assert name("small", "restated", "marker", "newest_first") == "small-restated-marker-newest"
    assert name("small", "marked", "marker", "newest_first") == "small-marker-newest"
    key = gym_reading._key
    old = {"size": "small", "layout": "restated", "world_config": "w", "head_read": "marker"}
    assert key(old) == key({**old, "order": "chronological"})
    assert key(old) != key({**old, "order": "newest_first"})
    # The written ranking (the paper's form) is its own rung too; the head's keep their keys.
    assert name("ci", "paper", "label", "chronological", "generate") == "ci-generate"
    assert key(old) == key({**old, "ranking_head": "first_token"})
    assert key(old) != key({**old, "ranking_head": "generate"})


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--recipe", "outcome_kl", "--train-shuffle", "0.5"], "RECIPE+VARIANT"),
        (["--recipe", "outcome_kl+s", "--train-shuffle", "1.5"], "a share in (0, 1]"),
    ],
)
def test_train_shuffle_is_refused_where_it_would_overwrite_or_is_no_share(
    args: list[str], message: str
) -> None:
    import typer
    from typer.testing import CliRunner

    import eval.probes.gym_reading as gym_reading

    app = typer.Typer()
    app.command()(gym_reading.main)
    done = CliRunner().invoke(app, ["--head-read", "marker", "--stage", "train", *args])
    assert done.exit_code == 2, done.output
    assert message in " ".join(done.output.replace("│", " ").split()), done.output


def test_rankings_come_from_the_cache_the_model_or_the_committed_record_in_that_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run ranked on a lent GPU (or whose checkpoint is gone) is evaluated from its committed
    rankings of exactly these questions; a model that is here is always ranked again."""
    import eval.probes.gym_reading as gym_reading

    monkeypatch.setattr(gym_reading, "code_version", lambda: "here")
    cache, kept = tmp_path / "cache", tmp_path / "kept"
    cache.mkdir(), kept.mkdir()
    qids = ["q1", "q2"]
    committed = {"qids": qids, "rankings": [[1, 0], [0, 1]], "code_version": "gpu"}
    (kept / "run.json").write_text(json.dumps(committed))
    # No model, no cache: the committed record, left as it was.
    assert gym_reading.rankings_of("run", qids, cache, kept, None) == [[1, 0], [0, 1]]
    assert json.loads((kept / "run.json").read_text())["code_version"] == "gpu"
    # Other questions: nothing stands in.
    assert gym_reading.rankings_of("run", ["q1"], cache, kept, None) is None
    # The model is here: it ranks, whatever was committed, and its record says this version.
    made = gym_reading.rankings_of("run", qids, cache, kept, lambda: [[0, 1], [1, 0]])
    assert made == [[0, 1], [1, 0]]
    assert json.loads((kept / "run.json").read_text()) == {
        "qids": qids, "rankings": made, "code_version": "here"
    }  # fmt: skip
    # Then this machine's cache answers, and the record keeps the version that made it.
    monkeypatch.setattr(gym_reading, "code_version", lambda: "later")
    assert gym_reading.rankings_of("run", qids, cache, kept, lambda: [[9]]) == made
    assert json.loads((kept / "run.json").read_text())["code_version"] == "here"


def test_a_layout_pair_reads_the_other_rungs_committed_rankings_of_the_same_questions(
    read_world: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--against-layout``: each ranker here against its namesake on the other rung, scored on
    that rung's rows from its committed rankings of the same question ids; a ranker it never
    ranked has no pair, and questions it does not have are refused by count."""
    import typer

    import eval.probes.gym_reading as gym_reading
    from memsifter.evaluation.bootstrap import paired_bootstrap
    from memsifter.evaluation.gym import score_rankings

    monkeypatch.setattr(gym_reading, "ROOT", tmp_path)
    monkeypatch.setattr(gym_reading, "RUNS", tmp_path / "runs")
    data = read_world["data"]
    rows = [r for r in gym_reading.load_split(data, "test") if r["useful_positions"]][:12]
    qids = [str(r["qid"]) for r in rows]

    def ordered(useful_first: bool) -> list[list[int]]:
        out = []
        for r in rows:
            rest = [i for i in range(int(r["n_candidates"])) if i not in r["useful_positions"]]
            out.append(list(r["useful_positions"]) + rest if useful_first else rest)
        return out

    kept = tmp_path / "runs" / "other" / "rankings"
    kept.mkdir(parents=True)
    record = {"qids": qids, "rankings": ordered(True), "code_version": "there"}
    (kept / "start.json").write_text(json.dumps(record))
    values = {"start": score_rankings(rows, ordered(False))}

    def ci(a: Any, b: Any) -> Any:
        return paired_bootstrap(a, b, clusters=qids)

    pairs = gym_reading.layout_pairs(("other", data), ["start", "outcome"], rows, values, ci)
    assert list(pairs) == ["start-start@other"]  # outcome was never ranked there
    assert pairs["start-start@other"]["ndcg@1_useful"]["mean"] == pytest.approx(-1.0)
    # The same rankings on both sides: a pair of zeros (the pair reads both sides).
    values = {"start": score_rankings(rows, ordered(True))}
    same = gym_reading.layout_pairs(("other", data), ["start"], rows, values, ci)
    assert same["start-start@other"]["ndcg@1_useful"]["mean"] == 0.0
    stray = [*rows, {**rows[0], "qid": "gym/not-there"}]
    with pytest.raises(typer.BadParameter, match="lacks 1 of these 13 questions"):
        gym_reading.layout_pairs(("other", data), ["start"], stray, values, ci)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--layout", "restated", "--against-layout", "restated"], "this rung's own layout"),
        (["--layout", "restated", "--against-layout", "paper"], "no closing markers"),
        (["--world", "configs/gym/bench_world.yaml", "--against-layout", "restated"], "--world"),
        (["--against-order", "chronological"], "this rung's own order"),
        (["--order", "newest_first", "--against-order", "newest_first"], "this rung's own order"),
        (["--order", "oldest_first"], "choose from ['chronological', 'newest_first']"),
        (["--world", "configs/gym/bench_world.yaml", "--against-order", "newest_first"], "--world"),
        (["--ranking-head", "generate"], "--head-read, --stage probe and --train-shuffle"),
        (["--ranking-head", "generate", "--recipe", "outcome"], "first-token head's recipe"),
        (["--recipe", "generate"], "it needs --ranking-head generate"),
        (["--ranking-head", "listwise"], "choose from ['first_token', 'generate']"),
        (["--until-sft"], "stops a training run: give --stage train"),
    ],
)
def test_against_layout_is_refused_where_it_pairs_nothing(args: list[str], message: str) -> None:
    """Refused before anything is built: a rung against itself (by layout or by order), a
    layout the marker read cannot read, a probe world, an order that is no rung's."""
    import typer
    from typer.testing import CliRunner

    import eval.probes.gym_reading as gym_reading

    app = typer.Typer()
    app.command()(gym_reading.main)
    done = CliRunner().invoke(app, ["--head-read", "marker", "--stage", "eval", *args])
    assert done.exit_code == 2, done.output
    assert message in " ".join(done.output.replace("│", " ").split()), done.output


def _top_adapted(proxy: Path) -> tuple[Any, Any, int]:
    """The proxy with a LoRA adapter on its top layer, initialised away from the zero start so
    that the top layer changes the scores (a check against it then compares something)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(proxy))
    model = AutoModelForCausalLM.from_pretrained(str(proxy), dtype=torch.float32)
    layers = model.config.num_hidden_layers
    model = get_peft_model(
        model,
        LoraConfig(r=4, target_modules=["q_proj", "v_proj"], layers_to_transform=[layers - 1],
                   task_type="CAUSAL_LM"),
    )  # fmt: skip
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)
    return tok, model, layers


def test_the_frozen_prefix_probe_is_the_full_model_and_trains_only_the_top(
    read_world: dict[str, Path],
) -> None:
    """The probe's cached path (eval/probes/gym_reading.py FrozenPrefix) gives the full model's
    label logits to float noise, and its gradient reaches the top layers' adapters only."""

    import eval.probes.gym_reading as gym_reading
    from memsifter.ranker.checkpoint import read_spec
    from memsifter.ranker.first_token import label_token_ids

    tok, model, layers = _top_adapted(read_world["proxy"])
    rows = gym_reading.load_split(read_world["data"], "validation")
    n = max(int(r["n_candidates"]) for r in rows)
    labels = label_token_ids(tok, n, read_spec(read_world["data"]).labels)
    frozen = gym_reading.FrozenPrefix(model, 1, "cpu", autocast=False)
    assert frozen.check(tok, rows[0]["prompt"], labels) < 1e-4
    # The adapter moves those logits, so the check compares something the top layer shapes.
    with model.disable_adapter():
        assert frozen.check(tok, rows[0]["prompt"], labels) < 1e-4
        ids = tok(rows[0]["prompt"], add_special_tokens=False)["input_ids"]
        plain = frozen.logits(frozen.prefix(ids)).detach()[labels]
    adapted = frozen.logits(frozen.prefix(ids)).detach()[labels]
    assert (plain - adapted).abs().max() > 1e-3
    h = frozen.prefix(tok(rows[0]["prompt"], add_special_tokens=False)["input_ids"])
    frozen.logits(h)[labels].logsumexp(-1).backward()
    grads = {name for name, p in model.named_parameters() if p.grad is not None}
    assert grads and all(f"layers.{layers - 1}." in name for name in grads)
    assert model.get_base_model().model.layers is frozen.all  # the stack is restored


def _rendered_probe(record: dict[str, Any]) -> str:
    """The results page with one probe record on a bare rung."""
    import eval.probes.gym_reading as gym_reading

    rung = {"size": "small", "world_config": "w", "level": "read", "command": "c",
            "code_version": "v", "machine": "-"}  # fmt: skip
    rung["probes"] = {"p": {**record, "log": "x"}}
    return gym_reading.render({"rungs": [rung]})


def _marker_data(out: Path, layout: str) -> dict[str, Path]:
    """The CI reading world's RL data for the marker read on ``layout``, with the tiny proxy."""
    import yaml

    from memsifter.testing.gym import gym_rl_data, read_corpus

    world = yaml.safe_load((ROOT / "configs/gym/read_ci.yaml").read_text())
    # The read token must be one token of the tiny proxy's tokenizer, like every label.
    corpus = (*read_corpus(), *["[End of Session A]\n yes, yes"] * 200)
    return gym_rl_data(
        out,
        world,
        ROOT / "configs/data/gym_read_first_token.yaml",
        corpus=corpus,
        prompt={"layout": layout, "head_read": "marker"},
    )


@pytest.mark.parametrize("layout", ["marked", "restated"])
def test_the_marker_read_trains_and_validates_on_the_tiny_proxy(
    tmp_path: Path, layout: str
) -> None:
    """``head_read: marker`` through the whole loop: data rendered marked, the PL-GRPO trainer
    (each place credited with the tiers it can change) and validation reading each candidate
    at its closing marker, the checkpoint carrying the
    read (served with the other read, it is refused by name)."""

    from memsifter.ranker.checkpoint import PromptSpecError, read_spec, resolve_spec
    from memsifter.training.config import load_train_config
    from memsifter.training.loop import run_training

    made = _marker_data(tmp_path / "marker", layout)
    assert read_spec(made["data"]).head_read == "marker"
    assert read_spec(made["data"]).layout == layout
    out = tmp_path / "outcome"
    cfg = load_train_config(
        ROOT / "configs/train/gym_read_pl_outcome.yaml",
        [
            f"output_dir={out}",
            f"data={made['data']}",
            f"model.name={made['proxy']}",
            "model.lora.top_layers=2",
            "epochs.max_steps=2",
            "epochs.save_steps=2",
            "epochs.validation_max_questions=8",
            "grpo.pl_credit=tiers",  # each place credited with the tiers it can change
        ],
    )
    result = run_training(cfg, log=lambda _: None)
    assert read_spec(result["model"]).head_read == "marker"
    assert read_spec(result["model"]).layout == layout  # validation read it on the data's layout
    # The eval stage ranks the trained model on its own layout (a restated checkpoint read as
    # marked would be refused).
    import eval.probes.gym_reading as G

    rows = G.load_split(made["data"], "validation")[:3]
    ranked = G.rank_with(result["model"], rows, read_spec(made["data"]))
    assert [sorted(r) for r in ranked] == [list(range(int(r["n_candidates"]))) for r in rows]
    state = json.loads((out / "epoch-0" / "checkpoint-2" / "trainer_state.json").read_text())
    assert all(e["pl_depth"] == 8 and e["grad_norm"] > 0 for e in state["log_history"])
    validation = json.loads((out / "epoch-0" / "validation.json").read_text())
    assert all(v["ndcg_1_useful"] is not None for v in validation.values()), validation
    with pytest.raises(PromptSpecError, match="head_read: 'label'"):
        resolve_spec(str(result["model"]), {"head_read": "label"})
    # The probe's cached path reads the same marker scores as the full model (fp32 both).
    import eval.probes.gym_reading as gym_reading

    tok, model, _ = _top_adapted(made["proxy"])
    row = gym_reading.load_split(made["data"], "validation")[0]
    frozen = gym_reading.FrozenPrefix(model, 1, "cpu", autocast=True)
    marker = (int(row["n_candidates"]), "letters")
    assert frozen.check(tok, row["prompt"], [], marker) < 1e-4
    assert frozen.autocast  # restored after the fp32 check


def test_the_first_kinds_report_tells_update_detection_from_reading() -> None:
    """eval/probes/gym_first_kinds.py: a first place is counted by what the generator wrote there
    (the useful session, the asked attribute's own other update or a distractor of it, another
    attribute's update or other, small talk), by question kind, none questions left out."""
    from types import SimpleNamespace

    from eval.probes.gym_first_kinds import first_kinds

    def event(attr: str | None, kind: str, subject: str = "self") -> dict[str, Any]:
        return {"attribute": attr, "kind": kind, "subject": subject}

    sessions = [
        {"id": "u/s0", "event": event("city", "first")},
        {"id": "u/s1", "event": event("job", "change")},
        {"id": "u/s2", "event": event("city", "change")},
        {"id": "u/s3", "event": event("city", "other_change", "sister")},
        {"id": "u/s4", "event": event(None, "smalltalk")},
    ]
    questions = [
        {"id": "u/q0", "kind": "current", "attribute": "city", "useful_session_ids": ["u/s2"]},
        {"id": "u/q1", "kind": "earlier", "attribute": "city", "useful_session_ids": ["u/s0"]},
        {"id": "u/q2", "kind": "none", "attribute": None, "useful_session_ids": []},
    ]
    world = SimpleNamespace(sessions=sessions, questions=questions)
    cands = json.dumps([{"id": s["id"]} for s in sessions])
    rows = [{"qid": f"gym/u/q{i}", "source": "gym", "candidates": cands} for i in range(3)]

    def shares(firsts: list[int]) -> dict[str, dict[str, Any]]:
        ranks = [[f, *(j for j in range(5) if j != f)] for f in firsts]
        return first_kinds({"qids": [r["qid"] for r in rows], "rankings": ranks}, rows, world)

    reader = shares([2, 0, 4])
    assert reader["all"]["n"] == 2 and reader["all"]["useful"] == 1.0  # the none question: out
    detector = shares([1, 2, 0])  # an update, of the wrong attribute / the wrong time
    assert detector["current"]["other attribute, own update"] == 1.0
    assert detector["earlier"]["asked attribute, own update"] == 1.0
    assert shares([3, 4, 0])["all"] == {
        "n": 2, "useful": 0.0, "asked attribute, own update": 0.0, "asked attribute, other": 0.5,
        "other attribute, own update": 0.0, "other attribute, other": 0.0, "small talk": 0.5,
    }  # fmt: skip


def test_the_first_place_report_tells_position_from_content() -> None:
    """eval/probes/gym_first_place.py's summary: a recency habit (always the newest) and a reader
    (always the useful session) are told apart, and relative positions fall in the right bins."""
    from eval.probes.gym_first_place import first_place_report

    rows = [
        {"n_candidates": 5, "useful_positions": [1]},
        {"n_candidates": 11, "useful_positions": [0, 3]},
        {"n_candidates": 2, "useful_positions": [1]},
    ]
    newest = first_place_report([[4, 0], [10, 0], [1, 0]], rows)
    assert newest["first_is_newest"] == 1.0 and newest["first_rel_position_hist"] == [0, 0, 0, 0, 3]
    assert newest["first_is_useful"] == pytest.approx(1 / 3)
    reader = first_place_report([[1, 0], [3, 0], [1, 0]], rows)
    assert reader["first_is_useful"] == 1.0
    assert reader["first_rel_position_hist"] == [0, 2, 0, 0, 1]  # 0.25, 0.3, 1.0
    assert reader["first_rel_position_mean"] == pytest.approx((0.25 + 0.3 + 1.0) / 3)


def test_an_evaluation_keeps_the_rows_of_recipes_it_did_not_rerank() -> None:
    """A rung re-evaluated with another recipe keeps the earlier recipe's rows: joined to the
    table on the same sample (named as carried, with their own code version), or as a whole
    earlier table on another sample; training curves stay either way."""
    import eval.probes.gym_reading as gym_reading

    def evaluation(recipe: str, sample: str, version: str) -> dict[str, Any]:
        return {
            "split": "test", "n_questions": 4, "n_users": 2, "n_candidates_mean": 5.0,
            "n_unseen": 1, "n_s0_prior": 0, "n_two_session": 1, "sample": sample,
            "model": "m", "code_version": version, "command": f"run {recipe}", "machine": "-",
            "rankers": {"start": {"ndcg@1_useful": 0.1}, recipe: {"ndcg@1_useful": 0.5},
                        "shortcuts": {"recency": {"ndcg@1_useful": 0.2}}},
            "cluster_ci95": {f"{recipe}-start": {"ndcg@1_useful": [0.1, 0.7]}},
            "cluster_mean": {f"{recipe}-start": {"ndcg@1_useful": 0.4}},
            "most_common_first_share": {"start": 0.5, recipe: 0.25},
            "curves": {recipe: [[0, 0.1], [40, 0.85]]},
        }  # fmt: skip

    before = evaluation("outcome", "one a user", "v1")
    rung = {**before, **evaluation("outcome_kl", "one a user", "v2")}
    gym_reading.fold_earlier(before, rung)
    assert rung["carried"] == {"outcome": "v1"} and rung["earlier"] == []
    assert rung["rankers"]["outcome"] == {"ndcg@1_useful": 0.5}
    assert set(rung["cluster_ci95"]) == {"outcome-start", "outcome_kl-start"}
    assert rung["steps_to_learn"] == 40 and rung["steps_to_learn_by_recipe"]["outcome_kl"] == 40
    assert "Row `outcome` carried from the evaluation at `v1`" in gym_reading.render(
        {"rungs": [{**rung, "size": "small", "world_config": "w", "level": "read"}]}
    )
    other = {**before, **evaluation("outcome_kl", "two a user", "v2")}
    gym_reading.fold_earlier(before, other)
    assert other["carried"] == {} and "outcome" not in other["rankers"]
    assert [e["code_version"] for e in other["earlier"]] == ["v1"]
    assert other["earlier"][0]["rankers"]["outcome"] == {"ndcg@1_useful": 0.5}
    assert set(other["curves"]) == {"outcome", "outcome_kl"}
    text = gym_reading.render(
        {"rungs": [{**other, "size": "small", "world_config": "w", "level": "read"}]}
    )
    assert "### Earlier evaluation: `run outcome` at `v1` (one a user)" in text


def test_the_shortcuts_read_dates_not_labels(read_world: dict[str, Path]) -> None:
    """A rule's "latest" is the newest session whatever order the prompt shows: the same rows
    with their candidates newest first pick the same sessions (only ``position p`` follows the
    label)."""
    import eval.probes.gym_reading as gym_reading
    from eval.probes.gym_shortcuts import shortcut_rankings
    from memsifter.data.gym import load_world
    from memsifter.rewards.columns import sessions_from_column, sessions_to_column

    world = load_world(ROOT / "configs/gym/read_ci.yaml")
    rows = [r for r in gym_reading.load_split(read_world["data"], "test") if r["useful_positions"]]
    flipped = [
        {**r, "candidates": sessions_to_column(sessions_from_column(r["candidates"])[::-1])}
        for r in rows
    ]

    def picked(rs: list[dict[str, Any]]) -> dict[str, list[str]]:
        ranked = shortcut_rankings(world, rs, positions=True)
        return {
            name: [
                sessions_from_column(r["candidates"])[k[0]].id for k, r in zip(rk, rs, strict=True)
            ]
            for name, rk in ranked.items()
        }

    dated, newest = picked(rows), picked(flipped)
    rules = [n for n in dated if not n.startswith("position ")]
    assert len(rules) >= 8 and all(dated[n] == newest[n] for n in rules)
    assert dated["position 0"] != newest["position 0"]


def test_a_run_with_an_sft_start_is_paired_with_that_start(
    read_world: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The written ranking's recipe starts from a format SFT (``--ranking-head generate``): the
    eval ranks that start as ``<run>_sft`` and pairs the run with it, from committed rankings
    when the checkpoints are gone; a run without an SFT start gets no such row."""
    import eval.probes.gym_reading as gym_reading

    monkeypatch.setattr(gym_reading, "RUNS", tmp_path / "runs")
    # The start is ranked in the permuted order for real: by the proxy these prompts were
    # rendered for, not SmolLM2 (100 s of a 135M model on prompts of another tokenizer).
    monkeypatch.setattr(gym_reading, "MODEL", str(read_world["proxy"]))
    out = tmp_path / "ci-generate"
    rows = [r for r in gym_reading.load_split(read_world["data"], "test") if r["useful_positions"]]
    qids = [str(r["qid"]) for r in rows]
    useful_first = [
        list(r["useful_positions"])
        + [i for i in range(int(r["n_candidates"])) if i not in r["useful_positions"]]
        for r in rows
    ]
    wrong_first = [
        [i for i in range(int(r["n_candidates"])) if i not in r["useful_positions"]] for r in rows
    ]
    (out / "eval").mkdir(parents=True)
    (out / "eval" / "start.json").write_text(json.dumps(wrong_first))
    kept = tmp_path / "runs" / out.name / "rankings"
    kept.mkdir(parents=True)
    for name, rankings in (("generate", useful_first), ("generate_sft", wrong_first)):
        record = {"qids": qids, "rankings": rankings, "code_version": "gpu"}
        (kept / f"{name}.json").write_text(json.dumps(record))
    table = gym_reading.evaluate("ci", read_world["data"], out, ["generate"], per_user=None)
    assert table["rankers"]["generate"]["ndcg@1_useful"] == 1.0
    assert table["rankers"]["generate_sft"]["ndcg@1_useful"] == 0.0
    assert table["cluster_mean"]["generate-generate_sft"]["ndcg@1_useful"] == pytest.approx(1.0)
    assert table["models"]["generate_sft"] == "not here: its committed rankings"
    (kept / "generate_sft.json").unlink()
    table = gym_reading.evaluate("ci", read_world["data"], out, ["generate"], per_user=None)
    assert "generate_sft" not in table["rankers"]
    assert "generate-generate_sft" not in table["cluster_ci95"]


def test_the_warm_marker_probe_trains_the_marker_read_then_the_label_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--probe-warm-marker N``: the first N steps train the marker read alone, the steps after
    them the label read with the marker read's loss beside it, and validation scores both
    reads at every checkpoint. Refused by name without closers, without the cached pool, or
    with the marker read as the probe's own read."""
    import yaml

    import eval.probes.gym_reading as gym_reading
    from memsifter.testing.gym import gym_rl_data, read_corpus

    world = yaml.safe_load((ROOT / "configs/gym/read_ci.yaml").read_text())
    made = _marker_data(tmp_path / "restated", "restated")
    monkeypatch.setattr(gym_reading, "MODEL", str(made["proxy"]))
    lines: list[str] = []
    result = gym_reading.probe(
        made["data"], tmp_path, steps=4, lr=1e-3, top_layers=1, batch=2, autocast="none",
        log=lines.append, pool=6, read="label", warm_marker=2,
    )  # fmt: skip
    assert result["warm_marker_steps"] == 2
    assert [s for s, _ in result["curve"]] == [0, 1, 2, 3, 4]
    assert [s for s, _ in result["marker_curve"]] == [0, 1, 2, 3, 4]
    # The coarse filter's bar on the probe's own validation questions (one a user, 40 at most).
    val = gym_reading.sample_per_user(
        [r for r in gym_reading.load_split(made["data"], "validation") if r["useful_positions"]],
        1,
    )[:40]
    assert result["n_questions"] == len(val)
    first = [r["coarse_order"][0] in r["useful_positions"] for r in val]
    assert result["coarse_ndcg@1"] == round(sum(first) / len(val), 3)
    assert "coarse filter's first session on the same questions" in _rendered_probe(result)
    steps = [line for line in lines if line.startswith("probe step ") and "train loss" in line]
    assert [("(marker read)" in s, "(label read)" in s) for s in steps] == [
        (True, False),
        (True, False),
        (False, True),
        (False, True),
    ], steps
    assert all("label read" in s and "marker read" in s for s in steps)
    # --probe-copy-from marker: the same warm phase, then the label read trained on the marker
    # read's own first choice. The same seed makes the warm phases equal, so the first label
    # step's loss differs only through its target.
    copied: list[str] = []
    again = gym_reading.probe(
        made["data"], tmp_path, steps=4, lr=1e-3, top_layers=1, batch=2, autocast="none",
        log=copied.append, pool=6, read="label", warm_marker=2, copy_from="marker",
    )  # fmt: skip
    assert again["copy_from"] == "marker" and "copy_from" not in result
    steps_copied = [c for c in copied if c.startswith("probe step ") and "train loss" in c]
    # The warm phase is the same run (the adapter is seeded); the seconds may differ.
    assert [c.rsplit(", ", 1)[0] for c in steps_copied[:2]] == [
        c.rsplit(", ", 1)[0] for c in steps[:2]
    ]
    assert all("against the marker read's first choice" in c for c in steps_copied[2:])
    assert steps_copied[2].split(" over ")[0] != steps[2].split(" over ")[0]
    assert "on the marker read's own first choice" in _rendered_probe(again)
    # bf16 asked for on a CPU that emulates it is kept, and said once; float32 says nothing.
    assert not [line for line in lines + copied if "without bf16 units" in line]
    monkeypatch.setattr(gym_reading, "cpu_bf16_units", lambda: ())
    warned: list[str] = []
    gym_reading.probe(
        made["data"], tmp_path, steps=1, lr=1e-3, top_layers=1, batch=2, autocast="bf16",
        log=warned.append,
    )  # fmt: skip
    assert len([w for w in warned if "without bf16 units" in w]) == 1, warned
    for kwargs, message in (
        ({"pool": 0, "read": "label"}, "--probe-pool 0"),
        ({"pool": 6, "read": "marker"}, "got read 'marker'"),
        ({"pool": 6, "read": "label"}, r"in \[0, 1\)"),  # no step left for the label read
        ({"pool": 6, "read": "label", "warm_marker": 0, "copy_from": "marker"}, "got 0"),
        ({"pool": 6, "read": "label", "copy_from": "label"}, "copy-from 'label'"),
    ):
        with pytest.raises(ValueError, match=message):
            gym_reading.probe(
                made["data"], tmp_path, steps=1, lr=1e-3, top_layers=1, batch=2,
                autocast="none", log=lines.append, **{"warm_marker": 1, **kwargs},
            )  # fmt: skip
    paper = gym_rl_data(
        tmp_path / "paper", world, ROOT / "configs/data/gym_read_first_token.yaml",
        corpus=read_corpus(),
    )  # fmt: skip
    monkeypatch.setattr(gym_reading, "MODEL", str(paper["proxy"]))
    with pytest.raises(ValueError, match="layout 'paper'"):
        gym_reading.probe(
            paper["data"], tmp_path, steps=1, lr=1e-3, top_layers=1, batch=2, autocast="none",
            log=lines.append, pool=6, read="label", warm_marker=1,
        )  # fmt: skip


def test_a_teachers_rankings_are_the_heads_carried_to_the_written_rankings_prompts(
    read_world: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--teacher RUNG/RUN``: the head ranks its own rung's train pool (its labels, its
    layout), and the file the written ranking's format start reads holds the same sessions in
    the same order at that rung's positions, for every train prompt; a teacher that is not a
    trained head of this world is refused by name."""
    import shutil

    import typer
    import yaml
    from typer.testing import CliRunner

    import eval.probes.gym_reading as gym_reading
    from memsifter.ranker.checkpoint import read_spec
    from memsifter.rewards.columns import sessions_from_column
    from memsifter.testing.gym import gym_rl_data, read_corpus
    from memsifter.training.rldata.curriculum import read_rankings

    world = yaml.safe_load((ROOT / "configs/gym/read_ci.yaml").read_text())
    pen = gym_rl_data(
        tmp_path / "pen", world, ROOT / "configs/data/gym_read_generate.yaml", corpus=read_corpus()
    )
    monkeypatch.setattr(gym_reading, "ROOT", tmp_path)
    head = read_world["data"]
    record = gym_reading.teacher_rankings(read_world["proxy"], head, pen["data"], tmp_path / "t")
    theirs = gym_reading.load_split(head, "train_pool")
    rows = gym_reading.load_split(pen["data"], "train_pool")
    ranked = gym_reading.rank_with(read_world["proxy"], theirs, read_spec(head))
    file = read_rankings(tmp_path / "t", {str(r["qid"]): int(r["n_candidates"]) for r in rows})
    assert set(file) == {str(r["qid"]) for r in rows} and record["n_prompts"] == len(rows)

    def ids(r: dict[str, Any]) -> list[str]:
        return [s.id for s in sessions_from_column(r["candidates"])]

    theirs_by = {str(r["qid"]): (r, order) for r, order in zip(theirs, ranked, strict=True)}
    for r in rows:
        their_row, order = theirs_by[str(r["qid"])]
        shown = ids(r)
        want = [ids(their_row)[p] for p in order if ids(their_row)[p] in shown]
        assert [shown[p] for p in file[str(r["qid"])]] == want
    assert record["dropped_sessions"] == sum(
        len(o) - len(file[q]) for q, (_, o) in theirs_by.items() if q in file
    )

    app = typer.Typer()
    app.command()(gym_reading.main)
    for args, message in (
        (["--stage", "train", "--recipe", "generate"], "RECIPE+VARIANT names"),
        (["--stage", "eval", "--recipe", "generate+t"], "--stage train"),
    ):
        done = CliRunner().invoke(
            app, ["--size", "ci", "--ranking-head", "generate", *args, "--teacher", "r/outcome"]
        )
        assert done.exit_code == 2 and message in " ".join(done.output.replace("│", " ").split())
    rung = tmp_path / "outputs/gym_reading/ci-restated-marker"
    rung.mkdir(parents=True)
    (rung / "rung.json").write_text(
        json.dumps({"world_config": "configs/gym/read_ci.yaml", "runs": {"outcome": {}}})
    )
    for value, message in (
        ("nothing", "RUNG/RUN of a rung trained here"),
        ("ci-restated-marker/outcome", "has no trained run 'outcome' here"),
    ):
        with pytest.raises(typer.BadParameter, match=message):
            gym_reading.teacher_of(value, "configs/gym/read_ci.yaml")
    with pytest.raises(typer.BadParameter, match="not this rung's configs/gym/read_small.yaml"):
        gym_reading.teacher_of("ci-restated-marker/outcome", "configs/gym/read_small.yaml")
    # --teacher-start: the teacher's weights, whose closers must be in this rung's layout.
    shutil.copytree(head, rung / "data")
    record = {"model": str(read_world["proxy"])}
    (rung / "rung.json").write_text(
        json.dumps({"world_config": "configs/gym/read_ci.yaml", "runs": {"outcome": record}})
    )
    shutil.copytree(ROOT / "configs", tmp_path / "configs")  # the rung's name reads a recipe
    theirs = read_spec(head).layout
    other = next(x for x in ("paper", "marked", "restated") if x != theirs)
    base = ["--size", "ci", "--ranking-head", "generate", "--stage", "train", "--layout", other]
    for args, message in (
        (["--recipe", "generate+t", "--teacher-start"], "give --teacher"),
        (
            [
                "--recipe",
                "generate+t",
                "--teacher",
                "ci-restated-marker/outcome",
                "--teacher-start",
            ],
            f"the teacher's closers are in layout {theirs!r}, this rung's is {other!r}",
        ),
    ):
        done = CliRunner().invoke(app, [*base, *args])
        assert done.exit_code == 2, done.output
        assert message in " ".join(done.output.replace("│", " ").split()), done.output
    # --teacher-reads pen: the teacher's marker read, on a rung with closers.
    base = ["--size", "ci", "--ranking-head", "generate", "--stage", "train"]
    for args, message in (
        (["--recipe", "generate+t", "--teacher-reads", "pen"], "give --teacher"),
        (["--teacher", "ci-restated-marker/outcome", "--teacher-reads", "them"], "one of own, pen"),
        (
            ["--recipe", "generate+t", "--teacher", "ci-restated-marker/outcome"]
            + ["--teacher-reads", "pen", "--layout", "restated"],
            f"a marker-read teacher (this one reads {read_spec(head).head_read!r})",
        ),
    ):
        done = CliRunner().invoke(app, [*base, *args])
        assert done.exit_code == 2, done.output
        assert message in " ".join(done.output.replace("│", " ").split()), done.output


def test_a_lesson_read_at_the_pens_own_closers_is_the_teachers_marker_order_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--teacher-reads pen``: the lesson is the teacher's marker read at the closers of the
    written ranking's own prompts, under its digits, best first. Each ranking in the file
    sorts the marker token's logits at those closers, taken here by one plain forward over the
    prompt as rendered (the ``<ranking>`` the read appends changes nothing before it), for
    every train prompt."""
    from types import SimpleNamespace

    import torch
    import yaml
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import eval.probes.gym_reading as gym_reading
    from memsifter.ranker.first_token import marker_positions, marker_token_id
    from memsifter.testing.gym import gym_rl_data, read_corpus
    from memsifter.training.rldata.curriculum import read_rankings

    world = yaml.safe_load((ROOT / "configs/gym/read_ci.yaml").read_text())
    # The read token must be one token of the tiny proxy's tokenizer (as in _marker_data).
    corpus = (*read_corpus(), *["[End of Session A]\n yes, yes"] * 200)
    pen = gym_rl_data(
        tmp_path / "pen",
        world,
        ROOT / "configs/data/gym_read_generate.yaml",
        corpus=corpus,
        prompt={"layout": "restated"},
    )
    monkeypatch.setattr(gym_reading, "ROOT", tmp_path)
    record = gym_reading.teacher_rankings(
        pen["proxy"], tmp_path / "unread", pen["data"], tmp_path / "t", reads="pen"
    )
    rows = gym_reading.load_split(pen["data"], "train_pool")
    file = read_rankings(tmp_path / "t", {str(r["qid"]): int(r["n_candidates"]) for r in rows})
    assert set(file) == {str(r["qid"]) for r in rows}
    assert (record["reads"], record["n_prompts"], record["dropped_sessions"]) == (
        "pen",
        len(rows),
        0,
    )
    tok = AutoTokenizer.from_pretrained(pen["proxy"])
    model = AutoModelForCausalLM.from_pretrained(pen["proxy"], dtype=torch.float32).eval()
    read_id = marker_token_id(tok)
    for r in rows[:8]:
        n = int(r["n_candidates"])
        ids = tok(r["prompt"], add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :, read_id]
        at = logits[marker_positions(tok, r["prompt"], n, "digits")].tolist()
        order = list(file[str(r["qid"])])
        assert sorted(order) == list(range(n))
        assert all(at[a] >= at[b] - 1e-4 for a, b in zip(order, order[1:], strict=False))
        assert at[order[0]] > min(at)  # a real order, not a tie everywhere
    with pytest.raises(ValueError, match="layout 'paper' has no closing markers"):
        gym_reading.closer_rankings(pen["proxy"], rows, SimpleNamespace(layout="paper"))


def test_a_teacher_start_trains_the_written_ranking_from_the_teachers_weights(
    tmp_path: Path,
) -> None:
    """``--teacher-start``: the run's ``model.name`` is the teacher's weights as a base, set after
    the gym's own model, so the format SFT (and GRPO after it) grows from the teacher. With LoRA
    on the top layer only, the layers below come out of the SFT as the teacher's, not the
    untrained proxy's. ``--until-sft`` stops the run there."""
    import shutil

    import torch
    import yaml
    from safetensors.torch import load_file, save_file

    import eval.probes.gym_reading as gym_reading
    from memsifter.ranker.checkpoint import as_base
    from memsifter.testing.gym import gym_rl_data, read_corpus
    from memsifter.training.rldata.curriculum import write_rankings

    world = yaml.safe_load((ROOT / "configs/gym/read_ci.yaml").read_text())
    pen = gym_rl_data(
        tmp_path / "pen", world, ROOT / "configs/data/gym_read_generate.yaml", corpus=read_corpus()
    )
    teacher = tmp_path / "teacher"
    shutil.copytree(pen["proxy"], teacher)
    weights = load_file(teacher / "model.safetensors")
    torch.manual_seed(1)
    moved = {k: v + 0.05 * torch.randn_like(v) for k, v in weights.items()}
    save_file(moved, teacher / "model.safetensors", metadata={"format": "pt"})
    base = as_base(teacher, tmp_path / "base")
    rows = gym_reading.load_split(pen["data"], "train_pool")
    lesson = write_rankings(
        tmp_path / "rankings.jsonl",
        ((str(r["qid"]), list(range(int(r["n_candidates"])))[::-1]) for r in rows),
    )
    sets = [
        "sft.target=rankings",
        f"sft.rankings={lesson}",
        f"model.name={base}",
        "model.lora.top_layers=1",
        "threads=1",
        "grpo.per_device_train_batch_size=4",
        "epochs.validation_max_questions=2",
        "epochs.save_steps=1",
    ]
    record = gym_reading.train(
        "generate+t", pen["data"], tmp_path / "out", 1, sets=sets, until="sft"
    )
    assert f"model.name={base}" in record["overrides"]
    # --until-sft: the format start is the run's model, and no GRPO step was taken
    assert record["stage"] == "sft" and record["model"].endswith("generate+t/sft/final")
    assert not (tmp_path / "out/train/generate+t/epoch-0").exists()
    sft = load_file(tmp_path / "out/train/generate+t/sft/final/model.safetensors")
    low = [k for k in sft if ".layers.0." in k]
    assert low and all(torch.equal(sft[k], moved[k]) for k in low)
    assert not all(torch.equal(sft[k], weights[k]) for k in low)
    top = [k for k in sft if ".layers.1." in k and "proj" in k]
    assert any(not torch.equal(sft[k], moved[k]) for k in top)  # the SFT trained the top


def test_a_retrain_never_writes_over_a_runs_committed_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A training run whose name has committed records (logs, validation, lesson) would
    replace them: it is refused, naming the files, before anything is built; ``--records-as
    TAG`` writes the retrain's beside them, and a tag already taken is refused too."""
    import typer
    from typer.testing import CliRunner

    import eval.probes.gym_reading as gym_reading

    monkeypatch.setattr(gym_reading, "ROOT", tmp_path)
    monkeypatch.setattr(gym_reading, "RUNS", tmp_path / "runs")

    def built(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("built")

    monkeypatch.setattr(gym_reading, "build_data", built)
    kept = tmp_path / "runs" / "ci-restated-marker"
    kept.mkdir(parents=True)
    (kept / "outcome_kl_log.jsonl").write_text("{}\n")
    (kept / "outcome_kl_fp32_run.json").write_text("{}\n")
    (kept / "outcome_kl_fp32b_log.jsonl.bak").write_text("{}\n")  # not a record's name
    assert gym_reading.committed_records("ci-restated-marker", "outcome_kl") == [
        "runs/ci-restated-marker/outcome_kl_log.jsonl"
    ]
    app = typer.Typer()
    app.command()(gym_reading.main)
    base = ["--size", "ci", "--layout", "restated", "--head-read", "marker", "--stage", "train"]
    for args, message in (
        ([], "runs/ci-restated-marker/outcome_kl_log.jsonl: committed records of this run"),
        (["--records-as", "fp32"], "runs/ci-restated-marker/outcome_kl_fp32_run.json"),
        (["--records-as", "../x"], "'../x': a tag"),
        (["--records-as", "b", "--stage", "eval"], "without --stage eval"),
    ):
        done = CliRunner().invoke(app, [*base, "--recipe", "outcome_kl", *args])
        assert done.exit_code == 2, done.output
        assert message in " ".join(done.output.replace("│", " ").split()), done.output
    # Another run of the rung has nothing committed: it goes on to build its data.
    done = CliRunner().invoke(app, [*base, "--recipe", "outcome", "--records-as", "b"])
    assert isinstance(done.exception, RuntimeError) and str(done.exception) == "built"


def test_until_sft_is_refused_for_a_recipe_with_no_format_sft(
    read_world: dict[str, Path], tmp_path: Path
) -> None:
    """The head's outcome recipe starts GRPO with no format SFT: there is nothing to stop
    after, and the CLI says so by name before a model loads."""
    import typer

    import eval.probes.gym_reading as gym_reading

    with pytest.raises(typer.BadParameter, match="outcome: its recipe has no format SFT"):
        gym_reading.train("outcome", read_world["data"], tmp_path, 1, until="sft")
    assert not (tmp_path / "train/outcome").exists()


def test_a_probes_labelling_is_a_copy_of_the_rungs_data_with_the_same_questions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``build_data(labels=...)``: the copy probe's prompts are the rung's questions under another
    labelling, beside the rung's data (which keeps its own); the probe's counts read rankings
    as written, a ranking that did not parse counted as ``none``."""
    import eval.probes.gym_reading as gym_reading
    from eval.probes.gym_copy_probe import first_ids, shown_as
    from memsifter.ranker.checkpoint import read_spec
    from memsifter.testing.gym import build_gym_proxy, read_corpus

    monkeypatch.setattr(
        gym_reading, "MODEL", str(build_gym_proxy(tmp_path / "p", corpus=read_corpus()))
    )
    world = "configs/gym/read_ci.yaml"
    data = gym_reading.build_data(world, tmp_path, "restated", "marker")
    digits = gym_reading.build_data(world, tmp_path, "restated", "marker", labels="digits")
    assert digits == tmp_path / "data-labels_digits"
    assert (read_spec(data).labels, read_spec(digits).labels) == ("letters", "digits")
    rows, shown = (gym_reading.load_split(d, "validation") for d in (data, digits))
    assert [r["qid"] for r in rows] == [r["qid"] for r in shown]
    assert shown_as(rows) == shown_as(shown) != shown_as(shown[::-1])  # the probe's pairing
    for row, other in zip(rows, shown, strict=True):
        assert "[End of Session A]" in row["prompt"] and "[End of Session 0]" not in row["prompt"]
        assert (
            "[End of Session 0]" in other["prompt"] and "[End of Session A]" not in other["prompt"]
        )

    useful = [{"useful_positions": [2]}, {"useful_positions": [0, 1]}, {"useful_positions": [3]}]
    assert gym_reading.useful_first(useful, [[2, 0], [1], []]) == pytest.approx(0.667)
    assert first_ids([[2, 0], [1], [], [2]]) == {"1": 1, "2": 2, "none": 1}


def test_the_copy_probe_pairs_its_rankers_on_the_same_questions_by_user() -> None:
    """Every pair is a paired difference whose bootstrap draws users, not questions; a pair
    whose rankers were not both read is left out; the copy rate is counted on first
    positions, a ranking that did not parse matching nothing."""
    from eval.probes.gym_copy_probe import compare, same_first

    hits = {
        "pen_sft_start": [1.0, 1.0, 0.0, 1.0],
        "bm25": [0.0, 1.0, 0.0, 0.0],
        "teacher_digits": [0.0, 0.0, 1.0, 0.0],
    }
    out = compare(hits, ["u1", "u1", "u2", "u3"])
    assert set(out) == {"pen_sft_start-bm25", "pen_sft_start-teacher_digits"}
    assert out["pen_sft_start-bm25"]["mean"] == pytest.approx(0.5)
    assert (out["pen_sft_start-bm25"]["n"], out["pen_sft_start-bm25"]["n_users"]) == (4, 3)
    lo, hi = out["pen_sft_start-teacher_digits"]["ci95"]
    assert lo < 0.25 < hi
    # One user holds all six wins: drawn by user the CI reaches 0, drawn by question it would not.
    import numpy as np

    from memsifter.evaluation.bootstrap import paired_bootstrap

    pen, bm25, users = [1.0] * 6 + [0.0] * 6, [0.0] * 12, ["u1"] * 6 + [f"v{i}" for i in range(6)]
    drawn = compare({"pen_sft_start": pen, "bm25": bm25}, users)["pen_sft_start-bm25"]
    assert drawn["ci95"][0] == 0.0 and drawn["n_users"] == 7
    by_question = paired_bootstrap({"m": np.array(pen)}, {"m": np.array(bm25)})["m"]
    assert by_question["ci95"][0] > 0.0
    assert same_first([[2, 0], [1], [], [3]], [[2, 1], [0], [1], []]) == pytest.approx(0.25)
