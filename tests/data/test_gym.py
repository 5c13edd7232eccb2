"""The memory gym: its world is seeded and exact, its reader is the careful reader the card
describes, and the reward service scores it through the ordinary answerer seam."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memsifter.data import load_dataset
from memsifter.data.gym import (
    LEVELS,
    UNKNOWN,
    GymConfig,
    generate_world,
    parse_question,
    parse_statements,
    to_dataset,
    world_json,
    world_stats,
    write_world,
)
from memsifter.errors import DataError
from memsifter.llm import BackendSpec, SamplingParams, build_backend
from memsifter.llm.gym import GymBackend
from memsifter.qa.answerer import Answerer
from memsifter.qa.scores import task_score


def _answerer() -> Answerer:
    return Answerer(
        GymBackend(), window_tokens=4096, max_new_tokens=16, memory_order="chronological"
    )


def test_same_config_same_bytes_and_seed_changes_the_world() -> None:
    a = world_json(generate_world(GymConfig(seed=3, size="ci", level="history")))
    b = world_json(generate_world(GymConfig(seed=3, size="ci", level="history")))
    c = world_json(generate_world(GymConfig(seed=4, size="ci", level="history")))
    assert a == b
    assert a != c


def test_written_world_loads_as_the_generated_one(tmp_path) -> None:
    world = generate_world(GymConfig(size="ci"))
    path = write_world(world, tmp_path / "w")
    assert (tmp_path / "w" / "README.md").read_text().startswith("# Memory gym world")
    from_file = load_dataset("gym", path)
    from_folder = load_dataset("gym", tmp_path / "w")
    direct = to_dataset(world)
    assert [q.qid for q in from_file.queries] == [q.qid for q in direct.queries]
    assert [s.render() for s in from_folder.conversations["user0000"]] == [
        s.render() for s in direct.conversations["user0000"]
    ]
    assert from_file.splits == direct.splits


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"level": "hard"}, "level"),
        ({"size": "huge"}, "size"),
        ({"seed": -1}, "seed"),
        ({"users": 2}, "users"),
        ({"attributes_per_user": 6}, "attributes_per_user"),
        ({"split": (0.5, 0.5, 0.0)}, "split"),
        ({"split": (0.5, 0.2, 0.2)}, "split"),
        ({"users": 4, "split": (0.9, 0.05, 0.05)}, "users"),
    ],
)
def test_bad_configs_are_named_errors(change, field) -> None:
    with pytest.raises(DataError) as e:
        generate_world(GymConfig(**{"size": "ci", **change}))
    assert e.value.field == field


def test_yaml_config_with_an_unknown_key_is_refused(tmp_path) -> None:
    p = tmp_path / "w.yaml"
    p.write_text("seed: 0\nlevl: stale\n")
    with pytest.raises(DataError, match="levl"):
        load_dataset("gym", p)


def test_a_file_that_is_not_a_world_is_refused(tmp_path) -> None:
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(DataError, match="not a gym world"):
        load_dataset("gym", p)


@pytest.mark.parametrize("level", LEVELS)
def test_exactly_one_useful_session_per_memory_question(level) -> None:
    """The card's promise, checked with the reader itself: alone, the useful session answers
    right and every other session does not; the whole history answers right; no memory answers
    only the no-memory questions."""
    ds = to_dataset(generate_world(GymConfig(size="ci", level=level, none_questions=1)))
    a = _answerer()
    for q in ds.queries:
        hs = list(q.haystack)
        prompts = [a.render(q.question, [s], q.question_date, times=[0]) for s in hs]
        prompts.append(a.render(q.question, hs, q.question_date, times=list(range(len(hs)))))
        prompts.append(a.render(q.question, [], q.question_date, times=[]))
        outs = a.answer_texts(prompts)
        right = [s.id for s, o in zip(hs, outs, strict=False) if task_score(o, q.answer, "em")]
        s_all, s_0 = (task_score(o, q.answer, "em") for o in outs[-2:])
        assert s_all == 1.0
        if q.meta["kind"] == "none":
            assert s_0 == 1.0 and len(right) == len(hs)
        else:
            assert s_0 == 0.0
            assert right == list(q.meta["useful_session_ids"])
            # labels are the annotator's: the useful session plus what else states the attribute
            assert set(q.meta["useful_session_ids"]) <= set(q.gold_session_ids)


def test_stale_labels_disagree_with_outcome_and_the_card_counts_it() -> None:
    single = world_stats(generate_world(GymConfig(size="ci", level="single")))
    stale = world_stats(generate_world(GymConfig(size="ci", level="stale")))
    assert single["test"]["labels_disagree_share"] == 0.0
    assert stale["test"]["labels_disagree_share"] == 1.0
    assert stale["test"]["mean_labels_per_memory_question"] >= 2.0


def test_grammar_reads_what_it_writes_and_nothing_else() -> None:
    (s,) = parse_statements("Hi! I just moved from Paris to Lisbon.")
    assert (s.attribute, s.kind, s.prev, s.value, s.subject) == (
        "home",
        "change",
        "Paris",
        "Lisbon",
        "self",
    )
    (o,) = parse_statements("My sister lives in Oslo now.")
    assert (o.subject, o.value) == ("sister", "Oslo")
    assert parse_statements("Where do you think people live happiest now?") == []
    q = parse_question("Where did I live before Lisbon?")
    assert (q.kind, q.attribute, q.value) == ("earlier", "home", "Lisbon")
    assert parse_question("What is the meaning of life?") is None


def test_careful_reader_ignores_stale_and_other_peoples_values() -> None:
    backend = GymBackend()
    a = Answerer(backend, window_tokens=4096, max_new_tokens=16)
    world = generate_world(GymConfig(size="ci", level="stale"))
    ds = to_dataset(world)
    q = next(q for q in ds.queries if q.meta["kind"] == "current")
    distractors = [s for s in q.haystack if s.id not in q.meta["useful_session_ids"]]
    (out,) = a.answer_texts([a.render(q.question, distractors, q.question_date)])
    assert out == UNKNOWN
    assert backend.reader.stats["unknown_answers"] == 1


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400))
def test_reader_never_raises_and_counts_what_it_cannot_read(text) -> None:
    backend = GymBackend()
    (gens,) = backend.generate([text], SamplingParams(max_new_tokens=8))
    assert gens[0].text.startswith("<answer>")
    stats = backend.reader.stats
    assert stats["calls"] == 1
    if gens[0].text == f"<answer>{UNKNOWN}</answer>":
        assert stats["unknown_answers"] == 1


def test_odd_sessions_give_unknown_and_are_counted() -> None:
    backend = GymBackend()
    a = Answerer(backend, window_tokens=4096, max_new_tokens=16)
    from memsifter.data.types import Session, Turn

    undated = Session("x", (Turn("Maya", "I just moved to Lisbon."),))
    garbled = Session("y", (Turn("Maya", "I just moved to."),), date_text="31 Febuary 2023")
    outs = a.answer_texts(
        [
            a.render("Where do I live now?", [undated]),
            a.render("Where do I live now?", [garbled]),
            a.render("Who won the cup?", []),
        ]
    )
    assert outs == [UNKNOWN] * 3
    assert backend.reader.stats["undated_sessions"] == 2
    assert backend.reader.stats["unknown_questions"] == 1
    assert backend.reader.stats["unknown_answers"] == 3


def test_the_gym_backend_is_built_from_its_spec_like_any_other() -> None:
    backend = build_backend(BackendSpec(kind="gym", model="gym-reader"))
    assert isinstance(backend, GymBackend)
    with pytest.raises(ValueError, match="gym-reader"):
        build_backend(BackendSpec(kind="gym", model="Qwen/Qwen3-4B"))


def _requests(level: str = "stale"):
    from memsifter.rewards.service import RewardRequest

    ds = to_dataset(generate_world(GymConfig(size="ci", level=level, none_questions=1)))
    for q in ds.queries:
        hs = list(q.haystack)
        useful = [i for i, s in enumerate(hs) if s.id in q.meta["useful_session_ids"]]
        rest = [i for i in range(len(hs)) if i not in useful]
        ranks = [useful + rest, rest + useful]  # useful first, useful last
        yield (
            q,
            RewardRequest(
                question=q.question,
                answer=q.answer,
                candidates=tuple(hs),
                completions=tuple(f"<ranking>{', '.join(map(str, r))}</ranking>" for r in ranks),
                gold_ids=q.gold_session_ids,
                question_date=q.question_date,
                category=q.category,
                data_source=q.source,
            ),
        )


def test_the_outcome_reward_runs_through_the_unchanged_service_with_the_gym_reader() -> None:
    from pathlib import Path

    from memsifter.rewards import load_reward_config
    from memsifter.rewards.service import RewardService

    root = Path(__file__).resolve().parents[2]
    service = RewardService.from_config(
        load_reward_config(root / "configs/rewards/gym_outcome.yaml")
    )
    absolute = RewardService.from_config(
        load_reward_config(root / "configs/rewards/gym_outcome_absolute.yaml")
    )
    pairs = list(_requests())
    batch = service.score([r for _, r in pairs])
    flat = absolute.score([r for _, r in pairs])
    assert batch.stats.answer_calls > 0 and batch.stats.parse_rate == 1.0
    for (q, _), group, abs_group in zip(pairs, batch.rewards, flat.rewards, strict=True):
        first, last = group
        if q.meta["kind"] == "none":
            # s_0 = 1: memory adds nothing, whatever the ranking; the absolute score is 1 each
            assert first.tier_scores[0] == 1.0 and first.r_ans == last.r_ans == 0.0
            assert abs_group[0].r_ans == pytest.approx(1.0)
        else:
            assert first.tier_scores[0] == 0.0 and first.tier_scores[1] == 1.0
            assert first.r_ans > last.r_ans
            # with s_0 = 0 the two rewards agree
            assert abs_group[0].r_ans == pytest.approx(first.r_ans)


def test_labels_reward_pays_a_stale_mention_first_as_much_as_the_useful_session() -> None:
    """The disagreement the gym is built on: R_ret cannot tell the useful session from a stale
    mention of the same attribute; R_ans can."""
    from pathlib import Path

    from memsifter.rewards import load_reward_config
    from memsifter.rewards.service import RewardRequest, RewardService

    root = Path(__file__).resolve().parents[2]
    labels = RewardService.from_config(load_reward_config(root / "configs/rewards/gym_labels.yaml"))
    outcome = RewardService.from_config(
        load_reward_config(root / "configs/rewards/gym_outcome.yaml")
    )
    q, req = next((q, r) for q, r in _requests() if q.meta["kind"] == "current")
    hs = list(q.haystack)
    useful = next(i for i, s in enumerate(hs) if s.id in q.meta["useful_session_ids"])
    stale = next(i for i, s in enumerate(hs) if s.id in q.gold_session_ids and i != useful)
    rest = [i for i in range(len(hs)) if i not in (useful, stale)]
    ranks = [[useful, stale, *rest], [stale, useful, *rest]]
    req = RewardRequest(
        **{
            **req.__dict__,
            "completions": tuple(f"<ranking>{', '.join(map(str, r))}</ranking>" for r in ranks),
        }
    )
    ((a, b),) = labels.score([req]).rewards
    assert a.reward == b.reward > 0
    ((c, d),) = outcome.score([req]).rewards
    assert c.reward > d.reward


def test_cli_writes_the_same_world_twice_and_names_bad_values(tmp_path) -> None:
    from typer.testing import CliRunner

    from memsifter.cli import app

    runner = CliRunner()
    for name in ("a", "b"):
        res = runner.invoke(app, ["data", "gym", "--size", "ci", "--out", str(tmp_path / name)])
        assert res.exit_code == 0, res.output
    assert (tmp_path / "a/world.json").read_bytes() == (tmp_path / "b/world.json").read_bytes()
    res = runner.invoke(app, ["data", "gym", "--level", "hard", "--out", str(tmp_path / "c")])
    assert res.exit_code == 2 and "unknown gym level 'hard'" in res.output
    assert not (tmp_path / "c").exists()


def test_rl_data_uses_the_worlds_user_split(tmp_path) -> None:
    from memsifter.training.rldata.build import SourceSettings, split_conversations

    world = generate_world(GymConfig(size="ci"))
    ds = to_dataset(world)
    split = split_conversations(ds, SourceSettings(name="gym", dataset="gym", path="w.json"))
    assert split.method == "dataset"
    for name in ("train", "validation", "test"):
        assert list(split.of(name)) == [u["id"] for u in world.users if u["split"] == name]


def test_s0_shifts_a_whole_group_so_group_advantages_ignore_it() -> None:
    """Marginal utility against the absolute score, explained: s_0 is one number per prompt, so
    subtracting it moves every completion of a GRPO group by the same amount, and the group's
    advantages (r - mean) / std, TRL's ``scale_rewards: group``, are unchanged. The two recipes
    differ only where rewards are compared across prompts (``scale_rewards: batch``, curriculum
    scores, reward-based checkpoint selection's absolute level)."""
    from pathlib import Path

    import torch

    from memsifter.rewards import load_reward_config
    from memsifter.rewards.service import RewardRequest, RewardService

    root = Path(__file__).resolve().parents[2]
    marginal = RewardService.from_config(
        load_reward_config(root / "configs/rewards/gym_outcome.yaml")
    )
    absolute = RewardService.from_config(
        load_reward_config(root / "configs/rewards/gym_outcome_absolute.yaml")
    )
    reqs = []
    for _, req in _requests():
        n = len(req.candidates)
        # every one-id ranking: the group a one-id policy samples from
        comps = tuple(f"<ranking>{i}</ranking>" for i in range(n))
        reqs.append(RewardRequest(**{**req.__dict__, "completions": comps}))
    shifted = 0
    for m, a in zip(marginal.score(reqs).rewards, absolute.score(reqs).rewards, strict=True):
        rm = torch.tensor([c.reward for c in m])
        ra = torch.tensor([c.reward for c in a])
        s0 = m[0].tier_scores[0]
        assert torch.allclose(ra - rm, torch.full_like(rm, s0))
        shifted += s0 > 0
        if rm.std() > 0:
            adv_m = (rm - rm.mean()) / rm.std()
            adv_a = (ra - ra.mean()) / ra.std()
            assert torch.allclose(adv_m, adv_a, atol=1e-6)
    assert shifted > 0  # the no-memory questions: s_0 = 1, where the two rewards differ


@pytest.mark.parametrize("level", LEVELS)
def test_useful_at_places_the_useful_update_and_uniform_has_no_habit(level) -> None:
    def shares(useful_at: str) -> tuple[float, float]:
        cfg = GymConfig(size="ci", level=level, useful_at=useful_at)
        memory = [q for q in to_dataset(generate_world(cfg)).queries if q.meta["kind"] == "current"]
        useful = [
            next(i for i, s in enumerate(q.haystack) if s.id in q.meta["useful_session_ids"])
            for q in memory
        ]
        n = [len(q.haystack) for q in memory]
        last = sum(u == k - 1 for u, k in zip(useful, n, strict=True)) / len(memory)
        # early: the useful update precedes every session that is not an update
        early = sum(
            all(s.id in q.gold_session_ids for s in q.haystack[:u])
            and q.haystack[u].id in q.meta["useful_session_ids"]
            for q, u in zip(memory, useful, strict=True)
        )
        return last, early / len(memory)

    assert shares("late")[0] == 1.0
    assert shares("uniform")[0] < 0.6
    if level == "single":
        assert shares("early") == (0.0, 1.0)
    with pytest.raises(DataError, match="useful_at"):
        GymConfig(useful_at="middle").resolved()
