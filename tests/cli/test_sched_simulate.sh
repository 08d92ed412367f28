#!/usr/bin/env bash
# test_sched_simulate.sh: gpc sched trace and gpc sched simulate end to end:
# a hand-made trace whose completion times are worked out by hand (FIFO and
# EASY backfill), the JSON and table outputs, generated traces (same seed,
# same file), the goal on a 5,000-job Philly-like trace (the best policy at
# least 2x lower mean JCT than FIFO, worst wait not much above FIFO's), and
# each kind of error with its one-line message and exit status.
set -euo pipefail
GPC=${GPC:?set GPC to the gpc binary}
"$GPC" sched --help | grep -q simulate || { echo "skip: gpc built without the scheduler"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# 2 GPUs; A holds one until 100; B needs both; C (limit 40) can run before B
# could start (100) and backfills; D (limit 200) would delay B and waits.
cat >"$work/hand.csv" <<'CSV'
# submit, duration, GPUs, priority, time limit (seconds)
submit,duration,gpus,priority,time_limit
0,100,1,normal,100
1,50,2,normal,60
2,30,1,normal,40
3,200,1,normal,200
CSV
"$GPC" sched simulate --trace "$work/hand.csv" --gpus 2 --policy fifo backfill --json --per-job >"$work/hand.json"
python3 - "$work/hand.json" <<'PY' || fail "hand trace: $(cat "$work/hand.json")"
import json, sys
r = {x["policy"]: x for x in json.load(open(sys.argv[1]))["results"]}
assert r["fifo"]["jct"] == [100, 149, 178, 347], r["fifo"]["jct"]
assert r["backfill"]["jct"] == [100, 149, 30, 347], r["backfill"]["jct"]
assert r["fifo"]["mean_jct"] == (100 + 149 + 178 + 347) / 4
assert r["backfill"]["mean_jct"] == (100 + 149 + 30 + 347) / 4
assert r["fifo"]["median_jct"] == (149 + 178) / 2 and r["fifo"]["p95_jct"] == 347
assert r["fifo"]["makespan"] == 350 and r["fifo"]["completed"] == 4
# GPU-seconds 100 + 2*50 + 30 + 200 over 2 GPUs x 350 s
assert abs(r["fifo"]["utilization"] - 430 / 700) < 1e-12
# waits: FIFO 0, 99, 148, 147; backfill 0, 99, 0, 147
assert r["fifo"]["worst_wait"] == 148 and r["fifo"]["worst_wait_line"] == 5
assert r["backfill"]["worst_wait"] == 147 and r["backfill"]["worst_wait_line"] == 6
PY
"$GPC" sched simulate --trace "$work/hand.csv" --gpus 2 --policy fifo >"$work/hand.txt"
grep -q "^4 jobs on 2 GPUs; times in hours" "$work/hand.txt" || fail "table header: $(cat "$work/hand.txt")"
grep -Eq "^fifo +0\.05 +0\.05 +0\.10 +0\.1 +61\.4% " "$work/hand.txt" || fail "table row: $(cat "$work/hand.txt")"

# generated traces: the summary, the header, same seed -> same file
seed=$((RANDOM * 32768 + RANDOM))
"$GPC" sched trace --jobs 5000 --seed "$seed" --out "$work/a.csv" 2>"$work/summary"
grep -Eq "^gpc sched trace: 5000 jobs over [0-9.]+ days \([0-9]+% single-GPU\), [0-9]+ GPU-hours, offered load 1\.0[0-9] on 64 GPUs -> $work/a.csv$" "$work/summary" ||
  fail "trace summary: $(cat "$work/summary")"
[[ $(head -1 "$work/a.csv") == "submit,duration,gpus,priority,time_limit" ]] || fail "trace header"
[[ $(wc -l <"$work/a.csv") == 5001 ]] || fail "trace lines: $(wc -l <"$work/a.csv")"
"$GPC" sched trace --jobs 5000 --seed "$seed" --out "$work/b.csv" 2>/dev/null
cmp -s "$work/a.csv" "$work/b.csv" || fail "seed $seed gave two different traces"
"$GPC" sched trace --jobs 5000 --seed $((seed + 1)) --out "$work/c.csv" 2>/dev/null
cmp -s "$work/a.csv" "$work/c.csv" && fail "seeds $seed and $((seed + 1)) gave the same trace"

# the goal, on the trace bench/sched_simulate.sh measures (seed 1, load 1.0)
"$GPC" sched trace --jobs 5000 --seed 1 --out "$work/philly.csv" 2>/dev/null
"$GPC" sched simulate --trace "$work/philly.csv" --json \
  --policy fifo priority,aging,backfill,shortest_first >"$work/goal.json"
python3 - "$work/goal.json" <<'PY' || fail "goal: $(cat "$work/goal.json")"
import json, sys
fifo, best = json.load(open(sys.argv[1]))["results"]
gain = fifo["mean_jct"] / best["mean_jct"]
print(f"mean JCT: FIFO {fifo['mean_jct']/3600:.2f} h, best {best['mean_jct']/3600:.2f} h ({gain:.2f}x); "
      f"worst wait {best['worst_wait']/3600:.1f} h (FIFO {fifo['worst_wait']/3600:.1f} h)")
assert gain >= 2.0, gain
assert best["worst_wait"] <= 1.25 * fifo["worst_wait"]
assert best["jobs"] == 5000 and best["completed"] == 5000
PY

# elastic jobs on the same trace: each set twice, rigid then half elastic;
# the elastic run completes every job and is not worse in mean JCT
"$GPC" sched simulate --trace "$work/philly.csv" --json --policy all --elastic 0.5 >"$work/elastic.json"
python3 - "$work/elastic.json" <<'PY' || fail "elastic: $(cat "$work/elastic.json")"
import json, sys
rigid, elastic = json.load(open(sys.argv[1]))["results"]
print(f"mean JCT: rigid {rigid['mean_jct']/3600:.2f} h, half elastic {elastic['mean_jct']/3600:.2f} h, "
      f"{elastic['resizes']} resizes")
assert rigid["elastic"] == 0 and rigid["elastic_jobs"] == 0 and rigid["resizes"] == 0
assert elastic["elastic"] == 0.5 and 2000 < elastic["elastic_jobs"] <= 2500
assert elastic["completed"] == 5000 and elastic["mean_jct"] > 0
assert elastic["mean_jct"] <= rigid["mean_jct"]
PY

# errors: one line, exit 2 for bad input, 1 for what went wrong around it
expect() { # status message-part command...
  local want=$1 needle=$2; shift 2
  set +e; err=$("$GPC" "$@" 2>&1 >/dev/null); rc=$?; set -e
  [[ $rc == "$want" ]] || fail "gpc $* exited $rc, want $want ($err)"
  [[ $(printf '%s\n' "$err" | wc -l) == 1 && $err == "gpc sched "*": error: "*"$needle"* ]] ||
    fail "gpc $*: '$err' lacks '$needle'"
}
printf 'submit,duration,gpus\n0,10,1\n5,10,x\n' >"$work/bad.csv"
expect 2 "$work/bad.csv line 3: gpus 'x' is not a whole number 1-64" sched simulate --trace "$work/bad.csv"
printf 'submit,duration,gpus,cost\n' >"$work/bad2.csv"
expect 2 "$work/bad2.csv line 1: unknown column 'cost'" sched simulate --trace "$work/bad2.csv"
printf 'submit,duration,gpus\n0,10,2\n' >"$work/big.csv"
expect 2 "the job on trace line 2 needs 2 GPUs; the simulated cluster has 1 (use --gpus)" sched simulate --trace "$work/big.csv" --gpus 1
expect 1 "$work/none.csv" sched simulate --trace "$work/none.csv"
expect 2 "--trace FILE is required" sched simulate --policy fifo
expect 2 "--elastic is a share of the jobs, 0-1, not 2" sched simulate --trace "$work/hand.csv" --elastic 2
expect 2 "unknown policy 'sjf'" sched simulate --trace "$work/hand.csv" --policy fifo sjf
expect 2 "--gpus 65 is outside 1-64" sched simulate --trace "$work/hand.csv" --gpus 65
expect 2 "unknown option 'nonsense'" sched simulate --trace "$work/hand.csv" --set nonsense=1
expect 2 "--set 'aging' is not KEY=VALUE" sched simulate --trace "$work/hand.csv" --set aging
expect 2 "--out FILE is required" sched trace --jobs 10
expect 2 "a trace needs 1 to 10,000,000 jobs, not 0" sched trace --jobs 0 --out "$work/z.csv"
expect 2 "load -1 is outside (0, 10]" sched trace --load -1 --out "$work/z.csv"
expect 1 "$work/no/such/dir" sched trace --jobs 10 --out "$work/no/such/dir/t.csv"
echo "ok"
