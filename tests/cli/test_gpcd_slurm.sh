#!/usr/bin/env bash
# test_gpcd_slurm.sh: gpcd with backend = slurm against a real Slurm
# (Debian's slurm-wlm) on this machine: the test writes a slurm.conf for one
# node with this machine's CPUs (no GPUs: slurm_gpu_option maps a job's GPU
# count to --cpus-per-task, so it still reaches Slurm and can be checked),
# starts munged with a fresh key, slurmctld and slurmd in the foreground with
# their state under the test's directory, and gpcd with gpus = none. Then,
# through the usual gpc commands: a failing job's exit status, output and
# the sbatch options Slurm saw; a successful 2-"GPU" job; cancelling a
# running job (scancel); a request Slurm refuses; and a gpcd restart while a
# job runs in Slurm. Skips (77), saying why, when slurm-wlm or munge is not
# installed or Slurm cannot start as this user.
set -euo pipefail
GPC=${GPC:?set GPC to the gpc binary}
GPCD=${GPCD:-}
[[ -n "$GPCD" && -x "$GPCD" ]] || { echo "skip: gpcd is not built"; exit 77; }
# config errors need no Slurm: each stops gpcd with one line
bad_config() { # expected-message key=value...
  local dir want=$1; dir=$(mktemp -d); shift
  printf '%s\n' "state_dir = $dir/s" "$@" >"$dir/c.conf"
  set +e; err=$("$GPCD" --config "$dir/c.conf" --foreground 2>&1); rc=$?; set -e
  rm -rf "$dir"
  [[ $rc == 1 && $err == *"$want"* ]] || { echo "FAIL: $* -> $rc '$err', want '$want'" >&2; exit 1; }
}
bad_config "backend = pbs: use local or slurm" "backend = pbs"
bad_config "gpus = none only suits backend = slurm" "gpus = none"
bad_config "slurm_gpu_option = '--gpus' must be one sbatch option with one %d" "backend = slurm" "gpus = none" "slurm_gpu_option = --gpus"
bad_config "slurm_gpu_option = '--gres=gpu:%s'" "backend = slurm" "gpus = none" "slurm_gpu_option = --gres=gpu:%s"
bad_config "slurm_poll_interval must be at least 100ms" "backend = slurm" "gpus = none" "slurm_poll_interval = 0.01s"
bad_config "slurm_log_dir is for backend = slurm" "slurm_log_dir = /tmp/x"
bad_config "slurm_log_dir = logs must be an absolute path" "backend = slurm" "gpus = none" "slurm_log_dir = logs"

for tool in slurmctld slurmd sbatch scontrol scancel munged; do
  command -v "$tool" >/dev/null || { echo "skip: $tool not found (apt-get install slurm-wlm)"; exit 77; }
done
work=$(mktemp -d /tmp/gpcd-slurm.XXXXXX)
pids=()
cleanup() {
  [[ -n "${SLURM_CONF:-}" ]] && scancel -u "$(id -un)" 2>/dev/null || true
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[i]}" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in gpcd.log ctld.log slurmd.log; do [[ -f $work/$f ]] && { echo "--- $f" >&2; tail -8 "$work/$f" >&2; }; done
  exit 1
}
skip() { echo "skip: $*"; for f in ctld.log slurmd.log; do [[ -f $work/$f ]] && tail -3 "$work/$f"; done; exit 77; }
# shellcheck source=tests/cli/lib.sh
source "$(dirname "$0")/lib.sh"
name_failures

# munge, with a key of its own and its socket in the test's directory
mkdir -m 700 "$work/munge"
if command -v mungekey >/dev/null; then mungekey --create --keyfile="$work/munge/munge.key"
else dd if=/dev/urandom of="$work/munge/munge.key" bs=1024 count=1 status=none; fi
chmod 400 "$work/munge/munge.key"
munged --foreground --force --key-file="$work/munge/munge.key" --socket="$work/munge/munge.sock" \
  --pid-file="$work/munge/munged.pid" --log-file="$work/munge/munged.log" \
  --seed-file="$work/munge/munge.seed" >/dev/null 2>&1 &
