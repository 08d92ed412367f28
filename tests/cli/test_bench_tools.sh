#!/usr/bin/env bash
# test_bench_tools.sh: the GPU benchmark programs in bench/ refuse bad
# options before they touch a GPU, so this runs wherever they were built
# (CUDA found at build time), GPU or not. bench_gemm_search: --list names
# every shape of the GPT-2 step once; each bad number, an unknown shape and
# an unknown option exit 2 with a line saying which; so do bench_ce_bench's
# bad numbers, precisions and options, and step_clocks.sh's bad model,
# numbers and build folder. Skipped (77) where the programs were
# not built.
set -u
bench=${GPC_BINARY_DIR:?set GPC_BINARY_DIR to the build folder}/bench
search=$bench/bench_gemm_search
[[ -x $search ]] || { echo "bench_gemm_search not built (no CUDA at build time): skipped"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/gpc-bench-tools-XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
source "$(dirname "$0")/lib.sh"

"$search" --list >"$work/list" 2>&1 || fail "--list: exit $?: $(cat "$work/list")"
names=$(awk '{print $1}' "$work/list")
[[ $(echo "$names" | wc -l) -eq 20 ]] || fail "--list: $(echo "$names" | wc -l) shapes, not 20"
[[ $(echo "$names" | sort -u | wc -l) -eq 20 ]] || fail "--list: a shape is named twice"
for s in fc_fwd fcproj_dinp_dgelu qkv_dweight fc_dweight_bgradb qkv_dweight_bgradb classifier_fwd; do
  grep -qx "$s" <<<"$names" || fail "--list does not name $s"
done

# usage errors: exit 2 and a message naming the problem
expect_usage() { expect_exit 2 "$1" "$search" "${@:2}"; }
expect_usage "--energy-s needs a number from 0 to 600, not 'abc'" --energy-s abc
expect_usage "--energy-s needs a number from 0 to 600, not '601'" --energy-s 601
expect_usage "--budget-s needs a number from 0.1 to 3600, not '0'" --budget-s 0
expect_usage "--energy-configs needs a number from 0 to 100, not '-1'" --energy-configs -1
expect_usage "--tokens needs a whole number, not '2.5'" --tokens 2.5
expect_usage "--tokens needs a number from 1 to 16777216, not '0'" --tokens 0
expect_usage "no shape 'fc_dweight_bgrad'; --list names them" --shape qkv_fwd,fc_dweight_bgrad
expect_usage "--runs needs a whole number, not '3.5'" --runs 3.5
expect_usage "--skip-algo needs a whole number, not '1e-3'" --skip-algo 1e-3
expect_usage "unknown option or missing value: --bogus" --bogus
expect_usage "unknown option or missing value: --shape" --shape

# bench/step_clocks.sh: its shape and numbers, and the build it needs, are
# checked before it looks for nvidia-smi
clocks=$GPC_SOURCE_DIR/bench/step_clocks.sh
expect_exit 2 "step_clocks: unknown model 'd13': use d12, d24, d36 or d48" \
  "$clocks" "$GPC_BINARY_DIR" d13
expect_exit 2 "step_clocks: BATCH needs a whole number from 1 to 999999, not '1x'" \
  env BATCH=1x "$clocks" "$GPC_BINARY_DIR" d12
expect_exit 2 "step_clocks: STEPS needs a whole number from 1 to 999999, not '0'" \
  env STEPS=0 "$clocks" "$GPC_BINARY_DIR" d12
expect_exit 2 "step_clocks: $work/none/bench/bench_gpt2_step not found" "$clocks" "$work/none" d36

# bench_ce_bench: its options are checked before it looks for a GPU
ce=$bench/bench_ce_bench
expect_exit 2 "bench_ce_bench: --rows needs a whole number, not '12x'" "$ce" --rows 12x
expect_exit 2 "bench_ce_bench: --rows needs a number from 1 to 16777216, not '0'" "$ce" --rows 0
expect_exit 2 "bench_ce_bench: --reps needs a whole number, not '2.5'" "$ce" --reps 2.5
expect_exit 2 "bench_ce_bench: --padded 100 is below --vocab 101" "$ce" --vocab 101 --padded 100
expect_exit 2 "bench_ce_bench: --precision needs f32, bf16 or f16, not 'i32'" "$ce" --precision i32
expect_exit 2 "bench_ce_bench: unknown option or missing value: --bogus" "$ce" --bogus 1
expect_exit 2 "bench_ce_bench: unknown option or missing value: --rows" "$ce" --rows

# bench_reduce_bench: the same, for its options
rb=$bench/bench_reduce_bench
expect_exit 2 "bench_reduce_bench: --rows needs a whole number, not '1k'" "$rb" --rows 1k
expect_exit 2 "bench_reduce_bench: --channels needs a number from 8 to 4096, not '4'" "$rb" --channels 4
expect_exit 2 "bench_reduce_bench: --channels needs a multiple of 8, not 100" "$rb" --channels 100
expect_exit 2 "bench_reduce_bench: --reps needs a number from 1 to 10000, not '0'" "$rb" --reps 0
expect_exit 2 "bench_reduce_bench: unknown option or missing value: --vocab" "$rb" --vocab 5
expect_exit 2 "bench_reduce_bench: unknown option or missing value: --reps" "$rb" --reps

# bench_gelu_bench: the same
gb=$bench/bench_gelu_bench
expect_exit 2 "bench_gelu_bench: --rows needs a whole number, not 'x'" "$gb" --rows x
expect_exit 2 "bench_gelu_bench: --channels needs a number from 8 to 8192, not '9000'" "$gb" --channels 9000
expect_exit 2 "bench_gelu_bench: unknown option or missing value: --steps" "$gb" --steps 3
expect_exit 2 "bench_gelu_bench: GPC_BENCH_ENERGY_S=abc is not a number of seconds in 0..600" \
  env GPC_BENCH_ENERGY_S=abc "$gb"
expect_exit 2 "bench_gelu_bench: GPC_BENCH_ENERGY_S=700 is not a number of seconds in 0..600" \
  env GPC_BENCH_ENERGY_S=700 "$gb"

# bench_attention_bench: the same
ab=$bench/bench_attention_bench
expect_exit 2 "bench_attention_bench: --batch needs a whole number, not '6o'" "$ab" --batch 6o
expect_exit 2 "bench_attention_bench: --head-size needs a number from 1 to 512, not '0'" "$ab" --head-size 0
expect_exit 2 "bench_attention_bench: --precision needs f32, bf16 or f16, not 'i32'" "$ab" --precision i32
expect_exit 2 "bench_attention_bench: --path (or GPC_ATTENTION) needs both, auto, gpc, cudnn or simple, not 'fast'" "$ab" --path fast
GPC_ATTENTION=quick expect_exit 2 "needs both, auto, gpc, cudnn or simple, not 'quick'" "$ab"
expect_exit 2 "bench_attention_bench: unknown option or missing value: --steps" "$ab" --steps 3
expect_exit 2 "bench_attention_bench: GPC_BENCH_ENERGY_S=abc is not a number of seconds in 0..600" \
  env GPC_BENCH_ENERGY_S=abc "$ab"
expect_exit 2 "bench_head_bench: GPC_BENCH_ENERGY_S=-1 is not a number of seconds in 0..600" \
  env GPC_BENCH_ENERGY_S=-1 "$bench/bench_head_bench"
expect_exit 2 "bench_attention_bench: unknown option or missing value: --reps" "$ab" --reps

[[ $failures -eq 0 ]] || exit 1
echo "bench tools: ok"
