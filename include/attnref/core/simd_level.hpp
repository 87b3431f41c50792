#pragma once
/// The hand-vectorised level attnref's kernels use (docs/attention.md, "SIMD levels"). Every level
/// gives the same bits; Portable (Eigen and scalar code only) is the fallback the tests compare
/// the others against.
///
///   attnref::SimdLevel::Portable   always available
///   attnref::SimdLevel::Avx2       compiled in with AVX2, FMA and F16C
///   attnref::SimdLevel::Avx512     compiled in with AVX-512F as well
///
/// The level is process-wide (an atomic; read once per operator call). set_simd_level clamps a
/// request to compiled_simd_level() and returns the previous level; ScopedSimdLevel restores it.

#include "attnref/detail/simd.hpp"

namespace attnref {

using SimdLevel = detail::simd::Level;

/// The level in use.
inline SimdLevel simd_level() { return detail::simd::level(); }
/// The highest level this translation unit was compiled for (the compiler's target flags).
inline SimdLevel compiled_simd_level() { return detail::simd::compiled_level(); }
/// Selects a level (clamped to compiled_simd_level()); returns the previous one.
inline SimdLevel set_simd_level(SimdLevel level) { return detail::simd::set_level(level); }
/// The name of a level: "portable", "avx2" or "avx512".
inline const char* to_string(SimdLevel level) { return detail::simd::to_string(level); }

/// Selects a level for the lifetime of the object, then restores the previous one.
class ScopedSimdLevel {
 public:
  explicit ScopedSimdLevel(SimdLevel level) : previous_(set_simd_level(level)) {}
  ~ScopedSimdLevel() { set_simd_level(previous_); }
  ScopedSimdLevel(const ScopedSimdLevel&) = delete;
  ScopedSimdLevel& operator=(const ScopedSimdLevel&) = delete;

 private:
  SimdLevel previous_;
};

}  // namespace attnref
