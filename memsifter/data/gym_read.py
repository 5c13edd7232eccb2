"""The memory gym's ``read`` level: a world where finding the useful session takes reading.

The older levels (:mod:`memsifter.data.gym`) are template detectors: one cue word marks the
user's update and each user has one attribute, so the question hardly matters. Here:

* **The question picks the session.** A user has three to five attributes, each with a history
  (a first value and one or more changes, the user's own updates), and is asked about all of
  them: ``current``, ``earlier`` ("before X") and two-session ``when`` questions.
* **Surface cues mislead.** Each attribute also has distractor sessions built from the updates'
  own cue words: someone else's change, a plan, a hypothetical, a denial of a value the user
  never had, a stale mention of a former value, someone else's value. Events are placed
  uniformly in time, so no position or recency habit pays; a distractor often comes after the
  asked attribute's latest update.
* **Strings cannot be memorised.** Every kind has several phrasings; some phrasings and values
  are held out (:mod:`memsifter.data.gym_read_grammar`): only validation and test users draw
  them, each draw with probability ``heldout_share``. A question is ``unseen`` when its
  template, its answer or named value, or a useful session's template or values never occur
  among train users (computed from the train users themselves, not from the held-out marks).
* **The outcome is more than a label.** A ``when`` question ("What did I work as when I moved
  to Lisbon?") needs two sessions, the anchor update and the asked attribute's update in force
  at its date: either alone answers ``unknown``. The reader has a no-memory prior per attribute
  (:attr:`ReadAttribute.prior`) that it answers for ``current`` when nothing it sees fits, and
  ``prior_share`` of attributes end at it: there s_0 = 1, and a ranking that shows only an
  older update makes the answer wrong (memory can hurt).

Labels stay the annotator's: every session where the user states the asked attribute (own
updates and stale mentions; not plans, denials or other people), plus the anchor for ``when``.

Records: a session's ``event`` holds its attribute, kind, value, prev, subject (``self`` or a
relation), ``template`` id and ``heldout``; a question holds the older levels' keys plus
``useful_session_ids`` (one, or two for ``when``: anchor first), ``s0_prior`` (the no-memory
answer is right), ``unseen``, ``template``, ``named`` (the value the question names) and, for
``when``, ``anchor`` (its attribute, value and session).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from memsifter.data.gym_config import GymConfig
from memsifter.data.gym_grammar import (
    _SMALL_TALK,
    DATE_FORMAT,
    KNOWLEDGE,
    NAMES,
    RELATIONS,
    session_turns,
)
from memsifter.data.gym_read_grammar import (
    DISTRACTOR_KINDS,
    READ_ATTRIBUTES,
    SELF_KINDS,
    UPDATE_KINDS,
    WHEN_FRAMES,
    ReadAttribute,
    Template,
    when_question,
)

LATE_SHARE = 0.5  # chance that one of an attribute's distractors follows its latest update
ECHO_SHARE = 0.65  # chance that a distractor's value is one of the user's own values


@dataclass
class _Event:
    attribute: str | None  # None: small talk
    kind: str  # an update kind, a distractor kind, chitchat or smalltalk
    order: float  # sort key within the user's timeline
    text: str
    template: str | None = None
    heldout: bool = False
    value: str | None = None
    prev: str | None = None
    subject: str = "self"
    sid: str = ""


class _Draw:
    """A user's draws of phrasings and values: held-out ones only off the train split, each with
    probability ``heldout_share`` (train users toss the same coins at share 0: one code path)."""

    def __init__(self, rng: random.Random, heldout_share: float, split: str) -> None:
        self.rng = rng
        self.share = heldout_share if split != "train" else 0.0

    def template(self, options: tuple[Template, ...]) -> Template:
        held = [t for t in options if t.heldout]
        coin = self.rng.random()
        if held and coin < self.share:
            return self.rng.choice(held)
        return self.rng.choice([t for t in options if not t.heldout])

    def value(self, attr: ReadAttribute, avoid: set[str]) -> str:
        pool = attr.heldout_values if self.rng.random() < self.share else attr.values
        choices = [v for v in pool if v not in avoid and v != attr.prior]
        if not choices:  # the held-out pool is small: fall back to the shared one
            choices = [v for v in attr.values if v not in avoid and v != attr.prior]
        return self.rng.choice(choices)


def read_users(
    rng: random.Random, cfg: GymConfig, splits: list[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Users, sessions and questions of a read world (``cfg`` resolved, ``splits`` one per
    user), then each question's ``unseen`` flag from what the train users hold."""
    users: list[dict[str, Any]] = []
    sessions: list[dict[str, Any]] = []
    questions: list[dict[str, Any]] = []
    for u, split in enumerate(splits):
        uid = f"user{u:04d}"
        user_sessions, user_questions, facts = _user(rng, cfg, uid, split)
        users.append({"id": uid, "split": split, "facts": facts})
        sessions += user_sessions
        questions += user_questions
    _mark_unseen(users, sessions, questions)
    return users, sessions, questions


