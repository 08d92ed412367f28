#!/usr/bin/env bash
# test_train_cli.sh: `gpc train` and `gpc sample` end to end: every usage
# error exits 2 with one "error:" line, runtime errors exit 1, a tiny run
# trains (metrics.jsonl has one line per step, the loss falls, no GPU fields
# on the CPU), samples deterministically for a seed, stops cleanly on SIGTERM
# with a checkpoint and resumes from it.
set -u
GPC=${GPC:?set GPC to the gpc binary}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpc-train-cli-XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
# shellcheck source=tests/cli/lib.sh
source "$(dirname "$0")/lib.sh"

# expect STATUS DESCRIPTION -- command...: exit status and, for errors, one
# stderr line that says "error:"
expect() {
  local want=$1 what=$2
  shift 3
  timeout 300 "$@" >"$work/out" 2>"$work/err"
  local got=$?
  if [[ $got -ne $want ]]; then
    fail "$what: exit $got, expected $want ($(head -c 300 "$work/err"))"
    return
  fi
  if [[ $want -ne 0 ]]; then
    local lines
    lines=$(wc -l <"$work/err")
    if [[ $lines -ne 1 ]] || ! grep -q "error:" "$work/err"; then
      fail "$what: expected one 'error:' line, got: $(cat "$work/err")"
    fi
  fi
}

# A small corpus: sentences from a fixed grammar, so the text is learnable.
python3 - "$work/corpus.txt" <<'EOF' 2>/dev/null || {
import random, sys
random.seed(5)
subjects = ["the cat", "a dog", "my friend", "the old man", "a small bird", "the teacher"]
verbs = ["sees", "likes", "finds", "follows", "watches", "helps"]
objects = ["the ball", "a tree", "the river", "an apple", "the house", "a song"]
with open(sys.argv[1], "w") as f:
    for i in range(3000):
        f.write(f"{random.choice(subjects)} {random.choice(verbs)} {random.choice(objects)}.\n")
        if i % 10 == 9:
            f.write("\n%\n")
EOF
  for i in $(seq 1 3000); do echo "the cat sees the ball number $((i % 7)). the dog likes it."; done >"$work/corpus.txt"
}
data="$work/data"
if ! "$GPC" data prepare --input "$work/corpus.txt" --out "$data" --vocab-size 300 \
  >"$work/prep.out" 2>"$work/prep.err"; then
  echo "cannot prepare the test dataset: $(cat "$work/prep.err")" >&2
  exit 1
fi
run="$work/run"

# ---- usage errors of train: exit 2
expect 2 "train without options" -- "$GPC" train
expect 2 "train without --out" -- "$GPC" train --data "$data"
expect 2 "train without --data" -- "$GPC" train --out "$run"
expect 2 "train unknown option" -- "$GPC" train --data "$data" --out "$run" --bogus 1
expect 2 "train --batch 0" -- "$GPC" train --data "$data" --out "$run" --batch 0
expect 2 "train --context -4" -- "$GPC" train --data "$data" --out "$run" --context -4
expect 2 "train --steps abc" -- "$GPC" train --data "$data" --out "$run" --steps abc
expect 2 "train --lr 5" -- "$GPC" train --data "$data" --out "$run" --lr 5
expect 2 "train --lr missing value" -- "$GPC" train --data "$data" --out "$run" --lr
expect 2 "train --min-lr-ratio 2" -- "$GPC" train --data "$data" --out "$run" --min-lr-ratio 2
expect 2 "train --warmup -3" -- "$GPC" train --data "$data" --out "$run" --warmup -3
expect 2 "train --weight-decay -1" -- "$GPC" train --data "$data" --out "$run" --weight-decay -1
expect 2 "train --model x4" -- "$GPC" train --data "$data" --out "$run" --model x4
expect 2 "train --precision fp8" -- "$GPC" train --data "$data" --out "$run" --precision fp8
expect 2 "train --device tpu" -- "$GPC" train --data "$data" --out "$run" --device tpu
expect 2 "train --total-batch 0" -- "$GPC" train --data "$data" --out "$run" --total-batch 0
expect 2 "train --total-batch not a multiple" -- "$GPC" train --data "$data" --out "$run" \
  --model d1 --context 16 --batch 2 --total-batch 100 --device cpu
