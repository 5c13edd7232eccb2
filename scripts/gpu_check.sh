#!/usr/bin/env bash
# The one-GPU check of the paper-scale recipe (docs/training.md, "The one-GPU check"): on one GPU
# (an H100 or H200 lent for minutes, no network, no vLLM), Qwen3-4B's architecture with random
# weights from configs/models/Qwen3-4B-Thinking-2507/config.json: peak memory and seconds per
# training step of both ranking heads, LoRA and full fine-tuning, at 8K, 32K and 128K prompt
# tokens, then the head's recall latency at 32K and 128K. Needs only torch, transformers and peft
# (no project install). Prints the table and PASS/FAIL; writes bench_gpu_step.{md,json} to OUT.
#   bash scripts/gpu_check.sh [OUT]            OUT defaults to $OUT, else outputs/gpu_check
#   bash scripts/gpu_check.sh --dry-run [OUT]  the same code on CPU with a tiny model (no GPU)
#   MEMSIFTER_GPU_CHECK_BUDGET_S  rows after this many seconds are skipped (default 420)
#   PYTHON                        the interpreter (default python3)
set -euo pipefail
cd "$(dirname "$0")/.."
DRY=()
if [ "${1:-}" = "--dry-run" ]; then DRY=(--dry-run); shift; fi
DEST="${1:-${OUT:-outputs/gpu_check}}"
exec "${PYTHON:-python3}" -m eval.bench.bench_gpu_step "${DRY[@]}" --out "$DEST" \
  --budget-s "${MEMSIFTER_GPU_CHECK_BUDGET_S:-420}"
