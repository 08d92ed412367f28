#!/usr/bin/env bash
# test_gpcd_security.sh: what gpcd promises a shared server's users, end
# to end: the shipped systemd unit restarts gpcd after a crash; the state
# folder, database, WAL, logs and exit files are the owner's alone, and a
# job's environment holds only what it needs (no stray secrets in the
# database).
set -euo pipefail
GPC=${GPC:?set GPC to the gpc binary}
GPCD=${GPCD:-}
[[ -n "$GPCD" && -x "$GPCD" ]] || exit 77
src=${GPC_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
work=$(mktemp -d)
gpcd_pid=
. "$(dirname "$0")/gpcd_stop.sh"
. "$(dirname "$0")/lib.sh"
name_failures
cleanup() { gpcd_stop "$work/state/gpcd.sock" "$gpcd_pid"; gpcd_remove "$work"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; [[ -f "$work/gpcd.log" ]] && tail -5 "$work/gpcd.log" >&2; exit 1; }

# the systemd unit: restarted after a crash, its jobs left alone on stop
unit=$src/scripts/gpcd.service
for line in Restart=on-failure KillMode=process UMask=0077 \
  "ExecStart=/usr/local/bin/gpcd --config /etc/gpcd.conf --foreground"; do
  grep -qxF "$line" "$unit" || fail "$unit lacks '$line'"
done
if command -v systemd-analyze >/dev/null && [[ -d /run/systemd/system ]]; then
  systemd-analyze verify "$unit" 2>&1 | grep -v "gpcd: No such\|Command /usr/local/bin/gpcd" |
    grep . && fail "systemd-analyze verify $unit"
fi

start_gpcd() { # CONFIG: starts gpcd and waits for its socket
  "$GPCD" --config "$1" --foreground >>"$work/gpcd.log" 2>&1 &
  gpcd_pid=$!
  wait_for_socket "$GPC_SOCKET" "$gpcd_pid" || fail "gpcd did not create its socket"
}
stop_gpcd() { gpcd_stop "$GPC_SOCKET" "$gpcd_pid"; gpcd_pid=; }
wait_state() { # ID STATE
  local job=$1 want=$2
  # shellcheck disable=SC2016 # the check expands each time it runs
  wait_until 60 '"$GPC" show "$job" --json | grep -q "\"state\":\"$want\""' ||
    fail "job $job never $want: $("$GPC" show "$job")"
}
mode() { stat -c %a "$1"; }
export GPC_SOCKET=$work/state/gpcd.sock
cat >"$work/gpcd.conf" <<CONF
state_dir = $work/state
gpus = simulated:2x80GB
sample_interval = 0.2s
CONF

# owner-only files; only the environment the job needs is stored
start_gpcd "$work/gpcd.conf"
secret=hunter2-$RANDOM$RANDOM
needed=key-$RANDOM$RANDOM
id=$(AWS_SECRET_ACCESS_KEY=$secret WANDB_API_KEY=$needed GPC_LOG=warn \
  "$GPC" submit --env WANDB_API_KEY -- sh -c 'echo "env:${AWS_SECRET_ACCESS_KEY:-none}:$WANDB_API_KEY:$GPC_LOG"' \
  2>/dev/null | tail -1)
wait_state "$id" completed
grep -qx "env:none:$needed:warn" "$work/state/jobs/$id.log" || fail "job env: $(cat "$work/state/jobs/$id.log")"
for f in state state/jobs state/gpcd.db state/gpcd.db-wal state/gpcd.db-shm "state/jobs/$id.log" \
  "state/jobs/$id.exit"; do
  want=600; [[ -d $work/$f ]] && want=700
  [[ $(mode "$work/$f") == "$want" ]] || fail "$f has mode $(mode "$work/$f"), want $want"
done
! grep -rqaF "$secret" "$work/state" || fail "the submitter's secret reached the state folder"
grep -qaF "$needed" "$work/state/gpcd.db" "$work/state/gpcd.db-wal" || fail "named variable not stored"
expect_exit 2 "--env NOT_SET_ANYWHERE: no such variable" "$GPC" submit --env NOT_SET_ANYWHERE -- true
stop_gpcd

# a database an older gpcd left world-readable is narrowed; with the socket
# open to every user the state folder may be traversed (0711), not listed
chmod 644 "$work/state/gpcd.db"
chmod 755 "$work/state"
echo "socket_mode = 0666" >>"$work/gpcd.conf"
start_gpcd "$work/gpcd.conf"
[[ $(mode "$work/state/gpcd.db") == 600 ]] || fail "old database left $(mode "$work/state/gpcd.db")"
[[ $(mode "$work/state") == 711 ]] || fail "state folder $(mode "$work/state") with socket_mode 0666"
stop_gpcd

# config lines longer than the ini reader's buffer: the key's own message
# (a socket path past the unix limit), or the length, never "not key = value"
long_socket=$work/$(printf 'x%.0s' $(seq 300))/gpcd.sock
printf 'state_dir = %s\nsocket = %s\n' "$work/s9" "$long_socket" >"$work/long.conf"
expect_exit 1 "long.conf line 2: socket path '" "$GPCD" --config "$work/long.conf" --foreground
grep -qF "too long for a unix socket (at most 99 bytes)" "$work/expect.err" || fail "$(cat "$work/expect.err")"
printf 'state_dir = %s\nsocket = %s\n' "$work/s9" "$work/$(printf 'y%.0s' $(seq 120))" >"$work/long.conf"
expect_exit 1 "too long for a unix socket" "$GPCD" --config "$work/long.conf" --foreground
printf 'state_dir = %s\nslurm_options = %s\n' "$work/s9" "$(printf -- '--x %.0s' $(seq 80))" >"$work/long.conf"
expect_exit 1 "long.conf line 2 is 336 characters long; config lines hold at most 198" \
  "$GPCD" --config "$work/long.conf" --foreground
! grep -q "key = value" "$work/expect.err" || fail "$(cat "$work/expect.err")"
echo "ok"