grep -q "not a multiple of batch x context" "$work/err" || fail "total-batch message: $(cat "$work/err")"
expect 2 "train --heads not dividing channels" -- "$GPC" train --data "$data" --out "$run" \
  --layers 1 --heads 3 --channels 32 --context 16 --device cpu
expect 2 "train bf16 on the cpu" -- "$GPC" train --data "$data" --out "$run" --model d1 \
  --device cpu --precision bf16
expect 2 "train --recompute 4" -- "$GPC" train --data "$data" --out "$run" --model d1 \
  --device cpu --recompute 4
grep -q "recompute 4 is not 0, gelu (1), layernorm (2) or block" "$work/err" || fail "recompute message: $(cat "$work/err")"
expect 2 "train --recompute-layers alone" -- "$GPC" train --data "$data" --out "$run" --model d1 \
  --device cpu --recompute-layers 2
grep -q "recompute-layers 2 needs a --recompute mode" "$work/err" || fail "recompute-layers message: $(cat "$work/err")"
expect 2 "train --recompute-layers beyond the model" -- "$GPC" train --data "$data" --out "$run" \
  --model d1 --device cpu --recompute block --recompute-layers 2
grep -q "recompute-layers 2 is more than the model's 1 blocks" "$work/err" || fail "recompute-layers range message: $(cat "$work/err")"
expect 2 "train --attention flash" -- "$GPC" train --data "$data" --out "$run" --model d1 \
  --device cpu --attention flash
grep -q "attention must be auto, gpc or cudnn, not 'flash'" "$work/err" ||
  fail "attention message: $(cat "$work/err")"
expect 2 "train --attention cudnn on the cpu" -- "$GPC" train --data "$data" --out "$run" \
  --model d1 --device cpu --attention cudnn
grep -q "attention cudnn needs a GPU" "$work/err" || fail "attention cpu message: $(cat "$work/err")"
expect 2 "train --attention-backward quick" -- "$GPC" train --data "$data" --out "$run" \
  --model d1 --device cpu --attention-backward quick
grep -q "attention-backward must be auto, two, fused or wgmma, not 'quick'" "$work/err" ||
  fail "attention-backward message: $(cat "$work/err")"
expect 2 "train --stochastic-rounding with a value" -- "$GPC" train --data "$data" --out "$run" \
  --model d1 --device cpu --stochastic-rounding 1
[[ -d "$run" && -f "$run/checkpoint.bin" ]] && fail "a refused run left a checkpoint"

# ---- flags of settings: shown in the help, and ahead of the environment,
# whose bad value is warned about only when it is read
"$GPC" help train >"$work/help" 2>&1
grep -Eq '^  --attention-backward B +GPU attention backward: auto .*two .*fused .*wgmma' "$work/help" ||
  fail "gpc help train lacks --attention-backward: $(grep attention "$work/help")"
grep -Eq '^  --stochastic-rounding +round the bf16 weights stochastically' "$work/help" ||
  fail "gpc help train lacks --stochastic-rounding"
tiny=(train --data "$data" --layers 1 --heads 2 --channels 32 --context 16 --batch 2 --steps 2
  --eval-every 0 --device cpu)
expect 0 "train with a bad GPC_STOCHASTIC_ROUNDING" -- env GPC_STOCHASTIC_ROUNDING=banana \
  "$GPC" "${tiny[@]}" --out "$work/sr-env"
grep -q "GPC_STOCHASTIC_ROUNDING=banana is not 1, on, true, yes, 0, off, false or no: using 0" \
  "$work/err" || fail "no warning about GPC_STOCHASTIC_ROUNDING=banana: $(cat "$work/err")"
expect 0 "train --stochastic-rounding --attention-backward two over the environment" -- \
  env GPC_STOCHASTIC_ROUNDING=banana GPC_ATTENTION_BWD=banana \
  "$GPC" "${tiny[@]}" --out "$work/sr-flag" --stochastic-rounding --attention-backward two
