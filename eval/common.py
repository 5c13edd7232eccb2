"""What the scripts in ``eval/`` share: the machine they ran on (``machine()`` for the
report's JSON, ``machine_line()`` for its text), how a run was started, latency statistics and
the per-run JSON a report keeps; and, for the recall-service benchmarks, starting ``memsifter
serve`` as a subprocess on a throwaway config and database, and synthetic chat sessions.

Every script runs as a module from the repository root (``python -m eval.bench.bench_load``), so
the repository root is on ``sys.path`` and this module is ``eval.common``: no script edits
``sys.path`` and none imports another's private names. Each writes under ``results(name)``.

The server always runs as its own process (never in-process), so that a benchmark measures the
HTTP stack a deployment runs and the durability check can ``kill -9`` it for real.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from memsifter.machine import machine_facts
from memsifter.machine import machine_line as machine_line  # re-exported: one rendered line
from memsifter.provenance import (
    git_dirty as git_dirty,
)  # re-exported: one home for the code version
from memsifter.provenance import git_head as git_head

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "eval" / "results"
DEFAULT_PG_DSN = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
KEY_ENV = "MEMSIFTER_BENCH_KEY"
TENANT = "bench"


def results(name: str) -> Path:
    """``eval/results/<name>/``, made if missing: every output of the benchmark or probe
    ``name`` lives there (history lives in git, not in file names)."""
    folder = RESULTS / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def rl_data(recipe: str, out: str) -> Path:
    """The RL data folder ``out`` (relative to the repository root), built by ``memsifter data
    rl --recipe recipe`` when it is not there yet."""
    folder = REPO / out
    if not (folder / "prompt_spec.json").is_file():
        subprocess.run(
            [sys.executable, "-m", "memsifter.cli", "data", "rl", "--recipe", recipe,
             "--out", str(folder)],
            cwd=REPO, check=True,
        )  # fmt: skip
    return folder


def split_rows(folder: Path, split: str) -> list[dict[str, Any]]:
    """An RL data folder's ``split`` (train, validation, test) as row dicts, in file order."""
    from datasets import load_dataset

    path = str(folder / f"{split}.parquet")
    return [dict(r) for r in load_dataset("parquet", data_files=path, split="train")]


# ---------------------------------------------------------------------------------- the machine


def cpu_seconds(pid: int) -> float:
    """A process's CPU time so far, user + system, all threads."""
    import psutil  # the dev extra

    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def process_tree(pid: int) -> list[int]:
    """``pid`` and its live descendants (a multi-worker server's workers)."""
    import psutil

    return [pid] + [child.pid for child in psutil.Process(pid).children(recursive=True)]


def tree_cpu_seconds(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        try:
            total += cpu_seconds(pid)
        except psutil.NoSuchProcess:  # a worker that exited meanwhile
            pass
    return total


def machine_busy_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, every core: differences over
    an interval say how saturated the cores were."""
    import psutil

    times = psutil.cpu_times()
    total = sum(times)
    idle = times.idle + getattr(times, "iowait", 0.0)
    # guest time is already inside user and nice on Linux
    total -= getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
    return total - idle, total


def machine() -> dict[str, Any]:
    """The machine facts every benchmark records in its JSON (``memsifter.machine``): CPU,
    cores, memory, GPUs, Python, and the load average, nice level and ``OMP_NUM_THREADS`` when
    the run started. Take them at the start of a run; ``machine_line`` renders them."""
    return machine_facts()


def utc_now_text() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def command_line() -> str:
    """How this run was started: ``python -m eval.<kind>.<name> …`` for a script of this
    package, else the script's path (relative to the repository root when possible)."""
    script = Path(sys.argv[0]).resolve()
    try:
        rel = script.relative_to(REPO)
    except ValueError:
        return " ".join(["python", str(script), *sys.argv[1:]])
    if rel.parts[0] == "eval" and rel.suffix == ".py":
        return " ".join(["python", "-m", ".".join(rel.with_suffix("").parts), *sys.argv[1:]])
    return " ".join(["python", str(rel), *sys.argv[1:]])


# ------------------------------------------------------------------------------------ statistics


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default), on pre-sorted data."""
    if not sorted_values:
        return None
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(values_ms: list[float]) -> dict[str, float | int | None]:
    ordered = sorted(values_ms)

    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 2)

    return {
        "n": len(ordered),
        "p50_ms": r(percentile(ordered, 50)),
        "p95_ms": r(percentile(ordered, 95)),
        "p99_ms": r(percentile(ordered, 99)),
        "max_ms": r(ordered[-1] if ordered else None),
        "mean_ms": r(sum(ordered) / len(ordered) if ordered else None),
    }


def update_runs(json_path: Path, key: str, result: dict[str, Any]) -> dict[str, Any]:
    """Store ``result`` as run ``key`` in the report's JSON, keeping the other runs (a report
    holds one section per database or ranker); returns every run."""
    runs: dict[str, Any] = {}
    if json_path.exists():
        try:
            runs = json.loads(json_path.read_text()).get("runs", {})
        except (ValueError, AttributeError):
            runs = {}
    runs[key] = result
    json_path.write_text(json.dumps({"runs": runs}, indent=2, sort_keys=True) + "\n")
    return runs


def run_header(result: dict[str, Any], note: str = "") -> list[str]:
    """A report's first lines after its title: when, on what, how loaded, by which command."""
    load = ", ".join(str(x) for x in result["loadavg_end"])
    return [
        f"Date: {result['date']}. Machine: {machine_line(result['machine'], run=True)}. Load "
        f"average at the end: {load}.{' ' + note if note else ''}",
        "",
        f"Command: `{result['command']}`",
        "",
    ]


