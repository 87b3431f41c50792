#!/usr/bin/env bash
# Builds and runs the tests: ./scripts/test.sh [--sanitize]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
preset=default
[ "${1:-}" = "--sanitize" ] && preset=sanitize
scripts/deps.sh
cmake --preset "$preset" ${ATTNREF_CMAKE_ARGS:-} >/dev/null
cmake --build --preset "$preset" -j "$(nproc)"
ctest --preset "$preset" -j "$(nproc)"
