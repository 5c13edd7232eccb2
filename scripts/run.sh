#!/usr/bin/env bash
# The main job: set up, then start the recall service (`memsifter serve`) on its embedded defaults
# (configs/serve/default.yaml): SQLite under outputs/serve/, BM25 + YAKE bookmarks as the offline
# coarse filter, and the offline SmolLM2-135M proxy on CPU. A sample conversation (user "alice",
# tenant "demo") is seeded, and the first curl is printed with its key. Ctrl-C stops it.
#   PORT / HOST                   where to listen (default 127.0.0.1:8080)
#   MEMSIFTER_DEMO_KEY            the sample tenant's API key (generated and printed when unset)
#   MEMSIFTER_SERVE_DB_URL        the store (default sqlite:///outputs/serve/memsifter.db)
#   MEMSIFTER_SERVE_CONFIG        another config, e.g. configs/serve/coarse_only.yaml
#   MEMSIFTER_PROXY_ENGINE=llamacpp  serve the shipped proxy through llama.cpp: build llama-server
#                                 once (scripts/llamacpp_server.sh --setup-only), start it on
#                                 127.0.0.1:8012 with memsifter-smollm2-135m-locomo (its log:
#                                 outputs/serve/llamacpp.log), serve configs/serve/llamacpp_proxy.yaml
#                                 (unless MEMSIFTER_SERVE_CONFIG says otherwise), stop it on exit
# The benchmark evals stay one command each: scripts/eval_retrieval.sh (LoCoMo retrieval), and the
# commands in docs/evaluation.md.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
export MEMSIFTER_SERVE_DB_URL="${MEMSIFTER_SERVE_DB_URL:-sqlite:///outputs/serve/memsifter.db}"
config="${MEMSIFTER_SERVE_CONFIG:-configs/serve/default.yaml}"
serve=(.venv/bin/memsifter serve --host "${HOST:-127.0.0.1}" --port "${PORT:-8080}" --seed-sample)

case "${MEMSIFTER_PROXY_ENGINE:-}" in
  "") exec "${serve[@]}" --config "$config" ;;
  llamacpp) ;;
  *) echo "MEMSIFTER_PROXY_ENGINE must be llamacpp (or unset), got $MEMSIFTER_PROXY_ENGINE" >&2
     exit 2 ;;
esac

config="${MEMSIFTER_SERVE_CONFIG:-configs/serve/llamacpp_proxy.yaml}"
bash scripts/llamacpp_server.sh --setup-only
mkdir -p outputs/serve
log=outputs/serve/llamacpp.log
bash scripts/llamacpp_server.sh --model memsifter-smollm2-135m-locomo --port 8012 >"$log" 2>&1 &
llama=$!
trap 'kill "$llama" 2>/dev/null || true' EXIT
echo ">>> starting llama-server on 127.0.0.1:8012 (log: $log)" >&2
# The first start exports the adapter to GGUF (merged, f32; cached) before the server loads.
ready=0
for _ in $(seq 1200); do
  kill -0 "$llama" 2>/dev/null || break
  if .venv/bin/python -c "import urllib.request as u
u.urlopen('http://127.0.0.1:8012/health', timeout=2)" 2>/dev/null; then ready=1; break; fi
  sleep 0.5
done
if [ "$ready" != 1 ]; then
  echo "llama-server did not come up on 127.0.0.1:8012; its log:" >&2
  tail -n 40 "$log" >&2
  exit 1
fi
# Not exec: this shell stays to stop llama-server when the service exits.
"${serve[@]}" --config "$config"
