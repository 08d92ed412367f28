#!/usr/bin/env bash
# gpu-check.sh: everything gpc needs to check on a GPU machine, in one call:
# build, the GPU tests, compute-sanitizer (memcheck over the op tests,
# racecheck over the attention kernels), then the benchmarks
# (bench/gpt2_train.sh). Logs go to $OUT (or ./gpu-out); the last lines
# printed are the summary.
#
#   scripts/gpu-check.sh [all|test|quick|bench|build]
#
# build: only the build, into build-gpu. quick: the build, the GPU tests once
# with the defaults and memcheck over the op tests (about a third of test's
# device time, for a call that also measures something).
#
# The single-GPU tests take about 580 s on an H200 (2026-12-04; the op tests
# and their variants about 220 of it), more than a 10-minute call leaves
# after the build. TESTS (a ctest -R pattern, default ^gpu_) and
# TESTS_EXCLUDE (ctest -E) pick a part, TEST_TIMEOUT (default 900 s) bounds
# it; two calls cover them all:
#   TESTS='^gpu_test_cuda_ops' scripts/gpu-check.sh quick
#   TESTS_EXCLUDE='^gpu_test_cuda_ops' scripts/gpu-check.sh quick
#
# The GPU machine lacks some -dev packages gpc builds against (cmocka,
# jansson, and possibly OpenBLAS). If .deps/cuda/ holds their Debian packages
# (fetch them with: mkdir -p .deps/cuda && cd .deps/cuda && apt-get download
# libcmocka-dev libcmocka0 libjansson-dev libjansson4 libopenblas0-pthread
# libopenblas-pthread-dev libopenblas-dev libopenblas0 libgfortran5), they are
# unpacked into a private prefix and used only for what the machine is
# missing (scripts/gpu-deps.sh).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mode=${1:-all}
case $mode in all | test | quick | bench | build) ;; *)
  echo "gpu-check: unknown mode '$mode': use all, test, quick, bench or build" >&2; exit 2 ;;
esac
final=${OUT:-$root/gpu-out}
out=/tmp/gpc-gpu-out
build=$root/build-gpu
rm -rf "$out"
mkdir -p "$final"
pack() { cp "$summary" "$final/summary.txt"; tar czf "$final/logs.tgz" -C "$out" .; }
trap pack EXIT
mkdir -p "$out"
summary=$out/summary.txt
: >"$summary"
note() { echo "$@" | tee -a "$summary"; }

{ nvidia-smi; nvcc --version; cmake --version | head -1; } >"$out/machine.txt" 2>&1
note "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"

source "$root/scripts/gpu-deps.sh" "$root"
[[ -n $gpu_deps_taken ]] && note "from .deps/cuda:$gpu_deps_taken"

start=$(date +%s)
if ! { cmake -S . -B "$build" -DGPC_ENABLE_SCHED=OFF -DCMAKE_BUILD_TYPE=Release &&
       cmake --build "$build" -j16; } >"$out/build.log" 2>&1; then
  note "build: FAILED"; grep -E "error|Error" "$out/build.log" | head -30 | tee -a "$summary"; exit 1
fi
note "build: ok ($(( $(date +%s) - start )) s)"

if [[ $mode == all || $mode == test || $mode == quick ]]; then
  exclude=()
  [[ -n ${TESTS_EXCLUDE:-} ]] && exclude=(-E "$TESTS_EXCLUDE")
  (cd "$build" && timeout "${TEST_TIMEOUT:-900}" ctest -R "${TESTS:-^gpu_}" "${exclude[@]}" \
    --output-on-failure) >"$out/tests.log" 2>&1
  [[ $? == 124 ]] && note "gpu tests: cut by TEST_TIMEOUT (${TEST_TIMEOUT:-900} s)"
  note "gpu tests: $(grep -E 'tests passed|tests failed' "$out/tests.log")"
  grep -E "FAILED|Failed|error|relative error|seed" "$out/tests.log" | head -40 | tee -a "$summary"
fi
if [[ $mode == quick ]]; then
  GPC_TEST_SEED=12345 timeout 150 compute-sanitizer --tool memcheck --leak-check no --error-exitcode 9 \
    "$build/tests/gpu_test_cuda_ops" >"$out/memcheck.log" 2>&1
  note "memcheck over gpu_test_cuda_ops: exit $? $(grep 'ERROR SUMMARY' "$out/memcheck.log" | tail -1)"
