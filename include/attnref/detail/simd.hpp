#pragma once
/// Hand-vectorised helpers with a portable fallback.
///
/// The SIMD code is compiled in only when the translation unit targets the instruction set
/// (e.g. -march=native; attnref never adds flags itself) and the level in use is selectable at
/// run time, so the tests run every compiled level and the portable path:
///   Level::Portable  Eigen GEMMs, Eigen's exp and scalar/Eigen conversions only;
///   Level::Avx2      AVX2 + FMA + F16C kernels (8 lanes) and conversions;
///   Level::Avx512    AVX-512F kernels (16 lanes).
/// The kernels: the small-row ones of simd_rows.hpp (decode), the panel ones of simd_panel.hpp
/// (prefill) and the softmax rows of simd_exp.hpp. Conversions fp16/bf16 -> float give the same
/// bits at every level; the kernels sum in a level-dependent order (each level is deterministic
/// and thread-count independent).

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "attnref/core/types.hpp"

#if defined(__AVX2__) || defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

/// The vector traits' one-instruction members are always inlined, also at -O0 (the sanitizer
/// build), where each would otherwise be a call around a single instruction.
#if defined(__GNUC__)
#define ATTNREF_SIMD_OP __attribute__((always_inline))
#else
#define ATTNREF_SIMD_OP
#endif

/// The decode dot-product kernel is inlined into its caller in optimised builds: called out of
/// line (g++ 12 declines to inline it into the out-of-line small_scores of kernels.hpp), it
/// passes its key pointers through memory on every call, and decode/f32/B:8 ran ~9 % slower
/// (AMD EPYC Zen 3). At -O0 it stays a call, which keeps the sanitizer build small.
#if defined(__GNUC__) && defined(__OPTIMIZE__)
#define ATTNREF_HOT_KERNEL __attribute__((always_inline))
#else
#define ATTNREF_HOT_KERNEL
#endif

