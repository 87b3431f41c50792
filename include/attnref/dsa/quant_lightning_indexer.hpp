#pragma once
/// attnref::quant_lightning_indexer — CANN aclnnQuantLightningIndexer: lightning_indexer over an
/// int8 index query and key, with fp16 dequantization scales (per query row and head, per key
/// token). The geometry, visibility, top-k, tie order and −1 rules are lightning_indexer's
/// (lightning_indexer.hpp); only the score differs, as the vendor's A2 / A3 kernel and its golden
/// reference compute it:
///   dot      = q_int8 · k_int8                          (exact integer)
///   r        = fp16(ReLU(dot / 1024))                   (the kernel's fixed range reduction)
///   w'       = fp16(w · query_dequant_scale)            (fp16 product, rounded)
///   score(s) = float(key_dequant_scale[s]) · Σ_h w'_h · r_h      (fp32; heads in order)
/// No values output. The vendor's documents write the ReLU after the scales; its kernel and
/// golden apply it to the raw dot (the same when every scale is positive): attnref follows the
/// kernel. Rounding to fp16 is round-to-nearest-even (the golden's; the kernel's mode for this
/// step is not documented).

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnref/core/dense.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/exec.hpp"
#include "attnref/core/types.hpp"
#include "attnref/dsa/detail/indexer_kernel.hpp"
#include "attnref/dsa/detail/sequences.hpp"
#include "attnref/dsa/lightning_indexer.hpp"

namespace attnref {

struct QuantLightningIndexerParams {
  std::int64_t query_quant_mode = 0;  ///< 0 (per token and head) only
  std::int64_t key_quant_mode = 0;    ///< 0 (per token) only
  std::string layout_query = "BSND";  ///< BSND or TND
  std::string layout_key = "BSND";    ///< BSND, TND or PA_BSND
  std::int64_t sparse_count = 2048;   ///< [1, 2048]
  std::int64_t sparse_mode = 3;       ///< 0 or 3
  std::int64_t pre_tokens = std::numeric_limits<std::int64_t>::max();   ///< only the default
  std::int64_t next_tokens = std::numeric_limits<std::int64_t>::max();  ///< only the default
  bool strict = true;  ///< the vendor's constraint list (false: relaxed)
};

struct QuantLightningIndexerInputs {
  StridedView<const std::int8_t> query{};         ///< BSND [B, S1, N1, D] or TND [T1, N1, D]
  StridedView<const std::int8_t> key{};           ///< BSND, TND or PA_BSND, as lightning_indexer's
  StridedView<const half> weights{};              ///< [B, S1, N1] or [T1, N1]
  StridedView<const half> query_dequant_scale{};  ///< the weights' shape
  StridedView<const half> key_dequant_scale{};    ///< the key's shape without D
  StridedView<const std::int32_t> block_table{};  ///< PA_BSND: [B, maxBlocks]
  std::vector<std::int64_t> actual_seq_lengths_query{};  ///< [B] (TND: cumulative, required)
  std::vector<std::int64_t> actual_seq_lengths_key{};    ///< [B] (TND: cumulative; TND and
                                                         ///< PA_BSND: required)

  /// Calls f(name, view) for every tensor field.
  template <class F>
  void for_each_view(F&& f) {
    f("query", query), f("key", key), f("weights", weights);
    f("query_dequant_scale", query_dequant_scale), f("key_dequant_scale", key_dequant_scale);
    f("block_table", block_table);
  }
};

struct QuantLightningIndexerOutputs {
  StridedView<std::int32_t> sparse_indices{};  ///< [B, S1, N2, sparse_count] or [T1, N2, ..]

  /// Calls f(name, view) for every tensor field.
  template <class F>
  void for_each_view(F&& f) {
    f("sparse_indices", sparse_indices);
  }
};

namespace detail {

inline void quant_lightning_indexer_dense(const QuantLightningIndexerParams& p,
                                          const QuantLightningIndexerInputs& in,
                                          const QuantLightningIndexerOutputs& out,
                                          const ExecConfig& exec, bool run) {
  constexpr const char* fn = "quant_lightning_indexer";
  ATTNREF_CHECK(p.query_quant_mode == 0 && p.key_quant_mode == 0, std::invalid_argument, fn,
                "params.query_quant_mode / key_quant_mode", "not supported", "0 and 0",
                std::to_string(p.query_quant_mode) + " and " + std::to_string(p.key_quant_mode));
  li_params(fn, p, 2048);
  DsaSeqs s;
  li_shapes(fn, p, in, out.sparse_indices, StridedView<half>{}, s);
  ATTNREF_CHECK(
      !in.query_dequant_scale.absent() && in.query_dequant_scale.shape() == in.weights.shape(),
      std::invalid_argument, fn, "query_dequant_scale.shape", "differs from the weights'",
      shape_str(in.weights), shape_str(in.query_dequant_scale));
  const Dims ks = in.key.shape();
  const Dims want = ks.size() == 3 ? Dims{ks[0], ks[1]} : Dims{ks[0], ks[1], ks[2]};
  ATTNREF_CHECK(!in.key_dequant_scale.absent() && in.key_dequant_scale.shape() == want,
                std::invalid_argument, fn, "key_dequant_scale.shape",
                "differs from the key's without D",
                shape_str(StridedView<const half>(nullptr, want)), shape_str(in.key_dequant_scale));
  if (!run) return;  // validate(): every check has run, nothing is written
  IndexerJob<std::int8_t, half> job{s,
                                    in.query.data(),
                                    in.key.data(),
                                    in.weights.data(),
                                    out.sparse_indices.data(),
                                    nullptr,
                                    static_cast<Index>(p.sparse_count),
                                    p.sparse_mode == 3,
                                    in.query_dequant_scale.data(),
                                    in.key_dequant_scale.data()};
  indexer_run(job, exec);
}

inline void quant_lightning_indexer_call(const QuantLightningIndexerParams& p,
                                         const QuantLightningIndexerInputs& in,
                                         const QuantLightningIndexerOutputs& out,
                                         const ExecConfig& exec, bool run) {
  check_exec("quant_lightning_indexer", exec);
  dense_call("quant_lightning_indexer", in, out, run, [&](const auto& din, const auto& dout) {
    quant_lightning_indexer_dense(p, din, dout, exec, run);
  });
}
}  // namespace detail

/// Every check of quant_lightning_indexer() without computing or writing anything.
inline void validate(const QuantLightningIndexerParams& p, const QuantLightningIndexerInputs& in,
                     const QuantLightningIndexerOutputs& out, const ExecConfig& exec = {}) {
  detail::quant_lightning_indexer_call(p, in, out, exec, false);
}

/// CANN QuantLightningIndexer as validate -> plan -> run (every check before any write).
inline void quant_lightning_indexer(const QuantLightningIndexerParams& p,
                                    const QuantLightningIndexerInputs& in,
                                    const QuantLightningIndexerOutputs& out,
                                    const ExecConfig& exec = {}) {
  detail::quant_lightning_indexer_call(p, in, out, exec, true);
}

}  // namespace attnref
