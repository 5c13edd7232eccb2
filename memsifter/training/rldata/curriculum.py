"""Curriculum sampling: which training questions each GRPO round sees.

GRPO learns only from groups whose completions get different rewards. A question the proxy already
ranks perfectly (every completion scores NDCG 1) or hopelessly (every completion scores 0) gives a
group with no spread and no gradient. So each candidate question is scored by how well a previous
model ranked it, NDCG@10 of the gold sessions among the prompt's candidates, and questions near an
anchor τ (default 0.2: hard, not hopeless) are preferred:

    priority = 1 − |NDCG@10 − τ|

**Reaching the anchor with short candidate lists.** The paper's τ = 0.2 assumes long candidate
lists, where NDCG@10 can fall near 0. With few candidates it cannot: with n candidates and one
gold, the worst ranking still scores 1/log2(n+1) (0.28 for n = 11), so every prompt is above τ and
``1 − |NDCG − τ|`` simply prefers the prompts the coarse filter ranks *worst*. ``scale:
attainable`` (the default) measures NDCG on the range the prompt can reach: d = (NDCG − NDCG_min)
/ (1 − NDCG_min), NDCG_min being the NDCG of the prompt's worst ranking (every gold last), so
d = 0 is "gold last", d = 1 is "gold first", and τ = 0.2 means "near the bottom of what this
prompt allows" for short and long lists alike. ``scale: absolute`` is the paper's formula as
written. The report's histograms are of raw NDCG.

The top ``count`` questions of each source by priority are kept (ties broken by a seeded hash of
the qid, so the choice is stable and reproducible). Only the train split is selected; validation
stays whole.

**Rankings file.** A previous model's rankings come as JSON lines, one per question:

    {"qid": "locomo/conv-26/q0", "ranking": [3, 0, 5]}

``qid`` is the dataset's ``qid`` column and ``ranking`` holds 0-based **prompt positions** (the
``[Session i]`` ids of that row's prompt), best first, as :func:`memsifter.ranker.parse_ranking`
reads them. An empty list means the model gave no usable ranking (NDCG 0). Other keys are
allowed and ignored (a writer may add ``"step"`` or ``"model"``). Positions refer to one built
dataset: a file written for a different build (other window, other coarse filter) is caught by its
unknown qids or out-of-range positions, which are errors. :func:`write_rankings` writes the format.

**First round.** Without rankings, the coarse filter's order of the prompt's candidates
(``coarse_order``) stands in for the previous model, and the report says so. ``strategy: random``
is the explicit fallback: a seeded uniform sample of ``count`` per source, NDCG still logged.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from memsifter.errors import DataError
from memsifter.rewards.retrieval import DEFAULT_RETRIEVAL_K, retrieval_reward

STRATEGIES: tuple[str, ...] = ("curriculum", "random")
SCALES: tuple[str, ...] = ("attainable", "absolute")
DEFAULT_ANCHOR = 0.2
# Priorities are compared after rounding, so that equal NDCGs computed along different float paths
# tie exactly and the seeded tie-break, not float noise, decides.
_PRIORITY_DIGITS = 9


@dataclass(frozen=True)
class CurriculumSettings:
    """How the train split is sampled down to each source's ``count``."""

    strategy: str = "curriculum"  # curriculum (priority by NDCG) | random (seeded, uniform)
    anchor: float = DEFAULT_ANCHOR  # τ: the NDCG the curriculum prefers
    scale: str = "attainable"  # attainable (NDCG on the prompt's reachable range) | absolute
    k: int = DEFAULT_RETRIEVAL_K  # NDCG cutoff
    bins: int = 10  # histogram bins over [0, 1] in the report and plot
    # Sample only examples whose prompt shows a gold session. Without gold every ranking has
    # NDCG 0, whose priority 1 - tau = 0.8 would outrank most answerable examples, and R_ret
    # gives such a group no spread. Set false to keep the paper's formula over every row.
    require_gold: bool = True

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"curriculum.strategy must be one of {STRATEGIES}, got {self.strategy!r}"
            )
        if self.scale not in SCALES:
            raise ValueError(f"curriculum.scale must be one of {SCALES}, got {self.scale!r}")
        if not 0.0 <= self.anchor <= 1.0:
            raise ValueError(f"curriculum.anchor must be in [0, 1], got {self.anchor}")
        if self.k < 1:
            raise ValueError(f"curriculum.k must be >= 1, got {self.k}")
        if self.bins < 1:
            raise ValueError(f"curriculum.bins must be >= 1, got {self.bins}")


