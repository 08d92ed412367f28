#!/usr/bin/env bash
# quant_decode.sh: decode speed of 8-bit weights against bf16 on one GPU,
# and, with PERPLEXITY=1, the perplexity they cost.
#
# By default (about two minutes on an H200) it runs two programs of the
# build and prints their RESULT lines:
#   - bench_quant_gemv_bench: the decode products alone (1 and 16 rows) at
#     GPT-2's shapes (3072 x 768, 768 x 3072, the head's 50304 x 768, d48's
#     6400 x 1600 and 1600 x 6400) as GB/s of weight bytes and the fraction
#     of PEAK_GBPS (default 4800): bf16, and int8 and fp8 in the skinny
#     kernel and in the earlier kernels;
#   - bench_quant_decode_bench: decode tokens/s of gpc sample's step (one
#     stream, random weights, GPT-2's vocabulary) for MODELS_SPEED (default
#     "d12,d36"): bf16, and int8, fp8 and per-tensor fp8 each with the
#     skinny kernel and with the earlier ones (GPC_QUANT_GEMV_MAX_M=0).
#
# PERPLEXITY=1 (and DEVICE=cpu, which runs only this part) adds the
# run-folder table: for each of MODELS it trains a
# run on the bundled corpus (or takes RUN), quantizes it three ways with
# gpc quantize, then measures for each:
#   - decode tokens/s of gpc sample (bf16 activations, kept keys and
#     values, TOKENS tokens after a short prompt, the rate after the first),
#     for the 8-bit runs also with GPC_QUANT_GEMV_MAX_M=0 (column "earlier");
#   - mean cross-entropy and perplexity on the dataset's validation shard
#     (gpc eval, context CONTEXT);
#   - the bytes of the weights (config.txt's figures, as gpc quantize says);
#   - which product path ran (the matmul_quant log line).
# and prints one table.
#
# Environment: BUILD (default build-gpu, else build: where gpc and the
# bench programs are), GPC (default BUILD/gpc), MODELS_SPEED, PEAK_GBPS,
# PERPLEXITY; for the table: MODELS (default "d12"; "d12 d48" adds GPT-2
# 1.5B's shape), STEPS (training steps per model, default 300 for d12 and
# 30 for larger ones: speed does not depend on the weights, perplexity
# does), RUN (an existing run folder, e.g. an imported GPT-2, used instead
# of training; DATA must then be a dataset tokenized with its tokenizer),
# DATA (a prepared dataset to train and evaluate on), CORPUS (text to
# prepare DATA from; default Debian's fortunes), TOKENS (default 512),
# CONTEXT (default 1024), BATCH (training micro-batch, default 8), DEVICE
# (default cuda), WORK (default a fresh temporary folder). The unquantized
# row computes in bf16 on a GPU, f32 on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-$([[ -x build-gpu/gpc ]] && echo build-gpu || echo build)}
GPC=${GPC:-$BUILD/gpc}
MODELS_SPEED=${MODELS_SPEED:-d12,d36}
PEAK_GBPS=${PEAK_GBPS:-4800}
PERPLEXITY=${PERPLEXITY:-0}
MODELS=${MODELS:-d12}
TOKENS=${TOKENS:-512}
CONTEXT=${CONTEXT:-1024}
BATCH=${BATCH:-8}
DEVICE=${DEVICE:-cuda}
WORK=${WORK:-$(mktemp -d)}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
mkdir -p "$WORK"
log=$WORK/quant_decode.log
: >"$log"
echo "quant_decode: work in $WORK, gpc $GPC, device $DEVICE" | tee -a "$log"

if [[ $DEVICE == cuda ]]; then
  for prog in bench_quant_gemv_bench bench_quant_decode_bench; do
    [[ -x $BUILD/bench/$prog ]] ||
      { echo "quant_decode: $BUILD/bench/$prog is missing: build gpc with CUDA first" >&2; exit 1; }
  done
  echo "quant_decode: the decode products alone (GB/s of weight bytes)" | tee -a "$log"
  if ! "$BUILD/bench/bench_quant_gemv_bench" --rows 1,16 --peak-gbps "$PEAK_GBPS" 2>&1 |
    tee -a "$log"; then
    echo "quant_decode: bench_quant_gemv_bench failed" >&2
    exit 1
  fi
  echo "quant_decode: decode tokens/s, one stream, random weights ($MODELS_SPEED)" | tee -a "$log"
  if ! "$BUILD/bench/bench_quant_decode_bench" --models "$MODELS_SPEED" --tokens 256 2>&1 |
    tee -a "$log"; then
    echo "quant_decode: bench_quant_decode_bench failed" >&2
    exit 1
  fi
fi
if [[ $PERPLEXITY != 1 && $DEVICE == cuda ]]; then
  echo "log: $log"
  exit 0
fi

data=${DATA:-}
if [[ -z $data ]]; then
  data=$WORK/data
  if [[ -n ${CORPUS:-} ]]; then corpus=("$CORPUS"); elif [[ -d /usr/share/games/fortunes ]]; then corpus=(/usr/share/games/fortunes); else corpus=(docs src README.md); fi
  inputs=()
  for c in "${corpus[@]}"; do inputs+=(--input "$c"); done
  "$GPC" data prepare "${inputs[@]}" --out "$data" --val-fraction 0.05 >>"$log" 2>&1 ||
    { echo "quant_decode: data prepare failed (see $log)" >&2; exit 1; }
