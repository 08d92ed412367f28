#!/usr/bin/env bash
# generate.sh: text generation speed, with the kept keys and values (the
# default) against recomputing the window for every token (--no-kv-cache),
# in one run. The model: a dN GPT (default d6: 6 layers, 384 channels) with a
# 1024-token context, trained two steps on the bundled corpus (speed does not
# depend on the weights). 1200 tokens cross the context once, so the
# window's drop and re-run are included. On the CPU (f32) both texts must be
# identical; on a GPU (bf16) they may part where rounding flips a draw.
#
# Environment: GPC (default build/gpc), DEVICE (cpu or cuda, default cpu),
# MODEL (default d6), WORK (default a fresh temporary folder), TOKENS
# (default 1200).
set -euo pipefail
cd "$(dirname "$0")/.."
GPC=${GPC:-build/gpc}
TOKENS=${TOKENS:-1200}
DEVICE=${DEVICE:-cpu}
MODEL=${MODEL:-d6}
WORK=${WORK:-$(mktemp -d)}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

# the bundled corpus where setup installed it, else this repository's own
# text (the GPU machine has no fortunes)
if [[ -d /usr/share/games/fortunes ]]; then corpus=(/usr/share/games/fortunes); else corpus=(docs src README.md); fi
inputs=()
for c in "${corpus[@]}"; do inputs+=(--input "$c"); done
"$GPC" data prepare "${inputs[@]}" --out "$WORK/data" >"$WORK/prepare.log" 2>&1 ||
  { echo "generate.sh: data prepare failed: $(tail -1 "$WORK/prepare.log")" >&2; exit 1; }
"$GPC" train --data "$WORK/data" --out "$WORK/run" --model "$MODEL" --context 1024 --batch 1 \
  --steps 2 --device "$DEVICE" --checkpoint-every 0 --eval-every 0 >"$WORK/train.log" 2>&1 ||
  { echo "generate.sh: train failed: $(tail -1 "$WORK/train.log")" >&2; exit 1; }
# temperature 1.5 over the whole vocabulary: an untrained model then rarely
# draws the end-of-text token, so all TOKENS are generated
args=(sample --run "$WORK/run" --tokens "$TOKENS" --seed 2 --device "$DEVICE" --top-k 0 --temperature 1.5)
"$GPC" "${args[@]}" >"$WORK/kept.txt" 2>"$WORK/kept.err"
"$GPC" "${args[@]}" --no-kv-cache >"$WORK/recomputed.txt" 2>"$WORK/recomputed.err"
echo "kept keys and values:  $(tail -1 "$WORK/kept.err")"
echo "window recomputed:     $(tail -1 "$WORK/recomputed.err")"
if cmp -s "$WORK/kept.txt" "$WORK/recomputed.txt"; then
  echo "texts: identical"
elif [[ $DEVICE == cpu ]]; then
  echo "texts: DIFFERENT" >&2
  exit 1
else
  echo "texts: they part after $(cmp "$WORK/kept.txt" "$WORK/recomputed.txt" | sed -n 's/.*byte \([0-9]*\).*/\1/p') bytes (bf16 rounding)"
fi
# tokens/s over the whole generation (N tokens in T s)
rate() { sed -nE 's/^sample: ([0-9]+) tokens in ([0-9.]+) s.*/\1 \2/p' "$1" | awk '{ printf "%.1f", $1 / $2 }'; }
kept=$(rate "$WORK/kept.err") recomputed=$(rate "$WORK/recomputed.err")
echo "tokens/s: $kept kept, $recomputed recomputed"
awk -v a="$kept" -v b="$recomputed" 'BEGIN { printf "speed-up: %.1fx\n", a / b }'
