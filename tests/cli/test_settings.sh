#!/usr/bin/env bash
# test_settings.sh: the table of settings (src/core/settings.c) against what
# uses it and what documents it.
#   - `gpc help env` prints every row under its group, and refuses a bad flag;
#   - every GPC_* name the code reads or sets as a variable (a "GPC_..."
#     string in C or CUDA, a $GPC_... in a script, a GPC_...= in the tests'
#     CMake environment) has a row, and every row is used somewhere;
#   - docs/environment.md holds `gpc help env --markdown` verbatim between
#     its markers, and names no variable the table lacks.
# With --update it rewrites docs/environment.md's generated part instead:
#   GPC=build/gpc GPC_SOURCE_DIR=. bash tests/cli/test_settings.sh --update
set -u
GPC=${GPC:?set GPC to the gpc binary}
root=${GPC_SOURCE_DIR:-.}
doc="$root/docs/environment.md"
begin='^<!-- begin: gpc help env --markdown'
end='^<!-- end: gpc help env --markdown'
work=$(mktemp -d "${TMPDIR:-/tmp}/gpc-settings-XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

if [[ ${1:-} == --update ]]; then
  "$GPC" help env --markdown >"$work/generated" || exit 1
  if ! grep -q "$begin" "$doc" || ! grep -q "$end" "$doc"; then
    echo "docs/environment.md lacks the begin and end markers of the generated part" >&2
    exit 1
  fi
  awk -v gen="$work/generated" -v b="$begin" -v e="$end" '
    $0 ~ b { while ((getline line < gen) > 0) print line; skip = 1; next }
    $0 ~ e { skip = 0; next }
    !skip' "$doc" >"$work/doc" && cp "$work/doc" "$doc"
  echo "updated $doc"
  exit 0
fi

# ---- gpc help env: the groups, a row of each kind, one line per row
out="$work/out"
"$GPC" help env >"$out" 2>"$work/err" || fail "gpc help env: exit $?: $(cat "$work/err")"
for group in Everyday Numerics "Distributed runs" "gpcd and its jobs" "Benchmarks and diagnosis" Tests; do
  grep -qx "$group:" "$out" || fail "gpc help env has no group '$group'"
done
grep -Eq '^  GPC_LOG +info +log level; debug, info, warn or error$' "$out" ||
  fail "gpc help env: GPC_LOG's line: $(grep GPC_LOG "$out")"
grep -Eq '^  GPC_ATTENTION_BWD +auto +which GPU attention backward runs \(gpc train --attention-backward\); auto, two, fused or wgmma$' "$out" ||
  fail "gpc help env: GPC_ATTENTION_BWD's line: $(grep GPC_ATTENTION_BWD "$out")"
grep -Eq '^  GPC_MATMUL_WORKSPACE_MB +32 +cuBLASLt.s workspace in MiB; 1 to 4096$' "$out" ||
  fail "gpc help env: GPC_MATMUL_WORKSPACE_MB's line: $(grep GPC_MATMUL_WORKSPACE_MB "$out")"
grep -Eq '^  GPC_TOKEN +- +bearer token' "$out" || fail "gpc help env: GPC_TOKEN has a default?"
awk '/^Set here/ {exit} /^  GPC_/ {print $1}' "$out" | sort >"$work/table"
sort -u "$work/table" | cmp -s - "$work/table" || fail "gpc help env prints a name twice"
[[ $(wc -l <"$work/table") -ge 40 ]] || fail "gpc help env lists only $(wc -l <"$work/table") settings"
# the variables set here: values of settings, and names that are none
env GPC_ATENTION=gpc GPC_LOG=warn "$GPC" help env >"$work/here" 2>&1 || fail "gpc help env with variables set"
sed -n '/^Set here:$/,/^$/p' "$work/here" | grep -qx '  GPC_LOG=warn' ||
  fail "gpc help env does not show GPC_LOG=warn as set: $(tail -8 "$work/here")"
sed -n '/^Set here but not settings of gpc/,$p' "$work/here" | grep -qx '  GPC_ATENTION' ||
  fail "gpc help env does not name GPC_ATENTION as no setting: $(tail -8 "$work/here")"
expect_exit 2 "gpc help env: error: unknown option --bogus (see 'gpc help env')" "$GPC" help env --bogus
"$GPC" help env --help >"$work/help" || fail "gpc help env --help: exit $?"
grep -q "usage: gpc help env \[--markdown\]" "$work/help" || fail "gpc help env --help: $(head -2 "$work/help")"
grep -q "gpc help env" < <("$GPC" help) || fail "gpc help does not point at gpc help env"

# ---- the names the code uses as variables against the table. The table
# itself (settings.c) names them all, and test_settings.c reads names
# missing from it on purpose, so neither counts.
(
  cd "$root" || exit 1
  grep -rhoE --include='*.c' --include='*.h' --include='*.cu' --include='*.cuh' \
    --exclude=settings.c --exclude=test_settings.c '"GPC_[A-Z0-9_]+"' src include bench tests fuzz |
    tr -d '"'
  # in scripts, a variable read ($GPC_X, ${GPC_X) or set (GPC_X=, outside
  # comments); this script sets a misspelt one on purpose
  # shellcheck disable=SC2016 # a $ to match, not to expand
  grep -rhoE --include='*.sh' --exclude=test_settings.sh '\$\{?GPC_[A-Z0-9_]+' bench scripts tests |
    tr -d '${'
  grep -rhE --include='*.sh' --exclude=test_settings.sh '(^|[^A-Za-z0-9_])GPC_[A-Z0-9_]+=' \
    bench scripts tests | grep -vE '^[[:space:]]*#' | grep -oE '(^|[^A-Za-z0-9_])GPC_[A-Z0-9_]+=' |
    grep -oE 'GPC_[A-Z0-9_]+'
  grep -hoE '[ ";(]GPC_[A-Z0-9_]+=' tests/CMakeLists.txt | tr -d ' ";(='
) | sort -u >"$work/used"
[[ $(wc -l <"$work/used") -ge 30 ]] || fail "the scan found only $(wc -l <"$work/used") names: is GPC_SOURCE_DIR right?"
missing=$(comm -23 "$work/used" "$work/table")
[[ -z $missing ]] || fail "read or set as variables but not in src/core/settings.c's table: ${missing//$'\n'/ }"
unused=$(comm -13 "$work/used" "$work/table")
[[ -z $unused ]] || fail "in src/core/settings.c's table but used nowhere: ${unused//$'\n'/ }"

# ---- docs/environment.md: the generated tables verbatim, no stray names
"$GPC" help env --markdown >"$work/generated" || fail "gpc help env --markdown failed"
sed -n "/$begin/,/$end/p" "$doc" >"$work/documented"
if ! diff -u "$work/documented" "$work/generated" >"$work/diff"; then
  fail "docs/environment.md's tables differ from gpc help env --markdown (update them with:" \
    "GPC=build/gpc GPC_SOURCE_DIR=. bash tests/cli/test_settings.sh --update):" \
    "$(head -40 "$work/diff")"
fi
grep -oE 'GPC_[A-Z0-9_]+' "$doc" | sort -u >"$work/named"
stray=$(comm -23 "$work/named" "$work/table")
[[ -z $stray ]] || fail "docs/environment.md names variables the table lacks: ${stray//$'\n'/ }"

[[ $failures -eq 0 ]] || exit 1
echo "settings: ok"
