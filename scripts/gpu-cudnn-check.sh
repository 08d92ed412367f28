#!/usr/bin/env bash
# gpu-cudnn-check.sh: cuDNN's attention path on a GPU machine, in one call:
# build (cuDNN's headers found by CMake, libcudnn opened at run time), the
# cuDNN test (tests/gpu/test_cuda_cudnn.c) with cuDNN's own error log on,
# the op and model tests, then the timings that decide auto's choice:
# bench_attention_bench (both paths at B=64 T=1024 NH=12 hs=64 bf16),
# `gpc bench attention`, and the GPT-2 step through the model API with each
# path. Logs go to $OUT (or ./gpu-out); the last lines printed are the
# summary.
#
#   scripts/gpu-cudnn-check.sh [all|test|bench]
#
# Like scripts/gpu-check.sh, it unpacks .deps/cuda/*.deb (cmocka, OpenBLAS)
# into a private prefix when the machine lacks them.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mode=${1:-all}
final=${OUT:-$root/gpu-out}
out=/tmp/gpc-cudnn-out
build=$root/build-gpu
rm -rf "$out"
mkdir -p "$final" "$out"
summary=$out/summary.txt
: >"$summary"
pack() { cp "$summary" "$final/summary.txt"; tar czf "$final/cudnn-logs.tgz" -C "$out" .; }
trap pack EXIT
note() { echo "$@" | tee -a "$summary"; }

note "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
note "cudnn headers: $(ls /usr/include/x86_64-linux-gnu/cudnn_version*.h /usr/include/cudnn_version*.h 2>/dev/null | head -2 | tr '\n' ' ')"
note "cudnn library: $(ldconfig -p | grep -o 'libcudnn.so.9 .*' | head -1)"
note "nvrtc: $(ldconfig -p | grep -o 'libnvrtc.so[.0-9]*' | head -1; ls /usr/local/cuda/lib64/libnvrtc.so* 2>/dev/null | head -1)"

source "$root/scripts/gpu-deps.sh" "$root"
[[ -n $gpu_deps_taken ]] && note "from .deps/cuda:$gpu_deps_taken"

start=$(date +%s)
targets="gpc_cli gpu_test_cuda_cudnn gpu_test_cuda_ops gpu_test_cuda_model test_ops_errors bench_attention_bench bench_gpt2_step"
if ! { cmake -S . -B "$build" -DGPC_ENABLE_SCHED=OFF -DCMAKE_BUILD_TYPE=Release &&
       cmake --build "$build" -j16 --target $targets; } >"$out/build.log" 2>&1; then
  note "build: FAILED"; grep -E "error|Error" "$out/build.log" | head -30 | tee -a "$summary"; exit 1
fi
note "build: ok ($(( $(date +%s) - start )) s); $(grep 'gpc: cuDNN\|cudnn.h' "$out/build.log" | head -1)"

if [[ $mode == all || $mode == test ]]; then
  # cuDNN explains rejected graphs on stderr with these
  CUDNN_LOGERR_DBG=1 CUDNN_LOGDEST_DBG=stderr GPC_LOG=debug timeout 300 \
    "$build/tests/gpu_test_cuda_cudnn" >"$out/test-cudnn.log" 2>&1
  note "gpu_test_cuda_cudnn: exit $?"
  grep -E "^\[  (PASSED|FAILED) |FAILED|error|relative error|cuDNN [0-9]|test seed|step [0-9]|attention (forward|backward) B=|engine" \
    "$out/test-cudnn.log" | grep -v "CUDNN_BACKEND" | head -40 | tee -a "$summary"
  timeout 200 "$build/tests/gpu_test_cuda_ops" >"$out/test-ops.log" 2>&1
  note "gpu_test_cuda_ops (gpc's kernels): exit $? $(grep -E '^\[  (PASSED|FAILED)' "$out/test-ops.log" | tr '\n' ' ')"
  timeout 200 "$build/tests/gpu_test_cuda_model" >"$out/test-model.log" 2>&1
  note "gpu_test_cuda_model (auto): exit $? $(grep -E '^\[  (PASSED|FAILED)' "$out/test-model.log" | tr '\n' ' ')"
  "$build/tests/test_ops_errors" >"$out/test-errors.log" 2>&1
  note "test_ops_errors: exit $?"
  # gpc train --attention end to end, each path, a tiny model on random tokens
  "$build/gpc" data synth --vocab 512 --tokens 400000 --out /tmp/gpc-synth >/dev/null 2>&1
  for path in cudnn gpc auto; do
    timeout 120 "$build/gpc" train --data /tmp/gpc-synth --out "/tmp/gpc-run-$path" --model d2 \
      --context 256 --batch 8 --steps 8 --eval-every 0 --device cuda --attention "$path" \
      --seed 3 >"$out/train-$path.log" 2>&1
    note "gpc train --attention $path: exit $? $(grep -E 'trained|cuDNN|error' "$out/train-$path.log" | tr '\n' ' ')"
  done
fi

if [[ $mode == all || $mode == bench ]]; then
  timeout 120 "$build/bench/bench_attention_bench" --reps 20 >"$out/attention-bench.log" 2>&1
  note "bench_attention_bench: exit $?"
  grep RESULT "$out/attention-bench.log" | tee -a "$summary"
  timeout 120 "$build/gpc" bench attention --device cuda >"$out/gpc-bench.log" 2>&1
  note "gpc bench attention: exit $?"
  grep -E "attention|--" "$out/gpc-bench.log" | tee -a "$summary"
  for path in gpc cudnn; do
    GPC_ATTENTION=$path timeout 150 "$build/bench/bench_gpt2_step" --steps 4 --warmup 2 \
      >"$out/step-$path.log" 2>&1
    note "bench_gpt2_step GPC_ATTENTION=$path: exit $? $(grep RESULT "$out/step-$path.log")"
  done
fi
echo "==== summary"
cat "$summary"
