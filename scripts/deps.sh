#!/usr/bin/env bash
# Installs the Debian packages attnref builds with, when missing (quiet when all are present).
#   scripts/deps.sh            the C++ library, tests, benchmarks and demo
#   scripts/deps.sh --python   also the Python module and its tests (pybind11, NumPy, pytest, torch)
#   scripts/deps.sh --python-build / --python-tests   the two halves of --python: what building
#                              the module needs, and what only its tests need (pytest, torch)
set -euo pipefail
pkgs=(g++ cmake libeigen3-dev libgtest-dev libbenchmark-dev)
py_build=(python3 python3-dev pybind11-dev python3-pybind11 python3-numpy)
py_tests=(python3-pytest python3-torch)
case "${1:-}" in
  --python) pkgs+=("${py_build[@]}" "${py_tests[@]}") ;;
  --python-build) pkgs+=("${py_build[@]}") ;;
  --python-tests) pkgs=("${py_tests[@]}") ;;
esac
need=()
for pkg in "${pkgs[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
[ ${#need[@]} -eq 0 ] && exit 0
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "attnref: please install: ${need[*]}" >&2; exit 1; }
  sudo="sudo"
fi
# ATTNREF_APT_UNSAFE_IO=1 (set by .ci/run, on throwaway machines): dpkg skips its fsync calls
# (nothing to lose there; the gain measured small: torch's ~180 packages took ~64 s either way).
dpkg_opts=()
[ "${ATTNREF_APT_UNSAFE_IO:-0}" = 1 ] && dpkg_opts=(-o Dpkg::Options::=--force-unsafe-io)
echo "attnref: installing ${need[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
  "${dpkg_opts[@]}" "${need[@]}" >/dev/null
