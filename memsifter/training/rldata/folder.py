"""The RL data folder: the built dataset (:class:`RLDataResult`), and how it is written to disk,
described by its dataset card, and read back.

:func:`write_rl_dataset` writes ``train.parquet``, ``validation.parquet``, ``test.parquet``, the
whole train pool (``train_pool.parquet``), ``split.json``, ``prompt_spec.json``, the card
``README.md``, the resolved ``recipe.yaml`` and the curriculum report; :func:`load_rl_dataset`
reads the splits back. :mod:`memsifter.training.rldata.build` builds the result.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from memsifter.data.splits import SPLITS
from memsifter.errors import DataError
from memsifter.ranker.checkpoint import save_spec
from memsifter.training.rldata.curriculum import CurriculumReport, write_report
from memsifter.training.rldata.recipe import RLDataConfig
from memsifter.training.rldata.split import ConversationSplit

if TYPE_CHECKING:
    from datasets import DatasetDict

POOL_FILE = "train_pool.parquet"  # every train row, before the curriculum's selection


@dataclass
class SourceSummary:
    source: str
    dataset: str
    path: str
    split: ConversationSplit
    counts: dict[str, dict[str, int | float]]  # split -> conversations, questions, rows, ...


@dataclass
class RLDataResult:
    config: RLDataConfig
    dataset: DatasetDict  # train (the curriculum's selection), validation, test
    pool: Any  # Dataset: the whole train split before selection (cold-start SFT reads it)
    sources: list[SourceSummary]
    curriculum: CurriculumReport
    seconds: float
    files: list[Path] = field(default_factory=list)


def split_json(result: RLDataResult) -> dict[str, Any]:
    return {
        "seed": result.config.seed,
        "rule": "by conversation: no conversation is in both splits",
        "sources": {
            s.source: {
                "dataset": s.dataset,
                "path": s.path,
                "method": s.split.method,
                "fractions": s.split.fractions,
                "train": list(s.split.train),
                "validation": list(s.split.validation),
                "test": list(s.split.test),
                "unused": list(s.split.unused),
                "counts": s.counts,
            }
            for s in result.sources
        },
    }


def _fmt_conversations(ids: Sequence[str], limit: int = 12) -> str:
    if not ids:
        return "none"
    shown = ", ".join(f"`{c}`" for c in ids[:limit])
    return shown + (f" … ({len(ids)} in all)" if len(ids) > limit else "")


def render_card(result: RLDataResult) -> str:
    """The dataset card: HF front matter (so ``datasets.load_dataset(DIR)`` finds the splits)
    and what a reader needs to trust the data: recipe, split, drops, curriculum, schema."""
    cfg, rep = result.config, result.curriculum
    unit = (
        "whole sessions"
        if cfg.prompt.unit == "session"
        else f"pages of {cfg.prompt.turns_per_page} turns (gold: the pages holding evidence turns)"
    )
    splits = [s for s in SPLITS if len(result.dataset[s])]
    front = ["---", "configs:", "- config_name: default", "  data_files:"]
    for s in splits:
        front += [f"  - split: {s}", f"    path: {s}.parquet"]
    front.append("---")
    lines = [
        *front,
        "",
        "# MemSifter RL data",
        "",
        f"Built by `memsifter data rl` in {result.seconds:.1f} s. Proxy prompts for "
        f"`{cfg.prompt.model}`: window {cfg.prompt.window_tokens} tokens, completion "
        f"{cfg.prompt.completion_tokens} (prompts at most {cfg.budget_tokens}), coarse filter "
        f"`{cfg.prompt.coarse}`, candidates are {unit} shown in {cfg.prompt.order} order, "
        f"language `{cfg.prompt.language}`, ask_think {cfg.prompt.ask_think}, seed {cfg.seed}. "
        "The prompt contract is `prompt_spec.json` (every checkpoint trained on this data "
        "carries it); the resolved recipe is `recipe.yaml`.",
        "",
        "## Split",
        "",
        "By conversation, never by question: no conversation has questions in two splits "
        "(`split.json` lists every conversation). `train` trains, `validation` chooses "
        "(checkpoints, early stopping, recipe options), `test` is only reported and never used "
        "to choose anything. Questions without any gold session are "
        "dropped; questions whose gold the coarse filter cut from the prompt are kept "
        "(`gold_in_prompt = 0`).",
        "",
        "| source | split | conversations | questions | dropped (no evidence) | rows | "
        "no gold in prompt | truncated | selected |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in result.sources:
        for split in SPLITS:
            c = s.counts[split]
            sel = c.get("selected", c["rows"])
            lines.append(
                f"| {s.source} | {split} | {c['conversations']} | {c['questions']} | "
                f"{c['dropped_no_evidence']} | {c['rows']} | {c['no_gold_in_prompt']} | "
                f"{c['truncated']} | {sel} |"
            )
    lines.append("")
    if cfg.train_shuffle_share:
        shuffled = sum(s.counts["train"].get("shuffled", 0) for s in result.sources)
        pool = sum(s.counts["train"]["rows"] for s in result.sources)
        lines += [
            f"Order augmentation (`train_shuffle_share: {cfg.train_shuffle_share}`): {shuffled} "
            f"of the {pool} train rows (before selection) show their candidates in a seeded "
            f"random order; the other train rows, validation and test show them in "
            f"{cfg.prompt.order} order, the order the proxy is served.",
            "",
        ]
    for s in result.sources:
        how = {
            "listed": "conversations listed in the recipe",
            "locomo-default": "LoCoMo default: conversations 0-6 train, 7 validation, 8-9 test",
            "hash": f"seeded hash of the conversation id, held-out fractions {s.split.fractions}",
            "dataset": "the dataset's own split (the memory gym splits by user)",
            "dataset+hash": "the dataset's own train and test; validation a seeded hash share "
            f"of its train ({s.split.fractions})",
        }[s.split.method]
        lines += [
            f"- **{s.source}** (`{s.dataset}`, `{s.path}`): {how}.",
            *(f"  - {split}: {_fmt_conversations(s.split.of(split))}" for split in SPLITS),
        ]
        if s.split.unused:
            lines.append(f"  - unused: {_fmt_conversations(s.split.unused)}")
    lines += [
        "",
        "## Curriculum",
        "",
        f"Strategy `{rep.strategy}`, scored by `{rep.scored_by}`: {rep.note}. "
        f"priority = 1 − |d − τ|, τ = {rep.anchor}, d = NDCG@{rep.k} "
        + ("on the prompt's attainable range" if rep.scale == "attainable" else "as is")
        + "; only the train split is selected, validation and test stay whole. Details: "
        "`curriculum.json`, `curriculum_ndcg.png`.",
        "",
        "| source | pool | count | selected | mean NDCG before | mean NDCG after "
        "| coarse top-1 is gold: pool | selected |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def fmt(x: float | None) -> str:
        return "–" if x is None else f"{x:.3f}"

    for sel in rep.sources:
        count = "all" if sel.count is None else str(sel.count)
        lines.append(
            f"| {sel.source} | {sel.n_pool} | {count} | {sel.n_selected} "
            f"| {fmt(sel.ndcg_mean_before)} | {fmt(sel.ndcg_mean_after)} "
            f"| {fmt(sel.coarse_top1_gold_before)} | {fmt(sel.coarse_top1_gold_after)} |"
        )
    lines += [
        "",
        "With candidates shown in the coarse order, the last two columns are the share of "
        "prompts whose first shown candidate is gold: the position prior GRPO sees.",
    ]
    lines += [
        "",
        "## Columns",
        "",
        "`prompt` (the rendered prompt text, exactly what the proxy is fed), `prompt_messages` "
        "(its chat messages), the reward columns `question`, `answer`, `question_date`, "
        "`candidates` (JSON sessions in prompt order: `[Session i]` is `candidates[i]`), "
        "`gold_ids`, `category`, `data_source`; then `qid`, `source`, `conversation`, "
        "`coarse_order` (prompt positions, coarse best first), `gold_positions`, "
        "`gold_in_prompt`, `n_candidates`, `prompt_tokens`, `n_dropped`, `truncated`. "
        "See `memsifter/training/rldata/build.py`.",
        "",
    ]
    return "\n".join(lines)


def write_rl_dataset(result: RLDataResult, out: str | Path) -> list[Path]:
    """Write the parquet splits, ``split.json``, ``README.md``, ``recipe.yaml`` and the
    curriculum report into ``out``."""
    import datasets

    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # one bar per parquet file is noise in the CLI
    try:
        tables = [(f"{s}.parquet", result.dataset[s]) for s in SPLITS]
        for name, table in [*tables, (POOL_FILE, result.pool)]:
            table.to_parquet(str(out_dir / name))
            files.append(out_dir / name)
    finally:
        if bars:
            datasets.enable_progress_bars()
    files.append(save_spec(result.config.prompt, out_dir))
    split_path = out_dir / "split.json"
    split_path.write_text(json.dumps(split_json(result), indent=2) + "\n", encoding="utf-8")
    recipe = out_dir / "recipe.yaml"
    resolved = dataclasses.asdict(result.config)
    resolved["prompt"] = result.config.prompt.to_dict()  # a digits spec as it always was
    recipe.write_text(yaml.safe_dump(resolved, sort_keys=False), encoding="utf-8")
    card = out_dir / "README.md"
    card.write_text(render_card(result), encoding="utf-8")
    files += [split_path, recipe, card, *write_report(result.curriculum, out_dir)]
    result.files = files
    return files


def load_rl_dataset(path: str | Path, pool: bool = False) -> DatasetDict:
    """Read a folder written by :func:`write_rl_dataset`. Unlike ``datasets.load_dataset``, it
    accepts an empty split and writes nothing to the HF cache. ``pool=True`` gives the whole
    train split (before the curriculum's selection) as ``train``."""
    import pyarrow.parquet as pq
    from datasets import Dataset, DatasetDict

    folder = Path(path)
    splits = {}
    for split in SPLITS:
        f = folder / f"{split}.parquet"
        if not f.is_file():
            raise DataError(f"missing split file {f.name}", file=str(f))
        splits[split] = Dataset(pq.read_table(f))
    if pool:
        f = folder / POOL_FILE
        if not f.is_file():
            raise DataError(f"missing {POOL_FILE}; rebuild with `memsifter data rl`", file=str(f))
        splits["train"] = Dataset(pq.read_table(f))
    return DatasetDict(splits)


__all__ = [
    "POOL_FILE",
    "RLDataResult",
    "SourceSummary",
    "load_rl_dataset",
    "render_card",
    "split_json",
    "write_rl_dataset",
]
