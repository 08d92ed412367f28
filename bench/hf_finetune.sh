#!/usr/bin/env bash
# hf_finetune.sh: fine-tuning an imported GPT-2 124M on one GPU, gpc against
# PyTorch (transformers' GPT2LMHeadModel, torch.compile, bf16), in one call.
#
#   bench/hf_finetune.sh [BUILD_DIR]        (default build-gpu; built if missing)
#
# Environment: CORPUS (text files or a folder; default
# /usr/share/games/fortunes, Debian's fortunes), STEPS (default 50), BATCH
# (default 8), CONTEXT (default 1024), LR (default 1e-4), OUT (logs, default
# ./gpu-out), SIZE (124m; 350m, 774m, 1.5b also work), SKIP_TORCH=1.
#
# No weights can be downloaded on the GPU machine: the GPT-2 is random
# (transformers' initialisation, scripts/hf_fixtures.py --big), with GPT-2's
# real tokenizer (tests/fixtures/gpt2). What runs, each printing a RESULT line:
#   1. gpc import hf of the folder (wall time);
#   2. gpc data prepare --tokenizer on CORPUS;
#   3. gpc train --init-from (bf16, B x T, STEPS steps, warmup 5, cosine);
#      tokens/s is the median of metrics.jsonl after the first 3 steps;
#   4. bench/reference/gpt2_finetune_torch.py on the same shards and settings.
# Both print the loss of every step: the curves must agree within bf16 noise
# (the batches come in different random orders).
set -uo pipefail
export PYTHONUNBUFFERED=1
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-gpu}
out=${OUT:-$root/gpu-out}
steps=${STEPS:-50} batch=${BATCH:-8} context=${CONTEXT:-1024} lr=${LR:-1e-4}
corpus=${CORPUS:-/usr/share/games/fortunes}
work=${WORK:-/tmp/gpc-hf-finetune}
mkdir -p "$out" "$work"
if [[ ! -x $build/gpc ]]; then
  cmake -S "$root" -B "$build" -DGPC_ENABLE_SCHED=OFF -DGPC_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release >"$out/bench-build.log" 2>&1 &&
    cmake --build "$build" -j"$(nproc)" --target gpc_cli >>"$out/bench-build.log" 2>&1 || { tail -30 "$out/bench-build.log"; exit 1; }
fi
log=$out/hf-finetune.log
: >"$log"
say() { echo "$@" | tee -a "$log"; }
say "== gpc fine-tuning benchmark, $(date -u +%Y-%m-%dT%H:%MZ), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
[[ -e $corpus ]] || { say "no corpus at $corpus: set CORPUS"; exit 1; }

model=$work/gpt2-${SIZE:-124m}
rm -rf "$model" "$work/run" "$work/data" "$work/ft"
xz -dc "$root/tests/fixtures/gpt2/vocab.json.xz" >"$work/vocab.json"
xz -dc "$root/tests/fixtures/gpt2/merges.txt.xz" >"$work/merges.txt"
python3 "$root/scripts/hf_fixtures.py" --big "$model" --size "${SIZE:-124m}" \
  --vocab "$work/vocab.json" --merges "$work/merges.txt" 2>&1 | grep -v Warning | tail -1 | tee -a "$log"

t0=$(date +%s.%N)
"$build/gpc" import hf "$model" --out "$work/run" 2>&1 | tee -a "$log"
say "RESULT gpc_import seconds=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')"
"$build/gpc" data prepare --input "$corpus" --out "$work/data" --tokenizer "$work/run" \
  --val-fraction 0.02 2>/dev/null | tee -a "$log"

"$build/gpc" train --data "$work/data" --out "$work/ft" --init-from "$work/run" --device cuda \
  --precision bf16 --batch "$batch" --context "$context" --steps "$steps" --lr "$lr" \
  --warmup 5 --eval-every 0 --checkpoint-every 0 >"$out/hf-finetune-gpc.log" 2>&1
tail -2 "$out/hf-finetune-gpc.log" | tee -a "$log"
cp "$work/ft/metrics.jsonl" "$out/hf-finetune-gpc-metrics.jsonl"
python3 - "$work/ft/metrics.jsonl" <<'PY' | tee -a "$log"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rates = [r["tokens_per_s"] for r in rows[3:]] or [0]
print("gpc losses:", " ".join(f"{r['loss']:.3f}" for r in rows))
print(f"RESULT gpc_finetune tokens_per_s={statistics.median(rates):.0f} final_loss={rows[-1]['loss']:.4f}")
PY

if [[ ${SKIP_TORCH:-0} != 1 ]]; then
  timeout 900 python3 "$root/bench/reference/gpt2_finetune_torch.py" --model "$model" \
    --data "$work/data" --batch "$batch" --context "$context" --steps "$steps" --lr "$lr" \
    --warmup 5 >"$out/hf-finetune-torch.log" 2>&1
  python3 - "$out/hf-finetune-torch.log" <<'PY' | tee -a "$log"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print("torch losses:", " ".join(f"{r['loss']:.3f}" for r in rows))
PY
  grep RESULT "$out/hf-finetune-torch.log" | tee -a "$log"
fi
