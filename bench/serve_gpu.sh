#!/usr/bin/env bash
# serve_gpu.sh: gpc serve's decode throughput on one GPU against Hugging
# Face transformers' generate, in one call.
#
#   bench/serve_gpu.sh [GPC]        (default build-gpu/gpc, else build/gpc)
#
# The model is a random GPT-2 124M (scripts/hf_fixtures.py --big, with GPT-2's
# real tokenizer from tests/fixtures/gpt2; no weights can be downloaded on
# the GPU machine), imported with gpc import hf. gpc serve runs it on cuda
# in bf16; gpc bench serve sends greedy streamed requests of PROMPT random
# token ids and NEW tokens each, ignoring end-of-text, at each concurrency
# of LEVELS, and reads the server's busy fraction from /metrics. Then
# bench/serve_hf_generate.py runs transformers' generate on the same shape
# at batches 1, 32 and 256. Each side prints RESULT lines; the log folder
# (OUT, default ./gpu-out) keeps the JSON.
#
# Environment: PROMPT (128), NEW (256), LEVELS (1,64,256), REQUESTS (per
# level, default 2 x the level), SKIP_PEER=1, PEER_BATCHES (1,32,256), WORK
# (default /tmp/gpc-serve).
set -uo pipefail
export PYTHONUNBUFFERED=1
root=$(cd "$(dirname "$0")/.." && pwd)
gpc=${1:-}
[[ -z $gpc ]] && { [[ -x $root/build-gpu/gpc ]] && gpc=$root/build-gpu/gpc || gpc=$root/build/gpc; }
out=${OUT:-$root/gpu-out} work=${WORK:-/tmp/gpc-serve}
prompt=${PROMPT:-128} new=${NEW:-256} levels=${LEVELS:-1,64,256}
mkdir -p "$out"
rm -rf "$work" && mkdir -p "$work"
log=$out/serve-gpu.log
: >"$log"
say() { echo "$@" | tee -a "$log"; }
say "== gpc serve benchmark, $(date -u +%Y-%m-%dT%H:%MZ), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"

xz -dc "$root/tests/fixtures/gpt2/vocab.json.xz" >"$work/vocab.json"
xz -dc "$root/tests/fixtures/gpt2/merges.txt.xz" >"$work/merges.txt"
python3 "$root/scripts/hf_fixtures.py" --big "$work/gpt2" --size 124m --vocab "$work/vocab.json" \
  --merges "$work/merges.txt" >/dev/null 2>&1 || { say "cannot build the random GPT-2"; exit 1; }
"$gpc" import hf "$work/gpt2" --out "$work/run" >>"$log" 2>&1 || { say "import failed"; exit 1; }

"$gpc" serve --run "$work/run" --device cuda --listen 127.0.0.1:0 >"$out/serve-server.log" 2>&1 &
server=$!
url=
for _ in $(seq 600); do
  url=$(sed -n "s/^serve: listening on //p" "$out/serve-server.log" | head -1)
  [[ -n $url ]] && break
  kill -0 $server 2>/dev/null || break
  sleep 0.1
done
[[ -n $url ]] || { say "gpc serve did not start: $(tail -5 "$out/serve-server.log")"; exit 1; }
say "gpc serve at $url: $(grep -m1 -i "cache\|blocks" "$out/serve-server.log")"
IFS=, read -ra lv <<<"$levels"
for c in "${lv[@]}"; do
  n=${REQUESTS:-$((2 * c))}
  "$gpc" bench serve --url "$url" --concurrency "$c" --requests "$n" --prompt-tokens "$prompt" \
    --max-tokens "$new" --stream --json "$out/serve-bench-$c.json" >>"$log" 2>&1
  python3 - "$out/serve-bench-$c.json" "$c" <<'PY' | tee -a "$log"
import json, sys
d = json.load(open(sys.argv[1]))
r = d["runs"][0]
flat = {k: v for k, v in r.items() if not isinstance(v, (dict, list))}
print("RESULT gpc_serve concurrency=%s %s" % (sys.argv[2], " ".join("%s=%s" % kv for kv in sorted(flat.items()))))
PY
done
curl -s "$url/metrics" >"$out/serve-metrics.txt" 2>/dev/null
kill -TERM $server; wait $server
say "server exit: $?"
if [[ -z ${SKIP_PEER:-} ]]; then
  python3 "$root/bench/serve_hf_generate.py" --batches "${PEER_BATCHES:-1,32,256}" --prompt "$prompt" --new "$new" \
    >"$out/serve-hf.json" 2>"$out/serve-hf.err"
  python3 - "$out/serve-hf.json" <<'PY' | tee -a "$log"
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["results"]:
    print("RESULT transformers_generate batch=%d tokens_per_s=%.0f (transformers %s, torch %s)" %
          (r["batch"], r["tokens_per_s"], d["transformers"], d["torch"]))
PY
fi
