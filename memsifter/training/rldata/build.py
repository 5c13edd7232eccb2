"""RL data: loaded datasets -> budgeted proxy prompts -> a parquet DatasetDict for GRPO.

A recipe (``configs/data/*.yaml``, :class:`RLDataConfig`, :mod:`memsifter.training.rldata.recipe`)
names the proxy's tokenizer and window, the coarse filter, and one or more sources (LoCoMo,
LongMemEval, our JSONL), each with a train ``count``. :func:`prepare_rl_data` builds every
question's prompt with the shared :class:`~memsifter.ranker.prompt.PromptBuilder` (the coarse
filter's budgeted selection included), so the proxy trains on exactly the prompt it is served, and
writes ``train.parquet``, ``validation.parquet``, ``test.parquet``, ``split.json``,
``prompt_spec.json`` (the :class:`~memsifter.ranker.spec.PromptSpec` every checkpoint trained on
this data carries), a dataset card ``README.md``, the resolved ``recipe.yaml`` and the curriculum
report (:mod:`memsifter.training.rldata.curriculum`); the folder's files are
:mod:`memsifter.training.rldata.folder`.

**Three splits, by conversation, never by question**
(:mod:`memsifter.training.rldata.split`): ``train`` trains, ``validation`` chooses,
``test`` is only reported and never used to choose anything.

**Candidates** are whole sessions, or with ``unit: page`` pages of a few consecutive turns
(:mod:`memsifter.data.units`; gold pages are those holding the evidence turns), so that a small
CPU window still shows several candidates. ``candidates`` and ``gold_ids`` then hold pages.

**Rows.** Questions without any gold session are dropped (counted in the card): they can give
neither a retrieval reward nor a curriculum score. Questions whose gold sessions the coarse filter
cut from the prompt are kept, with ``gold_in_prompt = 0``; their NDCG is 0. Columns:

* ``prompt``: the rendered prompt text (chat template applied, generation prompt included), built
  by :class:`~memsifter.ranker.prompt.PromptBuilder` from the recipe's PromptSpec. TRL uses it as
  is (a plain-text prompt is not templated again), so training, validation, eval and serving
  tokenize the same string; ``prompt_messages`` keeps the chat messages for reading (not
  ``messages``, which TRL would read as a conversation);
* the reward columns of :func:`memsifter.rewards.columns.reward_columns`: ``question``,
  ``answer``, ``question_date``, ``candidates`` (JSON, prompt order), ``gold_ids``, ``category``,
  ``data_source`` (the dataset family; it picks the task score);
* ``qid`` (``<source>/<loader qid>``, unique across sources: LongMemEval S and M share question
  ids), ``source`` (the recipe's source name), ``conversation``;
* ``coarse_order`` (prompt positions, coarse filter's best first), ``gold_positions`` (prompt
  positions of the gold sessions), ``gold_in_prompt``, ``n_candidates``, ``prompt_tokens``
  (rendered with the chat template, never above window − completion), ``n_dropped`` (sessions the
  coarse filter cut), ``truncated`` (the one session shown was cut to fit).
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memsifter.data import MemoryDataset, load_dataset
from memsifter.data.splits import SPLITS
from memsifter.data.types import Query
from memsifter.data.units import to_units
from memsifter.errors import DataError, PromptBudgetError
from memsifter.ranker.prompt import BuiltPrompt, PromptBuilder
from memsifter.rewards.columns import reward_columns
from memsifter.training.rldata.curriculum import (
    CurriculumReport,
    Example,
    read_rankings,
    select,
)
from memsifter.training.rldata.folder import (
    POOL_FILE,
    RLDataResult,
    SourceSummary,
    load_rl_dataset,
    render_card,
    split_json,
    write_rl_dataset,
)
from memsifter.training.rldata.recipe import (
    RLDataConfig,
    SourceSettings,
    load_rl_data_config,
    parse_data_overrides,
    with_data_paths,
)
from memsifter.training.rldata.split import (
    ConversationSplit,
    conversation_of,
    hash_fraction,
    split_conversations,
)

if TYPE_CHECKING:
    from datasets import Features
    from rich.console import Console

    from memsifter.coarse.base import CoarseFilter


@dataclass
class SourcePlan:
    """A source loaded and split: what the prompts will be built from."""

    config: SourceSettings
    dataset: MemoryDataset
    split: ConversationSplit
    queries: dict[str, list[Query]]  # split -> questions with evidence, in units, file order
    dropped_no_evidence: dict[str, int]  # split -> questions without any gold session, dropped

    def counts(self) -> dict[str, dict[str, int | float]]:
        return {
            s: {
                "conversations": len(self.split.of(s)),
                "questions": len(self.queries[s]) + self.dropped_no_evidence[s],
                "dropped_no_evidence": self.dropped_no_evidence[s],
                # page units: gold pages taken from whole gold sessions (no turn evidence)
                "session_level_gold": sum(
                    bool(q.meta.get("session_level_gold")) for q in self.queries[s]
                ),
            }
            for s in SPLITS
        }


def plan_sources(cfg: RLDataConfig) -> list[SourcePlan]:
    """Load and split every source (no tokenizer, no prompts): the recipe's dry run."""
    for i, s in enumerate(cfg.sources):
        if not Path(s.path).exists():  # a file, or a folder (the gym's, the MemSifter release)
            raise DataError(
                f"dataset file of source {s.name!r} not found: {s.path} (fix the recipe or pass "
                f"--data {s.name}=PATH)",
                file=s.path,
                field=f"sources[{i}].path",
            )
    plans = []
    for s in cfg.sources:
        ds = load_dataset(s.dataset, s.path)
        split = split_conversations(ds, s, cfg.seed)
        assignment = split.assignment()
        queries: dict[str, list[Query]] = {k: [] for k in SPLITS}
        dropped = dict.fromkeys(SPLITS, 0)
        for q in ds.queries:
            where = assignment.get(conversation_of(q))
            if where is None:
                continue
            if q.has_evidence or s.keep_without_evidence:
                queries[where].append(to_units(q, cfg.prompt.unit, cfg.prompt.turns_per_page))  # type: ignore[arg-type]
            else:
                dropped[where] += 1
        plans.append(SourcePlan(s, ds, split, queries, dropped))
    return plans


