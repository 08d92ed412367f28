#!/usr/bin/env bash
# gpt2_train.sh: GPT-2 124M (d12) training throughput on one GPU, gpc against
# PyTorch, in one call; then attention and GEMMs kernel by kernel.
#
#   bench/gpt2_train.sh [BUILD_DIR]        (default build-gpu; built if missing)
#
# Environment: STEPS (timed steps, default 10), OUT (folder for logs, default
# ./gpu-out), SKIP_TORCH=1 to leave out the PyTorch runs, KERNELS=0 to leave
# out the kernel benchmarks (4, 5), RECOMPUTE_LEVELS (default "1 2"), VARIANTS
# (extra runs of the step under other settings, e.g. "tune:GPC_MATMUL_TUNE=1
# fusedbwd:GPC_ATTENTION_BWD=fused"), ROUNDS (default 1: with more, the
# default step and the variants run in turn that many times).
#
# What runs, each printing a RESULT line:
#   1. gpc train --device cuda on synthetic shards (d12, B=64, T=1024,
#      524288 tokens a step, bf16): the real command, data loader included;
#      tokens/s is the median of its metrics.jsonl steps after the first 3.
#   2. bench_gpt2_step: the same step through the model API (no loader), and
#      once more with GPC_CUDA_PROFILE=1 for the time of each op family; then
#      without the GELU epilogues (GPC_MATMUL_GELU=0) and with --recompute.
#   3. bench/reference/gpt2_torch.py: PyTorch (torch.compile, SDPA flash,
#      bf16 autocast, fused AdamW), same model, batch and accumulation.
#   4. attention forward+backward on the d12 shape: gpc's own kernels, cuDNN's,
#      and the training default (auto: cuDNN's forward, gpc's wgmma backward),
#      against torch SDPA.
#   5. every GEMM of the step: gpc (cuBLASLt) against plain cuBLAS.
# MFU counts 6N + 6LCT FLOPs per token against 989 TFLOP/s (dense bf16).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-gpu}
out=${OUT:-$root/gpu-out}
steps=${STEPS:-10}
mkdir -p "$out"
if [[ ! -x $build/gpc ]]; then
  cmake -S "$root" -B "$build" -DGPC_ENABLE_SCHED=OFF -DGPC_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release >"$out/bench-build.log" 2>&1 &&
    cmake --build "$build" -j"$(nproc)" >>"$out/bench-build.log" 2>&1 || { tail -30 "$out/bench-build.log"; exit 1; }
fi
log=$out/bench.log
: >"$log"
say() { echo "$@" | tee -a "$log"; }
say "== gpc GPT-2 d12 benchmark, $(date -u +%Y-%m-%dT%H:%MZ), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"

# 1. the real command
if "$build/gpc" train --help >/dev/null 2>&1; then
  rm -f "${GPC_BENCH_DATA:-/tmp/gpc-bench-data}.complete" # fresh shards for this build
  "$root/bench/train_run.sh" "$build/gpc" "$out/gpc-train.log" "$steps" 2>&1 | tee -a "$log"
  tail -3 "$out/gpc-train.log" >>"$log"
else
  say "gpc train is not built here: step 1 skipped"
fi

