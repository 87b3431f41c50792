#pragma once
/// attnref::nsa_compress_attention_infer — CANN aclnnNsaCompressAttentionInfer (docs/semantics.md
/// §8): the compressed branch of Native Sparse Attention for decode, fused with the importance
/// score and the top-k block selection.
///
/// Per batch b (cmp_len_b compressed keys in a paged cache, q_len_b <= 4 query tokens), query
/// token i, head h (kv head h / G):
///   s_t = q·k_t · scale_value (fp32); with an attention mask and q_len_b > 1 the last
///   compressed key gets s = −3e38 for the tokens not yet covered: q_len_b − i − 1 > tail_b,
///   tail_b = sel_len_b − ((cmp_len_b − 1)·d + l); P = softmax(s) (fp32); out = Σ_t T(P_t)·v_t
///   (P rounded to the output type before P·V, summed in fp32); then importance scores, the group
///   sum, forced blocks and top-k as in nsa/importance.hpp; topk [.., KV_N, k] per kv head.
/// A batch without compressed keys (and padded BSND rows) gives output 0 and top-k −1; top-k
/// positions past n_sel (relaxed mode) are −1.
///
/// The vendor's constraints are checked by default (params.strict); strict = false keeps only
/// what the definition needs (positive sizes, d <= l <= l', d dividing l and l'), for research
/// shapes. Everything is checked before anything is written.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/attention/attention.hpp"
#include "attnref/attention/variant.hpp"
#include "attnref/core/dense.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/layout.hpp"
#include "attnref/core/types.hpp"
#include "attnref/detail/simd.hpp"
#include "attnref/detail/threading.hpp"
#include "attnref/nsa/importance.hpp"

namespace attnref {

struct NsaCompressAttentionInferParams {
  std::int64_t num_heads = 1;               ///< numHeads (N)
  std::int64_t num_key_value_heads = 1;     ///< numKeyValueHeads (KV_N)
  std::int64_t select_block_size = 64;      ///< selectBlockSize l'
  std::int64_t select_block_count = 16;     ///< selectBlockCount k
  std::int64_t compress_block_size = 32;    ///< compressBlockSize l
  std::int64_t compress_block_stride = 16;  ///< compressBlockStride d
  double scale_value = 1.0;                 ///< scaleValue
  std::string layout = "TND";               ///< layoutOptional: TND or BSND
  std::int64_t page_block_size = 128;       ///< pageBlockSize
  std::int64_t sparse_mode = 0;             ///< sparseMode (0; the mask's presence is the flag)
  bool strict = true;                       ///< the vendor's constraint list (false: relaxed)
};

/// T: half or bfloat16 (float: attnref extension). The mask's content is not read: its
/// presence turns on the multi-token rule (as the kernel's attenMaskFlag).
template <class T>
struct NsaCompressAttentionInferInputs {
  StridedView<const T> query{};  ///< TND [T, N, Dqk] or BSND [B, S, N, Dqk]
  StridedView<const T> key{};    ///< [numBlocks, pageBlockSize, KV_N·Dqk] (compressed keys)
  StridedView<const T> value{};  ///< [numBlocks, pageBlockSize, KV_N·Dv]
  StridedView<const std::uint8_t> atten_mask{};
  StridedView<const std::int32_t> block_table{};      ///< [B, maxBlocks]
  std::vector<std::int64_t> actual_q_seq_len{};       ///< [B] per batch (empty: 1 each / S)
  std::vector<std::int64_t> actual_cmp_kv_seq_len{};  ///< [B] compressed lengths (required)
  std::vector<std::int64_t> actual_sel_kv_seq_len{};  ///< [B] raw lengths (multi-token mask)

  /// Calls f(name, view) for every tensor field.
  template <class F>
  void for_each_view(F&& f) {
    f("query", query), f("key", key), f("value", value), f("atten_mask", atten_mask);
    f("block_table", block_table);
  }
};

template <class T>
struct NsaCompressAttentionInferOutputs {
  StridedView<T> output;           ///< TND [T, N, Dv] or BSND [B, S, N, Dv]
  StridedView<std::int32_t> topk;  ///< TND [T, KV_N, k] or BSND [B, S, KV_N, k]
  /// Optional debug outputs (fp32): the probabilities [T, N, >= max cmp_len] (BSND: [B, S, N,
  /// ...]); the per-head scores [T, N, >= max n_sel]; the group scores with the forced blocks
  /// [T, KV_N, >= max n_sel]. Entries past a row's length are 0.
  StridedView<float> probs{};
  StridedView<float> head_scores{};
  StridedView<float> group_scores{};

