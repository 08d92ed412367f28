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
echo "doctor --run cli: ok"
