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

/// What PagedAttention's checks found: sizes, the query rows of each sequence (q_cu: packed over
/// the sequences with context > 0), the row strides of the engine's query and output, and the
/// validated paged cache (BNSD: its views permuted to BSND).
template <class TKV>
struct PaPlan {
  Index batch = 0, tokens = 0, nh = 0, d = 0, nkv = 0, dv = 0, max_q = 0, max_kv = 0;
  /// compressType: kvHeadNum (sequence b is the pair (b / compress, b % compress)); else 0.
  Index compress = 0;
  /// The engine's view: rows (query tokens, or numTokens · kvHeadNum pairs) of heads (headNum, or
  /// headNum / kvHeadNum) each, row strides of query and out.
  Index rows = 0, heads = 0, q_row_stride = 0, o_row_stride = 0;
  std::vector<Index> q_cu;
  PagedKvCache<const TKV> cache;
};

/// compressType and inputLayout BNSD against the other params: what ATB's operation rejects
/// with them (paged_attention_operation.cpp).
template <class TQ, class TKV>
void pa_check_forms(const PagedAttentionParams& params) {
  using P = PagedAttentionParams;
  constexpr const char* fn = "paged_attention";
  constexpr bool kQkv = std::is_same_v<TQ, std::int8_t>;
  constexpr bool kInt8Cache = std::is_same_v<TKV, std::int8_t>;
  const std::string mt = std::to_string(static_cast<int>(params.mask_type));
  const std::string qts = std::to_string(static_cast<int>(params.quant_type));
  const std::string mla = std::to_string(params.mla_v_head_size);
  const bool spec = params.calc_type == P::CalcType::Spec;
  const bool logn = params.scale_type == P::ScaleType::LogN;
  if (params.compress_type != P::CompressType::Undefined) {
    const bool rope = params.compress_type == P::CompressType::KvHeadRope;
    const std::string ct = rope ? "KvHeadRope" : "KvHead";
    const std::string with = "not supported with compress_type " + ct;
    ATTNREF_CHECK(params.num_kv_heads > 0, std::invalid_argument, fn, "params.num_kv_heads",
                  "must be set with compress_type " + ct + " (the pairs are token x kv head)",
                  ">= 1", params.num_kv_heads);
    ATTNREF_CHECK(!spec, std::invalid_argument, fn, "params.calc_type", "Spec " + with, "Undefined",
                  "Spec");
    ATTNREF_CHECK(!kQkv, std::invalid_argument, fn, "params.quant_type",
                  "qkv quantization (int8 query) " + with, "Unquant (0) or DequantFusion (1)", qts);
    ATTNREF_CHECK(!logn, std::invalid_argument, fn, "params.scale_type", "LogN " + with, "Tor",
                  "LogN");
    ATTNREF_CHECK(params.input_layout == P::InputLayout::BSND, std::invalid_argument, fn,
                  "params.input_layout", "BNSD " + with, "BSND", "BNSD");
    ATTNREF_CHECK(params.mla_v_head_size == 0, std::invalid_argument, fn, "params.mla_v_head_size",
                  "MLA " + with, "0", mla);
    if (rope) {
      ATTNREF_CHECK(params.mask_type == P::MaskType::Undefined, std::invalid_argument, fn,
                    "params.mask_type", "a mask is " + with, "Undefined (0)", mt);
      ATTNREF_CHECK(!params.batch_run_status_enable, std::invalid_argument, fn,
                    "params.batch_run_status_enable", with, "false", "true");
    } else {
      ATTNREF_CHECK(params.mask_type != P::MaskType::Spec, std::invalid_argument, fn,
                    "params.mask_type", "Spec " + with, "Undefined, Norm or Alibi", mt);
    }
  }
  if (params.input_layout == P::InputLayout::BNSD) {
    const std::string with = "not supported with input_layout BNSD";
    ATTNREF_CHECK(!spec, std::invalid_argument, fn, "params.calc_type", "Spec " + with, "Undefined",
                  "Spec");
    ATTNREF_CHECK(params.mask_type != P::MaskType::Spec, std::invalid_argument, fn,
                  "params.mask_type", "Spec " + with + " (a parallel form: BSND tiling only)",
                  "Undefined, Norm or Alibi", mt);
    ATTNREF_CHECK(!kInt8Cache && params.quant_type == P::QuantType::Unquant, std::invalid_argument,
                  fn, "params.quant_type",
                  "quantization (int8 caches or quant_type != Unquant) " + with,
                  "Unquant (0) with floating-point caches", qts);
    ATTNREF_CHECK(!logn, std::invalid_argument, fn, "params.scale_type", "LogN " + with, "Tor",
                  "LogN");
    ATTNREF_CHECK(params.mla_v_head_size == 0, std::invalid_argument, fn, "params.mla_v_head_size",
                  "MLA " + with, "0", mla);
  }
}

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
  pa_check_forms<TQ, TKV>(params);

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

