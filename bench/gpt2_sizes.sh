#!/usr/bin/env bash
# gpt2_sizes.sh: training throughput and peak GPU memory of GPT-2's larger
# shapes and of a long context on one GPU, gpc against PyTorch in one call.
#
#   bench/gpt2_sizes.sh [BUILD_DIR]        (default build-gpu; built if missing)
#
# CONFIGS lists the cases as NAME:MODEL:CONTEXT:MICRO_BATCH:ACCUMULATION,
# default "d24:d24:1024:16:4 d36:d36:1024:16:4 d48:d48:1024:8:8
# d12t4096:d12:4096:16:4". Each case runs `gpc train --device cuda` on
# synthetic shards (bf16, the data loader included), then
# bench/reference/gpt2_torch.py (torch.compile, flash SDPA, bf16 autocast,
# fused AdamW) with the same shape, micro-batch and accumulation. STEPS
# (default 8) steps are timed after 3 warm-up steps; SKIP_TORCH=1 leaves out
# PyTorch. Peak memory: gpc's arena (metrics.jsonl "memory") and, for both,
# the most the process held on the GPU as nvidia-smi saw it (sampled every
# 200 ms). Prints per case:
#   RESULT sizes case=NAME who=gpc|torch tokens_per_s=N mfu=P smi_peak_gib=G ...
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-gpu}
out=${OUT:-$root/gpu-out}
steps=${STEPS:-8}
configs=${CONFIGS:-"d24:d24:1024:16:4 d36:d36:1024:16:4 d48:d48:1024:8:8 d12t4096:d12:4096:16:4"}
data=${GPC_BENCH_DATA:-/tmp/gpc-bench-data}
mkdir -p "$out"
log=$out/sizes.log
: >"$log"
if [[ ! -x $build/gpc ]]; then
  cmake -S "$root" -B "$build" -DGPC_ENABLE_SCHED=OFF -DGPC_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release >"$out/sizes-build.log" 2>&1 &&
    cmake --build "$build" -j"$(nproc)" >>"$out/sizes-build.log" 2>&1 || { tail -30 "$out/sizes-build.log"; exit 1; }
fi
if [[ ! -f $data.complete ]]; then
  rm -rf "$data"
  "$build/gpc" data synth --vocab 50257 --tokens 20000000 --out "$data" >>"$log" 2>&1 || { echo "gpc data synth failed"; exit 1; }
  touch "$data.complete"
fi

# Runs "$@" while sampling the GPU memory of every compute process; prints
# the peak in GiB on fd 3.
with_peak() {
  local peak=$out/.peak.$$
  ("$@") &
  local pid=$! max=0 now
  while kill -0 $pid 2>/dev/null; do
    now=$(nvidia-smi --query-compute-apps=used_memory --format=csv,noheader,nounits 2>/dev/null | awk '{s+=$1} END {print s+0}')
    ((now > max)) && max=$now
    sleep 0.2
  done
  wait $pid
  local rc=$?
  echo "$max" >"$peak"
  return $rc
}
peak_gib() { awk '{printf "%.2f", $1 / 1024}' "$out/.peak.$$"; }

# 6N + 6LCT FLOPs a token against 989 TFLOP/s, N without wpe
mfu() { # tokens/s layers channels context
  python3 -c 'import sys
t,L,C,T=map(float,sys.argv[1:])
V=50304
N=V*C+L*(12*C*C+13*C)+2*C
print("%.1f" % (100*t*(6*N+6*L*C*T)/989e12))' "$@"
}

for cfg in $configs; do
  IFS=: read -r name model ctx mb acc <<<"$cfg"
  total=$((mb * ctx * acc))
  case $model in
    d12) L=12 NH=12 C=768 ;; d24) L=24 NH=16 C=1024 ;; d36) L=36 NH=20 C=1280 ;; d48) L=48 NH=25 C=1600 ;;
    *) echo "gpt2_sizes: unknown model $model" >&2; exit 2 ;;
  esac
  echo "== $name: $model ($L x $NH x $C), context $ctx, micro-batch $mb, accumulation $acc ($total tokens a step)" | tee -a "$log"
  run=$(mktemp -d /tmp/gpc-sizes.XXXXXX)
  t0=$(date +%s)
  with_peak timeout 400 "$build/gpc" train --data "$data" --out "$run/run" --model "$model" --context "$ctx" \
    --batch "$mb" --total-batch "$total" --steps $((steps + 3)) --device cuda --precision bf16 \
    --eval-every 0 --checkpoint-every 0 --no-auto-fit >"$out/sizes-$name-gpc.log" 2>&1
  rc=$?
  smi=$(peak_gib)
  read -r tps arena <<<"$(python3 - "$run/run/metrics.jsonl" <<'PY'
import json, sys
try:
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
except OSError:
    rows = []
t = sorted(r["tokens_per_s"] for r in rows[3:] if r.get("tokens_per_s"))
m = max((r.get("memory", 0) for r in rows), default=0)
print(t[len(t) // 2] if t else 0, "%.2f" % (m / 2**30))
PY
)"
  echo "RESULT sizes case=$name who=gpc exit=$rc tokens_per_s=${tps%.*} mfu=$(mfu "$tps" $L $C "$ctx")% arena_gib=$arena smi_peak_gib=$smi wall_s=$(($(date +%s) - t0))" | tee -a "$log"
  tail -2 "$out/sizes-$name-gpc.log" >>"$log"
  rm -rf "$run"
  [[ ${SKIP_TORCH:-0} == 1 ]] && continue
  t0=$(date +%s)
  with_peak timeout 500 python3 "$root/bench/reference/gpt2_torch.py" --depth $L --heads $NH --channels $C \
    --context "$ctx" --batch "$mb" --total-batch "$total" --steps "$steps" --warmup 3 >"$out/sizes-$name-torch.log" 2>&1
  rc=$?
  smi=$(peak_gib)
  res=$(grep '^RESULT torch' "$out/sizes-$name-torch.log" | sed 's/^RESULT torch //')
  echo "RESULT sizes case=$name who=torch exit=$rc ${res:-tokens_per_s=0} smi_peak_gib=$smi wall_s=$(($(date +%s) - t0))" | tee -a "$log"
  [[ -n $res ]] || tail -5 "$out/sizes-$name-torch.log" | tee -a "$log"
done
rm -f "$out/.peak.$$"
