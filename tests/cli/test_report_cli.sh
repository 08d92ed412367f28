#!/usr/bin/env bash
# test_report_cli.sh: `gpc report` on a synthetic run written here (random
# losses, throughput, memory and GPU readings): the page is self-contained,
# holds the steps at the GPU's power limit, the median energy a step and the
# tokens per joule as computed here, and rendered in headless Chromium it
# shows the run's final loss, best validation loss, median tokens/s and MFU
# as computed here independently; a screenshot is taken. Missing, empty and corrupt metrics are clear errors. Skips (77)
# when Chromium is not installed.
set -euo pipefail
GPC=${GPC:?set GPC to the gpc binary}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

run="$work/run"
mkdir -p "$run"
seed=${GPC_TEST_SEED:-$RANDOM$RANDOM}
echo "test seed: $seed (set GPC_TEST_SEED to repeat)"
python3 - "$run" "$seed" <<'PY'
import json, math, random, sys
run, seed = sys.argv[1], int(sys.argv[2])
rng = random.Random(seed)
steps = rng.randint(20, 80)
with open(f"{run}/metrics.jsonl", "w") as f:
    for s in range(1, steps + 1):
        d = {"step": s, "loss": 4 * math.exp(-s / 15) + 2 + rng.random() * 0.1,
             "lr": 6e-4 * min(1, s / 5), "grad_norm": rng.random(),
             "tokens_per_s": 200000 + rng.random() * 20000, "ms": 80 + rng.random(),
             "tokens": s * 16384, "memory": 30e9 + rng.random() * 1e9}
        if s % 7 == 0 or s == steps:
            d["val_loss"] = d["loss"] + rng.random() * 0.2
        # the GPU's readings on most steps, a step's energy on every other read
        if s % 5 != 3:
            d["gpu_power_w"] = 600 + rng.random() * 100
            d["gpu_sm_clock_mhz"] = rng.randint(1400, 1980)
            d["gpu_power_capped"] = int(rng.random() < 0.7)
            if s > 1 and s % 2 == 0:
                d["gpu_step_energy_j"] = 50 + rng.random() * 10
        f.write(json.dumps(d, separators=(",", ":")) + "\n")
with open(f"{run}/config.txt", "w") as f:
    f.write("# gpc training run\nlayers=12\nheads=12\nchannels=768\ncontext=1024\n"
            "parameters=124475904\nprecision=bf16\ndevice=cuda:0\ngpu_name=NVIDIA H200\n"
            "batch=16\n")
PY

"$GPC" report "$run" --out "$work/page.html" >"$work/out.txt"
python3 - "$run" "$work/out.txt" >"$work/expect.txt" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
final = "%.4f" % rows[-1]["loss"]
best = "%.4f" % min(r["val_loss"] for r in rows if "val_loss" in r)
tps = statistics.median(r["tokens_per_s"] for r in rows[1:])
# MFU: (6N + 6 L C T) FLOPs per token against 989 TFLOP/s (H200, bf16)
flops = 6 * 124475904 + 6 * 12 * 768 * 1024
mfu = "%.3g%%" % (100 * tps * flops / 989e12)
out = open(sys.argv[2]).read()
assert f"final loss {final}" in out, out
# the GPU: steps at the power limit of those read, a step's energy, tokens per joule
read = [r for r in rows if "gpu_power_capped" in r]
capped = "%d of %d" % (sum(r["gpu_power_capped"] for r in read), len(read))
energy = statistics.median(r["gpu_step_energy_j"] for r in rows if "gpu_step_energy_j" in r)
per_joule = "%.0f" % (rows[-1]["tokens"] / rows[-1]["step"] / energy)
print(final, best, "%.0f" % tps, mfu, capped.replace(" ", "_"), "%.4g_J" % energy, per_joule)
PY
read -r final best tps mfu capped energy per_joule <"$work/expect.txt"
capped=${capped//_/ } energy=${energy//_/ }
# the GPU's figures are in the page as computed here
for pair in "gpu-capped:$capped" "step-energy:$energy" "tokens-per-joule:$per_joule"; do
  grep -q "id=\"${pair%%:*}\">${pair#*:}<" "$work/page.html" ||
    fail "page lacks ${pair%%:*} = ${pair#*:}: $(grep -o "id=\"${pair%%:*}\">[^<]*" "$work/page.html")"
done
grep -q 'id="gpu-note"' "$work/page.html" && fail "a note that there are no GPU readings, beside them"

