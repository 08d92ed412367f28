#!/usr/bin/env bash
# test_ab_step.sh: bench/ab_step.sh without a GPU. Bad arguments are usage
# errors (exit 2) naming what was wrong; with stand-in trees whose
# build-gpu/bench/bench_gpt2_step prints a fixed RESULT line (its rate
# raised by the environment a SOURCE:VAR=VALUE argument sets), the runs go
# round by round in the order given and the summary's medians and ratios are
# those of the printed rates.
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
echo "ab_step: ok"
