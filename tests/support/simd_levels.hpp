#pragma once
// The SIMD levels this build can run, for tests that compare them: every level must give the
// same bits.

#include <gtest/gtest.h>

#include <array>
#include <attnref/core/simd_level.hpp>
#include <cstddef>

namespace support {

/// The levels of one build, iterable (a fixed array: no heap, which also keeps GCC 12's
/// -Wfree-nonheap-object false positive on small inlined vectors away).
struct Levels {
  std::array<attnref::detail::simd::Level, 3> l{};
  std::size_t n = 0;
  const attnref::detail::simd::Level* begin() const { return l.data(); }
  const attnref::detail::simd::Level* end() const { return l.data() + n; }
  std::size_t size() const { return n; }
};

/// Portable, then Avx2 and Avx512 where compiled in: the int8 (VNNI) kernels run at Avx512, the
/// float GEMM below it.
inline Levels simd_levels() {
  namespace simd = attnref::detail::simd;
  Levels v;
  v.l[v.n++] = simd::Level::Portable;
  if (simd::compiled_level() >= simd::Level::Avx2) v.l[v.n++] = simd::Level::Avx2;
  if (simd::compiled_level() >= simd::Level::Avx512) v.l[v.n++] = simd::Level::Avx512;
  return v;
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
