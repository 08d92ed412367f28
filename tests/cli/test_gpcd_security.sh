#!/usr/bin/env bash
# test_gpcd_security.sh: what gpcd promises a shared server's users, end
# to end: the shipped systemd unit restarts gpcd after a crash.
set -euo pipefail
GPC=${GPC:?set GPC to the gpc binary}
GPCD=${GPCD:-}
[[ -n "$GPCD" && -x "$GPCD" ]] || exit 77
src=${GPC_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
work=$(mktemp -d)
gpcd_pid=
. "$(dirname "$0")/gpcd_stop.sh"
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
echo "ok"
