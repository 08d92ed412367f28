#!/usr/bin/env bash
# test_main_job.sh: `make run` (scripts/main-job.sh) on a small corpus and a
# few steps: it prepares, trains and closes with a sample of several lines
# (at least --min-tokens 150 tokens, not the few before the first
# end-of-text), and says why the sample stopped.
set -u
GPC=${GPC:?set GPC to the gpc binary}
SRC=${GPC_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
GPC=$(cd "$(dirname "$GPC")" && pwd)/$(basename "$GPC")
work=$(mktemp -d "${TMPDIR:-/tmp}/gpc-main-job-XXXXXX")
trap 'rm -rf "$work"' EXIT

mkdir "$work/corpus"
for i in $(seq 1 6000); do
  echo "the cat sees the ball number $((i % 7)). the dog likes it."
  if ((i % 5 == 0)); then printf '%%\n'; fi
done >"$work/corpus/fortunes"
if ! GPC=$GPC CORPUS="$work/corpus" DATA="$work/data" RUN="$work/run" STEPS=5 \
  bash "$SRC/scripts/main-job.sh" >"$work/out" 2>"$work/err"; then
  echo "FAIL: main-job.sh: $(tail -3 "$work/err")" >&2
  exit 1
fi
n=$(sed -n 's/^sample: \([0-9]*\) tokens in.*/\1/p' "$work/err")
if [[ -z $n || $n -lt 150 || $n -gt 300 ]]; then
  echo "FAIL: the closing sample has ${n:-no} tokens, expected 150 to 300: $(tail -3 "$work/err")" >&2
  exit 1
fi
if ! grep -Eq "^sample: stopped at (the end-of-text token after $n tokens|the limit of --tokens 300)" "$work/err"; then
  echo "FAIL: no stop reason: $(tail -3 "$work/err")" >&2
  exit 1
fi
lines=$(sed -n '/^== sample/,/^== timings/p' "$work/out" | wc -l)
if [[ $lines -lt 5 ]]; then
  echo "FAIL: the sample spans $((lines - 2)) lines" >&2
  exit 1
fi
echo "ok: a closing sample of $n tokens over $((lines - 2)) lines"
