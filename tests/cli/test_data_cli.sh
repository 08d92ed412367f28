#!/usr/bin/env bash
# test_data_cli.sh: `gpc data prepare` and `gpc data synth` end to end: the
# dataset.txt a small generated corpus gives, and the exit status and the
# one-line message of every usage error (2) and runtime error (1).
set -u
GPC=${GPC:?set GPC to the gpc binary}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpc-test-data-cli-XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0

fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}

# expect STATUS NEEDLE ARGS...: runs gpc, checks the exit status and that
# stderr holds exactly one line with "error:", the last one (progress lines
# may come before it), holding NEEDLE.
expect() {
    local want=$1 needle=$2
    shift 2
    "$GPC" "$@" >"$work/out" 2>"$work/err"
    local got=$?
    if [ "$got" -ne "$want" ]; then
        fail "gpc $*: exit $got, expected $want ($(cat "$work/err"))"
        return
    fi
    local lines
    lines=$(grep -c "error:" "$work/err")
    if [ "$lines" -ne 1 ] || ! tail -n1 "$work/err" | grep -q "^gpc data[a-z ]*: error: "; then
        fail "gpc $*: expected one error line, got: $(cat "$work/err")"
    fi
    if ! tail -n1 "$work/err" | grep -qF -- "$needle"; then
        fail "gpc $*: message lacks '$needle': $(cat "$work/err")"
    fi
}

# value KEY FILE: the value of KEY=... in a dataset.txt
value() {
    sed -n "s/^$1=//p" "$2"
}

# --- a small corpus: 40 fortune-style entries in two files, one binary file
mkdir -p "$work/corpus/more"
for f in one more/two; do
    for i in $(seq 1 20); do
        echo "Entry $i of $f: the quick brown fox jumps over the lazy dog $((i * 7))."
        echo "A second line, so that words repeat and merge."
        [ "$i" -lt 20 ] && echo "%"
    done >"$work/corpus/$f"
done
printf 'BIN\000\001\002' >"$work/corpus/index.dat"

"$GPC" data prepare --input "$work/corpus" --out "$work/ds" --vocab-size 300 --val-fraction 0.1 \
    >"$work/out" 2>"$work/err" || fail "prepare failed: $(cat "$work/err")"
ds="$work/ds/dataset.txt"
[ "$(head -n1 "$ds")" = "gpc-dataset 1" ] || fail "first line of dataset.txt: $(head -n1 "$ds")"
[ "$(value vocab_size "$ds")" = 300 ] || fail "vocab_size=$(value vocab_size "$ds")"
[ "$(value documents "$ds")" = 40 ] || fail "documents=$(value documents "$ds")"
# every 10th document (floor((d+1)/10) > floor(d/10)) is for validation
[ "$(value val_documents "$ds")" = 4 ] || fail "val_documents=$(value val_documents "$ds")"
[ "$(value train_documents "$ds")" = 36 ] || fail "train_documents=$(value train_documents "$ds")"
[ "$(value skipped_files "$ds")" = 1 ] || fail "skipped_files=$(value skipped_files "$ds")"
[ "$(value tokenizer "$ds")" = 1 ] || fail "tokenizer=$(value tokenizer "$ds")"
bytes=$(cat "$work/corpus/one" "$work/corpus/more/two" | grep -vx '%' | wc -c)
[ "$(value text_bytes "$ds")" = "$bytes" ] || fail "text_bytes=$(value text_bytes "$ds"), expected $bytes"
# shard sizes agree with the token counts: 64-byte header + 2 bytes a token
train=$(value train_tokens "$ds")
[ "$(stat -c %s "$work/ds/train_0000.bin")" = $((64 + 2 * train)) ] || fail "train shard size"
[ "$train" -gt 40 ] && [ "$train" -lt "$bytes" ] || fail "train_tokens=$train for $bytes bytes"
grep -q "^prepared $work/ds: 40 documents from 2 files (1 binary skipped)" "$work/out" ||
    fail "summary line: $(cat "$work/out")"