grep -q "banana" "$work/err" && fail "the flags did not come first: $(grep banana "$work/err")"

# ---- --offload-optimizer: in the help; on the CPU the losses are the plain
# run's, bit for bit (as printed in metrics.jsonl); refused with --tp
grep -Eq '^  --offload-optimizer +keep the f32 master weights' "$work/help" ||
  fail "gpc help train lacks --offload-optimizer"
expect 0 "train --offload-optimizer" -- "$GPC" "${tiny[@]}" --steps 4 --out "$work/off" \
  --offload-optimizer
grep -q "^gpc train: optimizer offloaded: master weights and moments in .* of pinned host memory" \
  "$work/err" || fail "no offload line: $(cat "$work/err")"
expect 0 "train without offload" -- "$GPC" "${tiny[@]}" --steps 4 --out "$work/no-off"
cmp -s <(grep -o '"loss":[^,]*' "$work/off/metrics.jsonl") \
  <(grep -o '"loss":[^,]*' "$work/no-off/metrics.jsonl") ||
  fail "offloaded losses differ: $(cat "$work/off/metrics.jsonl")"
cmp -s "$work/off/checkpoint.bin" "$work/no-off/checkpoint.bin" ||
  fail "offloaded checkpoint differs from the plain run's"
expect 1 "train --offload-optimizer --tp 2" -- "$GPC" "${tiny[@]}" --out "$work/off-tp" \
  --offload-optimizer --tp 2
grep -q "leave out --tp and --pp" "$work/err" || fail "--tp refusal: $(cat "$work/err")"

# ---- runtime errors: exit 1
expect 1 "train missing data dir" -- "$GPC" train --data "$work/nope" --out "$run" --device cpu
expect 1 "train --resume with nothing to resume" -- "$GPC" train --data "$data" --out "$work/none" \
  --resume --device cpu
# a CPU run larger than the memory free now is refused before anything is
# allocated or written, with the planned size (gpc plan's total and the batch
# buffers); before, it started and died of an allocation or the OOM killer
expect 1 "train larger than free memory" -- "$GPC" train --data "$data" --out "$work/huge" \
  --model d2 --context 1048576 --batch 64 --device cpu
[[ -e "$work/huge" ]] && fail "a run refused for memory created its folder"
"$GPC" plan --model d2 --context 1048576 --batch 64 --precision fp32 --vocab 300 --device cpu \
  --json "$work/plan.json" >/dev/null || fail "gpc plan --device cpu failed"
python3 - "$work/err" "$work/plan.json" <<'EOF' || fail "memory refusal: $(cat "$work/err")"
import json, re, sys
line = open(sys.argv[1]).read()
m = re.search(r"needs about ([0-9.]+) GiB of host memory, more than this machine has free, "
              r"([0-9.]+) GiB: use a smaller --context", line)
assert m, line
want = (json.load(open(sys.argv[2]))["total"] + 6 * 64 * 1048576 * 4) / 2**30
assert abs(float(m.group(1)) - want) < 0.06, (m.group(1), want)
EOF

# ---- a tiny run end to end
train=("$GPC" train --data "$data" --out "$run" --layers 2 --heads 2 --channels 32 --context 32
  --batch 4 --steps 40 --lr 3e-3 --eval-every 20 --eval-batches 2 --device cpu --seed 7)
if ! "${train[@]}" >"$work/train.out" 2>"$work/train.err"; then
  fail "tiny training run failed: $(cat "$work/train.err")"
