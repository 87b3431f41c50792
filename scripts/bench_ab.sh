#!/usr/bin/env bash
# Times the library's headers at two git revisions against each other, in one binary.
#
#   scripts/bench_ab.sh [-r ROUNDS] [-u "bench_a.cpp bench_b.cpp"] REV_A REV_B FILTER
#
# REV_A / REV_B: git revisions whose include/ is compared ("." is the working tree's). The
# benchmark sources are the working tree's for both, so the same benchmark code times both
# versions of the library. -u: the bench/ units to build (default bench_attention.cpp
# bench_cann_attention.cpp). FILTER: a regex over the benchmark names, e.g.
# 'decode(_bnsd)?/f16/B:8/KV:4096/threads:1'.
#
# Each unit is compiled twice (-O3 -march=native -fopenmp, as the bench build: without OpenMP the
# threads:2 benchmarks would run on one thread), once per revision, with the library's
# namespace renamed by the preprocessor (attnref_ab_A, attnref_ab_B) and the benchmark names
# prefixed "A:" / "B:", and linked into one binary. It runs ROUNDS times (default 8), each
# round one process that runs both versions of every matched benchmark once, in a random order
# (--benchmark_enable_random_interleaving), so a slow phase of a shared machine falls on both
# alike. The summary gives each version's fastest and median time and their ratios, and the
# median of the rounds' own ratios B/A, with the middle half of them and how many rounds B won:
# how far the ratios spread, so whether a difference stands out of the host's noise (the same
# headers on both sides, `HEAD .` on a clean tree, show that noise). Runs of two separate
# binaries one after the other moved by 5-15 % on a 2-vCPU cloud machine, more than the changes
# being measured.
#
# Needs g++, Google Benchmark and Eigen (scripts/deps.sh), and the naive reference library of a
# bench build, which it builds if missing (cmake --preset bench).
set -euo pipefail

reps=8
units="bench_attention.cpp bench_cann_attention.cpp"
while getopts "r:u:" opt; do
  case $opt in
    r) reps=$OPTARG ;;
    u) units=$OPTARG ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
if [ $# -ne 3 ]; then
  sed -n '2,10p' "$0" >&2
  exit 2
fi
rev_a=$1 rev_b=$2 filter=$3

root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
py=/usr/bin/python3
[ -x "$py" ] || py=python3
ref_lib=$root/build/bench/libattnref_test_reference.a
if [ ! -f "$ref_lib" ]; then
  (cd "$root" && cmake --preset bench > /dev/null &&
    cmake --build --preset bench --target attnref_test_reference -j"$(nproc)" > /dev/null)
fi
bench_lib=$(find /usr/lib /usr/local/lib -name 'libbenchmark_main.a' 2> /dev/null | head -n 1)
[ -n "$bench_lib" ] || { echo "bench_ab.sh: libbenchmark_main.a not found" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
objs=() pids=()
for side in A B; do
  rev=$rev_a
  [ $side = B ] && rev=$rev_b
  mkdir -p "$work/$side"
  if [ "$rev" = "." ]; then
    cp -r "$root/include" "$work/$side/"
  else
    git -C "$root" archive "$rev" include | tar -x -C "$work/$side"
  fi
  for unit in $units; do
    src=$work/$side/$unit
    {
      echo '#include <benchmark/benchmark.h>'
      echo '#include <string>'
      echo "template <class F> benchmark::internal::Benchmark* ab_register(const std::string& n, F f) {"
      echo "  return benchmark::RegisterBenchmark((std::string(\"$side:\") + n).c_str(), f);"
      echo "}"
      sed 's/benchmark::RegisterBenchmark(/ab_register(/g' "$root/bench/$unit"
    } > "$src"
    c++ -std=c++17 -O3 -march=native -fopenmp -DNDEBUG -w -Dattnref=attnref_ab_$side \
      -I"$work/$side/include" -I"$root/bench" -I"$root/tests" -isystem /usr/include/eigen3 \
      -c "$src" -o "$src.o" &
    pids+=($!)
    objs+=("$src.o")
  done
done
for pid in "${pids[@]}"; do wait "$pid"; done  # a failed compile stops the script here
c++ -fopenmp "${objs[@]}" -o "$work/ab" "$ref_lib" "$bench_lib" -lbenchmark -pthread

# ROUNDS rounds, one process each: every round runs both versions of each benchmark once, in a
# random order (its A and B seconds apart); the ratio B/A of each round is summarised beside
# the fastest and median times of each side.
for ((round = 0; round < reps; ++round)); do
  "$work/ab" --benchmark_filter="^(A|B):($filter)" --benchmark_repetitions=1 \
    --benchmark_enable_random_interleaving=true --benchmark_min_time=0.2 \
    --benchmark_format=csv 2> /dev/null | sed "s/^/$round,/"
done | "$py" -c '
import csv, statistics, sys
runs = {}  # name -> side -> {round: ms}
for row in csv.reader(sys.stdin):
    if len(row) < 6 or not row[1].startswith(("A:", "B:")):
        continue
    scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[row[5]]
    side, name = row[1].split(":", 1)
    runs.setdefault(name, {}).setdefault(side, {})[int(row[0])] = float(row[3]) * scale
if not runs:
    sys.exit(f"bench_ab.sh: no benchmark matched FILTER {sys.argv[4]!r} (it is matched after "
             "the A: / B: prefix, so it cannot start with ^)")
print(f"{sys.argv[1]} (A) against {sys.argv[2]} (B), ms, {sys.argv[3]} rounds")
for name in sorted(runs):
    a, b = runs[name].get("A", {}), runs[name].get("B", {})
    if not a or not b:
        continue
    av, bv = list(a.values()), list(b.values())
    ma, mb = statistics.median(av), statistics.median(bv)
    print(f"{name}  A {min(av):.3f} / {ma:.3f}  B {min(bv):.3f} / {mb:.3f}"
          f"  B/A {min(bv) / min(av):.3f} / {mb / ma:.3f}  (fastest / median)")
    pairs = sorted(b[r] / a[r] for r in a if r in b)
    if len(pairs) >= 2:
        q = statistics.quantiles(pairs, n=4) if len(pairs) >= 4 else [pairs[0], 0, pairs[-1]]
        faster = sum(1 for x in pairs if x < 1.0)
        print(f"{name}  paired B/A {statistics.median(pairs):.3f} (middle half {q[0]:.3f}-{q[2]:.3f}),"
              f" B faster in {faster} of {len(pairs)} rounds")
' "$rev_a" "$rev_b" "$reps" "$filter"
