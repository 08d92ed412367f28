#!/usr/bin/env bash
# test_ab_step.sh: bench/ab_step.sh (and bench/train_run.sh) without a GPU.
# Bad arguments are usage errors (exit 2) naming what was wrong; with
# stand-in trees whose build-gpu/bench/bench_gpt2_step prints a fixed RESULT
# line (its rate raised by the environment a SOURCE:VAR=VALUE argument sets),
# the runs go round by round in the order given and the summary's medians
# and ratios are those of the printed rates; TRAIN=1 and TORCH=1 add each
# tree's `gpc train` (a stand-in gpc) and a stand-in PyTorch reference;
# bench/ratio_run.sh runs the same stand-ins in turns; scripts/gpu-kernels.sh
# refuses a bad CACHE.
set -euo pipefail
root=${GPC_SOURCE_DIR:?set GPC_SOURCE_DIR to the source tree}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
source "$(dirname "$0")/lib.sh"
ab=$root/bench/ab_step.sh

export OUT=$work/out
expect_exit 2 "usage: bench/ab_step.sh SOURCE SOURCE" bash "$ab" "$work"
expect_exit 2 "no source tree at '$work/missing'" bash "$ab" "$work" "$work/missing"

# two stand-in trees: base prints 600,000 tokens/s, fast 606,000 plus EXTRA
for t in base fast; do
  mkdir -p "$work/$t/build-gpu/bench"
  rate=$([[ $t == base ]] && echo 600000 || echo 606000)
  printf '#!/bin/sh\necho "RESULT gpc tokens_per_s=$((%s + ${EXTRA:-0})) step_ms=1"\n' "$rate" \
    >"$work/$t/build-gpu/bench/bench_gpt2_step"
  chmod +x "$work/$t/build-gpu/bench/bench_gpt2_step"
done
(cd "$work" && ROUNDS=2 bash "$ab" base fast fast:EXTRA=6000) >"$work/ab.txt" 2>&1 ||
  fail "ab_step exited $?: $(cat "$work/ab.txt")"
grep -c '^round ' "$work/out/ab-step.log" | grep -qx 6 || fail "not six runs: $(cat "$work/out/ab-step.log")"
[[ $(grep '^round ' "$work/out/ab-step.log" | awk '{print $2, $3}' | tr '\n' ' ') == \
   "1 [base] 1 [fast] 1 [fast:EXTRA=6000] 2 [base] 2 [fast] 2 [fast:EXTRA=6000] " ]] ||
  fail "run order: $(cat "$work/out/ab-step.log")"
grep -qx 'base: 600,000, 600,000; median 600,000 tokens/s, 1.0000x base' "$work/ab.txt" ||
  fail "base line: $(cat "$work/ab.txt")"
grep -qx 'fast: 606,000, 606,000; median 606,000 tokens/s, 1.0100x base (faster in 2 of 2 rounds)' \
  "$work/ab.txt" || fail "fast line: $(cat "$work/ab.txt")"
grep -qx 'fast:EXTRA=6000: 612,000, 612,000; median 612,000 tokens/s, 1.0200x base (faster in 2 of 2 rounds)' \
  "$work/ab.txt" || fail "fast:EXTRA line: $(cat "$work/ab.txt")"

# TRAIN=1 and TORCH=1: each tree's `gpc train` once (stand-in binaries that
# write RATE + step into metrics.jsonl; train_run.sh takes the median after
# the first three steps) and the PyTorch reference once (a stand-in script),
# with the ratios to it
for t in base fast; do
  rate=$([[ $t == base ]] && echo 620000 || echo 630000)
  cat >"$work/$t/build-gpu/gpc" <<SH
#!/bin/sh
[ "\$1 \$2" = "train --help" ] && exit 0
if [ "\$1 \$2" = "data synth" ]; then
  while [ \$# -gt 0 ]; do [ "\$1" = --out ] && mkdir -p "\$2"; shift; done
  exit 0
fi
out= steps=0
while [ \$# -gt 0 ]; do
  case "\$1" in --out) out=\$2 ;; --steps) steps=\$2 ;; esac
  shift
