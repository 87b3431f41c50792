#pragma once
/// attnref::lightning_indexer — CANN aclnnLightningIndexer: DeepSeek-V3.2's token selector. For
/// every query row it scores each visible key with a small multi-head ReLU indexer and keeps the
/// top sparse_count keys.
///
/// Per batch b (q_b live query rows, s_b keys), query row i and key head g with its G = N1 / N2
/// query heads h:
///   score(i, s) = Σ_h w[i][h] · ReLU(q[i][h] · k[s][g])      (no scale), s < limit_i
///   limit_i = s_b (sparse_mode 0) or s_b − q_b + i + 1 (sparse_mode 3, rightDownCausal)
///   sparse_indices[i][g] = the keys of the top min(sparse_count, limit_i) scores, descending,
///                          ties to the lower key index, then −1
///   sparse_values[i][g]  = their scores in the query's type, −inf at the −1 entries
/// Indices are positions in the batch's own keys (0 .. s_b − 1), whatever the key layout. Rows
/// with no visible key and BSND rows past q_b are all −1.
///
/// Arithmetic (the vendor's A2/A3 kernel): q·k in fp32 from the 16-bit inputs, ReLU in fp32,
/// the weight (converted to fp32) times it in fp32, the head sum in fp32 in the kernel's order
/// (lane l of 16 accumulates heads l, l + 16, l + 32, ... in that order; then lanes [p, min(16, G))
/// are added onto lanes [0, ...) with p the largest power of two <= min(16, G), and a halving
/// tree ends in lane 0 + lane 1), no rounding before the top-k. The q·k order over D is attnref's
/// (Eigen's GEMM), so scores within a few ulps of each other may rank differently on the NPU.
///
/// The vendor's constraints are checked by default (params.strict; docs/dsa.md); strict = false
/// keeps what the definition needs. Everything is checked before anything is written.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/core/dense.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/exec.hpp"
#include "attnref/core/types.hpp"
#include "attnref/detail/threading.hpp"
#include "attnref/dsa/detail/indexer_kernel.hpp"
#include "attnref/dsa/detail/sequences.hpp"

namespace attnref {

struct LightningIndexerParams {
  std::string layout_query = "BSND";  ///< layoutQuery: BSND or TND
  std::string layout_key = "BSND";    ///< layoutKey: BSND, TND or PA_BSND
  std::int64_t sparse_count = 2048;   ///< sparseCount: keys kept per row
  std::int64_t sparse_mode = 3;       ///< 0: every key, 3: rightDownCausal
  std::int64_t pre_tokens = std::numeric_limits<std::int64_t>::max();   ///< only the default
  std::int64_t next_tokens = std::numeric_limits<std::int64_t>::max();  ///< only the default
  bool return_value = false;  ///< also write sparse_values
  bool strict = true;         ///< the vendor's constraint list (false: relaxed)
};

/// T: half or bfloat16 (float: attnref extension); TW (weights): T or float.
template <class T, class TW = T>
struct LightningIndexerInputs {
  StridedView<const T> query{};     ///< BSND [B, S1, N1, D] or TND [T1, N1, D]
  StridedView<const T> key{};       ///< BSND [B, S2, N2, D], TND [T2, N2, D] or PA_BSND
                                    ///< [blockNum, blockSize, N2, D]
  StridedView<const TW> weights{};  ///< [B, S1, N1] or [T1, N1]
  StridedView<const std::int32_t> block_table{};         ///< PA_BSND: [B, maxBlocks]
  std::vector<std::int64_t> actual_seq_lengths_query{};  ///< [B] (TND: cumulative, required)
  std::vector<std::int64_t> actual_seq_lengths_key{};    ///< [B] (TND: cumulative; TND and
                                                         ///< PA_BSND: required)

  /// Calls f(name, view) for every tensor field.
  template <class F>
  void for_each_view(F&& f) {
    f("query", query), f("key", key), f("weights", weights), f("block_table", block_table);
  }
};

template <class T>
struct LightningIndexerOutputs {
  StridedView<std::int32_t> sparse_indices{};  ///< [B, S1, N2, sparse_count] or [T1, N2, ..]
  StridedView<T> sparse_values{};              ///< the same shape (return_value), else absent