def _coarse_order(built: BuiltPrompt, query: Query, coarse: CoarseFilter) -> tuple[int, ...]:
    if built.coarse_order is not None:
        return built.coarse_order
    if built.num_candidates == 1:
        return (0,)
    # Everything fit, so the builder never asked the coarse filter: rank the candidates now.
    position = {sid: i for i, sid in enumerate(built.candidate_ids)}
    by_id = {s.id: s for s in query.haystack}
    shown = [by_id[sid] for sid in built.candidate_ids]
    return tuple(position[sid] for sid in coarse.score(query.question, shown).ids)


def shown_in_order(
    built: BuiltPrompt,
    query: Query,
    builder: PromptBuilder,
    coarse: CoarseFilter,
    order: Sequence[int],
) -> BuiltPrompt:
    """``built``'s candidates (the same blocks; what the coarse filter dropped stays dropped)
    shown in ``order``: ``order[j]`` is the built position shown at position j. Its coarse
    order moves with them. Label i still sits at position i, so the length is unchanged."""
    if sorted(order) != list(range(built.num_candidates)):
        raise ValueError(f"{list(order)} is not an order of {built.num_candidates} candidates")
    by_id = {s.id: s for s in query.haystack}
    shown = [by_id[built.candidate_ids[j]] for j in order]
    again = builder.build_shown(query.question, shown, query.question_date)
    if again.n_tokens > again.budget_tokens:
        raise PromptBudgetError(
            f"question {query.qid!r}: its candidates in another order take {again.n_tokens} "
            f"tokens, over the budget of {again.budget_tokens} that their built order fits"
        )
    moved = {old: new for new, old in enumerate(order)}
    return dataclasses.replace(
        again,
        dropped_ids=built.dropped_ids,
        truncated_ids=built.truncated_ids,
        coarse_order=tuple(moved[p] for p in _coarse_order(built, query, coarse)),
    )


def shown_shuffled(
    built: BuiltPrompt, query: Query, builder: PromptBuilder, coarse: CoarseFilter, seed: int
) -> BuiltPrompt:
    """``built``'s candidates in a random order seeded by ``seed`` and the question id (the
    train split's order augmentation, ``train_shuffle_share``): :func:`shown_in_order`."""
    order = list(range(built.num_candidates))
    random.Random(f"train-order:{seed}:{query.qid}").shuffle(order)
    return shown_in_order(built, query, builder, coarse, order)


