#!/usr/bin/env bash
# test_gpcd_cli.sh: gpcd and its client commands end to end: gpcd started
# from a config file with simulated GPUs; gpc submit prints the job id alone
# on its last line; gpc queue/show (text and --json) report what was
# submitted; gpc logs returns the job's output (and -f follows a running
# job to its end); gpc cancel stops a job; gpc top --once shows the GPUs;
# a client without gpcd gets the one-line "not running" error; bad
# arguments are usage errors (exit 2); gpcd without a driver refuses
# gpus = nvml rather than pretending.
set -euo pipefail
GPC=${GPC:?set GPC to the gpc binary}
GPCD=${GPCD:-}
[[ -n "$GPCD" && -x "$GPCD" ]] || exit 77
work=$(mktemp -d)
gpcd_pid=
. "$(dirname "$0")/gpcd_stop.sh"
cleanup() { gpcd_stop "$work/state/gpcd.sock" "$gpcd_pid"; gpcd_remove "$work"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; [[ -f "$work/gpcd.log" ]] && tail -5 "$work/gpcd.log" >&2; exit 1; }
# shellcheck source=tests/cli/lib.sh
. "$(dirname "$0")/lib.sh"
name_failures

cat >"$work/gpcd.conf" <<CONF
[gpcd]
state_dir = $work/state
gpus = simulated:4x80GB
sample_interval = 0.2s
[policies]
policies = priority,aging,least_loaded,task_type,backfill
CONF
"$GPCD" --config "$work/gpcd.conf" --foreground >"$work/gpcd.log" 2>&1 &
gpcd_pid=$!
export GPC_SOCKET=$work/state/gpcd.sock
wait_for_socket "$GPC_SOCKET" "$gpcd_pid" || fail "gpcd did not create its socket"
[[ $(stat -c %a "$GPC_SOCKET") == 600 ]] || fail "socket mode $(stat -c %a "$GPC_SOCKET"), want 600"

# submit: the id alone on the last line of stdout
token=$RANDOM$RANDOM
out=$("$GPC" submit --gpus 2 --mem 40G --priority high --type train --name exp -- \
  sh -c "echo hello-$token; echo warn-$token >&2; while [ ! -e $work/go ]; do sleep 0.05; done; echo done-$token")
id=$(printf '%s\n' "$out" | tail -1)
[[ $id =~ ^[0-9]+$ ]] || fail "submit printed '$out', not an id"
[[ $id == 1 ]] || fail "first job id $id"

# show --json has what was asked for
# shellcheck disable=SC2016 # the check expands each time it runs
wait_until 60 '"$GPC" show "$id" --json | grep -q "\"state\":\"running\""' || true # checked below
"$GPC" show "$id" --json >"$work/show.json"
python3 - "$work/show.json" <<'PY' || fail "show --json: $(cat "$work/show.json")"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["gpus"] == 2 and j["mem"] == 40 << 30, j
assert j["priority"] == 90 and j["type"] == "train" and j["name"] == "exp", j
assert j["state"] == "running" and len(j["assigned_gpus"]) == 2, j
assert j["cwd"] == __import__("os").getcwd(), j
PY
"$GPC" show "$id" | grep -q "^job $id: running" || fail "show text: $("$GPC" show "$id")"
"$GPC" queue | grep -qE "^$id +running +[^ ]+ +high +train +2 +40.0 GiB" || fail "queue: $("$GPC" queue)"

# logs -f follows until the job ends, with stdout and stderr (the job runs
# until $work/go exists, so the checks above cannot race its end)
( sleep 0.5; touch "$work/go" ) &
"$GPC" logs "$id" -f >"$work/logs.txt"
printf 'hello-%s\nwarn-%s\ndone-%s\n' "$token" "$token" "$token" | cmp -s - "$work/logs.txt" ||
  fail "logs -f: $(cat "$work/logs.txt")"
"$GPC" show "$id" --json | grep -q '"state":"completed"' || fail "job did not complete"
"$GPC" queue --all --json | python3 -c '
import json,sys; jobs=json.load(sys.stdin)["jobs"]; assert [j["id"] for j in jobs]==['"$id"'], jobs'

