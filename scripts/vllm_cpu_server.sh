#!/usr/bin/env bash
# Serve a local model folder through vLLM's OpenAI-compatible API on CPU, from this checkout.
#
# The launcher itself ships inside the package (memsifter/resources/vllm_cpu_server.sh: usage,
# options and environment there); this wrapper runs it with the checkout's venvs as defaults:
#   MEMSIFTER_VLLM_VENV  default .venv-vllm (relative to the repository root)
#   MEMSIFTER_PYTHON     default .venv/bin/python
#   bash scripts/vllm_cpu_server.sh --setup-only
#   bash scripts/vllm_cpu_server.sh --model DIR --port 8011
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${MEMSIFTER_VLLM_VENV:-.venv-vllm}"
case "$venv" in /*) ;; *) venv="$root/$venv" ;; esac
export MEMSIFTER_VLLM_VENV="$venv"
export MEMSIFTER_PYTHON="${MEMSIFTER_PYTHON:-$root/.venv/bin/python}"
exec bash "$root/memsifter/resources/vllm_cpu_server.sh" "$@"
