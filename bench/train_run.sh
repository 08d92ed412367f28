#!/usr/bin/env bash
# train_run.sh: one `gpc train` of GPT-2 124M on synthetic shards (d12,
# micro-batch 64 x 1024, 524,288 tokens a step, bf16, the data loader
# included), the run bench/gpt2_train.sh and bench/ab_step.sh (TRAIN=1)
# measure:
#
#   bench/train_run.sh GPC LOG [STEPS]
#
# GPC is the gpc binary, LOG the file its output is added to, STEPS the steps
# measured (default 10; three more run first). Prints one line,
#   RESULT gpc_train tokens_per_s=N steps=S last_loss=L
# with the median tokens/s of the steps after the first three, and exits 1
# (saying why) when there is none. The shards are made once, in
# $GPC_BENCH_DATA (default /tmp/gpc-bench-data), and reused by later runs.
set -uo pipefail
[[ $# -ge 2 ]] || { echo "usage: bench/train_run.sh GPC LOG [STEPS]" >&2; exit 2; }
gpc=$1 log=$2 steps=${3:-10}
data=${GPC_BENCH_DATA:-/tmp/gpc-bench-data}
"$gpc" train --help >/dev/null 2>&1 || { echo "train_run: '$gpc' has no train command" >&2; exit 1; }
if [[ ! -f $data.complete ]]; then
  rm -rf "$data"
  "$gpc" data synth --vocab 50257 --tokens 20000000 --out "$data" >>"$log" 2>&1 ||
    { echo "train_run: gpc data synth failed (its output is in $log)" >&2; exit 1; }
  touch "$data.complete"
fi
run=$(mktemp -d "${TMPDIR:-/tmp}/gpc-bench-run.XXXXXX")
trap 'rm -rf "$run"' EXIT
timeout 300 "$gpc" train --data "$data" --out "$run/run" --model d12 --context 1024 --batch 64 \
  --total-batch 524288 --steps $((steps + 3)) --device cuda --precision bf16 --eval-every 0 \
  --checkpoint-every 0 >>"$log" 2>&1
echo "gpc train exit status $?" >>"$log"
python3 - "$run/run/metrics.jsonl" <<'PY'
import json, sys
try:
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
except OSError:
    rows = []
tps = sorted(r["tokens_per_s"] for r in rows[3:] if r.get("tokens_per_s"))
if not tps:
    sys.exit("train_run: no measured steps in the run's metrics.jsonl")
print(f"RESULT gpc_train tokens_per_s={tps[len(tps) // 2]:.0f} steps={len(tps)} last_loss={rows[-1].get('loss')}")
PY
