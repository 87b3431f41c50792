#!/usr/bin/env bash
# Installs the Debian packages attnref builds with, when missing (quiet when all are present).
set -euo pipefail
need=()
for pkg in g++ cmake libeigen3-dev libgtest-dev libbenchmark-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
[ ${#need[@]} -eq 0 ] && exit 0
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "attnref: please install: ${need[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "attnref: installing ${need[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
