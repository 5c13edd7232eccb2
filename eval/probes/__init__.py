"""Diagnostic experiments (the memory gym's probes and reading ladder, LoCoMo head runs):
``python -m eval.probes.<name>``; outputs under ``eval/results/<name>/``."""
