#!/usr/bin/env bash
# lora_gpu.sh: LoRA fine-tuning on one GPU against full fine-tuning of the
# same model, gpc and PyTorch in one call: tokens/s and peak GPU memory.
#
#   bench/lora_gpu.sh [BUILD_DIR]        (default build-gpu; built if missing)
#
# For MODEL (default d48, GPT-2 1.5B), a base run is made first (one step at
# micro-batch 1, so a checkpoint exists), then four runs of the same shape,
# micro-batch MB (default 8) x 1024, accumulation ACC (default 8), bf16:
#   gpc full    gpc train --init-from BASE
#   gpc lora    gpc train --init-from BASE --lora RANK (default 16, all four
#               projections)
#   torch full  bench/reference/gpt2_torch.py (compile, flash SDPA, bf16
#               autocast, fused AdamW)
#   torch lora  the same with --lora RANK: frozen bf16 base, f32 adapters on
#               the four projections, in plain PyTorch
# STEPS (default 6) steps are timed after 3 warm-up steps; CTX (default 1024)
# and DEVICE (default cuda; cpu with SKIP_TORCH=1 for a quick check of the
# script) change the rest; TRAIN_ARGS (e.g. "--recompute block") is added to
# both gpc runs, SKIP_TORCH=1 leaves out the PyTorch runs, and MODES (default
# "full lora") picks the cases. Prints per run
#   RESULT lora case=full|lora who=gpc|torch tokens_per_s=N smi_peak_gib=G ...
# and the memory saved by LoRA for each.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-gpu}
out=${OUT:-$root/gpu-out}
steps=${STEPS:-6}
model=${MODEL:-d48}
rank=${RANK:-16}
mb=${MB:-8}
acc=${ACC:-8}
ctx=${CTX:-1024}
device=${DEVICE:-cuda}
read -r -a gpc_args <<<"${TRAIN_ARGS:-}"
precision=bf16
[[ $device == cpu ]] && precision=f32
data=${GPC_BENCH_DATA:-/tmp/gpc-bench-data}
mkdir -p "$out"
log=$out/lora.log
: >"$log"
source "$root/bench/sizes_common.sh"
shape_of "$model" || exit 2
total=$((mb * ctx * acc))
work=$(mktemp -d /tmp/gpc-lora.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "== $model ($L x $NH x $C), micro-batch $mb, accumulation $acc ($total tokens a step), LoRA rank $rank" | tee -a "$log"
if ! timeout 300 "$build/gpc" train --data "$data" --out "$work/base" --model "$model" --context $ctx \
  --batch 1 --total-batch $ctx --steps 1 --device "$device" --precision "$precision" --eval-every 0 \
  >"$out/lora-base.log" 2>&1; then
  echo "the base run failed:"; tail -5 "$out/lora-base.log"; exit 1
fi

declare -A tps peak
for mode in ${MODES:-full lora}; do
  extra=()
  [[ $mode == lora ]] && extra=(--lora "$rank")
  t0=$(date +%s)
  with_peak timeout 400 "$build/gpc" train --data "$data" --out "$work/$mode" --init-from "$work/base" \
    --context $ctx --batch "$mb" --total-batch $total --steps $((steps + 3)) --device "$device" \
    --precision "$precision" --eval-every 0 --checkpoint-every 0 --no-auto-fit "${gpc_args[@]}" "${extra[@]}" \
    >"$out/lora-$mode-gpc.log" 2>&1
  rc=$?
  peak[gpc$mode]=$(peak_gib)
  read -r t arena <<<"$(gpc_figures "$work/$mode")"
  tps[gpc$mode]=${t%.*}
  echo "RESULT lora case=$mode who=gpc exit=$rc tokens_per_s=${t%.*} mfu=$(mfu "$t" $L $C $ctx)% arena_gib=$arena smi_peak_gib=${peak[gpc$mode]} wall_s=$(($(date +%s) - t0))" | tee -a "$log"
  ((rc == 0)) || tail -3 "$out/lora-$mode-gpc.log" | tee -a "$log"
  [[ ${SKIP_TORCH:-0} == 1 ]] && continue
  extra=()
  [[ $mode == lora ]] && extra=(--lora "$rank")
  t0=$(date +%s)
  with_peak timeout 500 python3 "$root/bench/reference/gpt2_torch.py" --depth $L --heads $NH \
    --channels $C --context $ctx --batch "$mb" --total-batch $total --steps "$steps" --warmup 3 \
    "${extra[@]}" >"$out/lora-$mode-torch.log" 2>&1
  rc=$?
  peak[torch$mode]=$(peak_gib)
  res=$(grep '^RESULT torch' "$out/lora-$mode-torch.log" | sed 's/^RESULT torch //')
  tps[torch$mode]=$(sed -n 's/.*tokens_per_s=\([0-9]*\).*/\1/p' <<<"$res")
  echo "RESULT lora case=$mode who=torch exit=$rc ${res:-tokens_per_s=0} smi_peak_gib=${peak[torch$mode]} wall_s=$(($(date +%s) - t0))" | tee -a "$log"
  [[ -n $res ]] || tail -5 "$out/lora-$mode-torch.log" | tee -a "$log"
done
for who in gpc torch; do
  [[ -n ${peak[${who}lora]:-} && -n ${peak[${who}full]:-} ]] || continue
  python3 -c 'import sys
w,fp,lp,ft,lt=sys.argv[1],*map(float,sys.argv[2:])
print("RESULT lora who=%s memory_saved=%.0f%% speed_ratio=%.2f (lora tokens/s over full)" %
      (w, 100*(1-lp/fp) if fp else 0, lt/ft if ft else 0))' "$who" "${peak[${who}full]}" \
    "${peak[${who}lora]}" "${tps[${who}full]:-0}" "${tps[${who}lora]:-0}" | tee -a "$log"
done
[[ -n ${tps[torchlora]:-} && ${tps[torchlora]:-0} -gt 0 ]] &&
  echo "RESULT lora gpc_over_torch=$(python3 -c "print('%.2f' % (${tps[gpclora]:-0}/${tps[torchlora]}))")" | tee -a "$log"
rm -f "$out/.peak.$$"
