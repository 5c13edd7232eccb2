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
Users are split into train, validation and test; a world is a pure function of its config, and
:func:`world_json` writes it byte for byte the same for the same config.

The grammar is this module's: :data:`ATTRIBUTES` holds every template, :func:`parse_statements`
is its inverse (what the working LLM reads), and :func:`parse_question` reads the questions.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from memsifter.config import from_dict, load_config, setting
from memsifter.data.dataset import LoadReport, MemoryDataset
from memsifter.data.splits import SPLITS
from memsifter.data.types import Query, Session, Turn
from memsifter.errors import DataError

SOURCE = "gym"
LEVELS: tuple[str, ...] = ("single", "stale", "history")
QUESTION_KINDS: tuple[str, ...] = ("current", "earlier", "none")
USEFUL_AT: tuple[str, ...] = ("uniform", "early", "late")
UNKNOWN = "unknown"  # the reader's answer when nothing it sees fits the question
ASSISTANT = "Assistant"
DATE_FORMAT = "%d %B %Y"  # "08 May 2023": one spelling, parsed back by the reader


@dataclass(frozen=True)
class Attribute:
    """One attribute's grammar. ``{value}``/``{prev}``/``{rel}`` are the slots; every template
    is a whole sentence, and no two templates (of any attribute) can match the same sentence."""

    name: str
    values: tuple[str, ...]
    first: str  # the first value the history states
    change: str  # a change, naming the value before it
    former: str  # a stale mention of a value the user no longer has
    other: str  # someone else's value
    current_q: str
    earlier_q: str  # {value}: the value whose predecessor is asked
    chitchat: tuple[str, ...]  # share the question's words, state nothing


