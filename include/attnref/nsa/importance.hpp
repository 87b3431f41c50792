#pragma once
/// NSA block selection (docs/semantics.md §8 steps 4–6): the importance score of each select block
/// from the compressed branch's probabilities, the forced blocks and the top-k.
///
/// With compress block l, stride d, select block l' (a = l'/d, c = l/d) and cmp_len compressed
/// keys, there are n_sel = ceil(((cmp_len − 1)·d + l) / l') select blocks (0 without keys), and
///   score[p] = Σ_{m<a} Σ_{n<c} P[a·(p + 1) − m − n]      (indices outside [0, cmp_len) dropped)
/// — the kernel's index arithmetic, the paper's 1-based formula at j = p + 1. Computed in fp32
/// as Σ_i w_i · P[a(p + 1) − i] over i = m + n ascending, w_i the number of (m, n) pairs with
/// m + n = i (the kernel's multiplicity loop). The group score is the fp32 sum of its G heads'
/// scores in head order; blocks 0, n_sel − 2 and n_sel − 1 are then forced to +inf. top-k: the
/// k largest, descending, ties to the lower index (so 0, n_sel − 2, n_sel − 1 come first).

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <type_traits>
#include <vector>

#include "attnref/core/types.hpp"

namespace attnref {

/// Number of select blocks of cmp_len compressed keys (0 when cmp_len is 0).
inline Index nsa_select_block_count(Index cmp_len, Index compress_block_size,
                                    Index compress_block_stride, Index select_block_size) {
  if (cmp_len <= 0) return 0;
  const Index covered = (cmp_len - 1) * compress_block_stride + compress_block_size;
  return (covered + select_block_size - 1) / select_block_size;
}

/// score[p], p < n_sel, of one query head from its probabilities p[0, cmp_len) (fp32).
inline void nsa_head_scores(const float* p, Index cmp_len, Index compress_block_size,
                            Index compress_block_stride, Index select_block_size, float* score) {
  const Index a = select_block_size / compress_block_stride;
  const Index c = compress_block_size / compress_block_stride;
  const Index n_sel = nsa_select_block_count(cmp_len, compress_block_size, compress_block_stride,
                                             select_block_size);
  // w_i = #{(m, n): m < a, n < c, m + n = i}, i <= a + c - 2
  const Index taps = a + c - 1;
  float wbuf[64];
  std::vector<float> wvec;
  float* w = wbuf;
  if (taps > 64) {
    wvec.resize(static_cast<size_t>(taps));
    w = wvec.data();
  }
  for (Index i = 0; i < taps; ++i)
    w[i] = static_cast<float>(std::min(i, a - 1) - std::max<Index>(0, i - (c - 1)) + 1);
  // Blocks whose indices a(blk + 1) - i all lie inside [0, cmp_len): tap by tap over the
  // blocks (each block's sum still runs over i ascending); the others one by one, skipping the
  // indices outside.
  const Index lo = std::min(n_sel, std::max<Index>(0, (taps - 1 + a - 1) / a - 1));
  const Index hi = std::max(lo, std::min(n_sel, (cmp_len - 1) / a));  // a(blk + 1) < cmp_len
  std::fill(score + lo, score + hi, 0.0f);
  // (a = 4, the vendor's 64 / 16, as a constant: g++ then vectorises the strided reads;
  // nsa/compress_attention/B:1 spent a twentieth of its time here)
  const auto taps_over = [&](auto stride) {
    const Index s = stride() > 0 ? Index{stride()} : a;
    if (hi <= lo) return;  // (with an interior block, q below points inside the row)
    for (Index i = 0; i < taps; ++i) {
      const float wi = w[i];
      const float* q = p + s * (lo + 1) - i;  // block lo + b reads q[s · b] (s = a)
      float* out = score + lo;
      for (Index b = 0; b < hi - lo; ++b) out[b] += wi * q[s * b];
    }
  };
  if (a == 4)
    taps_over(std::integral_constant<int, 4>{});
  else
    taps_over(std::integral_constant<int, 0>{});
  for (Index blk = 0; blk < n_sel; ++blk) {
    if (blk == lo) blk = hi;
    if (blk >= n_sel) break;
    const Index top = a * (blk + 1);  // idx = top - i
    float s = 0.0f;
    for (Index i = 0; i < taps; ++i) {
      const Index idx = top - i;
      if (idx < 0 || idx >= cmp_len) continue;
      s += w[i] * p[idx];
    }
    score[blk] = s;
  }
}

/// Forces blocks 0, n_sel − 2 and n_sel − 1 to +inf (those that exist).
inline void nsa_force_blocks(float* score, Index n_sel) {
  const float inf = std::numeric_limits<float>::infinity();
  if (n_sel > 0) score[0] = inf;
  if (n_sel > 1) score[n_sel - 1] = inf;
  if (n_sel > 2) score[n_sel - 2] = inf;
}

/// The k largest of score[0, n) as indices, descending, ties to the lower index (NaN ranks
/// lowest); positions past n (k > n) get -1. `order` is scratch (reused across calls).
inline void nsa_topk(const float* score, Index n, Index k, std::int32_t* out,
                     std::vector<std::int32_t>& order) {
  order.resize(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  auto key = [&](std::int32_t i) {
    const float s = score[i];
    return s != s ? -std::numeric_limits<float>::infinity() : s;
  };
  auto better = [&](std::int32_t x, std::int32_t y) {
    const float kx = key(x), ky = key(y);
    return kx > ky || (kx == ky && x < y);  // a strict total order: the result is unique
  };
  const Index take = std::min(k, n);
  if (take < n) std::nth_element(order.begin(), order.begin() + take, order.end(), better);
  std::sort(order.begin(), order.begin() + take, better);
  for (Index i = 0; i < k; ++i) out[i] = i < take ? order[static_cast<size_t>(i)] : -1;
}

inline void nsa_topk(const float* score, Index n, Index k, std::int32_t* out) {
  std::vector<std::int32_t> order;
  nsa_topk(score, n, k, out, order);
}

}  // namespace attnref
