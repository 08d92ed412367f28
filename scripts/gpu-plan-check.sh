#!/usr/bin/env bash
# gpu-plan-check.sh: checks `gpc plan` against the peak GPU memory that
# `gpc train --device cuda` really uses, for d12 and d24 at several
# micro-batches (T = 1024, bf16). The peak is the process's used memory as
# nvidia-smi reports it (CUDA context included, as the plan counts it),
# sampled every 100 ms over a few training steps. Prints a table and exits 1
# when any plan is more than 10% off the measurement.
#
#   scripts/gpu-plan-check.sh [BUILD_DIR]      (default: build)
set -euo pipefail
build=${1:-build}
gpc="$build/gpc"
[[ -x "$gpc" ]] || { echo "gpu-plan-check: error: $gpc not found; run make first" >&2; exit 2; }
command -v nvidia-smi >/dev/null || { echo "gpu-plan-check: error: no nvidia-smi: this needs a GPU machine" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$gpc" data synth --vocab 50257 --tokens 20000000 --out "$work/data" >/dev/null
cases=${GPC_PLAN_CASES:-"d12:8 d12:16 d12:32 d24:4 d24:8 d24:16"}
printf "%-6s %6s %14s %14s %8s\n" model batch "plan MiB" "measured MiB" "off"
status=0
for c in $cases; do
  model=${c%%:*}
  batch=${c##*:}
  "$gpc" plan --model "$model" --batch "$batch" --context 1024 --precision bf16 \
    --json "$work/plan.json" >/dev/null
  plan=$(python3 -c "import json; print(json.load(open('$work/plan.json'))['total'])")
  "$gpc" train --data "$work/data" --out "$work/run-$c" --model "$model" --batch "$batch" \
    --context 1024 --steps 4 --eval-every 0 --checkpoint-every 0 --device cuda \
    --precision bf16 >"$work/train.log" 2>&1 &
  pid=$!
  peak=0
  while kill -0 "$pid" 2>/dev/null; do
    used=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits |
      awk -F', *' -v p="$pid" '$1 == p {print $2}')
    [[ -n "$used" && "$used" -gt "$peak" ]] && peak=$used
    sleep 0.1
  done
  if ! wait "$pid"; then
    echo "gpu-plan-check: gpc train $model batch $batch failed:" >&2
    tail -5 "$work/train.log" >&2
    status=1
    continue
  fi
  python3 - "$model" "$batch" "$plan" "$peak" <<'PY' || status=1
import sys
model, batch, plan, peak = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
plan_mib = plan / 2**20
off = (plan_mib - peak) / peak if peak else float("inf")
print("%-6s %6d %14.0f %14d %+7.1f%%" % (model, batch, plan_mib, peak, 100 * off))
sys.exit(0 if abs(off) <= 0.10 else 1)
PY
done
[[ $status -eq 0 ]] && echo "gpc plan agrees with every measured peak within 10%" ||
  echo "gpc plan is more than 10% off (or a run failed): see the table" >&2
exit $status
