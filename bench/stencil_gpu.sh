#!/usr/bin/env bash
# stencil_gpu.sh: gpc stencil on one GPU against the same GPU's copy rate.
# For f64 and f32 at 512^3 and 1024^3, one slab and two (the two-stream
# halo path), each run prints its rate as memory traffic (a read and a
# write of an element a point) beside cudaMemcpy device-to-device measured
# in the same call (bytes read plus written, the best of 5 copies of up to
# 2 GiB). The goal is 90% of the copy rate. Ends with a table; every run's
# output and JSON stay in the log folder.
#
#   bench/stencil_gpu.sh [GPC]             (default build/gpc)
#   bench/stencil_gpu.sh --sanitize [BUILD] compute-sanitizer memcheck on the
#                                           GPU test, racecheck and synccheck
#                                           on small runs (default build)
#
# Environment: DEVICE (default cuda:0), LOGS (default a new folder under
# /tmp, printed), SIZES (default "512 1024"), STEPS512 (default 500),
# STEPS1024 (default 200).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

if [[ ${1:-} == --sanitize ]]; then
  build=${2:-$root/build}
  command -v compute-sanitizer >/dev/null || export PATH=$PATH:/usr/local/cuda/bin
  cs=(compute-sanitizer --error-exitcode 9)
  set -x
  "${cs[@]}" --tool memcheck "$build/tests/gpu_test_cuda_stencil"
  for tool in racecheck synccheck; do
    for p in f64 f32; do
      "${cs[@]}" --tool "$tool" "$build/gpc" stencil --device "${DEVICE:-cuda:0}" --precision "$p" \
        --n 70 --steps 6 --domains 3
      "${cs[@]}" --tool "$tool" "$build/gpc" stencil --device "${DEVICE:-cuda:0}" --precision "$p" \
        --n 45 --steps 4
    done
  done
  "${cs[@]}" --tool memcheck "$build/gpc" stencil --device "${DEVICE:-cuda:0}" --n 70 --steps 6 --domains 70
  exit 0
fi

gpc=${1:-$root/build/gpc}
[[ -x $gpc ]] || { echo "stencil_gpu.sh: $gpc not built: make" >&2; exit 1; }
device=${DEVICE:-cuda:0}
logs=${LOGS:-$(mktemp -d /tmp/gpc-stencil-gpu-XXXXXX)}
mkdir -p "$logs"
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv 2>&1 || true; } >"$logs/gpu.txt"
"$gpc" --version >>"$logs/gpu.txt" 2>&1 || true
for n in ${SIZES:-512 1024}; do
  steps=$([[ $n -ge 1024 ]] && echo "${STEPS1024:-200}" || echo "${STEPS512:-500}")
  for p in f64 f32; do
    for d in 1 2; do
      name=$p-$n-d$d
      echo "== gpc stencil --device $device --precision $p --n $n --steps $steps --domains $d" | tee "$logs/$name.txt"
      "$gpc" stencil --device "$device" --precision "$p" --n "$n" --steps "$steps" --domains "$d" \
        --json "$logs/$name.json" 2>&1 | tee -a "$logs/$name.txt" | grep -v "^step "
    done
  done
done
python3 - "$logs" <<'PY'
import glob, json, os, sys
rows = []
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    j = json.load(open(path))
    rows.append((j["precision"], j["n"], j["domains"], j["steps"], j["glups"], j["gb_per_s"],
                 j["copy_gb_per_s"], j["error"]))
print("| precision | n | domains | steps | G updates/s | GB/s | copy GB/s | of copy | error |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
short = 0
for p, n, d, s, g, gb, copy, err in rows:
    ratio = gb / copy if copy > 0 else 0
    short += ratio < 0.9
    print(f"| {p} | {n}^3 | {d} | {s} | {g:.2f} | {gb:.0f} | {copy:.0f} | {ratio:.1%} | {err:.2g} |")
print(f"{len(rows) - short} of {len(rows)} runs at 90% of the copy rate or more")
PY
echo "logs: $logs"
