#!/usr/bin/env bash
# test_bench_cli.sh: `gpc bench --quick` on the CPU end to end: the JSON
# holds the sizes asked for, every rate equals work / time, GEMM work is
# 2 n^3 and its sampled error is at float32 level, the table shows the same
# figures, the GPU parts say why they did not run, and the claims are marked
# "not measured" with that reason. On a machine with a GPU the GPU part is
# checked the same way. Bad options are usage errors.
set -euo pipefail
GPC=${GPC:?set GPC to the gpc binary}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$GPC" bench gemm copy attention --quick --device cpu --json "$work/cpu.json" >"$work/cpu.txt"
python3 - "$work/cpu.json" "$work/cpu.txt" <<'PY'
import json, re, sys
b = json.load(open(sys.argv[1]))
table = open(sys.argv[2]).read()
assert b["gpu"] is None, b["gpu"]
assert b["quick"] is True
gemm = [r for r in b["results"] if r["group"] == "gemm"]
assert [r["size"] for r in gemm] == [64, 128, 256], [r["size"] for r in gemm]
for r in b["results"]:
    assert r["seconds"] > 0 and r["rate"] > 0 and r["ok"], r
    # the rate is the work over the median time, in units of 1e9
    assert abs(r["rate"] - r["work"] / r["seconds"] / 1e9) <= 1e-6 * r["rate"], r
    # the table shows the same rate (one decimal) on the row of that result
    row = [l for l in table.splitlines()
           if re.search(r"\b%s\b" % re.escape(r["name"]), l) and
           (("n=%d" % r["size"]) in l or r["group"] != "gemm")]
    assert row, "no table row for %s" % r["name"]
    assert any("%.1f" % r["rate"] in l for l in row), (row, r["rate"])
for r in gemm:
    n = r["size"]
    assert r["name"] == "openblas-f32" and r["device"] == "cpu"
    assert r["work"] == 2 * n ** 3, r
    # f32 accumulation of n products: error about n * 2^-24 of sum |a b| at worst
    assert 0 <= r["error"] < n * 2 ** -24, r
copy = [r for r in b["results"] if r["group"] == "copy"]
assert len(copy) == 1 and copy[0]["name"] == "host-memcpy"
assert copy[0]["size"] == 16 << 20 and copy[0]["work"] == 2 * (16 << 20), copy
att = [r for r in b["results"] if r["group"] == "attention"]
if att:
    fwd = [r for r in att if r["name"] == "gpc-forward"][0]
    bwd = [r for r in att if r["name"] == "gpc-backward"][0]
    # causal attention, B=1, T=128, C=768: 2 B T^2 C forward, 2.5 times that backward
    assert fwd["size"] == 128 and fwd["work"] == 2 * 1 * 128 * 128 * 768, fwd
    assert bwd["work"] == 2.5 * fwd["work"], bwd
else:
    assert any("attention on the CPU" in s for s in b["skipped"]), b["skipped"]
assert not any(r["group"] == "overlap" for r in b["results"])
skipped = " ".join(b["skipped"])
assert "gemm on the GPU" in skipped and "--device cpu was asked" in skipped, skipped
assert len(b["claims"]) == 4
for c in b["claims"]:
    assert c["verdict"] == "not measured" and c["measured"] is None, c
    assert c["detail"].startswith("not measured: "), c
assert [c["claimed"] for c in b["claims"]] == [50, 80, 1.3, 7.5]
assert table.count("not measured") >= 4
PY

# --device cuda without a usable GPU: a clear error, exit 1.
set +e
"$GPC" bench gemm --quick --device cuda >"$work/cuda.txt" 2>"$work/cuda.err"
rc=$?
set -e
if [[ $rc -ne 0 ]]; then
  [[ $rc -eq 1 ]] || fail "bench --device cuda without a GPU exited $rc, expected 1"
  grep -Eq "^gpc bench: error: (this gpc was built without CUDA|no GPU)" "$work/cuda.err" ||
    fail "bench --device cuda: message '$(cat "$work/cuda.err")'"
else
  # A GPU is here: its GEMMs were checked against float64 and have sane rates.
  "$GPC" bench gemm --quick --device cuda --json "$work/gpu.json" >/dev/null
  python3 - "$work/gpu.json" <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))
assert b["gpu"] is not None
g = [r for r in b["results"] if r["device"].startswith("cuda")]
names = {r["name"] for r in g}
assert {"naive-f32", "tiled-f32", "cublas-f32", "cublas-bf16"} <= names, names
for r in g:
    assert r["ok"] and r["work"] == 2 * r["size"] ** 3 and r["rate"] > 0, r
assert b["claims"][0]["verdict"] != "not measured"
PY
fi

# The default device falls back to the CPU parts without failing.
"$GPC" bench gemm --quick >"$work/auto.txt"
grep -q "openblas-f32" "$work/auto.txt" || fail "auto device ran no CPU GEMM"

expect() {
  local code=$1 needle=$2; shift 2
  set +e
  "$GPC" bench "$@" >/dev/null 2>"$work/err.txt"
  local rc=$?
  set -e
  [[ $rc -eq $code ]] || fail "gpc bench $* exited $rc, expected $code"
  grep -q "^gpc bench: error: .*$needle" "$work/err.txt" || fail "gpc bench $*: message '$(cat "$work/err.txt")' lacks '$needle'"
}
expect 2 "'matmul' is not a benchmark" matmul --quick
expect 2 "--device tpu is not" --device tpu --quick
expect 1 "cannot write $work/no/such/dir/b.json" gemm --quick --device cpu --json "$work/no/such/dir/b.json"
echo "bench cli: ok"
