"""The proxy benchmark on RL data: rankers compared on the very prompts the proxy is trained and
served on (``memsifter eval proxy``).

One split of an RL data folder (``memsifter data rl``: parquet splits, ``prompt_spec.json``,
``split.json``) gives every question's rendered prompt, the coarse filter's order and the gold
prompt positions. Rankers:

* the coarse row (named after ``spec.coarse``, e.g. ``bm25``): the row's ``coarse_order``;
* model rows (``--model NAME=PATH``): the proxy opened by ``Proxy.from_pretrained``, answering
  the row's ``prompt`` greedily (:meth:`~memsifter.ranker.proxy.Proxy.answer`: generated, or
  the first-token head's). What the model ranked is its ranking, with **no
  completion from the coarse order**: a partial answer is scored on what it gave, a failed parse
  ranks nothing and scores 0. A model whose folder carries a ``prompt_spec.json`` must have been
  trained on the data's prompt (every field but ``model``); a model without one (an untrained
  base) is refused unless named in ``explicit_spec``;
* fused rows (``--fuse NAME`` -> ``NAME+bm25``): reciprocal-rank fusion
  (:func:`memsifter.coarse.hybrid.rrf`) of the model's parsed ranking with the coarse order,
  over every candidate (ties keep the coarse order).

Metrics (ir-measures, through :mod:`memsifter.ir_metrics`) are means over the questions
whose prompt shows gold (``gold_in_prompt > 0``); the others cannot score any ranker. Pairs
``A-B`` get paired-bootstrap 95% CIs of the per-question differences A − B.
"""

from __future__ import annotations

import gc
import json
import shlex
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ir_measures
import numpy as np
from ir_measures import RR, R, nDCG

from memsifter.errors import MemSifterError
from memsifter.evaluation.bootstrap import paired_bootstrap
from memsifter.evaluation.breakdown import breakdown, render_breakdown
from memsifter.evaluation.config import N_BOOTSTRAP, ProxyEvalConfig, parse_model_option
from memsifter.evaluation.invariance import check_permutations, invariance
from memsifter.evaluation.proxy_data import EvalData, Question, load_eval_data, read_split_lists
from memsifter.evaluation.proxy_rankers import (
    RRF_K,
    BackendFactory,
    RankerRun,
    check_model_spec,
    coarse_run,
    default_backend_factory,
    fuse_order,
    fused_run,
    invariance_orders,
    model_run,
    saved_run,
)
from memsifter.ir_metrics import qrels_from_gold, rankings_to_run
from memsifter.provenance import code_version
from memsifter.ranker.checkpoint import spec_differences

METRICS: dict[str, Any] = {
    "ndcg@1": nDCG @ 1,
    "ndcg@5": nDCG @ 5,
    "ndcg@10": nDCG @ 10,
    "recall@1": R @ 1,
    "recall@5": R @ 5,
    "mrr": RR,
}
METRIC_NAMES: tuple[str, ...] = tuple(METRICS)
SLICE_METRIC = "ndcg@1"  # the metric the per-category and per-count slices report


# --------------------------------------------------------------------------- metrics


def per_question_metrics(
    rankings: Sequence[Sequence[int]], gold: Sequence[Sequence[int]]
) -> dict[str, np.ndarray]:
    """Every metric for every question (aligned with the inputs); a question whose ranking is
    empty scores 0 everywhere. Positions are the ids."""
    qids = [str(i) for i in range(len(gold))]
    qrels = qrels_from_gold({q: [str(p) for p in g] for q, g in zip(qids, gold, strict=True)})
    run = rankings_to_run({q: [str(p) for p in r] for q, r in zip(qids, rankings, strict=True)})
    by_measure = {m: name for name, m in METRICS.items()}
    out = {name: np.zeros(len(qids)) for name in METRICS}
    for metric in ir_measures.iter_calc(list(METRICS.values()), qrels, run):
        out[by_measure[metric.measure]][int(metric.query_id)] = metric.value
    return out


