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
# GPC_CUDA_PROFILE=1: the GPU time of every op family), TRAIN=1 (then each
# tree's `gpc train` once, bench/train_run.sh, the data loader included),
# TORCH=1 (then the PyTorch reference once, bench/reference/gpt2_torch.py,
# or the script TORCH_REF names, and each tree's ratio to it), OUT (folder
# for the logs, default ./gpu-out).
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
bins=() gpcs=()
targets=(bench_gpt2_step) # and gpc itself where TRAIN=1 runs it
[[ ${TRAIN:-0} == 1 ]] && targets+=(gpc_cli)
for i in "${!dirs[@]}"; do
  build=${dirs[$i]}/build-gpu
  if [[ ! -x $build/bench/bench_gpt2_step ]]; then
    build=${dirs[$i]}/build-ab
    echo "ab_step: building ${names[$i]} in $build" | tee -a "$log"
    { cmake -S "${dirs[$i]}" -B "$build" -DGPC_ENABLE_SCHED=OFF -DGPC_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release &&
      cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"; } >"$out/ab-build.log" 2>&1 ||
      { tail -20 "$out/ab-build.log"; exit 1; }
  fi
  bins+=("$build/bench/bench_gpt2_step")
  gpcs+=("$build/gpc")
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
if [[ ${TRAIN:-0} == 1 ]]; then
  for i in "${!gpcs[@]}"; do # each tree makes its own shards, in its own format
    data=${GPC_BENCH_DATA:-/tmp/gpc-bench-data}-ab$i
    rm -f "$data.complete"
    line=$(env ${envs[$i]} GPC_BENCH_DATA="$data" "$root/bench/train_run.sh" "${gpcs[$i]}" \
      "$out/train-$i.log" "$steps" 2>&1 | tail -1)
    echo "train [${names[$i]}] $line" | tee -a "$log"
  done
fi
if [[ ${TORCH:-0} == 1 ]]; then
  line=$(timeout 420 python3 "${TORCH_REF:-$root/bench/reference/gpt2_torch.py}" --steps "$steps" 2>&1 |
    tee "$out/torch.log" | grep '^RESULT torch ')
  echo "torch ${line:-(no result: see $out/torch.log)}" | tee -a "$log"
fi
python3 - "$log" "${names[@]}" <<'PY'
import re, statistics, sys
names = sys.argv[2:]
runs = {n: [] for n in names}
train, torch = {}, None
for line in open(sys.argv[1]):
    m = re.match(r"round \d+ \[(.*)\] RESULT gpc tokens_per_s=([0-9.]+)", line)
    if m and m.group(1) in runs:
        runs[m.group(1)].append(float(m.group(2)))
    m = re.match(r"train \[(.*)\] RESULT gpc_train tokens_per_s=([0-9.]+)", line)
    if m:
        train[m.group(1)] = float(m.group(2))
    m = re.match(r"torch RESULT torch tokens_per_s=([0-9.]+)", line)
    if m:
        torch = float(m.group(1))
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
        if torch:
            text += f", {statistics.median(v) / torch:.3f}x PyTorch"
    if n in train:
        text += f"; gpc train {train[n]:,.0f} tokens/s"
        if torch:
            text += f", {train[n] / torch:.3f}x PyTorch"
    print(f"{n}: {text or 'no runs'}")
if torch:
    print(f"PyTorch: {torch:,.0f} tokens/s")
PY
