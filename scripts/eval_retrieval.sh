#!/usr/bin/env bash
# The retrieval benchmark (the main job until the recall service landed), on its embedded defaults
# (configs/eval/locomo_retrieval.yaml: every offline coarse filter on LoCoMo, native haystack).
# Uses the real LoCoMo at ../shared/data/locomo/locomo10.json (or $MEMSIFTER_LOCOMO) when it is
# there; on a fresh clone without it, runs on the committed synthetic fixture and says so.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
DATA="${MEMSIFTER_LOCOMO:-../shared/data/locomo/locomo10.json}"
OUT="${1:-outputs/retrieval_locomo}"
if [ ! -f "$DATA" ]; then
  echo ">>> $DATA not found: running on the SYNTHETIC fixture data/fixtures/locomo_mini.json" >&2
  echo ">>> (numbers are a smoke test, not LoCoMo results; see data/README.md to get LoCoMo)" >&2
  DATA=data/fixtures/locomo_mini.json
fi
exec .venv/bin/memsifter eval retrieval --config configs/eval/locomo_retrieval.yaml \
  --data "$DATA" --out "$OUT"
