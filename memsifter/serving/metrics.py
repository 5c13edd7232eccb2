"""Prometheus metrics of one app instance, on a registry of its own (so several apps in one
process, as in tests, never collide on the global one). Served at ``/metrics``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from memsifter.serving.ranking import ParseReport

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, ranker: str) -> None:
        self.registry = CollectorRegistry()
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
        self.page_ins = Counter(
            "memsifter_page_ins_total", "Pages paged in to a context.", registry=self.registry
        )
        self.page_outs = Counter(
            "memsifter_page_outs_total", "Pages paged out of a context.", registry=self.registry
        )
        self.facts_swept = Counter(
            "memsifter_facts_swept_total", "Expired facts purged.", registry=self.registry
        )

    def observe_proxy(self, seconds: float, report: ParseReport) -> None:
        self.proxy_seconds.labels(self.ranker).observe(seconds)
        self.proxy_calls.labels(self.ranker).inc()
        if report.status == "failed":
            self.parse_failures.labels(report.error or "unknown").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
