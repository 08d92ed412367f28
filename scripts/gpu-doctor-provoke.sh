#!/usr/bin/env bash
# gpu-doctor-provoke.sh: provokes on one GPU the failures gpc doctor names
# and records what it says, and checks the out-of-memory auto-fit for real.
#
#   scripts/gpu-doctor-provoke.sh [GPC]   (default build-gpu/gpc)
#
# 1. launch-bound: a 2-layer model at batch 1 trains while gpc doctor
#    --pid watches it for 5 s; expected cause launch_bound or
#    under_occupied.
# 2. out of memory: GPT-2 1.5B (d48) at micro-batch 256 with --no-auto-fit
#    dies; gpc doctor --run on its folder and log must name out_of_memory
#    and say what fits.
# 3. auto-fit: the same model at micro-batch 256 without --no-auto-fit must
#    go on at a smaller micro-batch and train 2 steps.
# 4. input-bound: case 1's model at micro-batch 1024 (64K tokens a step, so
#    launches are not what holds it back) with GPC_LOADER_DELAY_MS=200, a
#    loader far slower than the step; gpc doctor --pid while it trains and
#    gpc doctor --run on its folder afterwards must both name input_bound,
#    from the step's measured wait for input (input_wait in metrics.jsonl).
# Communication is not provoked here: one GPU has no all-reduce. Prints
# RESULT lines; CORPUS (default .deps/corpus, else Debian's fortunes) feeds
# the dataset; CASES (default "1 2 3 4") picks the cases to run.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
gpc=${1:-$root/build-gpu/gpc}
out=${OUT:-$root/gpu-out} work=${WORK:-/tmp/gpc-provoke}
corpus=${CORPUS:-$root/.deps/corpus}
[[ -e $corpus ]] || corpus=/usr/share/games/fortunes
rm -rf "$work" && mkdir -p "$work" "$out"
"$gpc" data prepare --input "$corpus" --out "$work/data" --vocab-size 512 >"$out/provoke-data.log" 2>&1 ||
  { echo "RESULT provoke data=failed"; tail -3 "$out/provoke-data.log"; exit 1; }
cases=" ${CASES:-1 2 3 4} "
want() { [[ $cases == *" $1 "* ]]; }
causes() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(",".join(sorted({f["cause"] for f in d["findings"] if f["kind"]=="problem" and f.get("cause")})) or "none")' "$1" 2>/dev/null || echo unreadable; }

if want 1; then
"$gpc" train --data "$work/data" --out "$work/tiny" --layers 2 --heads 2 --channels 64 --context 64 \
  --batch 1 --total-batch 64 --steps 1000000 --device cuda --eval-every 0 --checkpoint-every 0 \
  >"$out/provoke-tiny.log" 2>&1 &
pid=$!
sleep 6
"$gpc" doctor --pid $pid --seconds 5 --json "$out/provoke-launch.json" >"$out/provoke-launch.txt" 2>&1
kill $pid 2>/dev/null; wait $pid 2>/dev/null
echo "RESULT provoke launch_bound causes=$(causes "$out/provoke-launch.json")"
grep -E "PROBLEM|->" "$out/provoke-launch.txt" | head -6
fi

if want 2; then
"$gpc" train --data "$work/data" --out "$work/oom" --model d48 --context 1024 --batch 256 \
  --total-batch 262144 --steps 2 --device cuda --no-auto-fit --eval-every 0 >"$work/oom-train.log" 2>&1
echo "RESULT provoke oom train_exit=$? last=$(tail -1 "$work/oom-train.log" | cut -c1-200)"
"$gpc" doctor --run "$work/oom" --log "$work/oom-train.log" --json "$out/provoke-oom.json" \
  >"$out/provoke-oom.txt" 2>&1
echo "RESULT provoke out_of_memory causes=$(causes "$out/provoke-oom.json")"
grep -E "PROBLEM|->" "$out/provoke-oom.txt" | head -4
fi

if want 3; then
"$gpc" train --data "$work/data" --out "$work/fit" --model d48 --context 1024 --batch 256 \
  --total-batch 262144 --steps 2 --device cuda --eval-every 0 >"$out/provoke-autofit.log" 2>&1
echo "RESULT provoke autofit exit=$? $(grep -m1 -iE "out of memory|going on|start" "$out/provoke-autofit.log" | cut -c1-240)"
tail -2 "$out/provoke-autofit.log"
fi

# 4. input-bound: the loader sleeps 200 ms before each batch
want 4 || exit 0
GPC_LOADER_DELAY_MS=200 "$gpc" train --data "$work/data" --out "$work/input" --layers 2 --heads 2 \
  --channels 64 --context 64 --batch 1024 --total-batch 65536 --steps 100 --device cuda \
  --eval-every 0 --checkpoint-every 0 >"$out/provoke-input.log" 2>&1 &
pid=$!
# past the ring of prefetched batches and the first steps' warm-up
for _ in $(seq 600); do
  [[ -f $work/input/metrics.jsonl && $(wc -l <"$work/input/metrics.jsonl") -ge 12 ]] && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.1
done
"$gpc" doctor --pid $pid --seconds 3 --json "$out/provoke-input-pid.json" \
  >"$out/provoke-input-pid.txt" 2>&1
kill $pid 2>/dev/null; wait $pid 2>/dev/null
"$gpc" doctor --run "$work/input" --json "$out/provoke-input.json" >"$out/provoke-input.txt" 2>&1
wait_share=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(*[f["figures"]["input_wait"] for f in d["findings"] if f.get("cause")=="input_bound"] or ["none"])' \
  "$out/provoke-input.json" 2>/dev/null || echo unreadable)
echo "RESULT provoke input_bound causes=$(causes "$out/provoke-input.json") pid_causes=$(causes "$out/provoke-input-pid.json") input_wait=$wait_share"
grep -E "PROBLEM|->" "$out/provoke-input.txt" | head -4
