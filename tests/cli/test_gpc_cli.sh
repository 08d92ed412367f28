#!/usr/bin/env bash
# test_gpc_cli.sh: the gpc command itself: the overview (no arguments: exit
# 2; --help: exit 0) lists the commands this build has, --version prints the
# version, an unknown command or help topic is a usage error, and a command
# this version does not have yet says so (exit 1).
set -u
GPC=${GPC:?set GPC to the gpc binary}
work=$(mktemp -d "${TMPDIR:-/tmp}/gpc-cli-XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
run() { # run EXPECTED_STATUS ARGS...: output in $work/out, $work/err
  local want=$1
  shift
  "$GPC" "$@" >"$work/out" 2>"$work/err"
  local rc=$?
  [[ $rc -eq $want ]] || fail "gpc $*: exit $rc, not $want: $(head -3 "$work/err")"
}

run 2
grep -q "^  md  *Lennard-Jones molecular dynamics" "$work/err" || fail "the overview does not list md"
grep -q "^  train " "$work/err" || fail "the overview does not list train"
grep -q "^  stencil  *3D finite-difference" "$work/err" || fail "the overview does not list stencil"
grep -q "^  serve  *serve a run over HTTP" "$work/err" || fail "the overview does not list serve"
run 0 --help
grep -q "^  help " "$work/out" || fail "gpc --help does not list help"
run 0 --version
grep -Eq "^gpc [0-9]+\.[0-9]+\.[0-9]+$" "$work/out" || fail "gpc --version: $(cat "$work/out")"
run 2 nosuch
grep -q "gpc: error: unknown command 'nosuch' (see 'gpc help')" "$work/err" || fail "unknown command: $(cat "$work/err")"
run 2 help nosuch
grep -q "unknown command 'nosuch'" "$work/err" || fail "help of an unknown command: $(cat "$work/err")"
run 0 help md
grep -q "usage: gpc md" "$work/out" || fail "gpc help md: $(head -2 "$work/out")"
run 2 serve
grep -q "gpc serve: error: --run RUN is required" "$work/err" || fail "gpc serve: $(cat "$work/err")"

[[ $failures -eq 0 ]] || exit 1
echo "gpc: ok"
