#pragma once
// The one comparison helper and tolerance policy of the test suite.
//
// all_close() reports the worst element (with its position), the number of elements outside
// tolerance, and any NaN/Inf mismatch in either direction (a NaN in the reference must not pass
// silently, nor a NaN in the result).

#include <gtest/gtest.h>

#include <attnref/core/types.hpp>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace support {

struct Tolerance {
  double atol;
  double rtol;
};

/// Tolerance of an attention output against the double reference, by output storage type and
/// compute type. fp32 compute: a few ulps of float times the accumulation depth are far below
/// 2e-5 for unit-scale data; fp16/bf16 outputs are dominated by the final rounding (half an ulp:
/// 2^-11 and 2^-8 relative), so the bounds are a little above one ulp.
enum class Kind { F64, F32, F16, BF16 };

inline Tolerance tolerance(Kind out) {
  switch (out) {
    case Kind::F64:
      return {1e-12, 1e-12};
    case Kind::F32:
      return {2e-5, 2e-5};
    case Kind::F16:
      return {1e-3, 1e-3};
    case Kind::BF16:
      return {8e-3, 8e-3};
  }
  return {0, 0};
}

/// The Kind of a storage type: double, float, attnref::half, else bfloat16.
template <class T>
constexpr Kind kind_of() {
  if constexpr (std::is_same_v<T, double>)
    return Kind::F64;
  else if constexpr (std::is_same_v<T, float>)
    return Kind::F32;
  else if constexpr (std::is_same_v<T, attnref::half>)
    return Kind::F16;
  else
    return Kind::BF16;
}

using Where = std::function<std::string(std::size_t)>;

inline ::testing::AssertionResult all_close(const std::vector<double>& expected,
                                            const std::vector<double>& actual, Tolerance tol,
                                            const Where& where = {}) {
  if (expected.size() != actual.size())
    return ::testing::AssertionFailure()
           << "size mismatch: expected " << expected.size() << " elements, got " << actual.size();
  std::size_t bad = 0, nan_mismatch = 0, worst = 0;
  double worst_excess = -1.0;
  std::size_t first_nan = expected.size();
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const double e = expected[i], a = actual[i];
    const bool en = std::isnan(e), an = std::isnan(a);
    if (en || an) {
      if (en != an) {
        ++nan_mismatch;
        if (first_nan == expected.size()) first_nan = i;
      }
      continue;
    }
    if (std::isinf(e) || std::isinf(a)) {
      if (e != a) {
        ++nan_mismatch;
        if (first_nan == expected.size()) first_nan = i;
      }
      continue;
    }
    const double diff = std::fabs(e - a);
    const double allowed = tol.atol + tol.rtol * std::fabs(e);
    if (diff > allowed) ++bad;
    const double excess = diff - allowed;
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  auto at = [&](std::size_t i) {
    std::ostringstream os;
    os << "[" << i << "]";
    if (where) os << " " << where(i);
    os << " expected " << expected[i] << ", got " << actual[i];
    return os.str();
  };
  if (bad == 0 && nan_mismatch == 0) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os.precision(10);
  os << bad << " of " << expected.size() << " elements outside atol " << tol.atol << " + rtol "
     << tol.rtol;
  if (bad)
    os << "; worst " << at(worst) << " (|diff| " << std::fabs(expected[worst] - actual[worst])
       << ")";
  if (nan_mismatch) os << "; " << nan_mismatch << " NaN/Inf mismatches, first " << at(first_nan);
  return ::testing::AssertionFailure() << os.str();
}

/// Bitwise equality of two float/double arrays (NaNs with equal bits compare equal).
template <class T>
::testing::AssertionResult bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure() << "size mismatch " << a.size() << " vs " << b.size();
  std::size_t diff = 0, first = a.size();
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) {
      if (first == a.size()) first = i;
      ++diff;
    }
  }
  if (diff == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << diff << " of " << a.size() << " elements differ bitwise; first at " << first << ": "
         << static_cast<double>(a[first]) << " vs " << static_cast<double>(b[first]);
}

}  // namespace support
