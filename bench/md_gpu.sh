#!/usr/bin/env bash
# md_gpu.sh: gpc md on one GPU at 1M, 4M and 16M atoms (LAMMPS's in.lj
# density 0.8442, cutoff 2.5, skin 0.3, temperature 3, time step 0.005),
# and on the CPU at 1M atoms for comparison. Prints atom-steps a second and
# the bound that memory traffic sets, from the bytes and FLOPs per pair
# assumed below.
#
#   bench/md_gpu.sh [GPC]        (default build/gpc)
#
# Environment: DEVICE (default cuda:0), FORCES (the GPU's pair-force
# precisions to run, default "f64 f32"), STEPS (default 1000 on the GPU),
# CPU_STEPS (default 50), SIZES (fcc cells a side, default "63 100 159":
# 1.0M, 4.0M and 16.1M atoms), BANDWIDTH (bytes/s, default 4.8e12: the
# H200's HBM3e), FP64 (flop/s, default 34e12: the H200's FP64 vector peak).
#
# The model (DRAM bytes and FLOPs an atom-step) is bench/md_model.py's,
# which says what each term is; FLOPs count at FP64 only with --forces f64.
# The thermo reductions (at the end of a chunk of at most 20 steps) are left
# out of the model and in the timing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
gpc=${1:-$root/build/gpc}
device=${DEVICE:-cuda:0}
steps=${STEPS:-1000}
cpu_steps=${CPU_STEPS:-50}
sizes=${SIZES:-63 100 159}
bandwidth=${BANDWIDTH:-4.8e12}
fp64=${FP64:-34e12}
[[ -x $gpc ]] || { echo "md_gpu.sh: $gpc not built: make" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "== gpc md on $device, $(date -u +%Y-%m-%dT%H:%MZ), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
echo "   in.lj: density 0.8442, cutoff 2.5, skin 0.3, T 3.0, dt 0.005; $steps steps (CPU: $cpu_steps)"
report() { # label json
  PYTHONPATH="$root/bench${PYTHONPATH:+:$PYTHONPATH}" python3 - "$1" "$2" "$bandwidth" "$fp64" <<'PY'
import json, sys
import md_model
label, path, bw, fp64 = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
r = json.load(open(path))
rate = r["atom_steps_per_s"]
partners = md_model.partners(r)
f32 = r.get("forces") == "f32"
dram = md_model.bytes_per_atom_step(r)
flops64 = 0 if f32 else md_model.flops_per_atom_step(r)
print(f"{label:>4} {r['atoms']:>10,} atoms {r['device']:>7} {r.get('forces', ''):>3}: {rate:10.4g} atom-steps/s "
      f"({r['steps']} steps in {r['seconds']:.3f} s, {r['neighbor_builds']} builds, "
      f"{partners:.1f} partners an atom)")
if r["device"].startswith("cuda"):
    print(f"     model: {dram:.0f} B and {flops64:.0f} fp64 flop an atom-step; memory bound "
          f"{bw / dram:.3g}/s, fp64 bound {fp64 / flops64 if flops64 else float('inf'):.3g}/s; "
          f"achieved {rate * dram / 1e12:.2f} TB/s = {100 * rate * dram / bw:.0f}% of {bw / 1e12:.1f} TB/s")
PY
}
for cells in $sizes; do
  for forces in ${FORCES:-f64 f32}; do
    "$gpc" md --device "$device" --forces "$forces" --cells "$cells" --steps "$steps" \
      --thermo "$steps" --json "$work/gpu.json" >"$work/gpu.out" 2>&1 ||
      { cat "$work/gpu.out"; exit 1; }
    grep -E '^ +[0-9]+ ' "$work/gpu.out" | sed 's/^/     /'
    report GPU "$work/gpu.json"
  done
done
cells=$(echo "$sizes" | awk '{print $1}')
OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)} "$gpc" md --device cpu --cells "$cells" \
  --steps "$cpu_steps" --thermo "$cpu_steps" --json "$work/cpu.json" >"$work/cpu.out" 2>&1 ||
  { cat "$work/cpu.out"; exit 1; }
report CPU "$work/cpu.json"
