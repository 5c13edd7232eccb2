"""The proxy benchmark's questions: one split of an RL data folder (``memsifter data rl``) read
into the prompts, coarse orders and gold positions every ranker of ``memsifter eval proxy`` is
scored on, with ``split.json``'s conversation lists for the report."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memsifter.data.types import Session
from memsifter.errors import DataError
from memsifter.ranker.checkpoint import read_spec
from memsifter.ranker.spec import PromptSpec
from memsifter.rewards.columns import sessions_from_column


@dataclass(frozen=True)
class Question:
    qid: str
    prompt: str
    n_candidates: int
    coarse_order: tuple[int, ...]
    gold_positions: tuple[int, ...]
    conversation: str = ""
    category: str = ""
    # What the prompt was built from (the reward columns), so it can be rendered again in
    # another order (memsifter.evaluation.invariance); "" in a folder without them.
    question: str = ""
    question_date: str | None = None
    candidates: str = ""
    truncated: bool = False

    def sessions(self) -> tuple[Session, ...]:
        """The prompt's candidates in prompt order (``[Session i]`` is ``sessions()[i]``)."""
        if not self.candidates:
            raise DataError(
                "this RL data folder has no candidates column (an older `memsifter data rl`): "
                "rebuild it, or pass --no-invariance",
                record=self.qid,
                field="candidates",
            )
        sessions = sessions_from_column(self.candidates)
        if len(sessions) != self.n_candidates:
            raise DataError(
                f"{len(sessions)} candidates for a prompt of {self.n_candidates}",
                record=self.qid,
                field="candidates",
            )
        return sessions


@dataclass
class EvalData:
    folder: Path
    split: str
    spec: PromptSpec
    questions: list[Question]  # the scored ones (gold in prompt, sampled if asked)
    n_questions: int  # rows in the split
    n_with_gold_in_prompt: int  # rows in the split whose prompt shows gold
    conversations: dict[str, Any]  # split.json's lists (see read_split_lists)
    sampled: bool = False


def read_split_lists(folder: str | Path) -> dict[str, Any] | None:
    """``split.json``'s conversation lists: ``{train, validation, test}`` with one source,
    ``{source: {train, validation, test}}`` with several; None without the file."""
    path = Path(folder) / "split.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(f"split.json is not valid JSON: {e}", file=str(path)) from e
    sources = data.get("sources") if isinstance(data, dict) else None
    if not isinstance(sources, dict):
        raise DataError("split.json has no 'sources' object", file=str(path))
    lists = {
        name: {k: list(s[k]) for k in ("train", "validation", "test") if k in s}
        for name, s in sources.items()
    }
    return next(iter(lists.values())) if len(lists) == 1 else lists


def _question(row: Mapping[str, Any], file: str) -> Question:
    prompt = row["prompt"]
    if not isinstance(prompt, str):
        raise DataError(
            "column prompt must be the rendered prompt text; this folder has chat messages "
            "there (an older `memsifter data rl`): rebuild it",
            file=file,
            record=row.get("qid"),
            field="prompt",
        )
    n = int(row["n_candidates"])
    coarse = [int(p) for p in row["coarse_order"]]
    seen = set(coarse)
    coarse += [p for p in range(n) if p not in seen]  # every candidate has a coarse rank
    return Question(
        qid=str(row["qid"]),
        prompt=prompt,
        n_candidates=n,
        coarse_order=tuple(coarse),
        gold_positions=tuple(int(p) for p in row["gold_positions"]),
        conversation=str(row.get("conversation") or ""),
        category=str(row.get("category") or ""),
        question=str(row.get("question") or ""),
        question_date=row.get("question_date"),
        candidates=str(row.get("candidates") or ""),
        truncated=bool(row.get("truncated") or False),
    )


def seeded_sample(n: int, k: int | None, seed: int) -> list[int]:
    """``k`` of ``range(n)`` drawn with ``seed``, in order (all of them when ``k`` is None or not
    below ``n``): the question sample and the invariance check's, so both draw alike."""
    if k is None or k >= n:
        return list(range(n))
    return sorted(np.random.default_rng(seed).choice(n, size=k, replace=False).tolist())


def load_eval_data(
    folder: str | Path, split: str = "test", max_questions: int | None = None, seed: int = 0
) -> EvalData:
    """The scored questions of one split: those whose prompt shows gold, all of them or a seeded
    sample of ``max_questions`` (kept in file order)."""
    from memsifter.training.rldata.build import load_rl_dataset

    folder = Path(folder)
    spec = read_spec(folder)
    dataset = load_rl_dataset(folder)
    if split not in dataset:
        raise DataError(
            f"no split {split!r} in {folder}; splits: {', '.join(dataset)}", field="--split"
        )
    rows = dataset[split]
    scoreable = [_question(r, str(folder)) for r in rows if int(r["gold_in_prompt"]) > 0]
    n_gold = len(scoreable)
    sampled = max_questions is not None and max_questions < n_gold
    if sampled:
        scoreable = [scoreable[i] for i in seeded_sample(n_gold, max_questions, seed)]
    return EvalData(
        folder=folder,
        split=split,
        spec=spec,
        questions=scoreable,
        n_questions=len(rows),
        n_with_gold_in_prompt=n_gold,
        conversations=read_split_lists(folder) or {},
        sampled=sampled,
    )


__all__ = ["EvalData", "Question", "load_eval_data", "read_split_lists", "seeded_sample"]
