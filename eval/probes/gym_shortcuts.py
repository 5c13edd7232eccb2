"""The memory gym's shortcut audit: how often a rule that reads no meaning puts a useful session
first (NDCG@1 against the useful session(s): a hit when the first session is one of them), on
the test users' memory questions of each world.

The rules: BM25 on the question; the latest session that uses the asked attribute's words (the
content words of that attribute's update and question templates that no other attribute's
use); the first, the latest and the unique session with an update cue word (and the latest one
that also uses the attribute's words); the latest session naming a value the question names;
recency (the last session); each position. The oracle (the reader's own grammar picks the
useful session) is not a shortcut and is reported apart: it says the questions are answerable.
A world passes when every shortcut scores <= 0.5 (the read level's design bar).

    python -m eval.probes.gym_shortcuts                       # read_medium, read_small, bench_world
    python -m eval.probes.gym_shortcuts --world configs/gym/read_medium.yaml

Writes eval/results/gym_shortcuts/gym_shortcuts.json and .md (with the code version and the
command).
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from memsifter.coarse import build_filter
from memsifter.data.gym import (
    ATTRIBUTES,
    GymWorld,
    load_world,
    parse_question,
    parse_statements,
    to_dataset,
)
from memsifter.data.gym_read_grammar import (
    READ_ATTRIBUTES,
    UPDATE_CUES,
    UPDATE_KINDS,
    parse_read_question,
    parse_read_statements,
)
from memsifter.data.types import Query, Session


@dataclass(frozen=True)
class Ask:
    """What a rule may look at: the question, the asked attribute's name (the world's record
    says it; no rule reads it from the text) and the sessions in the order shown."""

    question: str
    attribute: str | None
    haystack: Sequence[Session]

    @classmethod
    def of(cls, q: Query) -> Ask:
        return cls(q.question, q.meta.get("attribute"), tuple(q.haystack))


ROOT = Path(__file__).resolve().parents[2]
DEFAULT_WORLDS = ("configs/gym/read_medium.yaml", "configs/gym/read_small.yaml",
                  "configs/gym/bench_world.yaml")  # fmt: skip
BAR = 0.5
_STOP = set(
    "the a an i my me to of in at as and or but is am are was were be been do did does have has "
    "had now what which who where when how this that these those for with from on it its you "
    "your her his she he we our they them there so just still new last next year week".split()
)
_WORDS = re.compile(r"[a-z]+")
CUES = frozenset(UPDATE_CUES) | {"just", "quit", "rehomed", "broke", "tired", "adopted"}


def _words(text: str) -> set[str]:
    return set(_WORDS.findall(text.lower()))


def attribute_words() -> dict[str, set[str]]:
    """Content words of each attribute's update and question templates that no other
    attribute's templates use (both grammars: the rule must serve the old worlds too)."""
    raw: dict[str, set[str]] = defaultdict(set)
    for a in ATTRIBUTES:
        raw[a.name] |= _words(" ".join((a.first, a.change, a.current_q, a.earlier_q)))
    for r in READ_ATTRIBUTES:
        texts = [t.text for k in UPDATE_KINDS for t in r.templates[k]]
        texts += [t.text for t in (*r.current_q, *r.earlier_q)] + [r.when_ask, r.when_anchor]
        raw[r.name] |= _words(" ".join(texts))
    out = {}
    for name, ws in raw.items():
        others = set().union(*(v for k, v in raw.items() if k != name))
        out[name] = {w for w in ws - others - _STOP if w not in ("value", "prev", "rel")}
    return out


def _user_text(s: Session) -> str:
    return " ".join(t.text for t in s.turns if t.speaker != "Assistant")


def _latest(hs: Sequence[Session], keep: Callable[[Session], bool]) -> int | None:
    hits = [i for i, s in enumerate(hs) if keep(s)]
    return hits[-1] if hits else None


def _oracle(q: Ask) -> int | None:
    """The useful session as the reader's grammar finds it from the user's own statements: the
    latest update (``current``), the change to the named value (``earlier``), the anchor update
    (``when``, one of its two useful sessions)."""
    rq = parse_read_question(q.question)
    if rq is not None:
        parse: Callable[[str], list[Any]] = parse_read_statements
        kind, attr, value = rq.kind, (rq.anchor if rq.kind == "when" else rq.attribute), rq.value
    else:
        oq = parse_question(q.question)
        if oq is None or oq.kind == "none":
            return None
        parse, kind, attr, value = parse_statements, oq.kind, oq.attribute, oq.value

    def fits(s: Any) -> bool:
        if s.subject != "self" or s.attribute != attr or s.kind not in UPDATE_KINDS:
            return False
        if kind == "current":
            return True
        return s.value.lower() == (value or "").lower() and (kind == "when" or s.kind == "change")

    return _latest(q.haystack, lambda h: any(fits(s) for s in parse(_user_text(h))))


