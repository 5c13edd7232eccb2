"""The TRL reward function: completions grouped by prompt inside the call, dataset columns as
per-completion lists (the contract of memsifter.rewards.columns), TRL's logging hooks used when
given and not needed when absent, the step taken from ``trainer_state``."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest

from memsifter.data.types import Query, Session, Turn
from memsifter.errors import DataError
from memsifter.qa.answerer import Answerer
from memsifter.ranker.prompt import BuiltPrompt
from memsifter.rewards import (
    REWARD_COLUMNS,
    RewardConfig,
    RewardRequest,
    RewardService,
    make_reward_function,
    reward_columns,
    sessions_from_column,
    sessions_to_column,
)
from memsifter.testing.rewards import FakeWorkingLLM, fact_sessions, ranking_text


def _service(cfg: RewardConfig | None = None) -> RewardService:
    order = (cfg or RewardConfig()).answerer.memory_order
    return RewardService(Answerer(FakeWorkingLLM(), 100_000, 8, memory_order=order), cfg)


def _rows(tag: str, n: int = 5) -> dict[str, Any]:
    return {
        "question": f"What is the fact of {tag}?",
        "answer": "blue Lisbon",
        "question_date": "9 May 2023",
        "candidates": sessions_to_column(fact_sessions(n, tag)),
        "gold_ids": [f"{tag}/s1"],
        "category": "2",
        "data_source": "locomo",
    }


def _trl_batch(layout: list[tuple[str, str]]) -> tuple[list[str], list[str], dict[str, list]]:
    """(prompt tag, completion) per completion, as TRL hands them over: columns repeated."""
    prompts = [f"<prompt {tag}>" for tag, _ in layout]
    completions = [c for _, c in layout]
    columns: dict[str, list] = {name: [] for name in REWARD_COLUMNS}
    for tag, _ in layout:
        for name, value in _rows(tag).items():
            columns[name].append(value)
    columns["unrelated"] = [0] * len(layout)  # other dataset columns are ignored
    return prompts, completions, columns


def test_groups_by_prompt_and_keeps_order() -> None:
    layout = [
        ("a", ranking_text([0, 1, 2])),
        ("b", ranking_text([1, 0])),
        ("a", ranking_text([1, 2, 0])),
        ("b", "no ranking"),
        ("a", ranking_text([0, 1, 2])),
        ("b", ranking_text([4, 3, 1])),
    ]
    prompts, completions, columns = _trl_batch(layout)
    service = _service()
    seen: list[list[RewardRequest]] = []
    score = service.score
    service.score = lambda reqs, step=0: seen.append(list(reqs)) or score(reqs, step)  # type: ignore[method-assign]
    fn = make_reward_function(service)
    rewards = fn(prompts=prompts, completions=completions, completion_ids=[[1]] * 6, **columns)

    assert [len(r.completions) for r in seen[0]] == [3, 3]  # one request per prompt
    assert [r.question for r in seen[0]] == ["What is the fact of a?", "What is the fact of b?"]
    assert seen[0][1].gold_ids == ("b/s1",) and seen[0][1].data_source == "locomo"
    direct = _service().score(
        [
            RewardRequest(
                question=f"What is the fact of {t}?",
                answer="blue Lisbon",
                candidates=fact_sessions(5, t),
                completions=tuple(c for tag, c in layout if tag == t),
                gold_ids=(f"{t}/s1",),
                question_date="9 May 2023",
                category="2",
                data_source="locomo",
            )
            for t in "ab"
        ]
    )
    a, b = iter(direct.rewards[0]), iter(direct.rewards[1])
    assert rewards == [next(a if tag == "a" else b).reward for tag, _ in layout]
    assert rewards[0] == rewards[4] and rewards[3] == -1.0  # the format reward
    # s_0 once per prompt: 2 s_0 prompts among the calls.
    assert sum("(no memory)" in p for p in service.answerer.backend.seen) == 2


def test_log_hooks_step_and_conversational_completions() -> None:
    layout = [("a", ranking_text([1, 0, 2])), ("a", "oops"), ("b", ranking_text([0]))]
    prompts, completions, columns = _trl_batch(layout)
    chat_prompts = [[{"role": "user", "content": p}] for p in prompts]
    chat_completions = [[{"role": "assistant", "content": c}] for c in completions]
    metrics: dict[str, float] = {}
    extra: dict[str, list] = {}
    fn = make_reward_function(_service(RewardConfig(beta0=0.5, decay_steps=10)))
    rewards = fn(
        prompts=chat_prompts,
        completions=chat_completions,
        trainer_state=SimpleNamespace(global_step=10),  # warm-up over: beta = 0
        log_metric=metrics.__setitem__,
        log_extra=extra.__setitem__,
        **columns,
    )
    for name in (
        "beta",
        "r_ans",
        "r_ret",
        "s_0",
        "s_1",
        "s_2",
        "s_3",
        "parse_rate",
        "format_failures",
        "answer_calls",
        "naive_calls",
        "call_ratio",
    ):
        assert f"reward/{name}" in metrics, name
    assert metrics["reward/beta"] == 0.0
    assert metrics["reward/parse_rate"] == pytest.approx(2 / 3)
    assert metrics["reward/format_failures"] == 1.0
    assert metrics["reward/naive_calls"] == 5 + 5  # tiers 1, 2, 3, 5 (+ s_0)
    assert extra["reward/r_ans"][1] is None and rewards[0] == extra["reward/r_ans"][0]
    assert rewards[1] == -1.0

    # Without hooks or trainer_state it still works; the step comes from fn.step.
    fn.step = 0
    plain = fn(prompts=prompts, completions=completions, **columns)
    assert fn.last_metrics["beta"] == 0.5
    assert plain[0] > rewards[0]  # R_ret of a ranking with the gold session first now counts


def test_column_errors() -> None:
    prompts, completions, columns = _trl_batch([("a", ranking_text([0])), ("a", ranking_text([1]))])
    fn = make_reward_function(_service())
    with pytest.raises(DataError, match="missing"):
        fn(prompts=prompts, completions=completions, question=columns["question"])
    bad = dict(columns, answer=["x"])
    with pytest.raises(DataError, match="answer"):
        fn(prompts=prompts, completions=completions, **bad)
    mixed = dict(columns, question=["q1", "q2"])
    with pytest.raises(DataError, match="disagree"):
        fn(prompts=prompts, completions=completions, **mixed)


def test_sessions_column_round_trip() -> None:
    tz = timezone(timedelta(hours=2))
    sessions = (
        Session(
            "c/1",
            (Turn("A", "hé 你好", "t1", datetime(2023, 5, 1, 9, 30, tzinfo=tz)), Turn("B", "ok")),
            date=datetime(2023, 5, 1, 9, 0, tzinfo=tz),
            date_text="9:00 am on 1 May, 2023",
            conversation_id="c",
        ),
        Session("c/2", (Turn("A", "no date"),)),
    )
    column = sessions_to_column(sessions)
    assert isinstance(column, str)
    back = sessions_from_column(column)
    assert back == sessions and [s.render() for s in back] == [s.render() for s in sessions]
    import json

    assert sessions_from_column(json.loads(column)) == sessions  # decoded records work too
    with pytest.raises(DataError):
        sessions_from_column('[{"id": "x"}]')


def test_reward_columns_follow_prompt_order() -> None:
    sessions = fact_sessions(4, "c")
    query = Query(
        qid="q1",
        question="What?",
        answer=2023,  # type: ignore[arg-type]  # LoCoMo has numeric answers
        haystack=sessions,
        gold_session_ids=("c/s2",),
        question_date="1 June 2023",
        category="2",
        source="locomo",
    )
    prompt = BuiltPrompt(
        messages=[],
        text="",
        candidate_ids=("c/s3", "c/s0", "c/s2"),  # chronological, one session cut
        n_tokens=0,
        budget_tokens=0,
        dropped_ids=("c/s1",),
    )
    row = reward_columns(query, prompt)
    assert set(row) == set(REWARD_COLUMNS)
    assert [s.id for s in sessions_from_column(row["candidates"])] == list(prompt.candidate_ids)
    assert row["answer"] == "2023" and row["gold_ids"] == ["c/s2"]
    assert row["data_source"] == "locomo"


def test_set_total_steps_sizes_the_warm_up(tmp_path: Any) -> None:
    from memsifter.errors import DataError as _DataError
    from memsifter.rewards import load_reward_config

    layout = [("a", ranking_text([1, 0, 2]))]
    prompts, completions, columns = _trl_batch(layout)
    cfg = RewardConfig(beta0=0.5, decay_steps=None, decay_fraction=0.5)
    fn = make_reward_function(_service(cfg))
    with pytest.raises(ValueError, match="set_total_steps"):
        fn(prompts=prompts, completions=completions, **columns)
    fn.set_total_steps(20)  # beta reaches 0 at step 10
    assert fn.service.shaping.decay_steps == 10 and fn.service.total_steps == 20

    def at(step: int) -> None:
        state = SimpleNamespace(global_step=step)
        fn(prompts=prompts, completions=completions, trainer_state=state, **columns)

    for step, beta in ((0, 0.5), (5, 0.25), (10, 0.0)):
        at(step)
        assert fn.last_metrics["beta"] == beta
    fn.clock.start_epoch(8)  # a later epoch: the run's clock, not the trainer's
    at(1)
    assert fn.last_metrics["beta"] == pytest.approx(0.05)
    # decay_steps configs need no total and ignore one.
    fixed = make_reward_function(_service(RewardConfig(decay_steps=10)))
    fixed.set_total_steps(1000)
    assert fixed.service.shaping.decay_steps == 10

    path = tmp_path / "r.yaml"
    path.write_text("decay_fraction: 0.3\n")  # decay_steps keeps its default 200: both set
    with pytest.raises(_DataError, match="decay_steps.*decay_fraction.*both set"):
        load_reward_config(path)
    path.write_text("decay_steps: null\ndecay_fraction: 0.3\n")
    assert load_reward_config(path).shaping.for_run(10).decay_steps == 3
    path.write_text("decay_steps: null\n")
    with pytest.raises(_DataError, match="decay_fraction"):
        load_reward_config(path)


def test_alpha_zero_logs_r_ans_as_absent() -> None:
    layout = [("a", ranking_text([1, 0, 2])), ("a", "oops"), ("b", ranking_text([0]))]
    prompts, completions, columns = _trl_batch(layout)
    metrics: dict[str, float] = {}
    extra: dict[str, list] = {}
    service = _service(RewardConfig(alpha=0.0, format_reward=0.0))
    fn = make_reward_function(service)
    rewards = fn(
        prompts=prompts,
        completions=completions,
        log_metric=metrics.__setitem__,
        log_extra=extra.__setitem__,
        **columns,
    )
    assert service.answerer.backend.batches == []  # the working LLM was never called
    assert "reward/r_ans" not in metrics and not any(k.startswith("reward/s_") for k in metrics)
    assert extra["reward/r_ans"] == [None, None, None]
    assert metrics["reward/r_ans_skipped"] == 2.0 and metrics["reward/answer_calls"] == 0.0
    assert metrics["reward/r_ret"] > 0.0
    assert rewards[1] == 0.0 and rewards[0] == 0.5 * extra["reward/r_ret"][0]