@dataclass(frozen=True)
class Example:
    """What the curriculum needs of one dataset row."""

    qid: str
    source: str
    gold_positions: tuple[int, ...]
    coarse_order: tuple[int, ...]

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Example:
        try:
            return cls(
                qid=str(row["qid"]),
                source=str(row["source"]),
                gold_positions=tuple(int(p) for p in row["gold_positions"]),
                coarse_order=tuple(int(p) for p in row["coarse_order"]),
            )
        except KeyError as e:
            raise DataError(f"dataset row lacks column {e.args[0]!r}", field=str(e.args[0])) from e


@dataclass(frozen=True)
class Scored:
    qid: str
    source: str
    ndcg: float
    priority: float
    scored_by: str  # rankings | coarse


@dataclass
class SourceSelection:
    """One source's pool before selection and what was kept."""

    source: str
    n_pool: int
    count: int | None  # asked for; None keeps the whole pool
    n_selected: int
    ndcg_mean_before: float | None  # None for an empty pool
    ndcg_mean_after: float | None
    hist_before: list[int]
    hist_after: list[int]
    # Share of examples (with gold shown) whose coarse filter's first pick is gold, in the pool
    # and in the selection. When prompts list candidates in the coarse order, a selection that
    # moves this share moves the position prior the policy learns: a curriculum scored by the
    # coarse order near a low anchor keeps exactly the prompts where the first shown is wrong.
    coarse_top1_gold_before: float | None = None
    coarse_top1_gold_after: float | None = None


@dataclass
class CurriculumReport:
    strategy: str
    scored_by: str  # rankings | coarse | mixed (rankings, coarse for rows the file lacks)
    note: str
    anchor: float
    k: int
    seed: int
    bin_edges: list[float]
    sources: list[SourceSelection]
    rankings_file: str | None = None
    scale: str = "attainable"  # how NDCG was read against the anchor (CurriculumSettings.scale)
    n_scored_by_rankings: int = 0
    n_scored_by_coarse: int = 0
    n_rankings_ignored: int = 0  # lines for rows outside the pool (e.g. validation)
    examples: list[dict[str, Any]] = field(default_factory=list)  # qid, ndcg, priority, selected

    @property
    def hist_before(self) -> list[int]:
        return _sum_hists(s.hist_before for s in self.sources)

    @property
    def hist_after(self) -> list[int]:
        return _sum_hists(s.hist_after for s in self.sources)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["hist_before"] = self.hist_before
        out["hist_after"] = self.hist_after
        return out


def _sum_hists(hists: Iterable[list[int]]) -> list[int]:
    total: list[int] = []
    for h in hists:
        total = [a + b for a, b in zip(total, h, strict=True)] if total else list(h)
    return total


def priority(ndcg: float, anchor: float = DEFAULT_ANCHOR) -> float:
    """1 − |NDCG − τ|: 1 at the anchor, falling linearly on both sides."""
    if not 0.0 <= ndcg <= 1.0:
        raise ValueError(f"NDCG must be in [0, 1], got {ndcg}")
    return 1.0 - abs(ndcg - anchor)


def attainable(ndcg: float, n_candidates: int, gold: Sequence[int], k: int) -> float:
    """NDCG rescaled to the range a prompt of ``n_candidates`` with these gold positions can
    reach: 0 for the worst ranking (every gold last), 1 for the best."""
    gold_set = set(gold)
    worst = [p for p in range(n_candidates) if p not in gold_set] + sorted(gold_set)
    floor = retrieval_reward(worst, gold, k)
    if floor >= 1.0:
        return 1.0
    return min(1.0, max(0.0, (ndcg - floor) / (1.0 - floor)))


