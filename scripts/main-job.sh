#!/usr/bin/env bash
# main-job.sh: the README's first command after setup and build (`make run`):
# prepares the bundled corpus (the text of Debian's fortunes package), trains
# a small GPT on it on the CPU with a live progress line, and prints a
# generated sample. Sized to finish in a few minutes on 2 cores.
#
# Environment: GPC (the gpc binary, default build/gpc), DATA (default
# data/fortunes), RUN (default runs/fortunes), STEPS (default 600), CORPUS
# (default /usr/share/games/fortunes).
set -euo pipefail
cd "$(dirname "$0")/.."

GPC=${GPC:-build/gpc}
DATA=${DATA:-data/fortunes}
RUN=${RUN:-runs/fortunes}
STEPS=${STEPS:-600}
CORPUS=${CORPUS:-/usr/share/games/fortunes}

if [[ ! -x "$GPC" ]]; then
  echo "main-job: error: $GPC is missing; build it first (make)" >&2
  exit 1
fi
if [[ ! -d "$CORPUS" ]]; then
  echo "main-job: error: $CORPUS is missing; install the corpus (make setup, as root)" >&2
  exit 1
fi

seconds() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

t0=$(seconds)
if [[ -f "$DATA/dataset.txt" ]]; then
  echo "== data: $DATA already prepared"
else
  echo "== data: preparing $CORPUS into $DATA"
  "$GPC" data prepare --input "$CORPUS" --out "$DATA"
fi
t1=$(seconds)

# A fresh run each time: the previous one (if any) is replaced.
rm -rf "$RUN"
echo "== train: a 4-layer GPT (d4: 4 heads, 256 channels, context 128) for $STEPS steps of 2048 tokens"
"$GPC" train --data "$DATA" --out "$RUN" --model d4 --context 128 --batch 16 \
  --steps "$STEPS" --lr 2e-3 --eval-every 100 --eval-batches 10 --checkpoint-every 0 \
  --device cpu --seed 1337
t2=$(seconds)

# A fortune is a few dozen tokens: --min-tokens goes on past the first
# end-of-text so the sample shows several lines.
echo "== sample: gpc sample --run $RUN --tokens 300 --min-tokens 150"
"$GPC" sample --run "$RUN" --tokens 300 --min-tokens 150 --seed 1337 --device cpu
t3=$(seconds)

echo "== timings: data $(elapsed "$t0" "$t1") s, train $(elapsed "$t1" "$t2") s, sample $(elapsed "$t2" "$t3") s"
echo "== metrics per step: $RUN/metrics.jsonl"
