#pragma once
/// attnref::paged_attention — ATB PagedAttentionOperation (decode over a paged KV cache) on the
/// attention engine (docs/semantics.md §3).
///
/// Implemented: calcType UNDEFINED (one query token per sequence) and SPEC (parallel decoding:
/// q_seq_lens[b] query tokens per sequence, the last q_seq_lens[b] positions of its context),
/// GQA, qkScale, qScale (0 or 1: no effect; otherwise q · qScale rounded to the data type),
/// maskType UNDEFINED, NORM (rows [batch or 1, 1, maxSeq], ATB's [1, maxSeq] as [1, 1, maxSeq];
/// or the square [1, maxSeq, maxSeq], ATB's [maxSeq, maxSeq], whose row context - q_len + i
/// serves query i), SPEC ([numTokens, maxSeq], one row per query token) and ALIBI ([batch,
/// headNum, 1, maxSeq] or ATB's [headNum, 1, maxSeq] as [1, headNum, 1, maxSeq]), all additive;
/// scaleType LOGN (one float per sequence), mlaVHeadSize (V = the first mlaVHeadSize elements of
/// each K head; no value cache), batchRunStatus, and the quantized modes:
///   DEQUANT_FUSION (int8 caches): K = (K8 + k_offset[c]) · k_descale[c] per channel
///     c = kvHead · headSize + d (offset with hasQuantOffset), V likewise; then as unquantized.
///     Computed exactly in that algebra with the scale folded into q and the V affine applied
///     to the output (O = (Σ p·V8 / l + v_offset) · v_descale), fp32 throughout.
///   QKV_OFFLINE / QKV_ONLINE (int8 q and caches, fp16 / bf16 out): s = fp32(int32(q8·k8) ·
///     k_descale[h]) · qkScale + mask; blocks of params.quant_block_size keys from key 0 with the
///     running max m: P̂ = exp(s - m); online P8 = rint(fp16(P̂ / (bmax / 127))) with bmax the
///     block's largest P̂ and factor v_descale[h] · bmax / 127; offline P8 = rint(fp16(P̂ ·
///     p_scale[h])) (PagedAttention multiplies; SelfAttention divides) and factor v_descale[h]
///     (which must therefore fold 1 / p_scale, as in the golden); O = Σ factor · (P8·V8), l = Σ P̂
///     (unrounded), out = O / l. No split-KV (the NPU's kv split, a tiling choice, would restart
///     the blocks and the running max per split).
/// Validated and rejected: MASK_FREE and NORM_COMPRESS (Atlas 300I Duo only), compressType
/// (razor attention) and BNSD (not implemented), and ATB's incompatible combinations (SPEC with
/// batchRunStatus or DEQUANT_FUSION or, without MLA, masks other than NORM / SPEC; MLA with
/// ALIBI, DEQUANT_FUSION or, under SPEC, NORM or quantization; qkv quantization with offsets).
///
/// Shapes (BSND):
///   query          [numTokens, headNum, headSize]    numTokens = batch, or Σ q_seq_lens (SPEC)
///   key_cache      [numBlocks, blockSize, kvHeadNum, headSize]
///   value_cache    [numBlocks, blockSize, kvHeadNum, headSizeV]   (absent with MLA)
///   block_tables   [batch, maxBlocksPerSeq] int32: key t of sequence b is row t % blockSize of
///                  block block_tables[b][t / blockSize]; entries past the used blocks never read
///   context_lens   [batch]
///   out            [numTokens, headNum, headSizeV]
///
/// Per query token (sequence b), head h (kv head h / G), key t < context_lens[b], in fp32:
///   s_t = q · k_t · qkScale (· logN[b]) + mask + alibi[b][h][t];  p = softmax(s)
///   out = Σ_t p_t v_t rounded to the output type
/// The scores and P stay fp32 (the golden's fp32 reference; its P cast to the data type before
/// P·V is what the NPU's rounding does, not the definition — docs/semantics.md §1). A sequence with
/// context length 0 or batchRunStatus 0 gets zero output rows. Masks are additive (ATB's
/// -10000 / -inf entries): a row whose keys are all masked is an ordinary softmax over them.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/atb/detail/paged_attention_variant.hpp"
#include "attnref/atb/paged_attention_params.hpp"
#include "attnref/attention/attention.hpp"
#include "attnref/attention/paged_kv.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/quant.hpp"
#include "attnref/core/view.hpp"

