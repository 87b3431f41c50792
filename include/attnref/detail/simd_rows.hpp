#pragma once
/// The small-row micro-kernels (decode): R <= 8 query rows against K / V rows streamed from
/// memory, converted from fp16 / bf16 / int8 in registers, compute type float; the line stream
/// that fetches the next tile from inside a kernel's loop; and the row-count dispatch. The vector
/// traits and conversions they use are in simd.hpp.

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "attnref/core/types.hpp"
#include "attnref/detail/simd.hpp"

namespace attnref::detail::simd {

/// out[r * out_stride + c] = dot(q + r * q_stride, k[c]), r < R, c < C, over n elements.
template <class V, int R, int C, class T>
ATTNREF_HOT_KERNEL inline void dot_rows(const float* q, Index q_stride, const T* const* k, Index n,
                                        float* out, Index out_stride) {
  typename V::reg acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = V::zero();
  Index i = 0;
  for (; i + V::kWidth <= n; i += V::kWidth) {
    typename V::reg kk[C];
    for (int c = 0; c < C; ++c) kk[c] = V::load(k[c] + i);
    for (int r = 0; r < R; ++r) {
      typename V::reg qq = V::load(q + r * q_stride + i);
#if defined(__GNUC__)
      // Keeps the q block in a register: g++ 12 otherwise folds its load into each of the C
      // multiply-adds (C loads of q per step instead of one), and the kernel waited on its load
      // ports (decode/f16/B:1/KV:4096 and B:8, one thread: 7-12 % faster held, AMD Zen 5).
      asm("" : "+v"(qq));
#endif
      for (int c = 0; c < C; ++c) acc[r][c] = V::fmadd(qq, kk[c], acc[r][c]);
    }
  }
  if constexpr (C == 4 || (C == 2 && R >= 2)) {  // four sums at once, then the tail's products
    if constexpr (C == 4) {                      // a row's four
      for (int r = 0; r < R; ++r)
        V::sum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3], out + r * out_stride);
    } else {  // the two of a row and the two of the next (an odd last row alone)
      for (int r = 0; r + 1 < R; r += 2) {
        float t[4];
        V::sum4(acc[r][0], acc[r][1], acc[r + 1][0], acc[r + 1][1], t);
        std::copy_n(t, 2, out + r * out_stride);
        std::copy_n(t + 2, 2, out + (r + 1) * out_stride);
      }
      if constexpr (R % 2 == 1)
        for (int c = 0; c < C; ++c) out[(R - 1) * out_stride + c] = V::sum(acc[R - 1][c]);
    }
    for (int r = 0; r < R && i < n; ++r)
      for (int c = 0; c < C; ++c) {
        float s = out[r * out_stride + c];
        for (Index t = i; t < n; ++t) s += q[r * q_stride + t] * static_cast<float>(k[c][t]);
        out[r * out_stride + c] = s;
      }
    return;
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float s = V::sum(acc[r][c]);
      for (Index t = i; t < n; ++t) s += q[r * q_stride + t] * static_cast<float>(k[c][t]);
      out[r * out_stride + c] = s;
    }
}

/// Cache lines fetched ahead from inside a compute kernel, one per step of its inner loop: the
/// `bytes` bytes at `offset` of each of `count` rows (the next kv tile's rows of one head, in a
/// paged or token-major cache), into the second-level cache. The panel kernels work on a tile
/// for thousands of cycles; spread over that work, the next tile's fetches overlap it, where
/// issued at once (or left to the conversion that first reads the rows) they stalled it. An
/// empty stream (count 0) costs one compare per step.
struct LineStream {
  const char* const* row = nullptr;
  Index count = 0, offset = 0, bytes = 0;
  Index r = 0;                     // the row being fetched
  std::uintptr_t at = 0, end = 0;  // its next line, and the end of its bytes (addresses)

  LineStream() = default;
  LineStream(const char* const* rows, Index n, Index off, Index len)
      : row(rows), count(len > 0 ? n : 0), offset(off), bytes(len) {
    if (count > 0) start();
  }
  void start() {
    const std::uintptr_t p = reinterpret_cast<std::uintptr_t>(row[r] + offset);
    at = p & ~std::uintptr_t{63};
    end = p + static_cast<std::uintptr_t>(bytes);
  }
  void step() {
    if (r >= count) return;
#if defined(__GNUC__)
    __builtin_prefetch(reinterpret_cast<const void*>(at), 0, 2);
#endif
    at += 64;
    if (at >= end && ++r < count) start();
  }
};

