#!/usr/bin/env bash
# md_lammps.sh: Lennard-Jones molecular dynamics, gpc md against LAMMPS on
# the same machine, in one call: LAMMPS's in.lj melt benchmark (32,000 atoms
# on an fcc lattice at density 0.8442, temperature 3.0, cutoff 2.5, skin 0.3,
# the list rebuilt every 20 steps, time step 0.005), the same run in each,
# ROUNDS times in turn; prints each run's seconds and the medians' ratio.
#
#   bench/md_lammps.sh [GPC]        (default build/gpc)
#
# Environment: STEPS (default 500), ROUNDS (default 3), THREADS (default:
# the machine's cores; LAMMPS runs that many MPI ranks, gpc that many OpenMP
# threads), CELLS (default 20: 4 CELLS^3 atoms). Needs Debian's lammps
# package (apt-get install lammps) and mpirun for more than one rank.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
gpc=${1:-$root/build/gpc}
steps=${STEPS:-500}
rounds=${ROUNDS:-3}
threads=${THREADS:-$(nproc)}
cells=${CELLS:-20}
command -v lmp >/dev/null || { echo "md_lammps.sh: LAMMPS (lmp) not found: apt-get install lammps" >&2; exit 1; }
[[ -x $gpc ]] || { echo "md_lammps.sh: $gpc not built: make" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/in.lj" <<LJ
units		lj
atom_style	atomic
lattice		fcc 0.8442
region		box block 0 $cells 0 $cells 0 $cells
create_box	1 box
create_atoms	1 box
mass		1 1.0
velocity	all create 3.0 87287 loop geom
pair_style	lj/cut 2.5
pair_coeff	1 1 1.0 1.0 2.5
neighbor	0.3 bin
neigh_modify	delay 0 every 20 check no
fix		1 all nve
thermo		$steps
run		$steps
LJ
lammps=(lmp)
if [[ $threads -gt 1 ]]; then
  mpi=(mpirun -np "$threads")
  [[ $(id -u) -eq 0 ]] && mpi=(mpirun --allow-run-as-root -np "$threads")
  lammps=("${mpi[@]}" lmp)
fi
echo "== gpc md against LAMMPS, $(date -u +%Y-%m-%dT%H:%MZ), $(lscpu | sed -n 's/^Model name: *//p' | head -1), $threads cores"
echo "   $(lmp -h | grep -m1 -i 'Large-scale Atomic' || true) $(lmp -h | grep -m1 -E '^LAMMPS|version' || true)"
echo "   $((4 * cells * cells * cells)) atoms, $steps steps, rebuild every 20, ${lammps[*]} / OMP_NUM_THREADS=$threads gpc md"
lmp_times=() gpc_times=()
for r in $(seq "$rounds"); do
  (cd "$work" && "${lammps[@]}" -in in.lj -log none >"$work/lmp.out" 2>&1) || { tail "$work/lmp.out"; exit 1; }
  t=$(sed -n 's/^Loop time of \([0-9.e+-]*\) on.*/\1/p' "$work/lmp.out")
  lmp_times+=("$t")
  OMP_NUM_THREADS=$threads "$gpc" md --cells "$cells" --steps "$steps" --thermo "$steps" \
    --rebuild-every 20 --json "$work/gpc.json" >"$work/gpc.out"
  g=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['seconds'])" "$work/gpc.json")
  gpc_times+=("$g")
  echo "round $r: LAMMPS $t s, gpc $g s"
done
echo "-- LAMMPS's last thermo rows:"; grep -A2 "^ *Step" "$work/lmp.out" | head -3
echo "-- gpc's:"; grep -A2 "^ *Step" "$work/gpc.out" | head -3
python3 - "$((4 * cells * cells * cells))" "$steps" "${lmp_times[*]}" "${gpc_times[*]}" <<'PY'
import statistics, sys
n, steps = int(sys.argv[1]), int(sys.argv[2])
l = statistics.median(map(float, sys.argv[3].split()))
g = statistics.median(map(float, sys.argv[4].split()))
print(f"RESULT lammps seconds={l:.4f} atom_steps_per_s={n * steps / l:.4g}")
print(f"RESULT gpc seconds={g:.4f} atom_steps_per_s={n * steps / g:.4g}")
print(f"gpc / LAMMPS: {l / g:.3f}x (medians of {len(sys.argv[3].split())} runs each)")
PY
