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
# its micro-batch, so ncu's replays take about a minute), ACCUM (1), OUT.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-gpu}
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
bench=$build/bench/bench_gpt2_step
[[ -x $bench ]] || { echo "gpu-kernels: $bench is missing; build first (scripts/gpu-check.sh build)" >&2; exit 1; }
command -v ncu >/dev/null || { echo "gpu-kernels: ncu is not on the PATH" >&2; exit 1; }
csv=$out/kernels.csv
timeout 500 ncu --clock-control none --nvtx --nvtx-include "timed-step/" \
  --metrics gpu__time_duration.sum --csv --page raw \
  "$bench" --batch "${BATCH:-16}" --accum "${ACCUM:-1}" --steps 1 --warmup 1 >"$csv" 2>"$out/kernels.err"
echo "ncu exit $? ($(grep -c '^"' "$csv") lines)"
# columns: find "Kernel Name" and "gpu__time_duration.sum" by header
python3 - "$csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
head = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
cols = rows[head]
name, dur = cols.index("Kernel Name"), cols.index("gpu__time_duration.sum")
unit = rows[head + 1][dur] if len(rows) > head + 1 else ""
total, count = collections.Counter(), collections.Counter()
for r in rows[head + 1:]:
    try:
        t = float(r[dur].replace(",", ""))
    except (ValueError, IndexError):
        continue
    k = r[name][:90]
    total[k] += t
    count[k] += 1
grand = sum(total.values())
print(f"{'kernel':90} {'calls':>6} {'time':>12} {'share':>6}  ({unit})")
for k, t in total.most_common():
    print(f"{k:90} {count[k]:6d} {t:12.1f} {100 * t / grand:5.1f}%")
print(f"{'total':90} {sum(count.values()):6d} {grand:12.1f}")
PY
