#pragma once
/// The int8 quantization toolkit shared by the quantized operators (SelfAttention QKV quant,
/// PagedAttention int8 KV, PFA / IFA antiquant, MLA).
///
/// Convention (one for the whole library; operators map the vendor's forms onto it):
///   quantize:    q = saturate(round_half_even(x / scale + offset)) in [-128, 127]
///   dequantize:  x = (q - offset) * scale
/// Symmetric quantization has offset 0. The vendor's antiquant form (K_i8 + offset) * scale is
/// dequantize with -offset. Scales travel as float, or as the fp32 bit pattern in the low 32 bits
/// of an int64 / uint64 (the CANN convention for deq_scale tensors): scale_from_bits.
///
/// Granularity over a 2-D view [rows, cols]: PerTensor (one scale), PerChannel (one per column),
/// PerToken (one per row).
///
/// int8 x int8 products are accumulated exactly in int32 (dot_i8, axpy_i8 and the gemm_i8_*
/// helpers, at every SIMD level; up to 2^17 terms cannot overflow).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnref/core/error.hpp"
#include "attnref/core/types.hpp"
#include "attnref/core/view.hpp"
#include "attnref/detail/simd.hpp"

namespace attnref {

enum class QuantGranularity { PerTensor, PerChannel, PerToken };

/// Scales (and offsets: empty = symmetric) of one quantized 2-D tensor.
struct QuantScales {
  QuantGranularity granularity = QuantGranularity::PerTensor;
  std::vector<float> scale;
  std::vector<float> offset;  ///< empty: 0 everywhere

