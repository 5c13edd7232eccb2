#!/usr/bin/env bash
# The CPU training run (configs/train/smollm2_cpu.yaml): build the RL data from the real LoCoMo
# (train 0-6, validation 7, test 8-9), cold-start SFT on gold-first targets (LoRA, top 10 layers),
# GRPO with the retrieval-reward warm-up, validation on conversation 7 and checkpoint averaging,
# then export the result as a LoRA adapter of SmolLM2 (the shipped proxy's format). ~85 min on 2
# quiet cores. Rerunning resumes where it stopped. Results: outputs/train/smollm2_cpu/.
#   MEMSIFTER_LOCOMO   LoCoMo file (default ../shared/data/locomo/locomo10.json)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
LOCOMO="${MEMSIFTER_LOCOMO:-../shared/data/locomo/locomo10.json}"
if [ ! -f data/rl/locomo_smollm2/train_pool.parquet ]; then
  .venv/bin/memsifter data rl --recipe configs/data/locomo_smollm2_cpu.yaml \
    --out data/rl/locomo_smollm2 --data "locomo=$LOCOMO"
fi
.venv/bin/memsifter train configs/train/smollm2_cpu.yaml "$@"
.venv/bin/memsifter export-adapter outputs/train/smollm2_cpu/epoch-0/averaged \
  --out outputs/train/smollm2_cpu/adapter --base smollm2-135m-instruct --rank 48
