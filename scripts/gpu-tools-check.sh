#!/usr/bin/env bash
# gpu-tools-check.sh: on a GPU machine, in one call, checks what gpc's tools
# do on real hardware: the GPU tests, `gpc plan` against measured peak memory
# (scripts/gpu-plan-check.sh), `gpc bench`, `gpc doctor`, and gpcd with real
# NVML while a training job runs (scripts/gpu-gpcd-check.sh). Logs go to $OUT
# (or ./gpu-out); the summary is printed last.
#
# Missing -dev packages (cmocka, OpenBLAS, SQLite, libmicrohttpd, jansson,
# inih) are taken from .deps/cuda and .deps/sched when present: fetch them
# with apt-get download on a Debian machine (see scripts/gpu-check.sh).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
final=${OUT:-$root/gpu-out}
mkdir -p "$final"
log=$final/tools.log
: >"$log"
note() { echo "$@" | tee -a "$final/summary.txt"; }

prefix=/tmp/gpc-deps
lib=$prefix/usr/lib/x86_64-linux-gnu
mkdir -p "$prefix" "$lib/pkgconfig-gpc"
for f in .deps/cuda/*.deb .deps/sched/*.deb; do [[ -f $f ]] && dpkg -x "$f" "$prefix"; done
for pc in "$lib"/pkgconfig/*.pc "$lib"/openblas-pthread/pkgconfig/*.pc; do
  [[ -f $pc ]] || continue
  name=$(basename "$pc" .pc)
  pkg-config --exists "$name" 2>/dev/null && continue
  # Requires.private names packages (gnutls) whose -dev files are not needed to link
  # the shared library, but pkg-config refuses a module whose requirements are absent.
  sed "s|^prefix=/usr|prefix=$prefix/usr|; s|=/usr/|=$prefix/usr/|g; /^Requires.private:/d" "$pc" >"$lib/pkgconfig-gpc/$name.pc"
  note "deps: $name from .deps"
done
export PKG_CONFIG_PATH=$lib/pkgconfig-gpc:${PKG_CONFIG_PATH:-}
export LD_LIBRARY_PATH=$lib/openblas-pthread:$lib:${LD_LIBRARY_PATH:-}
export CPATH=$prefix/usr/include:${CPATH:-}
export LIBRARY_PATH=$lib:${LIBRARY_PATH:-}

# GPC_CHECKS picks parts: tests plan bench doctor gpcd (default: all of them).
checks=${GPC_CHECKS:-"tests plan bench doctor gpcd"}
want() { [[ " $checks " == *" $1 "* ]]; }
build=$root/build-gpu
if ! { cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release && cmake --build "$build" -j16; } >"$final/build.log" 2>&1; then
  note "build: FAILED"; grep -E "error|Error" "$final/build.log" | head -30; exit 1
fi
note "build: ok, gpcd: $([[ -x $build/gpcd ]] && echo yes || echo no)"

want tests && (cd "$build" && timeout 240 ctest -R '^gpu_' --output-on-failure) >"$final/gpu-tests.log" 2>&1
want tests && note "gpu tests: $(grep -E 'tests passed|tests failed' "$final/gpu-tests.log")"

if want plan; then
  GPC_PLAN_CASES=${GPC_PLAN_CASES:-"d12:8 d12:32 d24:8 d24:16"} timeout 200 scripts/gpu-plan-check.sh "$build" >"$final/plan-check.log" 2>&1
  note "plan check: exit $?"; tail -8 "$final/plan-check.log" | tee -a "$final/summary.txt"
fi

if want bench; then
  timeout 150 "$build/gpc" bench all --device cuda --json "$final/bench.json" >"$final/bench.txt" 2>&1
  note "bench: exit $?"
fi
if want doctor; then
  timeout 60 "$build/gpc" doctor >"$final/doctor.txt" 2>&1
  note "doctor: exit $?"
fi

want gpcd || { echo "==== summary"; cat "$final/summary.txt"; exit 0; }
data=/tmp/gpc-tools-data
"$build/gpc" data synth --vocab 50257 --tokens 20000000 --out "$data" >/dev/null 2>&1
timeout 120 scripts/gpu-gpcd-check.sh "$build" -- "$build/gpc" train --data "$data" --out /tmp/gpc-tools-run \
  --model d12 --context 1024 --batch 16 --steps 150 --eval-every 0 --checkpoint-every 0 --device cuda \
  >"$final/gpcd-check.log" 2>&1
note "gpcd check: exit $?"
echo "==== summary"; cat "$final/summary.txt"
want bench && { echo "==== bench (tail)"; tail -30 "$final/bench.txt"; }
want doctor && { echo "==== doctor"; tail -25 "$final/doctor.txt"; }
echo "==== gpcd (gpc top)"; grep -A12 '== gpc top --once' "$final/gpcd-check.log" | head -30
echo "==== gpcd (metrics, gpu series)"; grep -E '^gpc(d)?_gpu' "$final/gpcd-check.log" | head -20
