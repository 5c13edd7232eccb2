#!/usr/bin/env bash
# Set up the venv with the dev extra and run the whole test suite (slow-marked tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
MEMSIFTER_EXTRAS="${MEMSIFTER_EXTRAS:-dev}" bash scripts/setup.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" MKL_NUM_THREADS="${MKL_NUM_THREADS:-2}"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
