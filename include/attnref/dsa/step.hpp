#pragma once
/// attnref::dsa_step — one DeepSeek sparse attention (DSA) step composed of the public pieces, as
/// DeepSeek-V3.2's attention layer runs them on Ascend, for prefill (TND) and decode alike:
///
///   index_query, weights ─ lightning_indexer(index_key cache) ──> sparse_indices [.., 1, count]
///   query, query_rope    ─ sparse_flash_attention(latent cache, sparse_indices) ──> output
///
/// The index-key cache and the latent cache (key [.., 1, 512], key_rope [.., 1, 64]) share the
/// layout, the lengths and, with PA_BSND, the block table (a serving stack pages both caches with
/// the same table). The indexer's lists are tokens (sparse_block_size 1), its sparse_mode is the
/// attention's: with sparse_mode 3 every row sees the keys up to its own position, and with
/// sparse_count >= the visible length the step is causal MLA attention over the whole cache.
/// Every check of both operators runs before anything is written; the intermediate indices can be
/// read back through outputs.sparse_indices.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnref/attention/attention.hpp"
#include "attnref/core/dense.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/exec.hpp"
#include "attnref/core/view.hpp"
#include "attnref/dsa/lightning_indexer.hpp"
#include "attnref/dsa/sparse_flash_attention.hpp"

namespace attnref {

struct DsaStepParams {
  std::string layout_query = "TND";   ///< BSND or TND (both operators)
  std::string layout_kv = "PA_BSND";  ///< BSND, TND or PA_BSND (both caches)
  std::int64_t sparse_count = 2048;   ///< tokens the indexer keeps per row
  std::int64_t sparse_mode = 3;       ///< 0 or 3 (both operators)
  double scale_value = 1.0;           ///< the attention's scale
  bool strict = true;                 ///< both operators' vendor rules
};

/// T: half or bfloat16 (float: attnref extension); TW: the indexer weights' type (T or float).
template <class T, class TW = T>
struct DsaStepInputs {
  StridedView<const T> index_query{};  ///< [B, S1, N1i, 128] or [T1, N1i, 128]
  StridedView<const TW> weights{};     ///< [B, S1, N1i] or [T1, N1i]
  StridedView<const T> index_key{};    ///< the index-key cache [.., 1, 128] in layout_kv
  StridedView<const T> query{};        ///< [B, S1, N1, 512] or [T1, N1, 512]
  StridedView<const T> query_rope{};   ///< the query's shape with 64
  StridedView<const T> key{};          ///< the latent cache [.., 1, 512] in layout_kv (V too)
  StridedView<const T> key_rope{};     ///< [.., 1, 64]
  StridedView<const std::int32_t> block_table{};         ///< PA_BSND: both caches' table
  std::vector<std::int64_t> actual_seq_lengths_query{};  ///< [B] (TND: cumulative)
  std::vector<std::int64_t> actual_seq_lengths_kv{};     ///< [B] (TND: cumulative)
};

template <class T>
struct DsaStepOutputs {
  StridedView<T> output{};                     ///< the query's shape
  StridedView<std::int32_t> sparse_indices{};  ///< optional: [.., 1, sparse_count]
};

namespace detail {

/// The two operators' parameters and inputs, the indices in `idx` ([rows, 1, count]).
template <class T, class TW>
struct DsaStepCalls {
  LightningIndexerParams lp;
  LightningIndexerInputs<T, TW> li;
  SparseFlashAttentionParams sp;
  SparseFlashAttentionInputs<T> si;
  Dims idx_shape;