  /// Calls f(name, view) for every tensor field.
  template <class F>
  void for_each_view(F&& f) {
    f("output", output), f("topk", topk), f("probs", probs), f("head_scores", head_scores);
    f("group_scores", group_scores);
  }
};

namespace detail {

/// The multi-token mask as an engine hook: the last compressed key gets −3e38 for query rows
/// with q_len − i − 1 > tail[b].
template <class T>
struct NsaVariant {
  const std::vector<Index>* tail = nullptr;  // null: no mask
  bool has_transform() const { return tail != nullptr; }
  KvRange kv_range(const SeqInfo& s, Index, Index) const { return {0, s.kv_len}; }
  TileMask classify(const SeqInfo&, Index, Index, Index, Index) const { return TileMask::None; }
  bool row_interval(const SeqInfo& s, const Coord&, KvRange& v) const {
    v = {0, s.kv_len};
    return true;
  }
  bool masked(const SeqInfo&, const Coord&) const { return false; }
  /// P·V takes the probabilities rounded to the output type (the engine's two-pass mode).
  template <class Acc>
  void round_p(const Coord&, Acc* row, Index cols) const {
    if constexpr (std::is_same_v<T, half> && std::is_same_v<Acc, float>) {
      simd::round_to_half(row, cols);  // the same bits as the loop below, vectorised
    } else if constexpr (std::is_same_v<T, bfloat16> && std::is_same_v<Acc, float>) {
      simd::round_to_bfloat16(row, cols);  // (likewise)
    } else {
      for (Index j = 0; j < cols; ++j)
        row[j] = static_cast<Acc>(static_cast<float>(T(static_cast<float>(row[j]))));
    }
  }
  template <class Acc>
  Acc transform(const SeqInfo& s, const Coord& c, Acc score) const {
    if (c.kv == s.kv_len - 1 && s.q_len - c.q - 1 > (*tail)[static_cast<size_t>(c.batch)])
      return static_cast<Acc>(-3e38f);
    return score;
  }
};

inline bool nsa_step16(std::int64_t v, std::int64_t hi) {
  return v >= 16 && v <= hi && v % 16 == 0;
}

}  // namespace detail

namespace detail {
/// What nsa_compress_attention_infer's checks found: block sizes and heads (params), the batch
/// and its lengths, the validated compressed cache, the multi-token mask's tails.
template <class T>
struct NsaCmpPlan {
  std::int64_t l = 0, d = 0, ls = 0, k = 0;
  Index N = 0, KVN = 0, G = 0, B = 0, S = 0, total = 0, max_q = 0, Dqk = 0, Dv = 0;
  Index max_cmp = 0, max_sel_blocks = 0;
  bool tnd = false, mask = false;
  std::string rule;  // appended to the messages of the vendor's rules (params.strict)
  std::vector<Index> qlen, cmp, tail;
  PagedKvCache<const T> cache;
};

/// Block sizes, layout, scale and heads.
template <class T>
void nsa_cmp_params(const NsaCompressAttentionInferParams& p, NsaCmpPlan<T>& pl) {
  pl.rule = p.strict ? " (vendor rule; params.strict = false relaxes it)" : "";
  const std::string& rule = pl.rule;
  // Block sizes.
  const std::int64_t l = p.compress_block_size, d = p.compress_block_stride,
                     ls = p.select_block_size, k = p.select_block_count;
  ATTNREF_CHECK(l > 0 && d > 0 && ls > 0 && k > 0, std::invalid_argument,
                "nsa_compress_attention_infer", "params block sizes / select_block_count",
                "not positive", "> 0",
                std::to_string(l) + ", " + std::to_string(d) + ", " + std::to_string(ls) + ", " +
                    std::to_string(k));
  ATTNREF_CHECK(l >= d, std::invalid_argument, "nsa_compress_attention_infer",
                "params.compress_block_size", "below compress_block_stride",
                ">= " + std::to_string(d), std::to_string(l));
  ATTNREF_CHECK(ls >= l, std::invalid_argument, "nsa_compress_attention_infer",
                "params.select_block_size", "below compress_block_size", ">= " + std::to_string(l),
                std::to_string(ls));
  ATTNREF_CHECK(
      l % d == 0 && ls % d == 0, std::invalid_argument, "nsa_compress_attention_infer",
      "params.compress_block_stride", "must divide compress_block_size and select_block_size",
      "a divisor of both",
      "l " + std::to_string(l) + ", d " + std::to_string(d) + ", l' " + std::to_string(ls));
  if (p.strict) {
    ATTNREF_CHECK(detail::nsa_step16(l, 128), std::invalid_argument, "nsa_compress_attention_infer",
                  "params.compress_block_size", "not supported" + rule, "16, 32, ..., 128",
                  std::to_string(l));
    ATTNREF_CHECK(detail::nsa_step16(ls, 128), std::invalid_argument,
                  "nsa_compress_attention_infer", "params.select_block_size",
                  "not supported" + rule, "16, 32, ..., 128", std::to_string(ls));
    ATTNREF_CHECK(detail::nsa_step16(d, 64), std::invalid_argument, "nsa_compress_attention_infer",
                  "params.compress_block_stride", "not supported" + rule, "16, 32, 48 or 64",
                  std::to_string(d));
  }
  const Layout layout = detail::parse_layout("nsa_compress_attention_infer", "params.layout",
                                             p.layout, {Layout::TND, Layout::BSND});
  ATTNREF_CHECK(p.sparse_mode == 0, std::invalid_argument, "nsa_compress_attention_infer",
                "params.sparse_mode", "not supported", "0", std::to_string(p.sparse_mode));
  ATTNREF_CHECK(std::isfinite(p.scale_value), std::invalid_argument, "nsa_compress_attention_infer",
                "params.scale_value", "not finite", "a finite value",
                std::to_string(p.scale_value));
  // Heads and the query.
  const Index N = p.num_heads, KVN = p.num_key_value_heads;
  ATTNREF_CHECK(N > 0 && KVN > 0 && N % KVN == 0, std::invalid_argument,
                "nsa_compress_attention_infer", "params.num_heads",
                "not a positive multiple of num_key_value_heads",
                "a multiple of " + std::to_string(KVN), std::to_string(N));
  const Index G = N / KVN;
  if (p.strict)
    ATTNREF_CHECK(G <= 128 && 128 % G == 0, std::invalid_argument, "nsa_compress_attention_infer",
                  "params.num_heads / num_key_value_heads", "group size not supported" + rule,
                  "a divisor of 128", std::to_string(G));
  pl.l = l, pl.d = d, pl.ls = ls, pl.k = k;
  pl.N = N, pl.KVN = KVN, pl.G = G;
  pl.tnd = layout == Layout::TND;
}

/// The query, the batch (block_table's rows) and the query lengths.
template <class T>
void nsa_cmp_lengths(const NsaCompressAttentionInferParams& p,
                     const NsaCompressAttentionInferInputs<T>& in, NsaCmpPlan<T>& pl) {
  using detail::shape_str;
  const bool tnd = pl.tnd;
  const Index N = pl.N;
  const std::string& rule = pl.rule;
  const auto& q = in.query;
  ATTNREF_CHECK(
      !q.absent() && q.rank() == (tnd ? 3 : 4) && q.size(tnd ? 1 : 2) == N, std::invalid_argument,
      "nsa_compress_attention_infer", "query.shape", "mismatch",
      tnd ? "[T, " + std::to_string(N) + ", Dqk]" : "[B, S, " + std::to_string(N) + ", Dqk]",
      shape_str(q));
  const Index Dqk = q.size(q.rank() - 1);
  // Batches and lengths.
  const auto& bt = in.block_table;
  ATTNREF_CHECK(!bt.absent() && bt.rank() == 2 && bt.size(0) > 0, std::invalid_argument,
                "nsa_compress_attention_infer", "block_table.shape", "required: [B, maxBlocks]",
                "[B, maxBlocks]", shape_str(bt));
  const Index B = bt.size(0);
  if (p.strict)
    ATTNREF_CHECK(B <= 10000, std::invalid_argument, "nsa_compress_attention_infer",
                  "block_table.shape[0]", "batch out of range" + rule, "[1, 10000]",
                  std::to_string(B));
  ATTNREF_CHECK(static_cast<Index>(in.actual_cmp_kv_seq_len.size()) == B, std::invalid_argument,
                "nsa_compress_attention_infer", "actual_cmp_kv_seq_len", "required, one per batch",
                std::to_string(B), std::to_string(in.actual_cmp_kv_seq_len.size()));
  const Index S = tnd ? 0 : q.size(1);
  ATTNREF_CHECK(tnd || q.size(0) == B, std::invalid_argument, "nsa_compress_attention_infer",
                "query.shape[0]", "differs from block_table's batch", std::to_string(B),
                shape_str(q));
  std::vector<Index> qlen(static_cast<size_t>(B), tnd ? 1 : S);
  if (!in.actual_q_seq_len.empty()) {
    ATTNREF_CHECK(static_cast<Index>(in.actual_q_seq_len.size()) == B, std::invalid_argument,
                  "nsa_compress_attention_infer", "actual_q_seq_len", "size mismatch",
                  std::to_string(B), std::to_string(in.actual_q_seq_len.size()));
    for (Index b = 0; b < B; ++b) {
      const std::int64_t v = in.actual_q_seq_len[static_cast<size_t>(b)];
      ATTNREF_CHECK(v >= 1 && v <= 4 && (tnd || v <= S), std::invalid_argument,
                    "nsa_compress_attention_infer", "actual_q_seq_len[" + std::to_string(b) + "]",
                    "out of range", tnd ? "[1, 4]" : "[1, min(4, S)]", std::to_string(v));
      qlen[static_cast<size_t>(b)] = static_cast<Index>(v);
    }
  }
  Index total = 0, max_q = 0;
  for (Index v : qlen) total += v, max_q = std::max(max_q, v);
  if (tnd)
    ATTNREF_CHECK(q.size(0) == total, std::invalid_argument, "nsa_compress_attention_infer",
                  "query.shape[0]", "differs from the sum of actual_q_seq_len",
                  std::to_string(total), shape_str(q));
  else
    ATTNREF_CHECK(S >= 1 && S <= 4, std::invalid_argument, "nsa_compress_attention_infer",
                  "query.shape[1]", "q_S out of range", "[1, 4]", std::to_string(S));
  pl.Dqk = Dqk, pl.B = B, pl.S = S, pl.total = total, pl.max_q = max_q;
  pl.qlen = std::move(qlen);
}

/// The paged compressed K / V with their lengths (the vendor's limits under params.strict).
template <class T>
void nsa_cmp_cache(const NsaCompressAttentionInferParams& p,
                   const NsaCompressAttentionInferInputs<T>& in, NsaCmpPlan<T>& pl) {
  using detail::shape_str;
  const Index B = pl.B, KVN = pl.KVN, Dqk = pl.Dqk;
  const std::int64_t l = pl.l, d = pl.d, ls = pl.ls, k = pl.k;
  const std::string& rule = pl.rule;
  const auto& bt = in.block_table;
  std::vector<Index>& cmp = pl.cmp;
  cmp.assign(static_cast<size_t>(B), 0);
  // Paged compressed K / V.
  const auto& kt = in.key;
  const auto& vt = in.value;
  ATTNREF_CHECK(
      !kt.absent() && kt.rank() == 3 && kt.size(1) == p.page_block_size && kt.size(2) == KVN * Dqk,
      std::invalid_argument, "nsa_compress_attention_infer", "key.shape", "mismatch",
      "[numBlocks, " + std::to_string(p.page_block_size) + ", " + std::to_string(KVN * Dqk) + "]",
      shape_str(kt));
  ATTNREF_CHECK(
      !vt.absent() && vt.rank() == 3 && vt.size(0) == kt.size(0) && vt.size(1) == kt.size(1) &&
          vt.size(2) > 0 && vt.size(2) % KVN == 0,
      std::invalid_argument, "nsa_compress_attention_infer", "value.shape", "mismatch",
      "[" + std::to_string(kt.size(0)) + ", " + std::to_string(kt.size(1)) + ", KV_N * Dv]",
      shape_str(vt));
  const Index Dv = vt.size(2) / KVN, nb = kt.size(0), pbs = kt.size(1);
  ATTNREF_CHECK(pbs > 0, std::invalid_argument, "nsa_compress_attention_infer",
                "params.page_block_size", "not positive", "> 0", std::to_string(pbs));
  if (p.strict) {
    ATTNREF_CHECK(Dqk <= 192 && Dv <= 128 && Dqk >= Dv, std::invalid_argument,
                  "nsa_compress_attention_infer", "query / value head sizes",
                  "not supported" + rule, "Dv <= Dqk <= 192, Dv <= 128",
                  "Dqk " + std::to_string(Dqk) + ", Dv " + std::to_string(Dv));
    ATTNREF_CHECK(detail::nsa_step16(pbs, 128), std::invalid_argument,
                  "nsa_compress_attention_infer", "params.page_block_size", "not supported" + rule,
                  "16, 32, ..., 128", std::to_string(pbs));
  }
  Index max_cmp = 0, max_sel_blocks = 0;
  const Index capacity = detail::checked_mul(
      "nsa_compress_attention_infer", "block_table.shape[1] * page_block_size", bt.size(1), pbs);
  for (Index b = 0; b < B; ++b) {
    const std::int64_t v = in.actual_cmp_kv_seq_len[static_cast<size_t>(b)];
    ATTNREF_CHECK(v >= 0 && v <= capacity, std::invalid_argument, "nsa_compress_attention_infer",
                  "actual_cmp_kv_seq_len[" + std::to_string(b) + "]", "out of range",
                  "[0, maxBlocks * pageBlockSize = " + std::to_string(capacity) + "]",
                  std::to_string(v));
    if (p.strict)
      ATTNREF_CHECK(v <= 8192, std::invalid_argument, "nsa_compress_attention_infer",
                    "actual_cmp_kv_seq_len[" + std::to_string(b) + "]",
                    "above the compressed length limit" + rule, "<= 8192", std::to_string(v));
    cmp[static_cast<size_t>(b)] = static_cast<Index>(v);
    max_cmp = std::max(max_cmp, cmp[static_cast<size_t>(b)]);
    const Index ns = nsa_select_block_count(v, l, d, ls);
    max_sel_blocks = std::max(max_sel_blocks, ns);
    if (v > 0) {
      const Index ceil_len = (v - 1) * d + l;
      if (p.strict) {
        ATTNREF_CHECK(ceil_len / ls <= 4096, std::invalid_argument, "nsa_compress_attention_infer",
                      "actual_cmp_kv_seq_len[" + std::to_string(b) + "]",
                      "too many select blocks" + rule, "(cmp - 1) * d + l <= 4096 * l'",
                      std::to_string(v));
        ATTNREF_CHECK(k <= ceil_len / ls, std::invalid_argument, "nsa_compress_attention_infer",
                      "params.select_block_count",
                      "above the select blocks of batch " + std::to_string(b) + rule,
                      "<= ((cmp - 1) * d + l) / l' = " + std::to_string(ceil_len / ls),
                      std::to_string(k));
      }
    }
  }
  pl.cache = {StridedView<const T, 4>(kt.data(), {nb, pbs, KVN, Dqk}),
              StridedView<const T, 4>(vt.data(), {nb, pbs, KVN, Dv}),
              StridedView<const std::int32_t, 2>(bt.data(), {B, bt.size(1)}), cmp};
  pl.cache.validate("nsa_compress_attention_infer",
                    {"key", "value", "block_table", "actual_cmp_kv_seq_len",
                     "params.page_block_size", "page_block_size"});
  pl.Dv = Dv, pl.max_cmp = max_cmp, pl.max_sel_blocks = max_sel_blocks;
}

/// The multi-token mask: each batch's tail, consistent with its selected and compressed lengths.
template <class T>
void nsa_cmp_mask(const NsaCompressAttentionInferInputs<T>& in, NsaCmpPlan<T>& pl) {
  const Index B = pl.B;
  const std::int64_t l = pl.l, d = pl.d;
  const std::vector<Index>& cmp = pl.cmp;
  const std::vector<Index>& qlen = pl.qlen;
  // The multi-token mask.
  const bool mask = pl.mask = !in.atten_mask.absent() && pl.max_q > 1;
  std::vector<Index>& tail = pl.tail;
  tail.assign(static_cast<size_t>(B), 0);
  if (mask) {
    ATTNREF_CHECK(static_cast<Index>(in.actual_sel_kv_seq_len.size()) == B, std::invalid_argument,
                  "nsa_compress_attention_infer", "actual_sel_kv_seq_len",
                  "required with an attention mask and several query tokens", std::to_string(B),
                  std::to_string(in.actual_sel_kv_seq_len.size()));
    for (Index b = 0; b < B; ++b) {
      const std::int64_t sel = in.actual_sel_kv_seq_len[static_cast<size_t>(b)];
      const Index c = cmp[static_cast<size_t>(b)];
      const std::int64_t t = c > 0 ? sel - ((c - 1) * d + l) : 0;
      ATTNREF_CHECK(c == 0 || (t >= 0 && t < d), std::invalid_argument,
                    "nsa_compress_attention_infer",
                    "actual_sel_kv_seq_len[" + std::to_string(b) + "]",
                    "inconsistent with the compressed length",
                    "cmp = (sel - l) / d + 1 = " + std::to_string(c), std::to_string(sel));
      ATTNREF_CHECK(sel >= qlen[static_cast<size_t>(b)], std::invalid_argument,
                    "nsa_compress_attention_infer", "actual_q_seq_len[" + std::to_string(b) + "]",
                    "above actual_sel_kv_seq_len", "<= " + std::to_string(sel),
                    std::to_string(qlen[static_cast<size_t>(b)]));
      tail[static_cast<size_t>(b)] = static_cast<Index>(t);
    }
  }
}

/// The output, topk and the optional debug outputs.
template <class T>
void nsa_cmp_outputs(const NsaCompressAttentionInferOutputs<T>& out, const NsaCmpPlan<T>& pl) {
  using detail::shape_str;
  const bool tnd = pl.tnd;
  const Index B = pl.B, S = pl.S, total = pl.total, N = pl.N, KVN = pl.KVN, Dv = pl.Dv;
  const Index max_cmp = pl.max_cmp, max_sel_blocks = pl.max_sel_blocks;
  const std::int64_t k = pl.k;
  // Outputs.
  auto out_shape = [&](Index last, Index heads) {
    return tnd ? std::vector<Index>{total, heads, last} : std::vector<Index>{B, S, heads, last};
  };
  auto dims_str = [](const std::vector<Index>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
  };
  ATTNREF_CHECK(!out.output.absent() && out.output.shape() == out_shape(Dv, N),
                std::invalid_argument, "nsa_compress_attention_infer", "output.shape", "mismatch",
                dims_str(out_shape(Dv, N)), shape_str(out.output));
  ATTNREF_CHECK(!out.topk.absent() && out.topk.shape() == out_shape(k, KVN), std::invalid_argument,
                "nsa_compress_attention_infer", "topk.shape", "mismatch",
                dims_str(out_shape(k, KVN)), shape_str(out.topk));
  auto debug = [&](const StridedView<float>& t, const char* name, Index heads, Index need) {
    if (t.absent()) return;
    const auto want = out_shape(need, heads);
    ATTNREF_CHECK(
        !t.absent() && t.rank() == static_cast<Index>(want.size()) &&
            std::equal(want.begin(), want.end() - 1, t.shape().begin()) && t.shape().back() >= need,
        std::invalid_argument, "nsa_compress_attention_infer", std::string(name) + ".shape",
        "mismatch", dims_str(want) + " (last dimension at least)", shape_str(t));
  };
  debug(out.probs, "probs", N, max_cmp);
  debug(out.head_scores, "head_scores", N, max_sel_blocks);
  debug(out.group_scores, "group_scores", KVN, max_sel_blocks);
}

/// The selection outputs of query row `row` for kv head kh: the importance of each head of its
/// group (p_of(g): its probabilities over the row's c compressed keys) summed over the group,
/// the forced blocks and the top-k, plus the optional probs / head_scores / group_scores rows.
/// hs, gs: max_sel_blocks floats of scratch each; order: the top-k's scratch.
template <class T, class P>
void nsa_cmp_select(const NsaCompressAttentionInferOutputs<T>& out, const NsaCmpPlan<T>& pl,
                    Index row, Index kh, Index c, const P& p_of, float* hs, float* gs,
                    std::vector<std::int32_t>& order) {
  const Index N = pl.N, KVN = pl.KVN, G = pl.G;
  const Index ns = nsa_select_block_count(c, pl.l, pl.d, pl.ls);
  const auto put = [](const StridedView<float>& x, Index at, const float* src, Index n) {
    if (x.absent()) return;
    const Index w = x.shape().back();
    float* dst = x.data() + at * w;
    std::fill(dst, dst + w, 0.0f);
    std::copy(src, src + n, dst);
  };
  std::fill(gs, gs + ns, 0.0f);
  for (Index g = 0; g < G; ++g) {
    const Index h = kh * G + g;
    const float* p_h = p_of(g);
    nsa_head_scores(p_h, c, pl.l, pl.d, pl.ls, hs);
    for (Index s2 = 0; s2 < ns; ++s2) gs[s2] += hs[s2];
    put(out.probs, row * N + h, p_h, c);
    put(out.head_scores, row * N + h, hs, ns);
  }
  nsa_force_blocks(gs, ns);
  nsa_topk(gs, ns, pl.k, out.topk.data() + (row * KVN + kh) * pl.k, order);
  put(out.group_scores, row * KVN + kh, gs, ns);
}

/// The selection's scratch: hs then gs (max_sel_blocks floats each), a row of probabilities
/// padded with zeros, the top-k's order.
struct NsaSelectScratch {
  std::vector<float> scores, row;
  std::vector<std::int32_t> order;
};

/// The selection as the engine's item_probs hook: the worker that finishes an item turns its rows
/// into their kv heads' top-k while the probabilities are still in its cache. (Before, a probs
/// tensor of the whole batch went to memory and back: nsa/compress_attention/B:20 now takes
/// 0.90 / 0.88 of that time on one / two threads, AMD Zen 5.) done[row · KV_N + kv head] marks
/// the rows handed over.
template <class T>
struct NsaCmpSelect {
  const NsaCompressAttentionInferOutputs<T>* out = nullptr;
  const NsaCmpPlan<T>* pl = nullptr;
  const std::vector<Index>* q_cu = nullptr;  // TND: each batch's first row
  std::uint8_t* done = nullptr;

