#pragma once
/// Register-blocked float kernels for row blocks above the small-row size (prefill): Q·Kᵀ on a
/// key panel packed once per kv tile and head (the keys transposed in blocks of one vector of
/// keys, so a score block is a sum of broadcast-q × key-vector products with no horizontal
/// reduction), and P·V on the tile's value rows, adjacent in memory, with a block of each
/// output row in registers across the keys. Compute type float; compiled in with the vector traits
/// of simd.hpp, which select the level at run time (Level::Portable never calls these).

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "attnref/core/types.hpp"
#include "attnref/detail/simd.hpp"
#include "attnref/detail/simd_rows.hpp"

namespace attnref::detail::simd {

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
/// r[j] <- column j of the 8 x 8 block r[0..8).
inline void transpose(V8, __m256 (&r)[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}
#endif

#if defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
/// r[j] <- column j of the 16 x 16 block r[0..16).
inline void transpose(V16, __m512 (&r)[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {  // pairs of rows interleaved by element
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // quadruples of rows interleaved by element pair
    const auto pd = [](__m512 x) { return _mm512_castps_pd(x); };
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(t[i]), pd(t[i + 2])));
    r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t[i]), pd(t[i + 2])));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(t[i + 1]), pd(t[i + 3])));
    r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t[i + 1]), pd(t[i + 3])));
  }
  // Now r[4a + b] holds, in 128-bit lane l, elements 4l + b of rows 4a .. 4a + 3.
  for (int a = 0; a < 4; ++a) {  // lanes (0, 2) and (1, 3) of quadruples a and a + 4 ...
    t[a] = _mm512_shuffle_f32x4(r[a], r[a + 4], 0x88);
    t[a + 4] = _mm512_shuffle_f32x4(r[a], r[a + 4], 0xdd);
    t[a + 8] = _mm512_shuffle_f32x4(r[a + 8], r[a + 12], 0x88);
    t[a + 12] = _mm512_shuffle_f32x4(r[a + 8], r[a + 12], 0xdd);
  }
  for (int a = 0; a < 8; ++a) {  // ... then gathered across the two halves
    r[a] = _mm512_shuffle_f32x4(t[a], t[a + 8], 0x88);
    r[a + 8] = _mm512_shuffle_f32x4(t[a], t[a + 8], 0xdd);
  }
}
#endif

/// Packs keys [0, cols) transposed, in blocks of W = V::kWidth keys: panel[(b·n + d)·W + i] is
/// element d of key b·W + i (row_of(c): its n contiguous elements, converted to float exactly);
/// keys past `cols` in the last block are zero. The panel holds ceil(cols / W)·n·W floats.
/// (lane_scores packs q's rows, at most W, the same way.)
template <class V, class RowOf>
inline void pack_keys(const RowOf& row_of, Index cols, Index n, float* panel) {
  constexpr int W = V::kWidth;
  for (Index b = 0; b * W < cols; ++b) {
    const Index keys = std::min<Index>(W, cols - b * W);
    float* dst = panel + b * n * W;
    Index d = 0;
    for (; d + W <= n; d += W) {
      typename V::reg r[W];
      for (int i = 0; i < W; ++i) r[i] = i < keys ? V::load(row_of(b * W + i) + d) : V::zero();
      transpose(V{}, r);
      for (int j = 0; j < W; ++j) V::store(dst + (d + j) * W, r[j]);
    }
    for (; d < n; ++d)
      for (Index i = 0; i < W; ++i)
        dst[d * W + i] = i < keys ? static_cast<float>(row_of(b * W + i)[d]) : 0.0f;
  }
}

