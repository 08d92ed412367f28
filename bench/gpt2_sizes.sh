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
source "$root/bench/sizes_common.sh"

for cfg in $configs; do
  IFS=: read -r name model ctx mb acc <<<"$cfg"
  total=$((mb * ctx * acc))
  shape_of "$model" || exit 2
  echo "== $name: $model ($L x $NH x $C), context $ctx, micro-batch $mb, accumulation $acc ($total tokens a step)" | tee -a "$log"
  run=$(mktemp -d /tmp/gpc-sizes.XXXXXX)
  t0=$(date +%s)
  with_peak timeout 400 "$build/gpc" train --data "$data" --out "$run/run" --model "$model" --context "$ctx" \
    --batch "$mb" --total-batch "$total" --steps $((steps + 3)) --device cuda --precision bf16 \
    --eval-every 0 --checkpoint-every 0 --no-auto-fit >"$out/sizes-$name-gpc.log" 2>&1
  rc=$?
  smi=$(peak_gib)
  read -r tps arena <<<"$(gpc_figures "$run/run")"
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
