#!/usr/bin/env bash
# test_cli_random.sh: random command lines (each command's own options with
# empty, negative, huge, NaN, garbage, missing and real values) end as the
# README promises: exit 0, 1 or 2, never a signal or a sanitizer report, an
# error as one last line starting with "gpc", a usage error as that line
# alone. The lines and their checks are in cli_random.py; the seed is
# printed and GPC_TEST_SEED repeats it. About 30 s (ASan build: 60 s).
set -u
GPC=${GPC:?set GPC to the gpc binary}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpc-cli-random-XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

# a real run and real data, for the values that should be a run or shards
make_dataset 64 5
"$GPC" train --data "$work/data" --out "$work/run" --device cpu --layers 1 --heads 2 --channels 32 \
  --context 16 --batch 2 --steps 2 --eval-every 0 >"$work/out" 2>&1 || { fail "train: $(cat "$work/out")"; exit 1; }

python3 "$(dirname "$0")/cli_random.py" --gpc "$GPC" --work "$work" --runs 200 --budget-s 150 ||
  fail "random command lines (above)"
exit $((failures > 0))
