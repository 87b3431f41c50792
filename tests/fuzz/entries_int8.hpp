#pragma once
// What the fuzz entries of the int8 paths share (entries_int8_pfa.cpp, entries_int8_paged.cpp,
// entries_int8_sa.cpp): random int8 data and scales, non-finite values, the fp16 rounding of a
// reference value and the text of a mismatch.

#include <attnref/attnref.hpp>
#include <limits>
#include <string>
#include <vector>

#include "fuzz/fuzz.hpp"
#include "support/cast.hpp"

namespace fuzz_int8_util {

using attnref::half;
using attnref::StridedView;
using fuzz::Index;
using fuzz::kHuge;
using R = fuzz::Rng;
using i8 = std::int8_t;
using support::z;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

inline std::vector<i8> i8s(R& r, Index n, int lim = 128) {
  std::vector<i8> x(z(n));
  for (i8& e : x) e = static_cast<i8>(r.range(-lim, lim - 1));
  return x;
}
inline float unit(R& r) { return static_cast<float>(r.range(0, 1000)) / 1000.0f; }
inline float non_finite(R& r) { return r.chance(0.5) ? kNaN : r.chance(0.5) ? kInf : -kInf; }
inline double as_half(double x) { return static_cast<float>(half(static_cast<float>(x))); }
inline std::string at(size_t i, double got, double want) {
  return "element " + std::to_string(i) + ": got " + std::to_string(got) + ", want " +
         std::to_string(want);
}

}  // namespace fuzz_int8_util
