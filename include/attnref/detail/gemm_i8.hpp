#pragma once
/// int8 GEMM of the engine's quantized path: C = A · B with A and B holding int8 values and the
/// products summed exactly in int32 (AVX-512 VNNI `vpdpbusd`), stored as float (exact: the
/// callers' sums stay below 2^24). Used when the build has AVX-512 VNNI and the runtime level is
/// Avx512; otherwise the engine's float GEMM computes the same exact values.
///
/// vpdpbusd multiplies unsigned by signed bytes, so A is stored offset by +128 (u8) and the
/// result corrected: Σ_k A·B = Σ_k (A + 128)·B − 128 · Σ_k B[k][n].
///
/// Layouts: A: rows of `k4 * 4` bytes (u8, A + 128; entries past the real k hold 128 and meet
/// zero rows of B); B packed as [k4][n_pad][4] (4 consecutive k of one column n together;
/// n_pad a multiple of 16, padding zero); corr[n] = 128 · Σ_k B[k][n] (int32, n_pad entries).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "attnref/core/types.hpp"
#include "attnref/detail/simd.hpp"
#include "attnref/detail/simd_panel.hpp"

namespace attnref::detail::i8 {

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && \
    defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define ATTNREF_HAVE_VNNI 1
#else
#define ATTNREF_HAVE_VNNI 0
#endif

/// True when the VNNI kernels are compiled in and the runtime level allows them.
inline bool enabled() {
#if ATTNREF_HAVE_VNNI
  return simd::level() == simd::Level::Avx512;
#else
  return false;
#endif
}

inline Index round_up(Index x, Index m) { return (x + m - 1) / m * m; }

/// corr[n] = 128 · Σ_k B[k][n] over the packed B (n_pad entries).
inline void column_corrections(const std::int8_t* bp, Index n_pad, Index k4, std::int32_t* corr) {
#if ATTNREF_HAVE_VNNI
  const __m512i ones = _mm512_set1_epi32(static_cast<int>(0x80808080u));  // 128 in every byte
  for (Index n = 0; n < n_pad; n += 16) {
    __m512i acc = _mm512_setzero_si512();
    for (Index q = 0; q < k4; ++q)
      acc = _mm512_dpbusd_epi32(
          acc, ones, _mm512_loadu_si512(reinterpret_cast<const void*>(bp + (q * n_pad + n) * 4)));
    _mm512_storeu_si512(reinterpret_cast<void*>(corr + n), acc);
  }
#else
  for (Index n = 0; n < n_pad; ++n) {
    std::int32_t c = 0;
    for (Index q = 0; q < k4; ++q)
      for (int t = 0; t < 4; ++t) c += bp[(q * n_pad + n) * 4 + t];
    corr[n] = 128 * c;
  }
#endif
}

/// Packs B[k][n] = row(k)[n] (k < k_len, n < n_len; int8 rows with unit stride, e.g. V with one
/// row per key) into the [k4][n_pad][4] layout and fills corr.
inline void pack_rows(const std::int8_t* const* row, Index row_offset, Index k_len, Index n_len,
                      Index n_pad, std::int8_t* bp, std::int32_t* corr) {
  const Index k4 = (k_len + 3) / 4;
  for (Index q = 0; q < k4; ++q) {
    const std::int8_t* r[4];
    for (int t = 0; t < 4; ++t) r[t] = 4 * q + t < k_len ? row[4 * q + t] + row_offset : nullptr;
    std::int8_t* dst = bp + q * n_pad * 4;
    Index n = 0;
#if ATTNREF_HAVE_VNNI
    alignas(16) static const std::int8_t zeros[16] = {};
    for (; n + 16 <= n_len; n += 16) {  // interleave 16 columns of the 4 rows
      __m128i v[4];
      for (int t = 0; t < 4; ++t)
        v[t] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r[t] ? r[t] + n : zeros));
      const __m128i ab_lo = _mm_unpacklo_epi8(v[0], v[1]), ab_hi = _mm_unpackhi_epi8(v[0], v[1]);
      const __m128i cd_lo = _mm_unpacklo_epi8(v[2], v[3]), cd_hi = _mm_unpackhi_epi8(v[2], v[3]);
      __m128i* d = reinterpret_cast<__m128i*>(dst + n * 4);
      _mm_storeu_si128(d, _mm_unpacklo_epi16(ab_lo, cd_lo));
      _mm_storeu_si128(d + 1, _mm_unpackhi_epi16(ab_lo, cd_lo));
      _mm_storeu_si128(d + 2, _mm_unpacklo_epi16(ab_hi, cd_hi));
      _mm_storeu_si128(d + 3, _mm_unpackhi_epi16(ab_hi, cd_hi));
    }
#endif
    for (; n < n_pad; ++n)
      for (int t = 0; t < 4; ++t) dst[n * 4 + t] = r[t] && n < n_len ? r[t][n] : std::int8_t{0};
  }
  column_corrections(bp, n_pad, k4, corr);
}

