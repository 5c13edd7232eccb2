"""Cost of each coarse filter at 32K / 128K / 1M-token haystacks: index time, per-query latency
and peak memory, with raw ``bm25s`` measured on the same corpus in the same run.

Why: the coarse filter runs in front of the proxy on every request, on CPU boxes like this one,
so we need to know what each filter costs as the history grows, and whether our BM25 path (own
analyzer, index cache, ``Ranking`` output) stays within 1.2x of calling ``bm25s`` directly.

How it measures (also written into the report header):

* Each (filter, size) cell runs in its own spawned process, so RSS high-water marks do not bleed
  between cells. The process loads the data, builds the filter (model load, timed separately),
  warms it up on a one-session dummy haystack, records its RSS, resets the kernel's high-water
  mark (``/proc/self/clear_refs``), then indexes the haystack (nothing of it cached yet) and runs
  the queries. Peak RSS is the high-water mark over index + queries.
* Cheap cells run several times, round-robin, in fresh processes and report medians: the box is
  shared, and a sub-second timing otherwise measures the neighbours. The bm25 / raw bm25s ratio
  is the median of ratios of runs made back to back.
* Haystacks: up to the pool size, ``HaystackBuilder`` (the eval's own padding); beyond it (LoCoMo
  has ~210K approx tokens in all), copies of the pool's sessions with new ids and a ``(copy n)``
  date suffix, so every session has distinct content and no content-keyed cache can skip work.
  BM25 IDF over near-duplicates is odd; that is irrelevant to timing.
* Cells whose index time, extrapolated from a small probe sample, exceeds ``--max-index-seconds``
  are skipped and marked so in the table.
"""

from __future__ import annotations

import gc
import json
import multiprocessing as mp
import os
import random
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from eval.common import command_line, git_dirty, git_head, machine, machine_line
from memsifter.data import MemoryDataset, Ranking, Session, Turn, load_locomo
from memsifter.data.haystack import HaystackBuilder, parse_budget
from memsifter.data.locations import locomo_file
from memsifter.data.tokens import SessionTokenCache, get_counter

ROOT = Path(__file__).resolve().parents[2]
REAL_LOCOMO = locomo_file()
FIXTURE = ROOT / "data" / "fixtures" / "locomo_mini.json"
DEFAULT_FILTERS = "bm25,raw-bm25s,minilm,wordllama,hybrid:bm25+minilm"
RAW = "raw-bm25s"
RAW_DESC = (
    "`bm25s.tokenize(q, stopwords='en', stemmer=PyStemmer english)` + "
    "`BM25().retrieve(q, k=len(corpus))`: full scoring of every session plus a full sort, "
    "returning doc indices; index = `bm25s.tokenize(texts, ...)` + `BM25().index(...)` on "
    "pre-rendered texts"
)
MAX_PASSES = 20
DUMMY = Session("bench/warmup", (Turn("a", "warm up the filter before timing"),), date_text="x")

app = typer.Typer(add_completion=False)


# ----------------------------------------------------------------------------------------------
# data


def build_haystack(dataset: MemoryDataset, budget: int, seed: int) -> tuple[list[Session], int]:
    """Sessions of about ``budget`` approx tokens, and their exact count (deterministic)."""
    counter = get_counter()
    anchor = random.Random(seed).choice(dataset.queries)
    query, stats = HaystackBuilder(dataset, counter, seed=seed).build(anchor, budget)
    sessions, used = list(query.haystack), stats.tokens
    if stats.filled:
        return sessions, used
    tokens = SessionTokenCache(counter)
    pool = list(dataset.sessions.values())
    random.Random(seed).shuffle(pool)
    copy = 1
    while used < budget:
        added = False
        for s in pool:
            c = replace(
                s, id=f"{s.id}#copy{copy}", date_text=f"{s.date_text or ''} (copy {copy})".strip()
            )
            n = tokens(c)
            if used + n <= budget:
                sessions.append(c)
                used += n
                added = True
        if not added:
            break
        copy += 1
    return sessions, used


def pick_questions(dataset: MemoryDataset, n: int, seed: int) -> list[str]:
    questions = [q.question for q in dataset.queries]
    rng = random.Random(seed)
    return rng.sample(questions, n) if n <= len(questions) else rng.choices(questions, k=n)


