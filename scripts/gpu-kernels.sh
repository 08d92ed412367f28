#!/usr/bin/env bash
# gpu-kernels.sh: every kernel of one GPT-2 training step on the GPU, timed
# one by one by Nsight Compute and summed by kernel name: which kernels each
# op launches (does cuBLASLt's GELU epilogue run as a kernel of its own?),
# how long each takes, and so how far each is from the GPU's bandwidth or
# FLOP ceiling. ncu runs with --clock-control none (the clocks stay as they
# are) and profiles only the NVTX range "timed-step" of bench_gpt2_step.
#
#   scripts/gpu-kernels.sh [BUILD]    (BUILD: a CUDA build, default build-gpu,
#                                      the folder scripts/gpu-check.sh builds)
#
# Environment: BATCH (default 16: the shapes of GPT-2's step at a quarter of
# its micro-batch, so ncu's replays take about a minute), ACCUM (1), OUT,
# KERNELS (a regular expression: only the kernels it matches), METRICS (more
# ncu metrics, comma-separated, summed by name beside the time, e.g.
# dram__bytes_read.sum), CACHE (ncu's --cache-control: all, the default,
# empties the caches before each kernel; none keeps what the kernel before
# left in L2, as in a real step).
# STEP=decode times one serving decode step instead: the NVTX range
# "decode-step-ROWS-graphs-off" of bench_decode_step (its last step launched
# kernel by kernel, no graph), ROWS (1) rows at CONTEXT (256), and lists
# its kernels in launch order before the sums.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-gpu}
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
bench=$build/bench/bench_gpt2_step
range=timed-step
args=(--batch "${BATCH:-16}" --accum "${ACCUM:-1}" --steps 1 --warmup 1)
case ${STEP:-train} in
train) ;;
decode)
  bench=$build/bench/bench_decode_step
  range=decode-step-${ROWS:-1}-graphs-off
  args=(--rows "${ROWS:-1}" --context "${CONTEXT:-256}" --reps 3) ;;
*) echo "gpu-kernels: STEP=$STEP is not train or decode" >&2; exit 2 ;;
esac
case ${CACHE:-all} in all | none) ;; *)
  echo "gpu-kernels: CACHE=$CACHE is not all or none (ncu's --cache-control)" >&2; exit 2 ;;
esac
[[ -x $bench ]] || { echo "gpu-kernels: $bench is missing; build first (scripts/gpu-check.sh build)" >&2; exit 1; }
command -v ncu >/dev/null || { echo "gpu-kernels: ncu is not on the PATH" >&2; exit 1; }
csv=$out/kernels.csv
metrics=gpu__time_duration.sum${METRICS:+,$METRICS}
filter=()
[[ -n ${KERNELS:-} ]] && filter=(-k "regex:$KERNELS")
timeout 500 ncu --clock-control none --cache-control "${CACHE:-all}" --nvtx --nvtx-include "$range/" \
  "${filter[@]}" --metrics "$metrics" --csv --page raw \
  "$bench" "${args[@]}" >"$csv" 2>"$out/kernels.err"
echo "ncu exit $? ($(grep -c '^"' "$csv") lines)"
# columns: find "Kernel Name" and "gpu__time_duration.sum" by header
python3 - "$csv" "$metrics" "${STEP:-train}" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
head = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
cols = rows[head]
metrics = sys.argv[2].split(",")
name, dur = cols.index("Kernel Name"), cols.index(metrics[0])
extra = [cols.index(m) for m in metrics[1:] if m in cols]
unit = rows[head + 1][dur] if len(rows) > head + 1 else ""
total, count = collections.Counter(), collections.Counter()
sums = collections.defaultdict(lambda: [0.0] * len(extra))
def num(r, c):
    return float(r[c].replace(",", ""))
for r in rows[head + 1:]:
    try:
        t = num(r, dur)
        e = [num(r, c) for c in extra]
    except (ValueError, IndexError):
        continue
    k = r[name][:90]
    total[k] += t
    count[k] += 1
    sums[k] = [a + b for a, b in zip(sums[k], e)]
grand = sum(total.values())
if sys.argv[3] == "decode":
    for r in rows[head + 1:]:
        try:
            print(f"{num(r, dur):12.1f}  {r[name][:110]}")
        except (ValueError, IndexError):
            pass
names = "".join(f" {cols[c][:24]:>24}" for c in extra)
units = " ".join(rows[head + 1][c] for c in extra)
print(f"{'kernel':90} {'calls':>6} {'time':>12} {'share':>6}{names}  ({unit} {units})")
for k, t in total.most_common():
    more = "".join(f" {v:24.1f}" for v in sums[k])
    print(f"{k:90} {count[k]:6d} {t:12.1f} {100 * t / grand:5.1f}%{more}")
print(f"{'total':90} {sum(count.values()):6d} {grand:12.1f}")
PY
