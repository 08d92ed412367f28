#!/usr/bin/env bash
# test_input_errors.sh: inputs that slipped through: a --total-batch near
# 2^63 is a usage error without overflow or a negative suggestion; too
# little data is a runtime error (exit 1), not a usage error; a damaged
# tokenizer stops gpc train before it is copied into the run; gpc report
# says why it cannot write (permission, not a folder); gpc sched simulate
# refuses a duration of 1e308. About 5 s.
set -u
GPC=${GPC:?set GPC to the gpc binary}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpc-input-errors-XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

tiny=(--device cpu --layers 1 --heads 2 --channels 32 --context 16 --batch 2 --steps 2
  --eval-every 0)
make_dataset 64 3

# --total-batch 2^63-1: too many micro-steps, said without a negative number
expect_exit 2 "micro-steps of 32 tokens" "$GPC" train --data "$work/data" --out "$work/r1" \
  "${tiny[@]}" --total-batch 9223372036854775807
grep -q -- "-[0-9]" "$work/expect.err" && fail "a negative number in: $(cat "$work/expect.err")"

# too little data for one batch: the data's fault as much as the options', exit 1
"$GPC" data synth --vocab 64 --tokens 40 --out "$work/small" --seed 3 >"$work/out" 2>&1 ||
  fail "synth: $(cat "$work/out")"
expect_exit 1 "too few for one batch" "$GPC" train --data "$work/small" --out "$work/r2" "${tiny[@]}"

# a damaged tokenizer: refused before it is copied into the run folder
printf 'the cat sees the dog. the dog sees the cat.\n%.0s' $(seq 1 300) >"$work/corpus.txt"
"$GPC" data prepare --input "$work/corpus.txt" --out "$work/text" --vocab-size 270 \
  >"$work/out" 2>&1 || fail "prepare: $(cat "$work/out")"
size=$(stat -c %s "$work/text/tokenizer.bin")
printf '\x01' | dd of="$work/text/tokenizer.bin" bs=1 seek=$((size - 10)) conv=notrunc status=none
expect_exit 1 "checksum mismatch" "$GPC" train --data "$work/text" --out "$work/r3" "${tiny[@]}"
[[ -e $work/r3/tokenizer.bin ]] && fail "the damaged tokenizer was copied into the run"

# gpc report: the reason it cannot write, not a guess about folders
"$GPC" train --data "$work/data" --out "$work/run" "${tiny[@]}" >"$work/out" 2>&1 ||
  fail "train: $(cat "$work/out")"
touch "$work/file"
expect_exit 1 "Not a directory" "$GPC" report "$work/run" --out "$work/file/report.html"
grep -q "check that its directory exists" "$work/expect.err" &&
  fail "a wrong hint: $(cat "$work/expect.err")"
if [[ -d /sys/kernel ]] && ! touch /sys/gpc-test 2>/dev/null; then # EACCES even for root
  expect_exit 1 "Permission denied" "$GPC" report "$work/run" --out /sys/report.html
fi

# gpc sched simulate: a duration of 1e308 seconds is a typing error
if "$GPC" sched --help >/dev/null 2>&1; then
  printf 'submit,duration,gpus\n0,1e308,1\n' >"$work/huge.csv"
  expect_exit 2 "at most 100 years" "$GPC" sched simulate --trace "$work/huge.csv"
fi

if ((failures)); then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "all input error tests passed"
