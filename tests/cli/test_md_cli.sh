#!/usr/bin/env bash
# test_md_cli.sh: `gpc md` end to end. A small crystal's first thermo row is
# LAMMPS's in.lj figures (E_pair -6.7733681 whatever the crystal's size; the
# kinetic energy per atom (3N - 3) T / 2N), the JSON holds what the table
# prints, the rate is atoms x steps / seconds, the steps asked for ran, and
# bad options are usage errors (exit 2) with a line saying what to change,
# and --device cuda without a GPU says so.
set -euo pipefail
GPC=${GPC:?set GPC to the gpc binary}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
source "$(dirname "$0")/lib.sh"

"$GPC" md --cells 5 --steps 40 --thermo 10 --temperature 1.5 --json "$work/md.json" >"$work/out"
python3 - "$work/md.json" "$work/out" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
out = open(sys.argv[2]).read().splitlines()
n = r["atoms"]
assert n == 4 * 5 ** 3 == 500, n
assert r["steps"] == 40 and r["cells"] == 5 and r["temperature"] == 1.5
steps = [t["step"] for t in r["thermo"]]
assert steps == [0, 10, 20, 30, 40], steps
t0 = r["thermo"][0]
assert abs(t0["potential"] - -6.7733681) < 1e-7, t0
assert abs(t0["temperature"] - 1.5) < 1e-12, t0
assert abs(t0["kinetic"] - (3 * n - 3) * 1.5 / (2 * n)) < 1e-12, t0
for t in r["thermo"]:
    assert abs(t["total"] - (t["potential"] + t["kinetic"])) < 1e-12, t
assert abs(r["atom_steps_per_s"] - n * 40 / r["seconds"]) <= 1e-6 * r["atom_steps_per_s"], r
assert r["neighbor_builds"] >= 1 and r["pairs"] > 0
# the table prints the same rows (7 decimals)
rows = [l.split() for l in out if l.strip() and l.split()[0].isdigit()]
assert [int(x[0]) for x in rows] == steps, rows
for x, t in zip(rows, r["thermo"]):
    assert abs(float(x[2]) - t["potential"]) < 1e-7 and abs(float(x[3]) - t["total"]) < 1e-7, (x, t)
assert any("million atom-steps/s" in l for l in out), out[-1]
PY

# the trajectory: frames at 0, 15 and 30, atoms in creation order (frame 0
# is the lattice: 4 atoms a cell, x fastest), positions inside the box
"$GPC" md --cells 4 --steps 30 --thermo 10 --dump "$work/t.xyz" --dump-every 15 >/dev/null
python3 - "$work/t.xyz" <<'PY'
import re, sys
lines = open(sys.argv[1]).read().splitlines()
frames, at = [], 0
while at < len(lines):
    n = int(lines[at]); head = lines[at + 1]
    pos = [tuple(map(float, l.split()[1:])) for l in lines[at + 2:at + 2 + n]]
    frames.append((head, pos)); at += 2 + n
assert len(frames) == 3, len(frames)
steps = [int(re.search(r"step=(\d+)", h).group(1)) for h, _ in frames]
assert steps == [0, 15, 30], steps
L = float(re.search(r'Lattice="([0-9.e+-]+) ', frames[0][0]).group(1))
a = L / 4
assert all(len(p) == 256 for _, p in frames)
basis = [(0, 0, 0), (0.5, 0.5, 0), (0.5, 0, 0.5), (0, 0.5, 0.5)]
i = 0
for z in range(4):
    for y in range(4):
        for x in range(4):
            for b in basis:
                want = ((x + b[0]) * a, (y + b[1]) * a, (z + b[2]) * a)
                got = frames[0][1][i]
                assert all(abs(g - w) < 1e-7 for g, w in zip(got, want)), (i, got, want)
                i += 1
for _, p in frames:
    assert all(0 <= c < L for xyz in p for c in xyz)
assert frames[1][1] != frames[0][1] and frames[2][1] != frames[1][1]
PY

