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
   often its first session is useful, and how its first ids spread, beside the spread of the
   lesson it was given (the teacher's first ids on the train pool).

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


def main(
    size: Annotated[str, typer.Option(help="the rung's world size (configs/gym/read_<size>.yaml)")],
    teacher: Annotated[str, typer.Option(help="RUNG/RUN: the first-token head that taught")],
    pen: Annotated[str, typer.Option(help="RUNG/RUN: the written ranking's run it taught")],
) -> None:
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
    spec = read_spec(their_data)
    # The head's closers under the pen's labels: the teacher's weights as a base (its spec
    # names letters, and a checkpoint is never served under another labelling).
    digits = gym.build_data(
        world, their_data.parent, spec.layout, spec.head_read, order=spec.order, labels="digits"
    )
    base = as_base(model, their_data.parent / "copy_probe" / "base")
    rows = memory_rows(their_data)
    facts = gym.question_facts(size)
    users = {facts[str(r["qid"]).split("/", 1)[1]]["user"] for r in rows}
    closers = {}
    for labels, data, ranker in (("letters", their_data, model), ("digits", digits, base)):
        shown = memory_rows(data)
        if [r["qid"] for r in shown] != [r["qid"] for r in rows]:
            raise RuntimeError(f"the {labels} prompts hold other questions than the rung's")
        ranked = gym.rank_with(ranker, shown, read_spec(data))
        closers[labels] = {"ndcg@1_useful": gym.useful_first(shown, ranked)}
    pen_data = pen_dir / "data"
    pen_rows = memory_rows(pen_data)
    written = gym.rank_with(start, pen_rows, read_spec(pen_data))
    train = gym.load_split(pen_data, "train_pool")
    taught = read_rankings(lesson, {str(r["qid"]): int(r["n_candidates"]) for r in train})
    record = {
        "split": "validation",
        "n_questions": len(rows),
        "n_users": len(users),
        "teacher": teacher,
        "closers_marker_read": closers,
        "pen_sft_start": {
            "ndcg@1_useful": gym.useful_first(pen_rows, written),
            "first_ids": first_ids(written),
            "n": len(pen_rows),
        },
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
