"""MemSifter's evaluation scripts, run from the repository root as modules
(``python -m eval.bench.bench_load``):

* ``eval.bench``: speed, cost and load benchmarks (each table states its machine);
* ``eval.probes``: diagnostic experiments (the memory gym's probes and ladders, LoCoMo runs);
* ``eval.reports``: renderers of the benchmarks' tables from ``memsifter eval`` outputs.

What they share is :mod:`eval.common`. Every output goes under ``eval/results/<name>/``.
"""