pids+=($!)
# shellcheck disable=SC2016 # the check expands each time it runs
wait_until 30 '[[ -S $work/munge/munge.sock ]]' || skip "munged did not start: $(tail -2 "$work/munge/munged.log" 2>/dev/null)"

read -r ctld_port slurmd_port < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
cpus=$(nproc)
user=$(id -un)
mkdir -p "$work/ctld" "$work/spool"
export SLURM_CONF=$work/slurm.conf
cat >"$SLURM_CONF" <<CONF
ClusterName=gpctest
SlurmctldHost=localhost
SlurmUser=$user
SlurmdUser=$user
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
AuthInfo=socket=$work/munge/munge.sock
CredType=cred/munge
StateSaveLocation=$work/ctld
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/ctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/ctld.log
SlurmdLogFile=$work/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
EnforcePartLimits=ALL
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
NodeName=gpcnode NodeAddr=127.0.0.1 NodeHostname=$(hostname -s) CPUs=$cpus State=UNKNOWN
PartitionName=gpc Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
slurmctld -D -i >"$work/ctld.out" 2>&1 &
pids+=($!)
slurmd -D -N gpcnode >"$work/slurmd.out" 2>&1 &
pids+=($!)
# shellcheck disable=SC2016 # the check expands each time it runs
wait_until 60 '[[ $(sinfo -h -o %T 2>/dev/null) == idle ]]' ||
  skip "Slurm did not come up as user $user ($(tail -1 "$work/ctld.out" "$work/slurmd.out" 2>/dev/null | tr '\n' ' '))"

cat >"$work/gpcd.conf" <<CONF
state_dir = $work/state
gpus = none
backend = slurm
slurm_gpu_option = --cpus-per-task=%d
slurm_poll_interval = 0.2s
slurm_log_dir = $work/shared/logs
CONF
start_gpcd() {
  "$GPCD" --config "$work/gpcd.conf" --foreground >>"$work/gpcd.log" 2>&1 &
  gpcd_pid=$!
  pids+=($gpcd_pid)
  wait_for_socket "$work/state/gpcd.sock" "$gpcd_pid" || fail "gpcd did not start"
}
start_gpcd
export GPC_SOCKET=$work/state/gpcd.sock
field() { "$GPC" show "$1" --json | python3 -c "import json,sys; print(json.load(sys.stdin)$2)"; }
wait_state() { # id state seconds
  local job=$1 want=$2
  # shellcheck disable=SC2016 # the check expands each time it runs
  wait_until "$3" '[[ $(field "$job" "[\"state\"]") == "$want" ]]' ||
    fail "job $job is $(field "$job" '["state"]') ($(field "$job" '["message"]')), not $want"
}
slurm_id() { field "$1" '["message"]' | sed -n 's/^Slurm job \([0-9]*\).*/\1/p'; }

# a failing job: its exit status, its output, and what Slurm was asked for
tag=$RANDOM$RANDOM
a=$("$GPC" submit --gpus 1 --time 5m --name slurm-a -- \
  sh -c "echo out-$tag; echo cpus=\$SLURM_CPUS_PER_TASK job=\$GPC_JOB_ID; echo err-$tag >&2; exit 7" 2>/dev/null | tail -1)
wait_state "$a" failed 60
[[ $(field "$a" '["exit_code"]') == 7 ]] || fail "exit code $(field "$a" '["exit_code"]'), want 7"
sa=$(slurm_id "$a")
[[ $(field "$a" '["message"]') == "Slurm job $sa FAILED (exit status 7)" ]] || fail "message: $(field "$a" '["message"]')"
printf 'out-%s\ncpus=1 job=%s\nerr-%s\n' "$tag" "$a" "$tag" | cmp -s - <("$GPC" logs "$a") ||
  fail "logs: $("$GPC" logs "$a")"