/// The query rows of each sequence (pl.q_cu), packed over the sequences with keys: ATB's kernel
/// (paged_attention_tiling_dependency.cpp) gives a sequence with context length 0 no query row
/// and no output row (SPEC: whatever q_seq_lens says). batchRunStatus is read by no kernel, so a
/// sequence it turns off must have context length 0.
template <class TQ, class TKV, class TM>
void pa_pack_rows(const PagedAttentionParams& params, const PagedAttentionInputs<TQ, TKV, TM>& in,
                  PaPlan<TKV>& pl) {
  constexpr const char* fn = "paged_attention";
  const bool spec = params.calc_type == PagedAttentionParams::CalcType::Spec;
  const Index batch = pl.batch;
  auto at = [](const std::string& name, Index b) { return name + "[" + std::to_string(b) + "]"; };
  ATTNREF_CHECK(batch >= 1, std::invalid_argument, fn, "context_lens", "empty", ">= 1 sequence", 0);
  if (spec)
    ATTNREF_CHECK(static_cast<Index>(in.q_seq_lens.size()) == batch, std::invalid_argument, fn,
                  "q_seq_lens", "size mismatch with context_lens for calc_type Spec", batch,
                  in.q_seq_lens.size());
  else
    ATTNREF_CHECK(in.q_seq_lens.empty(), std::invalid_argument, fn, "q_seq_lens",
                  "given without calc_type Spec", "empty",
                  "[" + std::to_string(in.q_seq_lens.size()) + "]");
  if (params.batch_run_status_enable)
    ATTNREF_CHECK(static_cast<Index>(in.batch_run_status.size()) == batch, std::invalid_argument,
                  fn, "batch_run_status", "size mismatch", batch, in.batch_run_status.size());
  std::vector<Index>& q_cu = pl.q_cu;
  q_cu.assign(static_cast<size_t>(batch + 1), 0);
  for (Index b = 0; b < batch; ++b) {
    const Index kl = in.context_lens[static_cast<size_t>(b)];
    ATTNREF_CHECK(kl >= 0, std::invalid_argument, fn, at("context_lens", b), "negative", ">= 0",
                  kl);
    Index ql = kl > 0 ? 1 : 0;
    if (spec) {
      const Index given = in.q_seq_lens[static_cast<size_t>(b)];
      ATTNREF_CHECK(given >= 0 && (kl == 0 || given <= kl), std::invalid_argument, fn,
                    at("q_seq_lens", b), "out of range",
                    "[0, context_lens[" + std::to_string(b) + "] = " + std::to_string(kl) + "]",
                    given);
      ql = kl > 0 ? given : 0;
    }
    if (params.batch_run_status_enable) {
      const auto st = in.batch_run_status[static_cast<size_t>(b)];
      ATTNREF_CHECK(st == 0 || st == 1, std::invalid_argument, fn, at("batch_run_status", b),
                    "not 0 or 1", "0 or 1", st);
      ATTNREF_CHECK(st == 1 || kl == 0, std::invalid_argument, fn, at("batch_run_status", b),
                    "is 0 for a sequence with keys (the NPU kernel ignores batchRunStatus and "
                    "would compute that sequence; set its context length to 0)",
                    at("context_lens", b) + " = 0",
                    at("context_lens", b) + " = " + std::to_string(kl));
    }
    q_cu[static_cast<size_t>(b + 1)] = q_cu[static_cast<size_t>(b)] + ql;
    pl.max_q = std::max(pl.max_q, ql);
  }
  if (pl.compress > 0) {  // rows of pairs without keys are dropped; the trailing rows stay
    ATTNREF_CHECK(batch == pl.rows, std::invalid_argument, fn, "context_lens",
                  "size mismatch: compress_type needs one length per (query token, kv head) pair",
                  "numTokens * kvHeadNum = " + std::to_string(pl.rows), batch);
    return;
  }
  ATTNREF_CHECK(q_cu.back() == pl.tokens, std::invalid_argument, fn, "query.shape[0]",
                spec ? "mismatch with the sum of q_seq_lens over the sequences with "
                       "context_lens > 0 (query rows are packed; a sequence with context length "
                       "0 takes none)"
                     : "mismatch with the number of sequences with context_lens > 0 (one query "
                       "row each, packed; a sequence with context length 0 takes none)",
                q_cu.back(), pl.tokens);
}

