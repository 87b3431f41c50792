#pragma once
// What the NSA operator tests share (compress_attention_*, decode_step_*): the reference's dtype
// tag and the top-k check against the reference's group scores.

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/core/types.hpp>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "reference/nsa.hpp"
#include "support/cast.hpp"

namespace nsa_support {

using support::z;
using i32 = std::int32_t;

template <class T>
ref::nsa::Dt dt_of() {
  if constexpr (std::is_same_v<T, attnref::half>)
    return ref::nsa::Dt::F16;
  else if constexpr (std::is_same_v<T, attnref::bfloat16>)
    return ref::nsa::Dt::BF16;
  else
    return ref::nsa::Dt::F32;
}

// Top-k of one (row, kv head) against the reference group scores g (double, forced = +inf):
// exactly the reference's order, except that two finite scores within a relative 1e-5 of each
// other may come in either order (fp32 vs double). Checked as: the right count of distinct valid
// indices then -1; no pair in the wrong order unless near-tied; no unselected block that must
// precede a selected one.
inline ::testing::AssertionResult topk_ok(const std::vector<double>& g, const i32* got, long k) {
  const long n = static_cast<long>(g.size()), m = std::min(k, n);
  auto near = [&](long x, long y) {
    const double a = g[z(x)], b = g[z(y)];
    if (std::isinf(a) || std::isinf(b)) return false;
    return std::fabs(a - b) <= 1e-5 * std::max(std::fabs(a), std::fabs(b));
  };
  auto must_precede = [&](long x, long y) {  // x must come before y
    const double a = g[z(x)], b = g[z(y)];
    if (a == b) return std::isinf(a) ? x < y : false;  // exact finite ties: near, either order
    return a > b && !near(x, y);
  };
  auto dump = [&] {
    std::ostringstream os;
    os << " got [";
    for (long i = 0; i < k; ++i) os << (i ? " " : "") << got[i];
    os << "] scores [";
    for (long i = 0; i < n; ++i) os << (i ? " " : "") << g[z(i)];
    return os.str() + "]";
  };
  std::vector<char> chosen(z(n), 0);
  for (long i = 0; i < k; ++i) {
    if (i >= m) {
      if (got[i] != -1) return ::testing::AssertionFailure() << "position " << i << dump();
      continue;
    }
    if (got[i] < 0 || got[i] >= n || chosen[z(got[i])])
      return ::testing::AssertionFailure() << "invalid/duplicate at " << i << dump();
    chosen[z(got[i])] = 1;
  }
  for (long i = 0; i < m; ++i)
    for (long j = i + 1; j < m; ++j)
      if (must_precede(got[j], got[i]))
        return ::testing::AssertionFailure() << "order at " << i << ", " << j << dump();
  for (long y = 0; y < n; ++y)
    if (!chosen[z(y)])
      for (long i = 0; i < m; ++i)
        if (must_precede(y, got[i]))
          return ::testing::AssertionFailure() << "block " << y << " left out" << dump();
  return ::testing::AssertionSuccess();
}

}  // namespace nsa_support
