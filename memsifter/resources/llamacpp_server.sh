#!/usr/bin/env bash
# Serve a GGUF model through llama.cpp's OpenAI-compatible server (`llama-server`) on CPU.
#
# Where llama.cpp comes from: a pinned source release on PyPI, the sdist of llama-cpp-python, which
# vendors llama.cpp (vendor/llama.cpp: the server, convert_hf_to_gguf.py and gguf-py). pip fetches
# it by exact version and sha256, so a build is reproducible offline from a PyPI mirror and no
# llama.cpp code lives in this repository. We build only the `llama-server` target, Release, with
# portable CPU flags: GGML_NATIVE=OFF (no -march=native; on x86-64 ggml then targets
# AVX/AVX2/FMA/F16C/BMI2, any x86-64 CPU since ~2015), no OpenSSL, no web UI, no downloads.
# This file ships inside the package (memsifter/resources/), so an installed memsifter can launch
# it (memsifter.llm.llamacpp); in a checkout, scripts/llamacpp_server.sh runs it with the
# checkout's defaults. Relative paths are read against the working directory.
#
# Usage:
#   bash llamacpp_server.sh --setup-only
#   bash llamacpp_server.sh --model MODEL [--port PORT] [--served-model-name NAME]
#                           [--threads N] [--ctx-size N] [--parallel N] [--marker-read]
#                           [EXTRA LLAMA-SERVER ARGS...]
#   --setup-only         fetch and build llama-server (once) and exit
#   --model MODEL        a .gguf file, or any memsifter model name (a folder, a built-in such as
#                        memsifter-smollm2-135m-locomo, an adapter): exported once to f32 GGUF in
#                        the memsifter cache (memsifter.llm.llamacpp.gguf_for; `memsifter
#                        export-gguf MODEL OUT.gguf` writes one where you say)
#   --port PORT          default 8012
#   --served-model-name  the id /v1/models lists (default: the model name, or the file's stem)
#   --threads N          compute threads (default: all cores)
#   --ctx-size N         KV-cache tokens per slot (default 4096: the proxy's 2K-token prompts)
#   --parallel N         slots, i.e. requests decoded together (default 4)
#   --marker-read        serve the first-token head's marker read (head_read: marker) instead of
#                        completions: --embeddings --pooling none, so /embeddings returns every
#                        token's final (normed) hidden state, and a micro-batch of --ctx-size
#                        tokens (an embeddings request is never split across micro-batches; the
#                        default 512 would refuse a longer prompt). Clients: the openai backend
#                        with server: llamacpp (memsifter.llm.openai_http).
#   anything else is passed to llama-server unchanged, after our defaults, so it overrides them:
#   --flash-attn on (llama.cpp's `auto` leaves it off on CPU; on 2 cores it cut the prefill of a
#   1.7K-token proxy prompt by ~8%) and --no-webui.
# Environment:
#   MEMSIFTER_LLAMACPP_DIR   build folder (default .llamacpp): src/ holds the llama.cpp tree,
#                            build/bin/llama-server the binary
#   MEMSIFTER_PYTHON         the python memsifter is installed in: its pip downloads the sdist,
#                            and it exports a model name to GGUF (default python3)
#   MEMSIFTER_LLAMACPP_JOBS  parallel compile jobs (default 2)
#   MEMSIFTER_LLAMACPP_CMAKE_ARGS  extra cmake arguments (e.g. -DGGML_AVX2=OFF for an old CPU)
#   LLAMACPP_HOST            bind address (default 127.0.0.1)
set -euo pipefail
DIR="${MEMSIFTER_LLAMACPP_DIR:-.llamacpp}"
PY="${MEMSIFTER_PYTHON:-python3}"
JOBS="${MEMSIFTER_LLAMACPP_JOBS:-2}"
# The pin: llama-cpp-python 0.3.36 vendors llama.cpp at commit 0c1e57098bba43ac29e6e3b677cdceebdd22334f.
SDIST_VERSION=0.3.36
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
CMAKE_ARGS=(
  -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON
  -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF
  -DGGML_CCACHE=OFF
)
# shellcheck disable=SC2206
CMAKE_ARGS+=(${MEMSIFTER_LLAMACPP_CMAKE_ARGS:-})

