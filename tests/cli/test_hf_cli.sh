#!/usr/bin/env bash
# test_hf_cli.sh: Hugging Face GPT-2 folders and GPT-2's tokenizer end to
# end: `gpc tokenize` gives GPT-2's ids ("Hello world" is [15496, 995]) and
# decodes them back byte for byte; `gpc import hf` / `gpc export hf` round
# trip a transformers fixture bit for bit and refuse bad input with one line
# and no output folder; `gpc data prepare --tokenizer` tokenizes with GPT-2's
# tokenizer, `gpc train` records it, `gpc eval` reports values whose JSON
# agrees with its summary, and `gpc train --init-from` starts from the
# run's weights (with a learning rate of 1e-12 its eval equals the source's).
set -u
GPC=${GPC:?set GPC to the gpc binary}
SRC=${GPC_SOURCE_DIR:?set GPC_SOURCE_DIR to the source tree}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpc-hf-cli-XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
# shellcheck source=tests/cli/lib.sh
source "$(dirname "$0")/lib.sh"

# expect_one_line STATUS TEXT COMMAND...: exit STATUS, one stderr line holding TEXT
expect_one_line() {
  expect_exit "$@"
  [[ $(wc -l <"$work/expect.err") -eq 1 ]] || fail "$3: more than one line: $(cat "$work/expect.err")"
}

fx=$SRC/tests/fixtures
tok=$work/gpt2tok
mkdir -p "$tok"
xz -dc "$fx/gpt2/vocab.json.xz" >"$tok/vocab.json"
xz -dc "$fx/gpt2/merges.txt.xz" >"$tok/merges.txt"

# ---------------------------------------------------------------- tokenize
out=$("$GPC" tokenize --run "$tok" --text "Hello world") || fail "tokenize failed"
[[ $out == "[15496, 995]" ]] || fail "tokenize 'Hello world' gave $out"
out=$("$GPC" tokenize --run "$tok" --text "a<|endoftext|>b") || fail "tokenize eot failed"
[[ $out == "[64, 50256, 65]" ]] || fail "tokenize with <|endoftext|> gave $out"
out=$("$GPC" tokenize --run "$tok" --decode --text "[15496, 995, 50256]") || fail "decode failed"
[[ $out == "Hello world<|endoftext|>" ]] || fail "decode gave '$out'"
printf 'caf\xc3\xa9   \xf0\x9f\x98\x80 x\xff\xfe\n\ttabs  \n' >"$work/odd.txt"
"$GPC" tokenize --run "$tok" --text-file "$work/odd.txt" >"$work/odd.ids" || fail "tokenize file"
"$GPC" tokenize --run "$tok" --decode --text-file "$work/odd.ids" >"$work/odd.back" ||
  fail "decode file"
cmp -s "$work/odd.txt" "$work/odd.back" || fail "decode(encode(file)) differs from the file"
expect_one_line 1 "has no tokenizer" "$GPC" tokenize --run "$work" --text x
expect_one_line 2 "give --text S or --text-file F" "$GPC" tokenize --run "$tok"
expect_one_line 2 "JSON array of token ids" "$GPC" tokenize --run "$tok" --decode --text "hello"

# ---------------------------------------------------------- import, export
"$GPC" import hf "$fx/hf_tiny/model" --out "$work/run" >"$work/import.out" || fail "import failed"
grep -q "82752 parameters" "$work/import.out" || fail "import summary: $(cat "$work/import.out")"
grep -qx "tokenizer=none" "$work/run/config.txt" || fail "config.txt lacks tokenizer=none"
"$GPC" import hf "$fx/hf_tiny/sharded" --out "$work/run_sharded" >/dev/null || fail "import shards"
cmp -s "$work/run/checkpoint.bin" "$work/run_sharded/checkpoint.bin" ||
  fail "the sharded fixture imports to another checkpoint"
"$GPC" export hf "$work/run" --out "$work/exp" >/dev/null || fail "export failed"
"$GPC" import hf "$work/exp" --out "$work/run2" >/dev/null || fail "re-import failed"
cmp -s "$work/run/checkpoint.bin" "$work/run2/checkpoint.bin" ||
  fail "export then import changed the weights"
expect_one_line 2 "already exists" "$GPC" import hf "$fx/hf_tiny/model" --out "$work/run"
expect_one_line 1 "has no config.json" "$GPC" import hf "$work/nothing" --out "$work/bad"
[[ -e $work/bad ]] && fail "a failed import left $work/bad"
mkdir -p "$work/trunc"
cp "$fx/hf_tiny/model/config.json" "$work/trunc/"
head -c 100000 "$fx/hf_tiny/model/model.safetensors" >"$work/trunc/model.safetensors"
expect_one_line 1 "truncated or its header lies" "$GPC" import hf "$work/trunc" --out "$work/bad"
[[ -e $work/bad ]] && fail "a failed import left $work/bad"
expect_one_line 2 "say the format" "$GPC" import "$fx/hf_tiny/model" --out "$work/bad"