/// Packs B[k][n] = col(n)[k] (Kᵀ: one int8 row per key n, k its element index; k_len a multiple
/// of 4) into [k4][n_pad][4] and fills corr.
inline void pack_cols(const std::int8_t* const* col, Index col_offset, Index k_len, Index n_len,
                      Index n_pad, std::int8_t* bp, std::int32_t* corr) {
  const Index k4 = k_len / 4;
  Index n0 = 0;
#if ATTNREF_HAVE_VNNI
  // 16 keys x 16 groups of 4 bytes at a time: a 16 x 16 transpose of 32-bit lanes (moved as
  // floats, bit for bit). (The copy a group at a time took 4 % of quant/self_attention.)
  for (; n0 + 16 <= n_len; n0 += 16) {
    Index q = 0;
    for (; q + 16 <= k4; q += 16) {
      __m512 r[16];
      for (int i = 0; i < 16; ++i)
        r[i] = _mm512_loadu_ps(reinterpret_cast<const float*>(col[n0 + i] + col_offset + q * 4));
      simd::transpose(simd::V16{}, r);  // r[j]: group q + j of the 16 keys
      for (int j = 0; j < 16; ++j)
        _mm512_storeu_ps(reinterpret_cast<float*>(bp + ((q + j) * n_pad + n0) * 4), r[j]);
    }
    for (; q < k4; ++q)
      for (Index n = n0; n < n0 + 16; ++n)
        std::memcpy(bp + (q * n_pad + n) * 4, col[n] + col_offset + q * 4, 4);
  }
#endif
  for (Index n = n0; n < n_pad; ++n) {
    if (n < n_len) {
      const std::int8_t* src = col[n] + col_offset;
      for (Index q = 0; q < k4; ++q) std::memcpy(bp + (q * n_pad + n) * 4, src + q * 4, 4);
    } else {
      for (Index q = 0; q < k4; ++q) std::memset(bp + (q * n_pad + n) * 4, 0, 4);
    }
  }
  column_corrections(bp, n_pad, k4, corr);
}

/// dst[i] = u8(int(src[i]) + 128) for integer-valued floats in [-128, 127].
inline void to_u8_offset(const float* src, Index n, std::uint8_t* dst) {
  Index i = 0;
#if ATTNREF_HAVE_VNNI
  const __m512i off = _mm512_set1_epi32(128);
  for (; i + 16 <= n; i += 16)
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(dst + i),
        _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(_mm512_loadu_ps(src + i)), off)));
#endif
  for (; i < n; ++i) dst[i] = static_cast<std::uint8_t>(static_cast<int>(src[i]) + 128);
}

#if ATTNREF_HAVE_VNNI
/// acc += the products of a's u8 and b's s8 bytes, four to a lane. From the intrinsic, g++ 12 at
/// -O3 copies each accumulator of a full register block to another register and back around
/// the instruction, and spills about half of the block; the asm operand ties it to one
/// register. (clang keeps the intrinsic's accumulator in place.)
inline void dpbusd(__m512i& acc, __m512i a, __m512i b) {
#if defined(__GNUC__) && !defined(__clang__)
  asm("vpdpbusd {%2, %1, %0|%0, %1, %2}" : "+v"(acc) : "v"(a), "vm"(b));
#else
  acc = _mm512_dpbusd_epi32(acc, a, b);
#endif
}

/// The first min(left, 16) lanes.
inline __mmask16 lanes(Index left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
}

/// One k step of an R x NB block: acc[I] += a(row I / NB) · b(vector I % NB), I < R·NB.
template <int NB, int... I>
inline void kernel_step(std::integer_sequence<int, I...>, __m512i (&acc)[sizeof...(I)],
                        const std::uint8_t* a, Index lda, const std::int8_t* b) {
  const auto row = [&](int r) {
    std::int32_t a4;
    std::memcpy(&a4, a + r * lda, 4);
    return _mm512_set1_epi32(a4);
  };
  (dpbusd(acc[I], row(I / NB),
          _mm512_loadu_si512(reinterpret_cast<const void*>(b + 64 * (I % NB)))),
   ...);
}

