#!/usr/bin/env bash
# ratio_run.sh: gpc train against the PyTorch reference on one GPU, in turns
# (PyTorch, gpc, PyTorch, gpc, ...), so that a drift of the GPU's speed over
# the call (its temperature, at the power cap) falls on both alike:
#
#   bench/ratio_run.sh [BUILD]     (BUILD: a CUDA build with gpc, default
#                                   build-gpu, which scripts/gpu-check.sh
#                                   build makes)
#
# Environment: TURNS (default 2: each side runs this often), STEPS (timed
# steps a run, default 10), TORCH_REF (the PyTorch script, default
# bench/reference/gpt2_torch.py), OUT (folder for the logs, default
# ./gpu-out).
# Each run is GPT-2 124M, micro-batch 64 x 1024, 524,288 tokens a step, bf16:
# `gpc train` through bench/train_run.sh (the data loader included) and
# bench/reference/gpt2_torch.py. Prints each run's tokens/s, then each side's
# median over its runs and their ratio.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-gpu}
turns=${TURNS:-2} steps=${STEPS:-10}
out=${OUT:-$root/gpu-out}
for v in "TURNS=$turns" "STEPS=$steps"; do
  [[ ${v#*=} =~ ^[1-9][0-9]{0,2}$ ]] ||
    { echo "ratio_run: $v is not a whole number from 1 to 999" >&2; exit 2; }
done
[[ -x $build/gpc ]] || { echo "ratio_run: $build/gpc is missing; build first" >&2; exit 1; }
mkdir -p "$out"
log=$out/ratio-run.log
: >"$log"
for ((t = 1; t <= turns; t++)); do
  line=$(timeout 420 python3 "${TORCH_REF:-$root/bench/reference/gpt2_torch.py}" --steps "$steps" 2>&1 |
    tee -a "$out/torch.log" | grep '^RESULT torch ')
  echo "turn $t torch ${line:-(no result: see $out/torch.log)}" | tee -a "$log"
  line=$("$root/bench/train_run.sh" "$build/gpc" "$out/gpc-train.log" "$steps" 2>&1 | grep '^RESULT')
  echo "turn $t gpc ${line:-(no result: see $out/gpc-train.log)}" | tee -a "$log"
done
python3 - "$log" <<'PY'
import re, statistics, sys
torch, gpc = [], []
for line in open(sys.argv[1]):
    m = re.search(r"(torch|gpc) RESULT \S+ tokens_per_s=([0-9.]+)", line)
    if m:
        (torch if m.group(1) == "torch" else gpc).append(float(m.group(2)))
if not torch or not gpc:
    sys.exit("ratio_run: a side has no result")
t, g = statistics.median(torch), statistics.median(gpc)
print(f"PyTorch {t:,.0f} tokens/s ({', '.join(f'{v:,.0f}' for v in torch)})")
print(f"gpc train {g:,.0f} tokens/s ({', '.join(f'{v:,.0f}' for v in gpc)})")
print(f"ratio gpc/PyTorch {g / t:.3f} (per turn: {', '.join(f'{b / a:.3f}' for a, b in zip(torch, gpc))})")
PY