def rules(attr_words: dict[str, set[str]]) -> dict[str, Callable[[Ask], int | None]]:
    bm25 = build_filter("bm25")

    def ranked(q: Ask) -> int:
        # Looked up in this haystack each time: a cache keyed by id() answered from a freed
        # haystack whose id a later one reused.
        top = bm25.score(q.question, list(q.haystack)).ids[0]
        return next(i for i, s in enumerate(q.haystack) if s.id == top)

    def words_of(q: Ask) -> set[str]:
        return attr_words.get(q.attribute or "", set())

    def has_cue(s: Session) -> bool:
        return bool(_words(_user_text(s)) & CUES)

    def about(q: Ask, s: Session) -> bool:
        return bool(_words(_user_text(s)) & words_of(q))

    values = {v.lower() for a in READ_ATTRIBUTES for v in (*a.values, *a.heldout_values)}
    values |= {v.lower() for a in ATTRIBUTES for v in a.values}

    def named(q: Ask, s: Session) -> bool:
        shared = _words(q.question) & values
        return bool(shared and shared & _words(_user_text(s)))

    def cue_unique(q: Ask) -> int | None:
        cued = [i for i, s in enumerate(q.haystack) if has_cue(s)]
        return cued[0] if len(cued) == 1 else None  # no unique cue: no pick (a miss)

    return {
        "bm25": ranked,
        "attribute words, latest": lambda q: _latest(q.haystack, lambda s: about(q, s)),
        "update cue, first": lambda q: next(
            (i for i, s in enumerate(q.haystack) if has_cue(s)), None
        ),
        "update cue, latest": lambda q: _latest(q.haystack, has_cue),
        "update cue, unique": cue_unique,
        "update cue + attribute words, latest": lambda q: _latest(
            q.haystack, lambda s: has_cue(s) and about(q, s)
        ),
        "named value, latest": lambda q: _latest(q.haystack, lambda s: named(q, s)),
        "recency (last session)": lambda q: len(q.haystack) - 1,
    }


