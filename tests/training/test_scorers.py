"""Every data source a run trains on has a scorer, or the run refuses to start naming it.

A source whose task metric is ``judge`` with no judge endpoint (or an answerer on a server with
no URL) used to crash the run on the first batch holding one of its rows, hours in. Now
``RewardConfig.check_scorers`` refuses at start, and every shipped training config is checked
against every data source the shipped data recipes produce, with the endpoints a launch gives."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from memsifter.config import load_config
from memsifter.errors import DataError
from memsifter.rewards.config import (
    JudgeSettings,
    RewardConfig,
    load_reward_config,
    with_endpoints,
)
from memsifter.training.config import load_train_config

ROOT = Path(__file__).resolve().parents[2]
TRAIN_CONFIGS = sorted((ROOT / "configs" / "train").glob("*.yaml"))
REWARD_CONFIGS = sorted((ROOT / "configs" / "rewards").glob("*.yaml"))
JUDGE_URL = "http://judge:8002/v1"
ANSWERER_URL = "http://answerer:8001/v1"


def _recipe_sources() -> set[str]:
    """The ``data_source`` values the shipped data recipes produce (a row's data_source is its
    loader's dataset family)."""
    from memsifter.training.rldata.build import RLDataConfig

    sources = set()
    for path in sorted((ROOT / "configs" / "data").glob("*.yaml")):
        recipe = load_config(RLDataConfig, path)
        sources |= {s.dataset for s in recipe.sources}
    return sources


def _sources_for(config: Path) -> set[str]:
    """The sources a config must score: the memory gym's configs (gym_*) train on the gym alone,
    whose reader answers nothing else; every other config on every source."""
    return {"gym"} if config.name.startswith("gym_") else _recipe_sources()


def test_the_recipes_produce_locomo_longmemeval_and_the_gym() -> None:
    # The checks below are only as wide as this set.
    assert _recipe_sources() == {"locomo", "longmemeval", "gym"}


@pytest.mark.parametrize("path", REWARD_CONFIGS, ids=lambda p: p.name)
def test_every_reward_config_scores_every_source_once_launched(path: Path) -> None:
    cfg = load_reward_config(path)
    # A working LLM on a server gets its URL at launch too (train_multinode.sh always passes it).
    launched = with_endpoints(
        cfg,
        judge_url=JUDGE_URL if cfg.judge is not None else None,
        answerer_url=ANSWERER_URL if cfg.answerer.backend == "openai" else None,
    )
    launched.check_scorers(_sources_for(path), where=str(path))


@pytest.mark.parametrize("path", TRAIN_CONFIGS, ids=lambda p: p.name)
def test_every_train_config_has_a_scorer_or_refuses_to_start(path: Path) -> None:
    train = load_train_config(path)
    cfg = load_reward_config(ROOT / train.reward)
    sources = _sources_for(ROOT / train.reward)
    problems = {s: cfg.scorer_problem(s) for s in sources}
    for source, problem in problems.items():
        if problem is not None:
            # Refused at start, naming the source and the flag that fixes it.
            assert f"data source {source!r}" in problem
            assert "--judge-url" in problem or "--answerer-url" in problem
            with pytest.raises(DataError, match=f"data source '{source}'"):
                cfg.check_scorers(sources)
    answerer_url = ANSWERER_URL if cfg.answerer.backend == "openai" else None
    launched = with_endpoints(
        cfg, judge_url=JUDGE_URL if cfg.judge else None, answerer_url=answerer_url
    )
    launched.check_scorers(sources)


def test_the_paper_recipe_needs_the_judge_url_for_longmemeval() -> None:
    train = load_train_config(ROOT / "configs" / "train" / "qwen3_4b.yaml")
    # Its working LLM is a server (Qwen3-8B); --answerer-url is always given at launch.
    cfg = with_endpoints(load_reward_config(ROOT / train.reward), answerer_url=ANSWERER_URL)
    assert cfg.task_metric("longmemeval") == "judge" and cfg.judge is not None
    with pytest.raises(DataError, match="'longmemeval' is scored by the LLM judge") as e:
        cfg.check_scorers({"locomo", "longmemeval"})
    assert "--judge-url" in str(e.value) and "task_metrics.longmemeval: f1" in str(e.value)
    cfg.check_scorers({"locomo"})  # LoCoMo alone needs no judge
    launched = with_endpoints(cfg, judge_url=JUDGE_URL)
    assert launched.judge is not None and launched.judge.base_url == JUDGE_URL
    launched.check_scorers({"locomo", "longmemeval"})


def test_scorer_problems() -> None:
    judged = RewardConfig(task_metrics={"longmemeval": "judge"}, judge=None)
    assert "has no judge" in (judged.scorer_problem("longmemeval") or "")
    # The default names the judge model; its URL comes at launch.
    assert "no URL for its judge Qwen/Qwen3-8B" in (
        RewardConfig().scorer_problem("longmemeval") or ""
    )
    assert judged.scorer_problem("locomo") is None  # the default metric, f1
    no_default = RewardConfig(task_metrics={"locomo": "locomo"}, default_task_metric=None)
    assert "no task metric" in (no_default.scorer_problem("personamem") or "")
    # A retrieval-only stage scores no answers, so it needs no judge.
    assert replace(judged, alpha=0.0, format_reward=0.0).scorer_problem("longmemeval") is None
    remote = RewardConfig(answerer=replace(RewardConfig().answerer, backend="openai"))
    assert "--answerer-url" in (remote.scorer_problem("locomo") or "")
    assert with_endpoints(remote, answerer_url=ANSWERER_URL).scorer_problem("locomo") is None
    with_judge = replace(judged, judge=JudgeSettings(model="j", base_url=JUDGE_URL))
    assert with_judge.scorer_problem("longmemeval") is None


def test_judge_url_needs_a_judge_model() -> None:
    with pytest.raises(DataError, match="names no judge model"):
        with_endpoints(RewardConfig(judge=None), judge_url=JUDGE_URL)


def test_a_judge_without_url_builds_no_judge_backend() -> None:
    from memsifter.rewards.service import RewardService

    cfg = RewardConfig(judge=JudgeSettings(model="Qwen/Qwen3-8B"), alpha=0.0, format_reward=0.0)
    assert RewardService.from_config(cfg).judge is None


def test_train_refuses_a_judged_source_without_a_judge(
    tiny_qwen3: Path, locomo_mini_path: Path, tmp_path: Path
) -> None:
    """The refusal comes before any model loads (no SFT folder), naming the source."""
    from memsifter.ranker.spec import PromptSpec
    from memsifter.training.config import (
        ModelSettings,
        SFTSettings,
        TrackingSettings,
        TrainConfig,
    )
    from memsifter.training.loop import run_training
    from memsifter.training.rldata.build import RLDataConfig, SourceSettings, prepare_rl_data

    recipe = RLDataConfig(
        sources=[
            SourceSettings(
                name="locomo", path=str(locomo_mini_path), count=2, train_conversations=[0],
                validation_conversations=[1], test_conversations=[],
            )
        ],
        prompt=PromptSpec(  # type: ignore[arg-type]
            model=str(tiny_qwen3), window_tokens=640, completion_tokens=16, unit="page",
            turns_per_page=2,
        ),
    )  # fmt: skip
    prepare_rl_data(recipe, tmp_path / "rl")
    reward = tmp_path / "reward.yaml"
    reward.write_text(
        f"task_metrics:\n  locomo: judge\njudge:\n  model: {tiny_qwen3}\n"
        f"answerer:\n  model: {tiny_qwen3}\n",
        encoding="utf-8",
    )
    cfg = TrainConfig(
        output_dir=str(tmp_path / "out"),
        data=str(tmp_path / "rl"),
        reward=str(reward),
        model=ModelSettings(name=str(tiny_qwen3)),
        sft=SFTSettings(enabled=True),
        tracking=TrackingSettings(backend="none"),
    )
    with pytest.raises(DataError, match="data source 'locomo' is scored by the LLM judge") as e:
        run_training(cfg, log=lambda _: None)
    assert str(reward) in str(e.value)
    assert not (tmp_path / "out" / "sft").exists()