done
mkdir -p "\$out"
i=0
while [ \$i -lt \$steps ]; do
  echo "{\"step\": \$i, \"tokens_per_s\": \$(($rate + i)), \"loss\": 5.5}" >>"\$out/metrics.jsonl"
  i=\$((i + 1))
done
SH
  chmod +x "$work/$t/build-gpu/gpc"
done
printf 'print("RESULT torch tokens_per_s=500000 step_ms=1")\n' >"$work/torch_ref.py"
(cd "$work" && ROUNDS=1 TRAIN=1 TORCH=1 TORCH_REF="$work/torch_ref.py" GPC_BENCH_DATA="$work/data" \
  bash "$ab" base fast) >"$work/ab2.txt" 2>&1 || fail "ab_step TRAIN/TORCH exited $?: $(cat "$work/ab2.txt")"
grep -qx 'base: 600,000; median 600,000 tokens/s, 1.0000x base, 1.200x PyTorch; gpc train 620,006 tokens/s, 1.240x PyTorch' \
  "$work/ab2.txt" || fail "base line with TRAIN/TORCH: $(cat "$work/ab2.txt")"
grep -qx 'fast: 606,000; median 606,000 tokens/s, 1.0100x base (faster in 1 of 1 rounds), 1.212x PyTorch; gpc train 630,006 tokens/s, 1.260x PyTorch' \
  "$work/ab2.txt" || fail "fast line with TRAIN/TORCH: $(cat "$work/ab2.txt")"
grep -qx 'PyTorch: 500,000 tokens/s' "$work/ab2.txt" || fail "PyTorch line: $(cat "$work/ab2.txt")"
[[ -d $work/data-ab0 && -d $work/data-ab1 ]] || fail "no shards made for each tree: $(ls "$work")"

# scripts/gpu-kernels.sh refuses a CACHE ncu does not take, before it looks for a build
expect_exit 2 "gpu-kernels: CACHE=some is not all or none" env CACHE=some bash "$root/scripts/gpu-kernels.sh" "$work/missing"

# ratio_run.sh: the stand-in PyTorch and the base tree's stand-in gpc in
# turns, each side's median and the ratio; bad TURNS or STEPS and a build
# without gpc are refused
rr=$root/bench/ratio_run.sh
expect_exit 2 "ratio_run: TURNS=x is not a whole number from 1 to 999" env TURNS=x bash "$rr" "$work/base/build-gpu"
expect_exit 2 "ratio_run: STEPS=0 is not a whole number from 1 to 999" env STEPS=0 bash "$rr" "$work/base/build-gpu"
expect_exit 1 "ratio_run: $work/missing/gpc is missing; build first" bash "$rr" "$work/missing"
TURNS=2 STEPS=3 TORCH_REF="$work/torch_ref.py" GPC_BENCH_DATA="$work/data-rr" \
  bash "$rr" "$work/base/build-gpu" >"$work/rr.txt" 2>&1 || fail "ratio_run exited $?: $(cat "$work/rr.txt")"
[[ $(grep -c '^turn ' "$work/out/ratio-run.log") -eq 4 ]] || fail "not four runs: $(cat "$work/out/ratio-run.log")"
grep -qx 'PyTorch 500,000 tokens/s (500,000, 500,000)' "$work/rr.txt" || fail "ratio_run PyTorch line: $(cat "$work/rr.txt")"
grep -qx 'gpc train 620,004 tokens/s (620,004, 620,004)' "$work/rr.txt" || fail "ratio_run gpc line: $(cat "$work/rr.txt")"
grep -qx 'ratio gpc/PyTorch 1.240 (per turn: 1.240, 1.240)' "$work/rr.txt" || fail "ratio_run ratio line: $(cat "$work/rr.txt")"

# train_run.sh on a binary without a train command says so
printf '#!/bin/sh\nexit 1\n' >"$work/nogpc"
chmod +x "$work/nogpc"
expect_exit 1 "has no train command" bash "$root/bench/train_run.sh" "$work/nogpc" "$work/t.log"
expect_exit 2 "usage: bench/train_run.sh GPC LOG" bash "$root/bench/train_run.sh" "$work/nogpc"
echo "ab_step: ok"
