#!/usr/bin/env bash
# The held-out comparison (eval/results/proxy_locomo_test.{md,json}): every question of the
# LoCoMo test split (conversations 8-9) whose prompt shows a gold page, the same prompts for
# every ranker: BM25's order, the untrained SmolLM2, the SFT start, the trained proxy, and the
# trained proxy fused with BM25 (RRF); greedy; paired bootstrap 95% CIs. ~60 min on 2 cores.
# Needs the RL data (scripts/train_cpu.sh builds it) and, for the sft row, the training run's
# outputs/train/smollm2_cpu/sft/final (MEMSIFTER_SFT=PATH to point elsewhere).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
SFT="${MEMSIFTER_SFT:-outputs/train/smollm2_cpu/sft/final}"
exec .venv/bin/memsifter eval proxy --data data/rl/locomo_smollm2 --split test \
  --model "trained=memsifter-smollm2-135m-locomo" --model "sft=$SFT" \
  --model "untrained=smollm2-135m-instruct" --explicit-spec untrained --fuse trained \
  --pair trained-start --pair trained-bm25 --pair trained-sft --pair sft-untrained \
  --pair trained+bm25-bm25 --model-name memsifter-smollm2-135m-locomo --start sft \
  --threads 2 --out outputs/proxy_eval/locomo_test \
  --out-md eval/results/proxy_locomo_test.md --out-json eval/results/proxy_locomo_test.json "$@"
