#!/usr/bin/env bash
# Builds the demo preset and runs every standalone example (examples/*.cpp but demo.cpp), each
# of which checks itself: ./scripts/examples.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cmake --preset demo >/dev/null
cmake --build --preset demo -j "$(nproc)"
failed=()
ran=0
for exe in build/demo/examples/attnref_example_*; do
  [[ -x "$exe" ]] || continue
  echo "== ${exe##*/}"
  ran=$((ran + 1))
  if ! "$exe"; then
    failed+=("${exe##*/}")
  fi
done
if ((ran == 0)); then
  echo "no example binaries found in build/demo/examples" >&2
  exit 1
fi
if ((${#failed[@]})); then
  echo "FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "all ${ran} examples passed"