def write_report_files(out: Path, lines: list[str], result: dict[str, Any]) -> None:
    """The report as ``out`` (markdown) and its data beside it (``.json``); printed too."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join(lines))


def fmt_ms(x: float | int | None) -> str:
    return "–" if x is None else f"{x:.1f}"


# ------------------------------------------------------------------------------------ databases


@dataclass
class Database:
    """A database a run owns: a file under its temp dir, or a fresh PostgreSQL database."""

    kind: str  # sqlite | postgres
    url: str
    drop: Any = None  # callable that removes it, or None

    def cleanup(self) -> None:
        if self.drop is not None:
            self.drop()


def create_database(kind: str, workdir: Path, pg_dsn: str = DEFAULT_PG_DSN) -> Database:
    if kind == "sqlite":
        return Database("sqlite", f"sqlite:///{workdir / 'bench.db'}")
    if kind != "postgres":
        raise ValueError(f"--db must be sqlite or postgres, not {kind!r}")
    from memsifter.testing.postgres import scratch_postgres

    # A database of its own, so the run neither sees nor clobbers the test suite's tables.
    url, drop = scratch_postgres(pg_dsn, "memsifter_bench")
    return Database("postgres", url, drop)


# ---------------------------------------------------------------------------------------- server


@dataclass
class ProxyOptions:
    backend: str | None = None  # None: no model (ranker: coarse) | transformers | openai
    model: str = "smollm2-135m-instruct"
    base_url: str | None = None
    served_model_name: str | None = None
    max_concurrency: int = 1
    max_candidates: int = 40
    window_tokens: int = 8192
    completion_tokens: int = 1024
    timeout_s: float = 120.0


def write_config(path: Path, db_url: str, proxy: ProxyOptions | None = None) -> None:
    """A minimal serve config; everything not named keeps ``ServeConfig``'s defaults. The
    sweeper is off: a background writer would only add noise to the numbers."""
    proxy = proxy or ProxyOptions()
    lines = [
        f"db_url: {db_url}",
        "coarse: bm25",
        f"ranker: {'coarse' if proxy.backend is None else 'proxy'}",
        "proxy:",
        f"  backend: {proxy.backend or 'transformers'}",
        f"  model: {proxy.model}",
        f"  base_url: {proxy.base_url or 'null'}",
        f"  served_model_name: {proxy.served_model_name or 'null'}",
        f"  max_concurrency: {proxy.max_concurrency}",
        f"  max_candidates: {proxy.max_candidates}",
        f"  timeout_s: {proxy.timeout_s}",
        "  prompt:",  # the proxy's PromptSpec (a model with its own may only repeat it)
        f"    window_tokens: {proxy.window_tokens}",
        f"    completion_tokens: {proxy.completion_tokens}",
        "facts:",
        "  sweep_interval_s: 0",
        "api_keys:",
        f"  - tenant: {TENANT}",
        f"    key_env: {KEY_ENV}",
        "index_cache_users: 256",
    ]
    path.write_text("\n".join(lines) + "\n")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_command() -> list[str]:
    """``memsifter serve`` from this interpreter's environment; the module form when the
    console script is not installed next to it."""
    script = Path(sys.executable).parent / "memsifter"
    if script.exists():
        return [str(script), "serve"]
    return [sys.executable, "-m", "memsifter.cli", "serve"]


@dataclass
class Server:
    """One ``memsifter serve`` process; ``start`` again after ``kill`` to restart it on the
    same port, config and database."""

    config: Path
    port: int
    key: str
    log: Path
    log_level: str = "warning"
    workers: int = 1  # memsifter serve --workers
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    start_seconds: list[float] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def start(self, timeout_s: float = 120.0) -> None:
        env = dict(os.environ)
        env[KEY_ENV] = self.key
        env.pop("MEMSIFTER_SERVE_DB_URL", None)  # the config names the database
        cmd = [
            *serve_command(),
            "--config",
            str(self.config),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--log-level",
            self.log_level,
            *(("--workers", str(self.workers)) if self.workers > 1 else ()),
        ]
        t0 = time.perf_counter()
        with self.log.open("ab") as log:
            log.write(f"\n=== start {self.starts + 1}: {' '.join(cmd)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        self.starts += 1
        self._wait_ready(timeout_s)
        self.start_seconds.append(round(time.perf_counter() - t0, 2))

    def _wait_ready(self, timeout_s: float) -> None:
        import httpx  # the serve extra; the other benchmarks import this module without it

        deadline = time.monotonic() + timeout_s
        assert self.proc is not None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the server exited with {self.proc.returncode}; see {self.log}:\n"
                    + self.log.read_text()[-3000:]
                )
            try:
                if httpx.get(f"{self.base_url}/readyz", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the server was not ready within {timeout_s:.0f}s; see {self.log}")

    def kill(self) -> None:
        """SIGKILL: no shutdown hook, no flush, no lifespan exit runs."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def rss_mib(self) -> float | None:
        """The server's resident memory, for the report (Linux only)."""
        if self.proc is None:
            return None
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
        except OSError:
            pass
        return None