namespace attnref {

namespace detail {
template <class TQ>
struct pa_mask {
  using type = TQ;
};
template <>
struct pa_mask<std::int8_t> {
  using type = half;
};
}  // namespace detail

/// The inputs of PagedAttention. TQ: query type (half, bfloat16, float; int8 with qkv
/// quantization); TKV: cache type (TQ, or int8 with dequant fusion); TM: mask type (TQ, or the
/// output type with qkv quantization: half by default).
template <class TQ, class TKV = TQ, class TM = typename detail::pa_mask<TQ>::type>
struct PagedAttentionInputs {
  StridedView<const TQ, 3> query;         ///< [numTokens, headNum, headSize]
  StridedView<const TKV, 4> key_cache;    ///< [numBlocks, blockSize, kvHeadNum, headSize]
  StridedView<const TKV, 4> value_cache;  ///< [numBlocks, blockSize, kvHeadNum, headSizeV]
  StridedView<const std::int32_t, 2> block_tables;  ///< [batch, maxBlocksPerSeq]
  std::vector<Index> context_lens;                  ///< [batch]
  /// calcType SPEC: query tokens of each sequence [batch] (they sum to numTokens; token i of
  /// sequence b is query position context_lens[b] - q_seq_lens[b] + i). Empty: one each.
  std::vector<Index> q_seq_lens{};
  /// NORM: [batch or 1, 1, maxSeq] (one row per sequence; one query token each), or the square
  /// [1, maxSeq, maxSeq] (ATB's [maxSeq, maxSeq]: query i of sequence b reads row
  /// context_lens[b] - q_seq_lens[b] + i).
  StridedView<const TM, 3> mask{};
  StridedView<const TM, 2> spec_mask{};          ///< SPEC: [numTokens, maxSeq], row = query token
  StridedView<const TM, 4> alibi_mask{};         ///< ALIBI: [batch or 1, headNum, 1, maxSeq]
  StridedView<const float, 1> log_n{};           ///< LOGN: [batch]
  std::vector<std::int32_t> batch_run_status{};  ///< batchRunStatus [batch], 0 or 1
  /// quantType DEQUANT_FUSION: per channel [kvHeadNum * headSize(V)]; qkv quantization: per
  /// query head [headNum]. fp32 values (core/quant.hpp converts ATB's int64 bit patterns).
  StridedView<const float, 1> k_descale{};
  StridedView<const float, 1> v_descale{};
  /// DEQUANT_FUSION with hasQuantOffset: per channel, added before scaling.
  StridedView<const std::int32_t, 1> k_offset{};
  StridedView<const std::int32_t, 1> v_offset{};
  StridedView<const float, 1> p_scale{};  ///< QKV_OFFLINE: [headNum], P8 = rint(P * p_scale)
};

template <class TO>
struct PagedAttentionOutputs {
  StridedView<TO, 3> out;  ///< [numTokens, headNum, headSizeV]
};

namespace detail {

template <class T>
inline std::string pa_len(const StridedView<T, 1>& v) {
  return v.absent() ? std::string("none") : "[" + std::to_string(v.size(0)) + "]";
}

template <class T>
inline constexpr bool pa_float_v =
    std::is_same_v<T, half> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float>;

}  // namespace detail

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
  if (mask_t == P::MaskType::Norm) {
    const auto& m = in.mask;
    ATTNREF_CHECK(!m.absent(), std::invalid_argument, "paged_attention", "mask", "missing for Norm",
                  "[batch or 1, 1, maxSeq] or [1, maxSeq, maxSeq]", "none");
    const bool rows = m.size(1) == 1 && (m.size(0) == 1 || m.size(0) == batch);
    const bool square = !rows && m.size(0) == 1 && m.size(1) == m.size(2);
    ATTNREF_CHECK((rows || square) && m.size(2) >= max_kv, std::invalid_argument, "paged_attention",
                  "mask.shape", "mismatch for Norm",
                  "[1 or " + std::to_string(batch) + ", 1, >= " + std::to_string(max_kv) +
                      "] or [1, M, M] with M >= " + std::to_string(max_kv),
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
                  "missing for Alibi", "[batch or 1, headNum, 1, maxSeq]", "none");
    ATTNREF_CHECK((m.size(0) == 1 || m.size(0) == batch) && m.size(1) == nh && m.size(2) == 1 &&
                      m.size(3) >= max_kv,
                  std::invalid_argument, "paged_attention", "alibi_mask.shape",
                  "mismatch for Alibi",
                  "[1 or " + std::to_string(batch) + ", " + std::to_string(nh) +
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

/// A validated PagedAttention call, ready to run: the plan, the engine problem (the packed query
/// tokens against the paged cache), its hooks and its execution config. The hooks point into the
/// plan: a problem is filled in place and never copied.
template <class TQ, class TKV, class TM, class TO>
struct PaProblem {
  PaProblem() = default;
  PaProblem(const PaProblem&) = delete;
  PaProblem& operator=(const PaProblem&) = delete;
  PaPlan<TKV> pl;
  AttentionInputs<TQ, TKV> e;
  AttentionParams ep;
  AttentionOutputs<TO> eo;
  ExecConfig ex;
  PaVariant<TQ, TM> var{};
};

/// The engine problem, validated against the caller's tensors, with the shared query / output
/// hooks (detail/hooks/io.hpp): qScale, and for DequantFusion k_descale folded into q, k_offset
/// into a row constant and V's affine map applied to each output row (rows of sequences without
/// keys: 0).
template <class TQ, class TKV, class TM, class TO>
void pa_engine_problem(const PagedAttentionParams& params,
                       const PagedAttentionInputs<TQ, TKV, TM>& in,
                       const PagedAttentionOutputs<TO>& out, const PaPlan<TKV>& pl,
                       PaProblem<TQ, TKV, TM, TO>& pr) {
  constexpr bool kQkv = std::is_same_v<TQ, std::int8_t>;
  constexpr bool kDequant = !kQkv && std::is_same_v<TKV, std::int8_t>;
  const Index tokens = pl.tokens, nh = pl.nh, d = pl.d, dv = pl.dv;
  auto& e = pr.e;
  e.q = StridedView<const TQ, 4>(in.query.data(), {1, tokens, nh, d},
                                 {0, in.query.stride(0), in.query.stride(1), in.query.stride(2)});
  e.read_kv(pl.cache);
  e.seq.q_cu = pl.q_cu;
  pr.ep.scale = kQkv ? 1.0f : params.qk_scale;
  if (kQkv) pr.ex.kv_tile = params.quant_block_size;  // P is quantized block by block
  pr.eo.o = StridedView<TO, 4>(out.out.data(), {1, tokens, nh, dv},
                               {0, out.out.stride(0), out.out.stride(1), out.out.stride(2)});
  validate(e, pr.ep, pr.eo, pr.ex);  // engine checks, overlaps included

  auto& var = pr.var;
  if (!kQkv && params.q_scale != 0.0f && params.q_scale != 1.0f)
    var.template scale_query<TQ>(params.q_scale);
  if constexpr (kDequant) {
    var.group = nh / pl.nkv;
    var.bias_scale = params.qk_scale;
    var.zero_empty = true;
    for (Index c = 0; c < in.k_descale.size(0); ++c) var.k_scale.push_back(in.k_descale(c));
    for (Index c = 0; c < in.v_descale.size(0); ++c) var.v_scale.push_back(in.v_descale(c));
    if (params.has_quant_offset) {
      for (Index c = 0; c < in.k_offset.size(0); ++c) var.k_offset.push_back(in.k_offset(c));
      for (Index c = 0; c < in.v_offset.size(0); ++c)
        var.v_offset.push_back(static_cast<float>(in.v_offset(c)));
    }
  }
}

/// Validate and plan into `pr`: every check of paged_attention (params, tensors, execution
/// config), nothing written; pa_run runs it.
template <class TQ, class TKV, class TM, class TO>
void pa_prepare(const PagedAttentionParams& params, const PagedAttentionInputs<TQ, TKV, TM>& in,
                const PagedAttentionOutputs<TO>& out, const ExecConfig& exec,
                PaProblem<TQ, TKV, TM, TO>& pr) {
  constexpr bool kQkv = std::is_same_v<TQ, std::int8_t>;
  constexpr bool kDequant = !kQkv && std::is_same_v<TKV, std::int8_t>;
  static_assert(kQkv ? std::is_same_v<TKV, std::int8_t> &&
                           (std::is_same_v<TO, half> || std::is_same_v<TO, bfloat16>)&&(
                               std::is_same_v<TM, half> || std::is_same_v<TM, bfloat16>)
                     : pa_float_v<TQ> && std::is_same_v<TM, TQ> && std::is_same_v<TO, TQ> &&
                           (kDequant || std::is_same_v<TKV, TQ>),
                "paged_attention types: TQ = TKV = TM = TO (half, bfloat16, float); int8 caches "
                "(dequant fusion); or int8 q and caches with half / bfloat16 out and mask");
  check_exec("paged_attention", exec);
  pa_check_modes<TQ, TKV, TO>(params);
  pr.pl = pa_plan(params, in, out);
  pr.ex = exec;
  pa_bind_masks(params, in, pr.pl, pr.var);
  pa_bind_scales(params, in, pr.pl, pr.var);
  pa_engine_problem(params, in, out, pr.pl, pr);
}

template <class TQ, class TKV, class TM, class TO>
void pa_run(const PaProblem<TQ, TKV, TM, TO>& pr) {
  attention_with(pr.var, pr.e, pr.ep, pr.eo, pr.ex);
}

}  // namespace detail

/// Every check of paged_attention() (params, tensors, execution config), without computing or
/// writing anything.
template <class TQ, class TKV, class TM, class TO>
void validate(const PagedAttentionParams& params, const PagedAttentionInputs<TQ, TKV, TM>& in,
              const PagedAttentionOutputs<TO>& out, const ExecConfig& exec = {}) {
  detail::PaProblem<TQ, TKV, TM, TO> pr;
  detail::pa_prepare(params, in, out, exec, pr);
}

/// ATB PagedAttention. Three type families (checked against params.quant_type):
///   unquantized       TQ = TKV = TM = TO: half, bfloat16 or float
///   DEQUANT_FUSION    TQ = TM = TO: half, bfloat16 or float; TKV = int8
///   QKV_OFFLINE/ONLINE TQ = TKV = int8; TO = half or bfloat16 (params.out_data_type); TM: half
///                     or bfloat16
/// validate -> plan -> run: every check runs before `out` is written (validate() runs them
/// alone); results never depend on exec.threads.
template <class TQ, class TKV, class TM, class TO>
void paged_attention(const PagedAttentionParams& params,
                     const PagedAttentionInputs<TQ, TKV, TM>& in,
                     const PagedAttentionOutputs<TO>& out, const ExecConfig& exec = {}) {
  detail::PaProblem<TQ, TKV, TM, TO> pr;
  detail::pa_prepare(params, in, out, exec, pr);
  detail::pa_run(pr);
}

}  // namespace attnref
