#!/usr/bin/env bash
# ab_step.sh: the GPT-2 124M training step of two builds of gpc, measured in
# turn on one GPU, so that a drift of the GPU's speed over the call falls on
# both alike.
#
#   bench/ab_step.sh A_SOURCE [B_BUILD]
#
# A_SOURCE is a source tree of the baseline (for instance an older commit,
# `git archive OLD | tar -x -C a`); it is built into A_SOURCE/build-a unless
# that already holds bench/bench_gpt2_step. B_BUILD is the build of the
# change (default build-gpu of this tree, built by scripts/gpu-check.sh build).
# Environment: STEPS (timed steps a run, default 6), ROUNDS (default 3),
# OUT (folder for the log, default ./gpu-out).
#
# Each round runs bench_gpt2_step of A, then of B (d12, B=64, T=1024, 524,288
# tokens a step, bf16). The summary prints each one's tokens/s a round, the
# medians, and B's median over A's.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
root=$(cd "$(dirname "$0")/.." && pwd)
usage() { echo "usage: bench/ab_step.sh A_SOURCE [B_BUILD]" >&2; exit 2; }
[[ $# -ge 1 && $# -le 2 ]] || usage
a_src=$(cd "$1" 2>/dev/null && pwd) || { echo "ab_step: no source tree at '$1'" >&2; exit 2; }
b_build=${2:-$root/build-gpu}
steps=${STEPS:-6} rounds=${ROUNDS:-3}
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
log=$out/ab-step.log
: >"$log"
[[ -x $b_build/bench/bench_gpt2_step ]] || { echo "ab_step: $b_build/bench/bench_gpt2_step is not built" >&2; exit 2; }
a_build=$a_src/build-a
if [[ ! -x $a_build/bench/bench_gpt2_step ]]; then
  echo "ab_step: building A in $a_build" | tee -a "$log"
  { cmake -S "$a_src" -B "$a_build" -DGPC_ENABLE_SCHED=OFF -DCMAKE_BUILD_TYPE=Release &&
    cmake --build "$a_build" -j"$(nproc)" --target bench_gpt2_step; } >"$out/ab-build.log" 2>&1 ||
    { tail -20 "$out/ab-build.log"; exit 1; }
fi
for ((round = 1; round <= rounds; round++)); do
  for side in A B; do
    build=$a_build
    [[ $side == B ]] && build=$b_build
    line=$(timeout 300 "$build/bench/bench_gpt2_step" --steps "$steps" 2>&1 | grep '^RESULT gpc ')
    echo "round $round $side ${line:-(no result)}" | tee -a "$log"
  done
done
python3 - "$log" <<'PY'
import re, statistics, sys
runs = {"A": [], "B": []}
for line in open(sys.argv[1]):
    m = re.match(r"round \d+ ([AB]) RESULT gpc tokens_per_s=([0-9.]+)", line)
    if m:
        runs[m.group(1)].append(float(m.group(2)))
for side, v in runs.items():
    print(f"{side}: " + ", ".join(f"{x:,.0f}" for x in v) +
          (f"; median {statistics.median(v):,.0f} tokens/s" if v else "; no runs"))
if runs["A"] and runs["B"]:
    wins = sum(b > a for a, b in zip(runs["A"], runs["B"]))
    print(f"B / A: {statistics.median(runs['B']) / statistics.median(runs['A']):.4f}x "
          f"(B faster in {wins} of {min(len(runs['A']), len(runs['B']))} rounds)")
PY
