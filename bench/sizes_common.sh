# sizes_common.sh: what bench/gpt2_sizes.sh and bench/lora_gpu.sh share,
# sourced with root, build, out, log and data set: the build (when
# $build/gpc is missing), synthetic shards in $data, with_peak (the GPU
# memory a command held at most, as nvidia-smi saw it), peak_gib, mfu,
# shape_of and gpc_figures.
if [[ ! -x $build/gpc ]]; then
  cmake -S "$root" -B "$build" -DGPC_ENABLE_SCHED=OFF -DGPC_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release >"$out/sizes-build.log" 2>&1 &&
    cmake --build "$build" -j"$(nproc)" >>"$out/sizes-build.log" 2>&1 || { tail -30 "$out/sizes-build.log"; exit 1; }
fi
if [[ ! -f $data.complete ]]; then
  rm -rf "$data"
  "$build/gpc" data synth --vocab 50257 --tokens 20000000 --out "$data" >>"$log" 2>&1 || { echo "gpc data synth failed"; exit 1; }
  touch "$data.complete"
fi

# Runs "$@" while sampling the GPU memory of every compute process; prints
# the peak in GiB on fd 3.
with_peak() {
  local peak=$out/.peak.$$
  ("$@") &
  local pid=$! max=0 now
  while kill -0 $pid 2>/dev/null; do
    now=$(nvidia-smi --query-compute-apps=used_memory --format=csv,noheader,nounits 2>/dev/null | awk '{s+=$1} END {print s+0}')
    ((now > max)) && max=$now
    sleep 0.2
  done
  wait $pid
  local rc=$?
  echo "$max" >"$peak"
  return $rc
}
peak_gib() { awk '{printf "%.2f", $1 / 1024}' "$out/.peak.$$"; }

# 6N + 6LCT FLOPs a token against 989 TFLOP/s, N without wpe
mfu() { # tokens/s layers channels context
  python3 -c 'import sys
t,L,C,T=map(float,sys.argv[1:])
V=50304
N=V*C+L*(12*C*C+13*C)+2*C
print("%.1f" % (100*t*(6*N+6*L*C*T)/989e12))' "$@"
}

# Sets L, NH and C for a model name (GPT-2's shapes).
shape_of() {
  case $1 in
    d12) L=12 NH=12 C=768 ;; d24) L=24 NH=16 C=1024 ;; d36) L=36 NH=20 C=1280 ;; d48) L=48 NH=25 C=1600 ;;
    *) echo "unknown model $1" >&2; return 1 ;;
  esac
}

# A gpc run's median tokens/s over its steps after the third, and the most
# GiB its arena held (metrics.jsonl), as "TOKENS_PER_S GIB".
gpc_figures() {
  python3 - "$1/metrics.jsonl" <<'PY'
import json, sys
try:
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
except OSError:
    rows = []
t = sorted(r["tokens_per_s"] for r in rows[3:] if r.get("tokens_per_s"))
m = max((r.get("memory", 0) for r in rows), default=0)
print(t[len(t) // 2] if t else 0, "%.2f" % (m / 2**30))
PY
}