  /// Calls f(name, view) for every tensor field.
  template <class F>
  void for_each_view(F&& f) {
    f("sparse_indices", sparse_indices), f("sparse_values", sparse_values);
  }
};

namespace detail {

/// The scalar parameters (`fn`: lightning_indexer or quant_lightning_indexer; `cap`: the
/// vendor's sparse_count rule, 8192 with the multiples of 1024 above 2048, or 2048).
template <class P>
void li_params(const char* fn, const P& p, std::int64_t cap) {
  const std::int64_t c = p.sparse_count;
  ATTNREF_CHECK(c > 0 && c <= (std::int64_t{1} << 24), std::invalid_argument, fn,
                "params.sparse_count", "out of range", "[1, 2^24]", std::to_string(c));
  if (p.strict)
    ATTNREF_CHECK(
        c <= 2048 || (c % 1024 == 0 && c <= cap), std::invalid_argument, fn, "params.sparse_count",
        "not supported (vendor rule; params.strict = false relaxes it)",
        cap > 2048 ? "[1, 2048] or 3072, 4096, ..., 8192" : "[1, 2048]", std::to_string(c));
  ATTNREF_CHECK(p.sparse_mode == 0 || p.sparse_mode == 3, std::invalid_argument, fn,
                "params.sparse_mode", "not supported", "0 or 3", std::to_string(p.sparse_mode));
  constexpr std::int64_t big = std::numeric_limits<std::int64_t>::max();
  ATTNREF_CHECK(p.pre_tokens == big && p.next_tokens == big, std::invalid_argument, fn,
                "params.pre_tokens / next_tokens", "not supported (only the default)", "2^63 - 1",
                std::to_string(p.pre_tokens) + " / " + std::to_string(p.next_tokens));
}

/// The tensors' shapes (the query's, key's and weights' views of `in`; `idx` and, when not
/// absent, `val` the outputs), the lengths and the block table; the vendor's rules when strict.
template <class P, class In, class TV>
void li_shapes(const char* fn, const P& p, const In& in, const StridedView<std::int32_t>& idx,
               const StridedView<TV>& val, DsaSeqs& s) {
  dsa_query(fn, p.layout_query, in.query, in.actual_seq_lengths_query, "actual_seq_lengths_query",
            s);
  dsa_keys(fn, p.layout_key, "params.layout_key", "key", in.key, in.block_table,
           in.actual_seq_lengths_key, "actual_seq_lengths_key", s);
  const int qr = in.query.rank();
  ATTNREF_CHECK(in.key.size(in.key.rank() - 1) == s.D, std::invalid_argument, fn, "key.shape",
                "head size differs from the query's", std::to_string(s.D), shape_str(in.key));
  ATTNREF_CHECK(s.N1 % s.N2 == 0, std::invalid_argument, fn, "query.shape",
                "query heads not a multiple of the key heads",
                "a multiple of " + std::to_string(s.N2), shape_str(in.query));
  const Dims qs = in.query.shape();
  const Dims w = qs.size() == 3 ? Dims{qs[0], qs[1]} : Dims{qs[0], qs[1], qs[2]};
  ATTNREF_CHECK(!in.weights.absent() && in.weights.shape() == w, std::invalid_argument, fn,
                "weights.shape", "mismatch", s.q_tnd ? "[T1, N1]" : "[B, S1, N1]",
                shape_str(in.weights));
  Dims o = in.query.shape();
  o[qr - 2] = s.N2;
  o[qr - 1] = static_cast<Index>(p.sparse_count);
  const std::string want = s.q_tnd ? "[T1, N2, sparse_count]" : "[B, S1, N2, sparse_count]";
  ATTNREF_CHECK(!idx.absent() && idx.shape() == o, std::invalid_argument, fn,
                "sparse_indices.shape", "mismatch", want, shape_str(idx));
  if (!val.absent())
    ATTNREF_CHECK(val.shape() == o, std::invalid_argument, fn, "sparse_values.shape",
                  "mismatch (return_value)", want, shape_str(val));
  if (!p.strict) return;
  const std::string rule = " (vendor rule; params.strict = false relaxes it)";
  ATTNREF_CHECK(p.layout_key == "PA_BSND" || p.layout_key == p.layout_query, std::invalid_argument,
                fn, "params.layout_key", "not paired with layout_query" + rule,
                p.layout_query + " or PA_BSND", p.layout_key);
  ATTNREF_CHECK(s.D == 128, std::invalid_argument, fn, "query.shape (D)", "not supported" + rule,
                "128", std::to_string(s.D));
  ATTNREF_CHECK(s.N2 == 1, std::invalid_argument, fn, "key.shape (N2)", "not supported" + rule, "1",
                std::to_string(s.N2));
  ATTNREF_CHECK(s.N1 <= 64, std::invalid_argument, fn, "query.shape (N1)", "not supported" + rule,
                "<= 64", std::to_string(s.N1));
  if (s.kv == DsaKv::PA_BSND)
    ATTNREF_CHECK(s.block_size % 16 == 0 && s.block_size <= 1024, std::invalid_argument, fn,
                  "key.shape[1] (blockSize)", "not supported" + rule,
                  "a multiple of 16, at most 1024", std::to_string(s.block_size));
}

/// lightning_indexer on dense arguments: every check, then (run) the computation.
template <class T, class TW>
void lightning_indexer_dense(const LightningIndexerParams& p,
                             const LightningIndexerInputs<T, TW>& in,
                             const LightningIndexerOutputs<T>& out, const ExecConfig& exec,
                             bool run) {
  static_assert(std::is_same_v<T, half> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float>,
                "lightning_indexer: half or bfloat16 (float: attnref extension)");
  static_assert(std::is_same_v<TW, T> || std::is_same_v<TW, float>,
                "lightning_indexer: weights of the query's type or float");
  constexpr const char* fn = "lightning_indexer";
  li_params(fn, p, 8192);
  ATTNREF_CHECK(!(p.return_value && p.layout_key == "PA_BSND"), std::invalid_argument, fn,
                "params.return_value", "not supported with layout_key PA_BSND", "false", "true");
  DsaSeqs s;
  li_shapes(fn, p, in, out.sparse_indices, p.return_value ? out.sparse_values : StridedView<T>{},
            s);
  if (p.return_value)
    ATTNREF_CHECK(!out.sparse_values.absent(), std::invalid_argument, fn, "sparse_values",
                  "required with params.return_value", "a tensor", "none");
  if (!run) return;  // validate(): every check has run, nothing is written
  IndexerJob<T, TW> job{s,
                        in.query.data(),
                        in.key.data(),
                        in.weights.data(),
                        out.sparse_indices.data(),
                        p.return_value ? out.sparse_values.data() : nullptr,
                        static_cast<Index>(p.sparse_count),
                        p.sparse_mode == 3};
  indexer_run(job, exec);
}

template <class T, class TW>
void lightning_indexer_call(const LightningIndexerParams& p,
                            const LightningIndexerInputs<T, TW>& in,
                            const LightningIndexerOutputs<T>& out, const ExecConfig& exec,
                            bool run) {
  check_exec("lightning_indexer", exec);
  dense_call("lightning_indexer", in, out, run, [&](const auto& din, const auto& dout) {
    lightning_indexer_dense(p, din, dout, exec, run);
  });
}
}  // namespace detail

/// Every check of lightning_indexer() (params, tensors, index data, execution config), without
/// computing or writing anything.
template <class T, class TW>
void validate(const LightningIndexerParams& p, const LightningIndexerInputs<T, TW>& in,
              const LightningIndexerOutputs<T>& out, const ExecConfig& exec = {}) {
  detail::lightning_indexer_call(p, in, out, exec, false);
}

/// CANN LightningIndexer as validate -> plan -> run (every check before any write).
template <class T, class TW>
void lightning_indexer(const LightningIndexerParams& p, const LightningIndexerInputs<T, TW>& in,
                       const LightningIndexerOutputs<T>& out, const ExecConfig& exec = {}) {
  detail::lightning_indexer_call(p, in, out, exec, true);
}

}  // namespace attnref
