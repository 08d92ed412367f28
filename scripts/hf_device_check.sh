#!/usr/bin/env bash
# hf_device_check.sh: the Hugging Face checks that need transformers, run on
# the GPU machine (which has torch, transformers and tokenizers):
#   1. folders written by `gpc export hf` load with GPT2LMHeadModel and
#      GPT2TokenizerFast and give transformers' logits and ids
#      (scripts/hf_fixtures.py --check-export);
#   2. `gpc import hf` of a random GPT-2 1.5B (n_embd 1600, 48 layers)
#      saved by save_pretrained: wall time and peak memory.
# gpc is built there for the CPU only, from a source tree in DEPS/src,
# while transformers writes the 1.5B model.
#
#   scripts/hf_device_check.sh DEPS OUT
# DEPS holds hf_fixtures.py, corpus.bin.xz, fixtures/ (reference.safetensors,
# ids.bin.xz), the exported folders exp_*/ and src/ (a gpc source tree);
# the log goes to OUT/hf_device_check.log.
set -u
deps=$(cd "${1:?DEPS}" && pwd)
out=${2:?OUT}
log=$out/hf_device_check.log
exec >"$log" 2>&1
echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
for d in "$deps"/exp_*; do
  timeout 60 python3 "$deps/hf_fixtures.py" --check-export "$d" --fixtures "$deps/fixtures" \
    --corpus "$deps/corpus.bin.xz" 2>&1 | grep -v Warning | tail -2
done
build=/tmp/gpc-hf-build
(
  # shellcheck source=scripts/gpu-deps.sh
  source "$deps/src/scripts/gpu-deps.sh" "${DEPS_ROOT:-.}"
  cmake -S "$deps/src" -B $build -DCMAKE_BUILD_TYPE=Release -DGPC_ENABLE_CUDA=OFF \
    -DGPC_BUILD_TESTS=OFF -DGPC_ENABLE_SCHED=OFF >/dev/null &&
    cmake --build $build -j12 --target gpc_cli >/dev/null && echo "gpc built"
) >"$out/build.log" 2>&1 &
builder=$!
timeout 80 python3 "$deps/hf_fixtures.py" --big /tmp/gpt2-1.5b 2>&1 | grep -v Warning | tail -1
wait $builder
tail -3 "$out/build.log"
ls -la /tmp/gpt2-1.5b
sync
python3 - "$build/gpc" <<'PY'
import resource, subprocess, sys, time
t = time.time()
r = subprocess.run([sys.argv[1], "import", "hf", "/tmp/gpt2-1.5b", "--out", "/tmp/run-1.5b"],
                   capture_output=True, text=True, timeout=60)
print(r.stdout.strip(), r.stderr.strip()[-300:])
print(f"import: exit {r.returncode}, wall {time.time() - t:.2f} s, peak RSS "
      f"{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1e6:.2f} GB")
PY
ls -la /tmp/run-1.5b
