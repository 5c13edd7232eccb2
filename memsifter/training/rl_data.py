"""RL data: loaded datasets -> budgeted proxy prompts -> a parquet DatasetDict for GRPO.

A recipe (``configs/data/*.yaml``, :class:`RLDataConfig`) names the proxy's tokenizer and window,
the coarse filter, and one or more sources (LoCoMo, LongMemEval, our JSONL), each with a train
``count``. :func:`prepare_rl_data` builds every question's prompt with the shared
:class:`~memsifter.ranker.prompt.PromptBuilder` (the coarse filter's budgeted selection included),
so the proxy trains on exactly the prompt it is served, and writes ``train.parquet``,
``validation.parquet``, ``test.parquet``, ``split.json``, ``prompt_spec.json`` (the
:class:`~memsifter.ranker.spec.PromptSpec` every checkpoint trained on this data carries), a
dataset card ``README.md``, the resolved ``recipe.yaml`` and the curriculum report
(:mod:`memsifter.training.curriculum`).

**Three splits, by conversation, never by question.** Questions about one conversation share
its sessions; splitting them would let the proxy see held-out evidence in training. ``train``
trains; ``validation`` chooses (checkpoints, early stopping, recipe options); ``test`` is only
reported and never used to choose anything. A source lists ``validation_conversations`` and
``test_conversations`` (ids or 0-based indexes; ``train_conversations`` too, else train is the
rest), or gives ``validation_fraction`` / ``test_fraction`` for a seeded hash split, which suits
LongMemEval, where every question has its own haystack (its "conversation" is the question id).
The hash depends only on the seed and the conversation id, so the same question lands in the same
split in LongMemEval S and M, and adding data never moves an old conversation. LoCoMo with no
lists defaults to conversations 0-6 train, 7 validation, 8-9 test.

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
import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from memsifter.config import load_config
from memsifter.data import LOADERS, MemoryDataset, load_dataset
from memsifter.data.locations import DEFAULT_LOCOMO
from memsifter.data.splits import LOCOMO_TEST, LOCOMO_VALIDATION, SPLITS
from memsifter.data.types import Query
from memsifter.data.units import to_units
from memsifter.errors import DataError, UnknownNameError
from memsifter.ranker.checkpoint import save_spec
from memsifter.ranker.prompt import BuiltPrompt, PromptBuilder
from memsifter.ranker.spec import PromptSpec
from memsifter.rewards.columns import reward_columns
from memsifter.training.curriculum import (
    CurriculumReport,
    CurriculumSettings,
    Example,
    read_rankings,
    select,
    write_report,
)

if TYPE_CHECKING:
    from datasets import DatasetDict, Features
    from rich.console import Console

    from memsifter.coarse.base import CoarseFilter

# Datasets that split themselves when the recipe lists nothing: LoCoMo by the project's default
# (data/splits.py), the memory gym by the user split its world records.
OWN_SPLITS = ("locomo", "gym")
POOL_FILE = "train_pool.parquet"  # every train row, before the curriculum's selection


@dataclass(frozen=True)
class SourceSettings:
    """One dataset in the recipe. Conversations are ids or 0-based indexes in file order."""

    name: str  # the row's ``source`` and the key of --data overrides; unique in the recipe
    dataset: str = "locomo"  # loader: locomo | longmemeval | jsonl
    path: str = DEFAULT_LOCOMO
    count: int | None = None  # train rows kept by the curriculum; null keeps every train row
    train_conversations: list[int | str] | None = None
    validation_conversations: list[int | str] | None = None
    test_conversations: list[int | str] | None = None
    # Seeded hash split when no lists are given: the fractions held out for each role.
    validation_fraction: float | None = None
    test_fraction: float | None = None
    # Keep questions without any gold session (the gym's no-memory questions, where s_0 > 0);
    # they train nothing under R_ret, and R_ans gives them the same score for every ranking.
    keep_without_evidence: bool = False

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError(f"source name must be non-empty and without '/', got {self.name!r}")
        if self.dataset not in LOADERS:
            raise ValueError(
                f"source {self.name!r}: dataset must be one of {sorted(LOADERS)}, "
                f"got {self.dataset!r}"
            )
        if self.count is not None and self.count < 0:
            raise ValueError(f"source {self.name!r}: count must be >= 0, got {self.count}")
        listed = any(
            x is not None
            for x in (
                self.train_conversations,
                self.validation_conversations,
                self.test_conversations,
            )
        )
        hashed = self.validation_fraction is not None or self.test_fraction is not None
        if hashed:
            if listed:
                raise ValueError(
                    f"source {self.name!r}: give conversation lists or fractions, not both"
                )
            v, t = self.validation_fraction or 0.0, self.test_fraction or 0.0
            if not (0.0 <= v <= 1.0 and 0.0 <= t <= 1.0 and v + t <= 1.0):
                raise ValueError(
                    f"source {self.name!r}: validation_fraction ({v}) and test_fraction ({t}) "
                    "must be in [0, 1] and sum to at most 1"
                )
        elif listed and self.test_conversations is None:
            raise ValueError(
                f"source {self.name!r}: list test_conversations (the split that is only "
                "reported, never used to choose)"
            )
        elif not listed and self.dataset not in OWN_SPLITS:
            raise ValueError(
                f"source {self.name!r}: say how to split it: validation_conversations / "
                "test_conversations, or validation_fraction / test_fraction"
            )


@dataclass(frozen=True)
class RLDataConfig:
    """A dataset recipe: the proxy's prompt (one :class:`PromptSpec`: tokenizer, window,
    completion budget, coarse filter, language, thinking, candidate unit and order), the sources,
    the curriculum."""

    sources: list[SourceSettings] = field(default_factory=list)
    prompt: PromptSpec = field(default_factory=PromptSpec)
    seed: int = 0  # hash split and curriculum tie-breaks / random sampling
    curriculum: CurriculumSettings = field(default_factory=CurriculumSettings)

    def __post_init__(self) -> None:
        if not self.sources:
            raise ValueError("the recipe names no sources")
        names = [s.name for s in self.sources]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"source names must be unique; repeated: {dup}")

    @property
    def budget_tokens(self) -> int:
        return self.prompt.budget_tokens


def load_rl_data_config(path: str | Path) -> RLDataConfig:
    """Load a recipe; unknown keys, wrong types and refused values are errors naming the file."""
    # memsifter.config turns a dataclass's own ValueError into a DataError naming the file.
    return load_config(RLDataConfig, path)


def parse_data_overrides(values: Sequence[str], cfg: RLDataConfig) -> dict[str, str]:
    """``--data`` values: ``NAME=PATH`` per source, or a bare ``PATH`` when there is one source."""
    out: dict[str, str] = {}
    names = [s.name for s in cfg.sources]
    for value in values:
        name, sep, path = value.partition("=")
        if not sep:
            if len(names) != 1:
                raise DataError(
                    f"--data {value!r}: the recipe has {len(names)} sources ({', '.join(names)}); "
                    "write NAME=PATH",
                    field="--data",
                )
            name, path = names[0], value
        if name not in names:
            raise DataError(
                f"--data {value!r}: no source named {name!r}; sources: {', '.join(names)}",
                field="--data",
            )
        out[name] = path
    return out


def with_data_paths(cfg: RLDataConfig, paths: Mapping[str, str]) -> RLDataConfig:
    """The recipe with some sources' ``path`` replaced (by source name)."""
    names = {s.name for s in cfg.sources}
    unknown = sorted(set(paths) - names)
    if unknown:
        raise DataError(f"no source named {unknown}; sources: {sorted(names)}", field="sources")
    sources = [
        dataclasses.replace(s, path=paths[s.name]) if s.name in paths else s for s in cfg.sources
    ]
    return dataclasses.replace(cfg, sources=sources)