  Index row_of(Index b, Index i) const {
    return pl->tnd ? (*q_cu)[static_cast<size_t>(b)] + i : b * pl->S + i;
  }
  void take(const SeqInfo& s, const ItemProbs<float>& p) const {
    thread_local NsaSelectScratch x;
    const Index nsb = std::max<Index>(1, pl->max_sel_blocks), c = s.kv_len;
    x.scores.resize(static_cast<size_t>(2 * nsb));
    // (every item holds all c keys: NsaVariant's kv_range is [0, kv_len), p.kv_begin is 0)
    for (Index i = p.q_begin; i < p.q_end; ++i) {
      const Index row = row_of(s.batch, i);
      for (Index kh = p.head_begin; kh < p.head_end; ++kh) {
        const auto p_of = [&](Index g) { return p.at(kh, g, i); };
        nsa_cmp_select(*out, *pl, row, kh, c, p_of, x.scores.data(), x.scores.data() + nsb,
                       x.order);
        done[static_cast<size_t>(row * pl->KVN + kh)] = 1;
      }
    }
  }
};

/// NsaVariant with the selection hook (nsa_compress_attention_infer's engine call).
template <class T>
struct NsaCmpVariant : NsaVariant<T> {
  NsaCmpSelect<T> sel;
  template <class Acc>
  void item_probs(const SeqInfo& s, const ItemProbs<Acc>& p) const {
    static_assert(std::is_same_v<Acc, float>, "NSA's engine computes in float");
    sel.take(s, p);
  }
};

/// The engine (P of every batch, head and query token over its compressed keys, and with it the
/// importance scores, forced blocks and top-k of each item's rows), then the rows it handed none
/// of: padded BSND rows (output 0) and rows without compressed keys.
template <class T>
void nsa_cmp_run(const NsaCompressAttentionInferParams& p,
                 const NsaCompressAttentionInferInputs<T>& in,
                 const NsaCompressAttentionInferOutputs<T>& out, const NsaCmpPlan<T>& pl,
                 const ExecConfig& exec) {
  const bool tnd = pl.tnd;
  const Index B = pl.B, S = pl.S, total = pl.total, N = pl.N, KVN = pl.KVN, Dqk = pl.Dqk,
              Dv = pl.Dv;
  const auto& q = in.query;
  AttentionInputs<T, T> e;
  std::vector<Index> q_cu{0};
  if (tnd) {
    e.q = StridedView<const T, 4>(q.data(), {1, total, N, Dqk});
    for (Index v : pl.qlen) q_cu.push_back(q_cu.back() + v);
    e.seq.q_cu = q_cu;
  } else {
    e.q = StridedView<const T, 4>(q.data(), {B, S, N, Dqk});
    e.seq.q = pl.qlen;
  }
  e.read_kv(pl.cache);
  AttentionParams ep;
  ep.scale = p.scale_value;
  AttentionOutputs<T, float> eo;
  eo.o = tnd ? StridedView<T, 4>(out.output.data(), {1, total, N, Dv})
             : StridedView<T, 4>(out.output.data(), {B, S, N, Dv});
  const Index rows = tnd ? total : B * S;
  std::vector<std::uint8_t> done(static_cast<size_t>(rows * KVN), 0);
  detail::NsaCmpVariant<T> var;
  if (pl.mask) var.tail = &pl.tail;
  var.sel = {&out, &pl, &q_cu, done.data()};
  attention_with(var, e, ep, eo, exec);

  NsaSelectScratch x;
  x.scores.resize(static_cast<size_t>(2 * std::max<Index>(1, pl.max_sel_blocks)));
  x.row.assign(static_cast<size_t>(std::max<Index>(1, pl.max_cmp)), 0.0f);  // (no item: P 0)
  for (Index b = 0; b < B; ++b)
    for (Index i = 0; i < (tnd ? pl.qlen[static_cast<size_t>(b)] : S); ++i) {
      const Index row = var.sel.row_of(b, i);
      const bool live = i < pl.qlen[static_cast<size_t>(b)];
      if (!live) std::fill_n(out.output.data() + row * N * Dv, N * Dv, T(0.0f));
      const Index c = live ? pl.cmp[static_cast<size_t>(b)] : 0;
      for (Index kh = 0; kh < KVN; ++kh)
        if (!done[static_cast<size_t>(row * KVN + kh)])
          nsa_cmp_select(
              out, pl, row, kh, c, [&](Index) { return static_cast<const float*>(x.row.data()); },
              x.scores.data(), x.scores.data() + x.scores.size() / 2, x.order);
    }
}

/// nsa_compress_attention_infer on dense arguments (the stand-ins of dense_call): every
/// check, then (run) the computation.
template <class T>
void nsa_compress_attention_infer_dense(const NsaCompressAttentionInferParams& p,
                                        const NsaCompressAttentionInferInputs<T>& in,
                                        const NsaCompressAttentionInferOutputs<T>& out,
                                        const ExecConfig& exec, bool run) {
  static_assert(std::is_same_v<T, half> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float>,
                "nsa_compress_attention_infer: half or bfloat16 (float: attnref extension)");
  detail::check_views("nsa_compress_attention_infer", "query", in.query, "key", in.key, "value",
                      in.value, "atten_mask", in.atten_mask, "block_table", in.block_table,
                      "output", out.output, "topk", out.topk, "probs", out.probs, "head_scores",
                      out.head_scores, "group_scores", out.group_scores);
  NsaCmpPlan<T> pl;
  nsa_cmp_params(p, pl);
  nsa_cmp_lengths(p, in, pl);
  nsa_cmp_cache(p, in, pl);
  nsa_cmp_mask(in, pl);
  nsa_cmp_outputs(out, pl);
  if (!run) return;  // validate(): every check has run, nothing is written
  nsa_cmp_run(p, in, out, pl, exec);
}

template <class T>
void nsa_compress_attention_infer_call(const NsaCompressAttentionInferParams& p,
                                       const NsaCompressAttentionInferInputs<T>& in,
                                       const NsaCompressAttentionInferOutputs<T>& out,
                                       const ExecConfig& exec, bool run) {
  check_exec("nsa_compress_attention_infer", exec);
  dense_call("nsa_compress_attention_infer", in, out, run, [&](const auto& din, const auto& dout) {
    nsa_compress_attention_infer_dense(p, din, dout, exec, run);
  });
}
}  // namespace detail

/// Every check of nsa_compress_attention_infer() (params, tensors, execution config), without
/// computing or writing anything.
template <class T>
void validate(const NsaCompressAttentionInferParams& p,
              const NsaCompressAttentionInferInputs<T>& in,
              const NsaCompressAttentionInferOutputs<T>& out, const ExecConfig& exec = {}) {
  detail::nsa_compress_attention_infer_call(p, in, out, exec, false);
}

/// CANN NsaCompressAttentionInfer as validate -> plan -> run (every check before any write).
template <class T>
void nsa_compress_attention_infer(const NsaCompressAttentionInferParams& p,
                                  const NsaCompressAttentionInferInputs<T>& in,
                                  const NsaCompressAttentionInferOutputs<T>& out,
                                  const ExecConfig& exec = {}) {
  detail::nsa_compress_attention_infer_call(p, in, out, exec, true);
}

}  // namespace attnref
