#!/usr/bin/env bash
# test_doctor_input.sh: an input-bound run provoked on the CPU and named.
# A tiny `gpc train` whose loader sleeps GPC_LOADER_DELAY_MS before each
# batch records, in metrics.jsonl, a step that waits most of its time for
# input (input_wait, input_wait_ms); `gpc doctor --run` names input_bound
# with the median figures, which are checked against the metrics read here.
# The same run without the delay waits little and is named by nothing.
# `gpc doctor --pid` on the running process finds its run folder from its
# --out and names input_bound too. A bad GPC_LOADER_DELAY_MS stops gpc
# train with a clear error. About 15 s (longer on a loaded machine, where
# the delay grows with the step).
set -u
GPC=${GPC:?set GPC to the gpc binary}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpc-doctor-input-XXXXXX")
train_pid=
trap '[[ -n $train_pid ]] && kill -TERM "$train_pid" 2>/dev/null; rm -rf "$work"' EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

make_dataset 300 5
train=("$GPC" train --data "$work/data" --device cpu --model d2 --context 32 --batch 4
  --eval-every 0)
"${train[@]}" --steps 12 --out "$work/fast" >"$work/out" 2>&1 || fail "train: $(cat "$work/out")"
# a step of this model takes a few ms on one core, but far more in a
# sanitizer build on a loaded machine: the delay is ten times the step just
# measured, and at least 400 ms, so that the loader dominates either way
delay=$(python3 - "$work/fast/metrics.jsonl" <<'EOF'
import json, math, statistics, sys
ms = statistics.median(json.loads(l)["ms"] for l in list(open(sys.argv[1]))[2:])
print(min(60000, max(400, math.ceil(10 * ms))))
EOF
) || { echo "no metrics from the run without delay" >&2; exit 1; }

GPC_LOADER_DELAY_MS=$delay "${train[@]}" --steps 12 --out "$work/slow" >"$work/out" 2>&1 ||
  fail "train with the delay: $(cat "$work/out")"

# the metrics: the share is the wait over the step; once the ring of
# prefetched batches has drained (4 batches), the loader's pace sets the
# loop's: each step waits the delay less what the loop did meanwhile (its
# compute and the progress line, a few ms here), most of the step
python3 - "$work/slow/metrics.jsonl" "$work/fast/metrics.jsonl" "$delay" <<'EOF' ||
import json, sys
slow = [json.loads(l) for l in open(sys.argv[1])]
fast = [json.loads(l) for l in open(sys.argv[2])]
delay = float(sys.argv[3])
for m in slow + fast:
    assert 0 <= m["input_wait_ms"] <= m["ms"], m
    assert abs(m["input_wait"] - m["input_wait_ms"] / m["ms"]) <= 1e-6, m
for m in slow[6:]:
    assert m["input_wait_ms"] >= 0.4 * delay, m
    assert m["input_wait"] > 0.5, m
EOF
  fail "metrics: see above"

# gpc doctor --run: input_bound with the medians of the steps after the first two
"$GPC" doctor --run "$work/slow" --json "$work/slow.json" >"$work/out" 2>&1
rc=$?
[[ $rc -eq 1 ]] || fail "doctor --run on the slow run: exit $rc: $(cat "$work/out")"
grep -q "PROBLEM  input-bound: the step waits [0-9]*% of its time" "$work/out" ||
  fail "doctor --run: $(cat "$work/out")"
python3 - "$work/slow.json" "$work/slow/metrics.jsonl" <<'EOF' || fail "doctor --run json: see above"
import json, statistics, sys
d = json.load(open(sys.argv[1]))
m = [json.loads(l) for l in open(sys.argv[2])][2:]
p = [f for f in d["findings"] if f["kind"] == "problem"]
assert [f["cause"] for f in p] == ["input_bound"], p
fig = p[0]["figures"]
want = statistics.median(x["input_wait"] for x in m)
assert abs(fig["input_wait"] - want) <= 1e-5 * want, (fig, want)
want_ms = statistics.median(x["input_wait_ms"] for x in m)
assert abs(fig["input_wait_ms"] - want_ms) <= 1e-5 * want_ms, (fig, want_ms)
assert "loader more threads" in p[0]["advice"][0], p
EOF

"$GPC" doctor --run "$work/fast" --json "$work/fast.json" >"$work/out" 2>&1
rc=$?
[[ $rc -eq 0 ]] || fail "doctor --run on the run without delay: exit $rc: $(cat "$work/out")"
grep -q "input-bound" "$work/out" && fail "input-bound without the delay: $(cat "$work/out")"
python3 - "$work/fast/metrics.jsonl" <<'EOF' || fail "the run without delay waits: see above"
import json, statistics, sys
m = [json.loads(l) for l in open(sys.argv[1])][2:]
assert statistics.median(x["input_wait"] for x in m) < 0.2, m
EOF

# gpc doctor --pid on the running process: its --out names the run folder
GPC_LOADER_DELAY_MS=$delay "${train[@]}" --steps 400 --out "$work/live" >"$work/live.out" 2>&1 &
train_pid=$!
for _ in $(seq 3000); do
  [[ -f $work/live/metrics.jsonl && $(wc -l <"$work/live/metrics.jsonl") -ge 8 ]] && break
  kill -0 "$train_pid" 2>/dev/null || break
  sleep 0.1
done
"$GPC" doctor --pid "$train_pid" --seconds 1 --json "$work/live.json" >"$work/out" 2>&1
python3 - "$work/live.json" "$work/live" <<'EOF' || fail "doctor --pid: $(cat "$work/out")"
import json, sys
d = json.load(open(sys.argv[1]))
p = [f for f in d["findings"] if f["kind"] == "problem" and f.get("cause")]
assert [f["cause"] for f in p] == ["input_bound"], p
assert p[0]["figures"]["input_wait"] > 0.2, p
assert any(sys.argv[2] in f["text"] for f in d["findings"] if f["kind"] == "info"), d
EOF
kill -TERM "$train_pid" 2>/dev/null
wait "$train_pid" 2>/dev/null
train_pid=

# a bad value is an error, not a run at another pace
for bad in soon -5 60001 1.5; do
  GPC_LOADER_DELAY_MS=$bad expect_exit 2 \
    "GPC_LOADER_DELAY_MS must be a whole number from 0 to 60000, not '$bad'" \
    "${train[@]}" --steps 2 --out "$work/bad"
done

[[ $failures -eq 0 ]] || exit 1
echo "doctor input-bound: ok"