else
  [[ $(wc -l <"$run/metrics.jsonl") -eq 40 ]] || fail "metrics.jsonl has $(wc -l <"$run/metrics.jsonl") lines, expected 40"
  [[ $(grep -c '"val_loss":' "$run/metrics.jsonl") -eq 2 ]] || fail "expected 2 validation lines"
  for f in checkpoint.bin config.txt tokenizer.bin; do
    [[ -f "$run/$f" ]] || fail "run folder lacks $f"
  done
  grep -q "parameters" "$work/train.err" || fail "no header line: $(head -3 "$work/train.err")"
  grep -q "^trained 40 steps" "$work/train.out" || fail "no summary: $(cat "$work/train.out")"
  # the CPU has no GPU readings: none in the metrics, the progress line or a
  # closing remark on power
  grep -q '"gpu_' "$run/metrics.jsonl" && fail "a CPU run's metrics carry GPU fields: $(grep -m1 '"gpu_' "$run/metrics.jsonl")"
  grep -Eq '\| GPU |power limit|power cap' "$work/train.err" && fail "a CPU run reports GPU power: $(grep -Em1 'GPU|power' "$work/train.err")"
  # the loss falls: mean of the last 5 steps below 75% of the first step's
  python3 - "$run/metrics.jsonl" <<'EOF' || fail "loss did not fall"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in rows] == list(range(1, 41)), "steps out of order"
first, last = rows[0]["loss"], sum(r["loss"] for r in rows[-5:]) / 5
print(f"loss {first:.3f} -> {last:.3f}")
sys.exit(0 if last < 0.75 * first else 1)
EOF
  # training into a finished run without --resume is refused
  expect 2 "train over an existing run" -- "${train[@]}"
  expect 2 "resume a finished run" -- "${train[@]}" --resume
  expect 1 "resume with another model" -- "${train[@]}" --resume --layers 3 --steps 50
fi

