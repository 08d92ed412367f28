#!/usr/bin/env bash
# hf_import_big.sh: the wall time and peak memory of `gpc import hf` of a
# random GPT-2 1.5B (transformers' save_pretrained, one f32 safetensors file,
# generated here: no weights can be downloaded on the GPU machine). The file
# is read once before the timed import so that it is in the page cache, as
# after a download.
#
#   scripts/hf_import_big.sh [GPC]      (default build-gpu/gpc)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
gpc=${1:-$root/build-gpu/gpc}
model=${WORK:-/tmp}/gpt2-1.5b run=${WORK:-/tmp}/run-1.5b
rm -rf "$model" "$run"
timeout 120 python3 "$root/scripts/hf_fixtures.py" --big "$model" --size 1.5b 2>&1 | grep -v Warning | tail -1
cat "$model"/*.safetensors >/dev/null
python3 - "$gpc" "$model" "$run" <<'PY'
import resource, subprocess, sys, time
t = time.time()
r = subprocess.run([sys.argv[1], "import", "hf", sys.argv[2], "--out", sys.argv[3]],
                   capture_output=True, text=True, timeout=120)
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1e6
print(f"RESULT hf_import_1.5b exit={r.returncode} wall_s={time.time() - t:.2f} peak_rss_gb={peak:.2f}")
print(r.stdout.strip()[-300:], r.stderr.strip()[-300:])
PY
ls -la "$model" "$run" | grep -E "safetensors|checkpoint"
rm -rf "$model" "$run"
