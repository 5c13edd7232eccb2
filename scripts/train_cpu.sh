#!/usr/bin/env bash
# The CPU training run (configs/train/smollm2_cpu.yaml): build the RL data from the real LoCoMo,
# then cold-start SFT + GRPO epochs with validation and averaging. ~23 min on 2 quiet cores.
# Rerunning resumes where it stopped. Results: outputs/train/smollm2_cpu/{report.md,curves.png}.
#   MEMSIFTER_LOCOMO   LoCoMo file (default ../shared/data/locomo/locomo10.json)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
LOCOMO="${MEMSIFTER_LOCOMO:-../shared/data/locomo/locomo10.json}"
if [ ! -f data/rl/locomo_smollm2/train.parquet ]; then
  .venv/bin/memsifter data rl --recipe configs/data/locomo_smollm2_cpu.yaml \
    --out data/rl/locomo_smollm2 --data "locomo=$LOCOMO"
fi
exec .venv/bin/memsifter train configs/train/smollm2_cpu.yaml "$@"
