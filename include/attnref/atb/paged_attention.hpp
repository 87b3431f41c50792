#pragma once
/// attnref::paged_attention — ATB PagedAttentionOperation (decode over a paged KV cache) on the
/// attention engine (semantics.md §3).
///
/// Implemented: calcType UNDEFINED (one query token per sequence), GQA, qkScale, qScale (0 or 1:
/// no effect; otherwise q · qScale rounded to the data type), maskType UNDEFINED, NORM
/// ([batch, 1, maxSeq] or ATB's [1, maxSeq] as [1, 1, maxSeq]; additive) and ALIBI ([batch,
/// headNum, 1, maxSeq] or ATB's [headNum, 1, maxSeq] as [1, headNum, 1, maxSeq]; additive),
/// scaleType LOGN (one float per sequence), mlaVHeadSize (V = the first mlaVHeadSize elements of
/// each K head; no value cache), batchRunStatus. Validated and rejected as not implemented yet:
/// SPEC (calcType / maskType), MASK_FREE, quantType 1–3, compressType, BNSD.
///
/// Shapes (BSND):
///   query          [batch, headNum, headSize]                     one token per sequence
///   key_cache      [numBlocks, blockSize, kvHeadNum, headSize]
///   value_cache    [numBlocks, blockSize, kvHeadNum, headSizeV]   (absent with MLA)
///   block_tables   [batch, maxBlocksPerSeq] int32: key t of sequence b is row t % blockSize of
///                  block block_tables[b][t / blockSize]; entries past the used blocks never read
///   context_lens   [batch]
///   out            [batch, headNum, headSizeV]
///
/// Per sequence b, head h (kv head h / G), key t < context_lens[b], in fp32:
///   s_t = q · k_t · qkScale (· logN[b]) + mask[b][t] + alibi[b][h][t];  p = softmax(s)
///   out = Σ_t p_t v_t rounded to the data type
/// The scores and P stay fp32 (the golden's fp32 reference; its P cast to the data type before
/// P·V is what the NPU's rounding does, not the definition — semantics.md §1). A sequence with
/// context length 0 or batchRunStatus 0 gets a zero output row.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/atb/paged_attention_params.hpp"
#include "attnref/attention/attention.hpp"
#include "attnref/attention/paged_kv.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/view.hpp"

namespace attnref {

template <class T>
struct PagedAttentionInputs {
  StridedView<const T, 3> query;        ///< [batch, headNum, headSize]
  StridedView<const T, 4> key_cache;    ///< [numBlocks, blockSize, kvHeadNum, headSize]
  StridedView<const T, 4> value_cache;  ///< [numBlocks, blockSize, kvHeadNum, headSizeV]
  StridedView<const std::int32_t, 2> block_tables;  ///< [batch, maxBlocksPerSeq]
  std::vector<Index> context_lens;                  ///< [batch]
  StridedView<const T, 3> mask{};                   ///< NORM: [batch or 1, 1, maxSeq]
  StridedView<const T, 4> alibi_mask{};             ///< ALIBI: [batch or 1, headNum, 1, maxSeq]
  StridedView<const float, 1> log_n{};              ///< LOGN: [batch]
  std::vector<std::int32_t> batch_run_status{};     ///< batchRunStatus [batch], 0 or 1
};

template <class T>
struct PagedAttentionOutputs {
  StridedView<T, 3> out;  ///< [batch, headNum, headSizeV]
};

namespace detail {

/// The engine hooks of PagedAttention: logN and the additive masks, in fp32.
template <class T>
struct AtbPagedVariant {
  StridedView<const T, 3> mask;
  StridedView<const T, 4> alibi;
  StridedView<const float, 1> log_n;

