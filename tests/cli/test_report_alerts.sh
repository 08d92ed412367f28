#!/usr/bin/env bash
# test_report_alerts.sh: `gpc report` for a run that gpcd started shows the
# alerts gpcd raises on the job's GPUs. gpcd runs on one simulated GPU whose
# memory is made to read 79 of 80 GB (a memory alert); the run folder's
# config.txt names the job (gpcd_job, as the trainer writes it from
# GPC_JOB_ID). Also: a run outside gpcd says so, and an unreachable gpcd
# still gives a report that says why no alerts are shown.
set -euo pipefail
GPC=${GPC:?set GPC to the gpc binary}
GPCD=${GPCD:-}
[[ -n "$GPCD" && -x "$GPCD" ]] || { echo "gpcd not built: skipping"; exit 77; }
work=$(mktemp -d)
gpcd_pid=
. "$(dirname "$0")/gpcd_stop.sh"
cleanup() { gpcd_stop "$work/state/gpcd.sock" "$gpcd_pid"; gpcd_remove "$work"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; [[ -f "$work/gpcd.log" ]] && tail -5 "$work/gpcd.log" >&2; exit 1; }
# shellcheck source=tests/cli/lib.sh
. "$(dirname "$0")/lib.sh"
name_failures

echo "0 mem_used 79GB" >"$work/sim.txt"
cat >"$work/gpcd.conf" <<CONF
[gpcd]
state_dir = $work/state
gpus = simulated:1x80GB
simulated_file = $work/sim.txt
sample_interval = 0.1s
CONF
"$GPCD" --config "$work/gpcd.conf" --foreground >"$work/gpcd.log" 2>&1 &
gpcd_pid=$!
export GPC_SOCKET=$work/state/gpcd.sock
wait_for_socket "$GPC_SOCKET" "$gpcd_pid" || fail "gpcd did not create its socket"
# the job outlives any wait below; the cleanup cancels it
id=$("$GPC" submit --gpus 1 --type train -- sleep 600 | tail -1)
[[ $id =~ ^[0-9]+$ ]] || fail "submit printed '$id'"

write_run() { # folder, gpcd_job value
  mkdir -p "$1"
  printf '{"step":1,"loss":5.5,"lr":0.001,"grad_norm":1,"tokens_per_s":1000,"ms":10,"tokens":100}\n' >"$1/metrics.jsonl"
  printf 'layers=2\nheads=2\nchannels=64\ncontext=64\nparameters=100000\ngpcd_job=%s\n' "$2" >"$1/config.txt"
}
write_run "$work/run" "$id"
page=$work/run/report.html
# shellcheck disable=SC2016 # the check expands each time it runs
wait_until 60 '"$GPC" report "$work/run" >/dev/null && grep -q "close to running out of memory" "$page"' ||
  true # the checks below say what is missing
grep -q "gpcd job $id: active alerts on its GPUs" "$page" || fail "alerts note: $(grep alerts-note "$page")"
grep -q "<li>GPU 0 memory 99% used (79.0 of 80.0 GiB)" "$page" || fail "alert text: $(grep -A2 '<ul id="alerts"' "$page")"

write_run "$work/plain" ""
"$GPC" report "$work/plain" >/dev/null
grep -q "did not run under gpcd: no alerts to show" "$work/plain/report.html" || fail "plain run note"

GPC_SOCKET=$work/none.sock "$GPC" report "$work/run" --out "$work/away.html" >/dev/null ||
  fail "report must still be written when gpcd is away"
grep -q "gpcd job $id: alerts not shown: gpcd is not running at $work/none.sock" "$work/away.html" ||
  fail "unreachable note: $(grep alerts-note "$work/away.html")"
"$GPC" cancel "$id" >/dev/null || fail "cancel job $id"
echo "ok"
