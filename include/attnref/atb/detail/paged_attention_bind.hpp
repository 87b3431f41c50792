#pragma once
/// The masks, logN and quantization scales of ATB PagedAttention (attnref::paged_attention,
/// atb/paged_attention.hpp), checked against the plan and bound to its variant. Not part of the
/// API.

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "attnref/atb/detail/paged_attention_plan.hpp"
#include "attnref/atb/detail/paged_attention_variant.hpp"
#include "attnref/atb/mask_encoding.hpp"
#include "attnref/atb/paged_attention_io.hpp"
#include "attnref/atb/paged_attention_params.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/quant.hpp"
#include "attnref/core/view.hpp"

namespace attnref {

namespace detail {

/// The mask values against the encoding table (atb/mask_encoding.hpp), sequence by sequence
/// over the rows and keys the run reads, and the factor of a binary mask (the MLA multi-token
/// kernel in bf16 / float).
template <class TQ, class TKV, class TM, class Variant>
void pa_mask_values(const PagedAttentionParams& params, const PagedAttentionInputs<TQ, TKV, TM>& in,
                    const PaPlan<TKV>& pl, Variant& var) {
  constexpr const char* fn = "paged_attention";
  const MaskRule causal = paged_attention_mask_rule<TM>(params, MaskRole::Causal);
  const MaskRule bias = paged_attention_mask_rule<TM>(params, MaskRole::HeadBias);
  var.mask_factor = causal.factor;
  const auto& lens = pl.cache.context_lens;
  for (Index b = 0; b < pl.batch; ++b) {
    const Index kv = lens[static_cast<size_t>(b)];
    const Index q0 = pl.q_cu[static_cast<size_t>(b)], q1 = pl.q_cu[static_cast<size_t>(b + 1)];
    if (kv == 0 || q1 == q0) continue;                        // reads no mask
    const Index row = pl.compress > 0 ? b / pl.compress : b;  // the sequence's (token's) row
    const Index mb = in.mask.size(0) == 1 ? 0 : row, ab = in.alibi_mask.size(0) == 1 ? 0 : row;
    if (var.square)
      check_mask_values<TM, 3>(fn, "mask", in.mask, causal, {0, kv - (q1 - q0), 0}, {1, kv, kv});
    else
      check_mask_values<TM, 3>(fn, "mask", in.mask, causal, {mb, 0, 0}, {mb + 1, 1, kv});
    check_mask_values<TM, 2>(fn, "spec_mask", in.spec_mask, causal, {q0, 0}, {q1, kv});
    check_mask_values<TM, 4>(fn, "alibi_mask", in.alibi_mask, bias, {ab, 0, 0, 0},
                             {ab + 1, pl.nh, 1, kv});
  }
}

/// Masks (exactly the tensor of params.mask_type) and logN, checked and bound to the variant.
template <class TQ, class TKV, class TM, class Variant>
void pa_bind_masks(const PagedAttentionParams& params, const PagedAttentionInputs<TQ, TKV, TM>& in,
                   const PaPlan<TKV>& pl, Variant& var) {
  using P = PagedAttentionParams;
  const Index batch = pl.batch, tokens = pl.tokens, nh = pl.nh, max_q = pl.max_q,
              max_kv = pl.max_kv;
  const std::string mt = std::to_string(static_cast<int>(params.mask_type));
  var.q_cu = &pl.q_cu;
  const auto mask_t = params.mask_type;
  ATTNREF_CHECK(in.mask.absent() || mask_t == P::MaskType::Norm, std::invalid_argument,
                "paged_attention", "mask", "given for mask_type " + mt, "absent",
                detail::shape_str(in.mask));
  ATTNREF_CHECK(in.spec_mask.absent() || mask_t == P::MaskType::Spec, std::invalid_argument,
                "paged_attention", "spec_mask", "given for mask_type " + mt, "absent",
                detail::shape_str(in.spec_mask));
  ATTNREF_CHECK(in.alibi_mask.absent() || mask_t == P::MaskType::Alibi, std::invalid_argument,
                "paged_attention", "alibi_mask", "given for mask_type " + mt, "absent",
                detail::shape_str(in.alibi_mask));
  // compressType: NORM and ALIBI have one row per query token (pair b reads token b / kvHeadNum).
  const bool compress = pl.compress > 0;
  const Index mrows = compress ? pl.tokens : batch;
  const std::string mr = compress ? "numTokens" : "batch";
  if (mask_t == P::MaskType::Norm) {
    const auto& m = in.mask;
    ATTNREF_CHECK(
        !m.absent(), std::invalid_argument, "paged_attention", "mask", "missing for Norm",
        compress ? "[numTokens or 1, 1, maxSeq]" : "[batch or 1, 1, maxSeq] or [1, maxSeq, maxSeq]",
        "none");
    const bool rows = m.size(1) == 1 && (m.size(0) == 1 || m.size(0) == mrows);
    const bool square = !compress && !rows && m.size(0) == 1 && m.size(1) == m.size(2);
    ATTNREF_CHECK((rows || square) && m.size(2) >= max_kv, std::invalid_argument, "paged_attention",
                  "mask.shape", "mismatch for Norm",
                  "[1 or " + std::to_string(mrows) + ", 1, >= " + std::to_string(max_kv) + "]" +
                      (compress ? std::string(" (compress_type: one row per query token)")
                                : " or [1, M, M] with M >= " + std::to_string(max_kv)),
                  detail::shape_str(m));
    ATTNREF_CHECK(square || max_q <= 1, std::invalid_argument, "paged_attention", "mask.shape",
                  "a row mask serves one query token per sequence; several need the square form",
                  "[1, maxSeq, maxSeq]", detail::shape_str(m));
    var.mask = m;
    var.square = square;
  }
  if (mask_t == P::MaskType::Spec) {
    const auto& m = in.spec_mask;
    ATTNREF_CHECK(!m.absent() && m.size(0) == tokens && m.size(1) >= max_kv, std::invalid_argument,
                  "paged_attention", "spec_mask.shape", "mismatch for Spec",
                  "[" + std::to_string(tokens) + ", >= " + std::to_string(max_kv) + "]",
                  m.absent() ? std::string("none") : detail::shape_str(m));
    var.spec_mask = m;
  }
  if (mask_t == P::MaskType::Alibi) {
    const auto& m = in.alibi_mask;
    ATTNREF_CHECK(!m.absent(), std::invalid_argument, "paged_attention", "alibi_mask",
                  "missing for Alibi", "[" + mr + " or 1, headNum, 1, maxSeq]", "none");
    ATTNREF_CHECK((m.size(0) == 1 || m.size(0) == mrows) && m.size(1) == nh && m.size(2) == 1 &&
                      m.size(3) >= max_kv,
                  std::invalid_argument, "paged_attention", "alibi_mask.shape",
                  "mismatch for Alibi",
                  "[1 or " + std::to_string(mrows) + ", " + std::to_string(nh) +
                      ", 1, >= " + std::to_string(max_kv) + "]",
                  detail::shape_str(m));
    var.alibi = m;
  }
  if (params.scale_type == P::ScaleType::LogN) {
    ATTNREF_CHECK(!in.log_n.absent() && in.log_n.size(0) >= batch, std::invalid_argument,
                  "paged_attention", "log_n", "missing or shorter than the batch for LogN",
                  "[batch] float", pa_len(in.log_n));
    var.log_n = in.log_n;
  }
  pa_mask_values(params, in, pl, var);
}

/// compressType (razor attention): the pairs' query heads against the real ones, and for
/// KVHEAD_ROPE razor_offset [numBlocks, blockSize], read through the pair's block table and
/// added to q·k before qkScale (the engine's scale is then 1 and the variant applies qkScale).
template <class TQ, class TKV, class TM, class Variant>
void pa_bind_compress(const PagedAttentionParams& params,
                      const PagedAttentionInputs<TQ, TKV, TM>& in, const PaPlan<TKV>& pl,
                      Variant& var) {
  const auto& r = in.razor_offset;
  if (params.compress_type != PagedAttentionParams::CompressType::KvHeadRope) {
    ATTNREF_CHECK(r.absent(), std::invalid_argument, "paged_attention", "razor_offset",
                  "given without compress_type KvHeadRope", "absent", detail::shape_str(r));
  } else {
    const std::array<Index, 2> want{pl.cache.num_blocks(), pl.cache.block_size()};
    ATTNREF_CHECK(!r.absent() && r.shape() == want, std::invalid_argument, "paged_attention",
                  "razor_offset.shape",
                  "mismatch for compress_type KvHeadRope (one value per cache slot)",
                  detail::shape_str<2>(want), r.absent() ? "none" : detail::shape_str(r));
    var.razor = r;
    var.table = in.block_tables;
    var.razor_scale = params.qk_scale;
  }
  var.compress = pl.compress;
  var.pair_heads = pl.heads;
}

/// The quantization scales of the type family, checked (finite) and bound to the variant.
template <class TQ, class TKV, class TM, class Variant>
void pa_bind_scales(const PagedAttentionParams& params, const PagedAttentionInputs<TQ, TKV, TM>& in,
                    const PaPlan<TKV>& pl, Variant& var) {
  using P = PagedAttentionParams;
  constexpr bool kQkv = std::is_same_v<TQ, std::int8_t>;
  constexpr bool kDequant = !kQkv && std::is_same_v<TKV, std::int8_t>;
  const Index nh = pl.nh, d = pl.d, nkv = pl.nkv, dv = pl.dv;
  const auto qt = params.quant_type;
  const Index kch = nkv * d, vch = nkv * dv;
  if constexpr (kDequant) {
    ATTNREF_CHECK(!in.k_descale.absent() && in.k_descale.size(0) == kch, std::invalid_argument,
                  "paged_attention", "k_descale", "per-channel scales for DequantFusion",
                  "[" + std::to_string(kch) + "]", pa_len(in.k_descale));
    ATTNREF_CHECK(!in.v_descale.absent() && in.v_descale.size(0) == vch, std::invalid_argument,
                  "paged_attention", "v_descale", "per-channel scales for DequantFusion",
                  "[" + std::to_string(vch) + "]", pa_len(in.v_descale));
    if (params.has_quant_offset) {
      ATTNREF_CHECK(!in.k_offset.absent() && in.k_offset.size(0) == kch, std::invalid_argument,
                    "paged_attention", "k_offset", "per-channel offsets for has_quant_offset",
                    "[" + std::to_string(kch) + "]", pa_len(in.k_offset));
      ATTNREF_CHECK(!in.v_offset.absent() && in.v_offset.size(0) == vch, std::invalid_argument,
                    "paged_attention", "v_offset", "per-channel offsets for has_quant_offset",
                    "[" + std::to_string(vch) + "]", pa_len(in.v_offset));
    } else {
      ATTNREF_CHECK(in.k_offset.absent() && in.v_offset.absent(), std::invalid_argument,
                    "paged_attention", "k_offset / v_offset",
                    "given without params.has_quant_offset", "absent", "a tensor");
    }
    ATTNREF_CHECK(in.p_scale.absent(), std::invalid_argument, "paged_attention", "p_scale",
                  "given for DequantFusion", "absent", pa_len(in.p_scale));
  } else if constexpr (kQkv) {
    const bool online = qt == P::QuantType::QkvOnline;
    ATTNREF_CHECK(!in.k_descale.absent() && in.k_descale.size(0) == nh, std::invalid_argument,
                  "paged_attention", "k_descale", "per-head scales for qkv quantization",
                  "[" + std::to_string(nh) + "]", pa_len(in.k_descale));
    ATTNREF_CHECK(!in.v_descale.absent() && in.v_descale.size(0) == nh, std::invalid_argument,
                  "paged_attention", "v_descale", "per-head scales for qkv quantization",
                  "[" + std::to_string(nh) + "]", pa_len(in.v_descale));
    ATTNREF_CHECK(online ? in.p_scale.absent() : !in.p_scale.absent() && in.p_scale.size(0) == nh,
                  std::invalid_argument, "paged_attention", "p_scale",
                  online ? "given for QkvOnline" : "per-head scales for QkvOffline",
                  online ? std::string("absent") : "[" + std::to_string(nh) + "]",
                  pa_len(in.p_scale));
    ATTNREF_CHECK(in.k_offset.absent() && in.v_offset.absent(), std::invalid_argument,
                  "paged_attention", "k_offset / v_offset", "given for qkv quantization", "absent",
                  "a tensor");
    var.head_scale = in.k_descale;
    var.qk_scale = params.qk_scale;
    var.form = PQuantStep::Form::PagedAttention;
    var.v_descale = in.v_descale;
    var.p_scale = in.p_scale;
    var.online = online;
  } else {
    ATTNREF_CHECK(in.k_descale.absent() && in.v_descale.absent() && in.p_scale.absent() &&
                      in.k_offset.absent() && in.v_offset.absent(),
                  std::invalid_argument, "paged_attention",
                  "k_descale / v_descale / p_scale / offsets", "given without quantization",
                  "absent", "a tensor");
  }
  // Non-finite scales would give NaN heads (rejected, as PFA and SelfAttention do).
  detail::check_finite("paged_attention", "k_descale", in.k_descale);
  detail::check_finite("paged_attention", "v_descale", in.v_descale);
  detail::check_finite("paged_attention", "p_scale", in.p_scale);
}

/// The variant type of a PagedAttention type family.
template <class TQ, class TM>
using PaVariant = std::conditional_t<std::is_same_v<TQ, std::int8_t>, AtbPagedQuantVariant<TM>,
                                     AtbPagedVariant<TM>>;

}  // namespace detail

}  // namespace attnref
