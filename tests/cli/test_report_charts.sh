#!/usr/bin/env bash
# test_report_charts.sh: what `gpc report`'s charts show, read from the SVG
# of the page: memory that moves by 4 KiB of 170 MiB is a flat line on an
# axis from 0 (not a cliff across the plot), a loss that moves by 1e-4 of 3
# fills under a tenth of the plot, validation loss is a line through each
# evaluation with a marker on each, a run of 200,000 steps draws a few
# thousand points a line that still show a one-step spike and dip; and a CPU
# run's configuration names its CPU as cpu_name, never gpu_name (a run gpc
# trains here, and an older run folder that wrote the CPU's name as
# gpu_name).
set -u
GPC=${GPC:?set GPC to the gpc binary}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpc-report-charts-XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

run=$work/run
mkdir -p "$run"
python3 - "$run" <<'PY'
import json, sys
run = sys.argv[1]
with open(f"{run}/metrics.jsonl", "w") as f:
    for s in range(1, 61):
        d = {"step": s, "loss": 3 + 1e-4 * (s % 3), "lr": 1e-3, "tokens_per_s": 5000 + s,
             "ms": 10, "tokens": s * 1024, "memory": 170 * 2**20 + 4096 * (s % 2)}
        if s % 10 == 0:
            d["val_loss"] = 3.2 - s / 100
        f.write(json.dumps(d) + "\n")
with open(f"{run}/config.txt", "w") as f:
    f.write("layers=1\ndevice=cpu\nprecision=f32\ngpu_name=Intel(R) Xeon(R) Processor\n")
PY
"$GPC" report "$run" --out "$work/page.html" >/dev/null 2>"$work/err" ||
  fail "gpc report: $(cat "$work/err")"

python3 - "$work/page.html" <<'PY' || fail "charts"
import re, sys
page = open(sys.argv[1]).read()
charts = {}
for fig in re.findall(r"<figure>(.*?)</figure>", page, re.S):
    charts[re.search(r'aria-label="([^"]*)"', fig).group(1)] = fig
plot_h = 260 - 30 - 40  # the plot area's height in the chart's pixels

def lines(fig, color):
    return [[tuple(map(float, p.split(","))) for p in pts.split()]
            for c, pts in re.findall(r'<polyline[^>]*stroke="([^"]*)"[^>]*points="([^"]*)"', fig)
            if c == color]

def ticks(fig):
    return [float(t) for t in re.findall(r'class="ytick">([^<]*)<', fig)]

mem = charts["memory"]
(points,) = lines(mem, "#8c564b")
spread = max(y for _, y in points) - min(y for _, y in points)
assert spread < 0.01 * plot_h, f"memory moving by 4 KiB spans {spread:.1f} of {plot_h} px"
assert min(ticks(mem)) == 0, f"memory axis does not start at 0: {ticks(mem)}"

loss = charts["loss"]
(train,) = lines(loss, "#1f77b4")
assert len(train) == 60, f"a 60-step run's loss line has {len(train)} points"
spread = max(y for _, y in train) - min(y for _, y in train)
assert spread < 0.1 * plot_h, f"a loss moving by 2e-4 spans {spread:.1f} of {plot_h} px"
(val,) = lines(loss, "#d62728")
assert len(val) == 6, f"validation line has {len(val)} points, expected 6"
assert [x for x, _ in val] == sorted(x for x, _ in val)
marks = re.findall(r'<circle cx="([^"]*)" cy="([^"]*)" r="[^"]*" fill="#d62728"', loss)
assert [(float(x), float(y)) for x, y in marks] == val, "markers are not on the line's points"
# the validation loss falls from 3.1 to 2.6: the line goes down the plot
assert val[-1][1] > val[0][1] + 0.2 * plot_h, val
PY

# a long run: each line draws a half-pixel column's first, lowest, highest
# and last points, so 200,000 steps give a few thousand points and the page
# stays small, yet a one-step spike and a one-step dip still reach their
# heights, at their steps
long=$work/long
mkdir -p "$long"
python3 - "$long" <<'PY'
import math, sys
with open(f"{sys.argv[1]}/metrics.jsonl", "w") as f:
    for s in range(1, 200001):
        loss = 3 + math.sin(s / 7) / 4 - s / 200000
        loss = 5.5 if s == 123457 else 1.0 if s == 45678 else loss
        f.write(f'{{"step":{s},"loss":{loss:.6f},"lr":0.001,"tokens_per_s":5000,"ms":10,'
                f'"tokens":{s * 1024},"memory":{170 * 2**20}}}\n')
PY
"$GPC" report "$long" --out "$work/long.html" >/dev/null 2>"$work/err" ||
  fail "gpc report of 200,000 steps: $(cat "$work/err")"
python3 - "$work/long.html" <<'PY' || fail "long run's chart"
import os, re, sys
page = open(sys.argv[1]).read()
assert os.path.getsize(sys.argv[1]) < 500_000, f"page of {os.path.getsize(sys.argv[1])} bytes"
fig = next(f for f in re.findall(r"<figure>(.*?)</figure>", page, re.S) if 'aria-label="loss"' in f)
(pts,) = re.findall(r'<polyline[^>]*stroke="#1f77b4"[^>]*points="([^"]*)"', fig)
line = [tuple(map(float, p.split(","))) for p in pts.split()]
assert 1000 < len(line) <= 4 * 2 * 630 + 4, f"{len(line)} points"
xs = [x for x, _ in line]
assert xs == sorted(xs) and xs[0] == 70.0 and xs[-1] == 700.0, (xs[:3], xs[-3:])
# the axis runs from 1.0 to 5.5 with 5% of its span beyond each end: the
# spike at the plot's top less that margin, the dip at its bottom plus it
pad = 190 * 0.05 / 1.1
x_of = lambda step: 70 + (step - 1) / 199999 * 630
top, bottom = min(line, key=lambda p: p[1]), max(line, key=lambda p: p[1])
assert abs(top[1] - (30 + pad)) < 0.11 and abs(top[0] - x_of(123457)) < 0.11, top
assert abs(bottom[1] - (220 - pad)) < 0.11 and abs(bottom[0] - x_of(45678)) < 0.11, bottom
PY

# the configuration table: the CPU's name as cpu_name
grep -q '<th>gpu_name</th>' "$work/page.html" && fail "an old CPU run's page shows gpu_name"
grep -q '<th>cpu_name</th><td>Intel(R) Xeon(R) Processor</td>' "$work/page.html" ||
  fail "no cpu_name row: $(grep -o '<th>[a-z_]*name</th><td>[^<]*' "$work/page.html")"

# a CPU run trained now writes cpu_name into config.txt
for i in $(seq 1 400); do echo "the cat sees the ball number $((i % 7))."; done >"$work/corpus.txt"
"$GPC" data prepare --input "$work/corpus.txt" --out "$work/data" --vocab-size 270 >/dev/null 2>&1 ||
  fail "data prepare"
"$GPC" train --data "$work/data" --out "$work/cpu" --layers 1 --heads 1 --channels 8 --context 8 \
  --batch 2 --steps 2 --eval-every 0 --device cpu >/dev/null 2>"$work/err" ||
  fail "tiny CPU run: $(cat "$work/err")"
grep -q '^gpu_name=' "$work/cpu/config.txt" && fail "a CPU run wrote $(grep '^gpu_name=' "$work/cpu/config.txt")"
grep -q '^cpu_name=.' "$work/cpu/config.txt" || fail "a CPU run's config.txt lacks cpu_name"

if [[ $failures -ne 0 ]]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "ok"
