"""Evaluation: retrieval metrics over coarse filters (and, later, the proxy) on memory benchmarks."""
