"""The memory gym: a seeded synthetic world of users whose attributes change over time, with a
grammar that a deterministic working LLM (:mod:`memsifter.llm.gym`) reads back.

Why it exists: on real data a ranking policy that does not learn cannot tell a defect from a
model too small for the task. Here the task is built to be learnable, the answer is known, and
the retrieval labels are built to disagree with the outcome:

* A user has attributes (home, job, pet, partner, favourite food) whose value changes. Sessions
  are dated, in order, and each carries one event in a user turn: an **update** (``I just moved
  from Paris to Lisbon.``), a **stale mention** of a former value (``I still miss Paris, where I
  used to live.``), **someone else's** value (``My sister lives in Oslo now.``), or **chit-chat
  that shares the question's words** (``Where do you think people live happiest now?``).
* Questions ask the **current** value, an **earlier** one (``Where did I live before Lisbon?``),
  or need **no memory** (``How many days are in a week?``: the reader knows it, so s_0 = 1).
* Every memory question has exactly one **useful** session: the one whose content alone makes a
  careful reader answer right (the latest update for ``current``; the update *to* the named value
  for ``earlier``, since it says what came before). The **labels** are what an annotator gives:
  every session where the user states the asked attribute, stale mentions and older updates
  included. Labels and outcome disagree wherever that set is larger than the useful session; the
  dataset card counts how often.

Levels, easiest first: ``single`` (one update per attribute, no stale mentions: labels equal the
useful session), ``stale`` (one change, stale mentions of former values), ``history`` (two or
three changes, stale mentions; older updates now give wrong answers). Sizes run from ``ci`` (a
handful of sessions a user) to ``locomo`` (20-30 sessions a user, thousands of questions).
Level ``read`` (:mod:`memsifter.data.gym_read`, its grammar in
:mod:`memsifter.data.gym_read_grammar`) is where only reading pays: several attributes a user,
distractors built from the updates' own cue words, held-out phrasings and values, two-session
``when`` questions and a reader prior that makes s_0 > 0; :func:`generate_world` hands it to
that module, so the older levels' random draws, and their bytes, are what they were.
Users are split into train, validation and test; a world is a pure function of its config, and
:func:`world_json` writes it byte for byte the same for the same config.

The grammar lives in :mod:`memsifter.data.gym_grammar` (:data:`ATTRIBUTES` holds every
template, :func:`parse_statements` is its inverse, what the working LLM reads, and
:func:`parse_question` reads the questions) and the config in :mod:`memsifter.data.gym_config`;
this module generates, loads and describes worlds, and re-exports both.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from memsifter.config import from_dict, load_config
from memsifter.data.dataset import LoadReport, MemoryDataset
from memsifter.data.gym_config import ALL_LEVELS, LEVELS, READ_LEVEL, READ_SIZES, SIZES, GymConfig
from memsifter.data.gym_grammar import (
    _SMALL_TALK,
    ATTRIBUTE_NAMES,
    ATTRIBUTES,
    DATE_FORMAT,
    KNOWLEDGE,
    NAMES,
    QUESTION_KINDS,
    RELATIONS,
    UNKNOWN,
    Attribute,
    GymQuestion,
    Statement,
    parse_date,
    parse_question,
    parse_statements,
    session_turns,
)
from memsifter.data.gym_read import READ_CARD, read_card_rows, read_stats, read_users
from memsifter.data.splits import SPLITS
from memsifter.data.types import Query, Session, Turn
from memsifter.errors import DataError

SOURCE = "gym"


# -- generation ----------------------------------------------------------------------------


@dataclass
class _Event:
    attribute: str | None  # None: small talk
    kind: str  # first | change | former | other | chitchat | smalltalk
    text: str
    order: float  # sort key within the user's timeline
    value: str | None = None
    prev: str | None = None


@dataclass
class GymWorld:
    """A generated world: the config it came from, users (with their split), sessions and
    questions, as plain JSON-able records."""

    config: GymConfig
    users: list[dict[str, Any]]
    sessions: list[dict[str, Any]]
    questions: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "memsifter-gym/1",
            "config": self.config.to_dict(),
            "users": self.users,
            "sessions": self.sessions,
            "questions": self.questions,
        }


def generate_world(config: GymConfig) -> GymWorld:
    """The world ``config`` describes. Every random draw comes from one ``random.Random``
    seeded by the config, in a fixed order: the same config gives the same world."""
    cfg = config.resolved()
    rng = random.Random(f"memsifter-gym/{cfg.seed}/{cfg.level}")
    n = int(cfg.users)  # type: ignore[arg-type]
    n_val = round(cfg.split[1] * n)
    n_test = round(cfg.split[2] * n)
    n_train = n - n_val - n_test
    splits = ["train"] * n_train + ["validation"] * n_val + ["test"] * n_test
    rng.shuffle(splits)
    if cfg.level == READ_LEVEL:  # its own generator: the older levels' draws stay as they were
        return GymWorld(cfg, *read_users(rng, cfg, splits))
    users: list[dict[str, Any]] = []
    sessions: list[dict[str, Any]] = []
    questions: list[dict[str, Any]] = []
    for u in range(n):
        uid = f"user{u:04d}"
        user_sessions, user_questions, facts = _user(rng, cfg, uid)
        users.append({"id": uid, "split": splits[u], "facts": facts})
        sessions += user_sessions
        questions += user_questions
    return GymWorld(cfg, users, sessions, questions)


def _values(rng: random.Random, attr: Attribute, k: int, avoid: set[str]) -> list[str]:
    pool = [v for v in attr.values if v not in avoid]
    return rng.sample(pool, k)


def _user(
    rng: random.Random, cfg: GymConfig, uid: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    name = rng.choice(NAMES)
    attrs = rng.sample(ATTRIBUTES, int(cfg.attributes_per_user))  # type: ignore[arg-type]
    events: list[_Event] = []
    facts: dict[str, Any] = {}
    asks: list[tuple[str, Attribute, str | None]] = []  # (kind, attribute, value named)
    for attr in attrs:
        changes = {"single": 0, "stale": 1, "history": rng.choice((2, 3))}[cfg.level]
        # history[0] is the value before the chats (stale) or the first stated (history);
        # one more older value is what stale mentions before the first change refer to.
        older, *history = _values(rng, attr, changes + 2, set())
        if cfg.level == "single":
            history = history[:1]
        facts[attr.name] = {"history": history, "older": older}
        start = 0 if cfg.level == "stale" else 1  # stale: the first value is never stated
        # One uniform time per *stated* update, sorted; stale has a single change, so its time
        # is uniform and the useful session's position carries no habit a ranker could learn.
        stated = sorted(rng.random() for _ in range(len(history) - (cfg.level == "stale")))
        slots = [0.0] * (cfg.level == "stale") + stated
        band = len(facts) / 100  # attributes keep the order they were drawn in
        if cfg.useful_at == "late":
            slots[-1] = 1.0 + band
        elif cfg.useful_at == "early":  # every update before the other events, order kept
            slots = [x / 1000 - 1.0 + band for x in slots]
        if cfg.level != "stale":
            events.append(
                _Event(
                    attr.name, "first", attr.first.format(value=history[0]), slots[0], history[0]
                )
            )
        for i in range(max(start, 1), len(history)):
            events.append(
                _Event(
                    attr.name,
                    "change",
                    attr.change.format(prev=history[i - 1], value=history[i]),
                    slots[i],
                    history[i],
                    history[i - 1],
                )
            )
        if cfg.level != "single":
            for _ in range(int(cfg.stale_mentions)):  # type: ignore[arg-type]
                at = rng.random()
                # a former value the user had left by then: the older one, or any value
                # whose change away happened before this mention
                left = [older] + [history[i - 1] for i in range(1, len(history)) if slots[i] < at]
                value = rng.choice(left)
                events.append(
                    _Event(attr.name, "former", attr.former.format(value=value), at, value)
                )
        rel = rng.choice(RELATIONS)
        theirs = _values(rng, attr, 1, set(history) | {older})[0]
        events.append(
            _Event(
                attr.name, "other", attr.other.format(rel=rel, value=theirs), rng.random(), theirs
            )
        )
        events.append(_Event(attr.name, "chitchat", rng.choice(attr.chitchat), rng.random()))
        asks.append(("current", attr, None))
        if cfg.level != "single" and cfg.earlier_questions:
            # "before X" for a value X that some stated change reached
            targets = [history[i] for i in range(1, len(history))]
            asks.append(("earlier", attr, rng.choice(targets)))
    for _ in range(int(cfg.filler_sessions)):  # type: ignore[arg-type]
        if rng.random() < 0.5:
            a = rng.choice(attrs)
            events.append(_Event(a.name, "chitchat", rng.choice(a.chitchat), rng.random()))
        else:
            events.append(_Event(None, "smalltalk", rng.choice(_SMALL_TALK), rng.random()))
    events.sort(key=lambda e: e.order)

    day = datetime(2023, 1, 1) + timedelta(days=rng.randrange(0, 365))
    sessions: list[dict[str, Any]] = []
    event_session: list[str] = []
    for i, ev in enumerate(events):
        day += timedelta(days=rng.randrange(2, 15))
        sid = f"{uid}/s{i:02d}"
        turns = session_turns(rng, name, ev.text, cfg.long_sessions)
        sessions.append(
            {
                "id": sid,
                "user": uid,
                "date": day.strftime(DATE_FORMAT),
                "turns": turns,
                "event": {
                    "attribute": ev.attribute,
                    "kind": ev.kind,
                    "value": ev.value,
                    "prev": ev.prev,
                },
            }
        )
        event_session.append(sid)
    question_date = (day + timedelta(days=rng.randrange(1, 8))).strftime(DATE_FORMAT)

    questions: list[dict[str, Any]] = []
    for kind, attr, named in asks:
        mine = [
            (sid, ev)
            for sid, ev in zip(event_session, events, strict=True)
            if ev.attribute == attr.name and ev.kind in ("first", "change", "former")
        ]
        updates = [(sid, ev) for sid, ev in mine if ev.kind in ("first", "change")]
        history = facts[attr.name]["history"]
        if kind == "current":
            text, answer = attr.current_q, history[-1]
            useful = updates[-1][0]
        else:
            text = attr.earlier_q.format(value=named)
            i = history.index(named)
            answer = history[i - 1]
            useful = next(sid for sid, ev in updates if ev.kind == "change" and ev.value == named)
        gold = [sid for sid, _ in mine]
        questions.append(
            _question(
                uid, len(questions), text, answer, kind, attr.name, question_date, gold, useful
            )
        )
    for _ in range(int(cfg.none_questions)):  # type: ignore[arg-type]
        text, answer = rng.choice(KNOWLEDGE)
        questions.append(
            _question(uid, len(questions), text, answer, "none", None, question_date, [], None)
        )
    return sessions, questions, facts


def _question(
    uid: str,
    i: int,
    text: str,
    answer: str,
    kind: str,
    attribute: str | None,
    date: str,
    gold: list[str],
    useful: str | None,
) -> dict[str, Any]:
    return {
        "id": f"{uid}/q{i}",
        "user": uid,
        "question": text,
        "answer": answer,
        "kind": kind,
        "attribute": attribute,
        "question_date": date,
        "gold_session_ids": gold,
        "useful_session_id": useful,
    }


def world_json(world: GymWorld) -> str:
    """The world as JSON text: sorted keys, fixed separators, so one config gives one byte
    string."""
    return json.dumps(world.to_json(), sort_keys=True, ensure_ascii=False, indent=1) + "\n"


# -- loading -------------------------------------------------------------------------------


def to_dataset(world: GymWorld) -> MemoryDataset:
    """The world as a :class:`MemoryDataset`: a conversation per user, a query per question
    (its haystack the user's sessions, its meta the kind, useful session and split)."""
    split_of = {u["id"]: u["split"] for u in world.users}
    convs: dict[str, list[Session]] = {}
    for s in world.sessions:
        convs.setdefault(s["user"], []).append(
            Session(
                id=s["id"],
                turns=tuple(Turn(t["speaker"], t["text"]) for t in s["turns"]),
                date=datetime.strptime(s["date"], DATE_FORMAT),
                date_text=s["date"],
                conversation_id=s["user"],
            )
        )
    conversations = {u: tuple(v) for u, v in convs.items()}
    queries = []
    report = LoadReport(source=SOURCE)
    for q in world.questions:
        if not q["gold_session_ids"]:
            report.no_evidence_qids.append(q["id"])
        queries.append(
            Query(
                qid=q["id"],
                question=q["question"],
                answer=q["answer"],
                haystack=conversations[q["user"]],
                gold_session_ids=tuple(q["gold_session_ids"]),
                question_date=q["question_date"],
                category=q["kind"],
                source=SOURCE,
                conversation_id=q["user"],
                meta={
                    "kind": q["kind"],
                    "attribute": q["attribute"],
                    "useful_session_ids": _useful(q),
                    "split": split_of[q["user"]],
                    "level": world.config.level,
                    # read level: whether the no-memory answer is right, and whether a string
                    # no train user holds is involved (older levels' meta stays as it was)
                    **{k: q[k] for k in ("s0_prior", "unseen", "anchor") if k in q},
                },
            )
        )
    report.n_questions = len(queries)
    report.n_sessions = len(world.sessions)
    return MemoryDataset(
        queries=queries, conversations=conversations, report=report, splits=split_of
    )


def _useful(q: dict[str, Any]) -> tuple[str, ...]:
    """Every useful session of a question record: the read level's list (one or two), or the
    older levels' single one."""
    if "useful_session_ids" in q:
        return tuple(q["useful_session_ids"])
    return (q["useful_session_id"],) if q["useful_session_id"] else ()


def load_world(path: str | Path) -> GymWorld:
    """A world from a file :func:`world_json` wrote (``world.json``, or the folder holding
    it), or generated from a YAML/JSON config of :class:`GymConfig` fields."""
    p = Path(path)
    if p.is_dir():
        p = p / "world.json"
    if not p.exists():
        raise DataError("gym world not found (write one with `memsifter data gym`)", file=str(p))
    if p.suffix in (".yaml", ".yml"):
        return generate_world(load_config(GymConfig, p))
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"not a gym world: {e}", file=str(p)) from e
    if not isinstance(raw, dict) or raw.get("format") != "memsifter-gym/1":
        raise DataError("not a gym world (format: memsifter-gym/1 expected)", file=str(p))
    try:
        return GymWorld(
            from_dict(GymConfig, raw["config"], file=str(p), prefix="config"),
            raw["users"],
            raw["sessions"],
            raw["questions"],
        )
    except (KeyError, TypeError) as e:
        raise DataError(f"incomplete gym world: {e}", file=str(p)) from e


