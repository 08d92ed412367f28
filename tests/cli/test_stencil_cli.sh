#!/usr/bin/env bash
# test_stencil_cli.sh: `gpc stencil` end to end: the JSON holds the run asked
# for, the centre point is the exact decay of the starting mode (lambda^s,
# computed here), the field agrees with it to rounding, the error against
# the heat equation's exact solution is |lambda^s - exp(-pi^2 |k|^2 r h^2 s)|
# (computed here) and falls 4-fold when h halves at the same time (second
# order), two domains give the same centre as one, the rates are
# consistent, and bad options are usage errors (exit 2) saying what to
# change (f32 on the CPU among them; a GPU that is not there is refused).
set -euo pipefail
GPC=${GPC:?set GPC to the gpc binary}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
source "$(dirname "$0")/lib.sh"

"$GPC" stencil --n 31 --steps 40 --r 0.1 --mode 1,2,1 --json "$work/one.json" >"$work/out" 2>"$work/err"
"$GPC" stencil --n 31 --steps 40 --r 0.1 --mode 1,2,1 --domains 4 --json "$work/four.json" >/dev/null 2>&1
python3 - "$work/one.json" "$work/four.json" "$work/out" <<'PY'
import json, math, sys
one, four = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
out = open(sys.argv[3]).read()
n, r, k, steps = 31, 0.1, (1, 2, 1), 40
assert (one["n"], one["steps"], one["domains"], four["domains"]) == (n, steps, 1, 4), one
h = 1 / (n + 1)
lam = 1 - 4 * r * sum(math.sin(q * math.pi * h / 2) ** 2 for q in k)
assert abs(one["lambda"] - lam) < 1e-15, (one["lambda"], lam)
c = n // 2 + 1  # the centre point's grid coordinate, 1-based
want = lam ** steps * math.prod(math.sin(q * math.pi * c * h) for q in k)
assert abs(one["center"] - want) < 1e-13, (one["center"], want)
assert one["center"] == four["center"], (one["center"], four["center"])
assert one["error"] < 1e-13 and four["error"] < 1e-13, (one["error"], four["error"])
assert abs(one["glups"] - n ** 3 * steps / one["seconds"] / 1e9) <= 1e-6 * one["glups"], one
assert abs(one["gb_per_s"] - 16 * one["glups"]) <= 1e-7 * one["gb_per_s"], one  # both printed to 9 digits
assert one["copy_gb_per_s"] > 0
assert "G lattice updates/s" in out, out
# the scheme's error against the heat equation: the field is lambda^s u0,
# so it is |lambda^s - E| of the starting amplitude
E = math.exp(-math.pi ** 2 * sum(q * q for q in k) * r * h * h * steps)
assert abs(one["heat_decay"] - E) < 1e-15, (one["heat_decay"], E)
assert abs(one["heat_error"] - abs(lam ** steps - E)) < 1e-12, (one["heat_error"], abs(lam ** steps - E))
assert one["heat_error"] > 1e-5, one["heat_error"]  # the scheme's error, well above rounding
line = "gpc stencil: field vs the discrete operator's decay: %.2g; vs the heat equation's exact solution: %.2g" % (one["error"], one["heat_error"])
assert line in out, out
PY
# second order: n 15 for 50 steps and n 31 for 200 are the same time
"$GPC" stencil --n 15 --steps 50 --json "$work/coarse.json" >/dev/null 2>&1
"$GPC" stencil --n 31 --steps 200 --json "$work/fine.json" >/dev/null 2>&1
python3 - "$work/coarse.json" "$work/fine.json" <<'PY'
import json, sys
coarse, fine = (json.load(open(p)) for p in sys.argv[1:3])
assert abs(coarse["heat_decay"] - fine["heat_decay"]) < 1e-15, (coarse, fine)
ratio = coarse["heat_error"] / fine["heat_error"]
assert 3.6 < ratio < 4.4, ratio
PY

# SIGTERM stops the run cleanly: exit 128 + 15, a line saying where, and
# the summary of the steps that ran (sent once its first progress line shows
# the steps running)
sigterm_when 'grep -q "step [0-9]* of 100000000" "$work/stop.out"' "$work/stop.out" \
  "$GPC" stencil --n 64 --steps 100000000
[[ $stopped_rc -eq 143 ]] || fail "SIGTERM: exit $stopped_rc, not 143: $(tail -3 "$work/stop.out")"
grep -q "stopped by SIGTERM at step [0-9]* of 100000000" "$work/stop.out" || fail "no stop line: $(tail -3 "$work/stop.out")"
grep -q "G lattice updates/s" "$work/stop.out" && grep -q "field vs the discrete operator's decay" "$work/stop.out" ||
  fail "no summary after the stop"

expect_usage() { expect_exit 2 "$1" "$GPC" stencil "${@:2}"; }
expect_usage "at most 1/6" --r 0.2
expect_usage "9 domains for 8 planes" --n 8 --domains 9
expect_usage "--mode 1,2 is not three numbers" --mode 1,2
expect_usage "mode 1,9,1: each must be 1 to n (8)" --n 8 --mode 1,9,1
expect_usage "--steps -3 is negative" --steps -3
expect_usage "f32 runs on GPUs only" --precision f32
expect_usage "--precision f16: use f64 or f32" --precision f16
expect_usage "--halos gpu: use auto, nccl or host" --halos gpu
expect_usage "--halos nccl is for GPUs in several processes" --halos nccl
# processes started by gpc launch: halos go over MPI, which it does not start
GPC_RANK=1 GPC_WORLD_SIZE=2 GPC_LOCAL_RANK=1 GPC_MASTER_ADDR=127.0.0.1 GPC_MASTER_PORT=29999 \
  expect_usage "which gpc launch does not start: run mpirun -np 2 gpc stencil"
# a GPU that is not there: the reason depends on the build and the machine
"$GPC" stencil --device cuda:99 >/dev/null 2>"$work/gpu.err" && fail "cuda:99 ran"
grep -Eq "cuda:99 does not exist|GPU 99 does not exist|no usable NVIDIA GPU|without CUDA|no CUDA GPU" "$work/gpu.err" ||
  fail "cuda:99: $(cat "$work/gpu.err")"
# a grid larger than any machine's memory (a TiB): refused up front
expect_exit 1 "GiB: use a smaller --n" "$GPC" stencil --n 4096
grep -q "GiB of host memory, more than this machine has free, .* GiB: use a smaller --n" "$work/expect.err" ||
  fail "a grid too large for memory: $(cat "$work/expect.err")"
"$GPC" stencil --help | grep -q "halo" || fail "gpc stencil --help does not describe the command"
echo "stencil: ok"
