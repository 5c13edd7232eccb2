"""The memory gym's grammar: every sentence a gym world says and every question it asks, as
templates (:data:`ATTRIBUTES`, :data:`KNOWLEDGE`, the fixed phrases), and their inverse
(:func:`parse_statements`, :func:`parse_question`, :func:`parse_date`), which the gym's working
LLM (:mod:`memsifter.llm.gym`) reads back. The generator (:mod:`memsifter.data.gym`) writes with
these templates; keeping writer and reader in one module is what keeps them each other's inverse.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

QUESTION_KINDS: tuple[str, ...] = ("current", "earlier", "none")
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


def session_turns(rng: Any, name: str, text: str, long_sessions: bool) -> list[dict[str, str]]:
    """A session's turns around its event ``text``: the user's greeting and event, the
    assistant's acknowledgement, and with ``long_sessions`` a filler and a closer. Two turns
    keep a nine-session prompt near 500 tokens of the gym proxy. Every level writes its
    sessions here, so their draws (and so the worlds' bytes) stay in one order."""
    turns = [
        {"speaker": name, "text": f"{rng.choice(_GREETINGS)} {text}"},
        {"speaker": ASSISTANT, "text": rng.choice(_ACKS)},
    ]
    if long_sessions:
        turns += [
            {"speaker": name, "text": rng.choice(_FILLERS)},
            {"speaker": ASSISTANT, "text": rng.choice(_CLOSERS)},
        ]
    return turns


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
