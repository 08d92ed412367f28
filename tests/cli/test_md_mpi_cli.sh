#!/usr/bin/env bash
# test_md_mpi_cli.sh: `gpc md` split across processes. `mpirun -np 2` and
# `gpc launch --nproc 2 -- gpc md --device cpu` print the table of one
# process (the JSON's rows within 1e-9 per atom: only the order of the
# force sums differs), say so in the JSON, and write the same trajectory
# frames (positions within 1e-8); rank 0 alone prints. A GPU split run and
# slabs narrower than cutoff + skin are refused with what to do.
# Skipped (77) without mpirun or without MPI in this build.
set -u
GPC=${GPC:?set GPC to the gpc binary}
GPC=$(cd "$(dirname "$GPC")" && pwd)/$(basename "$GPC")
command -v mpirun >/dev/null 2>&1 || { echo "mpirun not found: skipped"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/gpc-md-mpi-XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent=
export OMP_NUM_THREADS=1 ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
mpi=(mpirun --oversubscribe --bind-to none -np)
run=(md --cells 7 --steps 40 --thermo 10 --dump-every 20)

"$GPC" "${run[@]}" --json "$work/one.json" --dump "$work/one.xyz" >"$work/one.out" 2>&1 ||
  fail "one process: $(tail -2 "$work/one.out")"
if ! "${mpi[@]}" 2 "$GPC" "${run[@]}" --json "$work/two.json" --dump "$work/two.xyz" \
  >"$work/two.out" 2>&1; then
  grep -q "built without MPI" "$work/two.out" && { echo "no MPI in this build: skipped"; exit 77; }
  fail "mpirun -np 2: $(tail -3 "$work/two.out")"
fi
unset OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
"$GPC" launch --nproc 2 -- "$GPC" "${run[@]}" --device cpu --json "$work/launch.json" \
  --dump "$work/launch.xyz" >"$work/launch.out" 2>&1 || fail "gpc launch: $(tail -3 "$work/launch.out")"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
python3 - "$work" <<'PY' || fail "the split runs differ from one process's (above)"
import json, sys
w = sys.argv[1]
one = json.load(open(f"{w}/one.json"))
for name in ("two", "launch"):
    r = json.load(open(f"{w}/{name}.json"))
    assert r["processes"] == 2 and one["processes"] == 1, (name, r["processes"])
    assert r["atoms"] == one["atoms"] == 1372 and r["pairs"] == one["pairs"], name
    assert r["neighbor_builds"] == one["neighbor_builds"], name
    assert [t["step"] for t in r["thermo"]] == [0, 10, 20, 30, 40], name
    for a, b in zip(one["thermo"], r["thermo"]):
        for k in ("temperature", "potential", "total", "pressure"):
            assert abs(a[k] - b[k]) < 1e-9, (name, a["step"], k, a[k], b[k])
def frames(path):
    lines = open(path).read().splitlines()
    at, out = 0, []
    while at < len(lines):
        n = int(lines[at])
        out.append([tuple(map(float, l.split()[1:])) for l in lines[at + 2:at + 2 + n]])
        at += 2 + n
    return out
f1, f2 = frames(f"{w}/one.xyz"), frames(f"{w}/two.xyz")
assert len(f1) == len(f2) == 3, (len(f1), len(f2))
box = one["box"]
for a, b in zip(f1, f2):
    for p, q in zip(a, b):
        for u, v in zip(p, q):
            d = abs(u - v)
            assert min(d, box - d) < 1e-8, (p, q)
PY
# one table: rank 0's
[[ $(grep -c "^ *Step " "$work/two.out") -eq 1 ]] || fail "more than one table: $(cat "$work/two.out")"
grep -q "cpu, 2 processes" "$work/two.out" || fail "no process count: $(head -1 "$work/two.out")"

# on GPUs: float32 forces are refused; a GPU that is not there stops every
# process with the reason (none waits for the others)
"${mpi[@]}" 2 "$GPC" md --cells 5 --device cuda --forces f32 >"$work/gpu.out" 2>&1
rc=$?
[[ $rc -ne 0 ]] && grep -q "computes pair forces in float64: leave out --forces f32" "$work/gpu.out" ||
  fail "float32 forces on GPUs over processes (exit $rc): $(tail -2 "$work/gpu.out")"
timeout 120 "${mpi[@]}" 2 "$GPC" md --cells 5 --device cuda:99 >"$work/gpu.out" 2>&1
rc=$?
[[ $rc -ne 0 && $rc -ne 124 ]] && grep -Eq "GPU|CUDA" "$work/gpu.out" ||
  fail "a split run on a GPU that is not there (exit $rc): $(head -20 "$work/gpu.out")"
# processes gpc launch started on GPUs: the slabs exchange over MPI, which
# it does not start (a CPU run it hands to mpirun itself)
GPC_RANK=1 GPC_WORLD_SIZE=2 GPC_LOCAL_RANK=1 GPC_MASTER_ADDR=127.0.0.1 GPC_MASTER_PORT=29999 \
  "$GPC" md --cells 5 --device cuda >"$work/launch.out" 2>&1
rc=$?
[[ $rc -eq 2 ]] && grep -q "which gpc launch does not start: run mpirun -np 2 gpc md" "$work/launch.out" ||
  fail "gpc launch's processes on GPUs (exit $rc): $(tail -2 "$work/launch.out")"
"${mpi[@]}" 3 "$GPC" md --cells 5 >"$work/narrow.out" 2>&1
rc=$?
[[ $rc -ne 0 ]] && grep -q "narrower than cutoff + skin (2.8): use at most 2 processes" "$work/narrow.out" ||
  fail "slabs too narrow (exit $rc): $(tail -2 "$work/narrow.out")"

# --halos: a word it does not know, and NCCL on the CPU, are usage errors
"$GPC" md --cells 5 --halos gpu >"$work/halos.out" 2>&1
rc=$?
[[ $rc -eq 2 ]] && grep -q -- "--halos gpu: use auto, nccl or host" "$work/halos.out" ||
  fail "--halos gpu (exit $rc): $(tail -2 "$work/halos.out")"
"${mpi[@]}" 2 "$GPC" md --cells 5 --halos nccl >"$work/halos.out" 2>&1
rc=$?
[[ $rc -ne 0 ]] && grep -q -- "--halos nccl is for GPUs in several processes" "$work/halos.out" ||
  fail "--halos nccl on the CPU (exit $rc): $(tail -2 "$work/halos.out")"

[[ $failures -eq 0 ]] && echo "md over MPI: ok"
exit $((failures > 0))
