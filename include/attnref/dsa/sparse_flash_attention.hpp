#pragma once
/// attnref::sparse_flash_attention — CANN aclnnSparseFlashAttention (SFA): DeepSeek-V3.2's sparse
/// attention, MLA-absorbed attention over the tokens a selector (lightning_indexer) chose.
///
/// Per batch b (q_b live query rows, s_b keys), query row i, key head g and its G = N1 / N2 query
/// heads, with the index list sparse_indices[row][g][0, K) (valid entries first, −1 after):
///   limit_i = s_b                       (sparse_mode 0)
///           = s_b − q_b + i + 1         (sparse_mode 3, rightDownCausal; ≤ 0: nothing visible)
///   keys(i, g) = the tokens [j·sbs, min((j + 1)·sbs, limit_i)) of every entry j read (a list,
///                repeats included; which entries are read: below)
///   out = softmax(scale_value · (q·k + q_rope·k_rope) over keys) · v over keys
/// (sbs = sparse_block_size; fp32 scores and accumulation, P normalised then rounded to the
/// query's type before P·V as the vendor's golden; the output in the query's type).
/// A row with no visible selected key gives 0, as do BSND rows past q_b. Entries are visited in
/// ascending order (the set, and so the result up to rounding, is the kernel's).
///
/// Index data: a valid entry must select a block that starts inside the batch's keys,
/// j·sbs < s_b, else std::out_of_range naming the row; a valid entry after a −1 is
/// std::invalid_argument (the vendor requires valid entries first). A repeated entry counts
/// twice (as the vendor's kernels and golden); a selected block past limit_i is not an error: it
/// contributes nothing. Only the first min(K, ceil(limit_i / sbs)) slots are read (the vendor's
/// slot rule).
/// The vendor's constraints are checked by default (params.strict; see docs/dsa.md); strict =
/// false keeps what the definition needs. Everything is checked before anything is written.
///
/// On the engine: every (query row, key head) is one engine sequence of G query heads over one
/// key head, with split scores (query_rope / key_rope), whose pages are the selected blocks'
/// runs of gcd(sbs, blockSize) tokens (sbs without a block table), pointing straight into the
/// caller's key / value / key_rope tensors (no copy). Split-KV, threads, tiling as everywhere.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/attention/attention.hpp"
#include "attnref/attention/variant.hpp"
#include "attnref/core/dense.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/exec.hpp"
#include "attnref/core/types.hpp"
#include "attnref/dsa/detail/sequences.hpp"
#include "attnref/nsa/detail/variant.hpp"  // NsaVariant: P rounded to T before P·V

namespace attnref {

struct SparseFlashAttentionParams {
  double scale_value = 1.0;            ///< scaleValue
  std::int64_t sparse_block_size = 1;  ///< sparseBlockSize: tokens per selected index
  std::string layout_query = "BSND";   ///< layoutQuery: BSND or TND
  std::string layout_kv = "BSND";      ///< layoutKv: BSND, TND or PA_BSND
  std::int64_t sparse_mode = 3;        ///< 0: every selected key, 3: rightDownCausal
  std::int64_t pre_tokens = std::numeric_limits<std::int64_t>::max();   ///< only the default
  std::int64_t next_tokens = std::numeric_limits<std::int64_t>::max();  ///< only the default
  std::int64_t attention_mode = 2;                                      ///< 2 (MLA-absorb) only
  bool return_softmax_lse = false;  ///< softmax_max / softmax_sum: not implemented
  bool strict = true;               ///< the vendor's constraint list (false: relaxed)
};

/// T: half or bfloat16 (float: attnref extension).
template <class T>
struct SparseFlashAttentionInputs {
  StridedView<const T> query{};  ///< BSND [B, S1, N1, D] or TND [T1, N1, D]
  StridedView<const T> key{};    ///< BSND [B, S2, N2, D], TND [T2, N2, D] or PA_BSND
                                 ///< [blockNum, blockSize, N2, D]
  /// Absent: V is the key (MLA's latent cache). Else the key's shape; with params.strict the
  /// key's own memory (the vendor's kernels for sparse_block_size <= 4 read the key as V).
  StridedView<const T> value{};
  StridedView<const T> query_rope{};                     ///< the query's shape with Dr
  StridedView<const T> key_rope{};                       ///< the key's shape with Dr
  StridedView<const std::int32_t> sparse_indices{};      ///< [B, S1, N2, K] or [T1, N2, K]
  StridedView<const std::int32_t> block_table{};         ///< PA_BSND: [B, maxBlocks]
  std::vector<std::int64_t> actual_seq_lengths_query{};  ///< [B] (TND: cumulative, required)
  std::vector<std::int64_t> actual_seq_lengths_kv{};     ///< [B] (TND: cumulative; TND and
                                                         ///< PA_BSND: required)

