#!/usr/bin/env bash
# test_quantize_cli.sh: `gpc quantize` end to end on the CPU: a run trained
# here quantized to int8 and fp8 (per channel and per tensor) scores within
# 1% of its perplexity under `gpc eval`, `gpc sample` writes text from each,
# quant.bin is about a quarter of the f32 checkpoint, and bad input gets one
# line: an unknown --to, int8 per tensor, a run already quantized, a missing
# run, an --out that is not empty, and gpc train --init-from a quantized run.
set -u
GPC=${GPC:?set GPC to the gpc binary}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpc-quantize-cli-XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
# shellcheck source=tests/cli/lib.sh
source "$(dirname "$0")/lib.sh"

mkdir -p "$work/text"
for i in $(seq 1 60); do
  printf "Document %d: the quick brown fox jumps over the lazy dog, again and again.\n%%\n" \
    "$i" >>"$work/text/corpus.txt"
done
"$GPC" data prepare --input "$work/text" --out "$work/data" --vocab-size 300 --val-fraction 0.2 \
  >/dev/null 2>&1 || fail "data prepare failed"
common=(--data "$work/data" --device cpu --context 32 --batch 4 --eval-every 0)
"$GPC" train "${common[@]}" --out "$work/run" --layers 2 --heads 2 --channels 64 --steps 60 \
  --lr 3e-3 >/dev/null 2>&1 || fail "training failed"

"$GPC" eval --run "$work/run" --data "$work/data" --device cpu --json "$work/base.json" \
  >/dev/null || fail "eval of the run failed"
base=$(sed -n 's/.*"perplexity": \([^,]*\),.*/\1/p' "$work/base.json")
for q in "int8" "fp8 --scales channel" "fp8 --scales tensor"; do
  name=${q// /}
  # shellcheck disable=SC2086  # $q is the --to value and its options
  "$GPC" quantize "$work/run" --to $q --out "$work/$name" >"$work/q.out" 2>&1 ||
    fail "quantize --to $q failed: $(cat "$work/q.out")"
  [[ -f $work/$name/quant.bin && -f $work/$name/tokenizer.bin && -f $work/$name/config.txt ]] ||
    fail "$name lacks quant.bin, tokenizer.bin or config.txt"
  "$GPC" eval --run "$work/$name" --data "$work/data" --device cpu --json "$work/$name.json" \
    >"$work/eval.out" || fail "eval of $name failed"
  grep -qF ", weights " "$work/eval.out" ||
    fail "eval of $name does not say the weights are quantized: $(cat "$work/eval.out")"
  cat "$work/eval.out" >>"$work/evals.txt"
  ppl=$(sed -n 's/.*"perplexity": \([^,]*\),.*/\1/p' "$work/$name.json")
  awk -v a="$base" -v b="$ppl" 'BEGIN { d = b / a - 1; if (d < 0) d = -d; exit !(d < 0.01) }' ||
    fail "$name's perplexity $ppl is not within 1% of $base"
  "$GPC" sample --run "$work/$name" --device cpu --prompt "the quick" --tokens 8 \
    --temperature 0 >"$work/sample.out" 2>/dev/null || fail "sample from $name failed"
  [[ $(wc -c <"$work/sample.out") -gt 10 ]] || fail "sample from $name wrote no text"
done
ckpt_bytes=$(stat -c %s "$work/run/checkpoint.bin")
quant_bytes=$(stat -c %s "$work/int8/quant.bin")
((quant_bytes < ckpt_bytes)) || fail "quant.bin ($quant_bytes) is not smaller than $ckpt_bytes"

# bad input
expect_exit 2 "--to int4 is not a quantization" "$GPC" quantize "$work/run" --to int4 \
  --out "$work/bad"
expect_exit 2 "per output channel only" "$GPC" quantize "$work/run" --to int8 --scales tensor \
  --out "$work/bad"
expect_exit 2 "--to int8 or --to fp8 is required" "$GPC" quantize "$work/run" --out "$work/bad"
expect_exit 2 "already quantized" "$GPC" quantize "$work/int8" --to fp8 --out "$work/bad"
expect_exit 1 "does not exist" "$GPC" quantize "$work/nothing" --to int8 --out "$work/bad"
expect_exit 2 "not an empty folder" "$GPC" quantize "$work/run" --to int8 --out "$work/int8"
[[ -e $work/bad ]] && fail "a failed quantize left $work/bad"
expect_exit 2 "for inference only" "$GPC" train "${common[@]}" --out "$work/ft" \
  --init-from "$work/int8" --steps 2

((failures == 0)) || exit 1
