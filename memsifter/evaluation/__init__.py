"""Evaluation: retrieval metrics for coarse filters (and later the proxy) on memory benchmarks."""