# ----------------------------------------------------------------------------------------------
# filters


class RawBM25s:
    """Plain ``bm25s`` as its README uses it, behind the ``index``/``score`` shape of ours."""

    name = RAW

    def __init__(self) -> None:
        import bm25s
        import Stemmer

        self._bm25s = bm25s
        self._stemmer = Stemmer.Stemmer("english")
        self._pre: tuple[Sequence[Session], list[str]] | None = None
        self._retriever: Any = None
        self._n = 0

    def prepare(self, sessions: Sequence[Session]) -> None:
        # The raw baseline starts from text; rendering sessions is our API's cost, not bm25s'.
        self._pre = (sessions, [s.render() for s in sessions])

    def index(self, sessions: Sequence[Session]) -> None:
        pre = self._pre
        texts = pre[1] if pre and pre[0] is sessions else [s.render() for s in sessions]
        tokens = self._bm25s.tokenize(
            texts, stopwords="en", stemmer=self._stemmer, show_progress=False
        )
        self._retriever = self._bm25s.BM25()
        self._retriever.index(tokens, show_progress=False)
        self._n = len(texts)

    def score(self, query: str, sessions: Sequence[Session]) -> Any:
        q = self._bm25s.tokenize(query, stopwords="en", stemmer=self._stemmer, show_progress=False)
        return self._retriever.retrieve(q, k=self._n, show_progress=False)


def make_filter(spec: str) -> Any:
    if spec == RAW:
        return RawBM25s()
    from memsifter.coarse import build_filter

    return build_filter(spec)


# ----------------------------------------------------------------------------------------------
# one cell, in its own process


def _proc_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _cpu_wait_us() -> int | None:
    """Cumulative time some task waited for a CPU (Linux PSI). Our own threads never exceed the
    cores, so waiting during a cell means other jobs were competing for the CPUs."""
    try:
        some = Path("/proc/pressure/cpu").read_text().splitlines()[0]
        return int(some.rsplit("total=", 1)[1])
    except (OSError, IndexError, ValueError):
        return None


def _cpu_wait_pct(since_us: int | None, since_s: float) -> float | None:
    now = _cpu_wait_us()
    if now is None or since_us is None:
        return None
    return 100 * (now - since_us) / 1e6 / (time.perf_counter() - since_s)


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # 5 = reset the RSS high-water mark
        return True
    except OSError:
        return False


@dataclass(frozen=True)
class Cell:
    spec: str
    size: str
    data: str
    seed: int
    queries: int
    threads: int
    min_query_seconds: float = 0.0
    probe: int = 0  # >0: only time indexing this many sampled sessions (index-time estimate)