def build_row(
    query: Query,
    source: str,
    builder: PromptBuilder,
    coarse: CoarseFilter,
    shuffle_seed: int | None = None,
) -> dict[str, Any]:
    """One dataset row (see the module doc for the columns). With ``shuffle_seed``, its
    candidates are shown in a seeded random order (:func:`shown_shuffled`)."""
    built = builder.build_query(query)
    shuffled = shuffle_seed is not None and built.num_candidates > 1
    if shuffled:
        built = shown_shuffled(built, query, builder, coarse, shuffle_seed)
    gold = set(query.gold_session_ids)
    gold_positions = [i for i, sid in enumerate(built.candidate_ids) if sid in gold]
    useful = set(query.meta.get("useful_session_ids", ()))
    return {
        "prompt": built.text,
        "prompt_messages": [{"role": m["role"], "content": m["content"]} for m in built.messages],
        **reward_columns(query, built),
        "qid": f"{source}/{query.qid}",
        "source": source,
        "conversation": conversation_of(query),
        "coarse_order": list(_coarse_order(built, query, coarse)),
        "gold_positions": gold_positions,
        # the sessions whose content alone makes the answer right, where the dataset knows them
        # (the memory gym); empty otherwise. Measured against, never trained on.
        "useful_positions": [i for i, sid in enumerate(built.candidate_ids) if sid in useful],
        "gold_in_prompt": len(gold_positions),
        "n_candidates": built.num_candidates,
        "prompt_tokens": built.n_tokens,
        "n_dropped": len(built.dropped_ids),
        "truncated": bool(built.truncated_ids),
        # not a column: counted in the card
        "shuffled": shuffled,
    }


def row_features() -> Features:
    """The parquet schema, fixed so that every split (even an empty one) has the same types."""
    from datasets import Features, List, Value

    string, int32 = Value("string"), Value("int32")
    return Features(
        {
            "prompt": string,
            "prompt_messages": List({"role": string, "content": string}),
            "question": string,
            "answer": string,
            "question_date": string,
            "candidates": string,
            "gold_ids": List(string),
            "category": string,
            "data_source": string,
            "qid": string,
            "source": string,
            "conversation": string,
            "coarse_order": List(int32),
            "gold_positions": List(int32),
            "useful_positions": List(int32),
            "gold_in_prompt": int32,
            "n_candidates": int32,
            "prompt_tokens": int32,
            "n_dropped": int32,
            "truncated": Value("bool"),
        }
    )


def _split_rows(rows: list[dict[str, Any]]) -> dict[str, int | float]:
    return {
        "rows": len(rows),
        "no_gold_in_prompt": sum(r["gold_in_prompt"] == 0 for r in rows),
        "truncated": sum(r["truncated"] for r in rows),
        "shuffled": sum(r["shuffled"] for r in rows),
        "prompt_tokens_max": max((r["prompt_tokens"] for r in rows), default=0),
        "candidates_mean": round(sum(r["n_candidates"] for r in rows) / max(len(rows), 1), 2),
    }


