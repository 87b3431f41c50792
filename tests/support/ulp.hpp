#pragma once
// The spacing of fp16 / bf16 values (no GoogleTest: the fuzz harness uses it too).

#include <algorithm>
#include <attnref/core/types.hpp>
#include <cmath>
#include <type_traits>

namespace support {

/// The spacing of T (attnref::half, else bfloat16) at v; subnormals have the smallest normal's.
template <class T>
double ulp_of(double v) {
  constexpr bool f16 = std::is_same_v<T, attnref::half>;
  constexpr int mant = f16 ? 10 : 7;
  constexpr double min_normal = f16 ? 6.103515625e-05 : 1.1754943508222875e-38;
  int e = 0;
  std::frexp(std::max(std::fabs(v), min_normal), &e);
  return std::ldexp(1.0, e - 1 - mant);
}

}  // namespace support
