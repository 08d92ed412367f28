# gpcd_stop.sh: sourced by the CLI tests that start gpcd. Job supervisors
# outlive gpcd on purpose (a restarted gpcd re-attaches to them), so a test
# that only killed gpcd left its jobs running and writing into its state
# folder while the folder was being removed. gpcd_stop cancels every job
# gpcd still lists, waits (up to 5 s) for them to end, stops gpcd and waits
# for it; gpcd_remove then removes a folder, retrying once. Neither fails.
#
#   gpcd_stop SOCKET PID        gpcd_remove DIR
gpcd_stop() {
  local sock=$1 pid=$2 ids n
  if [[ -S $sock ]] && command -v curl >/dev/null 2>&1; then
    ids=$(curl -sf --max-time 5 --unix-socket "$sock" http://gpcd/jobs 2>/dev/null |
      python3 -c 'import json, sys; print(" ".join(str(j["id"]) for j in json.load(sys.stdin)["jobs"]))' \
        2>/dev/null) || ids=""
    for id in $ids; do
      curl -sf --max-time 5 --unix-socket "$sock" -X POST "http://gpcd/jobs/$id/cancel" >/dev/null 2>&1 || true
    done
    for _ in $(seq 100); do
      [[ -z $ids ]] && break
      n=$(curl -sf --max-time 5 --unix-socket "$sock" http://gpcd/jobs 2>/dev/null |
        python3 -c 'import json, sys; print(len(json.load(sys.stdin)["jobs"]))' 2>/dev/null) || break
      [[ $n == 0 ]] && break
      sleep 0.05
    done
  fi
  if [[ -n $pid ]]; then
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  return 0
}

gpcd_remove() {
  rm -rf "$1" 2>/dev/null || { sleep 0.3; rm -rf "$1" 2>/dev/null; } || true
}
