#pragma once
// Random test data. Each helper fixes its engine, distribution and order of draws: the tests
// compare against references with tolerances set on exactly this data.

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace support {

/// n standard normal floats (a fresh std::normal_distribution<float> per call, so no value
/// cached by an earlier call is used), each converted to T.
template <class T>
std::vector<T> randn(std::size_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<T> x(n);
  for (T& e : x) e = T(nd(rng));
  return x;
}

/// The same from an engine of its own, seeded with `seed`.
template <class T>
std::vector<T> randn(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  return randn<T>(n, rng);
}

/// n int8 values uniform in [lo, hi].
inline std::vector<std::int8_t> rand_i8(std::size_t n, std::mt19937& rng, int lo = -128,
                                        int hi = 127) {
  std::uniform_int_distribution<int> u(lo, hi);
  std::vector<std::int8_t> x(n);
  for (std::int8_t& e : x) e = static_cast<std::int8_t>(u(rng));
  return x;
}

/// n int8 values, half of them (on average) at the extremes -128 / 127, the rest uniform.
inline std::vector<std::int8_t> extreme_i8(std::size_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int> u(-128, 127);
  std::bernoulli_distribution edge(0.5);
  std::vector<std::int8_t> x(n);
  for (auto& e : x) e = static_cast<std::int8_t>(edge(rng) ? (u(rng) < 0 ? -128 : 127) : u(rng));
  return x;
}

}  // namespace support
