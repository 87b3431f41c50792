#pragma once
// The SIMD levels this build can run, for tests that compare them: every level must give the
// same bits.

#include <gtest/gtest.h>

#include <attnref/core/simd_level.hpp>
#include <vector>

namespace support {

/// Portable, then Avx2 and Avx512 where compiled in: the int8 (VNNI) kernels run at Avx512, the
/// float GEMM below it.
inline std::vector<attnref::detail::simd::Level> simd_levels() {
  namespace simd = attnref::detail::simd;
  std::vector<simd::Level> l{simd::Level::Portable};
  if (simd::compiled_level() >= simd::Level::Avx2) l.push_back(simd::Level::Avx2);
  if (simd::compiled_level() >= simd::Level::Avx512) l.push_back(simd::Level::Avx512);
  return l;
}

/// Runs `body` at every compiled level (a trace names the level), then restores the level in use.
template <class F>
void at_every_level(F&& body) {
  namespace simd = attnref::detail::simd;
  const simd::Level previous = simd::level();
  for (simd::Level l : simd_levels()) {
    simd::set_level(l);
    SCOPED_TRACE(simd::to_string(l));
    body();
  }
  simd::set_level(previous);
}

}  // namespace support
