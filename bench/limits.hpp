#pragma once
// The machine's own limits, measured in the same run as the benchmarks that are judged against
// them (bench_limits.cpp reports them; the prefill and decode benchmarks divide by them):
//   fma_peak_gflops(T)      fp32 FMA throughput of T threads: independent multiply-add chains
//                           on the widest SIMD packet the build targets (Eigen's packet math,
//                           so -march=native picks AVX-512, AVX2 or SSE), 2 FLOPs per lane
//   int8_peak_gops(T)       int8 dot-product throughput of T threads where the build has AVX-512
//                           VNNI (independent vpdpbusd chains on 512-bit registers, 64 multiply-
//                           adds each, 2 ops per multiply-add), 0 without it
//   read_gbps(bytes, T)     read bandwidth of a working set of `bytes`: T threads summing their
//                           share of one buffer, again and again
// Each value is measured once per argument (best of several passes of >= 20 ms) and cached.

#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#endif

namespace bench_limits {

namespace detail {

using Packet = Eigen::internal::packet_traits<float>::type;
constexpr int kLanes = static_cast<int>(sizeof(Packet) / sizeof(float));
constexpr int kChains = 12;  // covers FMA latency x pipes on current x86 cores

// Runs fn(thread) on `threads` threads started together; returns the wall time in seconds.
inline double timed(int threads, const std::function<void(int)>& fn) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load()) std::this_thread::yield();
      fn(t);
    });
  while (ready.load() < threads) std::this_thread::yield();
  const auto t0 = std::chrono::steady_clock::now();
  go.store(true);
  for (auto& th : pool) th.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

inline float fma_chains(long iters) {
  using namespace Eigen::internal;
  Packet acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = pset1<Packet>(1.0f + 1e-3f * static_cast<float>(j));
  const Packet a = pset1<Packet>(0.9999999f), b = pset1<Packet>(1e-7f);
  for (long i = 0; i < iters; ++i)
    for (int j = 0; j < kChains; ++j) acc[j] = pmadd(acc[j], a, b);
  Packet s = acc[0];
  for (int j = 1; j < kChains; ++j) s = padd(s, acc[j]);
  return predux(s);
}

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
constexpr bool kHaveVnni = true;
constexpr int kI8Chains = 16;  // covers vpdpbusd latency x pipes

// acc += a · b (u8 · s8, four to a lane). Under g++ an asm with the accumulator tied to its
// register: g++ 12 copies and spills the intrinsic's accumulators (include/attnref/detail/
// gemm_i8.hpp says more).
inline void dpbusd(__m512i& acc, __m512i a, __m512i b) {
#if defined(__GNUC__) && !defined(__clang__)
  asm volatile("vpdpbusd {%2, %1, %0|%0, %1, %2}" : "+v"(acc) : "v"(a), "v"(b));
#else
  acc = _mm512_dpbusd_epi32(acc, a, b);
#endif
}

template <int... I>
inline std::int32_t dot_chains(long iters, std::integer_sequence<int, I...>) {
  __m512i acc[sizeof...(I)] = {((void)I, _mm512_set1_epi32(I))...};
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
  for (long i = 0; i < iters; ++i) (dpbusd(acc[I], a, b), ...);
  __m512i s = _mm512_setzero_si512();
  ((s = _mm512_add_epi32(s, acc[I])), ...);
  return _mm512_reduce_add_epi32(s);
}
inline std::int32_t int8_chains(long iters) {
  return dot_chains(iters, std::make_integer_sequence<int, kI8Chains>{});
}
#else
constexpr bool kHaveVnni = false;
constexpr int kI8Chains = 0;
inline std::int32_t int8_chains(long) { return 0; }
#endif

inline volatile std::int32_t g_isink = 0;

inline float read_sum(const float* p, std::size_t n) {
  using namespace Eigen::internal;
  constexpr std::size_t kAcc = 8;
  Packet acc[kAcc];
  for (auto& x : acc) x = pset1<Packet>(0.0f);
  std::size_t i = 0;
  for (; i + kAcc * kLanes <= n; i += kAcc * kLanes)
    for (std::size_t j = 0; j < kAcc; ++j)
      acc[j] = padd(acc[j], ploadu<Packet>(p + i + j * kLanes));
  Packet s = acc[0];
  for (std::size_t j = 1; j < kAcc; ++j) s = padd(s, acc[j]);
  float r = predux(s);
  for (; i < n; ++i) r += p[i];
  return r;
}