def _user(
    rng: random.Random, cfg: GymConfig, uid: str, split: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    draw = _Draw(rng, float(cfg.heldout_share), split)  # type: ignore[arg-type]
    name = rng.choice(NAMES)
    attrs = rng.sample(READ_ATTRIBUTES, int(cfg.attributes_per_user))  # type: ignore[arg-type]
    events: list[_Event] = []
    facts: dict[str, Any] = {}
    updates: dict[str, list[_Event]] = {}
    kinds: list[str] = []  # distractor kinds, a shuffled cycle so that a user meets them all
    for attr in attrs:
        n_changes = rng.randint(1, int(cfg.max_changes))  # type: ignore[arg-type]
        history: list[str] = []
        for _ in range(n_changes + 1):
            history.append(draw.value(attr, set(history)))
        prior_end = rng.random() < float(cfg.prior_share)  # type: ignore[arg-type]
        if prior_end:  # the prior is never drawn otherwise: s0_prior is exactly this coin
            history[-1] = attr.prior
        times = sorted(rng.random() for _ in history)
        mine = []
        for i, (value, at) in enumerate(zip(history, times, strict=True)):
            kind = UPDATE_KINDS[min(i, 1)]
            prev = history[i - 1] if i else None
            mine.append(_event(draw, attr, kind, at, value, prev))
        updates[attr.name] = mine
        events += mine
        # Half the time one distractor follows the latest update, so that "the latest session
        # that looks like an update of this attribute" is not a rule that pays.
        n_distractors = int(cfg.distractors_per_attribute)  # type: ignore[arg-type]
        late = rng.randrange(n_distractors) if n_distractors and rng.random() < LATE_SHARE else -1
        for k in range(n_distractors):
            if not kinds:
                kinds = list(DISTRACTOR_KINDS)
                rng.shuffle(kinds)
            events.append(_distractor(rng, draw, attr, kinds.pop(), history, times, k == late))
        facts[attr.name] = {"history": history, "prior": attr.prior, "prior_end": prior_end}
    for _ in range(int(cfg.filler_sessions)):  # type: ignore[arg-type]
        if rng.random() < 0.5:
            a = rng.choice(attrs)
            events.append(_Event(a.name, "chitchat", rng.random(), rng.choice(a.chitchat)))
        else:
            events.append(_Event(None, "smalltalk", rng.random(), rng.choice(_SMALL_TALK)))
    events.sort(key=lambda e: e.order)
    sessions = _sessions(rng, cfg, uid, name, events)
    question_date = _question_date(rng, sessions)
    questions = _questions(rng, cfg, draw, uid, attrs, facts, updates, events, question_date)
    return sessions, questions, facts


def _event(
    draw: _Draw,
    attr: ReadAttribute,
    kind: str,
    at: float,
    value: str,
    prev: str | None = None,
    subject: str = "self",
) -> _Event:
    t = draw.template(attr.templates[kind])
    text = t.text.format(value=value, prev=prev, rel=subject)
    return _Event(attr.name, kind, at, text, t.id, t.heldout, value, prev, subject)


def _distractor(
    rng: random.Random,
    draw: _Draw,
    attr: ReadAttribute,
    kind: str,
    history: list[str],
    times: list[float],
    late: bool,
) -> _Event:
    """A session of ``kind`` that shares the updates' cue words and is not the user's update,
    after the latest update when ``late``. Its values often echo the user's own (so that a
    value the question names does not find the useful session)."""
    u = rng.random()
    after = times[-1] if late else (times[1] if kind == "former" else 0.0)
    at = after + (1.0 - after) * u
    fresh = draw.value(attr, set(history))
    echo = rng.choice(history) if rng.random() < ECHO_SHARE else fresh
    if kind == "former":  # after the first change, naming a value the user had left by then
        left = [history[i - 1] for i in range(1, len(history)) if times[i] <= at]
        return _event(draw, attr, kind, at, rng.choice(left))
    if kind == "negation":  # a value the user never had
        return _event(draw, attr, kind, at, fresh)
    rel = rng.choice(RELATIONS)
    if kind == "other":
        return _event(draw, attr, kind, at, echo, subject=rel)
    if kind == "other_change":
        others = [h for h in history if h != echo]
        prev = rng.choice(others) if others and rng.random() < 0.5 else draw.value(attr, {echo})
        return _event(draw, attr, kind, at, echo, prev, subject=rel)
    # plan / hypo: from the value in force then, to a later value of the user's or a fresh one
    in_force = ([h for h, t in zip(history, times, strict=True) if t < at] or history[:1])[-1]
    later = [h for h, t in zip(history, times, strict=True) if t > at]
    target = rng.choice(later) if later and rng.random() < 0.5 else fresh
    return _event(draw, attr, kind, at, target, in_force)


def _sessions(
    rng: random.Random, cfg: GymConfig, uid: str, name: str, events: list[_Event]
) -> list[dict[str, Any]]:
    day = datetime(2023, 1, 1) + timedelta(days=rng.randrange(0, 365))
    out = []
    for i, ev in enumerate(events):
        day += timedelta(days=rng.randrange(2, 15))
        ev.sid = f"{uid}/s{i:02d}"
        turns = session_turns(rng, name, ev.text, cfg.long_sessions)
        event = {
            "attribute": ev.attribute,
            "kind": ev.kind,
            "value": ev.value,
            "prev": ev.prev,
            "subject": ev.subject,
            "template": ev.template,
            "heldout": ev.heldout,
        }
        out.append(
            {"id": ev.sid, "user": uid, "date": day.strftime(DATE_FORMAT), "turns": turns,
             "event": event}
        )  # fmt: skip
    return out


def _question_date(rng: random.Random, sessions: list[dict[str, Any]]) -> str:
    last = datetime.strptime(sessions[-1]["date"], DATE_FORMAT)
    return (last + timedelta(days=rng.randrange(1, 8))).strftime(DATE_FORMAT)


def _questions(
    rng: random.Random,
    cfg: GymConfig,
    draw: _Draw,
    uid: str,
    attrs: list[ReadAttribute],
    facts: dict[str, Any],
    updates: dict[str, list[_Event]],
    events: list[_Event],
    date: str,
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def labels(attribute: str) -> list[str]:
        return [
            e.sid
            for e in events
            if e.attribute == attribute and e.subject == "self" and e.kind in SELF_KINDS
        ]

    def add(q: dict[str, Any]) -> None:
        out.append({"id": f"{uid}/q{len(out)}", "user": uid, "question_date": date, **q})

    for attr in attrs:
        history, mine = facts[attr.name]["history"], updates[attr.name]
        t = draw.template(attr.current_q)
        add(_q(t, t.text, history[-1], "current", attr.name, labels(attr.name), [mine[-1].sid],
               s0_prior=facts[attr.name]["prior_end"]))  # fmt: skip
        if cfg.earlier_questions:
            i = rng.randrange(1, len(history))
            t = draw.template(attr.earlier_q)
            text = t.text.format(value=history[i])
            add(_q(t, text, history[i - 1], "earlier", attr.name, labels(attr.name),
                   [mine[i].sid], named=history[i]))  # fmt: skip
    # `when`: the asked attribute's update in force at an update of another attribute
    candidates = [
        (x, y, anchor, before[-1])
        for x in attrs
        for y in attrs
        if x is not y
        for anchor in updates[y.name]
        if (before := [e for e in updates[x.name] if e.order < anchor.order])
    ]
    for _ in range(int(cfg.when_questions)):  # type: ignore[arg-type]
        if not candidates:
            break
        # prefer, half the time, an answer that is not the current value (else `current` would do)
        differ = [c for c in candidates if c[3].value != facts[c[0].name]["history"][-1]]
        x, y, anchor, update = rng.choice(differ if differ and rng.random() < 0.5 else candidates)
        candidates = [c for c in candidates if c[2] is not anchor or c[0] is not x]
        frame = draw.template(WHEN_FRAMES)
        text = when_question(frame, x, y, str(anchor.value))
        gold, useful = [*labels(x.name), anchor.sid], [anchor.sid, update.sid]
        q = _q(frame, text, str(update.value), "when", x.name, gold, useful, named=anchor.value)
        q["anchor"] = {"attribute": y.name, "value": anchor.value, "session": anchor.sid}
        add(q)
    for _ in range(int(cfg.none_questions)):  # type: ignore[arg-type]
        text, answer = rng.choice(KNOWLEDGE)
        add(_q(None, text, answer, "none", None, [], [], s0_prior=True))
    return out


def _q(
    template: Template | None,
    text: str,
    answer: str,
    kind: str,
    attribute: str | None,
    gold: list[str],
    useful: list[str],
    named: str | None = None,
    s0_prior: bool = False,
) -> dict[str, Any]:
    return {
        "question": text,
        "answer": answer,
        "kind": kind,
        "attribute": attribute,
        "gold_session_ids": sorted(set(gold)),
        "useful_session_id": useful[0] if useful else None,
        "useful_session_ids": useful,
        "s0_prior": s0_prior,
        "template": template.id if template else "knowledge",
        "named": named,
        "unseen": False,
    }


def _mark_unseen(
    users: list[dict[str, Any]], sessions: list[dict[str, Any]], questions: list[dict[str, Any]]
) -> None:
    """``unseen``: the question's template, answer or named value, or a useful session's
    template or values, never occur among train users."""
    train = {u["id"] for u in users if u["split"] == "train"}
    seen: set[str] = set()
    for s in sessions:
        if s["user"] in train:
            e = s["event"]
            seen.update(x for x in (e["template"], e["value"], e["prev"]) if x)
    for q in questions:
        if q["user"] in train:
            seen.update(x for x in (q["template"], q["answer"], q["named"]) if x)
    event = {s["id"]: s["event"] for s in sessions}
    for q in questions:
        if q["kind"] == "none":
            continue
        items = [q["template"], q["answer"], q["named"]]
        for sid in q["useful_session_ids"]:
            items += [event[sid]["template"], event[sid]["value"], event[sid]["prev"]]
        q["unseen"] = any(x not in seen for x in items if x)


# -- the card's section ---------------------------------------------------------------------


def read_stats(questions: list[dict[str, Any]]) -> dict[str, Any]:
    """The read level's shares over one split's memory questions."""
    memory = [q for q in questions if q["kind"] != "none"]
    n = max(len(memory), 1)
    return {
        "memory_questions": len(memory),
        "two_session_share": round(sum(len(q["useful_session_ids"]) == 2 for q in memory) / n, 4),
        "s0_prior_share": round(sum(q["s0_prior"] for q in memory) / n, 4),
        "unseen_share": round(sum(q["unseen"] for q in memory) / n, 4),
        "unseen_by_kind": dict(sorted(Counter(q["kind"] for q in memory if q["unseen"]).items())),
    }


READ_CARD = """
- Level `read` (`memsifter.data.gym_read`): three to five attributes a user, each with a first
  value and one or more changes, and distractor sessions that share the updates' cue words
  (someone else's change, plans, hypotheticals, denials, stale mentions, someone else's value).
  `when` questions need two sessions (the anchor update and the asked attribute's update in
  force then): `useful_session_ids` holds both, either alone answers `unknown`. On `current`
  questions the reader answers its prior when nothing fits; `s_0 > 0` counts memory questions
  whose attribute ends at that prior (an older update shown alone makes the answer wrong).
  `unseen` counts memory questions whose phrasing, answer or useful sessions never occur among
  train users (held-out phrasings and values, drawn only for validation and test users).

| split | memory questions | two-session | s_0 > 0 | unseen |
|---|---|---|---|---|
"""


def read_card_rows(stats: dict[str, Any]) -> str:
    return "\n".join(
        f"| {s} | {v['memory_questions']} | {v['two_session_share']:.1%} | "
        f"{v['s0_prior_share']:.1%} | {v['unseen_share']:.1%} |"
        for s, v in stats.items()
    )


__all__ = ["READ_CARD", "read_card_rows", "read_stats", "read_users"]