def ranker_values(run: RankerRun, data: EvalData) -> dict[str, np.ndarray]:
    """Per-question values of every metric, plus ``parse_rate`` (0/1) for model rows."""
    values = per_question_metrics(run.rankings, [q.gold_positions for q in data.questions])
    if run.kind == "model" and run.parsed_ok is not None:
        values["parse_rate"] = np.asarray(run.parsed_ok, dtype=np.float64)
    return values


def summarize(
    run: RankerRun, values: Mapping[str, np.ndarray], order: str | None = None
) -> dict[str, Any]:
    """One ranker's row: metric means, and with ``order`` (the data's shown order) its
    order-invariance (None where the check did not run: a saved run without it)."""
    n = len(run.rankings)
    row: dict[str, Any] = {"n": n}
    for name in METRIC_NAMES:
        row[name] = float(values[name].mean()) if n else 0.0
    row["parse_rate"] = run.parse_rate
    if order is not None:
        row["order"] = order
        row["invariance"] = (
            None
            if run.permuted is None
            else invariance(
                run.permuted_base if run.permuted_base is not None else run.rankings, run.permuted
            )
        )
    if run.kind == "model":
        row["latency_ms_p50"] = float(np.percentile(run.latency_ms, 50)) if run.latency_ms else None
        row["parse_errors"] = dict(Counter(e for e in run.errors or () if e))
        row["ranked_mean"] = float(np.mean([len(r) for r in run.rankings])) if n else 0.0
        row["path"] = run.path
        row["spec"] = run.spec_check
        row["load_seconds"] = run.load_seconds
    return row


def split_pair(pair: str, names: Sequence[str], start: str | None = None) -> tuple[str, str]:
    """``A-B`` with ranker names that may themselves hold ``-``: the one split whose both sides
    are ranker names. ``start`` names the model GRPO began from; ``start`` in a pair means it
    (``trained-start``), so the json's key says what the issue asks while the row is named."""
    if start is not None and start in names and "start" not in names:
        names = [*names, "start"]
    hits = [
        (pair[:i], pair[i + 1 :])
        for i, c in enumerate(pair)
        if c == "-" and pair[:i] in names and pair[i + 1 :] in names
    ]
    if len(hits) != 1:
        why = "no" if not hits else "more than one"
        raise MemSifterError(
            f"--pair {pair!r}: {why} way to read it as A-B with rankers {', '.join(names)}"
        )
    a, b = hits[0]
    alias = {"start": start} if start is not None else {}
    return alias.get(a, a), alias.get(b, b)


# --------------------------------------------------------------------------- the run


@dataclass
class ProxyEvalResult:
    config: ProxyEvalConfig
    data: EvalData
    runs: list[RankerRun]
    rows: dict[str, dict[str, Any]]
    pairs: dict[str, dict[str, dict[str, Any]]]
    machine: str
    command: str
    files: list[Path] = field(default_factory=list)
    # the code that ranked and scored (memsifter.provenance): a report names its version
    code_version: str = field(default_factory=code_version)
    # SLICE_METRIC by category and by candidate count, paired against the coarse row
    slices: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        cfg, data = self.config, self.data
        return {
            "split": data.conversations,
            "n_questions": data.n_questions,
            "n_with_gold_in_prompt": data.n_with_gold_in_prompt,
            "model": cfg.model_name,
            "rankers": self.rows,
            "start": cfg.start,
            "paired_ci95": {
                p: {m: v["ci95"] for m, v in ms.items()} for p, ms in self.pairs.items()
            },
            "paired_mean_diff": {
                p: {m: v["mean"] for m, v in ms.items()} for p, ms in self.pairs.items()
            },
            # What one bootstrap draw resampled: conversations (with all their questions) when
            # the questions name theirs, else the questions themselves.
            "paired_units": {
                p: next((v.get("n_clusters") for v in ms.values()), None)
                for p, ms in self.pairs.items()
            },
            "slices": {"metric": SLICE_METRIC, **self.slices},
            "eval_split": data.split,
            "n_scored": len(data.questions),
            "sample": {"max_questions": cfg.max_questions, "seed": cfg.seed}
            if data.sampled
            else None,
            "data": str(data.folder),
            "prompt_spec": data.spec.to_dict(),
            "bootstrap": {"resamples": cfg.n_bootstrap, "seed": cfg.seed},
            "invariance": {
                "permutations": cfg.permutations,
                "max_questions": cfg.invariance_questions,
                "seed": cfg.seed,
            }
            if cfg.invariance
            else None,
            "machine": self.machine,
            "command": self.command,
            "code_version": self.code_version,
        }


