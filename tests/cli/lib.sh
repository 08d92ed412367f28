# shellcheck shell=bash disable=SC2154,SC2034  # sourced: $work and $stopped_rc belong to the caller
# lib.sh: helpers shared by the end-to-end scripts (sourced; not a test).
# They use the sourcing script's $GPC, $work (a scratch folder) and fail().

# name_failures: from here on, a command that stops the script under set -e
# says which one it was, on which line (not in set +e stretches, where a
# failure is the status the script checks).
name_failures() {
  trap 'case $- in *e*) echo "FAIL: line $LINENO: $BASH_COMMAND exited $?" >&2 ;; esac' ERR
}

# make_dataset VOCAB SEED: `gpc data synth` of 20,000 tokens into
# $work/data, or the script stops (exit 1), since nothing after it can run.
make_dataset() {
  "$GPC" data synth --vocab "$1" --tokens 20000 --out "$work/data" --seed "$2" >"$work/out" 2>&1 ||
    { echo "cannot make the dataset: $(cat "$work/out")" >&2; exit 1; }
}

# expect_exit STATUS TEXT COMMAND...: COMMAND exits STATUS and its standard
# error holds TEXT (a fixed string); its output stays in $work/expect.out
# and $work/expect.err.
expect_exit() {
  local want=$1 text=$2 rc
  shift 2
  "$@" >"$work/expect.out" 2>"$work/expect.err" && rc=0 || rc=$?
  [[ $rc -eq $want ]] || fail "$*: exit $rc, not $want: $(cat "$work/expect.err")"
  grep -qF -- "$text" "$work/expect.err" || fail "$*: no '$text' in: $(cat "$work/expect.err")"
}

# sigterm_when CHECK OUT COMMAND...: runs COMMAND in the background (all its
# output in OUT), sends it SIGTERM once the shell command CHECK succeeds
# (polled every 0.1 s, so a loaded machine's slow start does not matter;
# after 120 s, or if COMMAND has ended, it goes on and the caller's checks
# say what is missing) and waits; its exit status lands in $stopped_rc.
sigterm_when() {
  local check=$1 out=$2 pid i
  shift 2
  "$@" >"$out" 2>&1 &
  pid=$!
  for ((i = 0; i < 1200; i++)); do
    eval "$check" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" && stopped_rc=0 || stopped_rc=$?
}

# wait_until SECONDS CHECK: polls the shell command CHECK every 0.05 s until
# it succeeds (status 0) or SECONDS of wall time have passed (status 1).
# A deadline in time, not in tries, so that a loaded machine, where each
# try is slow, gets the same time as an idle one.
wait_until() {
  local deadline=$((SECONDS + $1)) check=$2
  while ((SECONDS < deadline)); do
    eval "$check" && return 0
    sleep 0.05
  done
  eval "$check"
}

# wait_for_socket SOCKET PID: waits until the daemon PID has made its Unix
# socket SOCKET (status 0), has exited (status 1, at once), or 120 s have
# passed (status 1). Starting takes well under a second; the long deadline
# is for a machine that stalls for tens of seconds (one CI machine held
# every test for about 40 s at once), not for a slow start.
wait_for_socket() {
  local sock
  sock=$(printf %q "$1")
  wait_until 120 "[[ -S $sock ]] || ! kill -0 $2 2>/dev/null"
  [[ -S $1 ]]
}
