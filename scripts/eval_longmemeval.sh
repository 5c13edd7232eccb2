#!/usr/bin/env bash
# The retrieval benchmark on LongMemEval (configs/eval/longmemeval_retrieval.yaml: every offline
# coarse filter, the benchmark's own session/turn metrics beside ours, run files per retriever).
# Uses LongMemEval-S at ../shared/data/longmemeval/longmemeval_s_cleaned_498.json.gz (or
# $MEMSIFTER_LONGMEMEVAL, e.g. the oracle set) when it is there; on a fresh clone without it, runs
# on the committed synthetic fixture and says so. eval/results/longmemeval_retrieval/longmemeval_retrieval.md is
# rendered from such runs by eval/reports/longmemeval_retrieval.py.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
DATA="${MEMSIFTER_LONGMEMEVAL:-../shared/data/longmemeval/longmemeval_s_cleaned_498.json.gz}"
OUT="${1:-outputs/retrieval_longmemeval_s}"
if [ ! -f "$DATA" ]; then
  echo ">>> $DATA not found: running on the SYNTHETIC fixture data/fixtures/longmemeval_mini.json" >&2
  echo ">>> (numbers are a smoke test, not LongMemEval results; see data/README.md)" >&2
  DATA=data/fixtures/longmemeval_mini.json
fi
exec .venv/bin/memsifter eval retrieval --config configs/eval/longmemeval_retrieval.yaml \
  --data "$DATA" --out "$OUT"
