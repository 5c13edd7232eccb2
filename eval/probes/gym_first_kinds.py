"""What a reading-gym ranker puts first, by what the generator wrote there.

Reads committed rankings (``eval/results/gym_reading/runs/<rung>/rankings/<ranker>.json``: question
ids and each ranking as candidate positions) against the rung's data rows (the candidates in prompt
order) and the world the rung was built from (every session's event), and counts each first place
as one of:

- ``useful``: a useful session of the question;
- ``asked attribute, own update``: the user's own update of the asked attribute, not the useful
  one (an older value, or the newer one an ``earlier`` question does not want);
- ``asked attribute, other``: a session about the asked attribute that is not the user's update
  (a plan, a denial, someone else's change, a stale mention);
- ``other attribute, own update``: the user's own update of an attribute the question does not
  ask about;
- ``other attribute, other`` and ``small talk``.

A policy that detects updates but does not match them to the question lands on ``other attribute,
own update``; one that matches the attribute but not the time on ``asked attribute, own update``.
Memory questions only (``none`` questions have no useful session). A ranker is a committed
rankings file's name, or a model (a name, or a checkpoint folder whose adapter is merged first),
which ranks the first ``--n`` validation questions of the rung's own data (models rank
validation users only: test users are ranked by the eval stage)::

    python -m eval.probes.gym_first_kinds --rung small-marker --split test start outcome_kl
    python -m eval.probes.gym_first_kinds --rung small-restated-marker --split validation \
        smollm2-135m-instruct outputs/gym_reading/small-restated-marker/train/outcome_kl/...
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer

ROOT = Path(__file__).resolve().parents[2]
KINDS = (
    "useful",
    "asked attribute, own update",
    "asked attribute, other",
    "other attribute, own update",
    "other attribute, other",
    "small talk",
)


def first_kind(first: str, question: dict[str, Any], event: dict[str, Any]) -> str:
    """The kind of session ``first`` (its generator ``event``) is for ``question``."""
    from memsifter.data.gym_read_grammar import UPDATE_KINDS

    if first in question["useful_session_ids"]:
        return "useful"
    if event["attribute"] is None:
        return "small talk"
    own = event["subject"] == "self" and event["kind"] in UPDATE_KINDS
    where = "asked attribute" if event["attribute"] == question["attribute"] else "other attribute"
    return f"{where}, {'own update' if own else 'other'}"


def first_kinds(
    rankings: dict[str, Any], rows: list[dict[str, Any]], world: Any
) -> dict[str, dict[str, Any]]:
    """Shares of each kind among the first places, over all memory questions and by question kind
    (``current``, ``earlier``, ``when``), with their n."""
    sessions = {s["id"]: s for s in world.sessions}
    questions = {q["id"]: q for q in world.questions}
    by_qid = {str(r["qid"]): r for r in rows}
    missing = [q for q in rankings["qids"] if q not in by_qid]
    if missing:
        raise typer.BadParameter(
            f"{len(missing)} ranked questions are not in the split ({missing[0]})"
        )
    counts: dict[str, Counter[str]] = {"all": Counter()}
    for qid, ranking in zip(rankings["qids"], rankings["rankings"], strict=True):
        row = by_qid[qid]
        question = questions[qid.removeprefix(f"{row['source']}/")]
        if question["kind"] == "none":
            continue
        candidates = row["candidates"]  # the prompt's sessions, in order (a JSON list)
        candidates = json.loads(candidates) if isinstance(candidates, str) else candidates
        first = str(candidates[int(ranking[0])]["id"])
        kind = first_kind(first, question, sessions[first]["event"])
        counts["all"][kind] += 1
        counts.setdefault(question["kind"], Counter())[kind] += 1
    return {
        group: {"n": sum(c.values()), **{k: c[k] / max(sum(c.values()), 1) for k in KINDS}}
        for group, c in counts.items()
    }


def main(
    rankers: Annotated[list[str], typer.Argument(help="committed rankings by ranker name")],
    rung: Annotated[str, typer.Option(help="the reading gym's rung")] = "small-marker",
    split: Annotated[str, typer.Option(help="the rankings' split: validation or test")] = "test",
    n: Annotated[int, typer.Option(help="validation questions a model ranks")] = 200,
    out: Annotated[Path | None, typer.Option(help="also write the tables to this file")] = None,
) -> None:
    """Each ranker's first places by kind, as a markdown table per group of questions."""
    import eval.probes.gym_reading as G
    from eval.probes.gym_first_place import mergeable
    from memsifter.data.gym import load_world
    from memsifter.ranker.checkpoint import read_spec

    # The rankings are positions in the rung's own prompts: its own data maps them to sessions.
    # A date-order rung of this size shows the same sessions by date whatever the layout, so
    # any such build serves; another order (`-newest`) needs its own.
    size = rung.split("-")[0]
    other_order = tuple(f"-{suffix}" for suffix in G.ORDER_SUFFIX.values())
    own = ROOT / "outputs/gym_reading" / rung / "data" / f"{split}.parquet"
    if own.is_file():
        built = [own]
    elif rung.endswith(other_order):
        built = []
    else:
        everything = (ROOT / "outputs/gym_reading").glob(f"{size}*/data/{split}.parquet")
        built = sorted(p for p in everything if not p.parent.parent.name.endswith(other_order))
    if not built:
        raise typer.BadParameter(f"no data of rung {rung} is built here: run its data stage")
    world = load_world(ROOT / G.world_config(size))
    rows = G.load_split(built[0].parent, split)

    def rankings(name: str) -> dict[str, Any]:
        committed = G.RUNS / rung / "rankings" / f"{name}.json"
        if committed.is_file():
            return json.loads(committed.read_text())
        if split != "validation":
            raise typer.BadParameter(f"{name}: no committed {committed.name}; a model ranks "
                                     "validation users only (--split validation)")  # fmt: skip
        data = ROOT / "outputs/gym_reading" / rung / "data"
        mine = [r for r in G.load_split(data, "validation") if len(r["useful_positions"])][:n]
        ranked = G.rank_with(mergeable(name, rung), mine, read_spec(data))
        return {"qids": [str(r["qid"]) for r in mine], "rankings": ranked}

    report = {name: first_kinds(rankings(name), rows, world) for name in rankers}
    lines = [
        f"`python -m eval.probes.gym_first_kinds {' '.join(sys.argv[1:])}` at code version "
        f"`{G.code_version()}`; rung {rung}, split {split}; shares of the first places"
    ]
    for group in report[rankers[0]]:
        lines += [
            f"\n{group} (n = {report[rankers[0]][group]['n']})\n",
            "| ranker | " + " | ".join(KINDS) + " |",
            "|---" * (len(KINDS) + 1) + "|",
        ]
        lines += [f"| {name} | " + " | ".join(f"{report[name][group][k]:.3f}" for k in KINDS)
                  + " |" for name in rankers]  # fmt: skip
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)


if __name__ == "__main__":
    typer.run(main)