ATTRIBUTES: tuple[Attribute, ...] = (
    Attribute(
        name="home",
        values=(
            "Lisbon",
            "Paris",
            "Oslo",
            "Berlin",
            "Madrid",
            "Vienna",
            "Prague",
            "Dublin",
            "Warsaw",
            "Athens",
            "Rome",
            "Helsinki",
            "Zurich",
            "Brussels",
            "Amsterdam",
            "Budapest",
            "Copenhagen",
            "Stockholm",
            "Seville",
            "Porto",
            "Krakow",
            "Munich",
        ),
        first="I just moved to {value}.",
        change="I just moved from {prev} to {value}.",
        former="I still miss {value}, where I used to live.",
        other="My {rel} lives in {value} now.",
        current_q="Where do I live now?",
        earlier_q="Where did I live before {value}?",
        chitchat=(
            "Where do you think people live happiest now?",
            "I read that more people live alone now. Where do they live, mostly?",
            "Do I need a big garden where I live? People now say so.",
        ),
    ),
    Attribute(
        name="job",
        values=(
            "nurse",
            "teacher",
            "baker",
            "pilot",
            "lawyer",
            "dentist",
            "plumber",
            "chef",
            "designer",
            "farmer",
            "journalist",
            "librarian",
            "carpenter",
            "pharmacist",
            "translator",
            "photographer",
            "mechanic",
            "banker",
            "surgeon",
            "tailor",
        ),
        first="I just started working as a {value}.",
        change="I quit being a {prev} and started working as a {value}.",
        former="I sometimes miss working as a {value}.",
        other="My {rel} works as a {value} now.",
        current_q="What do I work as now?",
        earlier_q="What did I work as before I became a {value}?",
        chitchat=(
            "What do most people work as now? I keep wondering.",
            "I wonder what I would work as now if I were a kid again.",
            "What do robots work as now? The news was full of it.",
        ),
    ),
    Attribute(
        name="pet",
        values=(
            "dog",
            "cat",
            "parrot",
            "rabbit",
            "hamster",
            "turtle",
            "goldfish",
            "ferret",
            "lizard",
            "canary",
            "pony",
            "hedgehog",
            "gecko",
            "snake",
            "tortoise",
            "cockatoo",
        ),
        first="I just adopted a {value}.",
        change="I rehomed my {prev} and adopted a {value}.",
        former="I still think about my old {value}.",
        other="My {rel} has a {value} now.",
        current_q="What pet do I have now?",
        earlier_q="What pet did I have before the {value}?",
        chitchat=(
            "What pet do you think is the easiest to have now?",
            "Do I have time for a pet now? What do people have, mostly?",
            "Which pet do kids have now? It changes every year.",
        ),
    ),
    Attribute(
        name="partner",
        values=(
            "Sam",
            "Alex",
            "Jordan",
            "Taylor",
            "Morgan",
            "Casey",
            "Riley",
            "Jamie",
            "Quinn",
            "Avery",
            "Robin",
            "Kai",
            "Noor",
            "Lena",
            "Omar",
            "Ines",
            "Yuki",
            "Mateo",
        ),
        first="I just started seeing {value}.",
        change="I broke up with {prev} and started seeing {value}.",
        former="I ran into {value}, who I used to date.",
        other="My {rel} is dating {value} now.",
        current_q="Who am I dating now?",
        earlier_q="Who was I dating before {value}?",
        chitchat=(
            "Who am I to judge who people are dating now?",
            "Dating now is all apps. Who even meets people in person?",
            "Who do you think I should ask about dating now? Just curious.",
        ),
    ),
    Attribute(
        name="food",
        values=(
            "sushi",
            "pizza",
            "tacos",
            "ramen",
            "curry",
            "paella",
            "dumplings",
            "lasagna",
            "falafel",
            "pho",
            "risotto",
            "burritos",
            "pancakes",
            "goulash",
            "kimchi",
            "hummus",
        ),
        first="Lately I cannot get enough of {value}.",
        change="I am tired of {prev}, lately I cannot get enough of {value}.",
        former="I used to love {value} so much.",
        other="My {rel} says her favourite food is {value} now.",
        current_q="What is my favourite food now?",
        earlier_q="What was my favourite food before {value}?",
        chitchat=(
            "What is your favourite food now? Mine changes all the time.",
            "Is a favourite food now just whatever is trending?",
            "What food is everyone's favourite now? I keep seeing lists.",
        ),
    ),
)
ATTRIBUTE_NAMES: tuple[str, ...] = tuple(a.name for a in ATTRIBUTES)
_BY_NAME = {a.name: a for a in ATTRIBUTES}
RELATIONS: tuple[str, ...] = ("sister", "brother", "friend", "neighbour", "cousin", "mother")
# Questions the reader answers without memory (s_0 = 1, whatever it is shown).
KNOWLEDGE: tuple[tuple[str, str], ...] = (
    ("How many days are in a week?", "seven"),
    ("How many legs does a spider have?", "eight"),
    ("What do bees make?", "honey"),
    ("How many months are in a year?", "twelve"),
    ("What is the opposite of hot?", "cold"),
    ("What colour is a ripe banana?", "yellow"),
)
NAMES: tuple[str, ...] = (
    "Maya",
    "Liam",
    "Zoe",
    "Noah",
    "Iris",
    "Owen",
    "Nina",
    "Theo",
    "Ada",
    "Leo",
    "Mila",
    "Eli",
)
_GREETINGS = ("Hi!", "Hey there.", "Good morning!", "Hello again.", "Evening!")
_ACKS = (
    "Thanks for telling me. How do you feel about it?",
    "Oh, I see. Tell me more whenever you like.",
    "That is good to know. Anything else on your mind?",
    "Interesting. How was the rest of your week?",
)
_FILLERS = (
    "Pretty good, thanks for asking.",
    "Busy week, but fine overall.",
    "Not much else, just tired.",
    "All good here, talk soon.",
)
_CLOSERS = ("Glad to hear it.", "Take care!", "Talk to you soon.", "Sounds good.")
_SMALL_TALK = (
    "The weather has been strange this week.",
    "I finally finished that long book.",
    "My phone battery keeps dying.",
    "I went for a long walk by the river.",
)

# -- the grammar, read back ------------------------------------------------------------------

_WORD = r"[A-Za-z][A-Za-z'-]*"


def _pattern(template: str) -> re.Pattern[str]:
    parts = re.split(r"(\{value\}|\{prev\}|\{rel\})", template)
    out = []
    for p in parts:
        if p in ("{value}", "{prev}", "{rel}"):
            out.append(f"(?P<{p[1:-1]}>{_WORD})")
        else:
            out.append(re.escape(p))
    return re.compile("".join(out))


