"""Benchmark reports rendered from ``memsifter eval`` outputs: ``python -m eval.reports.<name>``;
outputs under ``eval/results/<name>/``."""
