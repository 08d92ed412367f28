#!/usr/bin/env bash
# ab_step.sh: the GPT-2 124M training step of two or more builds of gpc,
# measured in turn on one GPU, so that a drift of the GPU's speed over the
# call falls on all of them alike.
#
#   bench/ab_step.sh SOURCE SOURCE [SOURCE...]
#
# Each SOURCE is a source tree of gpc (this one, or an older commit unpacked
# with `git archive OLD | tar -x -C a`), optionally followed by
# :VAR=VALUE[,VAR=VALUE] for the environment of its runs (`. .:GPC_X=0` is one
# build with and without a setting). A tree's build-gpu is used when it
# holds bench/bench_gpt2_step (scripts/gpu-check.sh build makes it);
# otherwise the tree is built into its build-ab. The first tree is the
# baseline. Environment: STEPS (timed steps a run, default 6), ROUNDS
# (default 3), PROFILE=1 (after the rounds, each tree's step once more with
# GPC_CUDA_PROFILE=1: the GPU time of every op family), OUT (folder for the
# logs, default ./gpu-out).
#
# Each round runs bench_gpt2_step of every tree in the order given (d12,
# B=64, T=1024, 524,288 tokens a step, bf16). The summary prints each tree's
# tokens/s a round, its median, and its median over the baseline's.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
root=$(cd "$(dirname "$0")/.." && pwd)
[[ $# -ge 2 ]] || { echo "usage: bench/ab_step.sh SOURCE SOURCE [SOURCE...]" >&2; exit 2; }
steps=${STEPS:-6} rounds=${ROUNDS:-3}
out=${OUT:-$root/gpu-out}
# every tree checked before anything is built
names=() dirs=() envs=()
for arg in "$@"; do
  src=${arg%%:*} env=
  [[ $arg == *:* ]] && env=${arg#*:}
  dir=$(cd "$src" 2>/dev/null && pwd) || { echo "ab_step: no source tree at '$src'" >&2; exit 2; }
  names+=("$arg") dirs+=("$dir") envs+=("${env//,/ }")
done
mkdir -p "$out"
log=$out/ab-step.log
: >"$log"
bins=()
for i in "${!dirs[@]}"; do
  build=${dirs[$i]}/build-gpu
  if [[ ! -x $build/bench/bench_gpt2_step ]]; then
    build=${dirs[$i]}/build-ab
    echo "ab_step: building ${names[$i]} in $build" | tee -a "$log"
    { cmake -S "${dirs[$i]}" -B "$build" -DGPC_ENABLE_SCHED=OFF -DGPC_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release &&
      cmake --build "$build" -j"$(nproc)" --target bench_gpt2_step; } >"$out/ab-build.log" 2>&1 ||
      { tail -20 "$out/ab-build.log"; exit 1; }
  fi
  bins+=("$build/bench/bench_gpt2_step")
done
for ((round = 1; round <= rounds; round++)); do
  for i in "${!bins[@]}"; do
    line=$(env ${envs[$i]} timeout 300 "${bins[$i]}" --steps "$steps" 2>&1 | grep '^RESULT gpc ')
    echo "round $round [${names[$i]}] ${line:-(no result)}" | tee -a "$log"
  done
done
if [[ ${PROFILE:-0} == 1 ]]; then
  for i in "${!bins[@]}"; do
    echo "== per-op profile [${names[$i]}]" | tee -a "$log"
    env ${envs[$i]} GPC_CUDA_PROFILE=1 timeout 120 "${bins[$i]}" --steps 2 --warmup 1 2>&1 | sed -n '/per-op/,$p' | tee -a "$log"
  done
fi
python3 - "$log" "${names[@]}" <<'PY'
import re, statistics, sys
names = sys.argv[2:]
runs = {n: [] for n in names}
for line in open(sys.argv[1]):
    m = re.match(r"round \d+ \[(.*)\] RESULT gpc tokens_per_s=([0-9.]+)", line)
    if m and m.group(1) in runs:
        runs[m.group(1)].append(float(m.group(2)))
base = runs[names[0]]
for n in names:
    v = runs[n]
    text = ", ".join(f"{x:,.0f}" for x in v)
    if v and base:
        wins = sum(b > a for a, b in zip(base, v))
        text += (f"; median {statistics.median(v):,.0f} tokens/s, "
                 f"{statistics.median(v) / statistics.median(base):.4f}x {names[0]}")
        if n != names[0]:
            text += f" (faster in {wins} of {min(len(v), len(base))} rounds)"
    print(f"{n}: {text or 'no runs'}")
PY