def machine_line() -> str:
    """This machine as every benchmark report describes it (``memsifter.machine``)."""
    from memsifter.machine import machine_facts
    from memsifter.machine import machine_line as render

    return render(machine_facts())


def command_line(cfg: ProxyEvalConfig) -> str:
    """The ``memsifter eval proxy`` command that reproduces ``cfg``."""
    args = ["memsifter", "eval", "proxy", "--data", cfg.data, "--split", cfg.split]
    for name, path in cfg.models:
        args += ["--model", f"{name}={path}"]
    for name, path in cfg.runs:
        args += ["--run", f"{name}={path}"]
    for flag, values in (
        ("--explicit-spec", cfg.explicit_spec),
        ("--fuse", cfg.fuse),
        ("--pair", cfg.pairs),
    ):
        for v in values:
            args += [flag, v]
    if cfg.max_questions is not None:
        args += ["--max-questions", str(cfg.max_questions)]
    args += ["--seed", str(cfg.seed), "--batch-size", str(cfg.batch_size)]
    if not cfg.invariance:
        args.append("--no-invariance")
    else:
        args += ["--permutations", str(cfg.permutations)]
        if cfg.invariance_questions is not None:
            args += ["--invariance-questions", str(cfg.invariance_questions)]
    if cfg.n_bootstrap != N_BOOTSTRAP:
        args += ["--n-bootstrap", str(cfg.n_bootstrap)]
    if cfg.threads is not None:
        args += ["--threads", str(cfg.threads)]
    args += ["--out", cfg.out]
    for flag, value in (
        ("--out-md", cfg.out_md),
        ("--out-json", cfg.out_json),
        ("--model-name", cfg.model_name),
        ("--start", cfg.start),
    ):
        if value is not None:
            args += [flag, value]
    return " ".join(shlex.quote(a) for a in args)


def validate(cfg: ProxyEvalConfig, coarse_name: str) -> list[str]:
    """Ranker names in run order; every name the flags mention must exist."""
    if cfg.invariance:
        check_permutations(cfg.permutations)
        if cfg.invariance_questions is not None and cfg.invariance_questions < 1:
            raise MemSifterError(
                f"--invariance-questions {cfg.invariance_questions}: sample at least 1 question "
                "(--no-invariance skips the check)"
            )
    model_names = [n for n, _ in cfg.models] + [n for n, _ in cfg.runs]
    dup = sorted({n for n in model_names if model_names.count(n) > 1})
    if dup:
        raise MemSifterError(f"--model and --run names must be unique; repeated: {dup}")
    if coarse_name in model_names:
        raise MemSifterError(f"--model name {coarse_name!r} is the coarse row's name")
    for flag, values in (("--explicit-spec", cfg.explicit_spec), ("--fuse", cfg.fuse)):
        known = [n for n, _ in cfg.models] if flag == "--explicit-spec" else model_names
        unknown = [v for v in values if v not in known]
        if unknown:
            raise MemSifterError(
                f"{flag} {', '.join(unknown)}: no --model with that name "
                f"(models: {', '.join(model_names) or 'none'})"
            )
    if cfg.start not in (None, "start") and "start" in model_names:
        raise MemSifterError(
            f"--start {cfg.start!r} with a ranker named 'start': a pair's `start` would mean both"
        )
    names = [coarse_name, *model_names, *(f"{f}+{coarse_name}" for f in dict.fromkeys(cfg.fuse))]
    for pair in cfg.pairs:
        split_pair(pair, names, cfg.start)
    return names


