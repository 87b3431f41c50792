#pragma once
/// attnref::kv_quant_sparse_flash_attention — CANN aclnnKvQuantSparseFlashAttention:
/// sparse_flash_attention over an int8 latent cache whose rows pack their own scales. The
/// selection rules (limits, the slot rule, −1, clipping, repeats, empty rows) are
/// sparse_flash_attention's (sparse_flash_attention.hpp); the inputs and the dequantization
/// differ, as the vendor's A2 / A3 kernel computes them:
///   query  [.., N1, 576]: the 512 latent values, then the 64 rope values (the query's type)
///   key    [.., 1, 656] int8 rows (bytes): [0, 512) int8 latent values, [512, 640) the 64 rope
///          values in the query's type, [640, 656) four fp32 scales, scale t for the latent values
///          [128·t, 128·t + 128)
///   k̂      = T(float(int8) · scale_t) for the latent part (rounded to the query's type T), the
///          rope part as stored; V = the same dequantized latent part
///   out    [.., N1, 512] = softmax(scale_value · q·k̂ over the selected keys) · V
/// The dequantized rows of the selected tokens are staged per chunk of query rows (O(selected
/// keys), never the cache), then the engine runs as in sparse_flash_attention (P rounded to T).
/// `value`, `key_dequant_scale` and `value_dequant_scale` are accepted and never read: the kernel
/// reads V and the scales from the key rows. fp16 rounding is to nearest even (the golden's; the
/// kernel rounds half away from zero there).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/attention/attention.hpp"
#include "attnref/core/dense.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/exec.hpp"
#include "attnref/core/types.hpp"
#include "attnref/dsa/detail/sequences.hpp"
#include "attnref/dsa/sparse_flash_attention.hpp"
#include "attnref/nsa/compress_attention.hpp"

namespace attnref {

struct KvQuantSparseFlashAttentionParams {
  double scale_value = 1.0;            ///< scaleValue
  std::int64_t key_quant_mode = 2;     ///< 2 (per tile) only (the vendor's definition says 1,
  std::int64_t value_quant_mode = 2;   ///< its tiling takes 2 only)
  std::int64_t sparse_block_size = 1;  ///< a power of 2 in [1, 16]
  std::string layout_query = "BSND";   ///< BSND or TND
  std::string layout_kv = "BSND";      ///< BSND, TND or PA_BSND
  std::int64_t sparse_mode = 3;        ///< 0 or 3
  std::int64_t pre_tokens = std::numeric_limits<std::int64_t>::max();   ///< only the default
  std::int64_t next_tokens = std::numeric_limits<std::int64_t>::max();  ///< only the default
  std::int64_t attention_mode = 2;                                      ///< 2 (MLA-absorb) only
  std::int64_t quant_scale_repo_mode = 1;  ///< 1 (scales inside the key rows) only
  std::int64_t tile_size = 128;            ///< latent values per scale (strict: 128)
  std::int64_t rope_head_dim = 64;         ///< (strict: 64)
  bool strict = true;                      ///< the vendor's constraint list (false: relaxed)
};

/// T: half or bfloat16 (the query's type, and the rope values' inside the key rows).
template <class T>
struct KvQuantSparseFlashAttentionInputs {
  StridedView<const T> query{};                    ///< [B, S1, N1, 576] or [T1, N1, 576]
  StridedView<const std::int8_t> key{};            ///< [B, S2, 1, 656], [T2, 1, 656] or PA_BSND
                                                   ///< [blockNum, blockSize, 1, 656]
  StridedView<const std::int8_t> value{};          ///< accepted, never read (V is the key's latent)
  StridedView<const float> key_dequant_scale{};    ///< reserved: accepted, never read
  StridedView<const float> value_dequant_scale{};  ///< reserved: accepted, never read
  StridedView<const std::int32_t> sparse_indices{};      ///< [B, S1, 1, K] or [T1, 1, K]
  StridedView<const std::int32_t> block_table{};         ///< PA_BSND: [B, maxBlocks]
  std::vector<std::int64_t> actual_seq_lengths_query{};  ///< [B] (TND: cumulative, required)
  std::vector<std::int64_t> actual_seq_lengths_kv{};     ///< [B] (TND: cumulative; TND and
                                                         ///< PA_BSND: required)

