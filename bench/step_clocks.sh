#!/usr/bin/env bash
# step_clocks.sh: gpc's GPT-2 training step beside PyTorch's at one shape,
# in one call, with the GPU's SM clock and power sampled through each run,
# and where each step's GPU time goes.
#
#   bench/step_clocks.sh [BUILD_DIR] [MODEL]     (default build-gpu, d36)
#
# MODEL is d12, d24, d36 or d48. BATCH (16), ACCUM (4), CONTEXT (1024) and
# STEPS (4) set the runs: bench_gpt2_step (the library's step, no data
# loader) and bench/reference/gpt2_torch.py (torch.compile, flash SDPA,
# bf16 autocast, fused AdamW), each timed after its warm-up steps while
# nvidia-smi samples the SM clock and the power every 100 ms. Then, not
# timed: gpc's step again under GPC_CUDA_PROFILE=1 (GPU time by op), and
# PyTorch's --profile step (GPU time by kernel family, its longest
# kernels). Prints
#   RESULT gpc ... / RESULT torch ...    tokens/s of the median step
#   CLOCKS gpc|torch: N samples, SM M MHz, P W   means over the samples
#                                                above 400 W (the steps)
# then both profiles. Logs go to $OUT (default ./gpu-out).
set -uo pipefail
export PYTHONUNBUFFERED=1
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-gpu}
model=${2:-d36}
out=${OUT:-$root/gpu-out}
batch=${BATCH:-16} accum=${ACCUM:-4} context=${CONTEXT:-1024} steps=${STEPS:-4}
for v in BATCH=$batch ACCUM=$accum CONTEXT=$context STEPS=$steps; do
  [[ ${v#*=} =~ ^[1-9][0-9]{0,5}$ ]] ||
    { echo "step_clocks: ${v%%=*} needs a whole number from 1 to 999999, not '${v#*=}'" >&2; exit 2; }
done
case $model in
d12) L=12 NH=12 C=768 ;;
d24) L=24 NH=16 C=1024 ;;
d36) L=36 NH=20 C=1280 ;;
d48) L=48 NH=25 C=1600 ;;
*) echo "step_clocks: unknown model '$model': use d12, d24, d36 or d48" >&2; exit 2 ;;
esac
step=$build/bench/bench_gpt2_step
[[ -x $step ]] || { echo "step_clocks: $step not found: build gpc with CUDA into $build first" >&2; exit 2; }
command -v nvidia-smi >/dev/null || { echo "step_clocks: nvidia-smi not found" >&2; exit 2; }
mkdir -p "$out"

# Runs "$@" (output to $out/$tag.log) while nvidia-smi samples into
# $out/$tag-clocks.csv; prints the RESULT line and the CLOCKS line.
sampled() {
  local tag=$1 smi
  shift
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader,nounits -lms 100 \
    >"$out/$tag-clocks.csv" &
  smi=$!
  "$@" >"$out/$tag.log" 2>&1
  local rc=$?
  kill $smi 2>/dev/null
  wait $smi 2>/dev/null
  grep '^RESULT' "$out/$tag.log" || { echo "RESULT $tag failed (exit $rc):"; tail -5 "$out/$tag.log"; }
  awk -F', ' -v tag="$tag" '$3 > 400 { n++; c += $2; p += $3 }
    END { if (n) printf "CLOCKS %s: %d samples, SM %.0f MHz, %.0f W\n", tag, n, c / n, p / n;
          else printf "CLOCKS %s: no samples above 400 W\n", tag }' "$out/$tag-clocks.csv"
}

gpc_args=(--depth $L --batch $batch --accum $accum --context $context --warmup 2)
torch_args=(--depth $L --heads $NH --channels $C --context $context --batch $batch
  --total-batch $((batch * context * accum)) --warmup 3)
sampled gpc timeout 300 "$step" "${gpc_args[@]}" --steps $steps
sampled torch timeout 500 python3 "$root/bench/reference/gpt2_torch.py" "${torch_args[@]}" --steps $steps

GPC_CUDA_PROFILE=1 timeout 300 "$step" "${gpc_args[@]}" --steps 3 >"$out/gpc-profile.log" 2>&1
sed -n '/^per-op GPU time/,$p' "$out/gpc-profile.log"
timeout 500 python3 "$root/bench/reference/gpt2_torch.py" "${torch_args[@]}" --steps 1 --profile 1 \
  >"$out/torch-profile.log" 2>&1
grep -E '^(PROFILE|KERNEL)' "$out/torch-profile.log"