@contextmanager
def workspace(keep: bool = False, prefix: str = "memsifter-bench-") -> Iterator[Path]:
    import tempfile

    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        if not keep:
            shutil.rmtree(path, ignore_errors=True)


@contextmanager
def coarse_sqlite_server() -> Iterator[Server]:
    """One coarse-only ``memsifter serve`` on a throwaway SQLite database, started; stopped and
    its folder removed on exit."""
    with workspace() as ws:
        db = create_database("sqlite", ws)
        write_config(ws / "serve.yaml", db.url, ProxyOptions())
        server = Server(ws / "serve.yaml", free_port(), new_key(), ws / "server.log")
        server.start()
        try:
            yield server
        finally:
            server.stop()


def new_key() -> str:
    return "msk-bench-" + uuid.uuid4().hex


# ----------------------------------------------------------------------------- synthetic chats

# Topic words give BM25 and YAKE something to find; filler words make pages differ in length and
# vocabulary like real chat does. The content is synthetic on purpose: no dataset is needed.
TOPICS: dict[str, list[str]] = {
    "dog": ["Max", "puppy", "leash", "vet", "kibble", "fetch", "walk"],
    "cooking": ["risotto", "saffron", "oven", "recipe", "garlic", "simmer", "basil"],
    "travel": ["Lisbon", "flight", "hostel", "itinerary", "passport", "tram", "beach"],
    "work": ["deadline", "manager", "promotion", "standup", "roadmap", "review", "client"],
    "running": ["marathon", "sneakers", "tempo", "hills", "blister", "pace", "splits"],
    "garden": ["tomatoes", "compost", "seedlings", "aphids", "mulch", "trellis", "basil"],
    "music": ["guitar", "chords", "concert", "playlist", "vinyl", "drummer", "rehearsal"],
    "health": ["dentist", "allergy", "vitamins", "insomnia", "physio", "knee", "checkup"],
    "money": ["budget", "savings", "mortgage", "invoice", "taxes", "refund", "pension"],
    "family": ["sister", "nephew", "birthday", "grandma", "wedding", "cousin", "reunion"],
    "books": ["novel", "library", "chapter", "author", "bookclub", "poetry", "memoir"],
    "car": ["mechanic", "tyres", "brakes", "mileage", "insurance", "garage", "battery"],
    "home": ["landlord", "plumber", "couch", "paint", "bathroom", "lease", "neighbours"],
    "study": ["exam", "thesis", "lecture", "professor", "flashcards", "semester", "lab"],
    "games": ["chess", "puzzle", "console", "tournament", "strategy", "boardgame", "quest"],
    "film": ["cinema", "director", "trailer", "sequel", "documentary", "popcorn", "subtitles"],
}
FILLER = (
    "I we you it that this then just really maybe think about with from after before today "
    "yesterday tomorrow week weekend morning evening again still also because though pretty "
    "quite nice good bad busy tired happy plan planning trying going went got get make made "
    "need want like love hate remember told said asked help started finished next last first "
    "little lot more less time day night people friend thing things idea sure okay great"
).split()


def make_session(
    rng: random.Random, session_id: str, when: datetime, n_turns: int = 4
) -> dict[str, Any]:
    topic = rng.choice(list(TOPICS))
    words = TOPICS[topic]
    turns = []
    for j in range(n_turns):
        n = rng.randint(10, 24)
        text = " ".join(
            rng.choice(words) if rng.random() < 0.3 else rng.choice(FILLER) for _ in range(n)
        )
        turns.append(
            {
                "speaker": "user" if j % 2 == 0 else "assistant",
                "text": text[0].upper() + text[1:] + ".",
                "turn_id": f"t{j}",
            }
        )
    return {"id": session_id, "date": when.isoformat(), "turns": turns}


def make_question(rng: random.Random) -> str:
    words = TOPICS[rng.choice(list(TOPICS))]
    a, b = rng.sample(words, 2)
    return f"What did I say about the {a} and the {b}?"


BASE_DATE = datetime(2025, 1, 1, 9, 0)


def session_date(i: int) -> datetime:
    return BASE_DATE + timedelta(hours=i)


def pl_around(order: list[int], rng: random.Random) -> list[int]:
    """A Plackett-Luce sample around ``order``: log-weight -rank plus Gumbel noise, sorted. A
    policy's samples agree at the top more than at the bottom; these keep ``order``'s first
    about 63% of the time. The reward benchmarks' stand-in for a policy's rankings."""
    keys = [-rank - math.log(-math.log(rng.random() or 1e-300)) for rank in range(len(order))]
    return [order[i] for i in sorted(range(len(order)), key=lambda i: -keys[i])]
