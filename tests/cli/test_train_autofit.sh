#!/usr/bin/env bash
# test_train_autofit.sh: `gpc train` out of device memory goes on at half the
# micro-batch with twice the accumulation steps, on the CPU, where
# GPC_DEVICE_MEMORY_LIMIT makes the allocation fail as a full GPU would, and
# GPC_TEST_OOM_STEP makes a step fail. The run that went on at 4 x 2 computes
# bitwise the losses of the run started at micro-batch 4 with 2 accumulation
# steps (the same micro-steps in the same order), and those of the run at
# micro-batch 8 within 1e-5 (the gradient sums are rounded in another order).
# A failure after a checkpoint goes on from it; --no-auto-fit fails; at
# micro-batch 1 the error gives advice. About 10 s.
set -u
GPC=${GPC:?set GPC to the gpc binary}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpc-autofit-XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

make_dataset 300 5
train=("$GPC" train --data "$work/data" --device cpu --model d2 --context 32 --steps 6
  --eval-every 3)

# a limit between what gpc plan says micro-batch 4 and 8 need
for b in 4 8; do
  "$GPC" plan --model d2 --context 32 --batch "$b" --vocab 300 --precision fp32 --device cpu \
    --json "$work/plan$b.json" >/dev/null || fail "gpc plan at micro-batch $b"
done
limit=$(python3 -c "
import json
a=json.load(open('$work/plan4.json'))['total']; b=json.load(open('$work/plan8.json'))['total']
print((a + b) // 2)")

# the references: micro-batch 8, and 4 x 2 with as many validation windows
"${train[@]}" --batch 8 --out "$work/b8" >"$work/out" 2>&1 || fail "micro-batch 8: $(cat "$work/out")"
"${train[@]}" --batch 4 --total-batch 256 --eval-batches 40 --out "$work/b4" >"$work/out" 2>&1 ||
  fail "micro-batch 4 x 2: $(cat "$work/out")"

# the allocation fails at 8: one line, then 4 x 2
GPC_DEVICE_MEMORY_LIMIT=$limit expect_exit 0 \
  "train: out of memory at micro-batch 8 (needs 12.1 MiB by gpc plan, cpu has" \
  "${train[@]}" --batch 8 --out "$work/fit"
grep -qF "going on at micro-batch 4 x 2 accumulation steps" "$work/expect.err" ||
  fail "no going-on line: $(cat "$work/expect.err")"
grep -qF "(batch 4 x context 32 x 2 accumulation)" "$work/expect.err" ||
  fail "header not at 4 x 2: $(head -3 "$work/expect.err")"
grep -qx "batch=4" "$work/fit/config.txt" || fail "config.txt: $(grep batch "$work/fit/config.txt")"

# loss and validation loss, step by step: bitwise against 4 x 2, close to 8
compare() { # RUN REFERENCE TOLERANCE
  python3 - "$1" "$2" "$3" <<'EOF' || fail "$1 against $2: see above"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
b = [json.loads(l) for l in open(sys.argv[2] + "/metrics.jsonl")]
tol = float(sys.argv[3])
assert [x["step"] for x in a] == list(range(1, 7)), [x["step"] for x in a]
assert [x["step"] for x in b] == list(range(1, 7)), [x["step"] for x in b]
for x, y in zip(a, b):
    for key in ("loss", "val_loss", "grad_norm"):
        if key not in y:
            continue
        if tol == 0 and x[key] != y[key] or abs(x[key] - y[key]) > tol * abs(y[key]):
            sys.exit("step %d %s: %r, reference %r" % (x["step"], key, x[key], y[key]))
EOF
}
compare "$work/fit" "$work/b4" 0
compare "$work/fit" "$work/b8" 1e-5

# the same again with the first command: the run resumes at its micro-batch 4
GPC_DEVICE_MEMORY_LIMIT=$limit expect_exit 0 "resuming at 4" \
  "${train[@]}" --batch 8 --steps 8 --out "$work/fit" --resume

# a step runs out of memory: no checkpoint yet, so from the start, bitwise 4 x 2
GPC_TEST_OOM_STEP=2 expect_exit 0 "going on at micro-batch 4 x 2 accumulation steps" \
  "${train[@]}" --batch 8 --out "$work/step"
compare "$work/step" "$work/b4" 0
# after the checkpoint of step 2: from it, each step once in the metrics
GPC_TEST_OOM_STEP=4 expect_exit 0 "accumulation steps, from the last checkpoint" \
  "${train[@]}" --batch 8 --checkpoint-every 2 --out "$work/after"
compare "$work/after" "$work/b8" 1e-5

# off: the allocation's error; at micro-batch 1: advice
GPC_DEVICE_MEMORY_LIMIT=$limit expect_exit 1 "over GPC_DEVICE_MEMORY_LIMIT" \
  "${train[@]}" --batch 8 --out "$work/off" --no-auto-fit
# the folder of the run that did not fit says what it tried, so that gpc
# doctor --run can name the cause and what would fit
cp "$work/expect.err" "$work/off.log"
"$GPC" doctor --run "$work/off" --log "$work/off.log" >"$work/doctor.out" 2>&1
grep -q "PROBLEM  out of memory after 0 steps" "$work/doctor.out" ||
  fail "doctor --run of the run that did not fit: $(cat "$work/doctor.out")"
GPC_DEVICE_MEMORY_LIMIT=1M expect_exit 1 "even at micro-batch 1: use --recompute block, LoRA" \
  "${train[@]}" --batch 8 --out "$work/tiny"
grep -c "out of memory at micro-batch" "$work/expect.err" | grep -qx 3 ||
  fail "not three halvings 8, 4, 2: $(cat "$work/expect.err")"

if ((failures)); then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "train autofit: ok"