namespace attnref::detail::simd {

enum class Level { Portable = 0, Avx2 = 1, Avx512 = 2 };

inline const char* to_string(Level l) {
  switch (l) {
    case Level::Portable:
      return "portable";
    case Level::Avx2:
      return "avx2";
    case Level::Avx512:
      return "avx512";
  }
  return "?";
}

/// Highest level compiled into this translation unit.
constexpr Level compiled_level() {
#if defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  return Level::Avx512;
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  return Level::Avx2;
#else
  return Level::Portable;
#endif
}

inline std::atomic<int>& level_flag() {
  static std::atomic<int> flag{static_cast<int>(compiled_level())};
  return flag;
}

/// Level in use (never above the compiled one).
inline Level level() { return static_cast<Level>(level_flag().load(std::memory_order_relaxed)); }

/// Selects the level (clamped to the compiled one); returns the previous level.
inline Level set_level(Level l) {
  const int v = std::min(static_cast<int>(l), static_cast<int>(compiled_level()));
  return static_cast<Level>(level_flag().exchange(v));
}

/// True when any hand-vectorised path is in use.
inline bool enabled() { return level() != Level::Portable; }

// ------------------------------------------------------------------------------------------
// Vector traits: one small struct per instruction set, used by the kernels below.

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
struct V8 {
  using reg = __m256;
  static constexpr int kWidth = 8;
  ATTNREF_SIMD_OP static reg zero() { return _mm256_setzero_ps(); }
  ATTNREF_SIMD_OP static reg set1(float x) { return _mm256_set1_ps(x); }
  ATTNREF_SIMD_OP static reg load(const float* p) { return _mm256_loadu_ps(p); }
  ATTNREF_SIMD_OP static reg load(const half* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  ATTNREF_SIMD_OP static reg load(const bfloat16* p) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
  }
  ATTNREF_SIMD_OP static reg load(const std::int8_t* p) {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  ATTNREF_SIMD_OP static void store(float* p, reg v) { _mm256_storeu_ps(p, v); }
  ATTNREF_SIMD_OP static reg fmadd(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  ATTNREF_SIMD_OP static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  ATTNREF_SIMD_OP static reg sub(reg a, reg b) { return _mm256_sub_ps(a, b); }
  ATTNREF_SIMD_OP static reg max(reg a, reg b) { return _mm256_max_ps(a, b); }
  ATTNREF_SIMD_OP static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  ATTNREF_SIMD_OP static reg fnmadd(reg a, reg b, reg c) { return _mm256_fnmadd_ps(a, b, c); }
  ATTNREF_SIMD_OP static reg round(reg a) {  // to the nearest integer, ties to even
    return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  ATTNREF_SIMD_OP static reg min(reg a, reg b) { return _mm256_min_ps(a, b); }
  ATTNREF_SIMD_OP static reg div(reg a, reg b) { return _mm256_div_ps(a, b); }
  ATTNREF_SIMD_OP static reg round_half(reg a) {  // to fp16 precision, nearest even
    return _mm256_cvtph_ps(_mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
  }
  ATTNREF_SIMD_OP static float sum(reg v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
  }
  /// The four sums of a, b, c, d, stored to out[0..3] (three horizontal adds for the four).
  ATTNREF_SIMD_OP static void sum4(reg a, reg b, reg c, reg d, float* out) {
    const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1)));
  }
};
#endif

#if defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
struct V16 {
  using reg = __m512;
  static constexpr int kWidth = 16;
  ATTNREF_SIMD_OP static reg zero() { return _mm512_setzero_ps(); }
  ATTNREF_SIMD_OP static reg set1(float x) { return _mm512_set1_ps(x); }
  ATTNREF_SIMD_OP static reg load(const float* p) { return _mm512_loadu_ps(p); }
  ATTNREF_SIMD_OP static reg load(const half* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  ATTNREF_SIMD_OP static reg load(const bfloat16* p) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
  }
  ATTNREF_SIMD_OP static reg load(const std::int8_t* p) {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  ATTNREF_SIMD_OP static void store(float* p, reg v) { _mm512_storeu_ps(p, v); }
  ATTNREF_SIMD_OP static reg fmadd(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  ATTNREF_SIMD_OP static reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  ATTNREF_SIMD_OP static reg sub(reg a, reg b) { return _mm512_sub_ps(a, b); }
  ATTNREF_SIMD_OP static reg max(reg a, reg b) { return _mm512_max_ps(a, b); }
  ATTNREF_SIMD_OP static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  ATTNREF_SIMD_OP static reg fnmadd(reg a, reg b, reg c) { return _mm512_fnmadd_ps(a, b, c); }
  ATTNREF_SIMD_OP static reg round(reg a) {
    return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  ATTNREF_SIMD_OP static reg min(reg a, reg b) { return _mm512_min_ps(a, b); }
  ATTNREF_SIMD_OP static reg div(reg a, reg b) { return _mm512_div_ps(a, b); }
  ATTNREF_SIMD_OP static reg round_half(reg a) {
    return _mm512_cvtph_ps(_mm512_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
  }
  ATTNREF_SIMD_OP static float sum(reg v) {
    const __m256 lo = _mm512_castps512_ps256(v);
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    return V8::sum(_mm256_add_ps(lo, hi));
  }
  /// The four sums of a, b, c, d, stored to out[0..3]: pairs interleaved and added within each
  /// 128-bit lane (a, b, c, d then share every lane), then the four lanes added: one-cycle
  /// shuffles only, where V8::sum4's horizontal adds take several µops each.
  ATTNREF_SIMD_OP static void sum4(reg a, reg b, reg c, reg d, float* out) {
    const reg ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    const reg cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    const reg abcd = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 h =
        _mm256_add_ps(_mm512_castps512_ps256(abcd),
                      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(abcd), 1)));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
  }
};
#endif

/// Calls f(V{}) with the vector traits of the level in use; returns false (and does nothing)
/// at Level::Portable.
template <class F>
inline bool with_vector(Level l, F&& f) {
#if defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  if (l == Level::Avx512) {
    f(V16{});
    return true;
  }
#endif
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  if (l != Level::Portable) {
    f(V8{});
    return true;
  }
#endif
  (void)l;
  (void)f;
  return false;
}

// ------------------------------------------------------------------------------------------
// Conversions (exact at every level).

/// fp16 / bf16 / int8 (or float) -> float, n elements, with the vector traits V (a kernel that
/// already runs at one level).
template <class V, class T>
inline void to_float(V, const T* src, Index n, float* dst) {
  Index i = 0;
  for (; i + V::kWidth <= n; i += V::kWidth) V::store(dst + i, V::load(src + i));
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

/// fp16 / bf16 / int8 -> float, n elements.
template <class T>
inline void to_float(const T* src, Index n, float* dst) {
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  if (level() != Level::Portable) return to_float(V8{}, src, n, dst);
#endif
  for (Index i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

/// x[i] = float(half(x[i])): rounds n floats to fp16 precision in place (round to nearest
/// even, overflow to inf), the same bits at every level.
inline void round_to_half(float* x, Index n) {
  Index i = 0;
  with_vector(level(), [&](auto vec) {
    using V = decltype(vec);
    for (; i + V::kWidth <= n; i += V::kWidth) V::store(x + i, V::round_half(V::load(x + i)));
  });
  for (; i < n; ++i) x[i] = static_cast<float>(half(x[i]));
}

/// x[i] = float(bfloat16(x[i])): rounds n floats to bf16 precision in place, as Eigen's
/// conversion does (round to nearest even on the bits, overflow to inf, a NaN to the quiet NaN
/// of its sign), the same bits at every level.
inline void round_to_bfloat16(float* x, Index n) {
  Index i = 0;
#if defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  if (level() == Level::Avx512) {
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
    const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
    const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
    const __m512i qnan = _mm512_set1_epi32(0x7fc00000);
    for (; i + 16 <= n; i += 16) {
      const __m512 v = _mm512_loadu_ps(x + i);
      const __m512i b = _mm512_castps_si512(v);
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), one);
      __m512i r = _mm512_and_si512(_mm512_add_epi32(b, _mm512_add_epi32(lsb, bias)), high);
      const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
      r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_and_si512(b, sign), qnan));
      _mm512_storeu_ps(x + i, _mm512_castsi512_ps(r));
    }
  }
#endif
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  if (level() != Level::Portable) {
    const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
    const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
    const __m256i sign = _mm256_set1_epi32(static_cast<int>(0x80000000u));
    const __m256i qnan = _mm256_set1_epi32(0x7fc00000);
    for (; i + 8 <= n; i += 8) {
      const __m256 v = _mm256_loadu_ps(x + i);
      const __m256i b = _mm256_castps_si256(v);
      const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), one);
      const __m256i r = _mm256_and_si256(_mm256_add_epi32(b, _mm256_add_epi32(lsb, bias)), high);
      const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
      const __m256i q = _mm256_or_si256(_mm256_and_si256(b, sign), qnan);
      _mm256_storeu_ps(x + i,
                       _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(q), nan));
    }
  }