  bool has_transform() const { return !mask.absent() || !alibi.absent() || !log_n.absent(); }
  KvRange kv_range(const SeqInfo& s, Index, Index) const { return {0, s.kv_len}; }
  TileMask classify(const SeqInfo&, Index, Index, Index, Index) const { return TileMask::None; }
  bool masked(const SeqInfo&, const Coord&) const { return false; }
  template <class Acc>
  Acc transform(const SeqInfo&, const Coord& c, Acc score) const {
    float s = static_cast<float>(score);  // q · k · qkScale
    if (!log_n.absent()) s *= log_n(c.batch);
    if (!mask.absent()) s += static_cast<float>(mask(mask.size(0) == 1 ? 0 : c.batch, 0, c.kv));
    if (!alibi.absent())
      s += static_cast<float>(alibi(alibi.size(0) == 1 ? 0 : c.batch, c.q_head, 0, c.kv));
    return static_cast<Acc>(s);
  }
};

inline void pa_not_yet(bool ok, const char* field, const std::string& got) {
  ATTNREF_CHECK(ok, std::invalid_argument, "paged_attention", field, "not implemented yet",
                "what this version implements", got);
}

}  // namespace detail

/// ATB PagedAttention (decode). T: half, bfloat16 or float. Every check runs before `out` is
/// written; results never depend on num_threads (0 = OpenMP's default).
template <class T>
void paged_attention(const PagedAttentionParams& params, const PagedAttentionInputs<T>& in,
                     const PagedAttentionOutputs<T>& out, int num_threads = 0) {
  using P = PagedAttentionParams;
  static_assert(std::is_same_v<T, half> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float>,
                "paged_attention data: half, bfloat16 or float");
  constexpr const char* fn = "paged_attention";
  validate(params);
  detail::pa_not_yet(params.calc_type == P::CalcType::Undefined, "params.calc_type", "Spec");
  detail::pa_not_yet(
      params.mask_type != P::MaskType::Spec && params.mask_type != P::MaskType::MaskFree,
      "params.mask_type", std::to_string(static_cast<int>(params.mask_type)));
  detail::pa_not_yet(params.quant_type == P::QuantType::Unquant, "params.quant_type",
                     std::to_string(static_cast<int>(params.quant_type)));
  detail::pa_not_yet(params.compress_type == P::CompressType::Undefined, "params.compress_type",
                     std::to_string(static_cast<int>(params.compress_type)));
  detail::pa_not_yet(params.input_layout == P::InputLayout::BSND, "params.input_layout", "BNSD");

  const Index batch = static_cast<Index>(in.context_lens.size());
  const Index nh = in.query.size(1), d = in.query.size(2);
  const Index nkv = params.num_kv_heads > 0 ? params.num_kv_heads : params.num_heads;
  const bool mla = params.mla_v_head_size > 0;
  const Index dv = out.out.size(2);
  ATTNREF_CHECK(batch >= 1, std::invalid_argument, fn, "context_lens", "empty", ">= 1 sequence", 0);
  ATTNREF_CHECK(nh == params.num_heads, std::invalid_argument, fn, "query.shape[1]",
                "mismatch with params.num_heads", params.num_heads, nh);
  ATTNREF_CHECK(in.query.size(0) == batch, std::invalid_argument, fn, "query.shape[0]",
                "mismatch with the number of sequences (one query token each)", batch,
                in.query.size(0));
  const auto& kc = in.key_cache;
  ATTNREF_CHECK(kc.size(2) == nkv && kc.size(3) == d, std::invalid_argument, fn, "key_cache.shape",
                "mismatch",
                "[numBlocks, blockSize, " + std::to_string(nkv) + ", " + std::to_string(d) + "]",
                detail::shape_str(kc));
  StridedView<const T, 4> vc = in.value_cache;
  if (mla) {
    ATTNREF_CHECK(dv == static_cast<Index>(params.mla_v_head_size) && dv <= d,
                  std::invalid_argument, fn, "out.shape[2]",
                  "mismatch with params.mla_v_head_size (<= headSize)",
                  static_cast<Index>(params.mla_v_head_size), dv);
    ATTNREF_CHECK(vc.absent(), std::invalid_argument, fn, "value_cache",
                  "given with mla_v_head_size (V is the first dims of K)", "absent", "a tensor");
    vc = StridedView<const T, 4>(kc.data(), {kc.size(0), kc.size(1), nkv, dv}, kc.strides());
  } else {
    const std::array<Index, 4> vs{kc.size(0), kc.size(1), nkv, dv};
    ATTNREF_CHECK(vc.shape() == vs, std::invalid_argument, fn, "value_cache.shape", "mismatch",
                  detail::shape_str<4>(vs), detail::shape_str(vc));
  }
  const std::array<Index, 3> os{batch, nh, dv};
  ATTNREF_CHECK(out.out.shape() == os, std::invalid_argument, fn, "out.shape", "mismatch",
                detail::shape_str<3>(os), detail::shape_str(out.out));
  // The paged cache: shapes, lengths, every used block-table entry (std::out_of_range).
  PagedKvCache<const T> cache{kc, vc, in.block_tables, in.context_lens};
  cache.validate(fn);
  std::vector<Index> kv_len = in.context_lens;
  if (params.batch_run_status_enable) {
    ATTNREF_CHECK(static_cast<Index>(in.batch_run_status.size()) == batch, std::invalid_argument,
                  fn, "batch_run_status", "size mismatch", batch, in.batch_run_status.size());
    for (Index b = 0; b < batch; ++b) {
      const auto st = in.batch_run_status[static_cast<size_t>(b)];
      ATTNREF_CHECK(st == 0 || st == 1, std::invalid_argument, fn,
                    "batch_run_status[" + std::to_string(b) + "]", "not 0 or 1", "0 or 1", st);
      if (st == 0) kv_len[static_cast<size_t>(b)] = 0;
    }
  }
  Index max_kv = 0;
  for (Index l : kv_len) max_kv = std::max(max_kv, l);
  detail::AtbPagedVariant<T> var{};
  if (params.mask_type == P::MaskType::Norm) {
    const auto& m = in.mask;
    ATTNREF_CHECK(!m.absent(), std::invalid_argument, fn, "mask", "missing for NORM",
                  "[batch or 1, 1, maxSeq]", "none");
    ATTNREF_CHECK((m.size(0) == 1 || m.size(0) == batch) && m.size(1) == 1 && m.size(2) >= max_kv,
                  std::invalid_argument, fn, "mask.shape", "mismatch for NORM",
                  "[1 or " + std::to_string(batch) + ", 1, >= " + std::to_string(max_kv) + "]",
                  detail::shape_str(m));
    var.mask = m;
  }
  if (params.mask_type == P::MaskType::Alibi) {
    const auto& m = in.alibi_mask;
    ATTNREF_CHECK(!m.absent(), std::invalid_argument, fn, "alibi_mask", "missing for ALIBI",
                  "[batch or 1, headNum, 1, maxSeq]", "none");
    ATTNREF_CHECK((m.size(0) == 1 || m.size(0) == batch) && m.size(1) == nh && m.size(2) == 1 &&
                      m.size(3) >= max_kv,
                  std::invalid_argument, fn, "alibi_mask.shape", "mismatch for ALIBI",
                  "[1 or " + std::to_string(batch) + ", " + std::to_string(nh) +
                      ", 1, >= " + std::to_string(max_kv) + "]",
                  detail::shape_str(m));
    var.alibi = m;
  }
  if (params.scale_type == P::ScaleType::LogN) {
    ATTNREF_CHECK(!in.log_n.absent() && in.log_n.size(0) >= batch, std::invalid_argument, fn,
                  "log_n", "missing or shorter than the batch for LOGN", "[batch] float",
                  detail::shape_str(in.log_n));
    var.log_n = in.log_n;
  }

  // q · qScale in the data type (qScale 0 or 1: no effect).
  std::vector<T> q_scaled;
  StridedView<const T, 4> q4(in.query.data(), {1, batch, nh, d},
                             {0, in.query.stride(0), in.query.stride(1), in.query.stride(2)});
  const bool q_scale = params.q_scale != 0.0f && params.q_scale != 1.0f;
  AttentionInputs<T> e;
  e.q = q4;
  e.k = kc;
  e.v = vc;
  e.block_table = in.block_tables;
  e.seq.kv = kv_len;
  e.seq.q_cu.resize(static_cast<size_t>(batch + 1));
  for (Index b = 0; b <= batch; ++b) e.seq.q_cu[static_cast<size_t>(b)] = b;
  AttentionParams ep;
  ep.scale = params.qk_scale;
  ep.num_threads = num_threads;
  AttentionOutputs<T> eo{
      StridedView<T, 4>(out.out.data(), {1, batch, nh, dv},
                        {0, out.out.stride(0), out.out.stride(1), out.out.stride(2)})};
  validate(e, ep, eo);  // engine checks, overlaps included, before anything is written
  if (q_scale) {
    q_scaled.resize(static_cast<size_t>(batch * nh * d));
    for (Index b = 0; b < batch; ++b)
      for (Index h = 0; h < nh; ++h)
        for (Index x = 0; x < d; ++x)
          q_scaled[static_cast<size_t>((b * nh + h) * d + x)] =
              T(static_cast<float>(in.query(b, h, x)) * params.q_scale);
    e.q = StridedView<const T, 4>(q_scaled.data(), {1, batch, nh, d});
  }
  attention_with(var, e, ep, eo);
}

}  // namespace attnref
