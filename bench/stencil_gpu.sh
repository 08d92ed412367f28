#!/usr/bin/env bash
# stencil_gpu.sh: gpc stencil on one GPU against the same GPU's copy rate,
# for each update kernel (GPC_STENCIL_KERNEL). For f64 and f32 at 512^3 and
# 1024^3, one slab and two (the two-stream halo path), each run prints its
# rate as memory traffic (a read and a write of an element a point) beside
# cudaMemcpy device-to-device measured in the same call (bytes read plus
# written, the best of 5 copies of up to 2 GiB). The goal is 90% of the
# copy rate. Prints a RESULT line a run, a table, and the fastest kernel of
# each precision and size; every run's output and JSON stay in the log
# folder. About 2 minutes on an H200 with the defaults.
#
#   bench/stencil_gpu.sh [GPC]             (default build/gpc)
#   bench/stencil_gpu.sh --sanitize [BUILD] compute-sanitizer memcheck on the
#                                           GPU test, racecheck and synccheck
#                                           on small runs of every kernel
#                                           (default build)
#
# Environment: DEVICE (default cuda:0), LOGS (default a new folder under
# /tmp, printed), SIZES (default "512 1024"), PRECISIONS (default "f64
# f32"), DOMAINS (default "1 2"), KERNELS (default "vector column plain
# shared twostep async stream2"), STEPS512 (default 300), STEPS1024
# (default 100). The two-step kernels (twostep, stream2) pair steps with
# one domain only; with two they step one at a time with vector.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

if [[ ${1:-} == --sanitize ]]; then
  build=${2:-$root/build}
  command -v compute-sanitizer >/dev/null || export PATH=$PATH:/usr/local/cuda/bin
  cs=(compute-sanitizer --error-exitcode 9)
  set -x
  "${cs[@]}" --tool memcheck "$build/tests/gpu_test_cuda_stencil"
  for kernel in ${KERNELS:-vector column plain shared twostep async stream2}; do
    export GPC_STENCIL_KERNEL=$kernel
    for tool in racecheck synccheck; do
      for p in f64 f32; do
        "${cs[@]}" --tool "$tool" "$build/gpc" stencil --device "${DEVICE:-cuda:0}" --precision "$p" \
          --n 70 --steps 6 --domains 3
        "${cs[@]}" --tool "$tool" "$build/gpc" stencil --device "${DEVICE:-cuda:0}" --precision "$p" \
          --n 45 --steps 4
      done
    done
    "${cs[@]}" --tool memcheck "$build/gpc" stencil --device "${DEVICE:-cuda:0}" --n 70 --steps 6 --domains 70
    "${cs[@]}" --tool memcheck "$build/gpc" stencil --device "${DEVICE:-cuda:0}" --n 131 --steps 5
  done
  unset GPC_STENCIL_KERNEL
  # stream2's other tiles
  if [[ " ${KERNELS:-stream2} " == *" stream2 "* ]]; then
    for rows in 6 30; do
      for tool in memcheck racecheck synccheck; do
        GPC_STENCIL_KERNEL=stream2 GPC_STENCIL_STREAM2_ROWS=$rows "${cs[@]}" --tool "$tool" "$build/gpc" \
          stencil --device "${DEVICE:-cuda:0}" --precision f32 --n 131 --steps 5
      done
    done
  fi
  exit 0
fi

gpc=${1:-$root/build/gpc}
[[ -x $gpc ]] || { echo "stencil_gpu.sh: $gpc not built: make" >&2; exit 1; }
device=${DEVICE:-cuda:0}
logs=${LOGS:-$(mktemp -d /tmp/gpc-stencil-gpu-XXXXXX)}
mkdir -p "$logs"
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv 2>&1 || true; } >"$logs/gpu.txt"
"$gpc" --version >>"$logs/gpu.txt" 2>&1 || true
for kernel in ${KERNELS:-vector column plain shared twostep async stream2}; do
  for n in ${SIZES:-512 1024}; do
    steps=$([[ $n -ge 1024 ]] && echo "${STEPS1024:-100}" || echo "${STEPS512:-300}")
    for p in ${PRECISIONS:-f64 f32}; do
      for d in ${DOMAINS:-1 2}; do
        name=$kernel-$p-$n-d$d
        echo "== GPC_STENCIL_KERNEL=$kernel gpc stencil --device $device --precision $p --n $n --steps $steps --domains $d" | tee "$logs/$name.txt"
        GPC_STENCIL_KERNEL=$kernel "$gpc" stencil --device "$device" --precision "$p" --n "$n" \
          --steps "$steps" --domains "$d" --json "$logs/$name.json" 2>&1 | tee -a "$logs/$name.txt" |
          grep -v "^step " || echo "== $name failed: $logs/$name.txt"
      done
    done
  done
done
python3 - "$logs" <<'PY'
import glob, json, os, sys
rows = []
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    j = json.load(open(path))
    copy = j["copy_gb_per_s"]
    rows.append(dict(j, ratio=j["gb_per_s"] / copy if copy > 0 else 0.0))
rows.sort(key=lambda j: (j["precision"], j["n"], j["domains"], -j["ratio"]))
for j in rows:
    print(f"RESULT stencil kernel={j['kernel']} precision={j['precision']} n={j['n']} "
          f"domains={j['domains']} steps={j['steps']} glups={j['glups']:.2f} "
          f"gb_per_s={j['gb_per_s']:.0f} copy_gb_per_s={j['copy_gb_per_s']:.0f} "
          f"of_copy={j['ratio']:.3f} error={j['error']:.2g} checksum={j['checksum']}")
print()
print("| kernel | precision | n | domains | steps | G updates/s | GB/s | copy GB/s | of copy | error |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for j in rows:
    print(f"| {j['kernel']} | {j['precision']} | {j['n']}^3 | {j['domains']} | {j['steps']} | "
          f"{j['glups']:.2f} | {j['gb_per_s']:.0f} | {j['copy_gb_per_s']:.0f} | {j['ratio']:.1%} | "
          f"{j['error']:.2g} |")
print()
# the fastest kernel of each case, and whether every kernel's field had the
# same checksum (f64: the CPU's bits; f32: the same arithmetic)
cases = {}
for j in rows:
    cases.setdefault((j["precision"], j["n"], j["domains"]), []).append(j)
short = 0
for (p, n, d), js in sorted(cases.items()):
    best = max(js, key=lambda j: j["ratio"])
    short += best["ratio"] < 0.9
    same = len({j["checksum"] for j in js}) == 1
    print(f"BEST {p} {n}^3 domains={d}: {best['kernel']} at {best['ratio']:.1%} of the copy rate"
          f"{'' if same else '; CHECKSUMS DIFFER between kernels'}")
print(f"{len(cases) - short} of {len(cases)} cases at 90% of the copy rate or more with their fastest kernel")
PY
echo "logs: $logs"
