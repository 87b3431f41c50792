#pragma once
/// The softmax row kernels of the hand-vectorised levels: the maximum of a row, and
/// x <- exp(x - m) with the row's sum in one pass. The exponential is Cody-Waite range reduction
/// (x = n·ln2 + r, |r| <= ln2 / 2) with a degree-7 polynomial for exp(r) (Cephes' expf
/// coefficients, about 1 ulp), scaled by 2^n exactly; arguments below -87.3365 (where exp leaves
/// the normal floats) give exactly 0, so masked (-inf) entries vanish and no subnormal reaches
/// P·V. The scalar form below is the same arithmetic, so vector lanes and tails agree bit for
/// bit and every level gives the same P for the same scores; only the order of the row sum
/// depends on the vector width.

#include <algorithm>
#include <cmath>
#include <limits>

#include "attnref/core/types.hpp"
#include "attnref/detail/simd.hpp"

namespace attnref::detail::simd {

namespace expf_consts {
inline constexpr float kLow = -87.33654f;  // exp(kLow) is about the smallest normal float
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
inline constexpr float kP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
}  // namespace expf_consts

/// exp(x) for x <= 0 (0 below kLow; NaN stays NaN), scalar.
inline float exp_nonpositive(float x) {
  using namespace expf_consts;
  if (x < kLow) return 0.0f;
  if (std::isnan(x)) return x;  // (the vector forms' lanes give NaN too)
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(-n, kLn2Hi, x);
  r = std::fma(-n, kLn2Lo, r);
  float p = kP[0];
  for (int i = 1; i < 6; ++i) p = std::fma(p, r, kP[i]);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  return std::ldexp(p, static_cast<int>(n));
}

/// The vector forms' common part: x (>= kLow, or NaN) = n·ln2 + r; returns exp(r), n in `n`.
template <class V>
inline typename V::reg exp_reduced(typename V::reg x, typename V::reg& n) {
  using namespace expf_consts;
  n = V::round(V::mul(x, V::set1(kLog2e)));
  typename V::reg r = V::fnmadd(n, V::set1(kLn2Hi), x);
  r = V::fnmadd(n, V::set1(kLn2Lo), r);
  typename V::reg p = V::set1(kP[0]);
  for (int i = 1; i < 6; ++i) p = V::fmadd(p, r, V::set1(kP[i]));
  p = V::fmadd(p, r, V::set1(1.0f));
  return V::fmadd(p, r, V::set1(1.0f));
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
inline __m256 exp_nonpositive(V8, __m256 x) {
  const __m256 low = _mm256_set1_ps(expf_consts::kLow);
  const __m256 keep = _mm256_cmp_ps(x, low, _CMP_NLT_UQ);  // x >= kLow, or NaN
  __m256 n;
  const __m256 p = exp_reduced<V8>(_mm256_max_ps(low, x), n);  // (max keeps a NaN x)
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);  // 2^n, n >= -126
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep);
}
#endif

#if defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
inline __m512 exp_nonpositive(V16, __m512 x) {
  const __m512 low = _mm512_set1_ps(expf_consts::kLow);
  const __mmask16 keep = _mm512_cmp_ps_mask(x, low, _CMP_NLT_UQ);
  __m512 n;
  const __m512 p = exp_reduced<V16>(_mm512_max_ps(low, x), n);
  return _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, n));
}
#endif

/// Largest of x[0..n) (-inf for n == 0; unspecified when an entry is NaN: the engine marks such
/// rows overflowed before it asks).
template <class V>
inline float row_max(const float* x, Index n) {
  float m = -std::numeric_limits<float>::infinity();
  Index i = 0;
  if (n >= V::kWidth) {
    typename V::reg acc = V::load(x);
    for (i = V::kWidth; i + V::kWidth <= n; i += V::kWidth) acc = V::max(acc, V::load(x + i));
    alignas(64) float lanes[V::kWidth];
    V::store(lanes, acc);
    for (float l : lanes) m = std::max(m, l);
  }
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

/// x[i] <- exp(x[i] - m) for i < n (m >= every x[i]); returns their sum (lanes, then the tail).
template <class V>
inline float exp_shift_sum(float* x, Index n, float m) {
  const typename V::reg vm = V::set1(m);
  typename V::reg acc = V::zero();
  Index i = 0;
  for (; i + V::kWidth <= n; i += V::kWidth) {
    const typename V::reg e = exp_nonpositive(V{}, V::sub(V::load(x + i), vm));
    V::store(x + i, e);
    acc = V::add(acc, e);
  }
  float s = V::sum(acc);
  for (; i < n; ++i) s += (x[i] = exp_nonpositive(x[i] - m));
  return s;
}

/// y[i] <- exp(x[i] - m) · s for i < n (m >= every x[i]; y may be x): the normalised
/// probabilities of a row whose maximum m and scale s = 1 / l are known, with the exponential of
/// exp_shift_sum (the same bits in every lane and in the scalar tail).
template <class V>
inline void exp_shift_scale(const float* x, Index n, float m, float s, float* y) {
  const typename V::reg vm = V::set1(m), vs = V::set1(s);
  Index i = 0;
  for (; i + V::kWidth <= n; i += V::kWidth)
    V::store(y + i, V::mul(exp_nonpositive(V{}, V::sub(V::load(x + i), vm)), vs));
  for (; i < n; ++i) y[i] = exp_nonpositive(x[i] - m) * s;
}

}  // namespace attnref::detail::simd
