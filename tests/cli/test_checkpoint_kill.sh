#!/usr/bin/env bash
# test_checkpoint_kill.sh: a training run killed with SIGKILL at random
# moments, over many checkpoint saves (--checkpoint-every 1), always
# resumes: checkpoint.bin is whole at every moment, each resume starts at or
# after the last step announced as saved, and no temporary file is left.
# Then a damaged checkpoint.bin: --resume falls back to checkpoint.prev.bin
# and says so. About 30 s of wall time.
set -u
GPC=${GPC:?set GPC to the gpc binary}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpc-ckpt-kill-XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

"$GPC" data synth --vocab 64 --tokens 20000 --out "$work/data" --seed 3 >"$work/out" 2>&1 ||
  { echo "cannot make the dataset: $(cat "$work/out")" >&2; exit 1; }
run="$work/run"
train=("$GPC" train --data "$work/data" --out "$run" --device cpu --layers 1 --heads 2
  --channels 32 --context 16 --batch 2 --steps 100000 --checkpoint-every 1 --eval-every 0)

RANDOM=7 # the same moments every time
kills=0 resumes=0 last_saved=0
# 25 s of kills, and on until 12 came after a checkpoint: on a loaded
# machine each run starts slowly, so fewer fit in the 25 s (at most 5 min)
deadline=$((SECONDS + 25)) hard=$((SECONDS + 300))
while ((SECONDS < hard)) && ((SECONDS < deadline || resumes < 12)); do
  args=()
  [[ -e $run/checkpoint.bin || -e $run/checkpoint.prev.bin ]] && args=(--resume)
  "${train[@]}" "${args[@]}" >"$work/train.out" 2>"$work/train.err" &
  pid=$!
  # 50 to 800 ms: the first runs die before a save, later ones anywhere in one
  sleep "0.$((RANDOM % 75 + 5))"
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" && rc=0 || rc=$?
  kills=$((kills + 1))
  if [[ $rc -ne 137 ]]; then
    fail "kill $kills (${args[*]}): exit $rc, not 137 (killed): $(tail -n 3 "$work/train.err")"
    break
  fi
  if [[ ${#args[@]} -gt 0 ]]; then
    resumes=$((resumes + 1))
    at=$(sed -n 's/^gpc train: resuming at step \([0-9]*\) .*/\1/p' "$work/train.err")
    if [[ -n $at && $at -lt $last_saved ]]; then
      fail "kill $kills: resumed at step $at, but step $last_saved had been saved"
    fi
  fi
  saved=$(tr '\r' '\n' <"$work/train.err" |
    sed -n 's/^step \([0-9]*\)\/[0-9]* | checkpoint saved.*/\1/p' | tail -n 1)
  [[ -n $saved ]] && last_saved=$saved
done
((resumes >= 10)) || fail "only $resumes of $kills kills came after a checkpoint (expected 10 or more)"

# the run goes on from where the last kill left it, and leaves no temporary file
"${train[@]}" --resume --stop-after 1 >"$work/train.out" 2>"$work/train.err" && rc=0 || rc=$?
[[ $rc -eq 0 ]] || fail "resume after $kills kills: exit $rc: $(tail -n 3 "$work/train.err")"
grep -q "resuming at step" "$work/train.err" || fail "no 'resuming at step': $(cat "$work/train.err")"
left=$(find "$run" -name '*.tmp.*' | wc -l)
[[ $left -eq 0 ]] || fail "temporary files left: $(find "$run" -name '*.tmp.*')"
[[ -f $run/checkpoint.prev.bin ]] || fail "no checkpoint.prev.bin beside checkpoint.bin"

# a temporary file of a process that no longer runs goes at the next start
echo partial >"$run/checkpoint.bin.tmp.999999999"
# a damaged checkpoint.bin: the previous one is taken, with a warning
step_prev=$(sed -n 's/^gpc train: resuming at step \([0-9]*\) .*/\1/p' "$work/train.err")
printf '\x55' | dd of="$run/checkpoint.bin" bs=1 seek=300 conv=notrunc status=none
"${train[@]}" --resume --stop-after 1 >"$work/train.out" 2>"$work/train.err" && rc=0 || rc=$?
[[ $rc -eq 0 ]] || fail "resume from a damaged checkpoint.bin: exit $rc: $(cat "$work/train.err")"
grep -q "resuming from the previous checkpoint" "$work/train.err" ||
  fail "the fallback is not said: $(cat "$work/train.err")"
grep -q "resuming at step $step_prev " "$work/train.err" ||
  fail "the fallback resumes at another step than the previous checkpoint's ($step_prev): $(cat "$work/train.err")"
[[ ! -e $run/checkpoint.bin.tmp.999999999 ]] || fail "a stale temporary file was not removed"

echo "$kills kills, $resumes resumes"
if ((failures)); then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "all checkpoint kill tests passed"
