"""Prometheus metrics of one app instance, on a registry of its own (so several apps in one
process, as in tests, never collide on the global one). Served at ``/metrics``.

**Several workers** (``memsifter serve --workers N``) run one app per process, and a scrape
reaches one of them. In prometheus_client's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set
before the worker imports prometheus_client; ``serve`` does that) every process writes its
values to memory-mapped files in that folder, and ``/metrics`` serves their sum over every
process, the exited ones included, so counters never go backwards when a worker is restarted.
``memsifter_workers`` counts the live workers: its per-process files are removed when a process
is gone (``reap_dead_workers``, run at worker start and on every scrape), which is the clean-up
prometheus_client asks of its users. The folder must be emptied before the server starts
(``prepare_multiprocess_dir``), or the last run's counts would be added in.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from memsifter.serving.ranking import IndexCacheReport, IndexLoad, ParseReport

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_PID = re.compile(r"_(\d+)\.db$")


def multiprocess_dir() -> Path | None:
    value = os.environ.get(MULTIPROC_ENV) or os.environ.get(MULTIPROC_ENV.lower())
    return Path(value) if value else None


def prepare_multiprocess_dir() -> Path:
    """The folder for multiprocess metrics, emptied: ``$PROMETHEUS_MULTIPROC_DIR`` if set (its
    ``*.db`` files removed), else a new temporary folder, exported for the workers to inherit."""
    path = multiprocess_dir()
    if path is None:
        path = Path(tempfile.mkdtemp(prefix="memsifter-metrics-"))
        os.environ[MULTIPROC_ENV] = str(path)
    path.mkdir(parents=True, exist_ok=True)
    for old in path.glob("*.db"):
        old.unlink()
    return path


def reap_dead_workers(path: Path) -> list[int]:
    """Mark every process with files in ``path`` that no longer runs as dead (its live-gauge
    files go; counters and histograms stay, summed into the totals). The pids reaped."""
    pids = {int(m.group(1)) for f in path.glob("*.db") if (m := _PID.search(f.name))}
    dead = [pid for pid in sorted(pids) if not _alive(pid)]
    for pid in dead:
        multiprocess.mark_process_dead(pid, str(path))
    return dead


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_multiprocess_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, ranker: str) -> None:
        self.registry = CollectorRegistry()
        self.multiprocess = multiprocess_dir()
        self.ranker = ranker
        self.request_seconds = Histogram(
            "memsifter_request_seconds",
            "HTTP request latency by route template and status code.",
            ["method", "route", "status"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.proxy_seconds = Histogram(
            "memsifter_proxy_seconds",
            "Latency of one proxy ranking call (prompt, generation, parse).",
            ["ranker"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.proxy_calls = Counter(
            "memsifter_proxy_calls_total",
            "Proxy ranking calls.",
            ["ranker"],
            registry=self.registry,
        )
        self.parse_failures = Counter(
            "memsifter_parse_failures_total",
            "Proxy answers without a usable ranking, by parse error kind.",
            ["kind"],
            registry=self.registry,
        )
        # Every load of a user's index that read the store (a request that found it warm, or
        # waited for another's load, is not one): caught_up reads the pages changed since the
        # replica's version, opened reads a stored BM25 index (pks and lengths), reindexed
        # writes a user's postings again from their pages first (counted: it should be rare),
        # rebuilt reads every page into a non-BM25 filter's index. The histogram's _count and
        # _sum are the loads and their seconds.
        self.index_load_seconds = Histogram(
            "memsifter_index_load_seconds",
            "Loads of a user's coarse index from the store, by kind "
            "(caught_up, opened, reindexed, rebuilt).",
            ["kind"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.index_load_pages = Counter(
            "memsifter_index_load_pages_total",
            "Pages read from the store into users' indexes, by kind of load.",
            ["kind"],
            registry=self.registry,
        )
        self.index_cache_bytes = Gauge(
            "memsifter_index_cache_bytes",
            "Estimated bytes of the users' indexes this process keeps (index_cache_bytes).",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.index_cache_users = Gauge(
            "memsifter_index_cache_users",
            "Users whose index this process keeps.",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.index_evictions = Counter(
            "memsifter_index_evictions_total",
            "Users' indexes dropped from the cache, by reason (bytes, users, too_large).",
            ["reason"],
            registry=self.registry,
        )
        self.page_ins = Counter(
            "memsifter_page_ins_total", "Pages paged in to a context.", registry=self.registry
        )
        self.page_outs = Counter(
            "memsifter_page_outs_total", "Pages paged out of a context.", registry=self.registry
        )
        self.facts_swept = Counter(
            "memsifter_facts_swept_total", "Expired facts purged.", registry=self.registry
        )

        self.workers = Gauge(
            "memsifter_workers",
            "Worker processes serving the API (1 unless serve --workers N).",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.workers.set(1)
        if self.multiprocess is not None:
            reap_dead_workers(self.multiprocess)

    def observe_proxy(self, seconds: float, report: ParseReport) -> None:
        self.proxy_seconds.labels(self.ranker).observe(seconds)
        self.proxy_calls.labels(self.ranker).inc()
        if report.status == "failed":
            self.parse_failures.labels(report.error or "unknown").inc()

    def observe_index_load(self, load: IndexLoad) -> None:
        self.index_load_seconds.labels(load.kind).observe(load.ms / 1000)
        self.index_load_pages.labels(load.kind).inc(load.pages)

    def observe_index_cache(self, report: IndexCacheReport) -> None:
        self.index_cache_bytes.set(report.bytes)
        self.index_cache_users.set(report.users)
        for reason, n in report.evicted.items():
            self.index_evictions.labels(reason).inc(n)

    def render(self) -> bytes:
        if self.multiprocess is None:
            return generate_latest(self.registry)
        reap_dead_workers(self.multiprocess)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, str(self.multiprocess))
        return generate_latest(registry)