def load_gym(path: str | Path) -> MemoryDataset:
    return to_dataset(load_world(path))


def split_users(world: GymWorld) -> dict[str, list[str]]:
    """Split name -> user ids (conversation ids), in world order."""
    out: dict[str, list[str]] = {s: [] for s in SPLITS}
    for u in world.users:
        out[u["split"]].append(u["id"])
    return out


# -- the card ------------------------------------------------------------------------------


def world_stats(world: GymWorld) -> dict[str, Any]:
    """What a world holds, per split: users, sessions a user, questions by kind, and the share
    of memory questions whose labels disagree with the outcome (labels larger than the useful
    session: an R_ret-optimal ranking may put a session first that answers wrongly)."""
    split_of = {u["id"]: u["split"] for u in world.users}
    per_user = Counter(s["user"] for s in world.sessions)
    out: dict[str, Any] = {}
    for split in SPLITS:
        qs = [q for q in world.questions if split_of[q["user"]] == split]
        users = [u for u in world.users if u["split"] == split]
        memory = [q for q in qs if q["kind"] != "none"]
        disagree = [q for q in memory if set(q["gold_session_ids"]) != set(_useful(q))]
        counts = [per_user[u["id"]] for u in users]
        out[split] = {
            "users": len(users),
            "sessions_per_user": [min(counts), max(counts)] if counts else [0, 0],
            "questions": len(qs),
            "by_kind": dict(sorted(Counter(q["kind"] for q in qs).items())),
            "labels_disagree": len(disagree),
            "labels_disagree_share": round(len(disagree) / len(memory), 4) if memory else 0.0,
            "mean_labels_per_memory_question": (
                round(sum(len(q["gold_session_ids"]) for q in memory) / len(memory), 3)
                if memory
                else 0.0
            ),
        }
        if world.config.level == READ_LEVEL:
            out[split].update(read_stats(qs))
    return out


