#!/usr/bin/env bash
# gpt2_ddp.sh: data-parallel GPT-2 124M (d12) training on 2 GPUs: gpc against
# itself on one GPU and against PyTorch DDP, in one call.
#
#   bench/gpt2_ddp.sh [BUILD_DIR]     (default build-gpu; built if missing)
#
# Environment: STEPS (timed steps, default 8), NPROC (GPUs, default 2), ACCUM
# (micro-steps per GPU in a step, default 1; ACCUM=4 on 2 GPUs is the
# 524,288-token step of the single-GPU benchmark), RUNS (names of the runs
# below to do, default all), OUT
# (logs, default ./gpu-out), SKIP_TORCH=1 to leave PyTorch out. If .deps/cuda
# holds the Debian packages the GPU machine lacks, they are unpacked as in
# scripts/gpu-check.sh.
#
# Runs (micro-batch 64 x 1024 per GPU, bf16, synthetic tokens), each a RESULT:
#   1gpu       gpc train, 1 GPU, the same total batch (2 x ACCUM micro-steps)
#              (with NPROC=1, the default on a one-GPU machine, everything runs
#              at 64 x 1024 on one GPU: the NCCL path with a world of one)
#   z0         gpc launch --nproc 2 -- gpc train --zero 0 (total batch the same
#              2 x 64 x 1024: one micro-step per GPU), default buckets
#   z1         the same with --zero 1 (each GPU holds its shard of the
#              optimizer state)
#   z0_nocomm  z0 with GPC_DDP_NO_COMM=1: the step without gradient traffic;
#              z0 minus this is the communication that backward does not hide
#   z0_b0      z0 with --bucket-mb 0: one all-reduce after backward (no overlap)
#   z0_b100    z0 with 100 MiB buckets
#   torch_ddp  bench/reference/gpt2_torch_ddp.py under gpc launch (compile, DDP)
# and CHECK lines: the losses of 1gpu, z0 and z1 step by step (same global
# batch, so they must agree to bf16 rounding).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-gpu}
out=${OUT:-$root/gpu-out}
steps=${STEPS:-8}
np=${NPROC:-$(nvidia-smi -L 2>/dev/null | grep -c ^GPU)}
[[ $np -ge 1 ]] || np=1
mkdir -p "$out"
log=$out/ddp.log
: >"$log"
say() { echo "$@" | tee -a "$log"; }

source "$root/scripts/gpu-deps.sh" "$root"
if [[ ! -x $build/gpc ]]; then
  t0=$(date +%s)
  { cmake -S "$root" -B "$build" -DGPC_ENABLE_SCHED=OFF -DGPC_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release &&
    cmake --build "$build" -j"$(nproc)" --target gpc_cli; } >"$out/ddp-build.log" 2>&1 ||
    { tail -30 "$out/ddp-build.log"; exit 1; }
  say "build: $(( $(date +%s) - t0 )) s"
fi
gpc=$build/gpc
say "== gpc data-parallel benchmark, $(date -u +%Y-%m-%dT%H:%MZ), $np x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
nvidia-smi topo -m >>"$log" 2>&1

data=/tmp/gpc-ddp-data
rm -rf "$data"
"$gpc" data synth --vocab 50257 --tokens 6000000 --out "$data" >>"$log" 2>&1 || { say "data synth failed"; exit 1; }
B=64 T=1024
accum=${ACCUM:-1}
total=$((B * T * np * accum))
common=(--data "$data" --model d12 --context $T --batch $B --total-batch $total --steps $((steps + 2))
        --device cuda --precision bf16 --eval-every 0 --checkpoint-every 0 --seed 7)

# run NAME PREFIX... : runs one training and prints its RESULT line
run() {
  local name=$1
  shift
  [[ -n ${RUNS:-} && " $RUNS " != *" $name "* ]] && return
  local dir=/tmp/gpc-ddp-$name
  rm -rf "$dir"
  timeout 240 "$@" "${common[@]}" --out "$dir" >"$out/$name.log" 2>&1
  local rc=$?
  [[ $rc -ne 0 ]] && { say "$name: exit $rc: $(tail -3 "$out/$name.log" | tr '\n' ' ')"; return; }
  python3 - "$name" "$dir/metrics.jsonl" <<'PY' | tee -a "$log"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
timed = rows[2:]
ms = sorted(r["ms"] for r in timed)
tps = sorted(r["tokens_per_s"] for r in timed)
print(f"RESULT {sys.argv[1]} tokens_per_s={tps[len(tps) // 2]:.0f} step_ms={ms[len(ms) // 2]:.2f} "
      "losses=" + ",".join("%.5f" % r["loss"] for r in rows))
PY
}

launch=("$gpc" launch --nproc "$np" --timeout 60 --)
run 1gpu "$gpc" train
# --collectives nccl: also with one GPU (a smoke test of the NCCL path, world 1)
ddp=("${launch[@]}" "$gpc" train --collectives nccl)
run z0 "${ddp[@]}" --zero 0
run z1 "${ddp[@]}" --zero 1
export GPC_DDP_NO_COMM=1
run z0_nocomm "${ddp[@]}" --zero 0
unset GPC_DDP_NO_COMM
run z0_b0 "${ddp[@]}" --zero 0 --bucket-mb 0
run z0_b100 "${ddp[@]}" --zero 0 --bucket-mb 100

if [[ ${SKIP_TORCH:-0} != 1 && ( -z ${RUNS:-} || " $RUNS " == *" torch_ddp "* ) ]]; then
  timeout 300 "${launch[@]}" python3 "$root/bench/reference/gpt2_torch_ddp.py" --steps "$steps" \
    --total-batch "$total" \
    >"$out/torch_ddp.log" 2>&1
  grep -E "RESULT|Error" "$out/torch_ddp.log" | tail -3 | tee -a "$log"
fi

python3 - "$log" "$np" <<'PY' | tee -a "$log"
import re, sys
r = {}
for line in open(sys.argv[1]):
    m = re.match(r"RESULT (\S+) .*tokens_per_s=(\d+)(?: step_ms=([\d.]+))?(?: losses=(\S+))?", line)
    if m:
        r[m.group(1)] = (float(m.group(2)), float(m.group(3) or 0), m.group(4))
np = int(sys.argv[2])
print("== summary")
if "1gpu" in r:
    one = r["1gpu"][0]
    for k in ("z0", "z1", "z0_b0", "z0_b100"):
        if k in r:
            print(f"{k}: {r[k][0]:.0f} tokens/s = {r[k][0] / one:.3f}x one GPU "
                  f"(scaling efficiency {100 * r[k][0] / one / np:.1f}%)")
if "z0" in r and "z0_nocomm" in r:
    print(f"exposed communication per step (z0 - z0_nocomm): {r['z0'][1] - r['z0_nocomm'][1]:.2f} ms"
          f" of {r['z0'][1]:.2f} ms")
if "z0_b0" in r and "z0_nocomm" in r:
    print(f"without overlap (bucket-mb 0): {r['z0_b0'][1] - r['z0_nocomm'][1]:.2f} ms exposed")
if "torch_ddp" in r:
    for k in ("z0", "z1"):
        if k in r:
            print(f"{k} / PyTorch DDP: {r[k][0] / r['torch_ddp'][0]:.3f}x")
ref = r.get("1gpu", (0, 0, None))[2]
for k in ("z0", "z1"):
    if ref and k in r and r[k][2]:
        a = [float(x) for x in ref.split(",")]
        b = [float(x) for x in r[k][2].split(",")]
        worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
        print(f"CHECK {k} losses vs 1gpu: max relative difference {worst:.2e} over {len(a)} steps")
PY
