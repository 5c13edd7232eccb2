"""The ``read`` level's grammar: every sentence a ``read`` world says and every question it asks
(:data:`READ_ATTRIBUTES`, :data:`WHEN_FRAMES`), and their inverse (:func:`parse_read_statements`,
:func:`parse_read_question`), which the gym's working LLM (:mod:`memsifter.llm.gym`) reads back.

Why a second grammar: the older levels' grammar gives every kind of statement one phrasing and
one cue word, so finding the useful session is template detection. Here the user's own updates
share their cue words and structures (``from``, ``quit``, ``rehomed``, ``broke up``, ``tired
of``, ``moved``, ``started``) with sentences that are not the user's updates: someone else's
change, a plan, a hypothetical, a denial. Only reading who did what, and whether it happened,
tells them apart. Every kind has several phrasings; templates and values marked ``heldout`` are
drawn only for validation and test users, so a model that memorised strings meets unseen ones.

Every template is a whole sentence; a statement is matched only at a sentence start, longest
template first, and the tests check that each template reads back as itself and no other. None
of these questions is a question of the older grammar, so the reader's behaviour on old worlds
is unchanged (its no-memory prior applies to these ``current`` questions only).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

READ_QUESTION_KINDS: tuple[str, ...] = ("current", "earlier", "when", "none")
UPDATE_KINDS: tuple[str, ...] = ("first", "change")  # the user's own updates: the only ones
DISTRACTOR_KINDS: tuple[str, ...] = ("other_change", "plan", "hypo", "negation", "former", "other")
SELF_KINDS: tuple[str, ...] = ("first", "change", "former")  # what an annotator labels
# The words the updates are built from; the distractors share them (the shortcut audit's cue).
UPDATE_CUES: tuple[str, ...] = (
    "moved", "move", "moving", "from", "left", "quit", "started", "became", "become", "rehomed",
    "adopted", "adopt", "broke", "break", "tired", "switched", "switch", "seeing", "after",
    "gave", "got", "split",
)  # fmt: skip


@dataclass(frozen=True)
class Template:
    id: str  # "home.change.2": attribute, kind, index
    text: str
    heldout: bool = False  # drawn only for validation and test users


@dataclass(frozen=True)
class ReadAttribute:
    name: str
    values: tuple[str, ...]  # every user may draw these
    heldout_values: tuple[str, ...]  # only validation and test users draw these
    prior: str  # the reader's no-memory answer to ``current``: a popular value, not held out
    templates: dict[str, tuple[Template, ...]]  # statement kind -> phrasings
    current_q: tuple[Template, ...]
    earlier_q: tuple[Template, ...]  # {value}: the value whose predecessor is asked
    when_ask: str  # "what did I work as": the asked half of a `when` question
    when_anchor: str  # "I moved to {value}": the anchor half
    chitchat: tuple[str, ...]  # filler that shares the questions' words and states nothing


def _attr(
    name: str, values: str, heldout: str, prior: str, **kinds: tuple[str, ...]
) -> ReadAttribute:
    """An attribute from compact literals: a phrasing starting with ``~`` is held out."""

    def templates(kind: str, texts: tuple[str, ...]) -> tuple[Template, ...]:
        return tuple(
            Template(f"{name}.{kind}.{i}", t.lstrip("~"), t.startswith("~"))
            for i, t in enumerate(texts)
        )

    when_ask, when_anchor = kinds.pop("when")
    chitchat = kinds.pop("chitchat")
    current_q = templates("current_q", kinds.pop("current_q"))
    earlier_q = templates("earlier_q", kinds.pop("earlier_q"))
    return ReadAttribute(
        name=name,
        values=tuple(values.split()),
        heldout_values=tuple(heldout.split()),
        prior=prior,
        templates={k: templates(k, v) for k, v in kinds.items()},
        current_q=current_q,
        earlier_q=earlier_q,
        when_ask=when_ask,
        when_anchor=when_anchor,
        chitchat=chitchat,
    )


READ_ATTRIBUTES: tuple[ReadAttribute, ...] = (
    _attr(
        "home",
        "Lisbon Paris Oslo Berlin Madrid Vienna Prague Dublin Warsaw Athens Rome Helsinki Zurich "
        "Brussels Amsterdam Budapest Copenhagen Stockholm Seville Porto Krakow Munich",
        "Geneva Lyon Bergen Tallinn Riga Valencia Ghent Bologna",
        "Paris",
        first=("I moved to {value} last week.", "I finally settled in {value}.",
               "I live in {value} now, I just got the keys.", "~My new address is in {value}."),
        change=("I moved from {prev} to {value}.", "I left {prev} and moved to {value}.",
                "After years in {prev}, I moved to {value}.",
                "~I packed up my life in {prev} and moved to {value}."),
        former=("I still miss {value}, where I used to live.",
                "I found old photos from my time living in {value}."),
        other=("My {rel} lives in {value} now.", "My {rel} loves living in {value}."),
        other_change=("My {rel} moved from {prev} to {value}.",
                      "My {rel} left {prev} and moved to {value}."),
        plan=("I might move from {prev} to {value} next year.",
              "I am thinking of moving from {prev} to {value} someday."),
        hypo=("If I ever left {prev}, I would move to {value}.",
              "If my job allowed it, I would move from {prev} to {value}."),
        negation=("People think I moved to {value}, but I never did.",
                  "Actually I never moved to {value}, I changed my mind."),
        current_q=("Which city do I live in these days?", "Where is home for me at the moment?",
                   "~What city am I based in right now?"),
        earlier_q=("Where did I live before I moved to {value}?",
                   "Which city was I in before {value}?",
                   "~Before {value}, where was home for me?"),
        when=("where did I live", "I moved to {value}"),
        chitchat=("Which city do you think is nicest to live in these days?",
                  "Is it hard to find a home in a big city at the moment?"),
    ),
    _attr(
        "job",
        "nurse teacher baker pilot lawyer dentist plumber chef designer farmer journalist "
        "librarian carpenter pharmacist translator photographer mechanic banker surgeon tailor",
        "florist welder cashier paramedic veterinarian barista roofer courier",
        "teacher",
        first=("I started working as a {value} this month.", "I got a job as a {value}.",
               "I am a {value} now, first week done.", "~I signed my contract as a {value} today."),
        change=("I quit being a {prev} and started working as a {value}.",
                "I left my job as a {prev} and became a {value}.",
                "After years as a {prev}, I started working as a {value}.",
                "~I handed in my notice as a {prev} and now work as a {value}."),
        former=("I sometimes miss working as a {value}.",
                "I ran into an old colleague from my days as a {value}."),
        other=("My {rel} works as a {value} now.", "My {rel} loves being a {value}."),
        other_change=("My {rel} quit being a {prev} and started working as a {value}.",
                      "My {rel} left her job as a {prev} and became a {value}."),
        plan=("I might quit being a {prev} and become a {value} next year.",
              "I am thinking of leaving my job as a {prev} to become a {value}."),
        hypo=("If I ever quit being a {prev}, I would become a {value}.",
              "If I could start over, I would quit being a {prev} and work as a {value}."),
        negation=("Actually I never took that job as a {value}, I turned it down.",
                  "People think I started working as a {value}, but I never did."),
        current_q=("What is my job these days?", "What do I do for a living at the moment?",
                   "~What is my line of work right now?"),
        earlier_q=("What was my job before I became a {value}?",
                   "Before I worked as a {value}, what was my job?",
                   "~What did I do for a living before becoming a {value}?"),
        when=("what did I work as", "I started working as a {value}"),
        chitchat=("What job do you think pays best these days?",
                  "Is it normal to feel tired of work at the moment?"),
    ),
    _attr(
        "pet",
        "dog cat parrot rabbit hamster turtle goldfish ferret lizard canary pony hedgehog gecko "
        "snake tortoise cockatoo",
        "chinchilla budgie tarantula donkey poodle lovebird",
        "dog",
        first=("I adopted a {value} last weekend.", "I brought home a {value} from the shelter.",
               "We have a {value} at home now, I just got it.",
               "~A little {value} joined my household."),
        change=("I rehomed my {prev} and adopted a {value}.",
                "I gave my {prev} to a neighbour and got a {value}.",
                "After my {prev} went to a new family, I adopted a {value}.",
                "~I found a new home for my {prev} and took in a {value}."),
        former=("I still think about my old {value}.",
                "I found a photo of the {value} I used to have."),
        other=("My {rel} has a {value} now.", "My {rel} keeps sending me pictures of her {value}."),
        other_change=("My {rel} rehomed her {prev} and adopted a {value}.",
                      "My {rel} gave away her {prev} and got a {value}."),
        plan=("I might rehome my {prev} and adopt a {value} next year.",
              "By spring I hope to have rehomed my {prev} and adopted a {value}."),
        hypo=("If I ever rehomed my {prev}, I would adopt a {value}.",
              "If I had more space, I would have adopted a {value} besides my {prev}."),
        negation=("Actually I never adopted that {value}, I changed my mind.",
                  "People think I got a {value}, but I never did."),
        current_q=("Which pet lives with me these days?",
                   "What animal do I have at home at the moment?",
                   "~What kind of pet do I keep right now?"),
        earlier_q=("Which pet did I have before I adopted the {value}?",
                   "Before the {value}, what animal did I have?",
                   "~What animal lived with me before the {value}?"),
        when=("what pet did I have", "I adopted the {value}"),
        chitchat=("Which pet do you think suits a small flat these days?",
                  "Is it a good time to have an animal at home at the moment?"),
    ),
    _attr(
        "partner",
        "Sam Alex Jordan Taylor Morgan Casey Riley Jamie Quinn Avery Robin Kai Noor Lena Omar "
        "Ines Yuki Mateo",
        "Elif Tomas Priya Hugo Sofia Ravi Anouk Bruno",
        "Alex",
        first=("I started seeing {value} this month.", "I am dating {value} now, it is going well.",
               "I met {value} and we are together now.", "~{value} and I made it official."),
        change=("I broke up with {prev} and started seeing {value}.",
                "Things ended with {prev}, and now I am dating {value}.",
                "After {prev} and I split, I started seeing {value}.",
                "~I left {prev} and fell for {value}."),
        former=("I ran into {value}, who I used to date.",
                "I found an old letter from {value}, my ex."),
        other=("My {rel} is dating {value} now.",
               "My {rel} keeps talking about {value}, her new partner."),
        other_change=("My {rel} broke up with {prev} and started seeing {value}.",
                      "My {rel} split from {prev} and is dating {value} now."),
        plan=("I might break up with {prev} and ask {value} out soon.",
              "I am thinking of leaving {prev} and seeing {value} instead."),
        hypo=("If I ever broke up with {prev}, I would ask {value} out.",
              "If I were single, I would start seeing {value} instead of {prev}."),
        negation=("Actually I never started seeing {value}, we are just friends.",
                  "People think I started seeing {value}, but I never did."),
        current_q=("Who is my partner these days?", "Who am I seeing at the moment?",
                   "~Who am I in a relationship with right now?"),
        earlier_q=("Who was I seeing before {value}?", "Who was my partner before {value}?",
                   "~Before I got together with {value}, who was I dating?"),
        when=("who was I dating", "I started seeing {value}"),
        chitchat=("Who do you think makes a good partner these days?",
                  "Is everyone seeing someone from an app at the moment?"),
    ),
    _attr(
        "food",
        "sushi pizza tacos ramen curry paella dumplings lasagna falafel pho risotto burritos "
        "pancakes goulash kimchi hummus",
        "gnocchi couscous bibimbap ceviche moussaka empanadas tempura baklava",
        "pizza",
        first=("Lately I eat {value} almost every day.", "I have become obsessed with {value}.",
               "My new favourite food is {value}.", "~These days {value} is all I want to eat."),
        change=("I am tired of {prev}, now I cannot get enough of {value}.",
                "I went off {prev} and my favourite food is {value} now.",
                "I switched from {prev} to {value} as my favourite food.",
                "~{prev} bores me now, I am all about {value}."),
        former=("I remember when I ate {value} every week.",
                "I used to love {value}, back in the day."),
        other=("My {rel} says her favourite food is {value} now.",
               "My {rel} cannot stop eating {value}."),
        other_change=("My {rel} is tired of {prev} and cannot get enough of {value}.",
                      "My {rel} switched from {prev} to {value} as her favourite food."),
        plan=("I might get tired of {prev} and switch to {value} soon.",
              "I am thinking of switching from {prev} to {value} for a while."),
        hypo=("If I ever got tired of {prev}, I would switch to {value}.",
              "If I lived by the sea, I would switch from {prev} to {value}."),
        negation=("Actually I never switched to {value}, that was a rumour.",
                  "People think I got into {value}, but I never did."),
        current_q=("What food do I like best these days?",
                   "What is my favourite dish at the moment?",
                   "~Which food do I love most right now?"),
        earlier_q=("Which food did I like best before {value}?",
                   "What dish did I love before {value}?",
                   "~Before {value}, what was my favourite dish?"),
        when=("what was my favourite food", "I got into {value}"),
        chitchat=("Which food do you think is best for a quick dinner these days?",
                  "Is everyone eating more street food at the moment?"),
    ),
)  # fmt: skip
READ_BY_NAME: dict[str, ReadAttribute] = {a.name: a for a in READ_ATTRIBUTES}
# `when` questions: {ask} is the asked attribute's past-tense question, {anchor} the anchor's
# update ("What did I work as when I moved to Lisbon?").
WHEN_FRAMES: tuple[Template, ...] = (
    Template("when_q.0", "{Ask} when {anchor}?"),
    Template("when_q.1", "Back when {anchor}, {ask}?"),
    Template("when_q.2", "At the time {anchor}, {ask}?", heldout=True),
)


def when_question(frame: Template, asked: ReadAttribute, anchor: ReadAttribute, value: str) -> str:
    ask = asked.when_ask
    return frame.text.format(
        Ask=ask[0].upper() + ask[1:], ask=ask, anchor=anchor.when_anchor.format(value=value)
    )


def corpus() -> tuple[str, ...]:
    """Every template and value once (for a tokenizer trained on the gym's words)."""
    lines: list[str] = []
    for a in READ_ATTRIBUTES:
        for ts in (*a.templates.values(), a.current_q, a.earlier_q):
            lines += [t.text for t in ts]
        lines += [*a.values, *a.heldout_values, a.when_ask, a.when_anchor, *a.chitchat]
    return tuple(lines + [f.text for f in WHEN_FRAMES])


# -- the grammar, read back ------------------------------------------------------------------

_WORD = r"[A-Za-z][A-Za-z'-]*"
_SENTENCE_START = r"(?:^|(?<=[.!?] ))"  # a template starts a sentence


def _regex(text: str) -> str:
    out = []
    for p in re.split(r"(\{value\}|\{prev\}|\{rel\})", text):
        out.append(f"(?P<{p[1:-1]}>{_WORD})" if p.startswith("{") else re.escape(p))
    return "".join(out)


@dataclass(frozen=True)
class ReadStatement:
    """One statement read from a turn: ``kind`` is an update kind (``first``/``change``) or a
    distractor kind; ``subject`` is ``self`` or the relation whose statement it is."""

    attribute: str
    kind: str
    value: str
    prev: str | None
    subject: str
    template: str


# Longest literal first, so that a template that holds another (a relation's change holds the
# user's) reads the span before the shorter one can.
_STATEMENTS: tuple[tuple[str, str, Template, re.Pattern[str]], ...] = tuple(
    sorted(
        (
            (a.name, kind, t, re.compile(_SENTENCE_START + _regex(t.text)))
            for a in READ_ATTRIBUTES
            for kind, ts in a.templates.items()
            for t in ts
        ),
        key=lambda x: -len(re.sub(r"\{\w+\}", "", x[2].text)),
    )
)


def parse_read_statements(text: str) -> list[ReadStatement]:
    """Every statement of the read grammar in ``text``, in order; never raises."""
    found: list[tuple[int, ReadStatement]] = []
    taken: list[tuple[int, int]] = []
    for name, kind, t, pat in _STATEMENTS:
        for m in pat.finditer(text):
            if any(m.start() < e and s < m.end() for s, e in taken):
                continue
            g = m.groupdict()
            subject = g.get("rel") or "self"
            found.append(
                (m.start(), ReadStatement(name, kind, g["value"], g.get("prev"), subject, t.id))
            )
            taken.append((m.start(), m.end()))
    return [s for _, s in sorted(found, key=lambda x: x[0])]


@dataclass(frozen=True)
class ReadQuestion:
    kind: str  # current | earlier | when
    attribute: str  # the asked attribute
    template: str
    value: str | None = None  # earlier: the named value; when: the anchor's value
    anchor: str | None = None  # when: the anchor's attribute


def _question_patterns() -> list[tuple[ReadQuestion, re.Pattern[str]]]:
    out = []
    for a in READ_ATTRIBUTES:
        for kind, ts in (("current", a.current_q), ("earlier", a.earlier_q)):
            out += [(ReadQuestion(kind, a.name, t.id), re.compile(_regex(t.text))) for t in ts]
        for b in READ_ATTRIBUTES:
            if b.name == a.name:
                continue
            for f in WHEN_FRAMES:
                text = when_question(f, a, b, "{value}")
                out.append(
                    (ReadQuestion("when", a.name, f.id, anchor=b.name), re.compile(_regex(text)))
                )
    return out


_QUESTIONS = _question_patterns()


def parse_read_question(text: str) -> ReadQuestion | None:
    """The read-level question ``text`` asks, or None."""
    text = text.strip()
    for q, pat in _QUESTIONS:
        m = pat.fullmatch(text)
        if m:
            value = m.groupdict().get("value")
            return ReadQuestion(q.kind, q.attribute, q.template, value, q.anchor)
    return None


__all__ = [
    "DISTRACTOR_KINDS",
    "READ_ATTRIBUTES",
    "READ_BY_NAME",
    "READ_QUESTION_KINDS",
    "SELF_KINDS",
    "UPDATE_CUES",
    "UPDATE_KINDS",
    "WHEN_FRAMES",
    "ReadAttribute",
    "ReadQuestion",
    "ReadStatement",
    "Template",
    "corpus",
    "parse_read_question",
    "parse_read_statements",
    "when_question",
]