def _tiebreak(seed: int, qid: str) -> str:
    return hashlib.sha256(f"{seed}:{qid}".encode()).hexdigest()


def read_rankings(path: str | Path, n_candidates: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    """Read a rankings file (see the module doc) against the dataset's rows.

    ``n_candidates`` maps every qid of the built dataset (all splits) to its prompt's candidate
    count. Malformed lines, duplicate qids, qids the dataset does not have and positions outside a
    prompt are :class:`DataError` naming the file, line and field."""
    p = Path(path)
    if not p.is_file():
        raise DataError("rankings file not found", file=str(p))
    out: dict[str, tuple[int, ...]] = {}
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = {"file": str(p), "record": f"line {lineno}"}
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"not a JSON line: {e.msg}", **where) from e
            if not isinstance(obj, dict):
                raise DataError(f"expected an object, got {type(obj).__name__}", **where)
            qid = obj.get("qid")
            if not isinstance(qid, str) or not qid:
                raise DataError(
                    f"qid must be a non-empty string, got {qid!r}", **where, field="qid"
                )
            if qid not in n_candidates:
                raise DataError(
                    f"unknown qid {qid!r}: no row of this dataset has it (rankings written for "
                    "another build?)",
                    **where,
                    field="qid",
                )
            if qid in out:
                raise DataError(f"qid {qid!r} appears twice", **where, field="qid")
            ranking = obj.get("ranking")
            if not isinstance(ranking, list) or not all(
                isinstance(x, int) and not isinstance(x, bool) for x in ranking
            ):
                raise DataError(
                    f"ranking must be a list of integer prompt positions, got {ranking!r}",
                    **where,
                    field="ranking",
                )
            n = n_candidates[qid]
            bad = [x for x in ranking if not 0 <= x < n]
            if bad:
                raise DataError(
                    f"positions {bad} are outside the prompt of {qid!r}, which shows {n} sessions "
                    "(positions 0.." + str(n - 1) + ")",
                    **where,
                    field="ranking",
                )
            if len(set(ranking)) != len(ranking):
                raise DataError(f"ranking of {qid!r} repeats a position", **where, field="ranking")
            out[qid] = tuple(ranking)
    return out


def write_rankings(path: str | Path, rankings: Iterable[tuple[str, Sequence[int]]]) -> Path:
    """Write ``(qid, positions)`` pairs in the rankings-file format."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("w", encoding="utf-8") as f:
        for qid, ranking in rankings:
            f.write(json.dumps({"qid": qid, "ranking": [int(x) for x in ranking]}) + "\n")
    return p


@dataclass(frozen=True)
class Carried:
    """Rankings of one build re-expressed in another's positions (:func:`carry_rankings`)."""

    rankings: dict[str, tuple[int, ...]]
    dropped: int  # ranked sessions the other build's prompt does not show
    unranked: int  # shown sessions the ranker never saw (a reader fills them in coarse order)


def carry_rankings(
    rankings: Mapping[str, Sequence[int]],
    ranked_rows: Iterable[Mapping[str, Any]],
    rows: Iterable[Mapping[str, Any]],
) -> Carried:
    """``rankings`` of ``ranked_rows``' prompts, in the positions of ``rows``' prompts: the same
    questions rendered by another recipe (another layout, head or completion budget, so a
    prompt may show one session more or less). Sessions are matched by id, never by position,
    so the order is the ranker's whatever each build's order is; a ranked session the other
    prompt lacks is dropped, and counted. A question of ``rows`` that ``rankings`` does not
    rank is a :class:`DataError` naming how many and the first qids: the two builds were not
    of the same questions."""
    from memsifter.rewards.columns import sessions_from_column

    def ids(row: Mapping[str, Any]) -> list[str]:
        return [s.id for s in sessions_from_column(row["candidates"])]

    shown = {str(r["qid"]): ids(r) for r in ranked_rows}
    out: dict[str, tuple[int, ...]] = {}
    missing: list[str] = []
    dropped = unranked = 0
    for row in rows:
        qid = str(row["qid"])
        if qid not in rankings or qid not in shown:
            missing.append(qid)
            continue
        at = {sid: i for i, sid in enumerate(ids(row))}
        ranked = [shown[qid][p] for p in rankings[qid]]
        out[qid] = tuple(at[sid] for sid in ranked if sid in at)
        dropped += len(ranked) - len(out[qid])
        unranked += len(set(at) - set(shown[qid]))
    if missing:
        raise DataError(
            f"{len(missing)} question(s) have no ranking to carry (first: {missing[:3]}): the "
            "ranked build is not of the same questions",
        )
    return Carried(out, dropped, unranked)