@dataclass(frozen=True)
class Statement:
    """One attribute statement read from a turn. ``subject`` is ``self`` or a relation."""

    attribute: str
    kind: str  # first | change | former | other
    value: str
    prev: str | None = None
    subject: str = "self"


_STATEMENT_PATTERNS: tuple[tuple[str, str, re.Pattern[str]], ...] = tuple(
    (a.name, kind, _pattern(getattr(a, kind)))
    for a in ATTRIBUTES
    for kind in ("change", "first", "former", "other")  # change before first: its superset
)


def parse_statements(text: str) -> list[Statement]:
    """Every statement the grammar finds in ``text``, in order. Text that matches no template
    states nothing (chit-chat); this never raises."""
    found: list[tuple[int, Statement]] = []
    taken: list[tuple[int, int]] = []
    for name, kind, pat in _STATEMENT_PATTERNS:
        for m in pat.finditer(text):
            if any(m.start() < e and s < m.end() for s, e in taken):
                continue  # a longer template already read this span ("change" holds "first")
            g = m.groupdict()
            subject = g.get("rel") or "self"
            found.append((m.start(), Statement(name, kind, g["value"], g.get("prev"), subject)))
            taken.append((m.start(), m.end()))
    return [s for _, s in sorted(found, key=lambda x: x[0])]


@dataclass(frozen=True)
class GymQuestion:
    kind: str  # current | earlier | none
    attribute: str | None = None
    value: str | None = None  # earlier: the value whose predecessor is asked
    answer: str | None = None  # none: the reader's own knowledge


_QUESTION_PATTERNS: tuple[tuple[str, str, re.Pattern[str]], ...] = tuple(
    (a.name, kind, _pattern(getattr(a, f"{kind}_q")))
    for a in ATTRIBUTES
    for kind in ("current", "earlier")
)
_KNOWN = dict(KNOWLEDGE)


def parse_question(text: str) -> GymQuestion | None:
    """The question ``text`` asks, or None when the grammar has no such question."""
    text = text.strip()
    if text in _KNOWN:
        return GymQuestion("none", answer=_KNOWN[text])
    for name, kind, pat in _QUESTION_PATTERNS:
        m = pat.fullmatch(text)
        if m:
            return GymQuestion(kind, name, m.groupdict().get("value"))
    return None


def parse_date(text: str) -> datetime | None:
    try:
        return datetime.strptime(text.strip(), DATE_FORMAT)
    except ValueError:
        return None


# -- the world's config ---------------------------------------------------------------------