/// The stream of kernels that fetch nothing ahead (no code in the loop).
struct NoStream {
  void step() {}
};

/// o[r * o_stride + i + e] += sum_{c < cols} p[r * p_stride + c] * row(c)[i + e], r < R,
/// e < K vectors: one register block, fused multiply-adds in key order; `ahead` steps once per
/// key.
template <class V, int R, int K, class Rows, class Stream>
inline void axpy_block(const float* p, Index p_stride, const Rows& row, Index cols, Index i,
                       float* o, Index o_stride, Stream& ahead) {
  typename V::reg acc[R][K];
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < K; ++k) acc[r][k] = V::load(o + r * o_stride + i + k * V::kWidth);
  for (Index c = 0; c < cols; ++c) {
    ahead.step();
    typename V::reg vv[K];
    const auto* vc = row(c) + i;
    for (int k = 0; k < K; ++k) vv[k] = V::load(vc + k * V::kWidth);
    for (int r = 0; r < R; ++r) {
      const typename V::reg a = V::set1(p[r * p_stride + c]);
      for (int k = 0; k < K; ++k) acc[r][k] = V::fmadd(a, vv[k], acc[r][k]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < K; ++k) V::store(o + r * o_stride + i + k * V::kWidth, acc[r][k]);
}

/// o + r * o_stride += sum_{c < cols} p[r * p_stride + c] * row(c), r < R, over n elements, key
/// after key (fused multiply-adds in key order for every element), with a block of each output
/// row held in registers across all the keys. `row(c)` gives value row c (const T*, any spacing).
/// `ahead` steps once per key of every register block.
template <class V, int R, class Rows, class Stream = NoStream>
inline void axpy_rows_each(const float* p, Index p_stride, const Rows& row, Index cols, Index n,
                           float* o, Index o_stride, Stream&& ahead = NoStream{}) {
  constexpr int kChunks = V::kWidth == 16 ? (R <= 6 ? 4 : 2) : (R <= 6 ? 2 : 1);
  Index i = 0;
  for (; i + kChunks * V::kWidth <= n; i += kChunks * V::kWidth)
    axpy_block<V, R, kChunks>(p, p_stride, row, cols, i, o, o_stride, ahead);
  for (; i + V::kWidth <= n; i += V::kWidth)
    axpy_block<V, R, 1>(p, p_stride, row, cols, i, o, o_stride, ahead);
  for (; i < n; ++i)  // the tail: fused multiply-adds, as the vector lanes
    for (int r = 0; r < R; ++r) {
      float acc = o[r * o_stride + i];
      for (Index c = 0; c < cols; ++c)
        acc = std::fma(p[r * p_stride + c], static_cast<float>(row(c)[i]), acc);
      o[r * o_stride + i] = acc;
    }
}

/// axpy_rows_each over the value rows v[0..cols) (decode: rows anywhere in a paged cache).
template <class V, int R, class T>
inline void axpy_rows_all(const float* p, Index p_stride, const T* const* v, Index cols, Index n,
                          float* o, Index o_stride) {
  axpy_rows_each<V, R>(
      p, p_stride, [v](Index c) { return v[c]; }, cols, n, o, o_stride);
}

/// Runtime row count (1..8) -> f(std::integral_constant<int, R>).
template <class F>
inline void with_rows(Index rows, F&& f) {
  switch (rows) {
    case 1:
      f(std::integral_constant<int, 1>{});
      break;
    case 2:
      f(std::integral_constant<int, 2>{});
      break;
    case 3:
      f(std::integral_constant<int, 3>{});
      break;
    case 4:
      f(std::integral_constant<int, 4>{});
      break;
    case 5:
      f(std::integral_constant<int, 5>{});
      break;
    case 6:
      f(std::integral_constant<int, 6>{});
      break;
    case 7:
      f(std::integral_constant<int, 7>{});
      break;
    default:
      f(std::integral_constant<int, 8>{});
      break;
  }
}

}  // namespace attnref::detail::simd
