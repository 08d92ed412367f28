#!/usr/bin/env bash
# md_split_gpu.sh: gpc md split across MPI processes on GPUs, against one
# process on one GPU (the single-GPU kernels) at the same size, one RESULT
# line a run. With fewer GPUs than processes every process shares GPU
# DEVICE: that measures what the split path costs (host round trips at
# builds, ghosts through the host each step), not scaling.
#
#   bench/md_split_gpu.sh [GPC]        (default build/gpc)
#
# Environment: PROCS (default "1 2 4"; 1 is the one-process run),
# SIZES (fcc cells a side, default "63 100": 1.0M and 4.0M atoms), STEPS
# (default 300), SHARED (default 1: every process on DEVICE, default
# cuda:0; 0: a GPU a process by local rank).
set -euo pipefail
GPC=${1:-build/gpc}
PROCS=${PROCS:-1 2 4}
SIZES=${SIZES:-63 100}
STEPS=${STEPS:-300}
SHARED=${SHARED:-1}
DEVICE=${DEVICE:-cuda:0}
[[ -x $GPC ]] || { echo "md_split_gpu.sh: no $GPC: build first" >&2; exit 1; }
command -v mpirun >/dev/null || { echo "md_split_gpu.sh: mpirun not found" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
device=$DEVICE
[[ $SHARED == 1 ]] || device=cuda
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent=
for cells in $SIZES; do
  for np in $PROCS; do
    if [[ $np == 1 ]]; then
      run=("$GPC" md --device "$DEVICE")
    else
      run=(mpirun --oversubscribe --bind-to none -np "$np" "$GPC" md --device "$device")
    fi
    if ! "${run[@]}" --cells "$cells" --steps "$STEPS" --json "$work/r.json" >"$work/out" 2>&1; then
      echo "RESULT cells=$cells processes=$np FAILED: $(tail -2 "$work/out")"
      continue
    fi
    python3 - "$work/r.json" "$np" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
first, last = r["thermo"][0], r["thermo"][-1]
print(f"RESULT cells={r['cells']} atoms={r['atoms']} processes={sys.argv[2]} "
      f"device={r['device']} steps={r['steps']} seconds={r['seconds']:.3f} "
      f"atom_steps_per_s={r['atom_steps_per_s']:.4g} builds={r['neighbor_builds']} "
      f"pairs={r['pairs']} etotal_first={first['total']:.6f} etotal_last={last['total']:.6f}")
PY
  done
done
