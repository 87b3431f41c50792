#!/usr/bin/env bash
# Builds and runs the tests: ./scripts/test.sh [--sanitize]
# The default build also builds the Python module and runs its tests (pytest, under ctest); the
# sanitizer build is C++ only.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
preset=default
[ "${1:-}" = "--sanitize" ] && preset=sanitize
if [ "$preset" = default ]; then scripts/deps.sh --python; else scripts/deps.sh; fi
cmake --preset "$preset" ${ATTNREF_CMAKE_ARGS:-} >/dev/null
cmake --build --preset "$preset" -j "$(nproc)"
ctest --preset "$preset" -j "$(nproc)"
