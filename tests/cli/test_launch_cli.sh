#!/usr/bin/env bash
# test_launch_cli.sh: `gpc launch`: the environment each process gets (ranks,
# master address, NCCL_NVLS_ENABLE=0), usage errors, a rank that fails (the
# others are stopped at once and the launcher names the rank and its status),
# --nproc auto, a rank killed by a signal, and a rank that hangs after the others finished
# (stopped after --timeout).
set -u
GPC=${GPC:?set GPC to the gpc binary}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpc-launch-cli-XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# usage errors: exit 2, one error line
for args in "--nproc 2" "--nproc 0 -- true" "--nproc x -- true" "--nproc 2x -- true" "--nproc auto -- true" "--nnodes 2 --node-rank 2 -- true" \
  "--nnodes 2 -- true" "--master nohost -- true" "--master h:99999 -- true" "--timeout 0 -- true"; do
  # shellcheck disable=SC2086
  env -u GPC_JOB_GPUS "$GPC" launch $args >"$work/out" 2>"$work/err"
  rc=$?
  [[ $rc -eq 2 ]] || fail "launch $args: exit $rc, expected 2"
  [[ $(wc -l <"$work/err") -eq 1 ]] && grep -q "error:" "$work/err" || fail "launch $args: $(cat "$work/err")"
done

# the environment: 3 ranks, each prints what it got
"$GPC" launch --nproc 3 -- sh -c 'echo "$GPC_RANK $GPC_WORLD_SIZE $GPC_LOCAL_RANK $GPC_LOCAL_WORLD_SIZE $RANK $WORLD_SIZE $GPC_MASTER_ADDR $GPC_MASTER_PORT $MASTER_PORT $NCCL_NVLS_ENABLE"' \
  >"$work/env" 2>"$work/err" || fail "launch of 3 env printers failed: $(cat "$work/err")"
sort "$work/env" >"$work/env.sorted"
port=$(awk 'NR==1{print $8}' "$work/env.sorted")
[[ $port -ge 1 && $port -le 65535 ]] || fail "no master port: $(cat "$work/env")"
printf '%s\n' "0 3 0 3 0 3 127.0.0.1 $port $port 0" "1 3 1 3 1 3 127.0.0.1 $port $port 0" \
  "2 3 2 3 2 3 127.0.0.1 $port $port 0" >"$work/env.want"
cmp -s "$work/env.sorted" "$work/env.want" || fail "environment: got $(cat "$work/env.sorted")"

# --nproc auto: the count gpcd gave the job (GPC_JOB_GPUS)
GPC_JOB_GPUS=2 "$GPC" launch --nproc auto -- sh -c 'echo "$GPC_RANK/$GPC_WORLD_SIZE"' | sort >"$work/auto"
printf '%s\n' 0/2 1/2 | cmp -s - "$work/auto" || fail "--nproc auto with GPC_JOB_GPUS=2: $(cat "$work/auto")"
env -u GPC_JOB_GPUS "$GPC" launch --nproc auto -- true 2>&1 | grep -q "GPC_JOB_GPUS, which gpcd sets" ||
  fail "--nproc auto outside gpcd does not say where the count comes from"

# without OMP_NUM_THREADS the processes share the cores (at least one
# thread each); a value given is kept
cores=$(nproc)
share=$((cores / 2 > 1 ? cores / 2 : 1))
env -u OMP_NUM_THREADS "$GPC" launch --nproc 2 -- sh -c 'echo "$OMP_NUM_THREADS"' >"$work/omp" 2>&1
[[ $(sort -u "$work/omp") == "$share" ]] || fail "OpenMP threads of 2 processes on $cores cores: $(cat "$work/omp")"
OMP_NUM_THREADS=3 "$GPC" launch --nproc 2 -- sh -c 'echo "$OMP_NUM_THREADS"' >"$work/omp" 2>&1
[[ $(sort -u "$work/omp") == 3 ]] || fail "OMP_NUM_THREADS=3 not kept: $(cat "$work/omp")"

# two nodes of two: node 1's ranks are 2 and 3 of 4, master as given
NCCL_NVLS_ENABLE=1 "$GPC" launch --nproc 2 --nnodes 2 --node-rank 1 --master 10.1.2.3:4567 -- \
  sh -c 'echo "$GPC_RANK $GPC_WORLD_SIZE $GPC_LOCAL_RANK $GPC_MASTER_ADDR $GPC_MASTER_PORT $NCCL_NVLS_ENABLE"' |
  sort >"$work/env2"
printf '%s\n' "2 4 0 10.1.2.3 4567 0" "3 4 1 10.1.2.3 4567 0" | cmp -s - "$work/env2" ||
  fail "two nodes: got $(cat "$work/env2")"

# rank 1 exits 3 while the others sleep: stopped within seconds, rank named
start=$(date +%s)
"$GPC" launch --nproc 3 -- sh -c 'if [ "$GPC_RANK" = 1 ]; then sleep 0.2; exit 3; fi; sleep 60' \
  >"$work/out" 2>"$work/err"
rc=$?
took=$(($(date +%s) - start))
[[ $rc -eq 1 ]] || fail "failing rank: exit $rc, expected 1"
grep -q "gpc launch: error: rank 1 (pid [0-9]*) exited with status 3; stopped the other 2" "$work/err" ||
  fail "failing rank: message was: $(cat "$work/err")"
[[ $took -lt 15 ]] || fail "failing rank: the others were stopped only after $took s"

# a rank killed by a signal
"$GPC" launch --nproc 2 -- sh -c 'if [ "$GPC_RANK" = 0 ]; then kill -9 $$; fi; sleep 60' \
  >"$work/out" 2>"$work/err"
rc=$?
[[ $rc -eq 1 ]] || fail "killed rank: exit $rc"
grep -q "rank 0 (pid [0-9]*) was killed by signal 9" "$work/err" || fail "killed rank: $(cat "$work/err")"

# rank 0 finishes, rank 1 hangs: stopped after --timeout
start=$(date +%s)
"$GPC" launch --nproc 2 --timeout 1 -- sh -c 'if [ "$GPC_RANK" = 1 ]; then sleep 60; fi' \
  >"$work/out" 2>"$work/err"
rc=$?
took=$(($(date +%s) - start))
[[ $rc -eq 1 ]] || fail "hung rank: exit $rc, expected 1"
grep -q "rank 1 (pid [0-9]*) was still running 1 s after rank 0 finished" "$work/err" ||
  fail "hung rank: message was: $(cat "$work/err")"
[[ $took -lt 15 ]] || fail "hung rank: stopped only after $took s"

# a command that does not exist
"$GPC" launch --nproc 2 -- /nonexistent/program >"$work/out" 2>"$work/err"
[[ $? -eq 1 ]] && grep -q "exited with status 127" "$work/err" || fail "missing program: $(cat "$work/err")"

# all succeed: exit 0
"$GPC" launch --nproc 4 -- true || fail "four successful ranks: exit $?"

if [[ $failures -ne 0 ]]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "launch CLI: all checks passed"
