#!/usr/bin/env bash
# test_plan_cli.sh: `gpc plan` end to end: the printed table and the JSON
# carry the memory model's figures, checked against the same hand
# computation as tests/unit/test_plan.c; bad options are usage errors (exit 2)
# with a message naming the option.
set -euo pipefail
GPC=${GPC:?set GPC to the gpc binary}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# d12, T=1024, B=4, bf16 on CUDA: total 4,340,506,880 bytes (test_plan.c has
# the sum line by line), one more sequence 421,548,032 bytes.
"$GPC" plan --model d12 --batch 4 --json "$work/plan.json" >"$work/out.txt"
grep -q "124475904 parameters" "$work/out.txt" || fail "parameter count missing: $(head -1 "$work/out.txt")"
total=$(awk '$1 == "total" {print $2}' "$work/out.txt")
[[ "$total" == 4340506880 ]] || fail "total row says '$total', expected 4340506880"
python3 - "$work/plan.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
want = {"num_params": 124475904, "parameters": 248951808, "gradients": 248951808,
        "optimizer": 1493710848, "activations": 1223770112, "backward": 37748992,
        "workspace": 458227712, "context_overhead": 629145600, "total": 4340506880,
        "per_sample": 421548032, "batch": 4, "context": 1024, "layers": 12}
for k, v in want.items():
    assert p[k] == v, f"{k}: {p[k]} != {v}"
parts = sum(p[k] for k in ("parameters", "gradients", "optimizer", "activations", "backward",
                           "workspace", "context_overhead"))