  Index index(Index row, Index col) const {
    switch (granularity) {
      case QuantGranularity::PerChannel:
        return col;
      case QuantGranularity::PerToken:
        return row;
      case QuantGranularity::PerTensor:
        break;
    }
    return 0;
  }
  float scale_at(Index row, Index col) const { return scale[static_cast<size_t>(index(row, col))]; }
  float offset_at(Index row, Index col) const {
    return offset.empty() ? 0.0f : offset[static_cast<size_t>(index(row, col))];
  }
};

/// fp32 scale stored as its bit pattern in the low 32 bits of a 64-bit integer.
inline float scale_from_bits(std::uint64_t bits) {
  const auto low = static_cast<std::uint32_t>(bits & 0xffffffffu);
  float f;
  std::memcpy(&f, &low, sizeof f);
  return f;
}
inline float scale_from_bits(std::int64_t bits) {
  return scale_from_bits(static_cast<std::uint64_t>(bits));
}
/// The inverse: an fp32 scale as the uint64 the vendor's APIs take.
inline std::uint64_t scale_to_bits(float scale) {
  std::uint32_t low;
  std::memcpy(&low, &scale, sizeof low);
  return low;
}

/// round half to even, then saturate to int8 (NaN gives 0).
inline std::int8_t saturate_i8(double x) {
  if (std::isnan(x)) return 0;
  const double r = std::nearbyint(x);  // the default rounding mode: to nearest, ties to even
  return static_cast<std::int8_t>(std::clamp(r, -128.0, 127.0));
}

/// One value: saturate(rne(x / scale + offset)).
inline std::int8_t quantize_value(float x, float scale, float offset = 0.0f) {
  return saturate_i8(static_cast<double>(x) / static_cast<double>(scale) +
                     static_cast<double>(offset));
}

namespace detail {

inline Index quant_count(QuantGranularity g, Index rows, Index cols) {
  return g == QuantGranularity::PerTensor ? 1 : g == QuantGranularity::PerChannel ? cols : rows;
}

inline void check_scales(const char* fn, const QuantScales& s, Index rows, Index cols) {
  const Index n = quant_count(s.granularity, rows, cols);
  ATTNREF_CHECK(static_cast<Index>(s.scale.size()) == n, std::invalid_argument, fn, "scales.scale",
                "size mismatch", n, s.scale.size());
  ATTNREF_CHECK(s.offset.empty() || static_cast<Index>(s.offset.size()) == n, std::invalid_argument,
                fn, "scales.offset", "size mismatch", "0 or " + std::to_string(n), s.offset.size());
  for (size_t i = 0; i < s.scale.size(); ++i)
    ATTNREF_CHECK(std::isfinite(s.scale[i]) && s.scale[i] != 0.0f, std::invalid_argument, fn,
                  "scales.scale[" + std::to_string(i) + "]", "not a finite nonzero value",
                  "finite, != 0", s.scale[i]);
}

/// Every value of a scale / offset vector finite (and > 0 with `positive`), else
/// std::invalid_argument naming fn and "<name>[i]". Absent vectors pass.
inline void check_finite(const char* fn, const std::string& name,
                         const StridedView<const float, 1>& s, bool positive = false) {
  for (Index i = 0; i < s.size(0); ++i)
    ATTNREF_CHECK(std::isfinite(s(i)) && (!positive || s(i) > 0.0f), std::invalid_argument, fn,
                  name + "[" + std::to_string(i) + "]",
                  positive ? "not a positive finite scale" : "not finite",
                  positive ? "> 0 and finite" : "finite", s(i));
}
}  // namespace detail

/// Scales that map x onto int8: symmetric, scale = amax / 127 (offset 0); asymmetric,
/// scale = (max - min) / 255 and offset = -128 - min / scale (so min -> -128, max -> 127). A
/// group of zeros gets scale 1.
template <class T>
QuantScales choose_scales(const StridedView<const T, 2>& x, QuantGranularity g, bool symmetric) {
  const Index rows = x.size(0), cols = x.size(1);
  const Index n = detail::quant_count(g, rows, cols);
  std::vector<double> lo(static_cast<size_t>(n), std::numeric_limits<double>::infinity());
  std::vector<double> hi(static_cast<size_t>(n), -std::numeric_limits<double>::infinity());
  QuantScales s;
  s.granularity = g;
  for (Index r = 0; r < rows; ++r)
    for (Index c = 0; c < cols; ++c) {
      const size_t k = static_cast<size_t>(s.index(r, c));
      const double v = static_cast<double>(static_cast<float>(x(r, c)));
      lo[k] = std::min(lo[k], v);
      hi[k] = std::max(hi[k], v);
    }
  s.scale.resize(static_cast<size_t>(n));
  if (!symmetric) s.offset.resize(static_cast<size_t>(n));
  for (size_t k = 0; k < static_cast<size_t>(n); ++k) {
    if (symmetric) {
      const double amax = std::max(std::abs(lo[k]), std::abs(hi[k]));
      s.scale[k] = amax > 0 ? static_cast<float>(amax / 127.0) : 1.0f;
    } else {
      const double range = hi[k] - lo[k];
      s.scale[k] = range > 0 ? static_cast<float>(range / 255.0) : 1.0f;
      s.offset[k] = static_cast<float>(std::nearbyint(-128.0 - lo[k] / s.scale[k]));
    }
  }
  return s;
}

/// out = saturate(rne(x / scale + offset)), element-wise with the scales' granularity.
template <class T>
void quantize(const StridedView<const T, 2>& x, const QuantScales& s,
              const StridedView<std::int8_t, 2>& out) {
  constexpr const char* fn = "quantize";
  ATTNREF_CHECK(out.shape() == x.shape(), std::invalid_argument, fn, "out.shape", "mismatch",
                detail::shape_str(x), detail::shape_str(out));
  detail::check_scales(fn, s, x.size(0), x.size(1));
  for (Index r = 0; r < x.size(0); ++r)
    for (Index c = 0; c < x.size(1); ++c)
      out(r, c) = quantize_value(static_cast<float>(x(r, c)), s.scale_at(r, c), s.offset_at(r, c));
}

/// out = (q - offset) * scale, computed in float and rounded to T.
template <class T>
void dequantize(const StridedView<const std::int8_t, 2>& q, const QuantScales& s,
                const StridedView<T, 2>& out) {
  constexpr const char* fn = "dequantize";
  ATTNREF_CHECK(out.shape() == q.shape(), std::invalid_argument, fn, "out.shape", "mismatch",
                detail::shape_str(q), detail::shape_str(out));
  detail::check_scales(fn, s, q.size(0), q.size(1));
  for (Index r = 0; r < q.size(0); ++r)
    for (Index c = 0; c < q.size(1); ++c)
      out(r, c) = T((static_cast<float>(q(r, c)) - s.offset_at(r, c)) * s.scale_at(r, c));
}

/// Exact int32 dot product of two int8 vectors of n elements (|n| <= 2^17).
inline std::int32_t dot_i8(const std::int8_t* a, const std::int8_t* b, Index n) {
  std::int32_t acc = 0;
  Index i = 0;
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  if (detail::simd::level() != detail::simd::Level::Portable) {
    // Widen to int16, then madd: pairs of int16 products summed in int32 (exact; maddubs would
    // saturate on -128 * -128 pairs).
    __m256i sum = _mm256_setzero_si256();
    for (; i + 16 <= n; i += 16) {
      const __m256i va =
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
      const __m256i vb =
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
      sum = _mm256_add_epi32(sum, _mm256_madd_epi16(va, vb));
    }
    alignas(32) std::int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), sum);
    for (std::int32_t x : lanes) acc += x;
  }
