#pragma once
/// attnref::nsa_selected_attention_infer — CANN aclnnNsaSelectedAttentionInfer: the selected
/// branch of Native Sparse Attention for decode. Each query head attends to the raw (paged) key
/// and value tokens of the select blocks its kv group chose (the top-k of
/// nsa_compress_attention_infer).
///
/// Per batch b (sel_len_b raw tokens in a paged cache, q_len_b <= 4 query tokens), query token
/// i, kv head g and its G query heads:
///   L_i = sel_len_b − (q_len_b − 1 − i)      (token i sees the raw positions [0, L_i): the
///                                             multi-token causal rule, always on, as the kernel)
///   keys(i, g) = ∪ over the entries j != −1 of topk[row(b, i)][g] of [j·l', min((j + 1)·l', L_i))
///   out = softmax(q·K_selᵀ · scale_value) · V_sel   (fp32 scores, P and accumulation)
/// Blocks are visited in ascending index order (the kernel visits them in top-k order; the set,
/// and so the result up to rounding, is the same). A row with no selected key gives output 0
/// (the kernel's all-zero output), as do padded BSND rows (i >= q_len_b).
///
/// Index data: a top-k entry must be −1 (an empty slot, anywhere) or a select block of the
/// batch, [0, ceil(sel_len_b / l')), else std::out_of_range; a block may appear once per
/// (row, kv head) (the kernel's result is undefined otherwise), else std::invalid_argument.
/// Block table entries covering [0, sel_len_b) must lie in [0, numBlocks) (std::out_of_range).
/// The vendor's constraints are checked by default (params.strict: Dqk 192, Dv 128, page block
/// 64 or 128, l' in 16..128 step 16, G <= 16, KV_N <= 256, B <= 3072, caches 4-d with BSND and
/// 3-d otherwise); strict = false keeps what the definition needs. Everything is checked before
/// anything is written.
///
/// On the engine: every (query row, kv head) is one engine sequence of G query heads over one
/// kv head, whose pages are the gcd(l', pageBlockSize)-token runs of its selected blocks,
/// pointing straight into the cache (no copy). Split-KV, threads, tiling as everywhere.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
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

namespace attnref {

struct NsaSelectedAttentionInferParams {
  std::int64_t num_heads = 1;            ///< numHeads (N)
  std::int64_t num_key_value_heads = 1;  ///< numKeyValueHeads (KV_N)
  std::int64_t select_block_size = 64;   ///< selectBlockSize l'
  std::int64_t select_block_count = 16;  ///< selectBlockCount k (top-k entries per kv head)
  std::int64_t page_block_size = 128;    ///< pageBlockSize
  double scale_value = 1.0;              ///< scaleValue
  std::string layout = "BSND";           ///< layoutOptional: BSND (default), BSH or TND
  std::int64_t sparse_mode = 0;          ///< sparseMode (reserved by the vendor: 0)
  bool strict = true;                    ///< the vendor's constraint list (false: relaxed)
};

/// T: half or bfloat16 (float: attnref extension). The vendor's attenMask is reserved and
/// unused; the multi-token causal rule needs no mask, so there is no mask input.
template <class T>
struct NsaSelectedAttentionInferInputs {
  StridedView<const T> query{};  ///< TND [T, N, Dqk], BSND [B, S, N, Dqk] or BSH [B, S, N·Dqk]
  /// [numBlocks, pageBlockSize, KV_N·Dqk] or [numBlocks, pageBlockSize, KV_N, Dqk] (raw keys)
  StridedView<const T> key{};
  StridedView<const T> value{};                       ///< the same with Dv
  StridedView<const std::int32_t> topk_indices{};     ///< TND [T, KV_N, k], else [B, S, KV_N, k]
  StridedView<const std::int32_t> block_table{};      ///< [B, maxBlocks] (required)
  std::vector<std::int64_t> actual_q_seq_len{};       ///< [B] (empty: 1 each for TND, else S)
  std::vector<std::int64_t> actual_sel_kv_seq_len{};  ///< [B] raw lengths (required)