def write_runs(runs: Sequence[RankerRun], data: EvalData, folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for run in runs:
        path = folder / f"{slug(run.name)}.jsonl"
        with path.open("w", encoding="utf-8") as f:
            for i, q in enumerate(data.questions):
                rec = {
                    "qid": q.qid,
                    "ranking": run.rankings[i],
                    "parsed_ok": run.parsed_ok[i] if run.parsed_ok is not None else None,
                    "completion": run.completions[i] if run.completions is not None else None,
                    "latency_ms": run.latency_ms[i] if run.latency_ms is not None else None,
                }
                if run.kind == "model" and run.permuted is not None:
                    rec["permuted"] = [a.to_record() for a in run.permuted[i]]
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        files.append(path)
    return files


def slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.+" else "_" for c in name)


def run_proxy_eval(
    cfg: ProxyEvalConfig,
    console: Any = None,
    backend_factory: BackendFactory | None = None,
) -> ProxyEvalResult:
    """Load the split, check every model's spec (before loading any model), run the rankers,
    score them, bootstrap the pairs, write run files, the markdown report and the json."""
    from memsifter.progress import make_progress

    factory = backend_factory or default_backend_factory
    data = load_eval_data(cfg.data, cfg.split, cfg.max_questions, cfg.seed)
    coarse_name = data.spec.coarse
    names = validate(cfg, coarse_name)
    explicit = set(cfg.explicit_spec)
    checks = {
        name: check_model_spec(name, path, data.spec, data.folder, name in explicit)
        for name, path in cfg.models
    }
    orders = None
    if cfg.invariance:
        orders = invariance_orders(data, cfg.permutations, cfg.seed, cfg.invariance_questions)
        for q, q_orders in zip(data.questions, orders, strict=True):
            if q_orders:
                q.sessions()  # refuses a folder without candidates before any model loads
    runs = [coarse_run(data, orders)]
    with make_progress(console) as progress:
        for name, path in cfg.models:
            t0 = time.perf_counter()
            backend = factory(path, cfg.batch_size, cfg.threads)
            load_s = time.perf_counter() - t0
            run = model_run(name, path, backend, data, cfg.batch_size, progress, orders)
            run.path, run.spec_check, run.load_seconds = path, checks[name], load_s
            runs.append(run)
            del backend
            gc.collect()
    runs += [saved_run(name, path, data) for name, path in cfg.runs]
    by_name = {r.name: r for r in runs}
    for f in dict.fromkeys(cfg.fuse):
        runs.append(fused_run(by_name[f], data, coarse_name))
    assert [r.name for r in runs] == names
    values = {r.name: ranker_values(r, data) for r in runs}
    rows = {r.name: summarize(r, values[r.name], data.spec.order) for r in runs}
    pairs = {}
    # Questions of one conversation share its history: resample conversations, not questions.
    convs = [q.conversation for q in data.questions]
    clusters = convs if all(convs) else None
    for pair in cfg.pairs:
        a, b = split_pair(pair, names, cfg.start)
        pairs[pair] = paired_bootstrap(
            values[a], values[b], cfg.n_bootstrap, cfg.seed, clusters=clusters
        )
    result = ProxyEvalResult(cfg, data, runs, rows, pairs, machine_line(), command_line(cfg))
    result.slices = breakdown(
        data.questions, values, coarse_name, SLICE_METRIC, cfg.n_bootstrap, cfg.seed
    )
    result.files = write_runs(runs, data, Path(cfg.out) / "runs")
    for path, text in (
        (cfg.md_path, render_report(result)),
        (cfg.json_path, json.dumps(result.to_json(), indent=2) + "\n"),
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        result.files.append(path)
    return result


# --------------------------------------------------------------------------- report


def _fmt(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def render_table(rows: Mapping[str, Mapping[str, Any]]) -> str:
    head = ["ranker", "n", *METRIC_NAMES, "parse rate", "p50 ms/question"]
    head += ["top-1 agreement", "constant label"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, m in rows.items():
        cells = [name, str(m["n"]), *(_fmt(m[k]) for k in METRIC_NAMES)]
        cells += [_fmt(m["parse_rate"]), _fmt(m.get("latency_ms_p50"), 0)]
        inv = m.get("invariance")
        cells += [_fmt(inv["top1_agreement"]), _fmt(inv["constant_share"])] if inv else ["–", "–"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# Below this many resampled units a bootstrap interval is the spread of a handful of distinct
# resamples (2 conversations: 3 of them), not a confidence statement.
MIN_UNITS = 10


def resampled_units(units: int, n: int) -> str:
    """What one bootstrap draw resamples: questions, or whole conversations of them."""
    return f"{n} questions" if units == n else f"{units} conversations ({n} questions)"


def bootstrap_note(pairs: Mapping[str, Mapping[str, Mapping[str, Any]]], resamples: int) -> str:
    """How the pairs were resampled, and a warning where too few units make the CI meaningless."""
    units = [v["n_clusters"] for ms in pairs.values() for v in ms.values() if v.get("n_clusters")]
    n = max((v["n"] for ms in pairs.values() for v in ms.values()), default=0)
    if not units:
        return f"{resamples:,} resamples."
    fewest = min(units)
    what = (
        f"{resamples:,} resamples of the {n} questions"
        if fewest == n
        else f"{resamples:,} resamples of the conversations, each drawn with all its questions "
        f"({fewest} conversations, {n} questions)"
    )
    if fewest < MIN_UNITS:
        what += (
            f". With {fewest} resampled units the interval is the spread of a few distinct "
            "resamples, not a 95% confidence statement: read the mean differences, the invariance "
            "and the slices"
        )
    return what + "."


def render_pairs(pairs: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    head = "| pair (A − B) | metric | mean difference | 95% CI | resampled units |"
    lines = [head, "|---|---|---|---|---|"]
    for pair, ms in pairs.items():
        for metric, v in ms.items():
            ci = v["ci95"]
            ci_text = "–" if ci is None else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"
            mean = "–" if v["mean"] is None else f"{v['mean']:+.3f}"
            units = v.get("n_clusters")
            unit_text = "–" if units is None else resampled_units(units, v["n"])
            lines.append(f"| {pair} | {metric} | {mean} | {ci_text} | {unit_text} |")
    return "\n".join(lines) + "\n"


def _conversations_text(lists: Mapping[str, Any], split: str) -> str:
    if not lists:
        return "no split.json"
    if split in lists:
        return ", ".join(f"`{c}`" for c in lists[split]) or "none"
    parts = [
        f"{src}: " + (", ".join(f"`{c}`" for c in v.get(split, [])) or "none")
        for src, v in lists.items()
        if isinstance(v, Mapping)
    ]
    return "; ".join(parts) or "none"


def _invariance_text(result: ProxyEvalResult) -> str:
    cfg, order = result.config, result.data.spec.order
    shown = f"The candidates are shown in `{order}` order."
    if not cfg.invariance:
        return f"{shown} The order-invariance check was skipped (`--no-invariance`)."
    checked = {r["invariance"]["n"] for r in result.rows.values() if r.get("invariance")}
    n = f"n = {max(checked)} questions" if checked else "no question"
    return (
        f"{shown} Order invariance ({cfg.permutations} seeded permutations of the shown order a "
        f"question, {n}; memsifter.evaluation.invariance): *top-1 agreement* is the share of "
        "permuted answers that put the same session first as on the original order (a ranker "
        "answering one fixed permutation: about 1/n); *constant label* is the share of questions "
        "whose first label is the same on every order (that ranker: 1). The coarse row re-ranks "
        "the same candidates in each order; fused rows fuse the permuted answers with the same "
        "coarse order; a saved run without permuted answers shows –."
    )


def render_report(result: ProxyEvalResult) -> str:
    cfg, data, spec = result.config, result.data, result.data.spec
    n = len(data.questions)
    title = cfg.model_name or data.folder.name
    scored = (
        f"a seeded random sample of {n} of them (--max-questions {cfg.max_questions}, "
        f"seed {cfg.seed})"
        if data.sampled
        else f"all {n} of them"
    )
    lines = [
        f"# Proxy eval: {title}, split `{data.split}`",
        "",
        f"- data: `{data.folder}`, split `{data.split}`; conversations: "
        f"{_conversations_text(data.conversations, data.split)}",
        f"- questions: {data.n_questions} in the split, {data.n_with_gold_in_prompt} whose "
        f"prompt shows gold; scored: {scored}",
        f"- prompt spec: model `{spec.model}`, window {spec.window_tokens}, completion "
        f"{spec.completion_tokens} (the generation cap), unit `{spec.unit}`, coarse "
        f"`{spec.coarse}`, order `{spec.order}`, language `{spec.language}`, think "
        f"{spec.ask_think}",
    ]
    if cfg.start:
        lines.append(f"- start: {cfg.start}")
    lines += [
        f"- machine: {result.machine}",
        f"- command: `{result.command}` at code version `{result.code_version}`",
        "",
        "## Metrics",
        "",
        f"Means over the n = {n} scored questions.",
        "",
        render_table(result.rows),
        f"Failed parses score 0: a model row ranks exactly what it parsed, with no completion "
        f"from the coarse order (a failed parse ranks nothing). Parse rate is over the same "
        f"questions. `NAME+{spec.coarse}` rows fuse the model's parsed ranking with the "
        f"`{spec.coarse}` order by reciprocal-rank fusion (k = {RRF_K:g}) over all candidates. "
        "Latency: greedy generation, wall time per call shared by its "
        f"{cfg.batch_size} prompts.",
        "",
        _invariance_text(result),
        "",
    ]
    models = [r for r in result.runs if r.kind == "model"]
    if models:
        lines += ["| model | path | spec | load s | parse errors |", "|---|---|---|---|---|"]
        for r in models:
            row = result.rows[r.name]
            errs = ", ".join(f"{k}: {v}" for k, v in sorted(row["parse_errors"].items())) or "–"
            lines.append(
                f"| {r.name} | `{r.path}` | {r.spec_check} | {_fmt(r.load_seconds, 1)} | {errs} |"
            )
        lines.append("")
    if len(result.runs) > 1:
        lines += [
            "## Where it wins and loses",
            "",
            f"Each slice's questions paired against `{spec.coarse}` on the same candidates "
            f"({cfg.n_bootstrap:,} resamples of the slice's conversations; seed {cfg.seed}).",
            "",
            render_breakdown(result.slices, spec.coarse, SLICE_METRIC),
        ]
    if result.pairs:
        lines += [
            "## Paired bootstrap",
            "",
            "95% CIs of the mean per-question difference A − B (numpy percentiles 2.5 / 97.5, "
            f"seed {cfg.seed}): {bootstrap_note(result.pairs, cfg.n_bootstrap)}",
            "",
            render_pairs(result.pairs),
        ]
    return "\n".join(lines)


__all__ = [
    "METRIC_NAMES",
    "EvalData",
    "ProxyEvalConfig",
    "ProxyEvalResult",
    "Question",
    "RankerRun",
    "check_model_spec",
    "coarse_run",
    "command_line",
    "fuse_order",
    "fused_run",
    "load_eval_data",
    "model_run",
    "paired_bootstrap",
    "parse_model_option",
    "per_question_metrics",
    "read_split_lists",
    "render_report",
    "render_table",
    "run_proxy_eval",
    "saved_run",
    "spec_differences",
    "split_pair",
    "summarize",
]
