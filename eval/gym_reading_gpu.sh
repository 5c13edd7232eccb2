#!/usr/bin/env bash
# The reading gym on one lent GPU (no network, minutes of device time): several runs of a rung
# trained side by side, each under a wall-clock budget (epochs.max_minutes: it stops, saves and
# validates), then one evaluation on test users; the results and the averaged checkpoints'
# adapters are packed into $GYM_OUT.
#
#   bash eval/gym_reading_gpu.sh SIZE MINUTES RUN[=SET,SET...] ...
#   bash eval/gym_reading_gpu.sh medium 4 outcome_kl \
#       outcome_kl+b32=grpo.per_device_train_batch_size=2048,grpo.learning_rate=1e-3
#
# A RUN is a recipe of eval/gym_reading.py, or RECIPE+VARIANT with its overrides. The rung's
# data must be built already (outputs/gym_reading/SIZE-marker/data, copied from where it was
# built: the same bytes the CPU runs read). A tree without git names its commit in
# MEMSIFTER_CODE_VERSION. GYM_PER_USER (default 2) test questions a user.
set -euo pipefail
cd "$(dirname "$0")/.."
size=$1 minutes=$2
shift 2
out=${GYM_OUT:-outputs/gym_reading/gpu}
mkdir -p "$out"
rung=outputs/gym_reading/$size-marker
[ -f "$rung/data/prompt_spec.json" ] || { echo "no data in $rung/data" >&2; exit 2; }
nvidia-smi -L 2>/dev/null || echo "no GPU here"
names=()
pids=()
for spec in "$@"; do
  name=${spec%%=*}
  sets=(--set "epochs.max_minutes=$minutes" --set threads=4)
  if [ "$name" != "$spec" ]; then
    IFS=, read -ra extra <<<"${spec#*=}"
    for s in "${extra[@]}"; do sets+=(--set "$s"); done
  fi
  names+=(--recipe "$name")
  # max_steps is the plan (far past the budget): the budget stops each run
  python3 eval/gym_reading.py --size "$size" --head-read marker --stage train \
    --recipe "$name" --max-steps 5000 "${sets[@]}" >"$out/train_${name}.log" 2>&1 &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
tail -n 3 "$out"/train_*.log
[ $status = 0 ] || { echo "a training run failed" >&2; exit 1; }
python3 eval/gym_reading.py --size "$size" --head-read marker --stage eval "${names[@]}" \
  --per-user "${GYM_PER_USER:-2}" 2>&1 | tee "$out/eval.log" | tail -n 60
# What comes back: the committed results, the rung's records, and each run's averaged adapters.
tar czf "$out/results.tgz" eval/results/gym_reading.json eval/results/gym_reading.md \
  "eval/results/gym_reading_runs/$size-marker" "$rung/rung.json" "$rung/eval" \
  $(ls -d "$rung"/train/*/result.json "$rung"/train/*/run_state.json \
    "$rung"/train/*/epoch-0/validation.json 2>/dev/null)
python3 - "$rung" "$out" <<'EOF'
import json, sys, tarfile
from pathlib import Path

rung, out = Path(sys.argv[1]), Path(sys.argv[2])
for run in sorted((rung / "train").iterdir()):
    state = run / "run_state.json"
    if not state.is_file():
        continue
    tops = [c for e in json.loads(state.read_text()).values() if isinstance(e, dict)
            for c in e.get("top", [])]
    with tarfile.open(out / f"adapters_{run.name}.tgz", "w:gz") as tar:
        for c in tops:
            for f in ("adapter_model.safetensors", "adapter_config.json", "prompt_spec.json"):
                p = run / "epoch-0" / c / f
                if p.is_file():
                    tar.add(p)
EOF
ls -la "$out"