#endif
  for (; i < n; ++i) x[i] = static_cast<float>(bfloat16(x[i]));
}

/// x[i] = float(half(x[i] * a)): one float multiply, then rounding to fp16, in place; with b,
/// the result multiplied by b and rounded again (one pass for the two steps). The same bits at
/// every level.
inline void mul_round_to_half(float* x, Index n, float a, const float* b = nullptr) {
  Index i = 0;
  with_vector(level(), [&](auto vec) {
    using V = decltype(vec);
    const typename V::reg va = V::set1(a), vb = V::set1(b ? *b : 1.0f);
    for (; i + V::kWidth <= n; i += V::kWidth) {
      typename V::reg v = V::round_half(V::mul(V::load(x + i), va));
      if (b) v = V::round_half(V::mul(v, vb));
      V::store(x + i, v);
    }
  });
  for (; i < n; ++i) {
    x[i] = static_cast<float>(half(x[i] * a));
    if (b) x[i] = static_cast<float>(half(x[i] * *b));
  }
}

/// dst[i] = half(src[i] * mul), round to nearest even (the same bits at every level).
inline void to_half(const float* src, float mul, Index n, half* dst) {
  Index i = 0;
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  if (level() != Level::Portable) {
    const __m256 vm = _mm256_set1_ps(mul);
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128(
          reinterpret_cast<__m128i*>(dst + i),
          _mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(src + i), vm), _MM_FROUND_TO_NEAREST_INT));
  }
