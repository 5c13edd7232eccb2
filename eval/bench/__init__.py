"""Speed, cost and load benchmarks: ``python -m eval.bench.<name>``; outputs under
``eval/results/<name>/``."""
