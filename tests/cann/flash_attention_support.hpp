#pragma once
// The shared scaffolding of the CANN PromptFlashAttention and IncreFlashAttention tests
// (prompt_flash_attention_test.cpp, flash_attention_test.cpp): deterministic mask / pse values,
// the CANN layouts, random rows rounded to T, the comparisons against the reference and between
// two paths, and the case flags.

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/cann/incre_flash_attention.hpp>
#include <attnref/cann/prompt_flash_attention.hpp>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "reference/cann_flash_attention.hpp"
#include "support/cast.hpp"
#include "support/compare.hpp"

namespace flash_attention_support {

using attnref::bfloat16;
using attnref::half;
using attnref::Index;
using attnref::StridedView;
using i8 = std::int8_t;
using u8 = std::uint8_t;
using ref::cann::Seqs;
using Shape = std::vector<Index>;

using support::dbl;
using support::rnd;
using support::z;
template <class T>
T poison() {
  if constexpr (std::is_same_v<T, i8>)
    return -128;  // int8 has no NaN
  else
    return T(NAN);
}

// A deterministic value in [0, 1) of (seed, a, b, c): masks and pse do not depend on the width
// of their tensors, so one problem stored two ways gets the same values.
inline double hv(unsigned seed, int a, int b, int c) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull +
                    static_cast<std::uint64_t>(a) * 0xBF58476D1CE4E5B9ull +
                    static_cast<std::uint64_t>(b) * 0x94D049BB133111EBull +
                    static_cast<std::uint64_t>(c) * 0x2545F4914F6CDD1Dull;
  for (int r = 0; r < 2; ++r) x = (x ^ (x >> 31)) * 0xBF58476D1CE4E5B9ull ^ (x >> 27);
  return static_cast<double>(x >> 11) * 0x1p-53;
}

// Element (b, s, n, d) of a q / k / v / out tensor in a CANN layout (TND: row cu[b] + s).
struct Dims {
  std::string lay;
  int B = 1, S = 1, N = 1, D = 1;
  std::vector<int> cu;
  Shape shape() const {
    if (lay == "BSH") return {B, S, N * D};
    if (lay == "BSND") return {B, S, N, D};
    if (lay == "TND") return {cu.back(), N, D};
    return {B, N, S, D};  // BNSD, BNSD_BSND
  }
  size_t size() const {
    size_t n = 1;
    for (Index e : shape()) n *= z(e);
    return n;
  }
  size_t at(int b, int s, int n, int d) const {
    if (lay == "TND") return z(((cu[z(b)] + s) * N + n) * D + d);
    if (lay == "BNSD" || lay == "BNSD_BSND") return z(((b * N + n) * S + s) * D + d);
    return z(((b * S + s) * N + n) * D + d);
  }
};

// Random rows rounded to T: x[b] = [len[b]][heads][dim].
template <class T>
Seqs draw(std::mt19937& rng, const std::vector<int>& len, int heads, int dim) {
  std::normal_distribution<double> nd;
  Seqs x(len.size());
  for (size_t b = 0; b < len.size(); ++b)
    for (int e = 0; e < len[b] * heads * dim; ++e) x[b].push_back(rnd<T>(nd(rng)));
  return x;
}

// Brace-free shapes and length lists (they keep the edit lambdas of the rejection tests on one line
// each).
template <class... I>
Shape shp(I... i) {
  return {static_cast<Index>(i)...};
}
template <class... I>
std::vector<std::int64_t> lens(I... i) {
  return {static_cast<std::int64_t>(i)...};
}

// The rows of x in a tensor of `d`; everything else NaN.
template <class T>
std::vector<T> pack(const Dims& d, const Seqs& x, const std::vector<int>& len) {
  std::vector<T> buf(d.size(), poison<T>());
  for (int b = 0; b < static_cast<int>(len.size()); ++b)
    for (int s = 0; s < len[z(b)]; ++s)
      for (int n = 0; n < d.N; ++n)
        for (int e = 0; e < d.D; ++e)
          buf[d.at(b, s, n, e)] = T(static_cast<float>(x[z(b)][z((s * d.N + n) * d.D + e)]));
  return buf;
}

template <class T>
std::vector<T> concat(const Seqs& x) {
  std::vector<T> out;
  for (const auto& s : x)
    for (double e : s) out.push_back(T(static_cast<float>(e)));
  return out;
}

// The reference rounded to T against the result, with the suite's tolerance policy.
template <class T>
::testing::AssertionResult matches(const std::vector<double>& want, const std::vector<T>& got) {
  std::vector<double> w, g;
  for (double x : want) w.push_back(rnd<T>(x));
  for (const T& x : got) g.push_back(dbl(x));
  return support::all_close(w, g, support::tolerance(support::kind_of<T>()));
}

// Two results within about one ulp of T (two code paths of the same math).
template <class T>
::testing::AssertionResult ulp_close(const std::vector<T>& a, const std::vector<T>& b) {
  std::vector<double> da, db;
  for (const T& x : a) da.push_back(dbl(x));
  for (const T& x : b) db.push_back(dbl(x));
  return support::all_close(da, db,
                            {1e-6, std::is_same_v<T, half>    ? 0x1p-10
                                   : std::is_same_v<T, float> ? 0x1p-20
                                                              : 0x1p-7});
}

template <class T>
bool untouched(const std::vector<T>& out) {
  return std::all_of(out.begin(), out.end(), [](const T& x) { return dbl(x) == 7.0; });
}

// std::vector<bool> has no data(): masks live here (copies share the storage, never written).
template <class T>
struct Array {
  std::shared_ptr<T[]> p;
  size_t n = 0;
  explicit Array(size_t size = 0) : p(new T[size]()), n(size) {}
  T* data() const { return p.get(); }
  T& operator[](size_t i) const { return p[i]; }
};

// Case flags.
constexpr int kAts = 1;           // PseOrder::AddThenScale
constexpr int kMaskB1 = 2;        // PFA mask batch 1
constexpr int kOneLen = 4;        // PFA: one-value length lists (broadcast)
constexpr int kNoLens = 8;        // PFA: no length lists, extents = lengths (else lengths + 2)
constexpr int kDv8 = 16;          // PFA: value head size 8
constexpr int kOffset = 32;       // IFA antiquant offset
constexpr int kCache4d = 64;      // IFA paged [blockNum, KV_N, blockSize, D] (BNSD only)
constexpr int kInner0 = 128;      // IFA inner_precise 0
constexpr int kNoFullMask = 256;  // IFA: key 0 never masked (else batch 1 is entirely masked)
constexpr std::int64_t kInf = 2147483647;

inline attnref::PseOrder order(int flags) {
  return flags & kAts ? attnref::PseOrder::AddThenScale : attnref::PseOrder::ScaleThenAdd;
}

}  // namespace flash_attention_support
