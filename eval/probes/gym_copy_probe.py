"""Did the written ranking copy its teacher? (docs/gym.md, finding 31)

    python -m eval.probes.gym_copy_probe --size ci --teacher ci-restated-marker/outcome_kl \\
        --pen ci-restated-generate/generate+teacher

A written ranking's run with ``--teacher RUNG/RUN --teacher-start`` (``eval/probes/gym_reading.py``)
starts from the teacher head's weights and learns, in its format SFT, to write the teacher's
rankings. On every memory question of the rung's **validation** users (not the loop's sample;
test users are not read), this measures the two halves of that copy:

1. **the closers**: the teacher's marker read on its own prompts (its letters) and on the same
   prompts labelled by digits, the written ranking's ids. The relevance the head learned sits
   at each session's closer; a closer that reads another label may not keep it;
2. **the copy**: the pen's SFT start (its written first id, greedy) on its own prompts: how
   often its first session is useful, how often it is the teacher's first session, and how its
   first ids spread, beside the spread of the lesson it was given (the teacher's first ids on
   the train pool);
3. **what the SFT did to the closers**: the pen's SFT weights read as the head (the marker read
   on the digits prompts), beside the teacher's on the same prompts;
4. **its own closers on its own prompt**: the pen's marker read at the closers of the very
   prompt it writes on (``closer_rankings``), and how often its written first session is
   theirs: the copy a lesson read there (``--teacher-reads pen``) teaches;

each beside the coarse filter (BM25's first session on the same candidates), with paired
cluster-bootstrap CIs that resample the validation users.

Writes ``eval/results/gym_reading/copy_probe.json`` (one entry per pen, with the code version,
the command and the machine). Ranks with the checkpoints in ``outputs/``: run it in the session
that trained them.
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from eval.probes import gym_reading as gym

OUT = gym.RESULTS / "copy_probe.json"


def first_ids(rankings: list[list[int]]) -> dict[str, int]:
    """How often each position is written first (``none``: no ranking parsed)."""
    count = collections.Counter(str(r[0]) if r else "none" for r in rankings)
    return dict(sorted(count.items()))


def memory_rows(data: Path) -> list[dict[str, Any]]:
    return [r for r in gym.load_split(data, "validation") if r["useful_positions"]]


def world_ids(rows: list[dict[str, Any]]) -> list[str]:
    """The world's question ids (a row's qid is ``<split>/<world id>``)."""
    return [str(r["qid"]).split("/", 1)[1] for r in rows]


def shown_as(rows: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """Each question with its candidate sessions in their order: two rungs' rows that agree
    here put the same session at every position, so their rankings pair position by position."""
    from memsifter.rewards.columns import sessions_from_column

    return [
        (q, [s.id for s in sessions_from_column(r["candidates"])])
        for q, r in zip(world_ids(rows), rows, strict=True)
    ]


# Each pair is a paired difference on the same questions, its CI resampling users.
PAIRS = (
    ("pen_sft_start", "bm25"),  # does the written first id beat the coarse filter?
    ("teacher_letters", "bm25"),  # the lesson's source, on its own prompts
    ("pen_sft_start", "teacher_digits"),  # the copy's gap, under the pen's labels
    ("pen_closers", "teacher_digits"),  # what the format SFT did to the closers
    ("pen_sft_start", "pen_own_closers"),  # the copy's gap, on the very prompt it writes on
)


def compare(hits: dict[str, list[float]], users: list[str]) -> dict[str, Any]:
    """Paired user-cluster bootstraps of :data:`PAIRS` (those whose two rankers were read)."""
    import numpy as np

    from memsifter.evaluation.bootstrap import paired_bootstrap

    out = {}
    for a, b in PAIRS:
        if a in hits and b in hits:
            (d,) = paired_bootstrap(
                {"ndcg@1_useful": np.asarray(hits[a])},
                {"ndcg@1_useful": np.asarray(hits[b])},
                clusters=users,
            ).values()
            out[f"{a}-{b}"] = {
                "mean": round(d["mean"], 3),
                "ci95": [round(x, 3) for x in d["ci95"]],
                "n": d["n"],
                "n_users": d["n_clusters"],
            }
    return out


def same_first(a: list[list[int]], b: list[list[int]]) -> float:
    """The share of questions on which two rankings of the same candidates put the same
    position first (a ranking that did not parse matches nothing)."""
    same = [bool(x) and bool(y) and x[0] == y[0] for x, y in zip(a, b, strict=True)]
    return round(sum(same) / max(len(same), 1), 3)


def main(
    size: Annotated[str, typer.Option(help="the rung's world size (configs/gym/read_<size>.yaml)")],
    teacher: Annotated[str, typer.Option(help="RUNG/RUN: the first-token head that taught")],
    pen: Annotated[str, typer.Option(help="RUNG/RUN: the written ranking's run it taught")],
) -> None:
    from memsifter.evaluation.config import N_BOOTSTRAP
    from memsifter.machine import machine_facts, machine_line
    from memsifter.ranker.checkpoint import as_base, read_spec
    from memsifter.training.rldata.curriculum import read_rankings

    world = gym.world_config(size)
    model, their_data = gym.teacher_of(teacher, world)
    pen_rung, _, pen_run = pen.partition("/")
    pen_dir = gym.ROOT / "outputs/gym_reading" / pen_rung
    start = pen_dir / "train" / pen_run / "sft" / "final"
    lesson = pen_dir / "teacher" / f"{pen_run}.jsonl"
    if not (start / "config.json").is_file() or not lesson.is_file():
        raise typer.BadParameter(
            f"{pen!r}: no format-SFT start and teacher's lesson here ({start}, {lesson})",
            param_hint="--pen",
        )
    pen_data = pen_dir / "data"
    rows, pen_rows = memory_rows(their_data), memory_rows(pen_data)
    if shown_as(pen_rows) != shown_as(rows):
        raise typer.BadParameter(
            f"{pen!r}: its validation prompts hold other questions or candidates than the "
            "teacher's rung",
            param_hint="--pen",
        )
    spec = read_spec(their_data)
    # The head's closers under the pen's labels: trained weights as a base (a checkpoint is
    # never served under another labelling); the teacher's spec names letters.
    digits = gym.build_data(
        world, their_data.parent, spec.layout, spec.head_read, order=spec.order, labels="digits"
    )
    probe_dir = their_data.parent / "copy_probe"
    facts = gym.question_facts(size)
    users = [str(facts[q]["user"]) for q in world_ids(rows)]
    ranked: dict[str, list[list[int]]] = {}
    for name, data, ranker in (
        ("teacher_letters", their_data, model),
        ("teacher_digits", digits, as_base(model, probe_dir / "base")),
        ("pen_closers", digits, as_base(start, probe_dir / "pen_base")),
    ):
        shown = memory_rows(data)
        if shown_as(shown) != shown_as(rows):
            raise RuntimeError(
                f"the {name} prompts hold other questions or candidates than the rung's"
            )
        ranked[name] = gym.rank_with(ranker, shown, read_spec(data))
    ranked["pen_sft_start"] = gym.rank_with(start, pen_rows, read_spec(pen_data))
    if read_spec(pen_data).layout in gym.MARKED_LAYOUTS:  # a pen shown no closers has none to read
        ranked["pen_own_closers"] = gym.closer_rankings(start, pen_rows, read_spec(pen_data))
    ranked["bm25"] = [list(r["coarse_order"]) for r in pen_rows]
    hits = {name: gym.useful_hits(pen_rows, r) for name, r in ranked.items()}
    train = gym.load_split(pen_data, "train_pool")
    taught = read_rankings(lesson, {str(r["qid"]): int(r["n_candidates"]) for r in train})
    score = {name: {"ndcg@1_useful": gym.useful_first(pen_rows, r)} for name, r in ranked.items()}
    record = {
        "split": "validation",
        "n_questions": len(rows),
        "n_users": len(set(users)),
        "teacher": teacher,
        "rankers": score,
        "closers_marker_read": {  # the first records' names
            "letters": score["teacher_letters"],
            "digits": score["teacher_digits"],
        },
        "pen_sft_start": {
            **score["pen_sft_start"],
            "first_ids": first_ids(ranked["pen_sft_start"]),
            "same_first_as_teacher_digits": same_first(
                ranked["pen_sft_start"], ranked["teacher_digits"]
            ),
            **(
                {
                    "same_first_as_own_closers": same_first(
                        ranked["pen_sft_start"], ranked["pen_own_closers"]
                    )
                }
                if "pen_own_closers" in ranked
                else {}
            ),
            "n": len(pen_rows),
        },
        "cluster_ci95": compare(hits, users),
        "bootstrap": f"paired, clustered by validation user, {N_BOOTSTRAP:,} resamples",
        "lesson_first_ids": first_ids([list(r) for r in taught.values()]),
        "lesson_n": len(taught),
        "position_prior": {  # where the useful session sits on these validation questions
            str(p): sum(p in r["useful_positions"] for r in pen_rows)
            for p in range(max(int(r["n_candidates"]) for r in pen_rows))
        },
        "code_version": gym.code_version(),
        "command": "python -m eval.probes.gym_copy_probe " + " ".join(sys.argv[1:]),
        "machine": machine_line(machine_facts(), run=True),
    }
    results = json.loads(OUT.read_text()) if OUT.is_file() else {}
    results[pen] = record
    OUT.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    typer.run(main)
