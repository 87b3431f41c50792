#!/usr/bin/env bash
# Builds and runs the demo: ./scripts/demo.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/deps.sh
cmake --preset demo >/dev/null
cmake --build --preset demo -j "$(nproc)"
exec build/demo/examples/attnref_demo "$@"
