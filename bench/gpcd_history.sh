#!/usr/bin/env bash
# gpcd_history.sh [BUILD]: how fast gpcd answers its clients when its
# database holds a long history. Starts gpcd once to make the database,
# fills it with JOBS finished jobs (ENV_BYTES of environment each, as a
# submitter's whole environment is stored), then times CALLS requests each
# of GET /jobs (what gpc queue and every second of gpc top ask) and GET
# /status with curl over the socket, and prints the median and range.
#   JOBS (200000), ENV_BYTES (4000), CALLS (5)
set -euo pipefail
build=${1:-build}
jobs=${JOBS:-200000} env_bytes=${ENV_BYTES:-4000} calls=${CALLS:-5}
[[ -x $build/gpcd ]] || { echo "gpcd_history.sh: no $build/gpcd (build first)" >&2; exit 2; }
[[ $jobs =~ ^[0-9]+$ && $env_bytes =~ ^[0-9]+$ && $calls =~ ^[1-9][0-9]*$ ]] ||
  { echo "gpcd_history.sh: JOBS, ENV_BYTES and CALLS must be whole numbers" >&2; exit 2; }
command -v curl >/dev/null || { echo "gpcd_history.sh: needs curl" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/gpcd-history-XXXXXX")
pid=
trap '[[ -n $pid ]] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
printf '[gpcd]\nstate_dir = %s/state\ngpus = simulated:2x80GB\n' "$work" >"$work/conf"
sock=$work/state/gpcd.sock

start() {
  "$build/gpcd" --config "$work/conf" --foreground >>"$work/log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do [[ -S $sock ]] && return 0; sleep 0.1; done
  echo "gpcd_history.sh: gpcd did not start: $(tail -3 "$work/log")" >&2
  exit 1
}
stop() { kill "$pid"; wait "$pid" 2>/dev/null || true; pid=; }

start
stop
python3 - "$work/state/gpcd.db" "$jobs" "$env_bytes" <<'PY'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
n, env = int(sys.argv[2]), "{" + "x" * int(sys.argv[3]) + "}"
rows = ((0, "bench", '["true"]', "/tmp", env, 1, 0, 50, 0, 0.0, 2, 1.7e9 + i, 1.7e9 + i, 1.7e9 + i + 1, 0)
        for i in range(n))
db.executemany("INSERT INTO jobs(owner_uid, owner, command, cwd, env, gpus, mem, priority, type,"
               " time_limit, state, submit_time, start_time, end_time, exit_code)"
               " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", rows)
db.commit()
PY
start
echo "gpcd with $jobs finished jobs of $env_bytes bytes of environment ($(du -h "$work/state/gpcd.db" | cut -f1))"
for path in /jobs /status; do
  curl -s -o /dev/null --unix-socket "$sock" "http://gpcd$path" # warm the page cache
  for _ in $(seq "$calls"); do
    curl -s -o /dev/null -w '%{time_total}\n' --unix-socket "$sock" "http://gpcd$path"
  done | sort -n | awk -v p="$path" '{t[NR] = $1 * 1000}
    END {printf "GET %-8s median %.2f ms (%.2f-%.2f, %d calls)\n", p, t[int((NR + 1) / 2)], t[1], t[NR], NR}'
done
