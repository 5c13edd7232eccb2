#!/usr/bin/env bash
# Start one piece of a multi-node GRPO run. The same script runs on every machine; --role picks
# the piece. Topology (the paper's Qwen3-4B run, configs/train/qwen3_4b.yaml):
#
#   training nodes                     rollout node                 answerer node
#   NNODES x NPROC_PER_NODE GPUs       VLLM_TP x VLLM_DP GPUs       ANSWERER_TP GPUs
#   accelerate launch                  trl vllm-serve               vllm serve (or any server
#     (DDP | ZeRO-3 | FSDP2)           (the policy)                 with an OpenAI-compatible
#     -m memsifter.cli train CONFIG                                 /v1/completions route)
#     --vllm-server-host  -- prompts -->  generates G completions
#                         <-- completions; weights pushed back (NCCL) after each step
#     --answerer-url      -- reward: batched, deduplicated, greedy prompts (HTTP) -->
#     --judge-url         -- (question, gold, answer) for judged sources -->  judge node
#                                                                   (JUDGE_TP GPUs, vllm serve)
#
# Rollouts: GRPO with `use_vllm: true, vllm_mode: server` sends generation to the rollout node.
# The server loads the config's policy once, with the config's window and rope scaling (YaRN for
# Qwen3-4B at 128K): `memsifter train CONFIG --vllm-args` prints them (--model, --max-model-len,
# --hf-overrides '{"rope_parameters": ...}'), so the server and the trainer read one config and
# cannot disagree. POLICY_MODEL replaces the model (e.g. a local copy). The trainer pushes the policy's
# weights to it before each generation round, so it serves the current policy, the averaged start
# of each epoch included. With `vllm_mode: colocate` (VLLM_MODE=colocate) vLLM runs inside every
# training process instead and no rollout node is needed.
# Reward: the working LLM answers the question from the proxy's top-k sessions. The reward service
# renders prompts with the answerer's tokenizer locally and calls /v1/completions, so the reward
# config's answerer.model must name the same model as ANSWERER_MODEL (answerer.served_model_name
# when the server uses another name). Qwen3 answerers and judges are prompted with thinking off.
# Judge: data sources whose task metric is `judge` (LongMemEval in configs/rewards/default.yaml)
# are scored by an LLM judge; its server is the judge role, its model the reward config's
# judge.model (= JUDGE_MODEL). Without JUDGE_URL a run with judged rows refuses to start,
# naming the source; choose `task_metrics.<source>: f1` in the reward config to run without one.
#
# Usage (start the servers first, then the trainer on every training node):
#   ANSWERER_MODEL=Qwen/Qwen3-8B            scripts/train_multinode.sh --role answerer
#   JUDGE_MODEL=Qwen/Qwen3-8B               scripts/train_multinode.sh --role judge
#   CONFIG=configs/train/qwen3_4b.yaml VLLM_DP=8 scripts/train_multinode.sh --role rollout
#   CONFIG=configs/train/qwen3_4b.yaml NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 \
#     VLLM_HOST=10.0.0.3 ANSWERER_URL=http://10.0.0.4:8001/v1 JUDGE_URL=http://10.0.0.5:8002/v1 \
#     scripts/train_multinode.sh --role trainer
#   ... the same with NODE_RANK=1 on the second training node.
#   --dry-run prints the command instead of running it. Arguments after `--` are appended to it
#   (to `memsifter train` for the trainer, to the server otherwise).
#
# Environment (defaults in brackets; "required" ones stop the script with a message when unset):
#   trainer:  CONFIG (required), ANSWERER_URL (required), VLLM_HOST (required unless
#             VLLM_MODE=colocate), JUDGE_URL (the judge role's URL; needed when the reward
#             config judges a data source of the run), VLLM_MODE [server], STRATEGY [deepspeed_zero3] (ddp |
#             deepspeed_zero3 | fsdp: configs/accelerate/$STRATEGY.yaml), NNODES [1],
#             NPROC_PER_NODE [8], NODE_RANK and MASTER_ADDR (required when NNODES > 1; 0 and
#             127.0.0.1 on one node), MASTER_PORT [29500]
#   rollout:  CONFIG (required: the training config; its model.name, model.context_tokens and
#             model.rope_scaling), POLICY_MODEL (optional: replaces model.name), VLLM_TP [1]
#             (tensor parallel), VLLM_DP [1] (data parallel; VLLM_TP x VLLM_DP GPUs), VLLM_PORT
#             [8000] (must equal the config's grpo.vllm_server_port), VLLM_GPU_MEMORY_UTILIZATION
#             (optional), PYTHON [python3] (the environment with memsifter installed)
#   answerer: ANSWERER_MODEL [Qwen/Qwen3-8B], ANSWERER_TP [1], ANSWERER_PORT [8001],
#             ANSWERER_SERVED_NAME (optional), ANSWERER_MAX_MODEL_LEN (optional)
#   judge:    JUDGE_MODEL [Qwen/Qwen3-8B], JUDGE_TP [1], JUDGE_PORT [8002],
#             JUDGE_SERVED_NAME (optional), JUDGE_MAX_MODEL_LEN (optional)
# Use CUDA_VISIBLE_DEVICES to split one node's GPUs between pieces. The training config's
# output_dir should be on storage every training node sees.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "train_multinode.sh: $*" >&2; exit 2; }
need() {  # need VAR why: stop with a message naming VAR when it is unset or empty
  [ -n "${!1:-}" ] || die "$1 is not set (needed $2); see the header of scripts/train_multinode.sh"
}