# the output went to slurm_log_dir (created by gpcd), owner-only
[[ -f $work/shared/logs/$a.log && ! -e $work/state/jobs/$a.log ]] || fail "job $a's log is not in slurm_log_dir"
[[ $(stat -c %a "$work/shared/logs/$a.log") == 600 && $(stat -c %a "$work/shared/logs") == 711 ]] ||
  fail "log modes: $(stat -c %a "$work/shared/logs/$a.log") $(stat -c %a "$work/shared/logs")"
info=$(scontrol -o show job "$sa")
for want in "JobName=gpcd-" "-$a " "TimeLimit=00:05:00" "CPUs/Task=1" "JobState=FAILED" "ExitCode=7:0" "WorkDir=$PWD "; do
  [[ $info == *"$want"* ]] || fail "Slurm's job lacks '$want': $info"
done

# a 2-"GPU" job that succeeds
g=$(( cpus >= 2 ? 2 : 1 ))
# (jobs here wait for a flag file, so the checks while they run cannot race their end)
b=$("$GPC" submit --gpus "$g" -- sh -c "while [ ! -e $work/go-b ]; do sleep 0.05; done; echo fine" 2>/dev/null | tail -1)
wait_state "$b" running 60
[[ $(field "$b" '["message"]') == "Slurm job $(slurm_id "$b") on gpcnode" ]] || fail "running message: $(field "$b" '["message"]')"
touch "$work/go-b"
wait_state "$b" completed 60
[[ $(field "$b" '["exit_code"]') == 0 ]] || fail "job $b exit code"
[[ $("$GPC" logs "$b") == fine ]] || fail "job $b logs"
scontrol -o show job "$(slurm_id "$b")" | grep -q "CPUs/Task=$g " || fail "job $b did not ask Slurm for $g CPUs"

# cancel a running job: scancel, and gpcd records it
c=$("$GPC" submit -- sleep 120 2>/dev/null | tail -1)
wait_state "$c" running 60
sc=$(slurm_id "$c")
"$GPC" cancel "$c" >/dev/null
wait_state "$c" cancelled 60
scontrol -o show job "$sc" | grep -q "JobState=CANCELLED" || fail "Slurm job $sc not cancelled"

# a request Slurm refuses fails with sbatch's reason
d=$("$GPC" submit --gpus 64 -- true 2>/dev/null | tail -1)
wait_state "$d" failed 60
msg=$(field "$d" '["message"]')
[[ $msg == "Slurm refused the job: sbatch: error: "* ]] || fail "refused message: $msg"

# gpcd restarts while a job runs in Slurm: the job is followed to its end
e=$("$GPC" submit -- sh -c "while [ ! -e $work/go-e ]; do sleep 0.05; done; exit 0" 2>/dev/null | tail -1)
wait_state "$e" running 60
kill "$gpcd_pid"; wait "$gpcd_pid" 2>/dev/null || true
start_gpcd
[[ $(field "$e" '["state"]') == running ]] || fail "after restart job $e is $(field "$e" '["state"]')"
touch "$work/go-e"
wait_state "$e" completed 60
[[ $(grep -c "handed to Slurm as job $(slurm_id "$e")" "$work/gpcd.log") == 1 ]] || fail "job $e was submitted twice"
grep -q "backend = slurm: 1 job(s) already in Slurm" "$work/gpcd.log" || fail "restart did not find the job"

"$GPC" queue --all --json | python3 -c '
import json, sys
states = {j["id"]: j["state"] for j in json.load(sys.stdin)["jobs"]}
want = {'"$a"': "failed", '"$b"': "completed", '"$c"': "cancelled", '"$d"': "failed", '"$e"': "completed"}
assert states == want, (states, want)' || fail "queue --all"
echo "ok"