grep -q "tokenizer merges" "$work/err" || fail "no training progress on stderr: $(cat "$work/err")"

# synth
"$GPC" data synth --vocab 70000 --tokens 20000 --out "$work/syn" --seed 3 >"$work/out" 2>&1 ||
    fail "synth failed: $(cat "$work/out")"
syn="$work/syn/dataset.txt"
[ "$(value val_tokens "$syn")" = 1025 ] || fail "synth val_tokens=$(value val_tokens "$syn")"
[ "$(value train_tokens "$syn")" = 18975 ] || fail "synth train_tokens"
[ "$(value tokenizer "$syn")" = 0 ] || fail "synth tokenizer=$(value tokenizer "$syn")"
[ "$(stat -c %s "$work/syn/train_0000.bin")" = $((64 + 4 * 18975)) ] || fail "u32 synth shard size"

# help
"$GPC" data prepare --help >"$work/out" 2>&1 || fail "data prepare --help exit $?"
grep -q -- "--vocab-size" "$work/out" || fail "prepare help lacks --vocab-size"
"$GPC" data synth --help >/dev/null 2>&1 || fail "data synth --help exit $?"
"$GPC" help data >"$work/out" 2>&1 || fail "gpc help data exit $?"
grep -q "prepare" "$work/out" || fail "gpc help data lacks the actions"

# usage errors: exit 2
expect 2 "prepare (text to token shards) or synth" data
expect 2 "unknown action 'bogus': use prepare or synth" data bogus
expect 2 "--input PATH... is required" data prepare --out "$work/x"
expect 2 "--out DIR is required" data prepare --input "$work/corpus"
expect 2 "--input needs at least one value" data prepare --input --out "$work/x"
expect 2 "--vocab-size 256 is out of range" data prepare --input "$work/corpus" --out "$work/x" --vocab-size 256
expect 2 "--vocab-size 65537 is out of range" data prepare --input "$work/corpus" --out "$work/x" --vocab-size 65537
expect 2 "--vocab-size needs a whole number" data prepare --input "$work/corpus" --out "$work/x" --vocab-size big
expect 2 "--val-fraction 0.6 is out of range" data prepare --input "$work/corpus" --out "$work/x" --val-fraction 0.6
expect 2 "--val-fraction -0.1 is out of range" data prepare --input "$work/corpus" --out "$work/x" --val-fraction -0.1
expect 2 "unknown option --bogus" data prepare --input "$work/corpus" --out "$work/x" --bogus
expect 2 "--vocab N is required" data synth --tokens 10 --out "$work/x"
expect 2 "--tokens M is required" data synth --vocab 10 --out "$work/x"
expect 2 "--out DIR is required" data synth --vocab 10 --tokens 10
expect 2 "--tokens 0 must be at least 1" data synth --vocab 10 --tokens 0 --out "$work/x"
expect 2 "--vocab 1 is out of range" data synth --vocab 1 --tokens 10 --out "$work/x"
expect 2 "--vocab 2147483649 is out of range" data synth --vocab 2147483649 --tokens 10 --out "$work/x"

# runtime errors: exit 1
expect 1 "input $work/missing: No such file or directory" data prepare --input "$work/missing" --out "$work/x"
expect 1 "no text found in the inputs (1 binary files skipped)" data prepare --input "$work/corpus/index.dat" --out "$work/x"
expect 1 "output folder: " data prepare --input "$work/corpus" --out "$work/corpus/one/sub"
expect 1 "output folder: " data synth --vocab 10 --tokens 10 --out "$work/corpus/one/sub"
# a failed prepare leaves the earlier dataset as it was
[ "$(value documents "$ds")" = 40 ] || fail "dataset.txt changed"

if [ "$failures" -ne 0 ]; then
    echo "$failures failure(s)" >&2
    exit 1
fi
echo "ok"
