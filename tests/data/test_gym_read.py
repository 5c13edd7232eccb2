"""The memory gym's ``read`` level: its grammar reads back what it writes, its reader answers
from the useful session(s) only, its config refuses what cannot be built, and its world and card
are exact functions of the config."""

from __future__ import annotations

import re

import pytest

from memsifter.data.gym import (
    GymConfig,
    dataset_card,
    generate_world,
    parse_question,
    to_dataset,
    world_json,
    world_stats,
)
from memsifter.data.gym_read_grammar import (
    DISTRACTOR_KINDS,
    READ_ATTRIBUTES,
    UPDATE_CUES,
    WHEN_FRAMES,
    parse_read_question,
    parse_read_statements,
    when_question,
)
from memsifter.errors import DataError
from memsifter.llm.gym import GymBackend
from memsifter.qa.answerer import Answerer
from memsifter.qa.scores import task_score


def _answerer() -> Answerer:
    return Answerer(
        GymBackend(), window_tokens=4096, max_new_tokens=16, memory_order="chronological"
    )


def test_every_template_reads_back_as_itself_and_no_other() -> None:
    for a in READ_ATTRIBUTES:
        for kind, ts in a.templates.items():
            assert len(ts) >= (3 if kind in ("first", "change") else 2), (a.name, kind)
            for t in ts:
                text = "Hi! " + t.text.format(value="Xval", prev="Yval", rel="sister")
                (s,) = parse_read_statements(text)
                assert (s.template, s.attribute, s.kind, s.value) == (t.id, a.name, kind, "Xval")
                assert s.subject == ("sister" if "{rel}" in t.text else "self")
                if "{prev}" in t.text:
                    assert s.prev == "Yval"
        # the updates share their cue words with the distractors
        for kind in DISTRACTOR_KINDS:
            cued = [
                set(re.findall(r"\w+", t.text.lower())) & set(UPDATE_CUES)
                for t in a.templates[kind]
            ]
            if kind in ("other_change", "plan", "hypo"):
                assert all(cued), (a.name, kind)
            elif kind == "negation":
                assert any(cued), (a.name, kind)
        assert a.prior in a.values and not set(a.values) & set(a.heldout_values)


def test_every_question_template_reads_back_and_none_is_an_old_levels_question() -> None:
    for a in READ_ATTRIBUTES:
        for kind, ts in (("current", a.current_q), ("earlier", a.earlier_q)):
            assert len(ts) >= 2 and any(t.heldout for t in ts)
            for t in ts:
                text = t.text.format(value="Xval")
                q = parse_read_question(text)
                assert (q.kind, q.attribute, q.template) == (kind, a.name, t.id)
                assert parse_question(text) is None
        for b in READ_ATTRIBUTES:
            if b is a:
                continue
            for f in WHEN_FRAMES:
                text = when_question(f, a, b, "Xval")
                q = parse_read_question(text)
                assert (q.kind, q.attribute, q.anchor, q.value) == ("when", a.name, b.name, "Xval")
                assert parse_question(text) is None
    assert parse_read_question("What is the meaning of life?") is None


