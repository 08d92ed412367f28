#!/usr/bin/env bash
# sched_simulate.sh: gpcd's policies on synthetic Philly-like traces.
#
# Generates a trace of JOBS jobs (default 5000) with `gpc sched trace` at
# offered loads 0.8, 0.9 and 1.0 on 64 GPUs, runs each policy set through
# `gpc sched simulate` (the real scheduling pass on a simulated clock) and
# prints one Markdown table per load: mean, median and p95 job completion
# time (JCT), makespan, utilisation, mean and worst wait, and the gain in
# mean JCT over FIFO. The goal (issue 7): the best policy at least 2x lower
# mean JCT than FIFO, with a worst wait no worse than FIFO's (no starvation).
#
#   bench/sched_simulate.sh [JOBS] [SEED]     GPC=path/to/gpc to pick the binary
set -euo pipefail
jobs=${1:-5000}
seed=${2:-1}
here=$(cd "$(dirname "$0")/.." && pwd)
GPC=${GPC:-$here/build/gpc}
[[ -x $GPC ]] || { echo "sched_simulate.sh: no gpc at $GPC (build it, or set GPC)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

policies=(
  fifo
  priority
  priority,aging
  backfill
  priority,aging,backfill
  priority,aging,least_loaded,binpack,task_type,locality,backfill,preemption
  shortest_first,aging,backfill
  priority,aging,backfill,shortest_first
  priority,aging,least_loaded,binpack,task_type,locality,backfill,shortest_first
)

for load in 0.8 0.9 1.0; do
  "$GPC" sched trace --jobs "$jobs" --seed "$seed" --load "$load" --out "$work/trace.csv" 2>"$work/summary"
  echo
  echo "### $jobs jobs, seed $seed, offered load $load on 64 GPUs"
  echo
  sed 's/^gpc sched trace: /trace: /' "$work/summary"
  echo
  "$GPC" sched simulate --trace "$work/trace.csv" --gpus 64 --json --policy "${policies[@]}" >"$work/result.json"
  python3 - "$work/result.json" <<'PY'
import json, sys
results = json.load(open(sys.argv[1]))["results"]
fifo = next(r for r in results if r["policy"] == "fifo")
h = 3600.0
print("| policy | mean JCT (h) | median (h) | p95 (h) | makespan (h) | util | mean wait (h) | worst wait (h) | preemptions | vs FIFO |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
best = min(results, key=lambda r: r["mean_jct"])
for r in results:
    name = r["policy"].replace(",", ", ")
    if r is best:
        name = "**" + name + "**"
    print(f"| {name} | {r['mean_jct']/h:.2f} | {r['median_jct']/h:.2f} | {r['p95_jct']/h:.2f} | "
          f"{r['makespan']/h:.0f} | {100*r['utilization']:.1f}% | {r['mean_wait']/h:.2f} | "
          f"{r['worst_wait']/h:.1f} | {r['preemptions']} | {fifo['mean_jct']/r['mean_jct']:.2f}x |")
print()
print(f"best: {best['policy']}: mean JCT {fifo['mean_jct']/best['mean_jct']:.2f}x lower than FIFO; "
      f"worst wait {best['worst_wait']/h:.1f} h (FIFO {fifo['worst_wait']/h:.1f} h)")
PY
done