  DsaStepCalls(const DsaStepParams& p, const DsaStepInputs<T, TW>& in) {
    lp.layout_query = sp.layout_query = p.layout_query;
    lp.layout_key = sp.layout_kv = p.layout_kv;
    lp.sparse_count = p.sparse_count;
    lp.sparse_mode = sp.sparse_mode = p.sparse_mode;
    lp.strict = sp.strict = p.strict;
    sp.scale_value = p.scale_value;
    sp.sparse_block_size = 1;
    li.query = in.index_query, li.key = in.index_key, li.weights = in.weights;
    li.block_table = si.block_table = in.block_table;
    li.actual_seq_lengths_query = si.actual_seq_lengths_query = in.actual_seq_lengths_query;
    li.actual_seq_lengths_key = si.actual_seq_lengths_kv = in.actual_seq_lengths_kv;
    si.query = in.query, si.query_rope = in.query_rope;
    si.key = in.key, si.key_rope = in.key_rope;
    // The indices: the query's leading dimensions, one key head, sparse_count entries.
    const Dims q = in.query.shape(), iq = in.index_query.shape();
    ATTNREF_CHECK(!in.query.absent() && (q.size() == 3 || q.size() == 4), std::invalid_argument,
                  "dsa_step", "query.shape", "mismatch", "[B, S1, N1, 512] or [T1, N1, 512]",
                  shape_str(in.query));
    ATTNREF_CHECK(!in.index_query.absent() && iq.size() == q.size() && iq[0] == q[0] &&
                      (q.size() == 3 || iq[1] == q[1]),
                  std::invalid_argument, "dsa_step", "index_query.shape",
                  "rows differ from the query's", "the query's leading dimensions",
                  shape_str(in.index_query));
    ATTNREF_CHECK(p.sparse_count > 0 && p.sparse_count <= (std::int64_t{1} << 24),
                  std::invalid_argument, "dsa_step", "params.sparse_count", "out of range",
                  "[1, 2^24]", std::to_string(p.sparse_count));
    idx_shape = q.size() == 3 ? Dims{q[0], 1, p.sparse_count} : Dims{q[0], q[1], 1, p.sparse_count};
  }
};

template <class T, class TW>
void dsa_step_call(const DsaStepParams& p, const DsaStepInputs<T, TW>& in,
                   const DsaStepOutputs<T>& out, const ExecConfig& exec, bool run) {
  constexpr const char* fn = "dsa_step";
  CallerScope scope(fn);  // the inner operators' rejections are reported as dsa_step's
  check_exec(fn, exec);
  check_views(fn, "index_query", in.index_query, "weights", in.weights, "index_key", in.index_key,
              "query", in.query, "query_rope", in.query_rope, "key", in.key, "key_rope",
              in.key_rope, "block_table", in.block_table, "output", out.output,
              "outputs.sparse_indices", out.sparse_indices);
  DsaStepCalls<T, TW> c(p, in);
  Index n = 1;
  for (Index e : c.idx_shape) n = checked_mul(fn, "sparse_indices' size", n, e);
  ATTNREF_CHECK(n <= DenseArena::kMaxDenseCopy, std::invalid_argument, fn,
                "rows * params.sparse_count", "too large for the step's index buffer",
                "<= 2^31 entries", std::to_string(n));
  if (!out.sparse_indices.absent())
    ATTNREF_CHECK(out.sparse_indices.shape() == c.idx_shape, std::invalid_argument, fn,
                  "outputs.sparse_indices.shape", "mismatch",
                  shape_str(StridedView<const std::int32_t>(nullptr, c.idx_shape)),
                  shape_str(out.sparse_indices));
  // Overlaps sparse_flash_attention cannot see: with the indexer's inputs, and of the indices.
  check_out_overlaps(fn, "output", out.output, "index_query", in.index_query, "weights", in.weights,
                     "index_key", in.index_key);
  if (!out.sparse_indices.absent())
    check_out_overlaps(fn, "outputs.sparse_indices", out.sparse_indices, "output", out.output,
                       "index_query", in.index_query, "weights", in.weights, "index_key",
                       in.index_key, "query", in.query, "query_rope", in.query_rope, "key", in.key,
                       "key_rope", in.key_rope, "block_table", in.block_table);
  std::vector<std::int32_t> idx(static_cast<size_t>(n), -1);
  const StridedView<std::int32_t> iv(idx.data(), c.idx_shape);
  c.si.sparse_indices = StridedView<const std::int32_t>(idx.data(), c.idx_shape);
  validate(c.lp, c.li, LightningIndexerOutputs<T>{iv, {}}, exec);
  validate(c.sp, c.si, SparseFlashAttentionOutputs<T>{out.output}, exec);
  if (!run) return;
  lightning_indexer(c.lp, c.li, LightningIndexerOutputs<T>{iv, {}}, exec);
  sparse_flash_attention(c.sp, c.si, SparseFlashAttentionOutputs<T>{out.output}, exec);
  if (!out.sparse_indices.absent())
    detail::for_each_offset(out.sparse_indices, [&, e = size_t{0}](Index off) mutable {
      out.sparse_indices.data()[off] = idx[e++];
    });
}
}  // namespace detail

/// Every check of dsa_step() (both operators'), without computing or writing anything.
template <class T, class TW>
void validate(const DsaStepParams& p, const DsaStepInputs<T, TW>& in, const DsaStepOutputs<T>& out,
              const ExecConfig& exec = {}) {
  detail::dsa_step_call(p, in, out, exec, false);
}

/// One DSA step: lightning_indexer, then sparse_flash_attention over its lists.
template <class T, class TW>
void dsa_step(const DsaStepParams& p, const DsaStepInputs<T, TW>& in, const DsaStepOutputs<T>& out,
              const ExecConfig& exec = {}) {
  detail::dsa_step_call(p, in, out, exec, true);
}

}  // namespace attnref