@pytest.mark.parametrize("size", ["ci", "small"])
def test_the_useful_sessions_alone_answer_and_nothing_else_does(size) -> None:
    """The card's promise, checked with the reader: the useful session(s) alone answer right; a
    single-useful question is answered by no other single session (except, on an s_0 > 0
    question, sessions that hold no update of the asked attribute: there the reader's prior is
    right, and a session with an older update makes it wrong); a `when` question by neither
    useful session alone; s_0 is right exactly on the `s0_prior` questions."""
    world = generate_world(GymConfig(size=size, level="read"))
    ds = to_dataset(world)
    if (
        size == "small"
    ):  # keep it quick: every test user (the held-out strings) and a slice of train
        ds_q = [q for q in ds.queries if q.meta["split"] == "test"]
        ds_q += [q for q in ds.queries if q.meta["split"] == "train"][:300]
    else:
        ds_q = ds.queries
    event = {s["id"]: s["event"] for s in world.sessions}
    a = _answerer()
    prompts, plans = [], []
    for q in ds_q:
        hs = list(q.haystack)
        useful = [s for s in hs if s.id in q.meta["useful_session_ids"]]
        t = {s.id: i for i, s in enumerate(hs)}
        singles = [a.render(q.question, [s], q.question_date, times=[0]) for s in hs]
        together = a.render(q.question, useful, q.question_date, times=[t[s.id] for s in useful])
        empty = a.render(q.question, [], q.question_date, times=[])
        plans.append((q, hs, len(prompts)))
        prompts += [*singles, together, empty]
    outs = a.answer_texts(prompts)
    kinds = set()
    for q, hs, at in plans:
        n = len(hs)
        right = [task_score(o, q.answer, "em") == 1.0 for o in outs[at : at + n]]
        s_useful, s_0 = (task_score(o, q.answer, "em") for o in outs[at + n : at + n + 2])
        kind = q.meta["kind"]
        kinds.add(kind)
        assert s_0 == float(q.meta["s0_prior"]), q.qid
        if kind == "none":
            continue
        assert s_useful == 1.0, q.qid
        useful = set(q.meta["useful_session_ids"])
        if kind == "when":
            assert len(useful) == 2 and not any(
                r for r, s in zip(right, hs, strict=True) if s.id in useful
            ), q.qid
        else:
            assert len(useful) == 1
            for r, s in zip(right, hs, strict=True):
                e = event[s.id]
                own_update = e["attribute"] == q.meta["attribute"] and e["kind"] in (
                    "first",
                    "change",
                )
                expected = s.id in useful or (q.meta["s0_prior"] and not own_update)
                assert r == expected, (q.qid, s.id)
        assert useful <= set(q.gold_session_ids)
    assert kinds == {"current", "earlier", "when", "none"}


def test_distractors_are_never_the_users_own_updates() -> None:
    world = generate_world(GymConfig(size="ci", level="read"))
    for s in world.sessions:
        e = s["event"]
        found = parse_read_statements(s["turns"][0]["text"])
        if e["template"] is None:
            assert found == []
            continue
        (st,) = found
        assert (st.kind, st.template, st.value) == (e["kind"], e["template"], e["value"])
        assert st.subject == e["subject"]


def test_same_config_same_bytes_and_card() -> None:
    a = generate_world(GymConfig(seed=5, size="ci", level="read"))
    b = generate_world(GymConfig(seed=5, size="ci", level="read"))
    assert world_json(a) == world_json(b)
    assert dataset_card(a) == dataset_card(b)
    assert world_json(a) != world_json(generate_world(GymConfig(seed=6, size="ci", level="read")))
    card = dataset_card(a)
    assert "two-session" in card and "unseen" in card


def test_older_levels_config_dict_has_no_read_fields() -> None:
    d = GymConfig(size="ci", level="stale").resolved().to_dict()
    assert "prior_share" not in d and "max_changes" not in d
    assert GymConfig(size="ci", level="read").resolved().to_dict()["prior_share"] == 0.3


def test_small_world_has_the_shares_the_card_promises() -> None:
    stats = world_stats(generate_world(GymConfig(size="small", level="read")))
    test = stats["test"]
    assert test["users"] >= 200 and test["memory_questions"] >= 400
    assert set(test["by_kind"]) == {"current", "earlier", "when", "none"}
    assert 0.15 <= test["two_session_share"] <= 0.35
    assert 0.05 <= test["s0_prior_share"] <= 0.25
    assert 0.15 <= test["unseen_share"] <= 0.6
    assert stats["train"]["unseen_share"] == 0.0
    assert test["labels_disagree_share"] > 0.5