/// s[r·lds + k·W + i] = sum_d q[r·ldq + d] · panel[(k·n + d)·W + i], r < MR, k < NV, i < W:
/// one MR x (NV·W) block of scores, the sum over d in order (one fused multiply-add per d);
/// `ahead` steps once per d.
template <class V, int MR, int NV>
inline void panel_dot(const float* q, Index ldq, const float* panel, Index n, float* s, Index lds,
                      LineStream& ahead) {
  constexpr int W = V::kWidth;
  typename V::reg acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int k = 0; k < NV; ++k) acc[r][k] = V::zero();
  for (Index d = 0; d < n; ++d) {
    ahead.step();
    typename V::reg b[NV];
    for (int k = 0; k < NV; ++k) b[k] = V::load(panel + (k * n + d) * W);
    for (int r = 0; r < MR; ++r) {
      const typename V::reg a = V::set1(q[r * ldq + d]);
      for (int k = 0; k < NV; ++k) acc[r][k] = V::fmadd(a, b[k], acc[r][k]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int k = 0; k < NV; ++k) V::store(s + r * lds + k * W, acc[r][k]);
}

/// Register block of the panel kernels: MR rows by NV vectors (24 accumulators of 32 registers
/// with 16 lanes, 12 of 16 with 8).
template <class V>
struct PanelShape {
  static constexpr int kRows = 6;
  static constexpr int kVectors = V::kWidth == 16 ? 4 : 2;
};

/// Runtime (rows, vectors) of a block edge -> f(integral_constant MR, integral_constant NV).
template <int MR, int NV, class F>
inline void with_block(Index rows, Index vectors, F&& f) {
  if constexpr (MR > 1)
    if (rows < MR) return with_block<MR - 1, NV>(rows, vectors, f);
  if constexpr (NV > 1)
    if (vectors < NV) return with_block<MR, NV - 1>(rows, vectors, f);
  f(std::integral_constant<int, MR>{}, std::integral_constant<int, NV>{});
}

/// S = Q·Kᵀ for `rows` rows of q (stride ldq, n elements) and the `cols` keys of a panel from
/// pack_keys: columns [0, ceil(cols / W)·W) of s (stride lds) are written (those past cols with
/// scores of the zero padding). Column blocks outside, so each block of the panel stays in the
/// first-level cache while every row block reads it. `ahead`: lines to fetch meanwhile.
template <class V>
inline void panel_scores(const float* q, Index ldq, Index rows, const float* panel, Index cols,
                         Index n, float* s, Index lds, LineStream ahead = {}) {
  constexpr int W = V::kWidth, MR = PanelShape<V>::kRows, NV = PanelShape<V>::kVectors;
  const Index blocks = (cols + W - 1) / W;
  for (Index b = 0; b < blocks; b += NV)
    for (Index r = 0; r < rows; r += MR)
      with_block<MR, NV>(rows - r, blocks - b, [&](auto R, auto K) {
        panel_dot<V, R(), K()>(q + r * ldq, ldq, panel + b * n * W, n, s + r * lds + b * W, lds,
                               ahead);
      });
}

/// Row stride, in floats, of lane_scores' key buffer, for keys of up to kLaneMaxN elements. A
/// compile-time constant, so the W broadcasts of a step address one base register: with the
/// head size as the stride, the W row pointers spilled out of the general registers (fp16 keys
/// in the L2 cache, 16 rows, D 192: 190 -> 157 GFLOPS, AMD Zen 5). 1024 + 16: consecutive rows
/// one line apart in the cache sets.
inline constexpr Index kLaneStride = 1040;
inline constexpr Index kLaneMaxN = 1024;

/// S = Q·Kᵀ with the rows of q in the vector lanes (rows <= W; qt: q's rows packed by pack_keys,
/// qt[d·W + r] = q[r][d], 0 in the other lanes): for each
/// block of W keys, the keys converted to float into kbuf (W rows of stride kLaneStride), then
/// per d one load of qt and W fused multiply-adds of a broadcast key element, and the W x W
/// block transposed into the rows of s (stride lds). Columns [0, ceil(cols / W)·W) are written,
/// those past cols with zero scores. Every score is the sum over d in order, one fused
/// multiply-add per d from zero, as panel_dot's: the same bits as pack_keys + panel_scores,
/// without transposing the keys (a decode step of a large query group, 9-16 rows: the packing
/// was a sixth of nsa/compress_attention). `ahead` steps once per d of every block.
template <class V, class RowOf>
inline void lane_scores(const float* qt, Index rows, const RowOf& row_of, Index cols, Index n,
                        float* kbuf, float* s, Index lds, LineStream ahead = {}) {
  constexpr int W = V::kWidth;
  for (Index c = 0; c < cols; c += W) {
    const Index keys = std::min<Index>(W, cols - c);
    for (Index k = 0; k < W; ++k) {
      float* dst = kbuf + k * kLaneStride;
      if (k >= keys) {
        std::fill(dst, dst + n, 0.0f);
        continue;
      }
      to_float(V{}, row_of(c + k), n, dst);
    }
    // The next block's rows are fetched while this block computes, one line every other step.
    const Index next = std::min<Index>(W, cols - c - W);
    const Index row_bytes = n * static_cast<Index>(sizeof(*row_of(0)));
    const char* next_row[W];
    for (Index k = 0; k < next; ++k) next_row[k] = reinterpret_cast<const char*>(row_of(c + W + k));
    Index nk = 0, off = 0;
    typename V::reg acc[W];
    for (int k = 0; k < W; ++k) acc[k] = V::zero();
    for (Index d = 0; d < n; ++d) {
      ahead.step();
      if ((d & 1) == 0 && nk < next) {
#if defined(__GNUC__)
        __builtin_prefetch(next_row[nk] + off, 0, 3);
#endif
        off += 64;
        if (off >= row_bytes) off = 0, ++nk;
      }
      const typename V::reg qd = V::load(qt + d * W);
      const float* b = kbuf + d;
      for (int k = 0; k < W; ++k) acc[k] = V::fmadd(V::set1(b[k * kLaneStride]), qd, acc[k]);
    }
    transpose(V{}, acc);
    for (Index r = 0; r < rows; ++r) V::store(s + r * lds + c, acc[r]);
  }
}

/// o += P·V for `rows` rows of p (stride ldp) and `cols` value rows of n elements: per element,
/// fused multiply-adds in key order (axpy_rows_each), MR rows at a time. `ahead`: lines to fetch
/// meanwhile. `row(c)`: value row c (float, or fp16 / bf16 / int8 converted in registers).
template <class V, class Rows>
inline void panel_pv(const float* p, Index ldp, Index rows, const Rows& row, Index cols, Index n,
                     float* o, Index ldo, LineStream ahead = {}) {
  constexpr int MR = PanelShape<V>::kRows;
  for (Index r = 0; r < rows; r += MR)
    with_block<MR, 1>(rows - r, 1, [&](auto R, auto) {
      axpy_rows_each<V, R()>(p + r * ldp, ldp, row, cols, n, o + r * ldo, ldo, ahead);
    });
}

}  // namespace attnref::detail::simd