# ------------------------------------------- GPT-2's tokenizer in training
mkdir -p "$work/text"
for i in $(seq 1 40); do
  printf "Document %d: the quick brown fox jumps over the lazy dog, isn't it? Caf\xc3\xa9 %d.\n%%\n" \
    "$i" "$((i * 7))" >>"$work/text/corpus.txt"
done
"$GPC" data prepare --input "$work/text" --out "$work/data" --tokenizer "$tok" \
  --val-fraction 0.25 >"$work/prepare.out" || fail "data prepare --tokenizer failed"
grep -q "vocab 50257" "$work/prepare.out" || fail "prepare summary: $(cat "$work/prepare.out")"
out=$("$GPC" tokenize --run "$work/data" --text "Hello world") || fail "tokenize with the dataset"
[[ $out == "[15496, 995]" ]] || fail "the dataset's tokenizer gives $out"
common=(--data "$work/data" --device cpu --context 32 --batch 2 --eval-every 0)
"$GPC" train "${common[@]}" --out "$work/base" --layers 1 --heads 2 --channels 32 --steps 3 \
  --lr 3e-3 >/dev/null 2>&1 || fail "train on GPT-2 tokens failed"
grep -qx "tokenizer=gpt2" "$work/base/config.txt" || fail "the run does not record GPT-2's tokenizer"
"$GPC" eval --run "$work/base" --data "$work/data" --device cpu --json "$work/eval.json" \
  >"$work/eval.out" || fail "eval failed: $(cat "$work/eval.out")"
# the JSON's losses average to its mean_loss, and perplexity is exp(mean)
awk 'BEGIN { RS = "" } {
  match($0, /"mean_loss": [^,]*/); mean = substr($0, RSTART + 13, RLENGTH - 13) + 0
  match($0, /"perplexity": [^,]*/); ppl = substr($0, RSTART + 14, RLENGTH - 14) + 0
  match($0, /"losses": \[[^]]*/); n = split(substr($0, RSTART + 11, RLENGTH - 11), l, ", ")
  s = 0; for (i = 1; i <= n; i++) s += l[i]
  d = s / n - mean; if (d < 0) d = -d
  e = exp(mean) - ppl; if (e < 0) e = -e
  exit !(n > 10 && d < 1e-5 && e < 1e-4 * ppl && mean > 5 && mean < 12)
}' "$work/eval.json" || fail "eval's JSON does not add up: $(head -c 300 "$work/eval.json")"
mean=$(sed -n 's/.*"mean_loss": \([^,]*\),.*/\1/p' "$work/eval.json")
grep -q "mean cross-entropy $(printf '%.6f' "$mean") nats" "$work/eval.out" ||
  fail "eval printed $(cat "$work/eval.out"), the JSON says $mean"
"$GPC" eval --run "$work/base" --text-file "$work/text/corpus.txt" --device cpu >/dev/null ||
  fail "eval --text-file failed"
expect_one_line 2 "give --data DIR or --text-file F" "$GPC" eval --run "$work/base"

# --init-from: with a learning rate of 1e-12 the weights stay the source's
"$GPC" train "${common[@]}" --out "$work/ft" --init-from "$work/base" --steps 1 --lr 1e-12 \
  >/dev/null 2>&1 || fail "train --init-from failed"
"$GPC" eval --run "$work/ft" --data "$work/data" --device cpu --json "$work/eval_ft.json" \
  >/dev/null || fail "eval of the fine-tuned run failed"
mean_ft=$(sed -n 's/.*"mean_loss": \([^,]*\),.*/\1/p' "$work/eval_ft.json")
awk -v a="$mean" -v b="$mean_ft" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 1e-4) }' ||
  fail "--init-from did not start from the source's weights (eval $mean_ft, source $mean)"
grep -qx "init_from=$work/base" "$work/ft/config.txt" || fail "config.txt lacks init_from"
"$GPC" sample --run "$work/ft" --prompt "The quick" --tokens 4 --device cpu >/dev/null ||
  fail "sample from the fine-tuned run failed"
expect_one_line 2 "sizes come from --init-from" "$GPC" train "${common[@]}" --out "$work/ft2" \
  --init-from "$work/base" --model d2
"$GPC" data synth --vocab 500 --tokens 4000 --out "$work/synth" >/dev/null || fail "data synth"
expect_one_line 1 "prepare the data with" "$GPC" train --data "$work/synth" --device cpu \
  --out "$work/ft3" --init-from "$work/base" --steps 1

# the run with GPT-2's tokenizer exports it too: the files equal GPT-2's
"$GPC" export hf "$work/base" --out "$work/exp_tok" >"$work/export.out" || fail "export with tokenizer"
cmp -s "$tok/merges.txt" "$work/exp_tok/merges.txt" || fail "exported merges.txt differs"
grep -q "tokenizer: GPT-2's" "$work/export.out" || fail "export summary: $(cat "$work/export.out")"

if [[ $failures -ne 0 ]]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "hf cli: all checks passed"