# SIGTERM (or Ctrl-C) stops the run cleanly: exit 128 + 15, a line saying
# where, the summary of the steps that ran, and whole trajectory frames (sent
# once a second frame's header shows the steps running)
sigterm_when '[[ $(grep -c "^864$" "$work/stop.xyz" 2>/dev/null) -ge 2 ]]' "$work/stop.out" \
  "$GPC" md --cells 6 --steps 10000000 --thermo 100 --dump "$work/stop.xyz" --dump-every 10
[[ $stopped_rc -eq 143 ]] || fail "SIGTERM: exit $stopped_rc, not 143: $(tail -3 "$work/stop.out")"
grep -q "stopped by SIGTERM at step [0-9]* of 10000000" "$work/stop.out" || fail "no stop line: $(tail -3 "$work/stop.out")"
grep -q "million atom-steps/s" "$work/stop.out" || fail "no summary after the stop"
python3 - "$work/stop.xyz" <<'PY'
import sys
lines = open(sys.argv[1]).read().splitlines()
at = frames = 0
while at < len(lines):
    n = int(lines[at])
    assert n == 864 and len(lines) >= at + 2 + n, (at, n, len(lines))
    assert all(len(l.split()) == 4 for l in lines[at + 2:at + 2 + n])
    at += 2 + n
    frames += 1
assert frames >= 2, frames
PY

expect_usage() { expect_exit 2 "$1" "$GPC" md "${@:2}"; }
expect_usage "use at least 4 cells" --cells 3
expect_usage "cells 0 is not 1 to 300" --cells 0
expect_usage "--steps -1 is negative" --steps -1
expect_usage "--thermo 0 is not 1 or more" --thermo 0
expect_usage "skin -1 is negative" --skin -1
expect_usage "unknown option --atoms" --atoms 10
expect_usage "--dump-every 5 needs --dump FILE" --dump-every 5
expect_usage "--device gpu: use cpu or cuda[:N]" --device gpu
expect_usage "--forces f16: use f64 or f32" --forces f16
expect_usage "--gpu-step both: use split or fused" --gpu-step both
expect_usage "--gpu-unroll 3: use 1, 2, 4 or 8" --gpu-unroll 3
expect_usage "--gpu-list warps: use cells or atoms" --gpu-list warps
GPC_MD_LIST=warps expect_usage "GPC_MD_LIST=warps: use one of cells|cells1|atoms" --cells 5
GPC_MD_STEP=both expect_usage "GPC_MD_STEP=both: use one of split|fused" --cells 5
expect_usage "--gpu-lanes 3: use 1, 2, 4 or 8" --gpu-lanes 3
expect_usage "--gpu-build f16: use f32 or f64" --gpu-build f16
expect_usage "--device cuda:x: write cuda:N" --device cuda:x
# without a GPU (or CUDA in the build): one line that says so and what to do
if ! nvidia-smi -L >/dev/null 2>&1; then
  expect_exit 1 "or run with --device cpu" "$GPC" md --cells 5 --device cuda
fi
"$GPC" md --help | grep -q "LAMMPS" || fail "gpc md --help does not describe the command"
# more atoms than any machine's memory holds (about 400 GiB): refused up front
expect_exit 1 "GiB: use fewer cells" "$GPC" md --cells 300 --density 9
grep -q "GiB of host memory, more than this machine has free, .* GiB: use fewer cells" "$work/expect.err" ||
  fail "a run too large for memory: $(cat "$work/expect.err")"
# a time step far too long: a clear error, not infinities
expect_usage "the run blew up" --cells 5 --dt 0.5 --steps 100
# fixed rebuilds too far apart for a hot gas: a warning with what to do
"$GPC" md --cells 5 --temperature 10 --dt 0.002 --steps 45 --rebuild-every 40 >"$work/hot" 2>&1 || true
grep -q "warning: .* pairs may have been missed: use --rebuild-every 0" "$work/hot" ||
  fail "no dangerous-build warning: $(tail -2 "$work/hot")"
echo "md: ok"