  /// Calls f(name, view) for every tensor field (the ones read).
  template <class F>
  void for_each_view(F&& f) {
    f("query", query), f("key", key), f("sparse_indices", sparse_indices);
    f("block_table", block_table);
  }
};

template <class T>
struct KvQuantSparseFlashAttentionOutputs {
  StridedView<T> attention_out{};  ///< the query's shape with 512 (the latent size)

  template <class F>
  void for_each_view(F&& f) {
    f("attention_out", attention_out);
  }
};

namespace detail {

/// The latent and rope sizes, tile, and the packed row's width in bytes.
struct KvqRow {
  Index nope = 512, rope = 64, tile = 128, width = 656;
};

template <class T>
KvqRow kvq_checks(const KvQuantSparseFlashAttentionParams& p,
                  const KvQuantSparseFlashAttentionInputs<T>& in,
                  const KvQuantSparseFlashAttentionOutputs<T>& out, SfaPlan& pl) {
  constexpr const char* fn = "kv_quant_sparse_flash_attention";
  SparseFlashAttentionParams sp;
  sp.scale_value = p.scale_value, sp.sparse_block_size = p.sparse_block_size;
  sp.layout_query = p.layout_query, sp.layout_kv = p.layout_kv, sp.sparse_mode = p.sparse_mode;
  sp.pre_tokens = p.pre_tokens, sp.next_tokens = p.next_tokens;
  sp.attention_mode = p.attention_mode, sp.strict = p.strict;
  sfa_params(sp, pl, fn);
  ATTNREF_CHECK(p.key_quant_mode == 2 && p.value_quant_mode == 2 && p.quant_scale_repo_mode == 1,
                std::invalid_argument, fn,
                "params.key_quant_mode / value_quant_mode / quant_scale_repo_mode", "not supported",
                "2 / 2 / 1",
                std::to_string(p.key_quant_mode) + " / " + std::to_string(p.value_quant_mode) +
                    " / " + std::to_string(p.quant_scale_repo_mode));
  DsaSeqs& s = pl.s;
  dsa_query(fn, p.layout_query, in.query, in.actual_seq_lengths_query, "actual_seq_lengths_query",
            s);
  dsa_keys(fn, p.layout_kv, "params.layout_kv", "key", in.key, in.block_table,
           in.actual_seq_lengths_kv, "actual_seq_lengths_kv", s);
  KvqRow r;
  r.rope = static_cast<Index>(p.rope_head_dim), r.tile = static_cast<Index>(p.tile_size);
  ATTNREF_CHECK(
      r.rope > 0 && r.tile > 0 && s.D > r.rope && (s.D - r.rope) % r.tile == 0,
      std::invalid_argument, fn, "query.shape (D) / params.rope_head_dim / tile_size",
      "the latent part is not a whole number of tiles",
      "D = rope_head_dim + a multiple of tile_size",
      std::to_string(s.D) + " / " + std::to_string(r.rope) + " / " + std::to_string(r.tile));
  r.nope = s.D - r.rope;
  r.width = r.nope + r.rope * Index{sizeof(T)} + (r.nope / r.tile) * 4;
  ATTNREF_CHECK(in.key.size(in.key.rank() - 1) == r.width, std::invalid_argument, fn, "key.shape",
                "row width is not latent + 2 * rope + 4 * scales bytes", std::to_string(r.width),
                shape_str(in.key));
  ATTNREF_CHECK(s.N1 % s.N2 == 0, std::invalid_argument, fn, "query.shape",
                "query heads not a multiple of the key heads",
                "a multiple of " + std::to_string(s.N2), shape_str(in.query));
  pl.G = s.N1 / s.N2, pl.Dr = r.rope;
  Dims want = in.query.shape();
  const int qr = want.size();
  want[qr - 2] = s.N2;
  const auto& si = in.sparse_indices;
  ATTNREF_CHECK(!si.absent() && si.rank() == qr && si.size(qr - 1) > 0 && si.size(0) == want[0] &&
                    si.size(qr - 2) == s.N2 && (qr == 3 || si.size(1) == want[1]),
                std::invalid_argument, fn, "sparse_indices.shape", "mismatch",
                s.q_tnd ? "[T1, N2, K > 0]" : "[B, S1, N2, K > 0]", shape_str(si));
  pl.K = si.size(qr - 1);
  Dims o = in.query.shape();
  o[qr - 1] = r.nope;
  ATTNREF_CHECK(!out.attention_out.absent() && out.attention_out.shape() == o,
                std::invalid_argument, fn, "attention_out.shape",
                "mismatch (the query's shape with the latent size)",
                shape_str(StridedView<const T>(nullptr, o)), shape_str(out.attention_out));
  return r;
}

/// The vendor's shape rules (params.strict).
inline void kvq_vendor_rules(const KvQuantSparseFlashAttentionParams& p, const SfaPlan& pl,
                             const KvqRow& r) {
  constexpr const char* fn = "kv_quant_sparse_flash_attention";
  const std::string rule = " (vendor rule; params.strict = false relaxes it)";
  ATTNREF_CHECK(
      r.nope == 512 && r.rope == 64 && r.tile == 128, std::invalid_argument, fn,
      "query.shape (D) / rope_head_dim / tile_size", "not supported" + rule, "576 / 64 / 128",
      std::to_string(pl.s.D) + " / " + std::to_string(r.rope) + " / " + std::to_string(r.tile));
  ATTNREF_CHECK(pl.sbs <= 16, std::invalid_argument, fn, "params.sparse_block_size",
                "not supported" + rule, "1, 2, 4, 8 or 16", std::to_string(pl.sbs));
  SparseFlashAttentionParams sp;
  sp.layout_query = p.layout_query, sp.layout_kv = p.layout_kv;
  SfaPlan rules = pl;
  rules.Dr = 64;
  rules.s.D = 512;  // the latent size for the shared N1 / N2 / block-size / pair rules
  sfa_vendor_rules(sp, rules);
}

/// Rows [r0, r1): the selected tokens of every (row, key head) dequantized into `stage`
/// ([keys, nope + rope] in T, one page per sequence), then the engine.
template <class T>
void kvq_run_rows(const KvQuantSparseFlashAttentionParams& p,
                  const KvQuantSparseFlashAttentionInputs<T>& in,
                  const KvQuantSparseFlashAttentionOutputs<T>& out, const SfaPlan& pl,
                  const KvqRow& r, const std::vector<Index>& batch_of, Index r0, Index r1,
                  const ExecConfig& exec) {
  const DsaSeqs& s = pl.s;
  const Index N2 = s.N2, G = pl.G, E = (r1 - r0) * N2, C = r.nope + r.rope;
  std::vector<T> stage;
  std::vector<Index> kv_len(static_cast<size_t>(E), 0), start(static_cast<size_t>(E), 0);
  std::vector<std::int32_t> sel;
  std::vector<float> scale(static_cast<size_t>(r.nope / r.tile));
  for (Index row = r0; row < r1; ++row) {
    const Index b = batch_of[static_cast<size_t>(row)];
    const Index L = s.limit(b, row - s.q_row0[static_cast<size_t>(b)], p.sparse_mode == 3);
    for (Index g = 0; g < N2; ++g) {
      const Index e = (row - r0) * N2 + g;
      start[static_cast<size_t>(e)] = static_cast<Index>(stage.size()) / C;
      if (L <= 0) continue;
      sfa_runs(in.sparse_indices.data() + (row * N2 + g) * pl.K, pl.K, pl.sbs, L, sel);
      for (const std::int32_t j : sel)
        for (Index pos = Index{j} * pl.sbs; pos < std::min(Index{j} * pl.sbs + pl.sbs, L); ++pos) {
          const std::int8_t* src = in.key.data() + (s.token(b, pos) * N2 + g) * r.width;
          std::memcpy(scale.data(), src + r.nope + r.rope * Index{sizeof(T)},
                      scale.size() * sizeof(float));
          const size_t at = stage.size();
          stage.resize(at + static_cast<size_t>(C));
          for (Index x = 0; x < r.nope; ++x)
            stage[at + static_cast<size_t>(x)] =
                T(static_cast<float>(src[x]) * scale[static_cast<size_t>(x / r.tile)]);
          std::memcpy(static_cast<void*>(stage.data() + at + static_cast<size_t>(r.nope)),
                      src + r.nope, static_cast<size_t>(r.rope) * sizeof(T));
          ++kv_len[static_cast<size_t>(e)];
        }
    }
  }
  Index max_len = 0;
  for (Index v : kv_len) max_len = std::max(max_len, v);
  detail::KvPages<T> pages;
  pages.page_size = std::max<Index>(1, max_len);  // one page per sequence
  for (Index e = 0; e < E; ++e) {
    pages.first.push_back(e);
    const T* base = stage.data() + start[static_cast<size_t>(e)] * C;
    pages.k.push_back(base), pages.v.push_back(base), pages.kr.push_back(base + r.nope);
  }
  const T* st = stage.data();
  AttentionInputs<T, T> ein;
  ein.q = StridedView<const T, 4>(in.query.data() + r0 * s.N1 * s.D, {E, 1, G, r.nope},
                                  {G * s.D, s.D, s.D, 1});
  ein.q_rope = StridedView<const T, 4>(in.query.data() + r0 * s.N1 * s.D + r.nope,
                                       {E, 1, G, r.rope}, {G * s.D, s.D, s.D, 1});
  ein.k = StridedView<const T, 4>(st, {E, max_len, 1, r.nope}, {0, C, C, 1});
  ein.v = ein.k;
  ein.k_rope =
      StridedView<const T, 4>(st ? st + r.nope : st, {E, max_len, 1, r.rope}, {0, C, C, 1});
  ein.seq.kv = kv_len;
  AttentionOutputs<T> eo;
  eo.o = StridedView<T, 4>(out.attention_out.data() + r0 * s.N1 * r.nope, {E, 1, G, r.nope});
  sfa_engine(ein, eo, pages, p.scale_value, exec);
}

template <class T>
void kv_quant_sparse_flash_attention_dense(const KvQuantSparseFlashAttentionParams& p,
                                           const KvQuantSparseFlashAttentionInputs<T>& in,
                                           const KvQuantSparseFlashAttentionOutputs<T>& out,
                                           const ExecConfig& exec, bool run) {
  static_assert(std::is_same_v<T, half> || std::is_same_v<T, bfloat16>,
                "kv_quant_sparse_flash_attention: half or bfloat16");
  SfaPlan pl;
  const KvqRow r = kvq_checks(p, in, out, pl);
  if (p.strict) kvq_vendor_rules(p, pl, r);
  sfa_indices("kv_quant_sparse_flash_attention", in.sparse_indices, pl);
  if (!run) return;  // validate(): every check has run, nothing is written
  const DsaSeqs& s = pl.s;
  const std::vector<Index> batch_of = s.batch_of_rows();
  // Chunks of at most ~2^16 staged keys (O(chunk · 576) values).
  const Index per_row = std::max<Index>(1, s.N2 * std::min<Index>(pl.K * pl.sbs, Index{1} << 16));
  const Index chunk = std::max<Index>(1, (Index{1} << 16) / per_row);
  for (Index r0 = 0; r0 < s.rows; r0 += chunk)
    kvq_run_rows(p, in, out, pl, r, batch_of, r0, std::min(s.rows, r0 + chunk), exec);
}

template <class T>
void kv_quant_sparse_flash_attention_call(const KvQuantSparseFlashAttentionParams& p,
                                          const KvQuantSparseFlashAttentionInputs<T>& in,
                                          const KvQuantSparseFlashAttentionOutputs<T>& out,
                                          const ExecConfig& exec, bool run) {
  constexpr const char* fn = "kv_quant_sparse_flash_attention";
  check_exec(fn, exec);
  check_views(fn, "value", in.value, "key_dequant_scale", in.key_dequant_scale,
              "value_dequant_scale", in.value_dequant_scale);
  dense_call(fn, in, out, run, [&](const auto& din, const auto& dout) {
    kv_quant_sparse_flash_attention_dense(p, din, dout, exec, run);
  });
}
}  // namespace detail

/// Every check of kv_quant_sparse_flash_attention() without computing or writing anything.
template <class T>
void validate(const KvQuantSparseFlashAttentionParams& p,
              const KvQuantSparseFlashAttentionInputs<T>& in,
              const KvQuantSparseFlashAttentionOutputs<T>& out, const ExecConfig& exec = {}) {
  detail::kv_quant_sparse_flash_attention_call(p, in, out, exec, false);
}

/// CANN KvQuantSparseFlashAttention as validate -> plan -> run (every check before any write).
template <class T>
void kv_quant_sparse_flash_attention(const KvQuantSparseFlashAttentionParams& p,
                                     const KvQuantSparseFlashAttentionInputs<T>& in,
                                     const KvQuantSparseFlashAttentionOutputs<T>& out,
                                     const ExecConfig& exec = {}) {
  detail::kv_quant_sparse_flash_attention_call(p, in, out, exec, true);
}

}  // namespace attnref