# ---- sample
expect 2 "sample without options" -- "$GPC" sample
expect 2 "sample --tokens 0" -- "$GPC" sample --run "$run" --tokens 0
expect 2 "sample --temperature -1" -- "$GPC" sample --run "$run" --temperature -1
expect 2 "sample --top-k -2" -- "$GPC" sample --run "$run" --top-k -2
expect 2 "sample --top-p 0" -- "$GPC" sample --run "$run" --top-p 0
expect 2 "sample --prompt and --prompt-file" -- "$GPC" sample --run "$run" --prompt x --prompt-file /etc/hostname
expect 1 "sample --prompt-file missing" -- "$GPC" sample --run "$run" --prompt-file "$work/no-such-prompt"
expect 2 "sample --top-p 1.5" -- "$GPC" sample --run "$run" --top-p 1.5
expect 2 "sample unknown option" -- "$GPC" sample --run "$run" --colour red
expect 2 "sample --precision int4" -- "$GPC" sample --run "$run" --precision int4
expect 1 "sample missing run" -- "$GPC" sample --run "$work/none"
if [[ -f "$run/checkpoint.bin" ]]; then
  expect 0 "sample" -- "$GPC" sample --run "$run" --prompt "the cat" --tokens 30 --seed 3 --device cpu
  cp "$work/out" "$work/sample1"
  [[ $(head -c 7 "$work/sample1") == "the cat" ]] || fail "sample does not start with the prompt: $(cat "$work/sample1")"
  [[ $(wc -c <"$work/sample1") -gt 9 ]] || fail "sample generated nothing: $(cat "$work/sample1")"
  # the report on stderr counts what was drawn: at most 30 tokens, the prompt's 2
  grep -Eq '^sample: ([1-9]|[12][0-9]|30) tokens in [0-9.]+ s: a prompt of 2 and the first token in [0-9.]+ s, then [0-9.]+ tokens/s$' "$work/err" ||
    fail "sample report: $(cat "$work/err")"
  # and why it stopped: at end-of-text after as many tokens as it reported,
  # or at the limit of 30
  n=$(sed -n 's/^sample: \([0-9]*\) tokens in.*/\1/p' "$work/err")
  grep -qx "sample: stopped at the end-of-text token after $n tokens (--ignore-eos or --min-tokens N write on past it)" "$work/err" ||
    { [[ $n -eq 30 ]] && grep -qx "sample: stopped at the limit of --tokens 30" "$work/err"; } ||
    fail "sample stop reason for $n tokens: $(cat "$work/err")"
  # --ignore-eos writes exactly --tokens tokens; --min-tokens at least that
  # many; 100 tokens outgrow the context of 32 (the window drops 8 at a time:
  # it is full after 32 - 2 = 30 tokens, then every 8: (100 - 30 + 7) / 8 = 9)
  expect 0 "sample --ignore-eos" -- "$GPC" sample --run "$run" --prompt "the cat" --tokens 100 --seed 3 --device cpu --ignore-eos
  grep -q "^sample: 100 tokens in" "$work/err" || fail "--ignore-eos did not give 100 tokens: $(cat "$work/err")"
  grep -qx "sample: stopped at the limit of --tokens 100" "$work/err" || fail "--ignore-eos stop: $(cat "$work/err")"
  grep -qx "sample: the text outgrew the context of 32 tokens 9 time(s): each token saw at least the last 24" "$work/err" ||
    fail "context notice: $(cat "$work/err")"
  for seed in 1 2 3 4 5; do
    expect 0 "sample --min-tokens 25" -- "$GPC" sample --run "$run" --tokens 40 --seed $seed --device cpu --min-tokens 25
    n=$(sed -n 's/^sample: \([0-9]*\) tokens in.*/\1/p' "$work/err")
    [[ -n $n && $n -ge 25 && $n -le 40 ]] || fail "--min-tokens 25 gave $n tokens: $(cat "$work/err")"
  done
  expect 2 "sample --min-tokens above --tokens" -- "$GPC" sample --run "$run" --tokens 5 --min-tokens 6
  expect 0 "sample again" -- "$GPC" sample --run "$run" --prompt "the cat" --tokens 30 --seed 3 --device cpu
  cmp -s "$work/out" "$work/sample1" || fail "same seed, different text"
  # the prompt from a file: the same text
  printf 'the cat' >"$work/prompt.txt"
  expect 0 "sample --prompt-file" -- "$GPC" sample --run "$run" --prompt-file "$work/prompt.txt" --tokens 30 --seed 3 --device cpu
  cmp -s "$work/out" "$work/sample1" || fail "--prompt-file gives another text: $(cat "$work/out")"
  expect 0 "sample greedy, empty prompt" -- "$GPC" sample --run "$run" --temperature 0 --tokens 20 --device cpu
  [[ -s "$work/out" ]] || fail "greedy sample printed nothing"
  cp "$work/out" "$work/greedy"
  # nucleus sampling with a tiny p keeps the likeliest token: the greedy text
  expect 0 "sample --top-p tiny" -- "$GPC" sample --run "$run" --top-p 0.000001 --top-k 0 --tokens 20 --device cpu
  cmp -s "$work/out" "$work/greedy" || fail "top-p 1e-6 differs from greedy: $(cat "$work/out") / $(cat "$work/greedy")"
  # a prompt longer than the context (32): said, and its end is used
  long=$(for i in $(seq 60); do printf 'the cat sat. '; done)
  expect 0 "sample, long prompt" -- "$GPC" sample --run "$run" --prompt "$long" --tokens 5 --device cpu
  grep -Eq "^sample: the prompt's [0-9]+ tokens exceed the context of 32: the model sees the last 32$" "$work/err" ||
    fail "long prompt notice: $(cat "$work/err")"
  # keys and values kept or the window recomputed every token: the same text
  expect 0 "sample greedy, no kv cache" -- "$GPC" sample --run "$run" --temperature 0 --tokens 20 --device cpu --no-kv-cache
  cmp -s "$work/out" "$work/greedy" || fail "greedy text differs without the kv cache: $(cat "$work/out") / $(cat "$work/greedy")"
  # a tokenizer that does not belong to the checkpoint
  cp -r "$run" "$work/mixed"
  "$GPC" data prepare --input "$work/corpus.txt" --out "$work/data2" --vocab-size 280 >/dev/null 2>&1
  cp "$work/data2/tokenizer.bin" "$work/mixed/tokenizer.bin"
  expect 1 "sample with another run's tokenizer" -- "$GPC" sample --run "$work/mixed" --device cpu
fi

# ---- SIGTERM: a checkpoint and exit 143 (a clean stop, not an error), then --resume finishes
long="$work/long"
"$GPC" train --data "$data" --out "$long" --layers 1 --heads 2 --channels 32 --context 32 \
  --batch 2 --steps 100000 --eval-every 0 --checkpoint-every 0 --device cpu --recompute 1 \
  >"$work/long.out" 2>"$work/long.err" &
