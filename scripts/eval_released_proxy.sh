#!/usr/bin/env bash
# The paper's retrieval table (NDCG@1, NDCG@5; ../shared/PAPER.md) for the authors' released
# proxy on their released test data, beside BGE-M3 on the same questions, on one GPU:
#   MODEL=/models/MemSifter-4B-Thinking BGE=/models/bge-m3 DATA=/data/MemSifter-Datasets \
#       bash scripts/eval_released_proxy.sh [OUT]
#   MODEL   the released checkpoint: a local folder (no hub on a GPU box without network) or a
#           hub id vLLM can fetch
#   BGE     BGE-M3's folder (BAAI/bge-m3); empty: the hub id, from the Hugging Face cache
#   DATA    a local copy of zstanjj/MemSifter-Datasets: <dataset>/test.parquet per dataset
#   DATASETS  which datasets (default: locomo split_longmemeval_s personamem_128k)
#   PORT    vLLM's port (default 8000); VLLM_ARGS  more vllm serve flags
#   --dry-run  check the data and the settings and print the commands; needs no GPU
# Writes OUT/<dataset>/{metrics.json,report.md,...} and OUT/table.md (ours beside the paper's).
# Expected runtime on one H200 (an estimate from the paper's 3.98 s a 128K-token query and vLLM's
# batching, not yet measured here): about 10 min to load and warm vLLM and BGE-M3, then roughly
# 20-40 min for ~300 test questions of ~130K prompt tokens and up to 16K thinking tokens each.
# What differs from the paper's setting is in docs/official_proxy.md ("The paper's table").
set -euo pipefail
cd "$(dirname "$0")/.."
DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
OUT="${1:-outputs/released_proxy}"
MODEL="${MODEL:-zstanjj/MemSifter-4B-Thinking}"
DATA="${DATA:?set DATA to a local copy of zstanjj/MemSifter-Datasets (<dataset>/test.parquet)}"
DATASETS="${DATASETS:-locomo split_longmemeval_s personamem_128k}"
PORT="${PORT:-8000}"
COARSE="bge-m3${BGE:+:$BGE}"
PY="${MEMSIFTER_PYTHON:-.venv/bin/python}"

for ds in $DATASETS; do
  [ -f "$DATA/$ds/test.parquet" ] || { echo "error: $DATA/$ds/test.parquet not found" >&2; exit 2; }
done
mkdir -p "$OUT"
# The released model's prompt settings, with the coarse filter's local folder.
"$PY" - "$COARSE" > "$OUT/prompt_spec.json" <<'EOF'
import json, sys
from memsifter.ranker.official import SETTINGS
print(json.dumps({**SETTINGS, "coarse": sys.argv[1]}, indent=2))
EOF
commands=()
for ds in $DATASETS; do
  commands+=("$PY -m memsifter.cli eval retrieval --config configs/eval/released_proxy_retrieval.yaml --data $DATA/$ds/test.parquet --model $MODEL --base-url http://127.0.0.1:$PORT/v1 --prompt $OUT/prompt_spec.json --retriever $COARSE --retriever memsifter --out $OUT/$ds")
done

if [ "$DRY" = 1 ]; then
  for ds in $DATASETS; do
    "$PY" -m memsifter.cli data stats --dataset memsifter --data "$DATA/$ds/test.parquet"
  done
  echo "vllm serve $MODEL --max-model-len 147456 --port $PORT ${VLLM_ARGS:-}"
  printf '%s\n' "${commands[@]}"
  exit 0
fi
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "error: no GPU here (nvidia-smi finds none); --dry-run checks the data and the commands" >&2
  exit 2
fi
command -v vllm >/dev/null 2>&1 || { echo "error: vllm is not installed (pip install 'memsifter[gpu]')" >&2; exit 2; }

# 147,456 = the ~130K-token prompt + the 16K-token answer the model was trained with.
# shellcheck disable=SC2086
vllm serve "$MODEL" --max-model-len 147456 --port "$PORT" --gpu-memory-utilization 0.8 \
  ${VLLM_ARGS:-} > "$OUT/vllm.log" 2>&1 &
vllm_pid=$!
trap 'kill $vllm_pid 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null && break
  kill -0 $vllm_pid 2>/dev/null || { tail -30 "$OUT/vllm.log" >&2; exit 1; }
  sleep 1
done
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
for cmd in "${commands[@]}"; do
  echo ">>> $cmd"
  $cmd
done
"$PY" -m memsifter.evaluation.released_table "$OUT" $DATASETS | tee "$OUT/table.md"