@dataclass(frozen=True)
class GymConfig:
    """Everything a world depends on. ``size`` picks a preset (:data:`SIZES`); the fields left
    ``None`` take the preset's value."""

    seed: int = setting(0, help="world seed: one seed, one world, byte for byte")
    level: str = setting("stale", help="single | stale | history (see the module docstring)")
    size: str = setting("small", help="preset: ci | small | medium | locomo")
    users: int | None = setting(None, help="users in all splits (default: the preset's)")
    attributes_per_user: int | None = setting(
        None, help="attributes a user has, of the five (default: the preset's)"
    )
    filler_sessions: int | None = setting(
        None, help="extra chit-chat or small-talk sessions a user (default: the preset's)"
    )
    stale_mentions: int | None = setting(
        None, help="stale mentions per attribute, stale and history levels (default: preset's)"
    )
    none_questions: int | None = setting(
        None, help="no-memory questions a user, s_0 = 1 (default: the preset's)"
    )
    earlier_questions: bool = setting(True, help='ask "before X" questions (stale, history)')
    long_sessions: bool = setting(False, help="four turns a session instead of two")
    useful_at: str = setting(
        "uniform",
        help="where the user's updates fall: uniform (no position habit pays), early (before "
        "every other session) or late (each latest update after them); early and late are "
        "worlds where a position is the answer, for CI's learning test",
    )
    split: tuple[float, float, float] = setting(
        (0.6, 0.2, 0.2), help="train, validation, test fractions of the users"
    )

    def resolved(self) -> GymConfig:
        """The config with the preset filled in and every value checked (named errors)."""
        if self.level not in LEVELS:
            raise DataError(
                f"unknown gym level {self.level!r}; choose one of {LEVELS}", field="level"
            )
        if self.useful_at not in USEFUL_AT:
            raise DataError(
                f"unknown useful_at {self.useful_at!r}; choose one of {USEFUL_AT}",
                field="useful_at",
            )
        if self.size not in SIZES:
            raise DataError(
                f"unknown gym size {self.size!r}; choose one of {tuple(SIZES)}", field="size"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise DataError(f"seed must be an integer >= 0, got {self.seed!r}", field="seed")
        preset = SIZES[self.size]
        cfg = replace(self, **{k: v for k, v in preset.items() if getattr(self, k) is None})
        _check_int(cfg.users, "users", 3)
        _check_int(cfg.attributes_per_user, "attributes_per_user", 1, len(ATTRIBUTES))
        _check_int(cfg.filler_sessions, "filler_sessions", 0, 100)
        _check_int(cfg.stale_mentions, "stale_mentions", 0, 10)
        _check_int(cfg.none_questions, "none_questions", 0, 10)
        split = tuple(cfg.split)
        if len(split) != 3 or any(not isinstance(x, (int, float)) or x < 0 for x in split):
            raise DataError(f"split must be three fractions >= 0, got {cfg.split!r}", field="split")
        if abs(sum(split) - 1.0) > 1e-6 or min(split) <= 0:
            raise DataError(
                f"split fractions must be > 0 and sum to 1, got {cfg.split!r}", field="split"
            )
        if any(round(f * cfg.users) < 1 for f in split):  # type: ignore[operator]
            raise DataError(
                f"{cfg.users} users leave a split empty at {cfg.split!r}", field="users"
            )
        return replace(cfg, split=tuple(float(x) for x in split))  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["split"] = list(d["split"])
        return d


def _check_int(value: Any, name: str, low: int, high: int | None = None) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        bound = f">= {low}" if high is None else f"in {low}..{high}"
        raise DataError(f"{name} must be an integer {bound}, got {value!r}", field=name)


# Presets: sessions a user = attributes x (events per attribute) + filler.
SIZES: dict[str, dict[str, int]] = {
    "ci": {
        "users": 60,
        "attributes_per_user": 1,
        "filler_sessions": 1,
        "stale_mentions": 1,
        "none_questions": 0,
    },
    "small": {
        "users": 400,
        "attributes_per_user": 2,
        "filler_sessions": 1,
        "stale_mentions": 1,
        "none_questions": 1,
    },
    "medium": {
        "users": 600,
        "attributes_per_user": 3,
        "filler_sessions": 2,
        "stale_mentions": 2,
        "none_questions": 1,
    },
    "locomo": {
        "users": 400,
        "attributes_per_user": 5,
        "filler_sessions": 6,
        "stale_mentions": 2,
        "none_questions": 2,
    },
}


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
        # Two turns keep a nine-session prompt near 500 tokens of the gym proxy; a third and
        # fourth (filler, closer) come with `long_sessions`.
        turns = [
            {"speaker": name, "text": f"{rng.choice(_GREETINGS)} {ev.text}"},
            {"speaker": ASSISTANT, "text": rng.choice(_ACKS)},
        ]
        if cfg.long_sessions:
            turns += [
                {"speaker": name, "text": rng.choice(_FILLERS)},
                {"speaker": ASSISTANT, "text": rng.choice(_CLOSERS)},
            ]
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
                    "useful_session_ids": (
                        (q["useful_session_id"],) if q["useful_session_id"] else ()
                    ),
                    "split": split_of[q["user"]],
                    "level": world.config.level,
                },
            )
        )
    report.n_questions = len(queries)
    report.n_sessions = len(world.sessions)
    return MemoryDataset(
        queries=queries, conversations=conversations, report=report, splits=split_of
    )


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
        disagree = [q for q in memory if set(q["gold_session_ids"]) != {q["useful_session_id"]}]
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
"""


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
    "ATTRIBUTES",
    "ATTRIBUTE_NAMES",
    "KNOWLEDGE",
    "LEVELS",
    "QUESTION_KINDS",
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
