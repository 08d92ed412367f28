#!/usr/bin/env bash
# md_gpu_variants.sh: gpc md on one GPU, each kernel variant at 1M, 4M and
# 16M atoms of LAMMPS's in.lj (density 0.8442, cutoff 2.5, skin 0.3,
# temperature 3, time step 0.005), one RESULT line a run, so one call
# compares the variants and picks the default. About 30 runs of a few
# seconds each.
#
#   bench/md_gpu_variants.sh [GPC]        (default build/gpc)
#
# A variant is forces/lanes/build[/step[/unroll]]:
#   forces  f64 or f32: the pair forces' precision (--forces)
#   lanes   1, 2, 4 or 8 threads per atom in the force kernel (--gpu-lanes)
#   build   f32: the list build tests candidates in float32, in float64 only
#           those within rounding of the reach; f64: each in float64
#           (--gpu-build)
#   step    split or fused (--gpu-step): the integration a kernel of its
#           own, or ending and beginning each step in the force kernel;
#           left out: gpc's default (GPC_MD_STEP)
#   unroll  1, 2, 4 or 8 partners a thread takes at a time in the force loop
#           (--gpu-unroll); left out: gpc's default (GPC_MD_UNROLL)
#
# Environment: DEVICE (default cuda:0), VARIANTS (default below), SIZES (fcc
# cells a side, default "63 100 159": 1.0M, 4.0M and 16.1M atoms), STEPS
# (per size, default "400 300 150"), THERMO (steps between thermo rows,
# default one row at the end; the pair energy is summed only for a row, so
# THERMO=20 adds an energy pass every 20 steps), BANDWIDTH (bytes/s,
# default 4.8e12: the H200's HBM3e), FP64 (flop/s, default 34e12: its
# float64 vector peak), FP32 (default 67e12), PROFILE (default 1: when nsys
# is there, the GPU time of each kernel of the first variant at the middle
# size, 100 steps).
#
# Each run sets GPC_MD_PHASES=1 (PHASES=0: not), so its RESULT line ends
# with the GPU milliseconds of each phase of the step (integrate, decide,
# build, forces, thermo) and each one's share: CUDA events between the
# phases, a few microseconds a step.
#
# The bound each RESULT line compares against: DRAM bytes per atom-step at
# BANDWIDTH and FLOPs at FP64 (f64) or FP32 (f32), from the model in
# bench/md_model.py, which says what each term is.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
gpc=${1:-$root/build/gpc}
device=${DEVICE:-cuda:0}
sizes=(${SIZES:-63 100 159})
steps_list=(${STEPS:-400 300 150})
variants=${VARIANTS:-"f64/4/f32 f64/1/f32 f64/2/f32 f64/8/f32 f64/4/f64 f32/4/f32 f32/1/f32 f32/2/f32 f32/8/f32 f32/4/f64"}
bandwidth=${BANDWIDTH:-4.8e12}
fp64=${FP64:-34e12}
fp32=${FP32:-67e12}
[[ -x $gpc ]] || { echo "md_gpu_variants.sh: $gpc not built: make" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "== gpc md variants on $device, $(date -u +%Y-%m-%dT%H:%MZ), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
echo "   in.lj: density 0.8442, cutoff 2.5, skin 0.3, T 3.0, dt 0.005; variants forces/lanes/build"
start=$(date +%s)
for s in "${!sizes[@]}"; do
  cells=${sizes[$s]}
  steps=${steps_list[$s]:-${steps_list[-1]}}
  for variant in $variants; do
    IFS=/ read -r forces lanes build step unroll <<<"$variant"
    extra=()
    [[ -n $step ]] && extra+=(--gpu-step "$step")
    [[ -n $unroll ]] && extra+=(--gpu-unroll "$unroll")
    if ! GPC_MD_PHASES=${PHASES:-1} "$gpc" md --device "$device" --cells "$cells" --steps "$steps" \
      --thermo "${THERMO:-$steps}" \
      --forces "$forces" --gpu-lanes "$lanes" --gpu-build "$build" "${extra[@]}" \
      --json "$work/run.json" \
      >"$work/run.out" 2>&1; then
      echo "RESULT variant=$variant cells=$cells FAILED: $(tail -1 "$work/run.out")"
      continue
    fi
    PYTHONPATH="$root/bench${PYTHONPATH:+:$PYTHONPATH}" python3 - "$variant" "$work/run.json" "$bandwidth" "$fp64" "$fp32" <<'PY'
import json, sys
import md_model
variant, path = sys.argv[1], sys.argv[2]
bw, fp64, fp32 = (float(a) for a in sys.argv[3:6])
r = json.load(open(path))
forces = r["forces"]
rate = r["atom_steps_per_s"]
P = md_model.partners(r)
B = md_model.steps_per_build(r)
bytes_atom = md_model.bytes_per_atom_step(r)
flops = md_model.flops_per_atom_step(r)
peak = fp32 if forces == "f32" else fp64
mem_bound = bw / bytes_atom
flop_bound = peak / flops
last = r["thermo"][-1]
print(f"RESULT variant={variant} atoms={r['atoms']} steps={r['steps']} "
      f"atom_steps_per_s={rate:.4g} steps_per_build={B:.2f} partners={P:.1f} "
      f"bytes_per_atom_step={bytes_atom:.0f} bytes_per_pair={bytes_atom / P:.2f} "
      f"memory_bound={mem_bound:.3g} of_memory_bound={100 * rate / mem_bound:.0f}% "
      f"flop_bound={flop_bound:.3g} achieved_TBps={rate * bytes_atom / 1e12:.2f} "
      f"last_row=\"{last['step']} {last['temperature']:.7f} {last['potential']:.7f} "
      f"{last['total']:.7f} {last['pressure']:.7f}\""
      + "".join(f" gpu_ms_{k}={v:.1f}" for k, v in r.get("gpu_ms", {}).items())
      + (" gpu_share=" + "/".join(f"{100 * v / max(sum(r['gpu_ms'].values()), 1e-9):.0f}"
                                  for v in r["gpu_ms"].values()) + "%"
         if "gpu_ms" in r else ""))
PY
  done
done
if [[ ${PROFILE:-1} == 1 ]] && command -v nsys >/dev/null 2>&1; then
  IFS=/ read -r forces lanes build step unroll <<<"${variants%% *}"
  cells=${sizes[$(( ${#sizes[@]} / 2 ))]}
  echo "== GPU time by kernel: variant $forces/$lanes/$build, $cells cells, 100 steps (nsys)"
  if nsys profile -o "$work/profile" --force-overwrite true "$gpc" md --device "$device" \
    --cells "$cells" --steps 100 --thermo 100 --forces "$forces" --gpu-lanes "$lanes" \
    --gpu-build "$build" ${step:+--gpu-step "$step"} ${unroll:+--gpu-unroll "$unroll"} \
    >"$work/profile.out" 2>&1; then
    # the report's name changed in 2023; either gives each kernel's total
    nsys stats --report cuda_gpu_kern_sum "$work/profile.nsys-rep" >"$work/kernels.txt" 2>&1 ||
      nsys stats --report gpukernsum "$work/profile.nsys-rep" >"$work/kernels.txt" 2>&1 || true
    grep -v '^ *$' "$work/kernels.txt" | cut -c1-200 | head -30
  else
    echo "nsys failed: $(tail -1 "$work/profile.out")"
  fi
fi
echo "== done in $(( $(date +%s) - start )) s"