/// R rows x NB 16-column vectors of C, k4 steps. Every accumulator is named by a constant index
/// (the sequence I), in the stores too: with loops over the block, or a lambda in the stores,
/// g++ 12 kept the block in a stack array. (With dpbusd's asm, pfa/int8/dense/S:2048 went from
/// 281 to 167 ms on one thread, AMD Zen 5.)
template <int R, int NB, int... I>
inline void kernel_block(std::integer_sequence<int, I...> seq, const std::uint8_t* a, Index lda,
                         const std::int8_t* bp, Index n_pad, Index k4, const std::int32_t* corr,
                         float* c, Index ldc, Index n_left) {
  __m512i acc[R * NB] = {((void)I, _mm512_setzero_si512())...};
  for (Index q = 0; q < k4; ++q) kernel_step<NB>(seq, acc, a + q * 4, lda, bp + q * n_pad * 4);
  (_mm512_mask_storeu_ps(
       c + (I / NB) * ldc + 16 * (I % NB), lanes(n_left - 16 * (I % NB)),
       _mm512_cvtepi32_ps(_mm512_sub_epi32(
           acc[I], _mm512_loadu_si512(reinterpret_cast<const void*>(corr + 16 * (I % NB)))))),
   ...);
}

template <int R, int NB>
inline void kernel(const std::uint8_t* a, Index lda, const std::int8_t* bp, Index n_pad, Index k4,
                   const std::int32_t* corr, float* c, Index ldc, Index n_left) {
  kernel_block<R, NB>(std::make_integer_sequence<int, R * NB>{}, a, lda, bp, n_pad, k4, corr, c,
                      ldc, n_left);
}

template <int NB>
inline void rows_dispatch(Index rows, const std::uint8_t* a, Index lda, const std::int8_t* bp,
                          Index n_pad, Index k4, const std::int32_t* corr, float* c, Index ldc,
                          Index n_left) {
  constexpr int kR = 6;
  Index r = 0;
  for (; r + kR <= rows; r += kR)
    kernel<kR, NB>(a + r * lda, lda, bp, n_pad, k4, corr, c + r * ldc, ldc, n_left);
  switch (rows - r) {
    case 5:
      kernel<5, NB>(a + r * lda, lda, bp, n_pad, k4, corr, c + r * ldc, ldc, n_left);
      break;
    case 4:
      kernel<4, NB>(a + r * lda, lda, bp, n_pad, k4, corr, c + r * ldc, ldc, n_left);
      break;
    case 3:
      kernel<3, NB>(a + r * lda, lda, bp, n_pad, k4, corr, c + r * ldc, ldc, n_left);
      break;
    case 2:
      kernel<2, NB>(a + r * lda, lda, bp, n_pad, k4, corr, c + r * ldc, ldc, n_left);
      break;
    case 1:
      kernel<1, NB>(a + r * lda, lda, bp, n_pad, k4, corr, c + r * ldc, ldc, n_left);
      break;
    default:
      break;
  }
}
#endif

/// C[r][n] = Σ_k (a[r][k] − 128) · B[k][n] as float, r < rows, n < n_len (C row stride ldc).
inline void gemm(const std::uint8_t* a, Index lda, Index rows, const std::int8_t* bp, Index n_pad,
                 Index k4, const std::int32_t* corr, Index n_len, float* c, Index ldc) {
#if ATTNREF_HAVE_VNNI
  for (Index n0 = 0; n0 < n_len; n0 += 64) {
    const Index nb = std::min<Index>(4, (n_len - n0 + 15) / 16);
    const std::int8_t* b = bp + n0 * 4;
    const Index left = n_len - n0;
    switch (nb) {
      case 4:
        rows_dispatch<4>(rows, a, lda, b, n_pad, k4, corr + n0, c + n0, ldc, left);
        break;
      case 3:
        rows_dispatch<3>(rows, a, lda, b, n_pad, k4, corr + n0, c + n0, ldc, left);
        break;
      case 2:
        rows_dispatch<2>(rows, a, lda, b, n_pad, k4, corr + n0, c + n0, ldc, left);
        break;
      default:
        rows_dispatch<1>(rows, a, lda, b, n_pad, k4, corr + n0, c + n0, ldc, left);
        break;
    }
  }
#else  // portable (the engine calls these kernels only when enabled(); kept complete anyway)
  for (Index r = 0; r < rows; ++r)
    for (Index n = 0; n < n_len; ++n) {
      std::int32_t acc = 0;
      for (Index q = 0; q < k4; ++q)
        for (int t = 0; t < 4; ++t)
          acc += static_cast<std::int32_t>(a[r * lda + q * 4 + t]) * bp[(q * n_pad + n) * 4 + t];
      c[r * ldc + n] = static_cast<float>(acc - corr[n]);
    }
#endif
}

}  // namespace attnref::detail::i8
