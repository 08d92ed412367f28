#!/usr/bin/env bash
# test_launch_cpu.sh: `gpc launch --nproc 2 -- gpc train --device cpu` runs
# the two processes under mpirun itself (as root too, without the caller
# setting Open MPI's variables) and computes what `mpirun -np 2 gpc train`
# computes: the same loss at every step. Without mpirun on PATH it says so
# in one line and exits 1.
# Skipped (77) without mpirun or without MPI in this build.
set -u
GPC=${GPC:?set GPC to the gpc binary}
GPC=$(cd "$(dirname "$GPC")" && pwd)/$(basename "$GPC")
command -v mpirun >/dev/null 2>&1 || { echo "mpirun not found: skipped"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/gpc-launch-cpu-XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
unset OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM OMPI_MCA_plm_rsh_agent
# MPI's own allocations are not gpc's leaks under the sanitizer build
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
root_env=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent=)

for i in $(seq 1 2500); do echo "the cat sees the ball number $((i % 7)). the dog likes it."; done >"$work/corpus.txt"
data=$work/data
"$GPC" data prepare --input "$work/corpus.txt" --out "$data" --vocab-size 300 >/dev/null 2>"$work/err" ||
  { echo "cannot prepare data: $(cat "$work/err")" >&2; exit 1; }
common=(train --data "$data" --layers 2 --heads 2 --channels 32 --context 16 --total-batch 256 --batch 4
  --steps 4 --device cpu --lr 1e-2 --warmup 1 --eval-every 0 --checkpoint-every 0 --seed 11)
if ! "${root_env[@]}" mpirun --oversubscribe --bind-to none -np 2 "$GPC" "${common[@]}" \
  --out "$work/mpirun" >/dev/null 2>"$work/err"; then
  grep -q "built without MPI" "$work/err" && { echo "gpc built without MPI: skipped"; exit 77; }
  echo "FAIL: mpirun -np 2 gpc train: $(cat "$work/err")" >&2
  exit 1
fi

export OMP_NUM_THREADS=1
"$GPC" launch --nproc 2 -- "$GPC" "${common[@]}" --out "$work/launch" >"$work/out" 2>"$work/err" ||
  fail "gpc launch --nproc 2 of a CPU run: exit $?: $(tail -3 "$work/err")"
python3 - "$work/mpirun/metrics.jsonl" "$work/launch/metrics.jsonl" <<'PY' || fail "losses differ"
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:3])
assert len(a) == len(b) == 4, (a, b)
assert a == b, (a, b)
PY
# the exchange's share of each step: on the CPU it blocks backward, so it is
# all exposed, more than nothing and less than the whole step
python3 - "$work/mpirun/metrics.jsonl" <<'PY' || fail "comm_exposed missing or out of range"
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    assert 0 < m["comm_exposed"] < 1, m
    assert abs(m["comm_exposed_ms"] - m["comm_exposed"] * m["ms"]) <= 1e-6 * m["ms"], m
    assert m["comm_bus_gbs"] > 0, m
PY
# two ranks: 256 tokens a step are 2 micro-batches of 4 x 16 on each
grep -qx "accumulation_steps=2" "$work/launch/config.txt" ||
  fail "not 2 processes: $(grep accumulation "$work/launch/config.txt")"

# no mpirun on PATH: one line, exit 1
PATH=/nonexistent "$GPC" launch --nproc 2 -- "$GPC" "${common[@]}" --out "$work/none" \
  >"$work/out" 2>"$work/err"
rc=$?
[[ $rc -eq 1 ]] || fail "launch without mpirun: exit $rc, expected 1"
[[ $(wc -l <"$work/err") -eq 1 ]] &&
  grep -q "gpc launch: error: 2 CPU processes are started by mpirun, which is not on PATH" "$work/err" ||
  fail "launch without mpirun: $(cat "$work/err")"
[[ -e "$work/none" ]] && fail "launch without mpirun started a run"

# several nodes of CPU processes are mpirun's business: a usage error
"$GPC" launch --nproc 2 --nnodes 2 --node-rank 0 --master 127.0.0.1:1234 -- "$GPC" "${common[@]}" \
  --out "$work/nodes" >"$work/out" 2>"$work/err"
rc=$?
[[ $rc -eq 2 ]] || fail "CPU launch over 2 nodes: exit $rc, expected 2"
grep -q "a CPU run over 2 nodes is started by mpirun with a host file" "$work/err" ||
  fail "CPU launch over 2 nodes: $(cat "$work/err")"

if [[ $failures -ne 0 ]]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "ok"
