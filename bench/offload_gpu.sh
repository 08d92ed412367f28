#!/usr/bin/env bash
# offload_gpu.sh: the largest GPT-2 shape that trains on one GPU, with and
# without --offload-optimizer, at micro-batch 4 x 1024 with --recompute
# block (bf16).
#
#   bench/offload_gpu.sh [BUILD_DIR]        (default build-gpu; built if missing)
#
# Environment: OUT (folder for logs, default ./gpu-out), SHAPES (the shapes
# tried, smallest first, each NAME:LAYERS:HEADS:CHANNELS; default d36 and d48
# as GPT-2 774M and 1.5B, then 32 and 48 layers x 2048 channels, 48 x 3072
# and 40 x 4096 (1.7B to 8.3B parameters), all with heads of 64), STEPS
# (default 3), MODES (default "0 1": plain, then offloaded; "1" runs the
# offloaded runs alone, so that a call's time limit need not cover both).
#
# A mode (plain or offloaded) stops at its first shape that fails: the
# larger ones would fail too. Offloaded, the host must pin 16 bytes a
# parameter (gpc plan --offload-optimizer says how much), so the host's
# memory, not the GPU's, bounds it on a machine with less RAM than GPU
# memory.
#
# Each shape trains STEPS steps twice, plain and offloaded, on synthetic
# shards (bench/train_run.sh's). Each run prints one line,
#   RESULT offload_gpu shape=NAME params=P offload=0|1 status=ok|oom|fail
#          saved=yes|no tokens_per_s=N peak_device_bytes=M [error="..."]
# status ok when every step ran; saved=no when the final checkpoint was not
# written (an 8B model's, with its optimizer state, is about 100 GB: more
# than the GPU machine's disk), which does not make the shape fail.
# tokens_per_s is the median over the steps after the first (the first pays
# for pinning and warm-up), peak_device_bytes the largest "memory" of its
# metrics.jsonl (the GPU's used bytes, read after each step). --no-auto-fit
# keeps the micro-batch at 4, so a shape that does not fit ends as oom.
# The last lines name the largest shape that trained each way.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-gpu}
out=${OUT:-$root/gpu-out}
steps=${STEPS:-3}
modes=${MODES:-0 1}
shapes=${SHAPES:-"d36:36:20:1280 d48:48:25:1600 l32c2048:32:32:2048 l48c2048:48:32:2048 l48c3072:48:48:3072 l40c4096:40:64:4096"}
data=${GPC_BENCH_DATA:-/tmp/gpc-bench-data}
mkdir -p "$out"
if [[ ! -x $build/gpc ]]; then
  cmake -S "$root" -B "$build" -DGPC_ENABLE_SCHED=OFF -DGPC_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release >"$out/bench-build.log" 2>&1 &&
    cmake --build "$build" -j"$(nproc)" >>"$out/bench-build.log" 2>&1 || { tail -30 "$out/bench-build.log"; exit 1; }
fi
gpc=$build/gpc
log=$out/offload.log
: >"$log"
say() { echo "$@" | tee -a "$log"; }
say "== gpc --offload-optimizer, $(date -u +%Y-%m-%dT%H:%MZ), $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null), $(nproc) CPUs"
if [[ ! -f $data.complete ]]; then
  rm -rf "$data"
  "$gpc" data synth --vocab 50257 --tokens 20000000 --out "$data" >>"$log" 2>&1 || { say "gpc data synth failed"; exit 1; }
  touch "$data.complete"
fi
run=$(mktemp -d "${TMPDIR:-/tmp}/gpc-offload-run.XXXXXX")
trap 'rm -rf "$run"' EXIT
largest_plain=none largest_offload=none
stopped=(0 0)
for shape in $shapes; do
  IFS=: read -r name layers heads channels <<<"$shape"
  for offload in $modes; do
    [[ ${stopped[$offload]} == 1 ]] && continue
    flag=()
    [[ $offload == 1 ]] && flag=(--offload-optimizer)
    rm -rf "$run/run"
    say "-- $name ($layers layers, $heads heads, $channels channels), offload $offload"
    "$gpc" plan --model d12 --layers "$layers" --heads "$heads" --channels "$channels" \
      --batch 4 --context 1024 --recompute block "${flag[@]}" 2>&1 | grep -E "^  total |pinned" | tee -a "$log"
    timeout 300 "$gpc" train --data "$data" --out "$run/run" --model d12 --layers "$layers" \
      --heads "$heads" --channels "$channels" --context 1024 --batch 4 --steps "$steps" \
      --recompute block --device cuda --precision bf16 --eval-every 0 --checkpoint-every 0 \
      --no-auto-fit "${flag[@]}" >"$run/out" 2>&1
    rc=$?
    cat "$run/out" >>"$log"
    python3 - "$run/run/metrics.jsonl" "$name" "$offload" "$rc" "$run/out" "$steps" <<'PY' | tee -a "$log"
import json, re, sys
path, name, offload, rc, out, steps = sys.argv[1:7]
try:
    rows = [json.loads(l) for l in open(path) if l.strip()]
except OSError:
    rows = []
text = open(out).read()
m = re.search(r"([0-9.]+[KMB]?) parameters", text)
params = m.group(1) if m else "?"
tps = sorted(r["tokens_per_s"] for r in rows[1:] if r.get("tokens_per_s"))
peak = max((r.get("memory", 0) for r in rows), default=0)
# trained: every step ran; saved: the final checkpoint too (a model of
# billions of parameters with its optimizer state can outgrow the disk)
trained = len(rows) >= int(steps) and bool(tps)
if trained:
    status = "ok"
elif re.search(r"out of (GPU|host) memory|host memory", text, re.I):
    status = "oom"
else:
    status = "fail" if rc != "0" else "fail-no-steps"
saved = "yes" if rc == "0" else "no"
why = re.findall(r"error: (.*)", text)
print(f"RESULT offload_gpu shape={name} params={params} offload={offload} status={status} "
      f"saved={saved} tokens_per_s={tps[len(tps) // 2] if tps else 0:.0f} peak_device_bytes={peak}"
      + (f" error=\"{why[-1][:160]}\"" if why else ""))
PY
    if grep -q "shape=$name .*offload=$offload status=ok" "$log"; then
      [[ $offload == 0 ]] && largest_plain=$name || largest_offload=$name
    else
      stopped[$offload]=1
    fi
  done
done
say "RESULT offload_gpu_largest plain=$largest_plain offload=$largest_offload"