assert parts == p["total"], "parts do not add up to the total"
fixed = p["total"] - 4 * p["per_sample"]
for g in p["gpus_fit"]:
    # the largest batch by hand: (capacity - fixed) // per_sample
    expect = max(0, (g["bytes"] - fixed) // p["per_sample"])
    assert g["max_batch"] == expect, f'{g["gpu"]}: {g["max_batch"]} != {expect}'
    assert g["fits"] == (p["total"] <= g["bytes"]), g
names = [g["gpu"] for g in p["gpus_fit"]]
assert names[0].startswith("RTX 3060") and names[-1].startswith("H200"), names
PY

# The GPU table: at B=64 the 12 GB card does not fit, the 141 GB one does and
# takes 351 sequences (test_plan.c: test_max_batch_boundary).
"$GPC" plan --model d12 --batch 64 >"$work/b64.txt"
grep -Eq '^  RTX 3060 12GB .* no +24$' "$work/b64.txt" || fail "RTX 3060 row: $(grep 3060 "$work/b64.txt")"
grep -Eq '^  H200 141GB .* yes +351$' "$work/b64.txt" || fail "H200 row: $(grep H200 "$work/b64.txt")"

# recompute 2 saves 276,824,064 + 138,412,032 bytes of activations at B=4.
"$GPC" plan --model d12 --batch 4 --recompute 2 --json "$work/r2.json" >/dev/null
python3 -c "
import json,sys
a=json.load(open('$work/plan.json')); b=json.load(open('$work/r2.json'))
assert a['activations']-b['activations']==276824064+138412032, (a['activations'], b['activations'])"

# block recomputation also drops 11 layers of qkv, atty, residual2, fch, lse
# and four statistics (test_plan.c: test_recompute_by_hand); on the first 6
# blocks only, 5 layers of all of it. The table lists each mode.
"$GPC" plan --model d12 --batch 4 --recompute block --json "$work/rb.json" >"$work/rb.txt"
"$GPC" plan --model d12 --batch 4 --recompute block --recompute-layers 6 --json "$work/rb6.json" >/dev/null
python3 -c "
import json
a=json.load(open('$work/plan.json')); b=json.load(open('$work/r2.json'))
c=json.load(open('$work/rb.json')); d=json.load(open('$work/rb6.json'))
assert b['activations']-c['activations']==11*56885248, (b['activations'], c['activations'])
assert a['activations']-d['activations']==5*(56885248+37748736), d['activations']
assert (c['recompute'], c['recompute_layers'], d['recompute_layers']) == (3, 12, 6)"
grep -q "recompute block, zero 0" "$work/rb.txt" || fail "plan header: $(sed -n 2p "$work/rb.txt")"
for mode in 0 gelu layernorm block; do
  grep -Eq "^  $mode +[0-9.]+ [KMG]i?B " "$work/rb.txt" || fail "no row for recompute $mode: $(cat "$work/rb.txt")"
done

# ZeRO-1 over 4 GPUs: each holds the optimizer state (m, v, f32 master) of
# ceil(P/4) = 31,118,976 elements (a multiple of 64), 3 x 4 x 31,118,976 =
# 373,427,712 bytes instead of 3 x 4 x P = 1,493,710,848; the saving is
# printed and is the difference of the totals with and without --zero 1.
"$GPC" plan --model d12 --batch 4 --zero 1 --gpus 4 --json "$work/z4.json" >"$work/z4.txt"
grep -q "^  ZeRO-1 over 4 GPUs: .* saving 1120283136 bytes$" "$work/z4.txt" ||
  fail "ZeRO-1 line: $(grep ZeRO "$work/z4.txt")"
grep -q "ZeRO-1" "$work/out.txt" && fail "a run without --zero 1 reports a ZeRO-1 saving"
python3 - "$work/plan.json" "$work/z4.json" <<'PY'
import json, sys
a, z = (json.load(open(f)) for f in sys.argv[1:3])
assert z["optimizer"] == 373427712, z["optimizer"]
assert z["optimizer_unsharded"] == a["optimizer"] == 1493710848, z["optimizer_unsharded"]
assert a["total"] - z["total"] == 1493710848 - 373427712, (a["total"], z["total"])
PY

# --offload-optimizer: the device drops the 1,493,710,848 bytes of master
# weights and moments (total 2,846,796,032) and the host pins 1,991,614,720
# (the state, a copy of the gradients and of the weights, 256 for the norm).
"$GPC" plan --model d12 --batch 4 --offload-optimizer --json "$work/off.json" >"$work/off.txt"
total=$(awk '$1 == "total" {print $2}' "$work/off.txt")
[[ "$total" == 2846796032 ]] || fail "offloaded total row says '$total', expected 2846796032"
grep -q "^  host pinned memory .*(1991614720 bytes)$" "$work/off.txt" ||
  fail "host pinned line: $(grep -i pinned "$work/off.txt")"
grep -qi "pinned" "$work/out.txt" && fail "a plan without --offload-optimizer reports pinned memory"
grep -q "ZeRO-1" "$work/off.txt" && fail "an offloaded plan reports a ZeRO-1 saving"
python3 -c "
import json
p=json.load(open('$work/off.json'))
assert (p['optimizer'], p['optimizer_unsharded'], p['total'], p['host_pinned'], p['offload_optimizer']) == (0, 0, 2846796032, 1991614720, 1), p"

# On a GPU the offloaded run starts in its pinned state (the weights are
# drawn or read into the pinned master: 1,991,614,720 bytes); the plan says
# whether this machine has that free (gpc train refuses a run that does not
# fit); the plan's default device is a GPU. d12 fits any test machine; 48 x
# 16384 (155B parameters, about 3 TB) none.
grep -q "^  host memory to start (the pinned state, where the weights start): 1.9 GiB; this machine has .* free: fits$" "$work/off.txt" ||
  fail "offload start line: $(grep -i 'to start' "$work/off.txt")"
"$GPC" plan --model d12 --layers 48 --heads 128 --channels 16384 --batch 1 --offload-optimizer \
  --device cuda >"$work/offbig.txt"
grep -q "free: does not fit (gpc train refuses it)$" "$work/offbig.txt" ||
  fail "offload start line of a huge model: $(grep -i 'to start' "$work/offbig.txt")"
"$GPC" plan --model d12 --batch 4 --offload-optimizer --device cpu >"$work/offcpu.txt"
grep -q "to start" "$work/offcpu.txt" && fail "a CPU plan reports the GPU offload's start memory"

# Usage errors: exit 2, one line naming what was wrong.
expect_usage() {
  local needle=$1; shift
  set +e
  "$GPC" plan "$@" >/dev/null 2>"$work/err.txt"
  local rc=$?
  set -e
  [[ $rc -eq 2 ]] || fail "gpc plan $* exited $rc, expected 2"
  grep -q "^gpc plan: error: .*$needle" "$work/err.txt" || fail "gpc plan $*: message '$(cat "$work/err.txt")' lacks '$needle'"
}
expect_usage "--model is required"
expect_usage "not of the form dN" --model gpt2
expect_usage "--precision int8" --model d12 --precision int8
expect_usage "--recompute 5" --model d12 --recompute 5
expect_usage "--recompute-layers 13 is more than the model's 12" --model d12 --recompute block --recompute-layers 13
expect_usage "--batch 0 must be at least 1" --model d12 --batch 0
expect_usage "--gpus 0" --model d12 --gpus 0
expect_usage "--tp 5 does not divide the model's 12 attention heads" --model d12 --tp 5 --gpus 5
expect_usage "--pp 5 does not divide the model's 12 layers" --model d12 --pp 5 --gpus 5
expect_usage "--gpus 6 is not a multiple of --tp 2 x --pp 2" --model d12 --tp 2 --pp 2 --gpus 6
expect_usage "--offload-optimizer plans one GPU" --model d12 --offload-optimizer --gpus 2

# GPT-2 1.5B (48 layers, 25 heads, 1600 channels) with full AdamW state on
# 4 GPUs: data parallelism alone needs an A100 40GB, 2 pipeline stages fit
# a 24 GB card, and tp 5 does not divide the GPUs, so it is not listed
"$GPC" plan --model d48 --layers 48 --heads 25 --channels 1600 --batch 1 --recompute 1 \
  --gpus 4 >"$work/layouts.txt"
grep -Eq "^  1 +1 +4 +25\.7 GiB +A100 40GB" "$work/layouts.txt" || fail "layouts: $(cat "$work/layouts.txt")"
grep -Eq "^  1 +2 +2 +14\.8 GiB +RTX 4090 24GB" "$work/layouts.txt" || fail "layouts: $(cat "$work/layouts.txt")"
grep -Eq "^  5 " "$work/layouts.txt" && fail "tp 5 listed on 4 GPUs"
# tp 5 on GPT-2 1.5B: each GPU holds 10064 of wte's 50304 padded rows
# (ceil(50304 / 5) rounded up to 8) with their gradient and AdamW state, so
# a part has 10064 x 1600 + 1024 x 1600 (wpe) + 48 x (12C^2/5 + 7C/5 + 6C)
# + 2C = 313,224,320 parameters, 626,448,640 bytes in bf16
"$GPC" plan --model d48 --batch 1 --gpus 5 --tp 5 >"$work/tp5.txt" 2>&1 || fail "tp 5: $(cat "$work/tp5.txt")"
grep -q "313224320 parameters" "$work/tp5.txt" || fail "tp 5 parameters: $(head -3 "$work/tp5.txt")"
grep -Eq "^  parameters +626448640 " "$work/tp5.txt" || fail "tp 5 bytes: $(head -6 "$work/tp5.txt")"
grep -q "10064 of wte's 50304 padded vocabulary rows" "$work/tp5.txt" ||
  fail "tp 5 vocabulary: $(grep "tp 5:" "$work/tp5.txt")"
echo "plan cli: ok"
