#!/usr/bin/env bash
# test_openmp_wait.sh: gpc's OpenMP threads wait passively (GOMP_SPINCOUNT 0
# as libgomp reports it with OMP_DISPLAY_ENV=verbose) unless the user chose
# a policy or a spin count, which are kept; gpc doctor reports the policy.
set -u
GPC=${GPC:?set GPC to the gpc binary}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpc-openmp-wait-XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# spin counts libgomp printed, one per time it was loaded
spins() {
  env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT OMP_DISPLAY_ENV=verbose "$@" "$GPC" md --cells 4 \
    --steps 1 2>&1 >/dev/null | sed -n "s/^ *GOMP_SPINCOUNT = '\([0-9]*\)'.*/\1/p" | tr '\n' ' '
}
got=$(spins)
[[ $got == *" 0 " || $got == "0 " ]] || fail "default: libgomp's spin count ends at '$got', expected 0 (passive)"
got=$(spins OMP_WAIT_POLICY=active)
[[ $got == "30000000000 " ]] || fail "OMP_WAIT_POLICY=active: spin counts '$got', expected one, 30000000000"
got=$(spins GOMP_SPINCOUNT=1000)
[[ $got == "1000 " ]] || fail "GOMP_SPINCOUNT=1000: spin counts '$got', expected one, 1000"

env -u OMP_WAIT_POLICY "$GPC" doctor >"$work/doctor" 2>&1
grep -Eq "OpenMP: [0-9]+ threads \(OMP_NUM_THREADS=[^)]*\) on [0-9]+ cores, waiting passive" "$work/doctor" ||
  fail "doctor's OpenMP line: $(grep OpenMP "$work/doctor")"
OMP_WAIT_POLICY=active "$GPC" doctor >"$work/doctor" 2>&1
grep -Eq "OpenMP: .* cores, waiting active" "$work/doctor" ||
  fail "doctor's OpenMP line with active: $(grep OpenMP "$work/doctor")"

if [[ $failures -ne 0 ]]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "ok"