  /// Calls f(name, view) for every tensor field.
  template <class F>
  void for_each_view(F&& f) {
    f("query", query), f("key", key), f("value", value), f("topk_indices", topk_indices);
    f("block_table", block_table);
  }
};

template <class T>
struct NsaSelectedAttentionInferOutputs {
  StridedView<T> output{};  ///< TND [T, N, Dv], BSND [B, S, N, Dv], BSH [B, S, N·Dv]

  /// Calls f(name, view) for every tensor field.
  template <class F>
  void for_each_view(F&& f) {
    f("output", output);
  }
};

namespace detail {
/// What nsa_selected_attention_infer's checks found: block size and heads, the layout, the
/// batch and its lengths (row0: each batch's first query row), and the paged cache.
template <class T>
struct NsaSelPlan {
  std::int64_t ls = 0, k = 0;
  Index N = 0, KVN = 0, G = 0, B = 0, S = 0, R = 0, Dqk = 0, Dv = 0;
  Layout layout = Layout::TND;
  std::string rule;  // appended to the messages of the vendor's rules (params.strict)
  std::vector<Index> qlen, sel, row0;
  PagedKvCache<const T> cache;
};

/// Block size and count, layout, scale and heads.
template <class T>
void nsa_sel_params(const NsaSelectedAttentionInferParams& p, NsaSelPlan<T>& pl) {
  pl.rule = p.strict ? " (vendor rule; params.strict = false relaxes it)" : "";
  const std::string& rule = pl.rule;
  const std::int64_t ls = p.select_block_size, k = p.select_block_count;
  ATTNREF_CHECK(ls > 0 && k > 0, std::invalid_argument, "nsa_selected_attention_infer",
                "params.select_block_size / select_block_count", "not positive", "> 0",
                std::to_string(ls) + ", " + std::to_string(k));
  if (p.strict)
    ATTNREF_CHECK(ls >= 16 && ls <= 128 && ls % 16 == 0, std::invalid_argument,
                  "nsa_selected_attention_infer", "params.select_block_size",
                  "not supported" + rule, "16, 32, ..., 128", std::to_string(ls));
  const Layout layout = detail::parse_layout("nsa_selected_attention_infer", "params.layout",
                                             p.layout, {Layout::TND, Layout::BSND, Layout::BSH});
  ATTNREF_CHECK(p.sparse_mode == 0, std::invalid_argument, "nsa_selected_attention_infer",
                "params.sparse_mode", "not supported (reserved)", "0",
                std::to_string(p.sparse_mode));
  ATTNREF_CHECK(std::isfinite(p.scale_value), std::invalid_argument, "nsa_selected_attention_infer",
                "params.scale_value", "not finite", "a finite value",
                std::to_string(p.scale_value));
  const Index N = p.num_heads, KVN = p.num_key_value_heads;
  ATTNREF_CHECK(N > 0 && KVN > 0 && N % KVN == 0, std::invalid_argument,
                "nsa_selected_attention_infer", "params.num_heads",
                "not a positive multiple of num_key_value_heads",
                "a multiple of " + std::to_string(KVN), std::to_string(N));
  const Index G = N / KVN;
  if (p.strict) {
    ATTNREF_CHECK(G <= 16, std::invalid_argument, "nsa_selected_attention_infer",
                  "params.num_heads / num_key_value_heads", "group size not supported" + rule,
                  "<= 16", std::to_string(G));
    ATTNREF_CHECK(KVN <= 256, std::invalid_argument, "nsa_selected_attention_infer",
                  "params.num_key_value_heads", "not supported" + rule, "<= 256",
                  std::to_string(KVN));
  }
  pl.ls = ls, pl.k = k, pl.N = N, pl.KVN = KVN, pl.G = G;
  pl.layout = layout;
}

/// The query, the batch (block_table's rows) and the query lengths.
template <class T>
void nsa_sel_lengths(const NsaSelectedAttentionInferParams& p,
                     const NsaSelectedAttentionInferInputs<T>& in, NsaSelPlan<T>& pl) {
  using detail::shape_str;
  const Layout layout = pl.layout;
  const Index N = pl.N;
  const std::string& rule = pl.rule;
  // The query and its layout.
  const bool tnd = layout == Layout::TND, bsh = layout == Layout::BSH;
  const auto& q = in.query;
  const Index q_rank = tnd || bsh ? 3 : 4;
  ATTNREF_CHECK(!q.absent() && q.rank() == q_rank, std::invalid_argument,
                "nsa_selected_attention_infer", "query.shape", "mismatch",
                tnd   ? "[T, N, Dqk]"
                : bsh ? "[B, S, N * Dqk]"
                      : "[B, S, N, Dqk]",
                shape_str(q));
  if (!bsh)
    ATTNREF_CHECK(q.size(tnd ? 1 : 2) == N, std::invalid_argument, "nsa_selected_attention_infer",
                  "query.shape", "head count differs from num_heads", std::to_string(N),
                  shape_str(q));
  else
    ATTNREF_CHECK(q.size(2) > 0 && q.size(2) % N == 0, std::invalid_argument,
                  "nsa_selected_attention_infer", "query.shape[2]", "not a multiple of num_heads",
                  "N * Dqk", shape_str(q));
  const Index Dqk = bsh ? q.size(2) / N : q.size(q_rank - 1);
  ATTNREF_CHECK(Dqk > 0, std::invalid_argument, "nsa_selected_attention_infer", "query.shape",
                "empty head dimension", "Dqk > 0", shape_str(q));
  // Batches and lengths.
  const auto& bt = in.block_table;
  ATTNREF_CHECK(!bt.absent() && bt.rank() == 2 && bt.size(0) > 0, std::invalid_argument,
                "nsa_selected_attention_infer", "block_table.shape", "required: [B, maxBlocks]",
                "[B, maxBlocks]", shape_str(bt));
  const Index B = bt.size(0);
  if (p.strict)
    ATTNREF_CHECK(B <= 3072, std::invalid_argument, "nsa_selected_attention_infer",
                  "block_table.shape[0]", "batch out of range" + rule, "[1, 3072]",
                  std::to_string(B));
  ATTNREF_CHECK(static_cast<Index>(in.actual_sel_kv_seq_len.size()) == B, std::invalid_argument,
                "nsa_selected_attention_infer", "actual_sel_kv_seq_len", "required, one per batch",
                std::to_string(B), std::to_string(in.actual_sel_kv_seq_len.size()));
  const Index S = tnd ? 0 : q.size(1);
  ATTNREF_CHECK(tnd || q.size(0) == B, std::invalid_argument, "nsa_selected_attention_infer",
                "query.shape[0]", "differs from block_table's batch", std::to_string(B),
                shape_str(q));
  if (!tnd)
    ATTNREF_CHECK(S >= 1 && S <= 4, std::invalid_argument, "nsa_selected_attention_infer",
                  "query.shape[1]", "q_S out of range", "[1, 4]", std::to_string(S));
  std::vector<Index> qlen(static_cast<size_t>(B), tnd ? 1 : S);
  if (!in.actual_q_seq_len.empty()) {
    ATTNREF_CHECK(static_cast<Index>(in.actual_q_seq_len.size()) == B, std::invalid_argument,
                  "nsa_selected_attention_infer", "actual_q_seq_len", "size mismatch",
                  std::to_string(B), std::to_string(in.actual_q_seq_len.size()));
    for (Index b = 0; b < B; ++b) {
      const std::int64_t v = in.actual_q_seq_len[static_cast<size_t>(b)];
      ATTNREF_CHECK(v >= 1 && v <= 4 && (tnd || v <= S), std::invalid_argument,
                    "nsa_selected_attention_infer", "actual_q_seq_len[" + std::to_string(b) + "]",
                    "out of range", tnd ? "[1, 4]" : "[1, min(4, S)]", std::to_string(v));
      qlen[static_cast<size_t>(b)] = static_cast<Index>(v);
    }
  }
  std::vector<Index> row0(static_cast<size_t>(B) + 1, 0);  // first query row of each batch
  for (Index b = 0; b < B; ++b)
    row0[static_cast<size_t>(b) + 1] = row0[static_cast<size_t>(b)] + (tnd ? qlen[b] : S);
  const Index R = row0.back();
  if (tnd)
    ATTNREF_CHECK(q.size(0) == R, std::invalid_argument, "nsa_selected_attention_infer",
                  "query.shape[0]", "differs from the sum of actual_q_seq_len", std::to_string(R),
                  shape_str(q));
  pl.Dqk = Dqk, pl.B = B, pl.S = S, pl.R = R;
  pl.qlen = std::move(qlen);
  pl.row0 = std::move(row0);
}

/// The paged caches and the selected lengths.
template <class T>
void nsa_sel_cache(const NsaSelectedAttentionInferParams& p,
                   const NsaSelectedAttentionInferInputs<T>& in, NsaSelPlan<T>& pl) {
  using detail::shape_str;
  constexpr const char* fn = "nsa_selected_attention_infer";
  const Layout layout = pl.layout;
  const Index B = pl.B, KVN = pl.KVN, Dqk = pl.Dqk;
  const std::string& rule = pl.rule;
  const std::vector<Index>& qlen = pl.qlen;
  const auto& bt = in.block_table;
  std::vector<Index>& sel = pl.sel;
  sel.assign(static_cast<size_t>(B), 0);
  // The paged caches: [numBlocks, pbs, KV_N·D] or [numBlocks, pbs, KV_N, D].
  const auto& kt = in.key;
  const auto& vt = in.value;
  const Index pbs = p.page_block_size;
  ATTNREF_CHECK(pbs > 0, std::invalid_argument, "nsa_selected_attention_infer",
                "params.page_block_size", "not positive", "> 0", std::to_string(pbs));
  auto cache_ok = [&](const auto& t, Index D) {
    if (t.absent() || t.size(1) != pbs) return false;
    return (t.rank() == 3 && t.size(2) == KVN * D) ||
           (t.rank() == 4 && t.size(2) == KVN && t.size(3) == D);
  };
  ATTNREF_CHECK((kt.rank() == 3 || kt.rank() == 4) && cache_ok(kt, Dqk), std::invalid_argument,
                "nsa_selected_attention_infer", "key.shape", "mismatch",
                "[numBlocks, " + std::to_string(pbs) + ", " + std::to_string(KVN * Dqk) +
                    "] or [numBlocks, " + std::to_string(pbs) + ", " + std::to_string(KVN) + ", " +
                    std::to_string(Dqk) + "]",
                shape_str(kt));
  ATTNREF_CHECK((vt.rank() == 3 || vt.rank() == 4) && !vt.absent() && vt.size(0) == kt.size(0) &&
                    vt.size(1) == pbs &&
                    (vt.rank() == 3 ? vt.size(2) > 0 && vt.size(2) % KVN == 0
                                    : vt.size(2) == KVN && vt.size(3) > 0),
                std::invalid_argument, "nsa_selected_attention_infer", "value.shape", "mismatch",
                "[" + std::to_string(kt.size(0)) + ", " + std::to_string(pbs) +
                    ", KV_N * Dv] or [.., KV_N, Dv]",
                shape_str(vt));
  const Index Dv = vt.rank() == 3 ? vt.size(2) / KVN : vt.size(3), nb = kt.size(0);
  if (p.strict) {
    const Index want_rank = layout == Layout::BSND ? 4 : 3;  // the vendor ties it to the layout
    ATTNREF_CHECK(kt.rank() == want_rank && vt.rank() == want_rank, std::invalid_argument,
                  "nsa_selected_attention_infer", "key / value rank",
                  "not the layout's cache rank" + rule,
                  want_rank == 4 ? "[numBlocks, pbs, KV_N, D] with BSND"
                                 : "[numBlocks, pbs, KV_N * D] with " + p.layout,
                  shape_str(kt) + " / " + shape_str(vt));
    ATTNREF_CHECK(Dqk == 192 && Dv == 128, std::invalid_argument, "nsa_selected_attention_infer",
                  "query / value head sizes", "not supported" + rule, "Dqk 192, Dv 128",
                  "Dqk " + std::to_string(Dqk) + ", Dv " + std::to_string(Dv));
    ATTNREF_CHECK(pbs == 64 || pbs == 128, std::invalid_argument, "nsa_selected_attention_infer",
                  "params.page_block_size", "not supported" + rule, "64 or 128",
                  std::to_string(pbs));
  }
  const Index capacity =
      detail::checked_mul(fn, "block_table.shape[1] * page_block_size", bt.size(1), pbs);
  for (Index b = 0; b < B; ++b) {
    const std::int64_t v = in.actual_sel_kv_seq_len[static_cast<size_t>(b)];
    ATTNREF_CHECK(v >= 0 && v <= capacity, std::invalid_argument, "nsa_selected_attention_infer",
                  "actual_sel_kv_seq_len[" + std::to_string(b) + "]", "out of range",
                  "[0, maxBlocks * pageBlockSize = " + std::to_string(capacity) + "]",
                  std::to_string(v));
    ATTNREF_CHECK(v == 0 || qlen[static_cast<size_t>(b)] <= v, std::invalid_argument,
                  "nsa_selected_attention_infer", "actual_q_seq_len[" + std::to_string(b) + "]",
                  "above actual_sel_kv_seq_len", "<= " + std::to_string(v),
                  std::to_string(qlen[static_cast<size_t>(b)]));
    sel[static_cast<size_t>(b)] = static_cast<Index>(v);
  }
  // (The docs also bound selectBlockCount · selectBlockSize by max(actualSelKvSeqLen); the host
  // checks do not, and the docs' own example (sel 48, l' 64, k 1) breaks it: not checked.)
  pl.Dv = Dv;
  pl.cache = {StridedView<const T, 4>(kt.data(), {nb, pbs, KVN, Dqk}),
              StridedView<const T, 4>(vt.data(), {nb, pbs, KVN, Dv}),
              StridedView<const std::int32_t, 2>(bt.data(), {B, bt.size(1)}), sel};
}

/// The top-k indices' and the output's shapes.
template <class T>
void nsa_sel_outputs(const NsaSelectedAttentionInferInputs<T>& in,
                     const NsaSelectedAttentionInferOutputs<T>& out, const NsaSelPlan<T>& pl) {
  using detail::shape_str;
  const bool tnd = pl.layout == Layout::TND, bsh = pl.layout == Layout::BSH;
  const Index B = pl.B, S = pl.S, R = pl.R, N = pl.N, KVN = pl.KVN, Dv = pl.Dv;
  const std::int64_t k = pl.k;
  // The top-k indices.
  const auto& tk = in.topk_indices;
  const std::vector<Index> tk_shape =
      tnd ? std::vector<Index>{R, KVN, k} : std::vector<Index>{B, S, KVN, k};
  auto dims_str = [](const std::vector<Index>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
  };
  ATTNREF_CHECK(!tk.absent() && tk.shape() == tk_shape, std::invalid_argument,
                "nsa_selected_attention_infer", "topk_indices.shape", "mismatch",
                dims_str(tk_shape), shape_str(tk));
  // The output.
  const std::vector<Index> o_shape = tnd   ? std::vector<Index>{R, N, Dv}
                                     : bsh ? std::vector<Index>{B, S, N * Dv}
                                           : std::vector<Index>{B, S, N, Dv};
  ATTNREF_CHECK(!out.output.absent() && out.output.shape() == o_shape, std::invalid_argument,
                "nsa_selected_attention_infer", "output.shape", "mismatch", dims_str(o_shape),
                shape_str(out.output));
}

/// Index data: the block table (every used entry), then every live row's top-k entries.
template <class T>
void nsa_sel_indices(const NsaSelectedAttentionInferInputs<T>& in, const NsaSelPlan<T>& pl) {
  constexpr const char* fn = "nsa_selected_attention_infer";
  const Index B = pl.B, KVN = pl.KVN;
  const std::int64_t ls = pl.ls, k = pl.k;
  const std::vector<Index>& qlen = pl.qlen;
  const std::vector<Index>& sel = pl.sel;
  const std::vector<Index>& row0 = pl.row0;
  const auto& tk = in.topk_indices;
  // Index data: block tables, then every live row's top-k entries.
  pl.cache.validate(fn, {"key", "value", "block_table", "actual_sel_kv_seq_len",
                         "params.page_block_size", "page_block_size"});
  std::vector<std::int32_t> seen;
  for (Index b = 0; b < B; ++b) {
    const Index n_sel = sel[static_cast<size_t>(b)] / ls + (sel[static_cast<size_t>(b)] % ls != 0);
    for (Index i = 0; i < qlen[static_cast<size_t>(b)]; ++i)
      for (Index g = 0; g < KVN; ++g) {
        const Index row = row0[static_cast<size_t>(b)] + i;
        const std::int32_t* t = tk.data() + (row * KVN + g) * k;
        seen.clear();
        for (Index e = 0; e < k; ++e) {
          const std::string arg = "topk_indices[" + std::to_string(row) + "][" + std::to_string(g) +
                                  "][" + std::to_string(e) + "]";
          ATTNREF_CHECK(t[e] == -1 || (t[e] >= 0 && t[e] < n_sel), std::out_of_range, fn, arg,
                        "not a select block of batch " + std::to_string(b),
                        "-1 or [0, ceil(sel_len / l') = " + std::to_string(n_sel) + ")",
                        std::to_string(t[e]));
          if (t[e] >= 0) seen.push_back(t[e]);
        }
        std::sort(seen.begin(), seen.end());
        const auto dup = std::adjacent_find(seen.begin(), seen.end());
        ATTNREF_CHECK(dup == seen.end(), std::invalid_argument, "nsa_selected_attention_infer",
                      "topk_indices[" + std::to_string(row) + "][" + std::to_string(g) + "]",
                      "repeats a block", "distinct blocks (or -1)",
                      dup == seen.end() ? "" : "block " + std::to_string(*dup) + " twice");
      }
  }
}

/// One engine sequence per (query row, kv head): G query heads, one kv head, pages of
/// gcd(l', pageBlockSize) tokens pointing into the cache at the kv head's slice.
template <class T>
void nsa_sel_run(const NsaSelectedAttentionInferParams& p,
                 const NsaSelectedAttentionInferInputs<T>& in,
                 const NsaSelectedAttentionInferOutputs<T>& out, const NsaSelPlan<T>& pl,
                 const ExecConfig& exec) {
  const bool tnd = pl.layout == Layout::TND;
  const Index B = pl.B, S = pl.S, R = pl.R, KVN = pl.KVN, G = pl.G, Dqk = pl.Dqk, Dv = pl.Dv;
  const std::int64_t ls = pl.ls, k = pl.k;
  const Index pbs = pl.cache.block_size();
  const std::vector<Index>& qlen = pl.qlen;
  const std::vector<Index>& sel = pl.sel;
  const std::vector<Index>& row0 = pl.row0;
  const PagedKvCache<const T>& cache = pl.cache;
  const auto& q = in.query;
  const auto& tk = in.topk_indices;
  const auto& kt = in.key;
  const auto& vt = in.value;
  // One engine sequence per (query row, kv head): G query heads, one kv head, pages of u
  // tokens pointing into the cache at the kv head's slice.
  const Index u = std::gcd(ls, pbs);
  const Index kstride = KVN * Dqk, vstride = KVN * Dv;  // token strides in the caches
  const Index E = R * KVN;
  detail::KvPages<T> pages;
  pages.page_size = u;
  pages.first.resize(static_cast<size_t>(E));
  std::vector<Index> kv_len(static_cast<size_t>(E), 0);
  std::vector<std::int32_t> blocks;
  for (Index b = 0; b < B; ++b)
    for (Index i = 0; i < (tnd ? qlen[static_cast<size_t>(b)] : S); ++i) {
      const Index row = row0[static_cast<size_t>(b)] + i;
      const bool live = i < qlen[static_cast<size_t>(b)];
      const Index L =
          live ? sel[static_cast<size_t>(b)] - (qlen[static_cast<size_t>(b)] - 1 - i) : 0;
      for (Index g = 0; g < KVN; ++g) {
        const Index e = row * KVN + g;
        pages.first[static_cast<size_t>(e)] = static_cast<Index>(pages.k.size());
        if (!live || L <= 0) continue;
        const std::int32_t* t = tk.data() + (row * KVN + g) * k;
        blocks.assign(t, t + k);
        std::sort(blocks.begin(), blocks.end());
        Index n = 0;
        for (const std::int32_t j : blocks) {
          if (j < 0) continue;
          for (Index pos = j * ls; pos < std::min<Index>((j + 1) * ls, L); pos += u) {
            const Index blk = cache.block_table(b, pos / pbs);  // validated above
            pages.k.push_back(&cache.k(blk, pos % pbs, g, 0));
            pages.v.push_back(&cache.v(blk, pos % pbs, g, 0));
          }
          n += std::max<Index>(0, std::min<Index>((j + 1) * ls, L) - j * ls);
        }
        kv_len[static_cast<size_t>(e)] = n;
      }
    }
  Index max_len = 0;  // 0 when nothing is selected: an empty cache may have null data
  for (Index v : kv_len) max_len = std::max(max_len, v);
  AttentionInputs<T, T> ein;
  ein.q = StridedView<const T, 4>(q.data(), {E, 1, G, Dqk});
  ein.k = StridedView<const T, 4>(kt.data(), {E, max_len, 1, Dqk}, {0, kstride, Dqk, 1});
  ein.v = StridedView<const T, 4>(vt.data(), {E, max_len, 1, Dv}, {0, vstride, Dv, 1});
  ein.seq.kv = kv_len;
  AttentionParams ep;
  ep.scale = p.scale_value;
  AttentionOutputs<T> eo;
  eo.o = StridedView<T, 4>(out.output.data(), {E, 1, G, Dv});
  DefaultVariant var;
  detail::attention_with_pages(var, ein, ep, eo, pages, exec);
}

/// nsa_selected_attention_infer on dense arguments (the stand-ins of dense_call): every
/// check, then (run) the computation.
template <class T>
void nsa_selected_attention_infer_dense(const NsaSelectedAttentionInferParams& p,
                                        const NsaSelectedAttentionInferInputs<T>& in,
                                        const NsaSelectedAttentionInferOutputs<T>& out,
                                        const ExecConfig& exec, bool run) {
  static_assert(std::is_same_v<T, half> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float>,
                "nsa_selected_attention_infer: half or bfloat16 (float: attnref extension)");
  constexpr const char* fn = "nsa_selected_attention_infer";
  detail::check_views(fn, "query", in.query, "key", in.key, "value", in.value, "topk_indices",
                      in.topk_indices, "block_table", in.block_table, "output", out.output);
  NsaSelPlan<T> pl;
  nsa_sel_params(p, pl);
  nsa_sel_lengths(p, in, pl);
  nsa_sel_cache(p, in, pl);
  nsa_sel_outputs(in, out, pl);
  nsa_sel_indices(in, pl);
  if (!run) return;  // validate(): every check has run, nothing is written
  nsa_sel_run(p, in, out, pl, exec);
}

template <class T>
void nsa_selected_attention_infer_call(const NsaSelectedAttentionInferParams& p,
                                       const NsaSelectedAttentionInferInputs<T>& in,
                                       const NsaSelectedAttentionInferOutputs<T>& out,
                                       const ExecConfig& exec, bool run) {
  check_exec("nsa_selected_attention_infer", exec);
  dense_call("nsa_selected_attention_infer", in, out, run, [&](const auto& din, const auto& dout) {
    nsa_selected_attention_infer_dense(p, din, dout, exec, run);
  });
}
}  // namespace detail

/// Every check of nsa_selected_attention_infer() (params, tensors, execution config), without
/// computing or writing anything.
template <class T>
void validate(const NsaSelectedAttentionInferParams& p,
              const NsaSelectedAttentionInferInputs<T>& in,
              const NsaSelectedAttentionInferOutputs<T>& out, const ExecConfig& exec = {}) {
  detail::nsa_selected_attention_infer_call(p, in, out, exec, false);
}

/// CANN NsaSelectedAttentionInfer as validate -> plan -> run (every check before any write).
template <class T>
void nsa_selected_attention_infer(const NsaSelectedAttentionInferParams& p,
                                  const NsaSelectedAttentionInferInputs<T>& in,
                                  const NsaSelectedAttentionInferOutputs<T>& out,
                                  const ExecConfig& exec = {}) {
  detail::nsa_selected_attention_infer_call(p, in, out, exec, true);
}

}  // namespace attnref
