#pragma once
/// The checks and the plan of ATB PagedAttention (attnref::paged_attention,
/// atb/paged_attention.hpp): the params against each other and the type family, the tensors'
/// shapes, the query packing and the paged cache. Not part of the API.

#include <algorithm>
#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/atb/paged_attention_io.hpp"
#include "attnref/atb/paged_attention_params.hpp"
#include "attnref/attention/attention.hpp"
#include "attnref/attention/paged_kv.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/view.hpp"

namespace attnref {

namespace detail {

/// What PagedAttention's checks found: sizes, the query tokens of each sequence (q_cu), and the
/// validated paged cache (context_lens 0 for the sequences batch_run_status turns off).
template <class TKV>
struct PaPlan {
  Index batch = 0, tokens = 0, nh = 0, d = 0, nkv = 0, dv = 0, max_q = 0, max_kv = 0;
  std::vector<Index> q_cu;
  PagedKvCache<const TKV> cache;
};

/// The params against each other and against the type family (nothing read from the tensors).
template <class TQ, class TKV, class TO>
void pa_check_modes(const PagedAttentionParams& params) {
  using P = PagedAttentionParams;
  constexpr const char* fn = "paged_attention";
  constexpr bool kQkv = std::is_same_v<TQ, std::int8_t>;
  constexpr bool kDequant = !kQkv && std::is_same_v<TKV, std::int8_t>;
  validate(params);
  const std::string mt = std::to_string(static_cast<int>(params.mask_type));
  const bool spec = params.calc_type == P::CalcType::Spec;
  const bool mla = params.mla_v_head_size > 0;
  ATTNREF_CHECK(
      params.mask_type != P::MaskType::MaskFree && params.mask_type != P::MaskType::NormCompress,
      std::invalid_argument, fn, "params.mask_type",
      "Atlas 300I Duo (310P) only; attnref models the Atlas A2 ND kernels",
      "Undefined, Norm, Alibi or Spec", mt);
  ATTNREF_NOT_IMPLEMENTED(params.compress_type == P::CompressType::Undefined, "paged_attention",
                          "params.compress_type",
                          std::to_string(static_cast<int>(params.compress_type)));
  ATTNREF_NOT_IMPLEMENTED(params.input_layout == P::InputLayout::BSND, "paged_attention",
                          "params.input_layout", "BNSD");

  // The quantization mode against the types.
  const auto qt = params.quant_type;
  const std::string qts = std::to_string(static_cast<int>(qt));
  if constexpr (kQkv) {
    ATTNREF_CHECK(qt == P::QuantType::QkvOffline || qt == P::QuantType::QkvOnline,
                  std::invalid_argument, "paged_attention", "params.quant_type",
                  "does not match int8 query and caches", "QkvOffline (2) or QkvOnline (3)", qts);
    const auto od = std::is_same_v<TO, half> ? P::OutDataType::Float16 : P::OutDataType::BFloat16;
    ATTNREF_CHECK(params.out_data_type == od, std::invalid_argument, "paged_attention",
                  "params.out_data_type", "does not match the output type",
                  std::to_string(static_cast<int>(od)),
                  std::to_string(static_cast<int>(params.out_data_type)));
    ATTNREF_CHECK(!params.has_quant_offset, std::invalid_argument, "paged_attention",
                  "params.has_quant_offset", "not supported with qkv quantization", "false",
                  "true");
    ATTNREF_CHECK(params.q_scale == 0.0f || params.q_scale == 1.0f, std::invalid_argument,
                  "paged_attention", "params.q_scale", "cannot scale an int8 query", "0 or 1",
                  std::to_string(params.q_scale));
  } else if constexpr (kDequant) {
    ATTNREF_CHECK(qt == P::QuantType::DequantFusion, std::invalid_argument, "paged_attention",
                  "params.quant_type", "does not match int8 caches with a floating-point query",
                  "DequantFusion (1)", qts);
    ATTNREF_CHECK(!mla, std::invalid_argument, "paged_attention", "params.mla_v_head_size",
                  "not supported with DequantFusion", "0", std::to_string(params.mla_v_head_size));
    ATTNREF_CHECK(!spec, std::invalid_argument, "paged_attention", "params.calc_type",
                  "Spec not supported with DequantFusion", "Undefined", "Spec");
  } else {
    ATTNREF_CHECK(qt == P::QuantType::Unquant, std::invalid_argument, "paged_attention",
                  "params.quant_type",
                  "does not match floating-point caches (int8 caches need DequantFusion)",
                  "Unquant (0)", qts);
  }

  // Parallel decoding (calcType SPEC) and the masks it allows.
  if (spec) {
    ATTNREF_CHECK(!params.batch_run_status_enable, std::invalid_argument, "paged_attention",
                  "params.batch_run_status_enable", "not supported with calc_type Spec", "false",
                  "true");
    if (mla)
      ATTNREF_CHECK(params.mask_type != P::MaskType::Norm && qt == P::QuantType::Unquant,
                    std::invalid_argument, "paged_attention", "params.mask_type",
                    "MLA with calc_type Spec takes no Norm mask and no quantization",
                    "Undefined or Spec, Unquant", mt);
    else
      ATTNREF_CHECK(params.mask_type == P::MaskType::Norm || params.mask_type == P::MaskType::Spec,
                    std::invalid_argument, "paged_attention", "params.mask_type",
                    "calc_type Spec needs a Norm or Spec mask", "Norm or Spec", mt);
  }
  if (mla)
    ATTNREF_CHECK(params.mask_type != P::MaskType::Alibi, std::invalid_argument, "paged_attention",
                  "params.mask_type", "Alibi not supported with MLA", "not Alibi", mt);
}

/// The tensors' shapes and lengths, the output against every input, and the paged cache (every
/// used block-table entry: std::out_of_range).
template <class TQ, class TKV, class TM, class TO>
PaPlan<TKV> pa_plan(const PagedAttentionParams& params, const PagedAttentionInputs<TQ, TKV, TM>& in,
                    const PagedAttentionOutputs<TO>& out) {
  using P = PagedAttentionParams;
  constexpr const char* fn = "paged_attention";
  const bool spec = params.calc_type == P::CalcType::Spec;
  const bool mla = params.mla_v_head_size > 0;
  detail::check_view(fn, "query", in.query);
  detail::check_view(fn, "key_cache", in.key_cache);
  detail::check_view(fn, "value_cache", in.value_cache);
  detail::check_view(fn, "block_tables", in.block_tables);
  detail::check_view(fn, "mask", in.mask);
  detail::check_view(fn, "spec_mask", in.spec_mask);
  detail::check_view(fn, "alibi_mask", in.alibi_mask);
  detail::check_view(fn, "log_n", in.log_n);
  detail::check_view(fn, "k_descale", in.k_descale);
  detail::check_view(fn, "v_descale", in.v_descale);
  detail::check_view(fn, "k_offset", in.k_offset);
  detail::check_view(fn, "v_offset", in.v_offset);
  detail::check_view(fn, "p_scale", in.p_scale);
  detail::check_view(fn, "out", out.out);
  PaPlan<TKV> pl;
  const Index batch = pl.batch = static_cast<Index>(in.context_lens.size());
  const Index tokens = pl.tokens = in.query.size(0);
  const Index nh = pl.nh = in.query.size(1), d = pl.d = in.query.size(2);
  const Index nkv = pl.nkv = params.num_kv_heads > 0 ? params.num_kv_heads : params.num_heads;
  // headSizeV: value_cache's (MLA: params.mla_v_head_size, V being the first dims of K).
  const Index dv = pl.dv =
      mla ? static_cast<Index>(params.mla_v_head_size) : in.value_cache.size(3);
  ATTNREF_CHECK(batch >= 1, std::invalid_argument, fn, "context_lens", "empty", ">= 1 sequence", 0);
  ATTNREF_CHECK(nh == params.num_heads, std::invalid_argument, fn, "query.shape[1]",
                "mismatch with params.num_heads", params.num_heads, nh);
  // Query tokens per sequence.
  std::vector<Index>& q_cu = pl.q_cu;
  q_cu.assign(static_cast<size_t>(batch + 1), 0);
  if (spec) {
    ATTNREF_CHECK(static_cast<Index>(in.q_seq_lens.size()) == batch, std::invalid_argument,
                  "paged_attention", "q_seq_lens",
                  "size mismatch with context_lens for calc_type Spec", std::to_string(batch),
                  std::to_string(in.q_seq_lens.size()));
    for (Index b = 0; b < batch; ++b) {
      const Index ql = in.q_seq_lens[static_cast<size_t>(b)];
      const Index kl = in.context_lens[static_cast<size_t>(b)];
      ATTNREF_CHECK(ql >= 0 && ql <= std::max<Index>(kl, 0), std::invalid_argument,
                    "paged_attention", "q_seq_lens[" + std::to_string(b) + "]", "out of range",
                    "[0, context_lens[" + std::to_string(b) + "] = " + std::to_string(kl) + "]",
                    std::to_string(ql));
      q_cu[static_cast<size_t>(b + 1)] = q_cu[static_cast<size_t>(b)] + ql;
    }
    ATTNREF_CHECK(q_cu.back() == tokens, std::invalid_argument, "paged_attention", "query.shape[0]",
                  "mismatch with the sum of q_seq_lens", std::to_string(q_cu.back()),
                  std::to_string(tokens));
  } else {
    ATTNREF_CHECK(in.q_seq_lens.empty(), std::invalid_argument, "paged_attention", "q_seq_lens",
                  "given without calc_type Spec", "empty",
                  "[" + std::to_string(in.q_seq_lens.size()) + "]");
    for (Index b = 0; b <= batch; ++b) q_cu[static_cast<size_t>(b)] = b;
    ATTNREF_CHECK(tokens == batch, std::invalid_argument, fn, "query.shape[0]",
                  "mismatch with the number of sequences (one query token each)", batch, tokens);
  }
  for (Index b = 0; b < batch; ++b)
    pl.max_q = std::max(pl.max_q, q_cu[static_cast<size_t>(b + 1)] - q_cu[static_cast<size_t>(b)]);

  const auto& kc = in.key_cache;
  ATTNREF_CHECK(kc.size(2) == nkv && kc.size(3) == d, std::invalid_argument, fn, "key_cache.shape",
                "mismatch",
                "[numBlocks, blockSize, " + std::to_string(nkv) + ", " + std::to_string(d) + "]",
                detail::shape_str(kc));
  StridedView<const TKV, 4> vc = in.value_cache;
  if (mla) {
    ATTNREF_CHECK(dv <= d, std::invalid_argument, fn, "params.mla_v_head_size",
                  "larger than headSize (V is the first dims of K)", "<= " + std::to_string(d), dv);
    ATTNREF_CHECK(vc.absent(), std::invalid_argument, fn, "value_cache",
                  "given with mla_v_head_size (V is the first dims of K)", "absent", "a tensor");
    vc = StridedView<const TKV, 4>(kc.data(), {kc.size(0), kc.size(1), nkv, dv}, kc.strides());
  } else {
    const std::array<Index, 4> vs{kc.size(0), kc.size(1), nkv, dv};
    ATTNREF_CHECK(vc.shape() == vs, std::invalid_argument, fn, "value_cache.shape", "mismatch",
                  detail::shape_str<4>(vs), detail::shape_str(vc));
  }
  const std::array<Index, 3> os{tokens, nh, dv};
  ATTNREF_CHECK(out.out.shape() == os, std::invalid_argument, fn, "out.shape", "mismatch",
                detail::shape_str<3>(os), detail::shape_str(out.out));
  // The output against every input, under PagedAttention's names.
  detail::check_out_overlaps(
      fn, "out", out.out, "query", in.query, "key_cache", in.key_cache, "value_cache",
      in.value_cache, "block_tables", in.block_tables, "mask", in.mask, "spec_mask", in.spec_mask,
      "alibi_mask", in.alibi_mask, "log_n", in.log_n, "k_descale", in.k_descale, "v_descale",
      in.v_descale, "k_offset", in.k_offset, "v_offset", in.v_offset, "p_scale", in.p_scale);
  // The paged cache: shapes, lengths, every used block-table entry (std::out_of_range).
  pl.cache = {kc, vc, in.block_tables, in.context_lens};
  pl.cache.validate(fn, {"key_cache", "value_cache", "block_tables", "context_lens",
                         "key_cache.shape[1] (blockSize)", "blockSize"});
  std::vector<Index>& kv_len = pl.cache.context_lens;  // inactive sequences read nothing (below)
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
  for (Index l : kv_len) pl.max_kv = std::max(pl.max_kv, l);
  return pl;
}

}  // namespace detail

}  // namespace attnref