def run_cell(cell: Cell) -> dict[str, Any]:
    dataset = load_locomo(cell.data)
    haystack, tokens = build_haystack(dataset, parse_budget(cell.size) or 0, cell.seed)
    if cell.probe:
        haystack = random.Random(cell.seed).sample(haystack, min(cell.probe, len(haystack)))
    questions = pick_questions(dataset, cell.queries, cell.seed)

    t0 = time.perf_counter()
    filt = make_filter(cell.spec)
    torch_threads = None
    if "torch" in sys.modules:
        import torch

        torch.set_num_threads(cell.threads)
        torch_threads = torch.get_num_threads()
    # One-time lazy setup (first forward pass, scipy/jieba imports) belongs to load, not index.
    filt.index([DUMMY])
    filt.score("warm up", [DUMMY])
    load_s = time.perf_counter() - t0
    # Only the dummy is cached now: the haystack is indexed from cold below.
    if cell.spec == RAW:
        filt.prepare(haystack)
    gc.collect()
    base_kib = _proc_kib("VmRSS")
    hwm_reset = _reset_peak()

    w0, start = _cpu_wait_us(), time.perf_counter()
    c0, t0 = time.process_time(), time.perf_counter()
    filt.index(haystack)
    index_s = time.perf_counter() - t0
    index_cpu_s = time.process_time() - c0
    if cell.probe:
        return {
            "cpu_wait_pct": _cpu_wait_pct(w0, start),
            "spec": cell.spec,
            "probe_sessions": len(haystack),
            "probe_index_s": index_s,
            "load_s": load_s,
        }

    # Sub-millisecond filters get the question list repeated, so their percentiles span at least
    # min_query_seconds rather than a 50 ms window that one burst from another job can skew.
    lat: list[float] = []
    first: Any = None
    for _ in range(MAX_PASSES):
        for q in questions:
            t0 = time.perf_counter()
            out = filt.score(q, haystack)
            lat.append(time.perf_counter() - t0)
            first = first if first is not None else out
        if sum(lat) >= cell.min_query_seconds:
            break
    if isinstance(first, Ranking):  # score() must rank every session, or the timing is moot
        assert len(first) == len(haystack)
    ms = np.asarray(lat) * 1e3
    peak_kib = _proc_kib("VmHWM")
    return {
        "cpu_wait_pct": _cpu_wait_pct(w0, start),
        "spec": cell.spec,
        "size": cell.size,
        "sessions": len(haystack),
        "tokens": tokens,
        "load_s": load_s,
        "index_s": index_s,
        "index_cpu_s": index_cpu_s,
        "queries": len(questions),
        "query_calls": len(lat),
        "p50_ms": float(np.percentile(ms, 50)),
        "p95_ms": float(np.percentile(ms, 95)),
        "mean_ms": float(ms.mean()),
        "base_rss_mib": base_kib / 1024,
        "peak_rss_mib": peak_kib / 1024,
        "delta_rss_mib": (peak_kib - base_kib) / 1024,
        "hwm_reset": hwm_reset,
        "torch_threads": torch_threads,
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
    }


def in_subprocess(cell: Cell) -> dict[str, Any]:
    with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as ex:
        try:
            return ex.submit(run_cell, cell).result()
        except BrokenProcessPool as e:  # killed (e.g. out of memory): report, keep going
            return {"spec": cell.spec, "size": cell.size, "error": f"process died: {e}"}


def run_all(cells: list[Cell], repeats: dict[Cell, int]) -> dict[Cell, list[dict[str, Any]]]:
    """Runs of every cell, round-robin: repeat k of all cells before repeat k+1, so cells next
    to each other in ``cells`` (bm25 and raw bm25s of one size) see the same neighbours' load."""
    runs: dict[Cell, list[dict[str, Any]]] = {c: [] for c in cells}
    for k in range(max(repeats.values(), default=0)):
        for c in cells:
            if k < repeats[c]:
                typer.echo(f"running {c.spec} @ {c.size} ({k + 1}/{repeats[c]}) ...")
                runs[c].append(in_subprocess(c))
    return runs


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median timings, max memory over fresh-process runs: on a shared 2-core box a single
    sub-second index time says more about the neighbours than about the filter."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0]
    out = dict(ok[0])
    for k in ("load_s", "index_s", "index_cpu_s", "p50_ms", "p95_ms", "mean_ms"):
        out[k] = statistics.median(r[k] for r in ok)
    for k in ("base_rss_mib", "peak_rss_mib", "delta_rss_mib"):
        out[k] = max(r[k] for r in ok)
    waits = [r["cpu_wait_pct"] for r in ok if r.get("cpu_wait_pct") is not None]
    out["cpu_wait_pct"] = statistics.median(waits) if waits else None
    out["repeats"] = len(ok)
    if len(runs) > 1:
        out["runs"] = runs
    return out


# ----------------------------------------------------------------------------------------------
# report