pid=$!
# SIGTERM once the first step is written, however slow the start (or once
# the run has ended: the checks below say what went wrong)
# shellcheck disable=SC2016 # the check expands each time it runs
wait_until 120 '[[ -s "$long/metrics.jsonl" ]] || ! kill -0 "$pid" 2>/dev/null'
kill -TERM "$pid"
wait "$pid"
rc=$?
if [[ $rc -ne 143 ]]; then
  fail "SIGTERM: exit $rc, expected 143 ($(tail -2 "$work/long.err"))"
else
  grep -q "error" "$work/long.err" && fail "a clean stop said 'error': $(tail -2 "$work/long.err")"
  grep -q "^gpc train: stopped by SIGTERM: interrupted after step" "$work/long.err" ||
    fail "SIGTERM stop line: $(tail -2 "$work/long.err")"
  grep -q "checkpoint saved at step [0-9]*; resume with --resume" "$work/long.err" ||
    fail "SIGTERM message: $(tail -2 "$work/long.err")"
  step=$(sed -n 's/.*checkpoint saved at step \([0-9]*\);.*/\1/p' "$work/long.err" | head -1)
  [[ $(wc -l <"$long/metrics.jsonl") -eq $step ]] || fail "metrics.jsonl does not end at step $step"
  expect 0 "resume after SIGTERM" -- "$GPC" train --data "$data" --out "$long" --resume \
    --steps $((step + 3)) --device cpu
  [[ $(wc -l <"$long/metrics.jsonl") -eq $((step + 3)) ]] || fail "resumed run did not reach step $((step + 3))"
  # --recompute was not repeated: the resumed run keeps the checkpoint's
  grep -qx "recompute=1" "$long/config.txt" || fail "resumed run lost --recompute 1: $(grep recompute "$long/config.txt")"
  expect 0 "resume with another --recompute" -- "$GPC" train --data "$data" --out "$long" --resume \
    --steps $((step + 4)) --device cpu --recompute 0
  grep -qx "recompute=0" "$long/config.txt" || fail "--recompute 0 on resume not taken: $(grep recompute "$long/config.txt")"
fi

# ---- a gpcd job that was preempted and requeued runs the same command again:
# it resumes (same GPC_JOB_ID as the run's config.txt), another job does not
job="$work/job"
jobcmd=("$GPC" train --data "$data" --out "$job" --layers 1 --heads 2 --channels 32 --context 32
  --batch 2 --steps 3 --eval-every 0 --checkpoint-every 0 --device cpu)
GPC_JOB_ID=41 "${jobcmd[@]}" >/dev/null 2>&1 || fail "first run of gpcd job 41"
grep -qx "gpcd_job=41" "$job/config.txt" || fail "config.txt lacks gpcd_job=41"
if GPC_JOB_ID=41 "${jobcmd[@]}" --steps 5 >"$work/job.out" 2>"$work/job.err"; then
  grep -q "gpcd job 41 was requeued: resuming from its checkpoint" "$work/job.err" ||
    fail "requeued job: no resume message ($(head -2 "$work/job.err"))"
  [[ $(wc -l <"$job/metrics.jsonl") -eq 5 ]] || fail "requeued job did not continue to step 5"
else
  fail "requeued gpcd job 41 did not resume: $(tail -1 "$work/job.err")"
fi
expect 2 "another gpcd job into the same folder" -- env GPC_JOB_ID=42 "${jobcmd[@]}"
# requeued once more after its last step (stopped as it finished): all is
# done, exit 0, nothing trained again
GPC_JOB_ID=41 "${jobcmd[@]}" --steps 5 >"$work/job.out" 2>"$work/job.err" ||
  fail "finished requeued job: exit $? ($(tail -1 "$work/job.err"))"
grep -q "gpcd job 41 was requeued after its last step: all 5 steps are done" "$work/job.err" ||
  fail "finished requeued job: $(cat "$work/job.err")"
[[ $(wc -l <"$job/metrics.jsonl") -eq 5 ]] || fail "finished requeued job trained again"

if [[ $failures -ne 0 ]]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "ok"