def score_examples(
    examples: Sequence[Example],
    rankings: Mapping[str, Sequence[int]] | None = None,
    anchor: float = DEFAULT_ANCHOR,
    k: int = DEFAULT_RETRIEVAL_K,
    scale: str = "absolute",
) -> list[Scored]:
    """NDCG@k and priority of each example: from ``rankings`` when it has the qid, else from the
    coarse order. A question without gold in its prompt scores NDCG 0."""
    out = []
    for ex in examples:
        given = rankings.get(ex.qid) if rankings is not None else None
        from_rankings = given is not None
        ranking = ex.coarse_order if given is None else given
        ndcg = retrieval_reward(ranking, ex.gold_positions, k) if ex.gold_positions else 0.0
        score = ndcg
        if scale == "attainable" and ex.gold_positions:
            score = attainable(ndcg, len(ex.coarse_order), ex.gold_positions, k)
        out.append(
            Scored(
                qid=ex.qid,
                source=ex.source,
                ndcg=ndcg,
                priority=round(priority(score, anchor), _PRIORITY_DIGITS),
                scored_by="rankings" if from_rankings else "coarse",
            )
        )
    return out


def histogram(values: Sequence[float], bins: int = 10) -> tuple[list[int], list[float]]:
    """Counts over ``bins`` equal bins of [0, 1] (the last bin includes 1) and the bin edges."""
    counts, edges = np.histogram(np.asarray(values, dtype=float), bins=bins, range=(0.0, 1.0))
    return [int(c) for c in counts], [round(float(e), 6) for e in edges]


def _coarse_top1_gold(ex: Example) -> float:
    return float(bool(ex.coarse_order) and ex.coarse_order[0] in ex.gold_positions)


def _mean(xs: Sequence[float]) -> float | None:
    return float(np.mean(xs)) if xs else None