@dataclass(frozen=True)
class ConversationSplit:
    """Which conversations of one source went where."""

    source: str
    method: str  # listed | hash | locomo-default | dataset
    train: tuple[str, ...]
    validation: tuple[str, ...]
    test: tuple[str, ...] = ()
    unused: tuple[str, ...] = ()  # listed in no split (all three lists given)
    fractions: dict[str, float] | None = None  # hash split: held-out fraction per role

    def of(self, split: str) -> tuple[str, ...]:
        return {"train": self.train, "validation": self.validation, "test": self.test}[split]

    def assignment(self) -> dict[str, str]:
        """Conversation id -> split, for the conversations in a split."""
        return {c: split for split in SPLITS for c in self.of(split)}


def _conversation(query: Query) -> str:
    # A query without a conversation id is its own conversation.
    return query.conversation_id or query.qid


def _conversation_keys(dataset: MemoryDataset) -> list[str]:
    keys = list(dataset.conversations)
    seen = set(keys)
    for q in dataset.queries:
        c = _conversation(q)
        if c not in seen:
            keys.append(c)
            seen.add(c)
    return keys


def _resolve(raw: Sequence[int | str], keys: list[str], source: str, key: str) -> list[str]:
    out = []
    known = set(keys)
    for item in raw:
        text = str(item)
        if text in known:
            out.append(text)
        elif text.isdigit() and int(text) < len(keys):
            out.append(keys[int(text)])
        else:
            raise UnknownNameError(
                f"source {source!r}, {key}: unknown conversation {item!r}; known: "
                f"{', '.join(keys[:12])}{' …' if len(keys) > 12 else ''} "
                f"(or indexes 0..{len(keys) - 1})"
            )
    return list(dict.fromkeys(out))