fi

# decode tokens/s of gpc sample on a run folder (extra environment first)
sample_rate() {
  local name=$1 run=$2
  shift 2
  env "$@" "$GPC" sample --run "$run" --device "$DEVICE" --tokens "$TOKENS" --ignore-eos \
    --top-k 0 --temperature 1.0 --seed 3 --prompt "The" >"$WORK/$name.txt" \
    2>"$WORK/$name.sample" ||
    { echo "quant_decode: sample of $name failed: $(tail -2 "$WORK/$name.sample")" >&2; exit 1; }
  sed -nE 's/.* then ([0-9.]+) tokens\/s.*/\1/p' "$WORK/$name.sample"
}

# one row of the table: decode rate (the skinny kernel, and the earlier
# kernels for 8-bit weights), perplexity and path of a run folder
measure() {
  local name=$1 run=$2 weights=$3 rate earlier=- ppl path
  if [[ $weights != bf16 && $weights != f32 && $DEVICE == cuda ]]; then
    earlier=$(sample_rate "$name-earlier" "$run" GPC_QUANT_GEMV_MAX_M=0)
    cat "$WORK/$name-earlier.sample" >>"$log"
  fi
  rate=$(sample_rate "$name" "$run")
  "$GPC" eval --run "$run" --data "$data" --device "$DEVICE" --context "$CONTEXT" \
    --json "$WORK/$name.json" >"$WORK/$name.eval" 2>&1 ||
    { echo "quant_decode: eval of $name failed: $(tail -2 "$WORK/$name.eval")" >&2; exit 1; }
  ppl=$(sed -n 's/.*"perplexity": \([^,]*\),.*/\1/p' "$WORK/$name.json")
  # the paths the products took: decode (sample), then prefill (eval)
  path=$(cat "$WORK/$name.sample" "$WORK/$name.eval" | sed -nE 's/.*matmul_quant: (.*)/\1/p' |
    awk '!seen[$0]++' | paste -sd ';' -)
  cat "$WORK/$name.sample" "$WORK/$name.eval" >>"$log"
  echo "$name|$weights|${rate:-?}|${earlier:-?}|${ppl:-?}|${path:--}"
}

rows=()
for model in $MODELS; do
  run=${RUN:-}
  if [[ -z $run ]]; then
    run=$WORK/$model
    steps=${STEPS:-$([[ $model == d12 ]] && echo 300 || echo 30)}
    echo "quant_decode: training $model for $steps steps" | tee -a "$log"
    "$GPC" train --data "$data" --out "$run" --model "$model" --context "$CONTEXT" --batch "$BATCH" \
      --steps "$steps" --device "$DEVICE" --checkpoint-every 0 --eval-every 0 >>"$log" 2>&1 ||
      { echo "quant_decode: training $model failed (see $log)" >&2; exit 1; }
  fi
  plain=$([[ $DEVICE == cpu ]] && echo f32 || echo bf16)
  rows+=("$(measure "$model-$plain" "$run" "$plain")")
  for q in "int8" "fp8 channel" "fp8 tensor"; do
    read -r to scales <<<"$q"
    name=$model-$to${scales:+-$scales}
    "$GPC" quantize "$run" --to "$to" ${scales:+--scales "$scales"} --out "$WORK/$name" \
      >"$WORK/$name.q" 2>&1 ||
      { echo "quant_decode: quantize $name failed: $(cat "$WORK/$name.q")" >&2; exit 1; }
    cat "$WORK/$name.q" >>"$log"
    rows+=("$(measure "$name" "$WORK/$name" "$to${scales:+/$scales}")")
  done
  [[ -n ${RUN:-} ]] && break
done

# the table: each quantized row against its model's bf16 row
printf '\n%-18s %-12s %12s %9s %9s %12s %9s  %s\n' run weights "decode tok/s" speed-up earlier \
  perplexity change path
base_rate=0 base_ppl=0
for row in "${rows[@]}"; do
  IFS='|' read -r name weights rate earlier ppl path <<<"$row"
  if [[ $weights == bf16 || $weights == f32 ]]; then base_rate=$rate base_ppl=$ppl; fi
  awk -v n="$name" -v w="$weights" -v r="$rate" -v e="$earlier" -v p="$ppl" -v br="$base_rate" \
    -v bp="$base_ppl" -v path="$path" 'BEGIN {
      s = (br > 0 && r > 0) ? sprintf("%.2fx", r / br) : "?";
      es = (br > 0 && e > 0) ? sprintf("%.2fx", e / br) : "-";
      c = (bp > 0 && p > 0) ? sprintf("%+.3f%%", 100 * (p / bp - 1)) : "?";
      printf "%-18s %-12s %12s %9s %9s %12s %9s  %s\n", n, w, r, s, es, p, c, path
      if (r > 0) printf "RESULT quant_sample run=%s weights=%s tokens_per_s=%s speedup=%s earlier=%s perplexity=%s change=%s\n", n, w, r, s, es, p, c }'
done | tee -a "$log"
grep -h "weights .* MiB in bf16" "$WORK"/*.q 2>/dev/null | sed 's/^/  /' | tee -a "$log" || true
echo "log: $log"
