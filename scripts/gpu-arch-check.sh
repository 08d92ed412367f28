#!/usr/bin/env bash
# gpu-arch-check.sh: the GPU checks of a change of shape that should change
# no result: the build, every GPU test, cuDNN's energy tuning, the energy
# lines of the attention benchmark, the training flags that replace
# settings, and the ratio against PyTorch. Logs go to $OUT (default
# ./gpu-out); the summary is printed last.
#
#   scripts/gpu-arch-check.sh            (TURNS and STEPS as bench/ratio_run.sh)
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
sum=$out/arch-summary.txt
: >"$sum"
note() { echo "$@" | tee -a "$sum"; }
OUT=$out scripts/gpu-check.sh build >/dev/null 2>&1
note "$(grep -E '^build' "$out/summary.txt")"
b=$root/build-gpu
[[ -x $b/gpc ]] || { tail -20 "$out/summary.txt"; exit 1; }
note "backend registered: $(nm "$b/gpc" | grep -c gpc_cuda_backend_register) symbol(s)"
(cd "$b" && timeout 420 ctest -R '^gpu_' --output-on-failure) >"$out/tests.log" 2>&1
note "gpu tests: $(grep -E 'tests passed|tests failed' "$out/tests.log")"
grep -E '\*\*\*Failed|FAILED' "$out/tests.log" | head -20 | tee -a "$sum"
(cd "$b" && GPC_CUDNN_TUNE=energy GPC_CUDNN_TUNE_ENERGY_S=0.05 GPC_LOG=info timeout 120 \
  ctest -V -R '^gpu_test_cuda_cudnn$') >"$out/cudnn-energy.log" 2>&1
note "cudnn energy tuning: $(grep -E 'tests passed|tests failed' "$out/cudnn-energy.log")"
grep -m1 "engine candidates, each run back to back" "$out/cudnn-energy.log" | cut -c1-240 | tee -a "$sum"
GPC_BENCH_ENERGY_S=1 timeout 120 "$b/bench/bench_attention_bench" --path auto --reps 10 \
  >"$out/attention-energy.log" 2>&1
grep '^RESULT' "$out/attention-energy.log" | cut -c1-240 | tee -a "$sum"
data=/tmp/gpc-arch-data
"$b/gpc" data synth --vocab 50257 --tokens 2000000 --out "$data" >/dev/null 2>&1
for bwd in two wgmma; do
  rm -rf /tmp/gpc-arch-run
  timeout 120 "$b/gpc" train --data "$data" --out /tmp/gpc-arch-run --model d12 --context 1024 \
    --batch 16 --total-batch 16384 --steps 4 --device cuda --precision bf16 --eval-every 0 \
    --checkpoint-every 0 --attention-backward $bwd --stochastic-rounding >"$out/train-$bwd.log" 2>&1
  note "train --attention-backward $bwd: exit $?, last: $(tail -1 /tmp/gpc-arch-run/metrics.jsonl | cut -c1-200)"
done
OUT=$out TURNS=${TURNS:-1} STEPS=${STEPS:-15} timeout 600 bench/ratio_run.sh "$b" 2>&1 | tail -3 | tee -a "$sum"
echo "==== summary"; cat "$sum"