# Self-contained: nothing to fetch (the SVG namespace is a name, not a fetch).
if grep -Eo '(src|href)="[^"]*"' "$work/page.html" | grep -q .; then
  fail "page references $(grep -Eo '(src|href)="[^"]*"' "$work/page.html" | head -1)"
fi
[[ $(grep -v 'xmlns="http://www.w3.org/2000/svg"' "$work/page.html" | grep -c 'http' || true) -eq 0 ]] ||
  fail "page mentions a URL"

# Error paths: each a one-line error with exit 1 (2 for usage).
expect() {
  local code=$1 needle=$2; shift 2
  set +e
  "$GPC" report "$@" >/dev/null 2>"$work/err.txt"
  local rc=$?
  set -e
  [[ $rc -eq $code ]] || fail "gpc report $* exited $rc, expected $code"
  grep -q "^gpc report: error: .*$needle" "$work/err.txt" || fail "gpc report $*: message '$(cat "$work/err.txt")' lacks '$needle'"
}
expect 2 "give the run folder"
expect 1 "is not a directory" "$work/nowhere"
mkdir -p "$work/empty-run"
expect 1 "metrics.jsonl does not exist" "$work/empty-run"
: >"$work/empty-run/metrics.jsonl"
expect 1 "has no steps yet" "$work/empty-run"
mkdir -p "$work/bad"
printf '{"step":1,"loss":3.5}\n{"step":2,"loss":3.4}\n{"step":3,"loss":\n{"step":4,"loss":3.2}\n' >"$work/bad/metrics.jsonl"
expect 1 "metrics.jsonl line 3 is not a metrics record" "$work/bad"
expect 1 "cannot write" "$run" --out "$work/no/such/dir/x.html"
# an unfinished last line (a run killed mid-write) is skipped with a warning
printf '{"step":1,"loss":3.5}\n{"step":2,"loss":3.25}\n{"step":3,"lo' >"$work/bad/metrics.jsonl"
"$GPC" report "$work/bad" >"$work/partial.txt" 2>"$work/partial.err"
grep -q "final loss 3.2500" "$work/partial.txt" || fail "partial run: $(cat "$work/partial.txt")"
grep -q "line 3 is unfinished" "$work/partial.err" || fail "no warning for the unfinished line"
grep -q 'id="mfu-note"' "$work/bad/report.html" || fail "no MFU note without a config"
grep -q 'id="gpu-note"' "$work/bad/report.html" || fail "no note that a run has no GPU readings"
grep -q 'id="gpu-capped"\|id="step-energy"' "$work/bad/report.html" && fail "GPU figures in a run without readings"

browser=$(command -v chromium || command -v chromium-browser || true)
if [[ -z "$browser" ]]; then
  echo "chromium not installed: skipping the rendering check"
  exit 77
fi
chrome() {
  local profile
  profile=$(mktemp -d "$work/profile.XXXX")
  timeout 120 "$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$profile" "$@" 2>>"$work/chromium.log"
}
chrome --dump-dom "file://$work/page.html" >"$work/dom.html" ||
  fail "chromium failed (exit $?): $(tail -3 "$work/chromium.log")"
python3 - "$work/dom.html" "$final" "$best" "$tps" "$mfu" <<'PY'
import re, sys
dom, final, best, tps, mfu = open(sys.argv[1]).read(), *sys.argv[2:]
def cell(i):
    m = re.search(r'id="%s">([^<]*)<' % i, dom)
    assert m, f"no #{i} in the rendered page"
    return m.group(1)
assert cell("final-loss") == final, (cell("final-loss"), final)
assert cell("best-val-loss") == best, (cell("best-val-loss"), best)
assert cell("tokens-per-s") == tps, (cell("tokens-per-s"), tps)
assert cell("mfu") == mfu, (cell("mfu"), mfu)
# eight charts: loss, tokens/s, MFU, memory, GPU power, SM clock, energy a
# step, learning rate; the loss chart has a line and the validation points
assert dom.count("<svg") == 8, dom.count("<svg")
assert "<polyline" in dom and "<circle" in dom
PY
chrome --window-size=900,1600 --screenshot="$work/shot.png" "file://$work/page.html" >/dev/null ||
  fail "chromium screenshot failed (exit $?): $(tail -3 "$work/chromium.log")"
[[ -s "$work/shot.png" ]] || fail "no screenshot"
[[ $(head -c 8 "$work/shot.png" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] || fail "screenshot is not a PNG"
[[ $(stat -c %s "$work/shot.png") -gt 20000 ]] || fail "screenshot is suspiciously small (blank page?)"
echo "report cli: ok"