/// The stride between the engine's rows of a [numTokens, headNum, ·] view: a token, or with
/// compressType a (token, kv head) pair — the view reshaped to [numTokens · kvHeadNum, G, ·]
/// without a copy, which needs stride(0) = kvHeadNum · G · stride(1) unless one of the merged
/// extents is 1. -1: not reshapeable. (The engine addresses its rows with one stride; a view
/// that fails this is rejected rather than copied.)
template <class T>
Index pa_row_stride(const StridedView<T, 3>& v, Index compress, Index group) {
  if (compress == 0 || compress == 1) return v.stride(0);
  if (v.size(0) <= 1 || v.stride(0) == compress * group * v.stride(1)) return group * v.stride(1);
  return -1;
}

/// The caches against the params (BSND, BNSD or compressed-head), the paged cache they form
/// (BNSD: a zero-copy permutation of the strides) and every used block-table entry
/// (std::out_of_range).
template <class TQ, class TKV, class TM>
void pa_plan_cache(const PagedAttentionParams& params, const PagedAttentionInputs<TQ, TKV, TM>& in,
                   PaPlan<TKV>& pl) {
  constexpr const char* fn = "paged_attention";
  const bool mla = params.mla_v_head_size > 0;
  const bool bnsd = params.input_layout == PagedAttentionParams::InputLayout::BNSD;
  const Index heads = pl.compress > 0 ? 1 : pl.nkv, d = pl.d, dv = pl.dv;
  const std::string hs = std::to_string(heads), ds = std::to_string(d);
  auto permuted =
      [](const StridedView<const TKV, 4>& x) {  // [nb, heads, bs, D] -> [nb, bs, heads, D]
        return StridedView<const TKV, 4>(x.data(), {x.size(0), x.size(2), x.size(1), x.size(3)},
                                         {x.stride(0), x.stride(2), x.stride(1), x.stride(3)});
      };
  StridedView<const TKV, 4> kc = in.key_cache, vc = in.value_cache;
  ATTNREF_CHECK(kc.size(bnsd ? 1 : 2) == heads && kc.size(3) == d, std::invalid_argument, fn,
                "key_cache.shape",
                pl.compress > 0 ? "mismatch (compress_type: one kv head)" : "mismatch",
                bnsd ? "[numBlocks, " + hs + ", blockSize, " + ds + "]"
                     : "[numBlocks, blockSize, " + hs + ", " + ds + "]",
                detail::shape_str(kc));
  if (mla) {
    ATTNREF_CHECK(dv <= d, std::invalid_argument, fn, "params.mla_v_head_size",
                  "larger than headSize (V is the first dims of K)", "<= " + std::to_string(d), dv);
    ATTNREF_CHECK(vc.absent(), std::invalid_argument, fn, "value_cache",
                  "given with mla_v_head_size (V is the first dims of K)", "absent", "a tensor");
    vc = StridedView<const TKV, 4>(kc.data(), {kc.size(0), kc.size(1), heads, dv}, kc.strides());
  } else {
    if (bnsd)
      ATTNREF_CHECK(dv == d, std::invalid_argument, fn, "value_cache.shape[3] (headSizeV)",
                    "must equal headSize with input_layout BNSD", d, dv);
    const std::array<Index, 4> vs = bnsd ? std::array<Index, 4>{kc.size(0), heads, kc.size(2), dv}
                                         : std::array<Index, 4>{kc.size(0), kc.size(1), heads, dv};
    ATTNREF_CHECK(vc.shape() == vs, std::invalid_argument, fn, "value_cache.shape", "mismatch",
                  detail::shape_str<4>(vs), detail::shape_str(vc));
  }
  if (bnsd) kc = permuted(kc), vc = permuted(vc);
  pl.cache = {kc, vc, in.block_tables, in.context_lens};
  pl.cache.validate(fn, {"key_cache", "value_cache", "block_tables", "context_lens",
                         bnsd ? "key_cache.shape[2] (blockSize)" : "key_cache.shape[1] (blockSize)",
                         "blockSize"});
  for (Index l : pl.cache.context_lens) pl.max_kv = std::max(pl.max_kv, l);
}

