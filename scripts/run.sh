#!/usr/bin/env bash
# The main job: set up, then start the recall service (`memsifter serve`) on its embedded defaults
# (configs/serve/default.yaml): SQLite under outputs/serve/, BM25 + YAKE bookmarks as the offline
# coarse filter, and the offline SmolLM2-135M proxy on CPU. A sample conversation (user "alice",
# tenant "demo") is seeded, and the first curl is printed with its key. Ctrl-C stops it.
#   PORT / HOST                   where to listen (default 127.0.0.1:8080)
#   MEMSIFTER_DEMO_KEY            the sample tenant's API key (generated and printed when unset)
#   MEMSIFTER_SERVE_DB_URL        the store (default sqlite:///outputs/serve/memsifter.db)
#   MEMSIFTER_SERVE_CONFIG        another config, e.g. configs/serve/coarse_only.yaml
# The benchmark evals stay one command each: scripts/eval_retrieval.sh (LoCoMo retrieval), and the
# README's Evaluation section.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
export MEMSIFTER_SERVE_DB_URL="${MEMSIFTER_SERVE_DB_URL:-sqlite:///outputs/serve/memsifter.db}"
exec .venv/bin/memsifter serve --config "${MEMSIFTER_SERVE_CONFIG:-configs/serve/default.yaml}" \
  --host "${HOST:-127.0.0.1}" --port "${PORT:-8080}" --seed-sample