#endif
  for (; i < n; ++i) dst[i] = half(src[i] * mul);
}

/// Rounds x[0..n) to fp16 in place and returns their sum and maximum (n >= 1). The sum is taken
/// in eight float lanes (element i in lane i % 8, the last n % 8 elements added in order after
/// the lanes are combined as ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))): the same bits at
/// every level.
inline void round_to_half_sum_max(float* x, Index n, float& sum, float& max) {
  Index i = 0;
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  float mx = -std::numeric_limits<float>::infinity();
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  if (level() != Level::Portable) {
    __m256 vs = _mm256_setzero_ps();
    __m256 vm = _mm256_set1_ps(mx);
    for (; i + 8 <= n; i += 8) {
      const __m256 v =
          _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
      _mm256_storeu_ps(x + i, v);
      vs = _mm256_add_ps(vs, v);
      vm = _mm256_max_ps(vm, v);
    }
    _mm256_storeu_ps(lanes, vs);
    alignas(32) float m8[8];
    _mm256_store_ps(m8, vm);
    for (float m : m8) mx = std::max(mx, m);
  }
#endif
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) {
      const float v = static_cast<float>(half(x[i + l]));
      x[i + l] = v;
      lanes[l] += v;
      mx = std::max(mx, v);
    }
  float s = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) +
            ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
  for (; i < n; ++i) {
    const float v = static_cast<float>(half(x[i]));
    x[i] = v;
    s += v;
    mx = std::max(mx, v);
  }
  sum = s;
  max = mx;
}

/// x[i] = clamp(rint(q), lo, hi) with q = x[i] / d when `divide`, else x[i] * d (IEEE division
/// or product), round half to even; with kHalf, q is rounded to fp16 (nearest even) first. The
/// same bits at every level.
template <bool kHalf>
inline void rint_clamp_steps(float* x, Index n, float d, bool divide, float lo, float hi) {
  Index i = 0;
  with_vector(level(), [&](auto vec) {
    using V = decltype(vec);
    const typename V::reg vd = V::set1(d), vlo = V::set1(lo), vhi = V::set1(hi);
    for (; i + V::kWidth <= n; i += V::kWidth) {
      const typename V::reg v = V::load(x + i);
      typename V::reg q = divide ? V::div(v, vd) : V::mul(v, vd);
      if constexpr (kHalf) q = V::round_half(q);
      V::store(x + i, V::min(V::max(V::round(q), vlo), vhi));
    }
  });
  for (; i < n; ++i) {
    float q = divide ? x[i] / d : x[i] * d;
    if constexpr (kHalf) q = static_cast<float>(half(q));
    x[i] = std::min(std::max(std::nearbyint(q), lo), hi);
  }
}

/// x[i] = clamp(rint(x[i] / d), lo, hi) when `divide`, else with x[i] * d.
inline void rint_clamp(float* x, Index n, float d, bool divide, float lo, float hi) {
  rint_clamp_steps<false>(x, n, d, divide, lo, hi);
}

/// x[i] = clamp(rint(float(half(x[i] / d))), lo, hi) when `divide`, else with x[i] * d: the
/// quotient or product rounded to fp16 first.
inline void half_rint_clamp(float* x, Index n, float d, bool divide, float lo, float hi) {
  rint_clamp_steps<true>(x, n, d, divide, lo, hi);
}

}  // namespace attnref::detail::simd
