#!/usr/bin/env bash
# test_lora_cli.sh: LoRA end to end on the CPU: `gpc train --init-from BASE
# --lora 4` lowers the loss and writes lora.bin alone (no checkpoint.bin),
# far smaller than the base; a run stopped and resumed writes the same
# lora.bin bytes as one that ran through; `gpc merge` writes a plain run
# that `gpc eval` reads, scoring better than the base; bad input gets one
# line: --lora without --init-from, a run without adapters, a damaged file.
set -u
GPC=${GPC:?set GPC to the gpc binary}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpc-lora-cli-XXXXXX")
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
"$GPC" train "${common[@]}" --out "$work/base" --layers 2 --heads 2 --channels 32 --steps 2 \
  --lr 3e-3 >/dev/null 2>&1 || fail "training the base failed"

lora=(--init-from "$work/base" --lora 4 --lora-alpha 16 --steps 60 --lr 1e-2 --warmup 2)
"$GPC" train "${common[@]}" --out "$work/ft" "${lora[@]}" >"$work/ft.out" 2>&1 ||
  fail "train --lora failed: $(tail -3 "$work/ft.out")"
[[ -f $work/ft/lora.bin ]] || fail "no lora.bin in the LoRA run"
[[ -e $work/ft/checkpoint.bin ]] && fail "a LoRA run wrote a whole checkpoint"
base_bytes=$(stat -c %s "$work/base/checkpoint.bin")
lora_bytes=$(stat -c %s "$work/ft/lora.bin")
((lora_bytes * 4 < base_bytes)) || fail "lora.bin is $lora_bytes bytes, the base $base_bytes"
first=$(head -1 "$work/ft/metrics.jsonl" | sed 's/.*"loss":\([^,]*\),.*/\1/')
last=$(tail -1 "$work/ft/metrics.jsonl" | sed 's/.*"loss":\([^,]*\),.*/\1/')
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.1) }' ||
  fail "LoRA training did not lower the loss: $first -> $last"

# stopped after 10 steps and resumed: the same adapters and moments, bit for bit
"$GPC" train "${common[@]}" --out "$work/ft2" "${lora[@]}" --stop-after 10 >/dev/null 2>&1 ||
  fail "train --lora --stop-after failed"
"$GPC" train "${common[@]}" --out "$work/ft2" --resume >"$work/resume.out" 2>&1 ||
  fail "train --resume of a LoRA run failed: $(tail -3 "$work/resume.out")"
cmp -s "$work/ft/lora.bin" "$work/ft2/lora.bin" || fail "the resumed run's lora.bin differs"
expect_exit 2 "already holds LoRA adapters" "$GPC" train "${common[@]}" --out "$work/ft2" \
  "${lora[@]}"

# merge, then eval: the merged run scores better than the base
"$GPC" merge "$work/ft" --out "$work/merged" >/dev/null || fail "merge failed"
[[ -f $work/merged/checkpoint.bin && -f $work/merged/tokenizer.bin ]] ||
  fail "the merged run lacks its checkpoint or tokenizer"
"$GPC" eval --run "$work/base" --data "$work/data" --device cpu --json "$work/base.json" \
  >/dev/null || fail "eval of the base failed"
"$GPC" eval --run "$work/merged" --data "$work/data" --device cpu --json "$work/merged.json" \
  >/dev/null || fail "eval of the merged run failed"
mb=$(sed -n 's/.*"mean_loss": \([^,]*\),.*/\1/p' "$work/base.json")
mm=$(sed -n 's/.*"mean_loss": \([^,]*\),.*/\1/p' "$work/merged.json")
awk -v a="$mb" -v b="$mm" 'BEGIN { exit !(b < a - 0.1) }' ||
  fail "the merged run's loss $mm is not below the base's $mb"

# bad input
expect_exit 2 "give its run folder with --init-from" "$GPC" train "${common[@]}" \
  --out "$work/bad" --lora 4
expect_exit 2 "--lora must be a positive rank" "$GPC" train "${common[@]}" --out "$work/bad" \
  --init-from "$work/base" --lora 0
expect_exit 2 "'mlp' is not one of" "$GPC" train "${common[@]}" --out "$work/bad" \
  --init-from "$work/base" --lora 2 --lora-targets qkv,mlp
expect_exit 1 "has no lora.bin" "$GPC" merge "$work/base" --out "$work/bad"
expect_exit 2 "already exists" "$GPC" merge "$work/ft" --out "$work/merged"
cp "$work/ft/lora.bin" "$work/ft2/lora.bin"
printf '\x55' | dd of="$work/ft2/lora.bin" bs=1 seek=2000 conv=notrunc status=none
expect_exit 1 "checksum" "$GPC" merge "$work/ft2" --out "$work/bad"
[[ -e $work/bad ]] && fail "a failed merge left $work/bad"

((failures == 0)) || exit 1
echo "lora cli: all checks passed"
