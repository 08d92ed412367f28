#!/usr/bin/env bash
# test_stencil_mpi.sh: `gpc stencil` split across 2 and 4 processes by
# mpirun, one and two slabs each, gives the one-process run's field to the
# last bit (the same checksum of every point's bits, centre value and
# errors in the JSON), on a grid whose planes do not divide evenly; only
# rank 0 prints; a grid with fewer planes than processes is refused with
# the reason; SIGTERM to one rank stops every rank, with the summary.
# Skipped (77) without mpirun or without MPI in this build.
set -u
GPC=${GPC:?set GPC to the gpc binary}
command -v mpirun >/dev/null 2>&1 || { echo "mpirun not found: skipped"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/gpc-stencil-mpi-XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent=
export OMP_NUM_THREADS=1 ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
mpi=(mpirun --oversubscribe --bind-to none -np)

args=(--n 27 --steps 30 --r 0.16 --mode 2,3,1)
"$GPC" stencil "${args[@]}" --json "$work/one.json" >"$work/one.out" 2>&1 || fail "one process: $(cat "$work/one.out")"
if ! "${mpi[@]}" 2 "$GPC" stencil "${args[@]}" --json "$work/np2.json" >"$work/np2.out" 2>&1; then
  grep -q "built without MPI" "$work/np2.out" && { echo "gpc built without MPI: skipped"; exit 77; }
  fail "2 processes: $(cat "$work/np2.out")"
fi
"${mpi[@]}" 2 "$GPC" stencil "${args[@]}" --domains 2 --json "$work/np2d2.json" >"$work/np2d2.out" 2>&1 ||
  fail "2 processes x 2 domains: $(cat "$work/np2d2.out")"
"${mpi[@]}" 4 "$GPC" stencil "${args[@]}" --json "$work/np4.json" >"$work/np4.out" 2>&1 ||
  fail "4 processes: $(cat "$work/np4.out")"
python3 - "$work" <<'PY' || exit 1
import json, sys
w = sys.argv[1]
one = json.load(open(f"{w}/one.json"))
assert one["processes"] == 1 and one["error"] < 1e-13, one
for name, np_, dom in (("np2", 2, 1), ("np2d2", 2, 2), ("np4", 4, 1)):
    j = json.load(open(f"{w}/{name}.json"))
    assert (j["processes"], j["domains"], j["steps"]) == (np_, dom, 30), (name, j)
    for key in ("checksum", "center", "error", "heat_error", "lambda"):
        assert j[key] == one[key], (name, key, j[key], one[key])
    out = open(f"{w}/{name}.out").read()
    # rank 0 alone prints: one summary, one checksum line
    assert out.count("field checksum " + one["checksum"]) == 1, (name, out)
    assert f"27^3 points in {np_} processes x {dom} domain" in out, (name, out)
PY

# the halos' path in the JSON; NCCL halos on the CPU are a usage error
python3 -c 'import json, sys; h = json.load(open(sys.argv[1]))["halos"]; assert h == "mpi", h' \
  "$work/np2.json" || fail "np2's halos: $(cat "$work/np2.json")"
python3 -c 'import json, sys; h = json.load(open(sys.argv[1]))["halos"]; assert h == "none", h' \
  "$work/one.json" || fail "one process's halos: $(cat "$work/one.json")"
if "${mpi[@]}" 2 "$GPC" stencil --n 8 --halos nccl >"$work/nccl.out" 2>&1; then fail "--halos nccl on the CPU ran"; fi
grep -q "halos nccl is for GPUs in several processes" "$work/nccl.out" || fail "--halos nccl on the CPU: $(cat "$work/nccl.out")"

# 3 planes cannot go to 4 processes: every rank refuses, a usage error
if "${mpi[@]}" 4 "$GPC" stencil --n 3 >"$work/bad.out" 2>&1; then fail "n 3 on 4 processes ran"; fi
grep -q "4 processes x 1 domains for 3 planes" "$work/bad.out" || fail "n 3 on 4 processes: $(cat "$work/bad.out")"

# SIGTERM to one rank (as a batch system's signal may reach one task
# first): the ranks agree every ten steps, so all stop together and rank 0
# prints the stop line and the summary. (mpirun itself kills its ranks soon
# after it forwards a signal, before any summary.)
"${mpi[@]}" 2 "$GPC" stencil --n 40 --steps 100000000 >"$work/stop.out" 2>&1 &
launcher=$!
for ((i = 0; i < 1200; i++)); do
  grep -q "step [0-9]* of 100000000" "$work/stop.out" && break
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.1
done
rank_pid=$(pgrep -P "$launcher" | head -1)
[[ -n $rank_pid ]] || fail "no rank process under mpirun: $(cat "$work/stop.out")"
kill -TERM "$rank_pid"
wait "$launcher" && rc=0 || rc=$?
[[ $rc -ne 0 ]] || fail "mpirun exited 0 after a rank's SIGTERM"
grep -Eq "stopped by (SIGTERM|a signal to another process) at step [0-9]* of 100000000" "$work/stop.out" ||
  fail "no stop line: $(tail -5 "$work/stop.out")"
grep -q "field vs the discrete operator's decay" "$work/stop.out" || fail "no summary after the stop: $(tail -5 "$work/stop.out")"
echo "stencil over MPI: ok"