def test_train_users_never_draw_held_out_strings() -> None:
    world = generate_world(GymConfig(size="small", level="read"))
    split = {u["id"]: u["split"] for u in world.users}
    held = {v for a in READ_ATTRIBUTES for v in a.heldout_values}
    by_split: dict[str, int] = {"train": 0, "validation": 0, "test": 0}
    for s in world.sessions:
        e = s["event"]
        by_split[split[s["user"]]] += bool(e["heldout"] or {e["value"], e["prev"]} & held)
    assert by_split["train"] == 0 and by_split["test"] > 0 and by_split["validation"] > 0
    to_meta = to_dataset(world).queries[0].meta
    assert {"useful_session_ids", "unseen", "s0_prior", "kind"} <= set(to_meta)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"attributes_per_user": 2}, "attributes_per_user"),
        ({"attributes_per_user": 6}, "attributes_per_user"),
        ({"prior_share": 1.5}, "prior_share"),
        ({"heldout_share": -0.1}, "heldout_share"),
        ({"max_changes": 0}, "max_changes"),
        ({"distractors_per_attribute": -1}, "distractors_per_attribute"),
        ({"max_changes": 3, "distractors_per_attribute": 12}, "distractors_per_attribute"),
        ({"distractors_per_attribute": 21}, "distractors_per_attribute"),
        ({"when_questions": 9}, "when_questions"),
        ({"useful_at": "late"}, "useful_at"),
        ({"users": 2}, "users"),
    ],
)
def test_bad_read_configs_are_named_errors(change, field) -> None:
    with pytest.raises(DataError) as e:
        generate_world(GymConfig(**{"size": "ci", "level": "read", **change}))
    assert e.value.field == field


def test_read_fields_are_refused_on_older_levels() -> None:
    with pytest.raises(DataError) as e:
        GymConfig(size="ci", level="stale", prior_share=0.5).resolved()
    assert e.value.field == "prior_share"


def test_reader_ignores_plans_denials_and_other_people_and_uses_its_prior() -> None:
    a = _answerer()
    from memsifter.data.types import Session, Turn

    def s(i: int, text: str) -> Session:
        return Session(f"s{i}", (Turn("Maya", text),), date_text=f"0{i + 1} May 2023")

    q = "Which city do I live in these days?"
    distract = [
        s(1, "Hi! My sister moved from Rome to Oslo."),
        s(2, "Hi! I might move from Lisbon to Porto next year."),
        s(3, "Hi! People think I moved to Porto, but I never did."),
        s(4, "Hi! I still miss Rome, where I used to live."),
    ]
    outs = a.answer_texts(
        [
            a.render(q, distract, times=[1, 2, 3, 4]),
            a.render(
                q, [s(0, "Hi! I moved from Rome to Lisbon."), *distract], times=[0, 1, 2, 3, 4]
            ),
            a.render("What did I work as when I moved to Lisbon?", distract, times=[1, 2, 3, 4]),
        ]
    )
    assert outs == ["Paris", "Lisbon", "unknown"]


def test_a_written_read_world_loads_back_and_the_cli_writes_it(tmp_path) -> None:
    from typer.testing import CliRunner

    from memsifter.cli import app
    from memsifter.data import load_dataset
    from memsifter.data.gym import write_world

    world = generate_world(GymConfig(size="ci", level="read"))
    path = write_world(world, tmp_path / "w")
    ds = load_dataset("gym", path)
    assert [q.meta for q in ds.queries] == [q.meta for q in to_dataset(world).queries]
    res = CliRunner().invoke(
        app, ["data", "gym", "--level", "read", "--size", "ci", "--out", str(tmp_path / "c")]
    )
    assert res.exit_code == 0, res.output
    assert (tmp_path / "c/world.json").read_text() == path.read_text()


def test_read_questions_over_odd_memory_never_raise_and_are_counted() -> None:
    from memsifter.data.types import Session, Turn

    backend = GymBackend()
    a = Answerer(backend, window_tokens=4096, max_new_tokens=16)
    undated = Session("x", (Turn("Maya", "I moved from Rome to Lisbon."),))
    garbled = Session("y", (Turn("Maya", "I moved from to."),), date_text="31 Febuary 2023")
    outs = a.answer_texts(
        [
            a.render("Which city was I in before Lisbon?", [undated]),
            a.render("What did I work as when I moved to Lisbon?", [garbled]),
            a.render("Which city do I live in these days?", [undated, garbled]),
        ]
    )
    assert outs == ["unknown", "unknown", "Paris"]  # `current` falls back to the prior
    assert backend.reader.stats["undated_sessions"] == 4
    assert backend.reader.stats["unknown_answers"] == 2
