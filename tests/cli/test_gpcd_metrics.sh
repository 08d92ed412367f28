#!/usr/bin/env bash
# test_gpcd_metrics.sh: gpcd's /metrics passes `promtool check metrics`
# (Prometheus's own linter) while jobs run and an alert is active, and its
# values agree with /status. Skipped (77) without promtool or curl.
set -euo pipefail
GPCD=${GPCD:-}
[[ -n "$GPCD" && -x "$GPCD" ]] || exit 77
command -v promtool >/dev/null 2>&1 || { echo "promtool not installed (apt-get install prometheus)"; exit 77; }
command -v curl >/dev/null 2>&1 || exit 77
work=$(mktemp -d)
gpcd_pid=
. "$(dirname "$0")/gpcd_stop.sh"
cleanup() { gpcd_stop "$work/state/gpcd.sock" "$gpcd_pid"; gpcd_remove "$work"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
. "$(dirname "$0")/lib.sh"
name_failures
cat >"$work/gpcd.conf" <<CONF
state_dir = $work/state
gpus = simulated:8x141GB
sample_interval = 0.1s
simulated_file = $work/sim
alert_util_window = 0.2s
CONF
"$GPCD" --config "$work/gpcd.conf" --foreground >"$work/gpcd.log" 2>&1 &
gpcd_pid=$!
sock=$work/state/gpcd.sock
wait_for_socket "$sock" "$gpcd_pid" || fail "no socket: $(cat "$work/gpcd.log")"
api() { curl -sf --max-time 10 --unix-socket "$sock" "http://gpcd$1" "${@:2}"; }
# the jobs outlive any wait below; the cleanup cancels them
api /jobs -d '{"command":["sleep","600"],"gpus":2,"type":"train"}' >/dev/null
api /jobs -d '{"command":["sleep","600"],"gpus":1,"type":"infer","mem":"20G"}' >/dev/null
echo "0 temperature 91" >"$work/sim"
# wait until the alert is up and both jobs run and are sampled as such (a
# loaded machine may need several sampling passes: a deadline in time)
sampled() {
  api /metrics >"$work/metrics.txt" || return 1
  grep -q '^gpcd_running_jobs 2$' "$work/metrics.txt" &&
    grep -q '^gpcd_alert_active{gpu="0",kind="temperature"} 1$' "$work/metrics.txt" &&
    [[ $(grep -c '^gpcd_gpu_busy{gpu="[0-7]"} 1$' "$work/metrics.txt") == 3 ]]
}
wait_until 120 sampled || true # the checks below say what is missing
promtool check metrics <"$work/metrics.txt" || fail "promtool: $(promtool check metrics <"$work/metrics.txt" 2>&1)"
grep -q '^gpcd_running_jobs 2$' "$work/metrics.txt" || fail "running jobs: $(grep running_jobs "$work/metrics.txt")"
grep -q '^gpcd_gpu_temperature_celsius{gpu="0"} 91$' "$work/metrics.txt" || fail "temperature"
grep -q '^gpcd_alert_active{gpu="0",kind="temperature"} 1$' "$work/metrics.txt" || fail "alert series"
[[ $(grep -c '^gpcd_gpu_busy{gpu="[0-7]"} 1$' "$work/metrics.txt") == 3 ]] || fail "busy GPUs"
grep -q '^gpcd_gpu_memory_used_bytes{gpu="[0-7]"} 21474836480$' "$work/metrics.txt" || fail "shared job memory"
for id in 1 2; do api /jobs/$id/cancel -X POST >/dev/null || fail "cancel job $id"; done
echo ok