def hash_fraction(seed: int, conversation: str) -> float:
    """A uniform number in [0, 1) fixed by the seed and the conversation id."""
    digest = hashlib.sha256(f"{seed}:{conversation}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_conversations(
    dataset: MemoryDataset, source: SourceSettings, seed: int = 0
) -> ConversationSplit:
    """Assign every conversation of ``dataset`` to train, validation or test (module doc)."""
    keys = _conversation_keys(dataset)
    if source.validation_fraction is not None or source.test_fraction is not None:
        v, t = source.validation_fraction or 0.0, source.test_fraction or 0.0
        where = {}
        for k in keys:
            h = hash_fraction(seed, k)
            where[k] = "test" if h < t else "validation" if h < t + v else "train"
        return ConversationSplit(
            source=source.name,
            method="hash",
            train=tuple(k for k in keys if where[k] == "train"),
            validation=tuple(k for k in keys if where[k] == "validation"),
            test=tuple(k for k in keys if where[k] == "test"),
            fractions={"validation": v, "test": t},
        )
    raw = {
        "train": source.train_conversations,
        "validation": source.validation_conversations,
        "test": source.test_conversations,
    }
    method = "listed"
    if all(v is None for v in raw.values()) and dataset.splits:  # the gym (see SourceSettings)
        where = {k: dataset.splits.get(k, "unused") for k in keys}
        return ConversationSplit(
            source=source.name,
            method="dataset",
            **{s: tuple(k for k in keys if where[k] == s) for s in ("train", "validation", "test")},
            unused=tuple(k for k in keys if where[k] == "unused"),
        )
    if all(v is None for v in raw.values()):  # LoCoMo (see SourceSettings)
        if len(keys) != 10:
            raise DataError(
                f"source {source.name!r}: the default LoCoMo split (conversations 0-6 train, 7 "
                f"validation, 8-9 test) is for the 10 conversations of locomo10.json, but this "
                f"file has {len(keys)}; list validation_conversations / test_conversations",
                file=source.path,
                field="test_conversations",
            )
        raw = {"train": None, "validation": list(LOCOMO_VALIDATION), "test": list(LOCOMO_TEST)}
        method = "locomo-default"
    lists = {
        k: _resolve(v, keys, source.name, f"{k}_conversations") if v else [] for k, v in raw.items()
    }
    for a, b in (("train", "validation"), ("train", "test"), ("validation", "test")):
        both = sorted(set(lists[a]) & set(lists[b]))
        if both:
            raise DataError(
                f"source {source.name!r}: conversations in both {a} and {b}: {both}",
                field=f"{b}_conversations",
            )
    if raw["train"] is None:
        held = set(lists["validation"]) | set(lists["test"])
        lists["train"] = [k for k in keys if k not in held]
    used = {c for v in lists.values() for c in v}
    return ConversationSplit(
        source=source.name,
        method=method,
        train=tuple(lists["train"]),
        validation=tuple(lists["validation"]),
        test=tuple(lists["test"]),
        unused=tuple(k for k in keys if k not in used),
    )


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
        if not Path(s.path).is_file():
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
            where = assignment.get(_conversation(q))
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


def build_row(
    query: Query, source: str, builder: PromptBuilder, coarse: CoarseFilter
) -> dict[str, Any]:
    """One dataset row (see the module doc for the columns)."""
    built = builder.build_query(query)
    gold = set(query.gold_session_ids)
    gold_positions = [i for i, sid in enumerate(built.candidate_ids) if sid in gold]
    useful = set(query.meta.get("useful_session_ids", ()))
    return {
        "prompt": built.text,
        "prompt_messages": [{"role": m["role"], "content": m["content"]} for m in built.messages],
        **reward_columns(query, built),
        "qid": f"{source}/{query.qid}",
        "source": source,
        "conversation": _conversation(query),
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


def _split_rows(rows: list[dict[str, Any]]) -> dict[str, int | float]:
    return {
        "rows": len(rows),
        "no_gold_in_prompt": sum(r["gold_in_prompt"] == 0 for r in rows),
        "truncated": sum(r["truncated"] for r in rows),
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
                    built.append(build_row(q, name, builder, coarse))
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
    for s in result.sources:
        how = {
            "listed": "conversations listed in the recipe",
            "locomo-default": "LoCoMo default: conversations 0-6 train, 7 validation, 8-9 test",
            "hash": f"seeded hash of the conversation id, held-out fractions {s.split.fractions}",
            "dataset": "the dataset's own split (the memory gym splits by user)",
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
        "See `memsifter/training/rl_data.py`.",
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
    recipe.write_text(
        yaml.safe_dump(dataclasses.asdict(result.config), sort_keys=False), encoding="utf-8"
    )
    card = out_dir / "README.md"
    card.write_text(render_card(result), encoding="utf-8")
    files += [split_path, recipe, card, *write_report(result.curriculum, out_dir)]
    result.files = files
    return files


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