setup_only=0
model=""
port=8012
name=""
threads="$(nproc 2>/dev/null || echo 2)"
ctx=4096
parallel=4
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
    --threads) threads="$2"; shift 2 ;;
    --threads=*) threads="${1#*=}"; shift ;;
    --ctx-size) ctx="$2"; shift 2 ;;
    --ctx-size=*) ctx="${1#*=}"; shift ;;
    --parallel) parallel="$2"; shift 2 ;;
    --parallel=*) parallel="${1#*=}"; shift ;;
    --marker-read) marker_read=1; shift ;;
    *) extra+=("$1"); shift ;;
  esac
done

# Build once; the stamp (written last) makes --setup-only a no-op unless the pin or the flags
# change. Serving builds only when there is no binary: a stale one is served, with a warning,
# rather than rebuilt for many minutes inside a caller's startup timeout.
stamp="$DIR/.memsifter-llamacpp-setup"
want="llama-cpp-python==$SDIST_VERSION ${CMAKE_ARGS[*]}"
stale=0
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] || [ ! -x "$DIR/build/bin/llama-server" ]; then
  stale=1
fi
if [ "$stale" = 1 ] && [ "$setup_only" = 0 ] && [ -x "$DIR/build/bin/llama-server" ]; then
  echo "warning: $DIR was built with other settings than these; run --setup-only to rebuild" >&2
  stale=0
fi
if [ "$stale" = 1 ]; then
  for tool in cmake c++ tar; do
    command -v "$tool" >/dev/null || { echo "building llama.cpp needs $tool on PATH" >&2; exit 2; }
  done
  echo ">>> building llama-server from llama-cpp-python==$SDIST_VERSION into $DIR (once)" >&2
  mkdir -p "$DIR"
  dl="$DIR/download"
  rm -rf "$dl" && mkdir -p "$dl"
  echo "llama-cpp-python==$SDIST_VERSION --hash=sha256:$SDIST_SHA256" > "$dl/requirements.txt"
  export PIP_DISABLE_PIP_VERSION_CHECK=1
  "$PY" -m pip download -q --no-deps --no-binary :all: --require-hashes \
    -r "$dl/requirements.txt" -d "$dl" 2>&1 | grep -v "is ignored" >&2 || true
  sdist="$dl/llama_cpp_python-$SDIST_VERSION.tar.gz"
  [ -f "$sdist" ] || { echo "pip did not download $sdist" >&2; exit 2; }
  rm -rf "$DIR/src" && mkdir -p "$DIR/src"
  # Only the vendored llama.cpp tree; its .git file points into the sdist's own git folder.
  tar xzf "$sdist" -C "$DIR/src" --strip-components=3 --exclude=.git \
    "llama_cpp_python-$SDIST_VERSION/vendor/llama.cpp"
  rm -rf "$dl"
  # llama.cpp stamps its version with `git rev-parse` in its tree; stop git at $DIR, or a build
  # inside a checkout would report the enclosing repository's commit as llama.cpp's.
  GIT_CEILING_DIRECTORIES="$(cd "$DIR" && pwd)"
  export GIT_CEILING_DIRECTORIES
  cmake -S "$DIR/src" -B "$DIR/build" "${CMAKE_ARGS[@]}" >&2
  nice -n 19 cmake --build "$DIR/build" --target llama-server -j "$JOBS" >&2
  "$DIR/build/bin/llama-server" --version >&2
  echo "$want" > "$stamp"
fi
[ "$setup_only" = 1 ] && exit 0

[ -n "$model" ] || { echo "--model is required (a .gguf file or a model name)" >&2; exit 2; }
case "$model" in
  *.gguf) name="${name:-$(basename "$model" .gguf)}" ;;
  *)
    name="${name:-$(basename "$model")}"
    export MEMSIFTER_LLAMACPP_DIR="$DIR"
    model="$("$PY" -c 'import sys
from memsifter.llm.llamacpp import gguf_for
print(gguf_for(sys.argv[1]))' "$model")" ;;
esac
[ -f "$model" ] || { echo "model file $model does not exist" >&2; exit 2; }
read_args=()
if [ "$marker_read" = 1 ]; then
  read_args=(--embeddings --pooling none --ubatch-size "$ctx" --batch-size "$ctx")
fi
# exec: the server then owns this process (and its group), so a caller's SIGTERM reaches it.
# --ctx-size is for all slots together: each of the `parallel` slots gets `ctx` tokens.
exec "$DIR/build/bin/llama-server" --model "$model" --alias "$name" \
  --host "${LLAMACPP_HOST:-127.0.0.1}" --port "$port" --threads "$threads" \
  --ctx-size "$((ctx * parallel))" --parallel "$parallel" --flash-attn on --no-webui \
  "${read_args[@]}" "${extra[@]}"
