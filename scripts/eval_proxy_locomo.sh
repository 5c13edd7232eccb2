#!/usr/bin/env bash
# The held-out comparison (eval/results/proxy_locomo_test/proxy_locomo_test.{md,json}): every question of the
# LoCoMo test split (conversations 8-9) whose prompt shows a gold page, the same prompts for
# every ranker: BM25's order, the untrained SmolLM2, the SFT start, the trained proxy (the
# shipped adapter), and the trained proxy fused with BM25 (RRF); greedy; paired bootstrap 95%
# CIs. Three generation passes (~16 min each on 2 quiet cores; the untrained model never stops
# early, ~24 min), each also answering a seeded 40 of the questions in 5 other orders of their
# candidates (the order-invariance check, ~5/7 of a pass more), then one scoring pass over their
# saved runs (`--run`, seconds), which reads the permuted answers back.
# Needs the RL data (scripts/train_cpu.sh builds it) and, for the sft row, the training run's
# outputs/train/smollm2_cpu/sft/final (MEMSIFTER_SFT=PATH to point elsewhere).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
SFT="${MEMSIFTER_SFT:-outputs/train/smollm2_cpu/sft/final}"
DATA=data/rl/locomo_smollm2
OUT=outputs/proxy_eval
INVARIANCE=(--permutations 5 --invariance-questions 40)
.venv/bin/memsifter eval proxy --data "$DATA" --split test --threads 2 "${INVARIANCE[@]}" \
  --model "trained=memsifter-smollm2-135m-locomo" --model "sft=$SFT" --out "$OUT/models"
.venv/bin/memsifter eval proxy --data "$DATA" --split test --threads 2 "${INVARIANCE[@]}" \
  --model "untrained=smollm2-135m-instruct" --explicit-spec untrained --out "$OUT/untrained"
.venv/bin/memsifter eval proxy --data "$DATA" --split test "${INVARIANCE[@]}" \
  --run "untrained=$OUT/untrained/runs/untrained.jsonl" --run "sft=$OUT/models/runs/sft.jsonl" \
  --run "trained=$OUT/models/runs/trained.jsonl" --fuse trained \
  --pair trained-start --pair trained-bm25 --pair trained-sft --pair sft-untrained \
  --pair sft-bm25 --pair trained+bm25-bm25 --model-name memsifter-smollm2-135m-locomo --start sft \
  --out "$OUT/locomo_test" --out-md eval/results/proxy_locomo_test/proxy_locomo_test.md \
  --out-json eval/results/proxy_locomo_test/proxy_locomo_test.json
cp "$OUT"/locomo_test/runs/*.jsonl eval/results/proxy_locomo_test/runs/