def select(
    examples: Sequence[Example],
    counts: Mapping[str, int | None],
    config: CurriculumSettings = CurriculumSettings(),
    seed: int = 0,
    rankings: Mapping[str, Sequence[int]] | None = None,
    rankings_file: str | None = None,
) -> tuple[list[int], CurriculumReport]:
    """Pick each source's ``count`` examples; return their indexes (ascending, i.e. in the
    input's order) and the report.

    ``strategy: curriculum`` keeps the highest priorities (ties: seeded hash of the qid);
    ``random`` a seeded uniform sample. A source whose count is ``None`` or at least its pool
    keeps everything. ``rankings`` may hold qids outside ``examples`` (a validation run's file);
    they are counted as ignored."""
    missing = sorted({ex.source for ex in examples} - set(counts))
    if missing:
        raise DataError(f"no count for source(s) {missing}", field="sources.count")
    scored = score_examples(examples, rankings, config.anchor, config.k, config.scale)
    by_source: dict[str, list[int]] = {name: [] for name in counts}
    for i, ex in enumerate(examples):
        if config.require_gold and not ex.gold_positions:
            continue
        by_source[ex.source].append(i)

    chosen: set[int] = set()
    selections: list[SourceSelection] = []
    for name, count in counts.items():
        pool = by_source[name]
        if count is not None and count < 0:
            raise DataError(f"count must be >= 0, got {count}", field=f"sources[{name}].count")
        if count is None or count >= len(pool):
            keep = list(pool)
        elif config.strategy == "random":
            keep = random.Random(f"{seed}:{name}").sample(pool, count)
        else:
            ranked = sorted(
                pool, key=lambda i: (-scored[i].priority, _tiebreak(seed, scored[i].qid))
            )
            keep = ranked[:count]
        chosen.update(keep)
        before = [scored[i].ndcg for i in pool]
        after = [scored[i].ndcg for i in keep]
        top1_before = [_coarse_top1_gold(examples[i]) for i in pool if examples[i].gold_positions]
        top1_after = [_coarse_top1_gold(examples[i]) for i in keep if examples[i].gold_positions]
        selections.append(
            SourceSelection(
                source=name,
                n_pool=len(pool),
                count=count,
                n_selected=len(keep),
                ndcg_mean_before=_mean(before),
                ndcg_mean_after=_mean(after),
                hist_before=histogram(before, config.bins)[0],
                hist_after=histogram(after, config.bins)[0],
                coarse_top1_gold_before=_mean(top1_before),
                coarse_top1_gold_after=_mean(top1_after),
            )
        )

    n_rank = sum(s.scored_by == "rankings" for s in scored)
    n_coarse = len(scored) - n_rank
    pool_qids = {ex.qid for ex in examples}
    ignored = sum(q not in pool_qids for q in rankings) if rankings is not None else 0
    if rankings is None:
        scored_by = "coarse"
        note = (
            "no rankings given: every example is scored with the coarse filter's order of its "
            "prompt (the first round's curriculum)"
        )
    elif n_coarse:
        scored_by = "mixed"
        note = (
            f"{n_coarse} of {len(scored)} examples have no line in the rankings file and are "
            "scored with the coarse order"
        )
    else:
        scored_by = "rankings"
        note = "every example is scored with the given rankings"
    if config.strategy == "random":
        note = f"random sampling (seed {seed}); NDCG shown for reference: " + note
    report = CurriculumReport(
        strategy=config.strategy,
        scored_by=scored_by,
        note=note,
        anchor=config.anchor,
        k=config.k,
        seed=seed,
        bin_edges=histogram([], config.bins)[1],
        sources=selections,
        rankings_file=rankings_file,
        scale=config.scale,
        n_scored_by_rankings=n_rank,
        n_scored_by_coarse=n_coarse,
        n_rankings_ignored=ignored,
        examples=[
            {
                "qid": s.qid,
                "source": s.source,
                "ndcg": s.ndcg,
                "priority": s.priority,
                "scored_by": s.scored_by,
                "selected": i in chosen,
            }
            for i, s in enumerate(scored)
        ],
    )
    return sorted(chosen), report


def plot_report(report: CurriculumReport, path: str | Path) -> Path:
    """Bar chart of the NDCG histogram before and after selection, one panel per source."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(len(report.sources), 1)
    fig, axes = plt.subplots(1, n, figsize=(4.5 * n, 3.4), squeeze=False)
    edges = np.asarray(report.bin_edges)
    centers = (edges[:-1] + edges[1:]) / 2
    width = (edges[1] - edges[0]) * 0.4
    for ax, sel in zip(axes[0], report.sources, strict=False):
        ax.bar(centers - width / 2, sel.hist_before, width, label=f"pool ({sel.n_pool})")
        ax.bar(centers + width / 2, sel.hist_after, width, label=f"selected ({sel.n_selected})")
        ax.axvline(report.anchor, color="black", linestyle="--", linewidth=1, label="τ")
        ax.set_title(sel.source)
        ax.set_xlabel(f"NDCG@{report.k}")
        ax.set_xlim(0, 1)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("questions")
    fig.suptitle(
        f"strategy {report.strategy}, NDCG from {report.scored_by}, τ = {report.anchor}",
        fontsize=10,
    )
    fig.tight_layout()
    p = Path(path)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def write_report(report: CurriculumReport, out_dir: str | Path) -> tuple[Path, Path]:
    """``curriculum.json`` and ``curriculum_ndcg.png`` in ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    js = out / "curriculum.json"
    js.write_text(json.dumps(report.to_dict(), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return js, plot_report(report, out / "curriculum_ndcg.png")