def audit(world: GymWorld, split: str = "test") -> dict[str, Any]:
    ds = to_dataset(world)
    test = [q for q in ds.queries if q.meta["split"] == split and q.meta["useful_session_ids"]]
    hits: dict[str, list[bool]] = defaultdict(list)
    by_kind: dict[str, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    span = max(len(q.haystack) for q in test)

    def record(name: str, q: Query, pick: int | None) -> None:
        hit = pick is not None and q.haystack[pick].id in q.meta["useful_session_ids"]
        hits[name].append(hit)
        by_kind[name][q.meta["kind"]].append(hit)

    table = rules(attribute_words())
    for q in test:
        ask = Ask.of(q)
        for name, rule in table.items():
            record(name, q, rule(ask))
        for p in range(span):
            record(f"position {p}", q, p if p < len(q.haystack) else None)
        record("oracle", q, _oracle(ask))
    scores = {k: round(sum(v) / len(v), 4) for k, v in hits.items()}
    shortcuts = {k: v for k, v in scores.items() if k != "oracle"}
    worst = max(shortcuts, key=lambda k: shortcuts[k])
    positions = {k: v for k, v in shortcuts.items() if k.startswith("position ")}
    best = max(positions, key=lambda k: positions[k])
    return {
        "config": world.config.to_dict(),
        "n_questions": len(test),
        "n_users": len({q.conversation_id for q in test}),
        "shortcuts": shortcuts,
        "oracle": scores["oracle"],
        "worst": {"rule": worst, "ndcg@1": shortcuts[worst]},
        "best_position": {"position": int(best.split()[1]), "ndcg@1": positions[best]},
        "passes_bar": shortcuts[worst] <= BAR,
        "by_kind": {
            name: {k: round(sum(v) / len(v), 4) for k, v in sorted(kinds.items())}
            for name, kinds in by_kind.items()
        },
    }


def shortcut_rankings(
    world: GymWorld, rows: Sequence[Mapping[str, Any]], positions: bool = False
) -> dict[str, list[list[int]]]:
    """Each rule's ranking of each RL data row's candidates (positions in the prompt's order),
    for scoring beside trained rankers (``eval/probes/gym_reading.py``): the rule's pick first, then
    the rest latest first; a rule with no pick (or a position past the end) ranks latest first,
    so its NDCG@1 here can exceed the audit's, which counts no pick as a miss. ``rows`` are rows of
    ``memsifter data rl`` on ``world`` (``qid`` = ``<source>/<question id>``).

    The rules read the candidates by date whatever order the prompt shows them in (``latest``
    is the newest session, not the last label; a newest-first prompt would otherwise turn every
    "latest" rule into "earliest"); ``position p`` is the shown label p."""
    from memsifter.ranker.prompt import chronological
    from memsifter.rewards.columns import sessions_from_column

    attribute = {q["id"]: q["attribute"] for q in world.questions}
    table = rules(attribute_words())
    out: dict[str, list[list[int]]] = defaultdict(list)
    span = max((len(sessions_from_column(r["candidates"])) for r in rows), default=0)
    for row in rows:
        shown = sessions_from_column(row["candidates"])
        hs = chronological(shown, [x.id for x in shown])
        at = {x.id: i for i, x in enumerate(shown)}
        dated = [at[x.id] for x in hs]
        ask = Ask(str(row["question"]), attribute[str(row["qid"]).split("/", 1)[1]], hs)
        latest_first = dated[::-1]
        picks = {
            name: None if (i := rule(ask)) is None else dated[i] for name, rule in table.items()
        }
        if positions:
            picks |= {f"position {p}": p if p < len(hs) else None for p in range(span)}
        for name, pick in picks.items():
            rest = [i for i in latest_first if i != pick]
            out[name].append(rest if pick is None else [pick, *rest])
    return dict(out)


def markdown(results: dict[str, Any]) -> str:
    names = list(results["worlds"])
    worlds = results["worlds"]
    head = "| rule | " + " | ".join(f"`{n}`" for n in names) + " |\n|---" + "|---:" * len(names)
    rows = [head + "|"]
    rules_seen = list(dict.fromkeys(r for w in worlds.values() for r in w["shortcuts"]))
    for rule in [r for r in rules_seen if not r.startswith("position ")]:
        cells = [
            f"{worlds[n]['shortcuts'][rule]:.3f}" if rule in worlds[n]["shortcuts"] else ""
            for n in names
        ]
        rows.append(f"| {rule} | " + " | ".join(cells) + " |")
    rows.append("| best single position | " + " | ".join(
        f"{worlds[n]['best_position']['ndcg@1']:.3f} ({worlds[n]['best_position']['position']})"
        for n in names) + " |")  # fmt: skip
    rows.append("| **worst shortcut** | " + " | ".join(
        f"**{worlds[n]['worst']['ndcg@1']:.3f}** ({worlds[n]['worst']['rule']})" for n in names
    ) + " |")  # fmt: skip
    rows.append("| oracle (not a shortcut) | " + " | ".join(
        f"{worlds[n]['oracle']:.3f}" for n in names) + " |")  # fmt: skip
    sizes = ", ".join(
        f"`{n}`: n = {w['n_questions']} questions, {w['n_users']} users" for n, w in worlds.items()
    )
    return f"""# Memory gym shortcut audit

NDCG@1 against the useful session(s) (a hit when the first session is one of them) for rules
that read no meaning, on the {results["split"]} users' memory questions ({sizes}). The bar
for the `read` level: every shortcut <= {BAR}. The oracle is the reader's own grammar picking
the useful session (it shows the questions are answerable, it is not a shortcut).

Code version `{results["code_version"]}`; command: `{results["command"]}`.

{chr(10).join(rows)}

Every position's score and every rule per question kind:
`eval/results/gym_shortcuts/gym_shortcuts.json` (`shortcuts`, `by_kind`). The update cue words
are the read grammar's `UPDATE_CUES` (plus the older grammar's `just`); an attribute's words are
the content words of its update and question templates that no other attribute's templates use.
"""


def main(
    world: Annotated[
        list[str] | None, typer.Option(help="a gym config YAML or world.json (repeatable)")
    ] = None,
    out: Annotated[str, typer.Option(help="report path; .json and .md are written")] = str(
        ROOT / "eval/results/gym_shortcuts/gym_shortcuts"
    ),
    split: Annotated[
        str, typer.Option(help="users to score (tune the generator on validation)")
    ] = "test",
) -> None:
    """Score every rule that reads no meaning on the gym's worlds: the shortcut audit."""
    worlds = world or list(DEFAULT_WORLDS)
    from eval.common import git_head

    version = git_head()
    command = "python -m eval.probes.gym_shortcuts" + "".join(f" --world {w}" for w in world or ())
    command += f" --split {split}" if split != "test" else ""
    results: dict[str, Any] = {"code_version": version, "command": command, "bar": BAR}
    results["split"] = split
    results["worlds"] = {Path(w).stem: audit(load_world(ROOT / w), split) for w in worlds}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    out.with_suffix(".md").write_text(markdown(results))
    print(markdown(results))
    if not all(w["passes_bar"] for n, w in results["worlds"].items() if n.startswith("read")):
        print("a read world has a shortcut above the bar", file=sys.stderr)


if __name__ == "__main__":
    typer.run(main)