def build_rl_dataset(
    cfg: RLDataConfig,
    rankings: str | Path | None = None,
    *,
    tokenizer: Any | None = None,
    coarse: CoarseFilter | None = None,
    console: Console | None = None,
) -> RLDataResult:
    """Build every prompt, select the train split with the curriculum, return the DatasetDict."""
    from datasets import Dataset, DatasetDict

    from memsifter.coarse import build_filter
    from memsifter.progress import make_progress

    start = time.perf_counter()
    plans = plan_sources(cfg)
    if tokenizer is None:
        from transformers import AutoTokenizer

        from memsifter.models import resolve_model

        tokenizer = AutoTokenizer.from_pretrained(resolve_model(cfg.prompt.model).path)
    coarse = coarse or build_filter(cfg.prompt.coarse)
    builder = cfg.prompt.builder(tokenizer, coarse)
    rows: dict[str, list[dict[str, Any]]] = {k: [] for k in SPLITS}
    per_source: dict[str, dict[str, list[dict[str, Any]]]] = {}
    total = sum(len(p.queries[s]) for p in plans for s in SPLITS)
    with make_progress(console) as progress:
        task = progress.add_task("prompts", total=total)
        for plan in plans:
            name = plan.config.name
            per_source[name] = {}
            for split in SPLITS:
                built = []
                for q in plan.queries[split]:
                    shuffle = split == "train" and (
                        hash_fraction(cfg.seed, f"train-order/{name}/{q.qid}")
                        < cfg.train_shuffle_share
                    )
                    seed = cfg.seed if shuffle else None
                    built.append(build_row(q, name, builder, coarse, shuffle_seed=seed))
                    progress.advance(task)
                per_source[name][split] = built
                rows[split].extend(built)

    n_candidates: dict[str, int] = {}
    for r in (r for s in SPLITS for r in rows[s]):
        if r["qid"] in n_candidates:
            raise DataError(f"question id {r['qid']!r} appears twice in its file", field="qid")
        n_candidates[r["qid"]] = r["n_candidates"]
    ranking_map = read_rankings(rankings, n_candidates) if rankings is not None else None
    keep, report = select(
        [Example.from_row(r) for r in rows["train"]],
        {p.config.name: p.config.count for p in plans},
        cfg.curriculum,
        seed=cfg.seed,
        rankings=ranking_map,
        rankings_file=str(rankings) if rankings is not None else None,
    )
    selected = [rows["train"][i] for i in keep]

    features = row_features()
    columns = list(features)

    def to_dataset(split_rows: list[dict[str, Any]]) -> Dataset:
        return Dataset.from_dict(
            {c: [r[c] for r in split_rows] for c in columns}, features=features
        )

    dataset = DatasetDict(
        train=to_dataset(selected),
        validation=to_dataset(rows["validation"]),
        test=to_dataset(rows["test"]),
    )
    selected_by_source = {sel.source: sel.n_selected for sel in report.sources}
    summaries = []
    for plan in plans:
        name = plan.config.name
        counts = plan.counts()
        for split in SPLITS:
            counts[split].update(_split_rows(per_source[name][split]))
        counts["train"]["selected"] = selected_by_source.get(name, 0)
        summaries.append(
            SourceSummary(name, plan.config.dataset, plan.config.path, plan.split, counts)
        )
    pool = to_dataset(rows["train"])
    return RLDataResult(cfg, dataset, pool, summaries, report, time.perf_counter() - start)


def prepare_rl_data(
    cfg: RLDataConfig,
    out: str | Path,
    rankings: str | Path | None = None,
    *,
    tokenizer: Any | None = None,
    coarse: CoarseFilter | None = None,
    console: Console | None = None,
) -> RLDataResult:
    """Build and write: the whole ``memsifter data rl`` stage."""
    result = build_rl_dataset(cfg, rankings, tokenizer=tokenizer, coarse=coarse, console=console)
    write_rl_dataset(result, out)
    return result


def reselect_train(folder: str | Path, rankings: str | Path) -> tuple[Any, CurriculumReport]:
    """The curriculum's selection from the whole train pool of a written RL data folder, scored
    with a model's rankings (``{"qid", "ranking"}`` JSONL over the pool): the next epoch's train
    split when the epoch loop re-scores with the current policy. Counts, anchor, scale and seed
    come from the recipe the folder was built with (``recipe.yaml``), so a re-selection differs
    from the first only by the rankings."""
    recipe = Path(folder) / "recipe.yaml"
    if not recipe.is_file():
        raise DataError("missing recipe.yaml; rebuild with `memsifter data rl`", file=str(recipe))
    cfg = load_rl_data_config(recipe)
    pool = load_rl_dataset(folder, pool=True)["train"]
    n_candidates = {str(q): int(n) for q, n in zip(pool["qid"], pool["n_candidates"], strict=True)}
    keep, report = select(
        [Example.from_row(r) for r in pool],
        {s.name: s.count for s in cfg.sources},
        cfg.curriculum,
        seed=cfg.seed,
        rankings=read_rankings(rankings, n_candidates),
        rankings_file=str(rankings),
    )
    return pool.select(keep), report


__all__ = [
    "POOL_FILE",
    "ConversationSplit",
    "RLDataConfig",
    "RLDataResult",
    "SourceSettings",
    "SourcePlan",
    "SourceSummary",
    "build_rl_dataset",
    "build_row",
    "hash_fraction",
    "load_rl_data_config",
    "load_rl_dataset",
    "parse_data_overrides",
    "plan_sources",
    "prepare_rl_data",
    "render_card",
    "reselect_train",
    "row_features",
    "split_conversations",
    "split_json",
    "with_data_paths",
    "write_rl_dataset",
]
