#!/usr/bin/env bash
# test_doctor_run_cli.sh: `gpc doctor --run` on the run folders of
# tests/fixtures/doctor: an out-of-memory end is a problem with what fits
# and exit 1, a healthy run exits 0 with its MFU, a power-capped run names
# the cap; --json writes the same findings as JSON (to a file or stdout);
# bad folders and option mixes are clear errors.
set -euo pipefail
GPC=${GPC:?set GPC to the gpc binary}
SRC=${GPC_SOURCE_DIR:?set GPC_SOURCE_DIR to the source tree}
fx="$SRC/tests/fixtures/doctor"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# shellcheck source=tests/cli/lib.sh
. "$(dirname "$0")/lib.sh"
name_failures
run() { # expected-rc args...: runs gpc doctor, output in $work/out.txt and err.txt
  local want=$1; shift
  set +e
  "$GPC" doctor "$@" >"$work/out.txt" 2>"$work/err.txt"
  local rc=$?
  set -e
  [[ $rc -eq $want ]] || fail "doctor $* exited $rc, not $want: $(cat "$work/out.txt" "$work/err.txt")"
}

run 1 --run "$fx/run_oom" --json "$work/oom.json"
grep -q "PROBLEM  out of memory after 0 steps: .*out of GPU memory on cuda:0" "$work/out.txt" ||
  fail "oom line: $(cat "$work/out.txt")"
grep -q -- "-> gpc plan: batch 64 needs .* --batch [0-9]* fits" "$work/out.txt" ||
  fail "oom remedy: $(cat "$work/out.txt")"
python3 - "$work/oom.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["problems"] == 1, d
p = [f for f in d["findings"] if f["kind"] == "problem"]
assert len(p) == 1 and p[0]["cause"] == "out_of_memory", p
assert "fits" in p[0]["advice"][0], p
PY

run 0 --run "$fx/run_healthy"
grep -q "MFU 39.[0-9]% of NVIDIA H200's 989 TFLOP/s" "$work/out.txt" || fail "mfu: $(cat "$work/out.txt")"
grep -q "no out-of-memory error in its log, and its metrics show no cause" "$work/out.txt" ||
  fail "healthy: $(cat "$work/out.txt")"

# --json -: stdout is the JSON alone
run 1 --run "$fx/run_power" --json -
python3 - "$work/out.txt" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
causes = [f.get("cause") for f in d["findings"] if f["kind"] == "problem"]
assert causes == ["power_capped"], causes
assert d["problems"] == 1
PY

run 2 --run "$work/none"
grep -q "is not a directory: give the run folder" "$work/err.txt" || fail "$(cat "$work/err.txt")"
mkdir "$work/empty"
run 2 --run "$work/empty"
grep -q "neither config.txt nor metrics.jsonl" "$work/err.txt" || fail "$(cat "$work/err.txt")"
run 1 --run "$fx/run_healthy" --log "$work/missing.log"
grep -q "cannot read the log" "$work/err.txt" || fail "$(cat "$work/err.txt")"
run 2 --log "$work/x.log"
grep -q -- "--log goes with --run RUN" "$work/err.txt" || fail "$(cat "$work/err.txt")"
run 2 --run "$fx/run_healthy" --pid $$
grep -q -- "--run reads a finished run" "$work/err.txt" || fail "$(cat "$work/err.txt")"
run 1 --run "$fx/run_healthy" --json "$work/no/such/dir.json"
grep -q "cannot write .*dir.json" "$work/err.txt" || fail "$(cat "$work/err.txt")"
# --job of a gpcd job that has ended: its run folder (its --out, relative to
# the job's directory) and its log, which gpcd keeps, read as --run reads them
if [[ -n ${GPCD:-} && -x ${GPCD:-} ]]; then
  . "$(dirname "$0")/gpcd_stop.sh"
  gpcd_pid=
  trap 'gpcd_stop "$work/state/gpcd.sock" "$gpcd_pid"; gpcd_remove "$work"' EXIT
  printf '[gpcd]\nstate_dir = %s/state\ngpus = simulated:1x80GB\nsample_interval = 0.2s\n' "$work" \
    >"$work/gpcd.conf"
  "$GPCD" --config "$work/gpcd.conf" --foreground >"$work/gpcd.log" 2>&1 &
  gpcd_pid=$!
  export GPC_SOCKET=$work/state/gpcd.sock
  wait_for_socket "$GPC_SOCKET" "$gpcd_pid" || fail "gpcd did not start: $(cat "$work/gpcd.log")"
  state_of() { "$GPC" show "$1" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])'; }
  mkdir -p "$work/jobdir"
  # the job writes its run folder and dies printing the out-of-memory line,
  # as gpc train does; --out in its command names the folder
  id=$(cd "$work/jobdir" && "$GPC" submit --gpus 1 -- sh -c \
    'mkdir -p "$2" && cp "$0/config.txt" "$2/" && tail -3 "$0/train.log" && exit 1' \
    "$fx/run_oom" --out jobrun | tail -1)
  [[ $id =~ ^[0-9]+$ ]] || fail "submit printed '$id'"
  # shellcheck disable=SC2016 # the check expands each time it runs
  wait_until 60 '[[ $(state_of "$id") == failed ]]' || fail "job $id is $(state_of "$id"), not failed"
  run 1 --job "$id"
  grep -q "PROBLEM  out of memory after 0 steps: .*out of GPU memory on cuda:0" "$work/out.txt" ||
    fail "--job of an ended job: $(cat "$work/out.txt" "$work/err.txt")"
  grep -q -- "--batch [0-9]* fits" "$work/out.txt" || fail "--job remedy: $(cat "$work/out.txt")"
  ls "${TMPDIR:-/tmp}"/gpc-doctor-job-"$id"-* >/dev/null 2>&1 && fail "the log copy was left behind"
  # a job whose command names no run folder
  id2=$("$GPC" submit --gpus 1 -- true | tail -1)
  # shellcheck disable=SC2016 # the check expands each time it runs
  wait_until 60 '[[ $(state_of "$id2") == completed ]]' || fail "job $id2 is $(state_of "$id2"), not completed"
  run 1 --job "$id2"
  grep -q "names no run folder (--out): give the folder with --run RUN" "$work/err.txt" ||
    fail "--job without --out: $(cat "$work/err.txt")"
fi
echo "doctor --run cli: ok"