# 2. the step through the model API, then its per-op profile
timeout 300 "$build/bench/bench_gpt2_step" --steps "$steps" 2>&1 | tee -a "$log"
GPC_CUDA_PROFILE=1 timeout 120 "$build/bench/bench_gpt2_step" --steps 2 --warmup 1 2>&1 | tee "$out/profile.log" | sed -n '/per-op/,$p' | tee -a "$log"
# the same step without the GELU epilogues (two kernels instead), and with recomputation
say "-- without the GELU epilogues (GPC_MATMUL_GELU=0):"
GPC_MATMUL_GELU=0 timeout 200 "$build/bench/bench_gpt2_step" --steps "$steps" 2>&1 | grep RESULT | sed 's/RESULT gpc /RESULT gpc_nogelu /' | tee -a "$log"
# variants of the step, each NAME:VAR=VALUE[,VAR=VALUE]: VARIANTS="tune:GPC_MATMUL_TUNE=1".
# With ROUNDS=R > 1 the default step (as "base") and every variant run in
# turn R times, so a drift of the GPU's speed over the call falls on all of
# them alike; the summary gives each one's median and its ratio to base's.
rounds=${ROUNDS:-1}
for ((round = 1; round <= rounds; round++)); do
  if [[ -n ${VARIANTS-} && $rounds -gt 1 ]]; then
    say "-- round $round, base:"
    timeout 200 "$build/bench/bench_gpt2_step" --steps "$steps" 2>&1 | grep RESULT | sed "s/RESULT gpc /RESULT gpc_base /" | tee -a "$log"
  fi
  for v in ${VARIANTS-}; do
    name=${v%%:*} envs=${v#*:}
    say "-- variant $name (${envs//,/ }):"
    env ${envs//,/ } timeout 200 "$build/bench/bench_gpt2_step" --steps "$steps" 2>&1 | grep RESULT | sed "s/RESULT gpc /RESULT gpc_$name /" | tee -a "$log"
  done
done
for r in ${RECOMPUTE_LEVELS-1 2}; do
  say "-- --recompute $r:"
  timeout 200 "$build/bench/bench_gpt2_step" --steps "$steps" --recompute "$r" 2>&1 | grep RESULT | sed "s/RESULT gpc /RESULT gpc_recompute$r /" | tee -a "$log"
done

# 3. PyTorch
if [[ ${SKIP_TORCH:-0} != 1 ]]; then
  timeout 420 python3 "$root/bench/reference/gpt2_torch.py" --steps "$steps" 2>&1 | tee "$out/torch.log" | grep -E "RESULT|Error|error" | tee -a "$log"
fi

# 4. attention, 5. GEMMs (KERNELS=0 leaves them out)
if [[ ${KERNELS:-1} != 0 ]]; then
  timeout 120 "$build/bench/bench_attention_bench" 2>&1 | tee -a "$log"
  timeout 120 "$build/bench/bench_attention_bench" --path auto 2>&1 | sed 's/gpc_attention/gpc_attention_auto/' | tee -a "$log"
  GPC_ATTENTION_BWD=fused timeout 120 "$build/bench/bench_attention_bench" --path gpc 2>&1 | sed 's/gpc_attention/gpc_attention_fused/' | tee -a "$log"
  GPC_ATTENTION=simple timeout 120 "$build/bench/bench_attention_bench" --reps 3 2>&1 | sed 's/gpc_attention/gpc_attention_simple/' | tee -a "$log"
  [[ ${SKIP_TORCH:-0} != 1 ]] && timeout 120 python3 "$root/bench/attention_bench.py" 2>&1 | tail -2 | tee -a "$log"
  timeout 180 "$build/bench/bench_gemm_bench" 2>&1 | tee -a "$log"
  say "-- the same with the bias gradient from cuBLASLt's BGRADB epilogue (GPC_MATMUL_BGRAD=1):"
  GPC_MATMUL_BGRAD=1 timeout 180 "$build/bench/bench_gemm_bench" 2>&1 | grep -E "dweight|dw\+dbias" | tee -a "$log"
fi

# summary
python3 - "$log" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
def get(tag, key):
    m = re.search(r"RESULT %s .*?%s=([0-9.]+)" % (tag, key), text)
    return float(m.group(1)) if m else None
g, gt, t = get("gpc", "tokens_per_s"), get("gpc_train", "tokens_per_s"), get("torch", "tokens_per_s")
print("== summary")
ng, r1, r2 = get("gpc_nogelu", "tokens_per_s"), get("gpc_recompute1", "tokens_per_s"), get("gpc_recompute2", "tokens_per_s")
for name, v in (("gpc (model API)", g), ("gpc train", gt), ("PyTorch", t), ("gpc no GELU epi.", ng),
                ("gpc --recompute 1", r1), ("gpc --recompute 2", r2)):
    if v: print(f"{name:18s} {v:10.0f} tokens/s")
runs = {}
for name, v in re.findall(r"RESULT gpc_(\w+) .*?tokens_per_s=([0-9.]+)", text):
    if name not in ("train", "nogelu", "recompute1", "recompute2", "attention", "attention_simple"):
        runs.setdefault(name, []).append(float(v))
median = lambda xs: sorted(xs)[len(xs) // 2]
ref = median(runs["base"]) if "base" in runs else g
for name, vs in runs.items():
    spread = f", {len(vs)} runs {min(vs):.0f}-{max(vs):.0f}" if len(vs) > 1 else ""
    print(f"gpc {name:14s} {median(vs):10.0f} tokens/s" + (f" ({median(vs) / ref:.3f}x {'base' if 'base' in runs else 'the default'}{spread})" if ref else ""))
if t and (g or gt):
    print(f"ratio gpc/PyTorch: model API {g / t if g else float('nan'):.3f}, gpc train {gt / t if gt else float('nan'):.3f}")
af, ab = get("gpc_attention", "fwd_ms"), get("gpc_attention", "bwd_ms")
sf, sb = get("torch_sdpa", "fwd_ms"), get("torch_sdpa", "bwd_ms")
if af and sf:
    print(f"attention fwd+bwd: gpc {af + ab:.3f} ms, SDPA {sf + sb:.3f} ms, gpc/SDPA time {(af + ab) / (sf + sb):.3f}")
cf, cb = get("cudnn_attention", "fwd_ms"), get("cudnn_attention", "bwd_ms")
if cf and af:
    print(f"attention fwd+bwd: cuDNN {cf + cb:.3f} ms, gpc {af + ab:.3f} ms, gpc/cuDNN time {(af + ab) / (cf + cb):.3f}"
          + (f", cuDNN/SDPA time {(cf + cb) / (sf + sb):.3f}" if sf else ""))
uf, ub = get("gpc_attention_auto", "fwd_ms"), get("gpc_attention_auto", "bwd_ms")
if uf and sf:
    print(f"attention fwd+bwd, the training default (auto: cuDNN's forward, gpc's wgmma backward): {uf + ub:.3f} ms, "
          f"SDPA {sf + sb:.3f} ms, auto/SDPA time {(uf + ub) / (sf + sb):.3f}")
ff, fb = get("gpc_attention_fused", "fwd_ms"), get("gpc_attention_fused", "bwd_ms")
if ff and ab:
    print(f"attention backward: one kernel (fused) {fb:.3f} ms against two kernels {ab:.3f} ms"
          + (f", fused fwd+bwd / SDPA {(ff + fb) / (sf + sb):.3f}" if sf else ""))
PY