fi
if [[ $mode == all || $mode == test ]]; then
  # the same tests with the GEMM algorithms picked by timing (GPC_MATMUL_TUNE=1)
  (cd "$build" && GPC_MATMUL_TUNE=1 timeout 300 ctest -R '^gpu_test_cuda_(ops|model)' --output-on-failure) >"$out/tests-tune.log" 2>&1
  note "gpu tests with GPC_MATMUL_TUNE=1: $(grep -E 'tests passed|tests failed' "$out/tests-tune.log")"
  # cuDNN's engines picked by energy at the power limit (GPC_CUDNN_TUNE=energy),
  # measured briefly here: the path runs, the values stay right
  (cd "$build" && GPC_CUDNN_TUNE=energy GPC_CUDNN_TUNE_ENERGY_S=0.05 GPC_LOG=info timeout 300 ctest -V -R '^gpu_test_cuda_cudnn') >"$out/tests-cudnn-energy.log" 2>&1
  note "gpu tests with GPC_CUDNN_TUNE=energy: $(grep -E 'tests passed|tests failed' "$out/tests-cudnn-energy.log")"
  grep -m2 "engine candidates, each run back to back" "$out/tests-cudnn-energy.log" | cut -c1-300 | tee -a "$summary"
  # the qkv bias gradient summed whole (GPC_QKV_BIAS_DERIVED=0) instead of its
  # key and value thirds derived: the whole model on the GPU against the CPU
  (cd "$build" && GPC_QKV_BIAS_DERIVED=0 timeout 300 ctest -R '^gpu_test_cuda_(model|curve)' --output-on-failure) >"$out/tests-qkvb.log" 2>&1
  note "gpu tests with GPC_QKV_BIAS_DERIVED=0: $(grep -E 'tests passed|tests failed' "$out/tests-qkvb.log")"
  grep -E "FAILED|Failed|relative error" "$out/tests-qkvb.log" | head -20 | tee -a "$summary"
  # and with the one-kernel attention backward (GPC_ATTENTION_BWD=fused)
  (cd "$build" && GPC_ATTENTION_BWD=fused timeout 300 ctest -R '^gpu_test_cuda_(ops|model|curve)' --output-on-failure) >"$out/tests-fused.log" 2>&1
  note "gpu tests with GPC_ATTENTION_BWD=fused: $(grep -E 'tests passed|tests failed' "$out/tests-fused.log")"
  grep -E "FAILED|Failed|relative error" "$out/tests-fused.log" | head -20 | tee -a "$summary"
  GPC_ATTENTION_BWD=fused GPC_TEST_FILTER='*attention*' timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 \
    "$build/tests/gpu_test_cuda_ops" >"$out/racecheck-fused.log" 2>&1
  note "racecheck, fused attention backward: exit $? $(grep 'RACECHECK SUMMARY\|ERROR SUMMARY' "$out/racecheck-fused.log" | tail -1)"
  # and with the wgmma backward on gpc's path too (GPC_ATTENTION_BWD=wgmma;
  # under auto it is the default, after cuDNN's forward)
  (cd "$build" && GPC_ATTENTION_BWD=wgmma timeout 300 ctest -R '^gpu_test_cuda_(ops|model|curve)$' --output-on-failure) >"$out/tests-wgmma.log" 2>&1
  note "gpu tests with GPC_ATTENTION_BWD=wgmma: $(grep -E 'tests passed|tests failed' "$out/tests-wgmma.log")"
  grep -E "FAILED|Failed|relative error" "$out/tests-wgmma.log" | head -20 | tee -a "$summary"
  GPC_ATTENTION_BWD=wgmma GPC_TEST_FILTER='*attention*' timeout 150 compute-sanitizer --tool memcheck --leak-check no --error-exitcode 9 \
    "$build/tests/gpu_test_cuda_ops" >"$out/memcheck-wgmma.log" 2>&1
  note "memcheck, wgmma attention backward: exit $? $(grep 'ERROR SUMMARY' "$out/memcheck-wgmma.log" | tail -1)"
  GPC_ATTENTION_BWD=wgmma GPC_TEST_FILTER='*attention_tensor*' timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 \
    "$build/tests/gpu_test_cuda_ops" >"$out/racecheck-wgmma.log" 2>&1
  note "racecheck, wgmma attention backward: exit $? $(grep 'RACECHECK SUMMARY\|ERROR SUMMARY' "$out/racecheck-wgmma.log" | tail -1)"
  export GPC_TEST_SEED=12345
  timeout 150 compute-sanitizer --tool memcheck --leak-check no --error-exitcode 9 \
    "$build/tests/gpu_test_cuda_ops" >"$out/memcheck.log" 2>&1
  note "memcheck over gpu_test_cuda_ops: exit $? ($(grep -c 'Invalid\|ERROR SUMMARY: [1-9]' "$out/memcheck.log") error lines) $(grep 'ERROR SUMMARY' "$out/memcheck.log" | tail -1)"
  for t in gpu_test_cuda_cudnn gpu_test_pipeline gpu_test_cuda_md_split; do
    timeout 200 compute-sanitizer --tool memcheck --leak-check no --error-exitcode 9 \
      "$build/tests/$t" >"$out/memcheck-$t.log" 2>&1
    note "memcheck over $t: exit $? $(grep 'ERROR SUMMARY' "$out/memcheck-$t.log" | tail -1)"
  done
  GPC_TEST_FILTER='*attention*' timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 \
    "$build/tests/gpu_test_cuda_ops" >"$out/racecheck.log" 2>&1
  note "racecheck over the attention tests: exit $? $(grep 'RACECHECK SUMMARY\|ERROR SUMMARY' "$out/racecheck.log" | tail -1)"
  # the fused head's product in single blocks (GPC_HEAD_CLUSTER=0; clusters of
  # two are the default), its blocks walking several tiles in the second case
  GPC_HEAD_CLUSTER=0 GPC_TEST_FILTER='*classifier*' timeout 150 compute-sanitizer --tool memcheck --leak-check no \
    --error-exitcode 9 "$build/tests/gpu_test_cuda_ops" >"$out/memcheck-head-single.log" 2>&1
  note "memcheck over the fused head in single blocks (GPC_HEAD_CLUSTER=0): exit $? $(grep 'ERROR SUMMARY' "$out/memcheck-head-single.log" | tail -1)"
  # the GELU products through cuBLASLt's epilogues instead of gpc's own
  # Hopper products (the default on an H100/H200, which memcheck saw above)
  GPC_GEMM_SM90=0 GPC_TEST_FILTER='*gelu*' timeout 150 compute-sanitizer --tool memcheck --leak-check no \
    --error-exitcode 9 "$build/tests/gpu_test_cuda_ops" >"$out/memcheck-gelu-cublaslt.log" 2>&1
  note "memcheck over the GELU products with GPC_GEMM_SM90=0: exit $? $(grep 'ERROR SUMMARY' "$out/memcheck-gelu-cublaslt.log" | tail -1)"
  # md split over two processes, both slabs on this GPU: each rank's kernels
  # under memcheck, then racecheck (the sums' shared memory)
  for tool in memcheck racecheck; do
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent= timeout 300 \
      mpirun --oversubscribe --bind-to none -np 2 compute-sanitizer --tool $tool --error-exitcode 9 \
      "$build/tests/mpi_test_md" cuda >"$out/$tool-md-split.log" 2>&1
    note "$tool over the split md (2 processes, one GPU): exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$tool-md-split.log" | sort | uniq -c | tr '\n' ' ')"
  done
  unset GPC_TEST_SEED
fi

if [[ $mode == all || $mode == bench ]]; then
  # generation: kept keys and values against the window recomputed, d12, bf16
  GPC=$build/gpc DEVICE=cuda MODEL=d12 timeout 300 bench/generate.sh >"$out/generate.log" 2>&1
  note "generation (d12, context 1024): exit $? $(grep -E 'tokens/s:|speed-up|texts' "$out/generate.log" | tr '\n' ' ')"
  OUT=$out bench/gpt2_train.sh "$build" >"$out/bench-run.log" 2>&1
  sed -n '/== summary/,$p' "$out/bench-run.log" >>"$summary"
  grep RESULT "$out/bench.log" >>"$summary"
fi
echo "==== summary"
cat "$summary"