caller_pwd="$PWD"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
resolve_config() {  # the CONFIG path, resolved against the caller's folder (commands run from ROOT)
  local config="$CONFIG"
  if [[ "$config" != /* ]] && [ -e "$caller_pwd/$config" ]; then
    config="$caller_pwd/$config"
  fi
  [ -f "$config" ] || [ -f "$ROOT/$config" ] || die "CONFIG=$CONFIG does not exist"
  printf '%s' "$config"
}
role=""
dry_run=0
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --role) [ $# -ge 2 ] || die "--role needs a value: trainer | rollout | answerer | judge"
            role="$2"; shift 2 ;;
    --role=*) role="${1#--role=}"; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument '$1' (expected --role ROLE, --dry-run, -- EXTRA ARGS)" ;;
  esac
done

cmd=()
case "$role" in
  trainer)
    need CONFIG "by the trainer: the training config, e.g. configs/train/qwen3_4b.yaml"
    need ANSWERER_URL "by the trainer: the working LLM's URL, e.g. http://host:8001/v1"
    VLLM_MODE="${VLLM_MODE:-server}"
    case "$VLLM_MODE" in
      server) need VLLM_HOST "by the trainer: the rollout node running trl vllm-serve" ;;
      colocate) ;;
      *) die "VLLM_MODE must be server or colocate, not '$VLLM_MODE'" ;;
    esac
    STRATEGY="${STRATEGY:-deepspeed_zero3}"
    accel_config="$ROOT/configs/accelerate/$STRATEGY.yaml"
    [ -f "$accel_config" ] \
      || die "STRATEGY=$STRATEGY has no $accel_config (ddp | deepspeed_zero3 | fsdp)"
    NNODES="${NNODES:-1}"
    NPROC_PER_NODE="${NPROC_PER_NODE:-8}"
    [[ "$NNODES" =~ ^[1-9][0-9]*$ ]] || die "NNODES must be a positive integer, not '$NNODES'"
    [[ "$NPROC_PER_NODE" =~ ^[1-9][0-9]*$ ]] \
      || die "NPROC_PER_NODE must be a positive integer, not '$NPROC_PER_NODE'"
    if [ "$NNODES" -gt 1 ]; then
      # Defaulting these would let two nodes both claim rank 0 and hang at the rendezvous.
      need NODE_RANK "on every node of a multi-node run (0 .. NNODES-1)"
      need MASTER_ADDR "on every node of a multi-node run: the address of the NODE_RANK=0 node"
    fi
    NODE_RANK="${NODE_RANK:-0}"
    MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
    MASTER_PORT="${MASTER_PORT:-29500}"
    config="$(resolve_config)"
    cmd=(accelerate launch --config_file "$accel_config"
      --num_machines "$NNODES" --num_processes "$((NNODES * NPROC_PER_NODE))"
      --machine_rank "$NODE_RANK" --main_process_ip "$MASTER_ADDR"
      --main_process_port "$MASTER_PORT"
      -m memsifter.cli train "$config")
    if [ "$VLLM_MODE" = server ]; then cmd+=(--vllm-server-host "$VLLM_HOST"); fi
    cmd+=(--answerer-url "$ANSWERER_URL")
    if [ -n "${JUDGE_URL:-}" ]; then cmd+=(--judge-url "$JUDGE_URL"); fi
    ;;
  rollout)
    need CONFIG "by the rollout: the training config whose policy, window and rope scaling the server serves"
    config="$(resolve_config)"
    serve_args="$(cd "$ROOT" && "${PYTHON:-python3}" -m memsifter.cli train "$config" --vllm-args)" \
      || die "could not read the rollout arguments from CONFIG=$CONFIG (memsifter train --vllm-args)"
    mapfile -t policy_args <<< "$serve_args"
    [ "${policy_args[0]:-}" = --model ] || die "unexpected --vllm-args output: $serve_args"
    if [ -n "${POLICY_MODEL:-}" ]; then policy_args[1]="$POLICY_MODEL"; fi
    cmd=(trl vllm-serve "${policy_args[@]}"
      --tensor-parallel-size "${VLLM_TP:-1}" --data-parallel-size "${VLLM_DP:-1}"
      --host 0.0.0.0 --port "${VLLM_PORT:-8000}")
    if [ -n "${VLLM_GPU_MEMORY_UTILIZATION:-}" ]; then
      cmd+=(--gpu-memory-utilization "$VLLM_GPU_MEMORY_UTILIZATION")
    fi
    ;;
  answerer)
    cmd=(vllm serve "${ANSWERER_MODEL:-Qwen/Qwen3-8B}"
      --host 0.0.0.0 --port "${ANSWERER_PORT:-8001}" --tensor-parallel-size "${ANSWERER_TP:-1}")
    if [ -n "${ANSWERER_SERVED_NAME:-}" ]; then
      cmd+=(--served-model-name "$ANSWERER_SERVED_NAME")
    fi
    if [ -n "${ANSWERER_MAX_MODEL_LEN:-}" ]; then
      cmd+=(--max-model-len "$ANSWERER_MAX_MODEL_LEN")
    fi
    ;;
  judge)
    cmd=(vllm serve "${JUDGE_MODEL:-Qwen/Qwen3-8B}"
      --host 0.0.0.0 --port "${JUDGE_PORT:-8002}" --tensor-parallel-size "${JUDGE_TP:-1}")
    if [ -n "${JUDGE_SERVED_NAME:-}" ]; then cmd+=(--served-model-name "$JUDGE_SERVED_NAME"); fi
    if [ -n "${JUDGE_MAX_MODEL_LEN:-}" ]; then cmd+=(--max-model-len "$JUDGE_MAX_MODEL_LEN"); fi
    ;;
  "") die "no role given: --role trainer | rollout | answerer | judge" ;;
  *) die "unknown role '$role': expected trainer | rollout | answerer | judge" ;;
esac
cmd+=("${extra[@]}")

cd "$ROOT"
if [ "$dry_run" = 1 ]; then
  echo "cd $(printf '%q' "$ROOT")"
  printf '%q ' "${cmd[@]}" | sed 's/ $//'
  echo
  exit 0
fi
command -v "${cmd[0]}" >/dev/null || die "'${cmd[0]}' is not on PATH (activate the environment)"
exec "${cmd[@]}"