  /// Calls f(name, view) for every tensor field.
  template <class F>
  void for_each_view(F&& f) {
    f("query", query), f("key", key), f("value", value), f("query_rope", query_rope);
    f("key_rope", key_rope), f("sparse_indices", sparse_indices), f("block_table", block_table);
  }
};

template <class T>
struct SparseFlashAttentionOutputs {
  StridedView<T> attention_out{};  ///< the query's shape

  /// Calls f(name, view) for every tensor field.
  template <class F>
  void for_each_view(F&& f) {
    f("attention_out", attention_out);
  }
};

namespace detail {

struct SfaPlan {
  DsaSeqs s;
  Index G = 0, Dr = 0, K = 0, sbs = 1;
  std::string rule;  // appended to the messages of the vendor's rules (params.strict)
};

/// The scalar parameters.
inline void sfa_params(const SparseFlashAttentionParams& p, SfaPlan& pl,
                       const char* fn = "sparse_flash_attention") {
  pl.rule = p.strict ? " (vendor rule; params.strict = false relaxes it)" : "";
  ATTNREF_CHECK(std::isfinite(p.scale_value), std::invalid_argument, fn, "params.scale_value",
                "not finite", "a finite value", std::to_string(p.scale_value));
  const std::int64_t sbs = p.sparse_block_size;
  ATTNREF_CHECK(sbs > 0 && sbs <= (std::int64_t{1} << 30), std::invalid_argument, fn,
                "params.sparse_block_size", "out of range", "[1, 2^30]", std::to_string(sbs));
  if (p.strict)
    ATTNREF_CHECK(sbs <= 128 && (sbs & (sbs - 1)) == 0, std::invalid_argument, fn,
                  "params.sparse_block_size", "not supported" + pl.rule, "a power of 2 in [1, 128]",
                  std::to_string(sbs));
  ATTNREF_CHECK(p.sparse_mode == 0 || p.sparse_mode == 3, std::invalid_argument, fn,
                "params.sparse_mode", "not supported", "0 or 3", std::to_string(p.sparse_mode));
  constexpr std::int64_t big = std::numeric_limits<std::int64_t>::max();
  ATTNREF_CHECK(p.pre_tokens == big && p.next_tokens == big, std::invalid_argument, fn,
                "params.pre_tokens / next_tokens", "not supported (only the default)", "2^63 - 1",
                std::to_string(p.pre_tokens) + " / " + std::to_string(p.next_tokens));
  ATTNREF_CHECK(p.attention_mode == 2, std::invalid_argument, fn, "params.attention_mode",
                "not supported", "2 (MLA-absorb)", std::to_string(p.attention_mode));
  ATTNREF_NOT_IMPLEMENTED(!p.return_softmax_lse, fn, "params.return_softmax_lse", "true");
  pl.sbs = static_cast<Index>(sbs);
}

/// The tensors' shapes, the lengths and the block table.
template <class T>
void sfa_shapes(const SparseFlashAttentionParams& p, const SparseFlashAttentionInputs<T>& in,
                const SparseFlashAttentionOutputs<T>& out, SfaPlan& pl) {
  constexpr const char* fn = "sparse_flash_attention";
  DsaSeqs& s = pl.s;
  dsa_query(fn, p.layout_query, in.query, in.actual_seq_lengths_query, "actual_seq_lengths_query",
            s);
  dsa_keys(fn, p.layout_kv, "params.layout_kv", "key", in.key, in.block_table,
           in.actual_seq_lengths_kv, "actual_seq_lengths_kv", s);
  const int kr = in.key.rank();
  ATTNREF_CHECK(in.key.size(kr - 1) == s.D, std::invalid_argument, fn, "key.shape",
                "head size differs from the query's", std::to_string(s.D), shape_str(in.key));
  ATTNREF_CHECK(s.N1 % s.N2 == 0, std::invalid_argument, fn, "query.shape",
                "query heads not a multiple of the key heads",
                "a multiple of " + std::to_string(s.N2), shape_str(in.query));
  if (!in.value.absent()) dsa_like_key(fn, "value", in.value, in.key, s.D);
  ATTNREF_CHECK(!in.query_rope.absent() && in.query_rope.rank() == in.query.rank() &&
                    in.query_rope.size(in.query.rank() - 1) > 0,
                std::invalid_argument, fn, "query_rope.shape", "mismatch",
                "the query's shape with Dr", shape_str(in.query_rope));
  pl.Dr = in.query_rope.size(in.query.rank() - 1);
  Dims qr = in.query.shape();
  qr[qr.size() - 1] = pl.Dr;
  ATTNREF_CHECK(in.query_rope.shape() == qr, std::invalid_argument, fn, "query_rope.shape",
                "mismatch", "the query's shape with Dr", shape_str(in.query_rope));
  dsa_like_key(fn, "key_rope", in.key_rope, in.key, pl.Dr);
  pl.G = s.N1 / s.N2;
  // sparse_indices [.., N2, K] and the output.
  const auto& si = in.sparse_indices;
  const int qrank = in.query.rank();
  Dims want = in.query.shape();
  want[qrank - 2] = s.N2;
  ATTNREF_CHECK(
      !si.absent() && si.rank() == qrank && si.size(qrank - 1) > 0 &&
          [&] {
            for (int d = 0; d < qrank - 1; ++d)
              if (si.size(d) != want[d]) return false;
            return true;
          }(),
      std::invalid_argument, fn, "sparse_indices.shape", "mismatch",
      s.q_tnd ? "[T1, N2, K > 0]" : "[B, S1, N2, K > 0]", shape_str(si));
  pl.K = si.size(qrank - 1);
  ATTNREF_CHECK(!out.attention_out.absent() && out.attention_out.shape() == in.query.shape(),
                std::invalid_argument, fn, "attention_out.shape", "differs from the query's",
                shape_str(in.query), shape_str(out.attention_out));
}

/// The vendor's shape rules (params.strict).
inline void sfa_vendor_rules(const SparseFlashAttentionParams& p, const SfaPlan& pl) {
  constexpr const char* fn = "sparse_flash_attention";
  const DsaSeqs& s = pl.s;
  const std::string& rule = pl.rule;
  ATTNREF_CHECK(p.layout_kv == "PA_BSND" || p.layout_kv == p.layout_query, std::invalid_argument,
                fn, "params.layout_kv", "not paired with layout_query" + rule,
                p.layout_query + " or PA_BSND", p.layout_kv);
  ATTNREF_CHECK(s.N2 == 1, std::invalid_argument, fn, "key.shape (N2)", "not supported" + rule, "1",
                std::to_string(s.N2));
  ATTNREF_CHECK(s.N1 <= 128 && (s.N1 & (s.N1 - 1)) == 0, std::invalid_argument, fn,
                "query.shape (N1)", "not supported" + rule, "1, 2, 4, ..., 128",
                std::to_string(s.N1));
  ATTNREF_CHECK(s.D == 512 && pl.Dr == 64, std::invalid_argument, fn,
                "query / query_rope head sizes", "not supported" + rule, "D 512, Dr 64",
                "D " + std::to_string(s.D) + ", Dr " + std::to_string(pl.Dr));
  if (s.kv == DsaKv::PA_BSND) {
    ATTNREF_CHECK(s.block_size % 16 == 0 && s.block_size <= 1024, std::invalid_argument, fn,
                  "key.shape[1] (blockSize)", "not supported" + rule,
                  "a multiple of 16, at most 1024", std::to_string(s.block_size));
    ATTNREF_CHECK(s.block_size % pl.sbs == 0, std::invalid_argument, fn, "params.sparse_block_size",
                  "does not divide blockSize" + rule,
                  "a divisor of " + std::to_string(s.block_size), std::to_string(pl.sbs));
  }
}

/// Index data: every live row's list, valid entries first (a valid entry after −1 is
/// std::invalid_argument), each −1 or a block starting inside the batch's keys
/// (std::out_of_range). Repeated entries are allowed (the vendor counts them twice).
inline void sfa_indices(const char* fn, const StridedView<const std::int32_t>& indices,
                        const SfaPlan& pl) {
  const DsaSeqs& s = pl.s;
  for (Index b = 0; b < s.B; ++b) {
    const Index kv = s.kv_len[static_cast<size_t>(b)];
    const Index blocks = kv / pl.sbs + (kv % pl.sbs != 0);
    for (Index i = 0; i < s.q_len[static_cast<size_t>(b)]; ++i)
      for (Index g = 0; g < s.N2; ++g) {
        const Index row = s.q_row0[static_cast<size_t>(b)] + i;
        const std::int32_t* t = indices.data() + (row * s.N2 + g) * pl.K;
        bool ended = false;
        for (Index e = 0; e < pl.K; ++e) {
          if (t[e] == -1) {
            ended = true;
            continue;
          }
          auto arg = [&] {
            return "sparse_indices[" + std::to_string(row) + "][" + std::to_string(g) + "][" +
                   std::to_string(e) + "]";
          };
          if (!(t[e] >= 0 && t[e] < blocks))
            raise<std::out_of_range>(
                fn, arg(),
                "not a block of batch " + std::to_string(b) + "'s keys (row " +
                    std::to_string(row) + ")",
                "-1 or [0, ceil(kv_len / sparse_block_size) = " + std::to_string(blocks) + ")",
                std::to_string(t[e]));
          if (ended)
            raise<std::invalid_argument>(fn, arg(), "a valid entry after -1",
                                         "valid entries first, -1 after", std::to_string(t[e]));
        }
      }
  }
}

/// The runs [token, token + length) of keys(i, g), in ascending block order: the first
/// min(K, ceil(limit / sbs)) slots up to the first −1 (the vendor's slot rule), each block
/// clipped to the row's limit, a block past it dropped, a repeated block taken again.
inline void sfa_runs(const std::int32_t* list, Index K, Index sbs, Index limit,
                     std::vector<std::int32_t>& sel) {
  const Index slots = std::min(K, limit / sbs + (limit % sbs != 0));
  sel.clear();
  for (Index e = 0; e < slots && list[e] != -1; ++e)
    if (Index{list[e]} * sbs < limit) sel.push_back(list[e]);
  std::sort(sel.begin(), sel.end());
}

/// The engine call of E sequences of G query heads (q / q_rope / o: [E, 1, G, d] with the
/// heads of a sequence adjacent; k / v / k_rope: one kv head over `pages`). Groups of more than
/// 64 heads are cut into P parts of at most 64, each its own sequence over the same pages: the
/// engine runs a rounded-P sequence as one work item, so this gives DeepSeek's 128-head decode
/// two items. P depends on G only, never on the thread count.
template <class T>
void sfa_engine(AttentionInputs<T, T>& in, AttentionOutputs<T>& out, KvPages<T>& pages,
                double scale, const ExecConfig& exec) {
  const Index E = in.q.size(0), G = in.q.size(2);
  Index P = 1;
  while (G / P > 64 && (G / P) % 2 == 0) P *= 2;
  if (P > 1) {
    auto cut = [&](auto& v) {  // [E, 1, G, d] -> [E·P, 1, G / P, d]
      using V = std::decay_t<decltype(v)>;
      v = V(v.data(), {E * P, 1, G / P, v.size(3)},
            {v.stride(2) * (G / P), v.stride(1), v.stride(2), v.stride(3)});
    };
    cut(in.q), cut(in.q_rope), cut(out.o);
    auto more = [&](auto& v) {  // [E, L, 1, d] (stride 0 over E) -> [E·P, L, 1, d]
      using V = std::decay_t<decltype(v)>;
      v = V(v.data(), {E * P, v.size(1), 1, v.size(3)}, {0, v.stride(1), v.stride(2), v.stride(3)});
    };
    more(in.k), more(in.v), more(in.k_rope);
    std::vector<Index> kv, first;
    for (Index e = 0; e < E; ++e)
      for (Index j = 0; j < P; ++j) {
        kv.push_back(in.seq.kv[static_cast<size_t>(e)]);
        first.push_back(pages.first[static_cast<size_t>(e)]);
      }
    in.seq.kv = std::move(kv), pages.first = std::move(first);
  }
  AttentionParams ep;
  ep.scale = scale;
  detail::attention_with_pages(NsaVariant<T>{}, in, ep, out, pages, exec);
}

/// Rows [r0, r1) of the query as engine sequences (one per row and key head) over pages of
/// their selected runs, pointing into the caller's tensors.
template <class T>
void sfa_run_rows(const SparseFlashAttentionParams& p, const SparseFlashAttentionInputs<T>& in,
                  const SparseFlashAttentionOutputs<T>& out, const SfaPlan& pl,
                  const std::vector<Index>& batch_of, Index r0, Index r1, const ExecConfig& exec) {
  const DsaSeqs& s = pl.s;
  const Index N2 = s.N2, D = s.D, Dr = pl.Dr, G = pl.G, E = (r1 - r0) * N2, sbs = pl.sbs;
  const T* vdata = in.value.absent() ? in.key.data() : in.value.data();
  // The page size: every run but a row's last is a whole block (gcd(sbs, blockSize) pages);
  // a clipped block taken twice shrinks it to a divisor of the clipped length.
  Index u = s.kv == DsaKv::PA_BSND ? std::gcd(sbs, s.block_size) : sbs;
  std::vector<std::int32_t> sel;
  std::vector<Index> limit(static_cast<size_t>(r1 - r0));
  for (Index r = r0; r < r1; ++r) {
    const Index b = batch_of[static_cast<size_t>(r)];
    const Index L = s.limit(b, r - s.q_row0[static_cast<size_t>(b)], p.sparse_mode == 3);
    limit[static_cast<size_t>(r - r0)] = L;
    for (Index g = 0; g < N2 && L > 0; ++g) {
      sfa_runs(in.sparse_indices.data() + (r * N2 + g) * pl.K, pl.K, sbs, L, sel);
      for (size_t e = 0; e + 1 < sel.size(); ++e)
        if (Index{sel[e]} * sbs + sbs > L) u = std::gcd(u, L - Index{sel[e]} * sbs);
    }
  }
  detail::KvPages<T> pages;
  pages.page_size = u;
  pages.first.assign(static_cast<size_t>(E), 0);
  std::vector<Index> kv_len(static_cast<size_t>(E), 0);
  for (Index r = r0; r < r1; ++r) {
    const Index b = batch_of[static_cast<size_t>(r)], L = limit[static_cast<size_t>(r - r0)];
    for (Index g = 0; g < N2; ++g) {
      const Index e = (r - r0) * N2 + g;
      pages.first[static_cast<size_t>(e)] = static_cast<Index>(pages.k.size());
      if (L <= 0) continue;
      sfa_runs(in.sparse_indices.data() + (r * N2 + g) * pl.K, pl.K, sbs, L, sel);
      Index n = 0;
      for (const std::int32_t j : sel) {
        const Index lo = Index{j} * sbs, hi = std::min(lo + sbs, L);
        for (Index pos = lo; pos < hi; pos += u) {
          const Index tok = s.token(b, pos) * N2 + g;
          pages.k.push_back(in.key.data() + tok * D);
          pages.v.push_back(vdata + tok * D);
          pages.kr.push_back(in.key_rope.data() + tok * Dr);
        }
        n += hi - lo;
      }
      kv_len[static_cast<size_t>(e)] = n;
    }
  }
  Index max_len = 0;  // 0 when nothing is selected
  for (Index v : kv_len) max_len = std::max(max_len, v);
  AttentionInputs<T, T> ein;
  ein.q = StridedView<const T, 4>(in.query.data() + r0 * s.N1 * D, {E, 1, G, D});
  ein.q_rope = StridedView<const T, 4>(in.query_rope.data() + r0 * s.N1 * Dr, {E, 1, G, Dr});
  ein.k = StridedView<const T, 4>(in.key.data(), {E, max_len, 1, D}, {0, N2 * D, D, 1});
  ein.v = StridedView<const T, 4>(vdata, {E, max_len, 1, D}, {0, N2 * D, D, 1});
  ein.k_rope =
      StridedView<const T, 4>(in.key_rope.data(), {E, max_len, 1, Dr}, {0, N2 * Dr, Dr, 1});
  ein.seq.kv = kv_len;
  AttentionOutputs<T> eo;
  eo.o = StridedView<T, 4>(out.attention_out.data() + r0 * s.N1 * D, {E, 1, G, D});
  sfa_engine(ein, eo, pages, p.scale_value, exec);
}

/// The query rows in chunks of at most ~2^20 selected keys (the pages stay O(chunk)).
template <class T>
void sfa_run(const SparseFlashAttentionParams& p, const SparseFlashAttentionInputs<T>& in,
             const SparseFlashAttentionOutputs<T>& out, const SfaPlan& pl, const ExecConfig& exec) {
  const DsaSeqs& s = pl.s;
  const std::vector<Index> batch_of = s.batch_of_rows();
  const Index per_row = std::max<Index>(1, s.N2 * std::min<Index>(pl.K * pl.sbs, Index{1} << 20));
  const Index chunk = std::max<Index>(1, (Index{1} << 20) / per_row);
  for (Index r0 = 0; r0 < s.rows; r0 += chunk)
    sfa_run_rows(p, in, out, pl, batch_of, r0, std::min(s.rows, r0 + chunk), exec);
}

/// sparse_flash_attention on dense arguments: every check, then (run) the computation.
template <class T>
void sparse_flash_attention_dense(const SparseFlashAttentionParams& p,
                                  const SparseFlashAttentionInputs<T>& in,
                                  const SparseFlashAttentionOutputs<T>& out, const ExecConfig& exec,
                                  bool run) {
  static_assert(std::is_same_v<T, half> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float>,
                "sparse_flash_attention: half or bfloat16 (float: attnref extension)");
  SfaPlan pl;
  sfa_params(p, pl);
  sfa_shapes(p, in, out, pl);
  if (p.strict) sfa_vendor_rules(p, pl);
  sfa_indices("sparse_flash_attention", in.sparse_indices, pl);
  if (!run) return;  // validate(): every check has run, nothing is written
  sfa_run(p, in, out, pl, exec);
}

template <class T>
void sparse_flash_attention_call(const SparseFlashAttentionParams& p,
                                 const SparseFlashAttentionInputs<T>& in,
                                 const SparseFlashAttentionOutputs<T>& out, const ExecConfig& exec,
                                 bool run) {
  check_exec("sparse_flash_attention", exec);
  if (p.strict && !in.value.absent())
    ATTNREF_CHECK(in.value.data() == in.key.data() && in.value.shape() == in.key.shape() &&
                      in.value.strides() == in.key.strides(),
                  std::invalid_argument, "sparse_flash_attention", "value",
                  "not the key's memory (vendor rule: V is the key, read as V by the kernels "
                  "for sparse_block_size <= 4; params.strict = false relaxes it)",
                  "absent or the key's view", "another tensor");
  dense_call("sparse_flash_attention", in, out, run, [&](const auto& din, const auto& dout) {
    sparse_flash_attention_dense(p, din, dout, exec, run);
  });
}
}  // namespace detail

/// Every check of sparse_flash_attention() (params, tensors, index data, execution config),
/// without computing or writing anything.
template <class T>
void validate(const SparseFlashAttentionParams& p, const SparseFlashAttentionInputs<T>& in,
              const SparseFlashAttentionOutputs<T>& out, const ExecConfig& exec = {}) {
  detail::sparse_flash_attention_call(p, in, out, exec, false);
}

/// CANN SparseFlashAttention as validate -> plan -> run (every check before any write).
template <class T>
void sparse_flash_attention(const SparseFlashAttentionParams& p,
                            const SparseFlashAttentionInputs<T>& in,
                            const SparseFlashAttentionOutputs<T>& out,
                            const ExecConfig& exec = {}) {
  detail::sparse_flash_attention_call(p, in, out, exec, true);
}

}  // namespace attnref