def machine_info(threads: int) -> dict[str, Any]:
    """``eval.common.machine()`` plus what this benchmark adds: package versions, torch threads,
    the date and the git revision."""
    versions = {}
    for pkg in ("torch", "bm25s", "numpy", "PyStemmer", "sentence-transformers", "wordllama"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = "not installed"
    return {
        **machine(),
        "versions": versions,
        "torch_set_num_threads": threads,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "git": _git(),
    }


def _git() -> str:
    head = git_head()
    return head + (" (uncommitted changes)" if head != "unknown" and git_dirty() else "")


def exact_command() -> str:
    cmd = command_line()
    # Heavy runs on this shared box go through flock; keep that visible in the report.
    parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\0")
    if parent and Path(parent[0].decode()).name == "flock":
        cmd = shlex.join([p.decode() for p in parent if p][:2]) + " " + cmd
    return cmd


def _num(x: float) -> str:
    return f"{x:.3f}" if x < 10 else f"{x:.1f}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0f}"


def _cell_row(r: dict[str, Any]) -> str:
    head = f"| {r['spec']} | {r['size']} | {r.get('sessions', '')} | {r.get('tokens', '')} "
    if "error" in r:
        return head + f"| {r['error']} |" + " |" * 9
    if r.get("skipped"):
        return head + f"| skipped (est. {r['est_index_s'] / 60:.1f} min) |" + " |" * 9
    return head + (
        f"| {r['load_s']:.2f} | {_num(r['index_s'])} | {_num(r['p50_ms'])} "
        f"| {_num(r['p95_ms'])} | {r['base_rss_mib']:.0f} | {r['peak_rss_mib']:.0f} "
        f"| {r['delta_rss_mib']:+.0f} | {r.get('est_index_s', float('nan')):.1f} "
        f"| {r.get('repeats', 1)} | {_pct(r.get('cpu_wait_pct'))} |"
    )


def ratios(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """bm25 / raw bm25s per size: the median of the ratios of runs made back to back (robust to
    load that comes and goes), and the ratio of the medians for reference."""
    done = {(c["spec"], c["size"]): c for c in cells if "index_s" in c}
    out = []
    for (spec, size), ours in done.items():
        raw = done.get((RAW, size))
        if spec != "bm25" or raw is None:
            continue
        pairs = [
            (a, b)
            for a, b in zip(ours.get("runs", [ours]), raw.get("runs", [raw]), strict=False)
            if "error" not in a and "error" not in b
        ]
        keys = ("index_s", "p50_ms", "p95_ms")
        out.append(
            {
                "size": size,
                **{k: statistics.median(a[k] / b[k] for a, b in pairs) for k in keys},
                "ratio_of_medians": {k: ours[k] / raw[k] for k in keys},
                "pairs": len(pairs),
                "raw_p50_ms": raw["p50_ms"],
                "ours_p50_ms": ours["p50_ms"],
            }
        )
    return out


def _ratio(r: dict[str, Any], key: str) -> str:
    return f"{r[key]:.2f}x ({r['ratio_of_medians'][key]:.2f}x)"


def render_markdown(report: dict[str, Any]) -> str:
    m, cfg = report["machine"], report["config"]
    v = m["versions"]
    lines = [
        "# Coarse-filter cost benchmark",
        "",
        f"- Command: `{report['command']}`",
        f"- Date: {m['date']}; git {m['git']}",
        f"- Machine: {machine_line(m, threads=False)}; Python {m['python']}",
        f"- Versions: torch {v['torch']}, bm25s {v['bm25s']}, numpy {v['numpy']}, PyStemmer "
        f"{v['PyStemmer']}, sentence-transformers {v['sentence-transformers']}, wordllama "
        f"{v['wordllama']}",
        f"- Threads: OMP_NUM_THREADS={m['omp_num_threads']}, "
        f"torch.set_num_threads({m['torch_set_num_threads']}) in cells that load torch "
        f"(torch.get_num_threads() there: {m.get('torch_threads_seen') or 'n/a'})",
        "- Filters as `build_filter(spec)` makes them: the dense ones (minilm, wordllama) embed "
        "~160-approx-token passages of each session and score its best one (MaxP), so their "
        "index cost grows with tokens, not sessions.",
        f"- Load average (1/5/15 min) at start {' '.join(map(str, m['loadavg_1_5_15']))}, at end "
        f"{' '.join(report['loadavg_end'])} (other jobs share this box; heavy runs are "
        "serialised with flock)",
        f"- Corpus: `{cfg['data']}` ({cfg['pool_sessions']} sessions, {cfg['pool_tokens']} approx "
        "tokens). Sizes up to the pool use `HaystackBuilder` (seeded); larger ones add copies of "
        "pool sessions with new ids and a `(copy n)` date suffix, so content is distinct but "
        "near-duplicate: **BM25 IDF is odd on them; fine for timing, meaningless for quality**.",
        f"- Queries: {cfg['queries']} LoCoMo questions, seeded sample (seed {cfg['seed']}), "
        "same for every cell; latency is one `score(query, haystack)` call on the already "
        "indexed haystack (ranks every session); the list is repeated (≤20 passes) until "
        f"{cfg['min_query_seconds']:g} s of calls are timed.",
        f"- Raw baseline `{RAW}`: {RAW_DESC}. Ours (`bm25`) additionally renders and "
        "content-hashes sessions at index time and returns a full `Ranking` (ids + scores).",
        "- Load = filter construction incl. model load + warm-up on a one-session dummy; "
        "index = `index(haystack)` on that fresh instance (excluded: load). RSS: base = after "
        "imports, data, model load; peak = high-water mark over index + queries (reset after "
        "base); each cell in its own spawned process.",
        f"- Est. index = extrapolated from indexing {cfg['probe_sessions']} sampled sessions; "
        f"cells estimated over {cfg['max_index_seconds']:.0f} s are skipped; cells estimated "
        f"under {cfg['repeat_below_seconds']:g} s run {cfg['repeats']}x in fresh processes "
        "(runs): median times, max RSS.",
        "- CPU wait % = share of the timed part (index + queries) during which some task waited "
        "for a CPU (Linux PSI `/proc/pressure/cpu`). A cell never runs more threads than cores, "
        "so a high value means other jobs competed and that row's times are inflated.",
        "",
        "| filter | size | sessions | tokens | load s | index s | p50 ms | p95 ms | base RSS MiB "
        "| peak RSS MiB | Δ MiB | est. index s | runs | CPU wait % |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
        *(_cell_row(r) for r in report["cells"]),
        "",
    ]
    if report["ratios"]:
        target = cfg["target_ratio"]
        lines += [
            f"## bm25 (ours) / {RAW} (target ≤ {target}x)",
            "",
            "Median over the runs of the ratio of two runs made back to back (cells run "
            "round-robin); in brackets the ratio of the medians in the table above.",
            "",
            "| size | runs | index | p50 | p95 | ours p50 ms | raw p50 ms |",
            "|---|--:|--:|--:|--:|--:|--:|",
            *(
                f"| {r['size']} | {r['pairs']} | {_ratio(r, 'index_s')} | {_ratio(r, 'p50_ms')} "
                f"| {_ratio(r, 'p95_ms')} | {r['ours_p50_ms']:.3f} | {r['raw_p50_ms']:.3f} |"
                for r in report["ratios"]
            ),
            "",
        ]
    lines.append(f"Total wall time: {report['wall_s'] / 60:.1f} min.")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# CLI


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


@app.command()
def main(
    data: Annotated[
        Path | None,
        typer.Option(
            help="LoCoMo JSON; default: the real one under /work/shared if present, else the "
            "committed fixture"
        ),
    ] = None,
    filters: Annotated[str, typer.Option(help="comma-separated filter specs")] = DEFAULT_FILTERS,
    sizes: Annotated[str, typer.Option(help="comma-separated haystack sizes")] = "32k,128k,1m",
    queries: Annotated[int, typer.Option(help="queries per cell")] = 200,
    seed: int = 0,
    threads: Annotated[int, typer.Option(help="OMP_NUM_THREADS and torch threads")] = 2,
    max_index_seconds: Annotated[
        float, typer.Option(help="skip cells whose estimated index time exceeds this")
    ] = 360.0,
    probe_sessions: Annotated[
        int,
        typer.Option(help="sessions indexed to estimate index time (0: no estimate, never skip)"),
    ] = 32,
    repeats: Annotated[
        int, typer.Option(help="fresh-process repeats (median) of cells cheaper than below")
    ] = 5,
    repeat_below_seconds: Annotated[
        float, typer.Option(help="repeat only cells whose estimated index time is under this")
    ] = 10.0,
    min_query_seconds: Annotated[
        float, typer.Option(help="repeat the question list until this much is timed (≤20x)")
    ] = 1.0,
    target_ratio: float = 1.2,
    out: Annotated[Path, typer.Option(help="report path; .md and .json are written")] = (
        ROOT / "eval" / "results" / "bench_coarse" / "bench_coarse"
    ),
) -> None:
    """Benchmark index time, query latency and peak RSS of coarse filters."""
    started = time.perf_counter()
    # Spawned cells inherit this; it must be set before any of them imports torch or numpy.
    os.environ["OMP_NUM_THREADS"] = str(threads)
    data_path = data or (REAL_LOCOMO if REAL_LOCOMO.exists() else FIXTURE)
    specs, size_names = _csv(filters), _csv(sizes)
    facts = machine_info(threads)
    command = exact_command()

    dataset = load_locomo(data_path)
    pool_tokens = SessionTokenCache(get_counter())
    plan = {s: build_haystack(dataset, parse_budget(s) or 0, seed) for s in size_names}
    largest = max(size_names, key=lambda s: len(plan[s][0]))
    typer.echo(
        f"data {data_path}: "
        + ", ".join(f"{s} = {len(h)} sessions / {t} tokens" for s, (h, t) in plan.items())
    )

    per_session: dict[str, float] = {}
    if probe_sessions > 0:
        for spec in specs:
            r = in_subprocess(
                Cell(spec, largest, str(data_path), seed, 1, threads, probe=probe_sessions)
            )
            if "probe_index_s" in r:
                per_session[spec] = r["probe_index_s"] / r["probe_sessions"]
                typer.echo(
                    f"probe {spec}: {per_session[spec] * 1e3:.1f} ms/session "
                    f"(load {r['load_s']:.1f} s, CPU wait {_pct(r['cpu_wait_pct'])} %)"
                )

    def estimate(spec: str, size: str) -> float | None:
        return per_session[spec] * len(plan[size][0]) if spec in per_session else None

    def runs_of(est: float | None) -> int:
        return repeats if est is not None and est <= repeat_below_seconds else 1

    if per_session:
        total = sum(
            e * runs_of(e)
            for sp in specs
            for sz in size_names
            if (e := estimate(sp, sz)) is not None and e <= max_index_seconds
        )
        typer.echo(f"estimated total index time of the cells that run: {total / 60:.1f} min")

    todo = {
        (spec, size): Cell(spec, size, str(data_path), seed, queries, threads, min_query_seconds)
        for size in size_names
        for spec in specs
        if (est := estimate(spec, size)) is None or est <= max_index_seconds
    }
    repeats_of = {c: runs_of(estimate(c.spec, c.size)) for c in todo.values()}
    runs = run_all(list(todo.values()), repeats_of)
    cells: list[dict[str, Any]] = []
    for spec in specs:
        for size in size_names:
            est = estimate(spec, size)
            base = {"spec": spec, "size": size, "sessions": len(plan[size][0])}
            base["tokens"] = plan[size][1]
            if (spec, size) in todo:
                r = {**base, **summarise(runs[todo[(spec, size)]])}
            else:
                r = {**base, "skipped": True}
            if est is not None:
                r["est_index_s"] = est
            cells.append(r)

    report = {
        "command": command,
        "machine": facts,
        "config": {
            "data": str(data_path),
            "filters": specs,
            "sizes": size_names,
            "queries": queries,
            "seed": seed,
            "threads": threads,
            "max_index_seconds": max_index_seconds,
            "probe_sessions": probe_sessions,
            "repeats": repeats,
            "repeat_below_seconds": repeat_below_seconds,
            "min_query_seconds": min_query_seconds,
            "target_ratio": target_ratio,
            "raw_baseline": RAW_DESC,
            "pool_sessions": len(dataset.sessions),
            "pool_tokens": sum(pool_tokens(s) for s in dataset.sessions.values()),
        },
        "cells": cells,
        "ratios": ratios(cells),
        "est_index_s_per_session": per_session,
        "loadavg_end": Path("/proc/loadavg").read_text().split()[:3],
        "wall_s": time.perf_counter() - started,
    }
    torch_threads = {c.get("torch_threads") for c in cells} - {None}
    report["machine"]["torch_threads_seen"] = sorted(torch_threads)
    md = render_markdown(report)
    out.with_suffix(".md").write_text(md, encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    typer.echo("\n" + md)
    for r in report["ratios"]:
        worst = max(r["index_s"], r["p50_ms"], r["p95_ms"])
        if worst > target_ratio:
            typer.echo(
                f"bm25 @ {r['size']}: {worst:.2f}x raw bm25s, over the {target_ratio}x target",
                err=True,
            )


if __name__ == "__main__":
    app()
