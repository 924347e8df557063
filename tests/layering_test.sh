#!/usr/bin/env bash
# The include arrows of docs/ARCHITECTURE.md ("Layers and the include arrows"), checked by
# scripts/check-layering: (a) kiln's library passes the check; (b)-(d) on copies of the library
# and the document with one planted file each, the check fails and names it: a pass that
# includes a backend header, an op that includes an ir header, an include of a folder the
# layers table does not place.
#   tests/layering_test.sh [ROOT]   # ROOT: the repository (default: this script's ../)
# Prints PASS/FAIL per case; exits 1 if any case fails. ctest runs it as "layering".
set -uo pipefail
root=$(cd "${1:-$(dirname "$0")/..}" && pwd)
check=("python3" "$root/scripts/check-layering")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1"; failures=$((failures + 1)); }

# A fresh copy of the library folders and the document under $work/$1; prints its path.
copy() {
  local dir="$work/$1"
  mkdir -p "$dir/docs"
  for part in runtime profiler ops ir passes codegen io kiln.h; do
    [ -e "$root/$part" ] && cp -r "$root/$part" "$dir/"
  done
  cp "$root/docs/ARCHITECTURE.md" "$dir/docs/"
  echo "$dir"
}

# expect_failure NAME DIR TEXT: the check on DIR exits 1 and prints a line containing TEXT.
expect_failure() {
  local out rc
  out=$("${check[@]}" "$2" 2>&1)
  rc=$?
  if [ "$rc" -eq 1 ] && grep -qF -- "$3" <<<"$out"; then
    pass "$1"
  else
    fail "$1 (exit $rc, expected 1 and a line with: $3)"
    echo "$out" | sed 's/^/    /'
  fi
}

# (a) The real tree: every arrow allowed.
if out=$("${check[@]}" "$root" 2>&1); then
  pass "the library's includes ($(tail -n 1 <<<"$out"))"
else
  fail "the library's includes"
  echo "$out" | sed 's/^/    /'
fi

# (b) A pass that includes a backend header (a CUDA launcher in ops/cuda/).
dir=$(copy passes_backend)
printf '#pragma once\n' >"$dir/ops/cuda/planted_launcher.h"
printf '// planted\n#include "ops/cuda/planted_launcher.h"\n' >"$dir/passes/planted_violation.cc"
expect_failure "passes -> backend is refused" "$dir" \
  'passes/planted_violation.cc:2: passes -> backend: #include "ops/cuda/planted_launcher.h"'

# (c) An op that includes the IR (ops sit below ir).
dir=$(copy ops_ir)
printf '#pragma once\n' >"$dir/ir/planted_node.h"
printf '#include "ir/planted_node.h"\n' >"$dir/ops/planted_upward.cc"
expect_failure "ops -> ir is refused" "$dir" \
  'ops/planted_upward.cc:1: ops -> ir: #include "ir/planted_node.h"'

# (d) An include of a folder the layers table does not place (a new folder must be placed).
dir=$(copy unplaced)
mkdir -p "$dir/newlayer"
printf '#include "runtime/status.h"\n' >"$dir/newlayer/x.h"
printf '#include "newlayer/x.h"\n' >"$dir/ops/planted_unplaced.cc"
expect_failure "a file no pattern places is refused" "$dir" \
  'ops/planted_unplaced.cc:1: #include "newlayer/x.h": newlayer/x.h matches no pattern'

if [ "$failures" -ne 0 ]; then
  echo "layering_test: $failures case(s) failed"
  exit 1
fi
echo "layering_test: all cases passed"
