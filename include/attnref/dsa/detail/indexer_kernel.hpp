#pragma once
/// lightning_indexer's computation: the fp32 scores of a block of query rows against tiles of
/// keys (an Eigen GEMM per tile, then ReLU, the weights and the head sum in the vendor kernel's
/// order), then each row's top-k. Work items are (batch, key head, block of 16 query rows), each
/// computed whole by one worker: the bits do not depend on the thread count. Not part of the API.

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <type_traits>
#include <vector>

#include "attnref/core/exec.hpp"
#include "attnref/core/types.hpp"
#include "attnref/detail/threading.hpp"
#include "attnref/dsa/detail/sequences.hpp"

namespace attnref::detail {

template <class T, class TW>
struct IndexerJob {
  const DsaSeqs& s;
  const T* q;         // [rows, N1, D]
  const T* k;         // [tokens, N2, D]
  const TW* w;        // [rows, N1]
  std::int32_t* idx;  // [rows, N2, count]
  T* val;             // the same, or null
  Index count = 0;
  bool causal = false;
  /// quant_lightning_indexer (int8 q / k): fp16 per-(row, head) query and per-token key scales.
  const half* q_scale = nullptr;  // [rows, N1]
  const half* k_scale = nullptr;  // [tokens, N2]
};

/// out[c] = Σ_h prod[h][c] over G heads (rows of `ld` floats) in the vendor kernel's order:
/// lane l < min(16, G) sums heads l, l + 16, ... in order; lanes [p, r) are added onto [0, r − p)
/// (p the largest power of two <= r); then a halving tree down to lane 0 + lane 1.
inline void indexer_head_sum(float* prod, Index G, Index ld, Index n, float* out) {
  const Index r = std::min<Index>(16, G);
  for (Index h = 16; h < G; ++h) {
    float* a = prod + (h % 16) * ld;
    const float* b = prod + h * ld;
    for (Index c = 0; c < n; ++c) a[c] += b[c];
  }
  Index p = 1;
  while (p * 2 <= r) p *= 2;
  auto fold = [&](Index count, Index shift) {
    for (Index l = 0; l < count; ++l) {
      float* a = prod + l * ld;
      const float* b = prod + (l + shift) * ld;
      for (Index c = 0; c < n; ++c) a[c] += b[c];
    }
  };
  fold(r - p, p);
  for (Index half = p / 2; half >= 1; half /= 2) fold(half, half);
  std::copy(prod, prod + n, out);
}

/// The k best of score[0, n) (descending, ties to the lower index, NaN as −inf) into idx / val
/// (val may be null), −1 / −inf after them.
template <class T>
void indexer_topk(const float* score, Index n, Index k, std::int32_t* idx, T* val,
                  std::vector<std::int32_t>& order) {
  const float ninf = -std::numeric_limits<float>::infinity();
  auto key = [&](std::int32_t i) { return score[i] != score[i] ? ninf : score[i]; };
  order.resize(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  const Index take = std::min(k, n);
  std::partial_sort(order.begin(), order.begin() + take, order.end(),
                    [&](std::int32_t x, std::int32_t y) {
                      const float kx = key(x), ky = key(y);
                      return kx > ky || (kx == ky && x < y);
                    });
  for (Index e = 0; e < k; ++e) {
    idx[e] = e < take ? order[static_cast<size_t>(e)] : -1;
    if constexpr (!std::is_same_v<T, std::int8_t>)  // (no values output for int8 inputs)
      if (val) val[e] = T(e < take ? score[order[static_cast<size_t>(e)]] : ninf);
  }
}

struct IndexerWork {
  Index b, g, i0, i1;
};

struct IndexerBuffers {
  std::vector<float> q, w, k, s, prod, score;
  std::vector<std::int32_t> order;
};

/// prod[h][c] (then the row's scores) from the dots S of one row's G heads against n keys:
/// w · ReLU(dot) in fp32 and the kernel-order head sum, or (quant) w' · fp16(ReLU(dot / 1024))
/// with fp16 products summed in head order in fp32, times the key's scale.
template <class T, class TW>
void indexer_row(const IndexerJob<T, TW>& job, const IndexerWork& it, const float* w,
                 const float* S, Index n, Index t0, IndexerBuffers& buf, float* score) {
  const Index G = job.s.N1 / job.s.N2;
  if (!job.q_scale) {
    for (Index h = 0; h < G; ++h) {
      const float* sr = S + h * n;
      float* pr = buf.prod.data() + h * n;
      for (Index c = 0; c < n; ++c) pr[c] = w[h] * (sr[c] < 0.0f ? 0.0f : sr[c]);  // NaN stays
    }
    indexer_head_sum(buf.prod.data(), G, n, n, score);
    return;
  }
  std::fill(score, score + n, 0.0f);
  for (Index h = 0; h < G; ++h) {
    const float* sr = S + h * n;
    for (Index c = 0; c < n; ++c) {
      const float x = sr[c] * (1.0f / 1024.0f);  // exact: the dot is an integer below 2^22
      score[c] += w[h] * static_cast<float>(half(x < 0.0f ? 0.0f : x));
    }
  }
  for (Index c = 0; c < n; ++c)
    score[c] *= static_cast<float>(job.k_scale[job.s.token(it.b, t0 + c) * job.s.N2 + it.g]);
}

/// One work item: rows [i0, i1) of batch b, key head g.
template <class T, class TW>
void indexer_item(const IndexerJob<T, TW>& job, const IndexerWork& it, IndexerBuffers& buf) {
  using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  constexpr Index tile = 512;
  const DsaSeqs& s = job.s;
  const Index G = s.N1 / s.N2, D = s.D, R = it.i1 - it.i0, k = job.count;
  const Index row0 = s.q_row0[static_cast<size_t>(it.b)];
  Index span = 0;  // keys the block's rows see
  for (Index i = it.i0; i < it.i1; ++i) span = std::max(span, s.limit(it.b, i, job.causal));
  buf.q.resize(static_cast<size_t>(R * G * D));
  buf.w.resize(static_cast<size_t>(R * G));
  for (Index r = 0; r < R; ++r)
    for (Index h = 0; h < G; ++h) {
      const Index src = (row0 + it.i0 + r) * s.N1 + it.g * G + h;
      const float wv = static_cast<float>(job.w[src]);  // quant: w' = fp16(w · q_scale)
      buf.w[static_cast<size_t>(r * G + h)] =
          job.q_scale ? static_cast<float>(half(wv * static_cast<float>(job.q_scale[src]))) : wv;
      if (span > 0)
        for (Index x = 0; x < D; ++x)
          buf.q[static_cast<size_t>((r * G + h) * D + x)] = static_cast<float>(job.q[src * D + x]);
    }
  buf.score.resize(static_cast<size_t>(R * span));
  buf.k.resize(static_cast<size_t>(tile * D));
  buf.s.resize(static_cast<size_t>(R * G * tile));
  buf.prod.resize(static_cast<size_t>(G * tile));
  for (Index t0 = 0; t0 < span; t0 += tile) {
    const Index n = std::min(tile, span - t0);
    for (Index c = 0; c < n; ++c) {
      const T* src = job.k + (s.token(it.b, t0 + c) * s.N2 + it.g) * D;
      for (Index x = 0; x < D; ++x)
        buf.k[static_cast<size_t>(c * D + x)] = static_cast<float>(src[x]);
    }
    Eigen::Map<const RowMat> Q(buf.q.data(), R * G, D), K(buf.k.data(), n, D);
    Eigen::Map<RowMat> S(buf.s.data(), R * G, n);
    S.noalias() = Q * K.transpose();
    for (Index r = 0; r < R; ++r)
      indexer_row(job, it, buf.w.data() + r * G, buf.s.data() + r * G * n, n, t0, buf,
                  buf.score.data() + r * span + t0);
  }
  for (Index r = 0; r < R; ++r) {
    const Index out = ((row0 + it.i0 + r) * s.N2 + it.g) * k;
    indexer_topk(buf.score.data() + r * span, s.limit(it.b, it.i0 + r, job.causal), k,
                 job.idx + out, job.val ? job.val + out : nullptr, buf.order);
  }
}

/// Every (batch, key head, block of 16 rows) as a work item, on exec.threads workers.
template <class T, class TW>
void indexer_run(const IndexerJob<T, TW>& job, const ExecConfig& exec) {
  constexpr Index rows_per_item = 16;
  const DsaSeqs& s = job.s;
  std::vector<IndexerWork> items;
  for (Index b = 0; b < s.B; ++b) {
    const Index rows = s.q_tnd ? s.q_len[static_cast<size_t>(b)] : s.S1;
    for (Index g = 0; g < s.N2; ++g)
      for (Index i0 = 0; i0 < rows; i0 += rows_per_item)
        items.push_back({b, g, i0, std::min(rows, i0 + rows_per_item)});
  }
  parallel_for(
      resolve_threads(exec.threads), static_cast<Index>(items.size()),
      [] { return IndexerBuffers{}; },
      [&](IndexerBuffers& buf, Index i) { indexer_item(job, items[static_cast<size_t>(i)], buf); });
}

}  // namespace attnref::detail
