#!/usr/bin/env bash
# Set up the venv with the dev extra, build the vLLM CPU server's own venv (.venv-vllm) and
# llama.cpp's server (.llamacpp; once, ~20 min on 2 cores) for the real-server integration tests,
# and run the whole test suite (slow-marked tests included).
#   MEMSIFTER_SKIP_VLLM=1       skip building .venv-vllm (its tests then skip instead of failing)
#   MEMSIFTER_SKIP_LLAMACPP=1   skip building .llamacpp (its tests then skip instead of failing)
#   MEMSIFTER_SKIP_BROWSER=1    skip installing Debian's chromium (the inspector's browser test
#                               then skips instead of failing)
set -euo pipefail
cd "$(dirname "$0")/.."
MEMSIFTER_EXTRAS="${MEMSIFTER_EXTRAS:-train,serve,postgres,integrations,dev}" bash scripts/setup.sh
if [ "${MEMSIFTER_SKIP_VLLM:-0}" != "1" ]; then
  bash scripts/vllm_cpu_server.sh --setup-only
  export MEMSIFTER_REQUIRE_VLLM=1
fi
if [ "${MEMSIFTER_SKIP_LLAMACPP:-0}" != "1" ]; then
  bash scripts/llamacpp_server.sh --setup-only
  export MEMSIFTER_REQUIRE_LLAMACPP=1
fi
# The recall inspector's browser test drives Debian's chromium (never a downloaded browser).
if [ "${MEMSIFTER_SKIP_BROWSER:-0}" != "1" ]; then
  if ! command -v chromium >/dev/null 2>&1; then
    (apt-get install -y -q chromium || (apt-get update -q && apt-get install -y -q chromium)) >/dev/null
  fi
  export MEMSIFTER_REQUIRE_BROWSER=1
fi
# The recall service suites (store, API, bad input, isolation) also run on PostgreSQL: the one this machine provides
# (127.0.0.1:5432, trust auth, database test) unless a DSN is given; skipped when none answers.
if [ -z "${MEMSIFTER_TEST_PG_DSN:-}" ] && command -v pg_isready >/dev/null 2>&1 \
    && pg_isready -q -h 127.0.0.1 -p 5432; then
  export MEMSIFTER_TEST_PG_DSN="postgresql+psycopg://postgres@127.0.0.1:5432/test"
fi
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" MKL_NUM_THREADS="${MKL_NUM_THREADS:-2}"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 "$@"
