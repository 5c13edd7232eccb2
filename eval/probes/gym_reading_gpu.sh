#!/usr/bin/env bash
# The reading gym on one lent GPU (no network, minutes of device time): several runs of a rung
# trained side by side, each under a wall-clock budget (epochs.max_minutes: it stops, saves and
# validates), then one evaluation on test users. The records, the averaged checkpoints'
# adapters and the results are packed into $GYM_OUT (GYM_EVAL_SECONDS bounds the evaluation).
#
#   bash eval/probes/gym_reading_gpu.sh SIZE MINUTES RUN[=SET,SET...] ...
#   bash eval/probes/gym_reading_gpu.sh medium 4 outcome_kl \
#       outcome_kl+b32=grpo.per_device_train_batch_size=2048,grpo.learning_rate=1e-3
#
# A RUN is a recipe of eval/probes/gym_reading.py, or RECIPE+VARIANT with its overrides. The rung's
# data must be built already (outputs/gym_reading/SIZE-marker/data, or SIZE-LAYOUT-marker/data
# with GYM_LAYOUT=restated (default marked), copied from where it was
# built: the same bytes the CPU runs read). A tree without git names its commit in
# MEMSIFTER_CODE_VERSION. GYM_PER_USER (default 2) test questions a user. Only the packs land
# in $GYM_OUT (a lent machine returns few files): the logs travel inside them.
set -euo pipefail
cd "$(dirname "$0")/../.."
size=$1 minutes=$2
shift 2
out=${GYM_OUT:-outputs/gym_reading/gpu}
mkdir -p "$out"
layout=${GYM_LAYOUT:-marked}
case $layout in
  marked) rung_name=$size-marker ;;
  restated) rung_name=$size-restated-marker ;;
  *) echo "GYM_LAYOUT must be marked or restated (got $layout)" >&2; exit 2 ;;
esac
rung=outputs/gym_reading/$rung_name
logs=$rung/gpu_logs
mkdir -p "$logs"
for f in prompt_spec.json train.parquet train_pool.parquet validation.parquet test.parquet; do
  [ -f "$rung/data/$f" ] || { echo "$rung/data/$f is missing: copy the rung's data" >&2; exit 2; }
done
nvidia-smi -L 2>/dev/null || echo "no GPU here"
# eval/ scripts take typer for their CLI; a lent machine's Python may lack it (carry its wheel).
python3 -c "import typer" 2>/dev/null || {
  echo "python3 cannot import typer: carry its wheels (typer, click, rich, shellingham) and" \
    "pip install --no-index them first" >&2
  exit 2
}
# One pack a run and two more: a lent machine returns at most 8 files.
[ $# -le 6 ] || { echo "at most 6 runs a call ($# given)" >&2; exit 2; }
names=()
pids=()
for spec in "$@"; do
  name=${spec%%=*}
  # fp32 weights as on a CPU (the recipes' bf16 autocast does the matmuls): "auto" would hold
  # bf16 weights on a GPU and step AdamW on them
  sets=(--set "epochs.max_minutes=$minutes" --set threads=4 --set model.dtype=float32)
  if [ "$name" != "$spec" ]; then
    IFS=, read -ra extra <<<"${spec#*=}"
    for s in "${extra[@]}"; do sets+=(--set "$s"); done
  fi
  names+=(--recipe "$name")
  # max_steps is the plan (far past the budget): the budget stops each run
  python3 -m eval.probes.gym_reading --size "$size" --layout "$layout" --head-read marker --stage train \
    --recipe "$name" --max-steps 5000 "${sets[@]}" >"$logs/train_${name}.log" 2>&1 &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
tail -n 3 "$logs"/train_*.log
[ $status = 0 ] || { echo "a training run failed" >&2; exit 1; }

# What comes back, packed as soon as it exists (a call cut at its limit still returns the
# training): each run's records and the adapters it averaged; then the evaluation's results.
pack() {
  python3 - "$rung" "$out" "$rung_name" "$1" "$logs" <<'PY'
import json, sys, tarfile
from pathlib import Path

rung, out, rung_name, what, logs = sys.argv[1:6]
rung, out, logs = Path(rung), Path(out), Path(logs)
runs = [r for r in sorted((rung / "train").iterdir()) if (r / "run_state.json").is_file()]
with tarfile.open(out / f"{what}.tgz", "w:gz") as tar:
    for path in (Path("eval/results/gym_reading/gym_reading.json"), Path("eval/results/gym_reading/gym_reading.md"),
                 Path("eval/results/gym_reading/runs") / rung_name, rung / "rung.json",
                 rung / "eval", logs):
        if path.exists():
            tar.add(path)
    for run in runs:
        for f in ("result.json", "run_state.json", "summary.json", "epoch-0/validation.json",
                  "epoch-0/trainer_state.json"):
            if (run / f).is_file():
                tar.add(run / f)
if what == "train":
    for run in runs:
        state = json.loads((run / "run_state.json").read_text())
        tops = [c for e in state.values() if isinstance(e, dict) for c in e.get("top", [])]
        # a lent machine returns file names of letters, digits, '.', '_' and '-' only
        with tarfile.open(out / f"adapters_{run.name.replace('+', '_')}.tgz", "w:gz") as tar:
            for c in tops:
                for f in ("adapter_model.safetensors", "adapter_config.json", "prompt_spec.json"):
                    if (run / "epoch-0" / c / f).is_file():
                        tar.add(run / "epoch-0" / c / f)
PY
}
pack train
timeout "${GYM_EVAL_SECONDS:-1800}" python3 -m eval.probes.gym_reading --size "$size" \
  --layout "$layout" --head-read marker --stage eval "${names[@]}" --per-user "${GYM_PER_USER:-2}" 2>&1 |
  tee "$logs/eval.log" | tail -n 60
pack results
ls -la "$out"
