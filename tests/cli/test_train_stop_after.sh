#!/usr/bin/env bash
# test_train_stop_after.sh: `gpc train --stop-after N` stops a run early on
# its own schedule: stopped and resumed, it computes the same learning rates
# and losses as the run trained in one go; a resume that changes --steps says
# that the schedule changes. About 5 s.
set -u
GPC=${GPC:?set GPC to the gpc binary}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpc-stop-after-XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

make_dataset 64 3
train=("$GPC" train --data "$work/data" --device cpu --layers 1 --heads 2 --channels 32
  --context 16 --batch 2 --steps 8 --eval-every 0)

"${train[@]}" --out "$work/whole" >"$work/out" 2>&1 || fail "the whole run: $(cat "$work/out")"
expect_exit 0 "" "${train[@]}" --out "$work/parts" --stop-after 3
grep -q "stopped at step 3 of 8 (--stop-after)" "$work/expect.out" ||
  fail "no stop line: $(cat "$work/expect.out")"
[[ $(wc -l <"$work/parts/metrics.jsonl") -eq 3 ]] || fail "not 3 steps: $(cat "$work/parts/metrics.jsonl")"
expect_exit 0 "resuming at step 3 of 8" "${train[@]}" --out "$work/parts" --resume
# the same schedule and the same numbers, step by step (the time fields aside)
strip() { sed 's/,"tokens_per_s".*//' "$1"; }
diff <(strip "$work/whole/metrics.jsonl") <(strip "$work/parts/metrics.jsonl") >"$work/diff" ||
  fail "stopped and resumed is not the run in one go: $(head -5 "$work/diff")"

# --steps on resume changes the schedule, and says so
expect_exit 0 "changes the run's learning-rate schedule" "$GPC" train --data "$work/data" \
  --device cpu --out "$work/parts" --resume --steps 12 --eval-every 0
expect_exit 2 "--stop-after must be a positive number" "${train[@]}" --out "$work/x" --stop-after 0

if ((failures)); then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "all stop-after tests passed"