/// The tensors' shapes and lengths, the output against every input, the query packing and the
/// paged cache.
template <class TQ, class TKV, class TM, class TO>
PaPlan<TKV> pa_plan(const PagedAttentionParams& params, const PagedAttentionInputs<TQ, TKV, TM>& in,
                    const PagedAttentionOutputs<TO>& out) {
  using P = PagedAttentionParams;
  constexpr const char* fn = "paged_attention";
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
  detail::check_view(fn, "razor_offset", in.razor_offset);
  detail::check_view(fn, "out", out.out);
  PaPlan<TKV> pl;
  pl.batch = static_cast<Index>(in.context_lens.size());
  pl.tokens = in.query.size(0);
  pl.nh = in.query.size(1), pl.d = in.query.size(2);
  pl.nkv = params.num_kv_heads > 0 ? params.num_kv_heads : params.num_heads;
  pl.compress = params.compress_type != P::CompressType::Undefined ? pl.nkv : 0;
  // headSizeV: value_cache's (MLA: params.mla_v_head_size, V being the first dims of K).
  pl.dv = mla ? static_cast<Index>(params.mla_v_head_size) : in.value_cache.size(3);
  ATTNREF_CHECK(pl.nh == params.num_heads, std::invalid_argument, fn, "query.shape[1]",
                "mismatch with params.num_heads", params.num_heads, pl.nh);
  const Index group = pl.nh / pl.nkv;
  pl.rows = pl.compress > 0
                ? detail::checked_mul(fn, "query.shape[0] * kvHeadNum", pl.tokens, pl.compress)
                : pl.tokens;
  pl.heads = pl.compress > 0 ? group : pl.nh;
  pa_pack_rows(params, in, pl);
  pa_plan_cache(params, in, pl);
  const std::array<Index, 3> os{pl.tokens, pl.nh, pl.dv};
  ATTNREF_CHECK(out.out.shape() == os, std::invalid_argument, fn, "out.shape", "mismatch",
                detail::shape_str<3>(os), detail::shape_str(out.out));
  pl.q_row_stride = pa_row_stride(in.query, pl.compress, group);
  pl.o_row_stride = pa_row_stride(out.out, pl.compress, group);
  const std::string merged =
      "compress_type reads the view as [numTokens * kvHeadNum, headNum / "
      "kvHeadNum, ·] and the merged axes need one stride";
  ATTNREF_CHECK(pl.q_row_stride >= 0, std::invalid_argument, fn, "query.stride(0)", merged,
                "kvHeadNum * (headNum / kvHeadNum) * stride(1) = " +
                    std::to_string(pl.nh * in.query.stride(1)),
                in.query.stride(0));
  ATTNREF_CHECK(pl.o_row_stride >= 0, std::invalid_argument, fn, "out.stride(0)", merged,
                "kvHeadNum * (headNum / kvHeadNum) * stride(1) = " +
                    std::to_string(pl.nh * out.out.stride(1)),
                out.out.stride(0));
  // The output against every input, under PagedAttention's names.
  detail::check_out_overlaps(fn, "out", out.out, "query", in.query, "key_cache", in.key_cache,
                             "value_cache", in.value_cache, "block_tables", in.block_tables, "mask",
                             in.mask, "spec_mask", in.spec_mask, "alibi_mask", in.alibi_mask,
                             "log_n", in.log_n, "k_descale", in.k_descale, "v_descale",
                             in.v_descale, "k_offset", in.k_offset, "v_offset", in.v_offset,
                             "p_scale", in.p_scale, "razor_offset", in.razor_offset);
  return pl;
}

}  // namespace detail

}  // namespace attnref