#endif
  for (; i < n; ++i) acc += static_cast<std::int32_t>(a[i]) * static_cast<std::int32_t>(b[i]);
  return acc;
}

/// c[0..n) += alpha * v[0..n), exact in int32 (one row of an int8 P·V product).
inline void axpy_i8(std::int32_t* c, std::int8_t alpha, const std::int8_t* v, Index n) {
  if (alpha == 0) return;
  Index i = 0;
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  if (detail::simd::level() != detail::simd::Level::Portable) {
    const __m256i a = _mm256_set1_epi32(alpha);
    for (; i + 8 <= n; i += 8) {
      const __m256i vv =
          _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(v + i)));
      __m256i* dst = reinterpret_cast<__m256i*>(c + i);
      _mm256_storeu_si256(dst,
                          _mm256_add_epi32(_mm256_loadu_si256(dst), _mm256_mullo_epi32(vv, a)));
    }
  }
#endif
  for (; i < n; ++i) c[i] += static_cast<std::int32_t>(alpha) * static_cast<std::int32_t>(v[i]);
}

/// C[m, n] (+)= A[m, k] · B[n, k]ᵀ in int32 (Q·Kᵀ: rows of A and B contiguous along k).
inline void gemm_i8_nt(const StridedView<const std::int8_t, 2>& a,
                       const StridedView<const std::int8_t, 2>& b,
                       const StridedView<std::int32_t, 2>& c, bool accumulate = false) {
  constexpr const char* fn = "gemm_i8_nt";
  ATTNREF_CHECK(a.size(1) == b.size(1), std::invalid_argument, fn, "b.shape[1]",
                "mismatch with a.shape[1]", a.size(1), b.size(1));
  ATTNREF_CHECK(c.size(0) == a.size(0) && c.size(1) == b.size(0), std::invalid_argument, fn,
                "c.shape", "mismatch",
                "[" + std::to_string(a.size(0)) + ", " + std::to_string(b.size(0)) + "]",
                detail::shape_str(c));
  ATTNREF_CHECK(a.stride(1) == 1 && b.stride(1) == 1, std::invalid_argument, fn,
                "a.stride(1)/b.stride(1)", "not contiguous", "1",
                std::to_string(a.stride(1)) + " and " + std::to_string(b.stride(1)));
  for (Index i = 0; i < a.size(0); ++i)
    for (Index j = 0; j < b.size(0); ++j) {
      const std::int32_t d = dot_i8(a.ptr(i, 0), b.ptr(j, 0), a.size(1));
      c(i, j) = accumulate ? c(i, j) + d : d;
    }
}

/// C[m, n] (+)= P[m, k] · V[k, n] in int32 (P·V: rows of V and C contiguous along n).
inline void gemm_i8_nn(const StridedView<const std::int8_t, 2>& p,
                       const StridedView<const std::int8_t, 2>& v,
                       const StridedView<std::int32_t, 2>& c, bool accumulate = false) {
  constexpr const char* fn = "gemm_i8_nn";
  ATTNREF_CHECK(p.size(1) == v.size(0), std::invalid_argument, fn, "v.shape[0]",
                "mismatch with p.shape[1]", p.size(1), v.size(0));
  ATTNREF_CHECK(c.size(0) == p.size(0) && c.size(1) == v.size(1), std::invalid_argument, fn,
                "c.shape", "mismatch",
                "[" + std::to_string(p.size(0)) + ", " + std::to_string(v.size(1)) + "]",
                detail::shape_str(c));
  ATTNREF_CHECK(v.stride(1) == 1 && c.stride(1) == 1, std::invalid_argument, fn,
                "v.stride(1)/c.stride(1)", "not contiguous", "1",
                std::to_string(v.stride(1)) + " and " + std::to_string(c.stride(1)));
  for (Index i = 0; i < p.size(0); ++i) {
    std::int32_t* row = c.ptr(i, 0);
    if (!accumulate) std::fill(row, row + c.size(1), 0);
    for (Index k = 0; k < p.size(1); ++k) axpy_i8(row, p(i, k), v.ptr(k, 0), v.size(1));
  }
}

}  // namespace attnref
