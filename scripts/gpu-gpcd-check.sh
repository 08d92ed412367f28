#!/usr/bin/env bash
# gpu-gpcd-check.sh: gpcd on a real GPU server: starts gpcd with NVML (no
# simulated fallback: it fails loudly without a driver), optionally runs a
# job under it, and prints what `gpc top --once` and /metrics show, so the
# NVML readings can be checked against nvidia-smi.
#
#   scripts/gpu-gpcd-check.sh [BUILD_DIR] [-- COMMAND...]
#
# BUILD_DIR defaults to ./build. With a COMMAND (for example
# `-- build/gpc train --config run.ini`) it is submitted as a 1-GPU training
# job and the readings are taken while it runs (10 s in, then every 10 s
# until it ends, at most 5 times).
set -euo pipefail
build=build
if [[ $# -gt 0 && $1 != -- ]]; then build=$1; shift; fi
[[ ${1:-} == -- ]] && shift
gpc=$build/gpc
gpcd=$build/gpcd
[[ -x $gpc && -x $gpcd ]] || { echo "gpu-gpcd-check: error: $gpc or $gpcd missing; build first (cmake --build $build)" >&2; exit 1; }
command -v curl >/dev/null || { echo "gpu-gpcd-check: error: curl is needed" >&2; exit 1; }
state=$(mktemp -d /tmp/gpcd-check-XXXXXX)
gpcd_pid=
cleanup() { [[ -n $gpcd_pid ]] && kill "$gpcd_pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$state"; }
trap cleanup EXIT
cat >"$state/gpcd.conf" <<CONF
state_dir = $state
gpus = nvml
sample_interval = 1s
CONF
"$gpcd" --config "$state/gpcd.conf" --foreground >"$state/gpcd.log" 2>&1 &
gpcd_pid=$!
export GPC_SOCKET=$state/gpcd.sock
for _ in $(seq 100); do [[ -S $GPC_SOCKET ]] && break; kill -0 "$gpcd_pid" 2>/dev/null || break; sleep 0.1; done
if [[ ! -S $GPC_SOCKET ]]; then
  echo "gpu-gpcd-check: gpcd did not start:" >&2; cat "$state/gpcd.log" >&2; exit 1
fi
echo "== gpcd log"; cat "$state/gpcd.log"
show() {
  echo "== nvidia-smi"; nvidia-smi --query-gpu=index,name,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw,power.limit,clocks.sm --format=csv || true
  echo "== gpc top --once"; "$gpc" top --once
  echo "== /metrics"; curl -s --unix-socket "$GPC_SOCKET" http://gpcd/metrics
  if command -v promtool >/dev/null; then
    echo "== promtool check metrics"; curl -s --unix-socket "$GPC_SOCKET" http://gpcd/metrics | promtool check metrics && echo "promtool: ok"
  fi
}
sleep 2
if [[ $# -gt 0 ]]; then
  id=$("$gpc" submit --gpus 1 --type train -- "$@" | tail -1)
  echo "== submitted job $id: $*"
  for round in 1 2 3 4 5; do
    sleep 10
    show
    state_now=$("$gpc" show "$id" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')
    [[ $state_now == running ]] || break
  done
  echo "== gpc show $id"; "$gpc" show "$id"
  echo "== gpc logs $id (last 20 lines)"; "$gpc" logs "$id" | tail -20
  if [[ $("$gpc" show "$id" --json) == *'"state":"running"'* ]]; then "$gpc" cancel "$id" || true; fi
else
  show
fi