inline volatile float g_sink = 0.0f;
inline volatile std::size_t g_zero = 0;  // read per pass: the compiler cannot reuse a pass's sum

}  // namespace detail

namespace detail {
/// The best of 5 passes of `threads` threads each running run(iters) (iters grown until one
/// pass takes >= 20 ms), in G operations a second, ops_per_iter per iteration and thread.
template <class Run>
double best_rate(int threads, double ops_per_iter, const Run& run) {
  long iters = 1 << 16;
  while (timed(1, [&](int) { run(iters); }) < 0.02) iters *= 2;
  double best = 0.0;
  for (int pass = 0; pass < 5; ++pass) {
    const double s = timed(threads, [&](int) { run(iters); });
    best = std::max(best, ops_per_iter * static_cast<double>(iters) * threads / s * 1e-9);
  }
  return best;
}
}  // namespace detail

/// fp32 FMA peak of `threads` threads, GFLOPS.
inline double fma_peak_gflops(int threads) {
  static std::mutex m;
  static std::map<int, double> cache;
  std::lock_guard<std::mutex> lock(m);
  if (auto it = cache.find(threads); it != cache.end()) return it->second;
  return cache[threads] = detail::best_rate(threads, 2.0 * detail::kLanes * detail::kChains,
                                            [](long n) { detail::g_sink = detail::fma_chains(n); });
}

/// int8 dot-product peak of `threads` threads (AVX-512 VNNI), GOPS; 0 where the build has none.
inline double int8_peak_gops(int threads) {
  if (!detail::kHaveVnni) return 0.0;
  static std::mutex m;
  static std::map<int, double> cache;
  std::lock_guard<std::mutex> lock(m);
  if (auto it = cache.find(threads); it != cache.end()) return it->second;
  return cache[threads] = detail::best_rate(threads, 2.0 * 64 * detail::kI8Chains, [](long n) {
           detail::g_isink = detail::int8_chains(n);
         });
}

/// The counters `name` (`ops` useful operations per iteration, in G a second) and, where
/// int8_peak > 0 (a VNNI build), of_int8_peak: that rate over the int8 peak.
inline void int8_rate_counters(benchmark::State& state, const char* name, double ops,
                               double int8_peak) {
  state.counters[name] =
      benchmark::Counter(ops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  if (int8_peak > 0.0)
    state.counters["of_int8_peak"] =
        benchmark::Counter(ops * 1e-9 / int8_peak, benchmark::Counter::kIsIterationInvariantRate);
}

/// Seconds for `threads` threads to read their shares of `buf` `reps` times each.
inline double read_passes(const std::vector<float>& buf, int threads, int reps) {
  const std::size_t share = buf.size() / static_cast<std::size_t>(threads);
  return detail::timed(threads, [&](int t) {
    float s = 0.0f;
    for (int r = 0; r < reps; ++r)
      s += detail::read_sum(buf.data() + static_cast<std::size_t>(t) * share + detail::g_zero,
                            share);
    detail::g_sink = s;
  });
}

/// Read bandwidth of a working set of `bytes` read by `threads` threads, GB/s.
inline double read_gbps(std::size_t bytes, int threads) {
  static std::mutex m;
  static std::map<std::pair<std::size_t, int>, double> cache;
  std::lock_guard<std::mutex> lock(m);
  const auto key = std::make_pair(bytes, threads);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  std::vector<float> buf(bytes / sizeof(float));
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i % 7);
  const double read =
      static_cast<double>(buf.size() / static_cast<std::size_t>(threads)) * sizeof(float) * threads;
  int reps = 1;
  while (read_passes(buf, threads, reps) < 0.02) reps *= 2;
  double best = 0.0;
  for (int p = 0; p < 5; ++p)
    best = std::max(best, read * reps / read_passes(buf, threads, reps) * 1e-9);
  return cache[key] = best;
}

}  // namespace bench_limits
