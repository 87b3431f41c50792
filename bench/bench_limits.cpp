// attnref_bench: the machine's own limits, so that every figure of the other families reads as a
// fraction of this machine in this run (bench/limits.hpp):
//   limits/fma_peak/f32/threads:<T>    fp32 FMA throughput (GFLOPS)
//   limits/int8_peak/threads:<T>       int8 dot-product throughput (GOPS, 2 per multiply-add),
//                                      where the build has AVX-512 VNNI
//   limits/read/MB:<size>/threads:<T>  read bandwidth of a working set of that size (GBps):
//                                      16.8 MB is the K/V of decode B:1 (f16, KV 4096, 8 kv heads,
//                                      D 128), 134 MB that of B:8
// The prefill and decode benchmarks report `of_peak` / `of_bw`: their GFLOPS / GBps divided by
// these limits at the same thread count (and working set).

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "limits.hpp"

namespace {

namespace L = bench_limits::detail;

// Each iteration runs long enough (~10 ms) for the threads' start to be noise.
void fma_peak(benchmark::State& state, int threads) {
  constexpr long kIters = 1 << 22;
  for (auto _ : state) L::timed(threads, [&](int) { L::g_sink = L::fma_chains(kIters); });
  const double flops = 2.0 * L::kLanes * L::kChains * static_cast<double>(kIters) * threads;
  state.counters["GFLOPS"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["lanes"] = L::kLanes;
}

void int8_peak(benchmark::State& state, int threads) {
  constexpr long kIters = 1 << 21;
  for (auto _ : state) L::timed(threads, [&](int) { L::g_isink = L::int8_chains(kIters); });
  const double ops = 2.0 * 64 * L::kI8Chains * static_cast<double>(kIters) * threads;
  state.counters["GOPS"] =
      benchmark::Counter(ops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void read_bw(benchmark::State& state, std::size_t bytes, int threads) {
  const std::vector<float> buf(bytes / sizeof(float), 1.0f);
  const int reps = std::max<int>(1, static_cast<int>(1e9 / static_cast<double>(bytes)));
  for (auto _ : state) bench_limits::read_passes(buf, threads, reps);
  const double read = static_cast<double>(buf.size() / static_cast<std::size_t>(threads)) *
                      sizeof(float) * threads * reps;
  state.counters["GBps"] =
      benchmark::Counter(read * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

const bool registered = [] {
  for (int t : {1, 2}) {
    const std::string ts = "/threads:" + std::to_string(t);
    benchmark::RegisterBenchmark(("limits/fma_peak/f32" + ts).c_str(),
                                 [=](benchmark::State& st) { fma_peak(st, t); })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    if (L::kHaveVnni)
      benchmark::RegisterBenchmark(("limits/int8_peak" + ts).c_str(),
                                   [=](benchmark::State& st) { int8_peak(st, t); })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    for (const auto& [name, bytes] : {std::make_pair(std::string("16.8"), std::size_t{16777216}),
                                      std::make_pair(std::string("134"), std::size_t{134217728})})
      benchmark::RegisterBenchmark(("limits/read/MB:" + name + ts).c_str(),
                                   [=](benchmark::State& st) { read_bw(st, bytes, t); })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
  }
  return true;
}();

}  // namespace
