#!/usr/bin/env bash
# The held-out comparison (eval/results/proxy_locomo_test.{md,json}): every question of the
# LoCoMo test split (conversations 8-9) whose prompt shows a gold page, the same prompts for
# every ranker: BM25's order, the SFT start, the trained proxy (the shipped adapter), and the
# trained proxy fused with BM25 (RRF); greedy; paired bootstrap 95% CIs. ~25 min on 2 cores.
# Then the untrained SmolLM2 on a seeded sample of 48 of those questions (its own report,
# proxy_locomo_test_untrained.*): it never writes a ranking, and all 283 would take ~14 min.
# Needs the RL data (scripts/train_cpu.sh builds it) and, for the sft row, the training run's
# outputs/train/smollm2_cpu/sft/final (MEMSIFTER_SFT=PATH to point elsewhere).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
SFT="${MEMSIFTER_SFT:-outputs/train/smollm2_cpu/sft/final}"
.venv/bin/memsifter eval proxy --data data/rl/locomo_smollm2 --split test \
  --model "trained=memsifter-smollm2-135m-locomo" --model "sft=$SFT" --fuse trained \
  --pair trained-start --pair trained-bm25 --pair trained-sft --pair sft-bm25 \
  --pair trained+bm25-bm25 --model-name memsifter-smollm2-135m-locomo --start sft \
  --threads 2 --out outputs/proxy_eval/locomo_test \
  --out-md eval/results/proxy_locomo_test.md --out-json eval/results/proxy_locomo_test.json
.venv/bin/memsifter eval proxy --data data/rl/locomo_smollm2 --split test \
  --model "untrained=smollm2-135m-instruct" --explicit-spec untrained --model "sft=$SFT" \
  --pair sft-untrained --max-questions 48 --threads 2 --out outputs/proxy_eval/locomo_untrained \
  --out-md eval/results/proxy_locomo_test_untrained.md \
  --out-json eval/results/proxy_locomo_test_untrained.json
