#pragma once
/// attnref::self_attention — ATB SelfAttentionOperation on the attention engine.
///
/// Implemented so far: calcType PA_ENCODER (packed tokens, no cache) with maskType UNDEFINED,
/// NORM and CAUSAL_MASK, qScale, qkScale, logN (scaleType LOGN), clamp, GQA, kernelType DEFAULT
/// (fp16 score path) and HIGH_PRECISION. Every other calcType / mask / feature is validated
/// (attnref::validate(SelfAttentionParams)) and then rejected as not implemented yet.
///
/// Shapes (PA_ENCODER, BSND):
///   query  [nTokens, headNum, headSize]      tokens of all sequences packed by seq_len
///   key    [nTokens, kvHeadNum, headSize]
///   value  [nTokens, kvHeadNum, headSizeV]
///   mask   NORM: [maxSeq, maxSeq] (as [1, maxSeq, maxSeq]) or [batch, maxSeq, maxSeq]
///   log_n  LOGN: [maxSeqLen] float, row i of each sequence is scaled by log_n[i]
///   out    [nTokens, headNum, headSizeV]
///
/// Per sequence b, head h, query i, key j (semantics.md §2.2–2.3):
///   s = (q_i · qScale) · k_j  (fp32 accumulation)
///   s = s · logN[i] (LOGN) · qkScale
///   s = fp16(clamp(s, clampMin, clampMax))      (clampType MIN_MAX)
///   s = s + mask term                            (NORM: binary mask × −3e38 with HIGH_PRECISION
///                                                 or bf16, additive fp16 values with DEFAULT;
///                                                 CAUSAL_MASK: j > i gets −3e38)
///   out = softmax_j(s) · V                       (fp32), rounded to the data type
/// DEFAULT with fp16 data rounds s to fp16 after the product, after qkScale and after the mask
/// addition, as the NPU's fp16 kernel does, so an fp16 overflow gives inf / NaN exactly where the
/// NPU does; HIGH_PRECISION (and bf16, always) keeps fp32. A fully masked row follows the −3e38
/// arithmetic: a uniform average of its values, as on the NPU.

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/atb/self_attention_params.hpp"
#include "attnref/attention/attention.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/view.hpp"

namespace attnref {

template <class T>
struct SelfAttentionInputs {
  StridedView<const T, 3> query;
  StridedView<const T, 3> key;
  StridedView<const T, 3> value;
  std::vector<Index> seq_len;           ///< seqLen [batch]
  StridedView<const T, 3> mask{};       ///< NORM mask (see above)
  StridedView<const float, 1> log_n{};  ///< logN (scaleType LOGN)
};

template <class T>
struct SelfAttentionOutputs {
  StridedView<T, 3> out;  ///< [nTokens, headNum, headSizeV]
};

namespace detail {

/// The engine hooks of ATB SelfAttention: scaling, clamp, mask encodings and the fp16 score path.
template <class T>
struct AtbSelfAttentionVariant {
  using P = SelfAttentionParams;
  const SelfAttentionParams* p;
  bool fp16_scores;                   // DEFAULT kernel with fp16 data
  float mask_coeff;                   // -3e38 (binary masks) or 1 (additive fp16 masks)
  StridedView<const T, 3> mask;       // NORM mask, absent otherwise
  StridedView<const float, 1> log_n;  // LOGN, absent otherwise

  static constexpr float kMaskValue = -3e38f;

  bool has_transform() const { return true; }
  KvRange kv_range(const SeqInfo& s, Index, Index) const { return {0, s.kv_len}; }
  TileMask classify(const SeqInfo&, Index, Index, Index, Index) const { return TileMask::None; }
  bool masked(const SeqInfo&, const Coord&) const { return false; }

  static float fp16(float x) { return static_cast<float>(half(x)); }