def dataset_card(world: GymWorld) -> str:
    cfg = world.config
    stats = world_stats(world)
    rows = "\n".join(
        f"| {s} | {v['users']} | {v['sessions_per_user'][0]}-{v['sessions_per_user'][1]} | "
        f"{v['questions']} | {v['by_kind']} | {v['labels_disagree']} "
        f"({v['labels_disagree_share']:.1%}) | {v['mean_labels_per_memory_question']} |"
        for s, v in stats.items()
    )
    return f"""# Memory gym world (seed {cfg.seed}, level `{cfg.level}`, size `{cfg.size}`)

A synthetic world from `memsifter.data.gym` (`memsifter data gym`). Regenerate it byte for byte
with the same config:

```json
{json.dumps(cfg.to_dict(), sort_keys=True)}
```

| split | users | sessions a user | questions | by kind | labels disagree | labels a question |
|---|---|---|---|---|---|---|
{rows}

- **useful session**: the one session whose content alone makes the gym's working LLM
  (`memsifter.llm.gym`) answer right: the latest update for `current`, the update to the named
  value for `earlier`. `none` questions need no memory (the reader knows the answer: s_0 = 1).
- **labels** (`gold_session_ids`): every session where the user states the asked attribute,
  as an annotator marks evidence: older updates and stale mentions included. "Labels disagree"
  counts memory questions whose labels hold more than the useful session, so that a ranking
  optimal for R_ret can put a wrong session first.
- Users are split into train, validation and test; sessions are dated and in date order.
- Level `single`: one update per attribute (labels = useful). `stale`: one change and stale
  mentions of former values. `history`: two or three changes; older updates answer wrongly.
""" + (READ_CARD + read_card_rows(stats) + "\n" if cfg.level == READ_LEVEL else "")


def write_world(world: GymWorld, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "world.json").write_text(world_json(world), encoding="utf-8")
    (out / "README.md").write_text(dataset_card(world), encoding="utf-8")
    (out / "stats.json").write_text(
        json.dumps(world_stats(world), indent=1, sort_keys=True) + "\n", encoding="utf-8"
    )
    return out / "world.json"


__all__ = [
    "ALL_LEVELS",
    "ATTRIBUTES",
    "ATTRIBUTE_NAMES",
    "KNOWLEDGE",
    "LEVELS",
    "QUESTION_KINDS",
    "READ_LEVEL",
    "READ_SIZES",
    "SIZES",
    "UNKNOWN",
    "GymConfig",
    "GymQuestion",
    "GymWorld",
    "Statement",
    "dataset_card",
    "generate_world",
    "load_gym",
    "load_world",
    "parse_date",
    "parse_question",
    "parse_statements",
    "split_users",
    "to_dataset",
    "world_json",
    "world_stats",
    "write_world",
]
