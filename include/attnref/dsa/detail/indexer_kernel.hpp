#pragma once
/// lightning_indexer's computation: the fp32 scores of a block of query rows against tiles of
/// keys (an Eigen GEMM per tile, then ReLU, the weights and the head sum in the vendor kernel's
/// order), then each row's top-k. Work items are (batch, key head, block of 16 query rows), each
/// computed whole by one worker: the bits do not depend on the thread count. Not part of the API.

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <numeric>
#include <type_traits>
#include <vector>

#include "attnref/core/exec.hpp"
#include "attnref/core/types.hpp"
#include "attnref/detail/threading.hpp"
#include "attnref/dsa/detail/sequences.hpp"
#include "attnref/nsa/importance.hpp"

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

/// The k best of score[0, n) (nsa_topk: descending, ties to the lower index, NaN as −inf) into
/// idx, and their scores into val (may be null), −1 / −inf after them.
template <class T>
void indexer_topk(const float* score, Index n, Index k, std::int32_t* idx, T* val,
                  std::vector<std::int32_t>& order) {
  nsa_topk(score, n, k, idx, order);
  if constexpr (!std::is_same_v<T, std::int8_t>)  // (no values output for int8 inputs)
    if (val)
      for (Index e = 0; e < k; ++e)
        val[e] = T(idx[e] >= 0 ? score[idx[e]] : -std::numeric_limits<float>::infinity());
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

/// The keys the rows of item `it` see (the longest row's).
template <class T, class TW>
Index indexer_span(const IndexerJob<T, TW>& job, const IndexerWork& it) {
  Index span = 0;
  for (Index i = it.i0; i < it.i1; ++i) span = std::max(span, job.s.limit(it.b, i, job.causal));
  return span;
}

/// The item's query rows and weights (quant: w' = fp16(w · q_scale)) into buf.q / buf.w.
template <class T, class TW>
void indexer_load(const IndexerJob<T, TW>& job, const IndexerWork& it, IndexerBuffers& buf) {
  const DsaSeqs& s = job.s;
  const Index G = s.N1 / s.N2, D = s.D, R = it.i1 - it.i0;
  const Index row0 = s.q_row0[static_cast<size_t>(it.b)];
  buf.q.resize(static_cast<size_t>(R * G * D));
  buf.w.resize(static_cast<size_t>(R * G));
  for (Index r = 0; r < R; ++r)
    for (Index h = 0; h < G; ++h) {
      const Index src = (row0 + it.i0 + r) * s.N1 + it.g * G + h;
      const float wv = static_cast<float>(job.w[src]);
      buf.w[static_cast<size_t>(r * G + h)] =
          job.q_scale ? static_cast<float>(half(wv * static_cast<float>(job.q_scale[src]))) : wv;
      for (Index x = 0; x < D; ++x)
        buf.q[static_cast<size_t>((r * G + h) * D + x)] = static_cast<float>(job.q[src * D + x]);
    }
}

/// The scores of keys [k0, k1) (k0 on the 512-key tile grid) of the item's rows into `score`
/// (rows of `span` floats): one GEMM per tile, then indexer_row. The tile grid is fixed, so a
/// key's score does not depend on how the keys are split.
template <class T, class TW>
void indexer_scores(const IndexerJob<T, TW>& job, const IndexerWork& it, IndexerBuffers& buf,
                    Index span, Index k0, Index k1, float* score) {
  using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  constexpr Index tile = 512;
  const DsaSeqs& s = job.s;
  const Index G = s.N1 / s.N2, D = s.D, R = it.i1 - it.i0;
  buf.k.resize(static_cast<size_t>(tile * D));
  buf.s.resize(static_cast<size_t>(R * G * tile));
  buf.prod.resize(static_cast<size_t>(G * tile));
  for (Index t0 = k0; t0 < k1; t0 += tile) {
    const Index n = std::min(tile, k1 - t0);
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
                  score + r * span + t0);
  }
}

/// Each row's top-k from its scores (rows of `span` floats).
template <class T, class TW>
void indexer_select(const IndexerJob<T, TW>& job, const IndexerWork& it, const float* score,
                    Index span, IndexerBuffers& buf) {
  const DsaSeqs& s = job.s;
  const Index row0 = s.q_row0[static_cast<size_t>(it.b)], k = job.count;
  for (Index r = 0; r < it.i1 - it.i0; ++r) {
    const Index out = ((row0 + it.i0 + r) * s.N2 + it.g) * k;
    indexer_topk(score + r * span, s.limit(it.b, it.i0 + r, job.causal), k, job.idx + out,
                 job.val ? job.val + out : nullptr, buf.order);
  }
}

/// Every (batch, key head, block of 16 rows) as a work item, on exec.threads workers. With fewer
/// items than workers (decode), each item's keys are scored in chunks of 8 tiles on all the
/// workers first; the bits are the same either way.
template <class T, class TW>
void indexer_run(const IndexerJob<T, TW>& job, const ExecConfig& exec) {
  constexpr Index rows_per_item = 16, chunk = 8 * 512;
  const DsaSeqs& s = job.s;
  std::vector<IndexerWork> items;
  for (Index b = 0; b < s.B; ++b) {
    const Index rows = s.q_tnd ? s.q_len[static_cast<size_t>(b)] : s.S1;
    for (Index g = 0; g < s.N2; ++g)
      for (Index i0 = 0; i0 < rows; i0 += rows_per_item)
        items.push_back({b, g, i0, std::min(rows, i0 + rows_per_item)});
  }
  const int nt = resolve_threads(exec.threads);
  const Index n = static_cast<Index>(items.size());
  auto make = [] { return IndexerBuffers{}; };
  if (nt <= 1 || n >= nt) {
    parallel_for(nt, n, make, [&](IndexerBuffers& buf, Index i) {
      const IndexerWork& it = items[static_cast<size_t>(i)];
      const Index span = indexer_span(job, it);
      buf.score.resize(static_cast<size_t>((it.i1 - it.i0) * span));
      indexer_load(job, it, buf);
      indexer_scores(job, it, buf, span, 0, span, buf.score.data());
      indexer_select(job, it, buf.score.data(), span, buf);
    });
    return;
  }
  std::vector<Index> spans;
  std::vector<std::vector<float>> scores;
  std::vector<std::array<Index, 3>> pieces;  // item, first key, end key
  for (Index i = 0; i < n; ++i) {
    const IndexerWork& it = items[static_cast<size_t>(i)];
    spans.push_back(indexer_span(job, it));
    scores.emplace_back(static_cast<size_t>((it.i1 - it.i0) * spans.back()));
    for (Index k0 = 0; k0 < spans.back(); k0 += chunk)
      pieces.push_back({i, k0, std::min(spans.back(), k0 + chunk)});
  }
  parallel_for(nt, static_cast<Index>(pieces.size()), make, [&](IndexerBuffers& buf, Index p) {
    const auto& pc = pieces[static_cast<size_t>(p)];
    const IndexerWork& it = items[static_cast<size_t>(pc[0])];
    indexer_load(job, it, buf);
    indexer_scores(job, it, buf, spans[static_cast<size_t>(pc[0])], pc[1], pc[2],
                   scores[static_cast<size_t>(pc[0])].data());
  });
  parallel_for(nt, n, make, [&](IndexerBuffers& buf, Index i) {
    indexer_select(job, items[static_cast<size_t>(i)], scores[static_cast<size_t>(i)].data(),
                   spans[static_cast<size_t>(i)], buf);
  });
}

}  // namespace attnref::detail