  template <class Acc>
  Acc transform(const SeqInfo&, const Coord& c, Acc raw) const {
    // raw = (q · qScale) · k, accumulated in float (the engine's scale is 1).
    float s = static_cast<float>(raw);
    if (fp16_scores) {
      s = fp16(s);
      s = fp16(s * fp16(p->qk_scale));
    } else {
      if (!log_n.absent()) s *= log_n(c.q);
      s *= p->qk_scale;
    }
    if (p->clamp_type == P::ClampType::MinMax)
      s = fp16(std::min(std::max(s, p->clamp_min), p->clamp_max));
    float m = 0.0f;
    if (p->mask_type == P::MaskType::Norm) {
      const Index b = mask.size(0) == 1 ? 0 : c.batch;
      m = static_cast<float>(mask(b, c.q, c.kv)) * mask_coeff;
    } else if (p->mask_type == P::MaskType::CausalMask) {
      m = c.kv > c.q ? kMaskValue : 0.0f;
    }
    if (fp16_scores) return static_cast<Acc>(fp16(s + fp16(m)));
    return static_cast<Acc>(s + m);
  }
};

}  // namespace detail

/// ATB SelfAttention. Validates the params (co-existence table and constraints) and every input
/// before writing anything. T: half or bfloat16 (the NPU's data types) or float.
template <class T>
void self_attention(const SelfAttentionParams& params, const SelfAttentionInputs<T>& in,
                    const SelfAttentionOutputs<T>& out) {
  using P = SelfAttentionParams;
  static_assert(std::is_same_v<T, half> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float>,
                "self_attention data: half, bfloat16 or float");
  constexpr const char* fn = "self_attention";
  validate(params);
  auto not_yet = [&](bool ok, const char* field, const std::string& got) {
    ATTNREF_CHECK(ok, std::invalid_argument, fn, field, "not implemented yet",
                  "what this version implements", got);
  };
  not_yet(params.calc_type == P::CalcType::PaEncoder, "params.calc_type",
          std::to_string(static_cast<int>(params.calc_type)) + " (only PaEncoder so far)");
  not_yet(params.mask_type == P::MaskType::Undefined || params.mask_type == P::MaskType::Norm ||
              params.mask_type == P::MaskType::CausalMask,
          "params.mask_type",
          std::to_string(static_cast<int>(params.mask_type)) +
              " (only Undefined, Norm and CausalMask so far)");
  not_yet(params.is_triu_mask == 0, "params.is_triu_mask", "1");
  not_yet(params.quant_type == P::QuantType::Unquant, "params.quant_type", "quantized");
  not_yet(params.mla_v_head_size == 0, "params.mla_v_head_size", "> 0");

  const Index tokens = in.query.size(0);
  const Index nh = in.query.size(1), d = in.query.size(2);
  const Index nkv = in.key.size(1), dv = in.value.size(2);
  ATTNREF_CHECK(nh == params.num_heads, std::invalid_argument, fn, "query.shape[1]",
                "mismatch with params.num_heads", params.num_heads, nh);
  ATTNREF_CHECK(in.key.size(2) == d, std::invalid_argument, fn, "key.shape[2] (head_size)",
                "mismatch with query", d, in.key.size(2));
  ATTNREF_CHECK(in.value.size(1) == nkv, std::invalid_argument, fn, "value.shape[1]",
                "mismatch with key", nkv, in.value.size(1));
  const Index want_kv = params.num_kv_heads > 0 ? params.num_kv_heads : params.num_heads;
  ATTNREF_CHECK(nkv == want_kv, std::invalid_argument, fn, "key.shape[1]",
                "mismatch with params.num_kv_heads", want_kv, nkv);
  ATTNREF_CHECK(in.key.size(0) == tokens && in.value.size(0) == tokens, std::invalid_argument, fn,
                "key/value.shape[0]", "mismatch with query (PaEncoder: q_len == kv_len)", tokens,
                in.key.size(0));
  const Index batch = static_cast<Index>(in.seq_len.size());
  ATTNREF_CHECK(batch >= 1, std::invalid_argument, fn, "seq_len", "empty", ">= 1 sequence", 0);
  std::vector<Index> cu(1, 0);
  Index max_seq = 0;
  for (Index b = 0; b < batch; ++b) {
    const Index l = in.seq_len[static_cast<size_t>(b)];
    ATTNREF_CHECK(l >= 0, std::invalid_argument, fn, "seq_len[" + std::to_string(b) + "]",
                  "negative", ">= 0", l);
    cu.push_back(cu.back() + l);
    max_seq = std::max(max_seq, l);
  }
  ATTNREF_CHECK(cu.back() == tokens, std::invalid_argument, fn, "seq_len",
                "sum mismatch with query.shape[0]", tokens, cu.back());
  const bool fp16_scores = std::is_same_v<T, half> && params.kernel_type == P::KernelType::Default;
  if (params.mask_type == P::MaskType::Norm) {
    ATTNREF_CHECK(!in.mask.absent(), std::invalid_argument, fn, "mask", "missing for NORM",
                  "a [maxSeq, maxSeq] or [batch, maxSeq, maxSeq] mask", "none");
    ATTNREF_CHECK(in.mask.size(0) == 1 || in.mask.size(0) == batch, std::invalid_argument, fn,
                  "mask.shape[0]", "mismatch", "1 or " + std::to_string(batch), in.mask.size(0));
    ATTNREF_CHECK(in.mask.size(1) >= max_seq && in.mask.size(2) >= max_seq, std::invalid_argument,
                  fn, "mask.shape[1:]", "smaller than the longest sequence",
                  ">= " + std::to_string(max_seq), std::min(in.mask.size(1), in.mask.size(2)));
  }
  if (params.scale_type == P::ScaleType::LogN) {
    ATTNREF_CHECK(!in.log_n.absent(), std::invalid_argument, fn, "log_n", "missing for LOGN",
                  "a [maxSeqLen] float tensor", "none");
    ATTNREF_CHECK(in.log_n.size(0) >= max_seq, std::invalid_argument, fn, "log_n.shape[0]",
                  "smaller than the longest sequence", ">= " + std::to_string(max_seq),
                  in.log_n.size(0));
  }
  const std::array<Index, 3> out_shape{tokens, nh, dv};
  ATTNREF_CHECK(out.out.shape() == out_shape, std::invalid_argument, fn, "out.shape", "mismatch",
                detail::shape_str<3>(out_shape), detail::shape_str(out.out));

  // Map onto the engine: packed (TND) views with a unit batch dimension.
  auto tnd = [](auto v) {
    using E = typename decltype(v)::element_type;
    return StridedView<E, 4>(v.data(), {1, v.size(0), v.size(1), v.size(2)},
                             {0, v.stride(0), v.stride(1), v.stride(2)});
  };
  // qScale multiplies q in the data type before the product (ATB golden); the engine's scale
  // would multiply in float, so a scaled copy of q (never of K/V) is made when qScale != 1.
  std::vector<T> q_scaled;
  StridedView<const T, 3> q = in.query;
  if (params.q_scale != 1.0f) {
    q_scaled.resize(static_cast<size_t>(tokens * nh * d));
    for (Index t = 0; t < tokens; ++t)
      for (Index h = 0; h < nh; ++h)
        for (Index e = 0; e < d; ++e)
          q_scaled[static_cast<size_t>((t * nh + h) * d + e)] =
              T(static_cast<float>(in.query(t, h, e)) * params.q_scale);
    q = StridedView<const T, 3>(q_scaled.data(), {tokens, nh, d});
  }
  AttentionInputs<T> ein{tnd(q), tnd(in.key), tnd(in.value)};
  ein.seq.q_cu = cu;
  ein.seq.kv_cu = cu;
  AttentionOutputs<T> eout{tnd(out.out)};
  AttentionParams ep;
  ep.scale = 1.0;
  detail::AtbSelfAttentionVariant<T> var{
      &params, fp16_scores,
      std::is_same_v<T, half> && params.kernel_type == P::KernelType::Default
          ? 1.0f
          : detail::AtbSelfAttentionVariant<T>::kMaskValue,
      params.mask_type == P::MaskType::Norm ? in.mask : StridedView<const T, 3>{},
      params.scale_type == P::ScaleType::LogN ? in.log_n : StridedView<const float, 1>{}};
  attention_with(var, ein, ep, eout);
}

}  // namespace attnref
