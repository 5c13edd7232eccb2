#!/usr/bin/env bash
# Serve a GGUF model through llama.cpp's OpenAI-compatible server on CPU, from this checkout.
#
# The launcher itself ships inside the package (memsifter/resources/llamacpp_server.sh: usage,
# options and environment there); this wrapper runs it with the checkout's defaults:
#   MEMSIFTER_LLAMACPP_DIR  default .llamacpp (relative to the repository root)
#   MEMSIFTER_PYTHON        default .venv/bin/python
#   bash scripts/llamacpp_server.sh --setup-only
#   bash scripts/llamacpp_server.sh --model proxy.gguf --port 8012
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${MEMSIFTER_LLAMACPP_DIR:-.llamacpp}"
case "$dir" in /*) ;; *) dir="$root/$dir" ;; esac
export MEMSIFTER_LLAMACPP_DIR="$dir"
export MEMSIFTER_PYTHON="${MEMSIFTER_PYTHON:-$root/.venv/bin/python}"
exec bash "$root/memsifter/resources/llamacpp_server.sh" "$@"
