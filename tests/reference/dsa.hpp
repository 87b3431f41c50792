#pragma once
// Independent reference of DeepSeek sparse attention as CANN runs it (LightningIndexer and
// SparseFlashAttention), written from the definitions, in double, over one dense array per
// batch (values already rounded to the input type). Query head h uses key head g = h / G,
// G = N1 / N2.
//
// Visibility. Query row i (0 <= i < q_len) of a batch with kv_len keys sees the keys
// [0, limit_i): limit_i = kv_len (causal false, sparse_mode 0) or kv_len - q_len + i + 1 (causal
// true, sparse_mode 3, rightDownCausal), nothing when that is <= 0.
//
// Indexer. score(i, g, s) = sum over the G heads h of g of w[i][h] * max(0, q[i][h] . k[s][g]),
// over the visible keys s; the top sparse_count of them, by descending score, ties to the lower
// key index, found by sorting every visible key explicitly; -1 after the visible keys run out.
//
// Sparse attention (the vendor's slot rule). Only the first min(K, ceil(limit_i / sbs)) slots of
// idx[i][g] are read, up to the first -1; entry j contributes the tokens
// [j * sbs, min((j + 1) * sbs, limit_i)) (none when j * sbs >= limit_i), a token once per entry
// that names it (a repeated entry counts twice); out[i][h] = softmax(scale * (q.k +
// q_rope.k_rope)) . v over that list, 0 when it is empty.
//
// No include of attnref (nor Eigen): plain loops and double accumulation.

#include <cstdint>
#include <vector>

namespace ref::dsa {

struct Shape {
  int N1 = 1, N2 = 1, D = 1, Dr = 0;
  bool causal = false;
};

struct Batch {
  int q_len = 0;
  long kv_len = 0;
  std::vector<double> q, qr;      // [q_len][N1][D], [q_len][N1][Dr]
  std::vector<double> k, kr, v;   // [kv_len][N2][D], [kv_len][N2][Dr], [kv_len][N2][D]
  std::vector<double> w;          // indexer weights [q_len][N1]
  std::vector<std::int32_t> idx;  // sparse attention: [q_len][N2][K]
};

/// limit_i: the keys [0, limit_i) row i sees (0 when nothing).
long visible(const Shape& sh, const Batch& b, int i);

/// The indexer's scores [q_len][N2][kv_len]; keys row i does not see are NaN.
std::vector<double> indexer_scores(const Shape& sh, const Batch& b);

/// The indexer's top-k [q_len][N2][count] from indexer_scores (ties to the lower index).
std::vector<std::int32_t> indexer_topk(const Shape& sh, const Batch& b, long count);

/// The quantized indexer's top-k (quant_lightning_indexer): b.q / b.k hold int8 values, b.w fp16
/// weights, qs [q_len][N1] / ks [kv_len][N2] fp16 scales; score(i, g, s) = ks[s][g] * sum_h
/// fp16(w * qs) * fp16(max(q.k, 0) / 1024), fp16() rounding to nearest even (the vendor golden's
/// steps), then the top-k as indexer_topk.
std::vector<std::int32_t> quant_indexer_topk(const Shape& sh, const Batch& b,
                                             const std::vector<double>& qs,
                                             const std::vector<double>& ks, long count);

/// Sparse attention [q_len][N1][D] (not rounded) of the index lists b.idx, K entries each.
std::vector<double> sparse_attention(const Shape& sh, const Batch& b, long K, long sbs,
                                     double scale);

}  // namespace ref::dsa
