#!/usr/bin/env bash
# Builds and runs the tests: ./scripts/test.sh [--sanitize]
# The default build also builds the Python module and runs its tests (pytest, under ctest); the
# sanitizer build is C++ only.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
preset=default
[ "${1:-}" = "--sanitize" ] && preset=sanitize
tests_deps="" deps_pid=""
if [ "$preset" = default ]; then
  scripts/deps.sh --python-build
  if [ "$(id -u)" -eq 0 ]; then
    # As root (no sudo prompt to answer), pytest and torch (~180 packages on a fresh machine)
    # install while the build runs; ctest waits for them.
    tests_deps=$(mktemp)
    scripts/deps.sh --python-tests >"$tests_deps" 2>&1 &
    deps_pid=$!
  else
    scripts/deps.sh --python-tests
  fi
else
  scripts/deps.sh
fi
cmake --preset "$preset" ${ATTNREF_CMAKE_ARGS:-} >/dev/null
cmake --build --preset "$preset" -j "$(nproc)"
if [ -n "$deps_pid" ]; then
  wait "$deps_pid" || { cat "$tests_deps" >&2; echo "attnref: installing pytest / torch failed" >&2; exit 1; }
  cat "$tests_deps"
  rm -f "$tests_deps"
fi
ctest --preset "$preset" -j "$(nproc)"