# cancel: a long job is stopped and recorded as cancelled
id2=$("$GPC" submit -- sleep 600 2>/dev/null | tail -1)
# shellcheck disable=SC2016 # the check expands each time it runs
wait_until 60 '"$GPC" show "$id2" --json | grep -q "\"pid\":[0-9]"' || fail "job $id2 never started"
"$GPC" cancel "$id2" | grep -q "job $id2 is stopping" || fail "cancel output"
# shellcheck disable=SC2016 # the check expands each time it runs
wait_until 60 '"$GPC" show "$id2" --json | grep -q "\"state\":\"cancelled\""' || fail "job $id2 not cancelled"
set +e
err=$("$GPC" cancel "$id2" 2>&1 >/dev/null); rc=$?
set -e
[[ $rc == 1 && $err == "gpc cancel: error: job $id2 has already been cancelled" ]] || fail "cancel twice: $rc $err"

# top --once: one frame with every GPU
"$GPC" top --once >"$work/top.txt"
grep -q "on simulated:4x80GB" "$work/top.txt" || fail "top header: $(head -2 "$work/top.txt")"
[[ $(grep -cE "^ +[0-3]  Simulated GPU" "$work/top.txt") == 4 ]] || fail "top GPUs: $(cat "$work/top.txt")"
grep -q "jobs: 0 running, 0 waiting, 1 completed, 0 failed, 1 cancelled" "$work/top.txt" ||
  fail "top counts: $(sed -n 2p "$work/top.txt")"

# gpu drain/resume: the GPU leaves service and comes back (test_api checks placement)
[[ $("$GPC" gpu drain 3) == "GPU 3 drained: running jobs carry on, new ones go elsewhere" ]] || fail "gpu drain"
curl -sf --max-time 10 --unix-socket "$GPC_SOCKET" http://gpcd/gpus | python3 -c '
import json,sys; g=json.load(sys.stdin)["gpus"]; assert g[3]["drained"] and not g[2]["drained"], g' ||
  fail "drained GPU not shown in /gpus"
[[ $("$GPC" gpu resume 3) == "GPU 3 back in service" ]] || fail "gpu resume"
set +e
err=$("$GPC" gpu drain 9 2>&1 >/dev/null); rc=$?
set -e
[[ $rc == 1 && $err == "gpc gpu: error: no GPU 9 (this server has 4)" ]] || fail "drain 9: $rc $err"

# usage errors exit 2 with one line
expect_usage() {
  set +e; err=$("$GPC" "$@" 2>&1 >/dev/null); rc=$?; set -e
  [[ $rc == 2 ]] || fail "gpc $* exited $rc, want 2 ($err)"
  [[ $(printf '%s\n' "$err" | wc -l) == 1 && $err == "gpc $1: error: "* ]] ||
    fail "gpc $*: '$err'"
}
expect_usage submit --gpus 2
expect_usage submit --gpus 0 -- true
expect_usage submit --gpus 9 -- true            # more than the server has
expect_usage submit --priority urgent -- true
expect_usage submit --type gaming -- true
expect_usage show abc
expect_usage logs
expect_usage queue --state bogus
expect_usage gpu drain
expect_usage gpu fly 1
expect_usage gpu drain x

# no gpcd at the socket: one line naming the path and how to start gpcd
set +e
err=$(GPC_SOCKET=$work/none.sock "$GPC" queue 2>&1); rc=$?
set -e
[[ $rc == 1 ]] || fail "queue without gpcd exited $rc"
[[ $err == "gpc queue: error: gpcd is not running at $work/none.sock"*"start it with 'gpcd --config FILE'"* ]] ||
  fail "not-running message: $err"

# gpcd stops on SIGTERM and removes its socket
kill "$gpcd_pid"; wait "$gpcd_pid" || fail "gpcd exited with $? on SIGTERM"
gpcd_pid=
[[ ! -e $GPC_SOCKET ]] || fail "socket left behind"

# NVML without a driver is an error, never a silent switch to simulated GPUs
if ! ldconfig -p 2>/dev/null | grep -q libnvidia-ml.so.1; then
  set +e
  err=$("$GPCD" --foreground --state-dir "$work/nvml" --gpus nvml 2>&1); rc=$?
  set -e
  [[ $rc == 1 && $err == "gpcd: error: gpus = nvml: no NVIDIA driver found"* ]] || fail "nvml: $rc $err"
fi
set +e
err=$("$GPCD" --foreground --state-dir "$work/x" --gpus simulated:0x80GB 2>&1); rc=$?
set -e
[[ $rc == 1 && $err == *"simulated:COUNTxMEMORY"* ]] || fail "bad gpus: $rc $err"
echo "ok"
