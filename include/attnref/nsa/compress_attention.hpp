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
#include "attnref/nsa/compress_attention_io.hpp"
#include "attnref/nsa/detail/compress_select.hpp"
#include "attnref/nsa/detail/variant.hpp"
#include "attnref/nsa/importance.hpp"

namespace attnref {

namespace detail {

inline bool nsa_step16(std::int64_t v, std::int64_t hi) {
  return v >= 16 && v <= hi && v % 16 == 0;
}

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
