#pragma once
/// attnref::self_attention — ATB SelfAttentionOperation on the attention engine.
///
/// Implemented so far: calcType PA_ENCODER (packed tokens, no cache) and ENCODER / DECODER /
/// UNDEFINED (KV caches, written then read; kv-bypass; batchRunStatus) with maskType UNDEFINED,
/// NORM and CAUSAL_MASK, qScale, qkScale, logN (scaleType LOGN), clamp, GQA, kernelType DEFAULT
/// (fp16 score path) and HIGH_PRECISION. Every other calcType / mask / feature is validated
/// (attnref::validate(SelfAttentionParams)) and then rejected as not implemented yet.
///
/// Shapes (BSND):
///   query        [nTokens, headNum, headSize]   tokens of all sequences packed by seq_len
///   key, value   [nTokens, kvHeadNum, headSize(V)] the new tokens (absent with kv-bypass)
///   key_cache,   [layerNum, batch, maxSeqLen, kvHeadNum * headSize(V)] (ENCODER / DECODER /
///   value_cache   UNDEFINED): the new tokens of sequence b go to rows
///                 token_offset[b] - seq_len[b] + j of layer layer_id, then attention runs over
///                 rows [0, token_offset[b]); with kv-bypass nothing is written
///   mask         NORM: [maxSeq, maxSeq] (as [1, maxSeq, maxSeq]), [batch, maxSeq, maxSeq], or
///                decoder [batch, 1, maxSeq]; sliced top-left (rows = query positions, columns =
///                key positions of the sequence)
///   log_n        LOGN: float, [maxSeqLen] per query position (PA_ENCODER) or [batch] (DECODER)
///   out          [nTokens, headNum, headSizeV]
/// batchRunStatus (batch_run_status_enable): a sequence with status 0 gets zero output rows and
/// no cache write (semantics.md §2.7, the choice of §10 item 4).
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
  StridedView<const T, 3> key{};  ///< new tokens (absent with kv-bypass)
  StridedView<const T, 3> value{};
  std::vector<Index> seq_len;                    ///< seqLen [batch]
  StridedView<const T, 3> mask{};                ///< NORM mask (see above)
  StridedView<const float, 1> log_n{};           ///< logN (scaleType LOGN)
  std::vector<Index> token_offset{};             ///< tokenOffset [batch] (cache calcTypes)
  Index layer_id = 0;                            ///< layerId (cache calcTypes)
  std::vector<std::int32_t> batch_run_status{};  ///< batchRunStatus [batch], 0 or 1
};

template <class T>
struct SelfAttentionOutputs {
  StridedView<T, 3> out;          ///< [nTokens, headNum, headSizeV]
  StridedView<T, 4> key_cache{};  ///< read and (unless kv-bypass) written
  StridedView<T, 4> value_cache{};
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
  bool log_n_per_batch;               // DECODER: one logN value per sequence
  bool transform_needed;              // false: plain scaled scores (qk_scale is the engine's scale)
  CausalHook causal;                  // CAUSAL_MASK: top-left, key j hidden from query i iff j > i

  static constexpr float kMaskValue = -3e38f;

  // CAUSAL_MASK goes through the engine's mask predicate: its hidden keys get probability
  // exactly 0 either way (−3e38 absorbs any fp32 score, and fp16 overflows to −inf, while every
  // row keeps key 0), so the tiles above the diagonal are skipped instead of computed.
  bool has_transform() const { return transform_needed; }
  KvRange kv_range(const SeqInfo& s, Index q0, Index q1) const {
    return causal.kv_range(s, q0, q1);
  }
  TileMask classify(const SeqInfo& s, Index q0, Index q1, Index k0, Index k1) const {
    return causal.classify(s, q0, q1, k0, k1);
  }
  bool masked(const SeqInfo& s, const Coord& c) const { return causal.masked(s, c.q, c.kv); }

  static float fp16(float x) { return static_cast<float>(half(x)); }

  template <class Acc>
  Acc transform(const SeqInfo&, const Coord& c, Acc raw) const {
    // raw = (q · qScale) · k, accumulated in float (the engine's scale is 1).
    float s = static_cast<float>(raw);
    if (fp16_scores) {
      s = fp16(s);
      s = fp16(s * fp16(p->qk_scale));
    } else {
      if (!log_n.absent()) s *= log_n(log_n_per_batch ? c.batch : c.q);
      s *= p->qk_scale;
    }
    if (p->clamp_type == P::ClampType::MinMax)
      s = fp16(std::min(std::max(s, p->clamp_min), p->clamp_max));
    float m = 0.0f;  // CAUSAL_MASK: only visible keys reach the transform
    if (p->mask_type == P::MaskType::Norm) {
      const Index b = mask.size(0) == 1 ? 0 : c.batch;
      m = static_cast<float>(mask(b, c.q, c.kv)) * mask_coeff;
    }
    if (fp16_scores) return static_cast<Acc>(fp16(s + fp16(m)));
    return static_cast<Acc>(s + m);
  }
};

/// [layer, batch, maxSeq, heads * d] cache -> engine view [batch, maxSeq, heads, d] of one layer.
template <class E>
StridedView<E, 4> cache_layer(const StridedView<E, 4>& c, Index layer, Index heads, Index d) {
  return StridedView<E, 4>(c.data() + layer * c.stride(0), {c.size(1), c.size(2), heads, d},
                           {c.stride(1), c.stride(2), d * c.stride(3), c.stride(3)});
}

/// [n, a, b] -> engine view [1, n, a, b] (packed tokens).
template <class E>
StridedView<E, 4> packed(const StridedView<E, 3>& v) {
  return StridedView<E, 4>(v.data(), {1, v.size(0), v.size(1), v.size(2)},
                           {0, v.stride(0), v.stride(1), v.stride(2)});
}

}  // namespace detail

/// ATB SelfAttention. Validates the params (co-existence table and constraints) and every input
/// before writing anything (caches included). T: half or bfloat16 (the NPU's data types) or float.
/// num_threads: worker threads of the engine (0 = OpenMP's default); results never depend on it.
template <class T>
void self_attention(const SelfAttentionParams& params, const SelfAttentionInputs<T>& in,
                    const SelfAttentionOutputs<T>& out, int num_threads = 0) {
  using P = SelfAttentionParams;
  static_assert(std::is_same_v<T, half> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float>,
                "self_attention data: half, bfloat16 or float");
  constexpr const char* fn = "self_attention";
  validate(params);
  auto not_yet = [&](bool ok, const char* field, const std::string& got) {
    ATTNREF_CHECK(ok, std::invalid_argument, fn, field, "not implemented yet",
                  "what this version implements", got);
  };
  const bool pa = params.calc_type == P::CalcType::PaEncoder;
  const bool decoder = params.calc_type == P::CalcType::Decoder;
  const bool bypass = params.kvcache_cfg == P::KvCacheCfg::KBypassVBypass;
  not_yet(params.calc_type != P::CalcType::PrefixEncoder, "params.calc_type", "PrefixEncoder");
  not_yet(params.mask_type == P::MaskType::Undefined || params.mask_type == P::MaskType::Norm ||
              params.mask_type == P::MaskType::CausalMask,
          "params.mask_type",
          std::to_string(static_cast<int>(params.mask_type)) +
              " (only Undefined, Norm and CausalMask so far)");
  not_yet(params.is_triu_mask == 0, "params.is_triu_mask", "1");
  not_yet(params.quant_type == P::QuantType::Unquant, "params.quant_type", "quantized");
  not_yet(params.mla_v_head_size == 0, "params.mla_v_head_size", "> 0");
  not_yet(params.input_layout == P::InputLayout::BSND, "params.input_layout", "BNSD");

  // Sizes.
  const Index tokens = in.query.size(0);
  const Index nh = in.query.size(1), d = in.query.size(2);
  const Index nkv = params.num_kv_heads > 0 ? params.num_kv_heads : params.num_heads;
  const Index dv = out.out.size(2);
  ATTNREF_CHECK(nh == params.num_heads, std::invalid_argument, fn, "query.shape[1]",
                "mismatch with params.num_heads", params.num_heads, nh);
  const Index batch = static_cast<Index>(in.seq_len.size());
  ATTNREF_CHECK(batch >= 1, std::invalid_argument, fn, "seq_len", "empty", ">= 1 sequence", 0);
  std::vector<Index> cu(1, 0);
  Index max_q = 0;
  for (Index b = 0; b < batch; ++b) {
    const Index l = in.seq_len[static_cast<size_t>(b)];
    ATTNREF_CHECK(l >= 0, std::invalid_argument, fn, "seq_len[" + std::to_string(b) + "]",
                  "negative", ">= 0", l);
    if (decoder)
      ATTNREF_CHECK(l == 1, std::invalid_argument, fn, "seq_len[" + std::to_string(b) + "]",
                    "not 1 for Decoder", 1, l);
    cu.push_back(cu.back() + l);
    max_q = std::max(max_q, l);
  }
  ATTNREF_CHECK(cu.back() == tokens, std::invalid_argument, fn, "seq_len",
                "sum mismatch with query.shape[0]", tokens, cu.back());
  std::vector<bool> active(static_cast<size_t>(batch), true);
  if (params.batch_run_status_enable) {
    ATTNREF_CHECK(static_cast<Index>(in.batch_run_status.size()) == batch, std::invalid_argument,
                  fn, "batch_run_status", "size mismatch", batch, in.batch_run_status.size());
    for (Index b = 0; b < batch; ++b) {
      const auto st = in.batch_run_status[static_cast<size_t>(b)];
      ATTNREF_CHECK(st == 0 || st == 1, std::invalid_argument, fn,
                    "batch_run_status[" + std::to_string(b) + "]", "not 0 or 1", "0 or 1", st);
      active[static_cast<size_t>(b)] = st == 1;
    }
  }
  const bool new_tokens = pa || !bypass;
  if (new_tokens) {
    const std::array<Index, 3> ks{tokens, nkv, d};
    ATTNREF_CHECK(in.key.shape() == ks, std::invalid_argument, fn, "key.shape", "mismatch",
                  detail::shape_str<3>(ks), detail::shape_str(in.key));
    const std::array<Index, 3> vs{tokens, nkv, dv};
    ATTNREF_CHECK(in.value.shape() == vs, std::invalid_argument, fn, "value.shape", "mismatch",
                  detail::shape_str<3>(vs), detail::shape_str(in.value));
    detail::check_data(fn, "key", in.key);
    detail::check_data(fn, "value", in.value);
  }
  std::vector<Index> kv_len(static_cast<size_t>(batch));
  if (!pa) {
    const auto& kc = out.key_cache;
    const auto& vc = out.value_cache;
    ATTNREF_CHECK(!kc.absent() && !vc.absent(), std::invalid_argument, fn, "key_cache/value_cache",
                  "missing", "[layerNum, batch, maxSeqLen, hidden]", "none");
    ATTNREF_CHECK(
        kc.size(1) == batch && kc.size(3) == nkv * d, std::invalid_argument, fn, "key_cache.shape",
        "mismatch",
        "[layerNum, " + std::to_string(batch) + ", maxSeqLen, " + std::to_string(nkv * d) + "]",
        detail::shape_str(kc));
    ATTNREF_CHECK(vc.size(0) == kc.size(0) && vc.size(1) == batch && vc.size(2) == kc.size(2) &&
                      vc.size(3) == nkv * dv,
                  std::invalid_argument, fn, "value_cache.shape", "mismatch",
                  "[" + std::to_string(kc.size(0)) + ", " + std::to_string(batch) + ", " +
                      std::to_string(kc.size(2)) + ", " + std::to_string(nkv * dv) + "]",
                  detail::shape_str(vc));
    ATTNREF_CHECK(in.layer_id >= 0 && in.layer_id < kc.size(0), std::out_of_range, fn, "layer_id",
                  "out of range", "[0, " + std::to_string(kc.size(0)) + ")", in.layer_id);
    ATTNREF_CHECK(static_cast<Index>(in.token_offset.size()) == batch, std::invalid_argument, fn,
                  "token_offset", "size mismatch", batch, in.token_offset.size());
    for (Index b = 0; b < batch; ++b) {
      const Index off = in.token_offset[static_cast<size_t>(b)];
      const std::string arg = "token_offset[" + std::to_string(b) + "]";
      ATTNREF_CHECK(off >= in.seq_len[static_cast<size_t>(b)], std::invalid_argument, fn, arg,
                    "smaller than seq_len",
                    ">= " + std::to_string(in.seq_len[static_cast<size_t>(b)]), off);
      ATTNREF_CHECK(off <= kc.size(2), std::invalid_argument, fn, arg, "exceeds maxSeqLen",
                    "<= " + std::to_string(kc.size(2)), off);
      kv_len[static_cast<size_t>(b)] = active[static_cast<size_t>(b)] ? off : 0;
    }
  } else {
    for (Index b = 0; b < batch; ++b)
      kv_len[static_cast<size_t>(b)] =
          active[static_cast<size_t>(b)] ? in.seq_len[static_cast<size_t>(b)] : 0;
  }
  Index max_kv = 0;
  for (Index l : kv_len) max_kv = std::max(max_kv, l);
  if (params.mask_type == P::MaskType::Norm) {
    ATTNREF_CHECK(!in.mask.absent(), std::invalid_argument, fn, "mask", "missing for NORM",
                  "a [maxSeq, maxSeq], [batch, maxSeq, maxSeq] or [batch, 1, maxSeq] mask", "none");
    ATTNREF_CHECK(in.mask.size(0) == 1 || in.mask.size(0) == batch, std::invalid_argument, fn,
                  "mask.shape[0]", "mismatch", "1 or " + std::to_string(batch), in.mask.size(0));
    ATTNREF_CHECK(in.mask.size(1) >= max_q, std::invalid_argument, fn, "mask.shape[1]",
                  "smaller than the longest query sequence", ">= " + std::to_string(max_q),
                  in.mask.size(1));
    ATTNREF_CHECK(in.mask.size(2) >= max_kv, std::invalid_argument, fn, "mask.shape[2]",
                  "smaller than the longest key sequence", ">= " + std::to_string(max_kv),
                  in.mask.size(2));
  }
  if (params.scale_type == P::ScaleType::LogN) {
    ATTNREF_CHECK(!in.log_n.absent(), std::invalid_argument, fn, "log_n", "missing for LOGN",
                  decoder ? "a [batch] float tensor" : "a [maxSeqLen] float tensor", "none");
    const Index need = decoder ? batch : max_q;
    ATTNREF_CHECK(in.log_n.size(0) >= need, std::invalid_argument, fn, "log_n.shape[0]",
                  decoder ? "smaller than the batch" : "smaller than the longest sequence",
                  ">= " + std::to_string(need), in.log_n.size(0));
  }
  const std::array<Index, 3> out_shape{tokens, nh, dv};
  ATTNREF_CHECK(out.out.shape() == out_shape, std::invalid_argument, fn, "out.shape", "mismatch",
                detail::shape_str<3>(out_shape), detail::shape_str(out.out));

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

  // Map onto the engine: packed queries; K/V are the new tokens (PA_ENCODER) or one cache layer.
  AttentionInputs<T> ein{detail::packed(q), {}, {}};
  ein.seq.q_cu = cu;
  if (pa) {
    ein.k = detail::packed(in.key);
    ein.v = detail::packed(in.value);
    ein.seq.kv_cu = cu;
    // Inactive sequences (batchRunStatus is rejected with PA_ENCODER by the table) do not occur.
  } else {
    ein.k = detail::cache_layer(StridedView<const T, 4>(out.key_cache), in.layer_id, nkv, d);
    ein.v = detail::cache_layer(StridedView<const T, 4>(out.value_cache), in.layer_id, nkv, dv);
    ein.seq.kv = kv_len;
  }
  AttentionOutputs<T> eout{detail::packed(out.out)};
  const bool fp16_scores = std::is_same_v<T, half> && params.kernel_type == P::KernelType::Default;
  const bool transform_needed = fp16_scores || params.scale_type == P::ScaleType::LogN ||
                                params.clamp_type == P::ClampType::MinMax ||
                                params.mask_type == P::MaskType::Norm;
  AttentionParams ep;
  // Without a transform the scores are q·k·qkScale in fp32: the engine applies qkScale itself
  // (folded into its q tile, a rounding-level difference from scaling the product).
  ep.scale = transform_needed ? 1.0 : static_cast<double>(params.qk_scale);
  ep.num_threads = num_threads;
  validate(ein, ep, eout);  // engine checks (overlaps included) before the caches are written
  if (!pa)
    for (auto* c : {&out.key_cache, &out.value_cache})
      ATTNREF_CHECK(!detail::overlaps(out.out, *c), std::invalid_argument, fn, "out",
                    "overlaps a cache", "memory disjoint from the caches", "overlapping memory");

  // Cache write: rows token_offset - seq_len + j of the layer, active sequences only.
  if (!pa && !bypass) {
    for (Index b = 0; b < batch; ++b) {
      if (!active[static_cast<size_t>(b)]) continue;
      const Index first =
          in.token_offset[static_cast<size_t>(b)] - in.seq_len[static_cast<size_t>(b)];
      for (Index j = 0; j < in.seq_len[static_cast<size_t>(b)]; ++j) {
        const Index t = cu[static_cast<size_t>(b)] + j;
        for (Index h = 0; h < nkv; ++h) {
          for (Index e = 0; e < d; ++e)
            out.key_cache(in.layer_id, b, first + j, h * d + e) = in.key(t, h, e);
          for (Index e = 0; e < dv; ++e)
            out.value_cache(in.layer_id, b, first + j, h * dv + e) = in.value(t, h, e);
        }
      }
    }
  }

  detail::AtbSelfAttentionVariant<T> var{
      &params,
      fp16_scores,
      fp16_scores ? 1.0f : detail::AtbSelfAttentionVariant<T>::kMaskValue,
      params.mask_type == P::MaskType::Norm ? in.mask : StridedView<const T, 3>{},
      params.scale_type == P::ScaleType::LogN ? in.log_n : StridedView<const float, 1>{},
      decoder,
      transform_needed,
      CausalHook{params.mask_type == P::MaskType::CausalMask ? CausalMode::TopLeft
                                                             : CausalMode::None}};
  attention_with(var, ein, ep, eout);
}

}  // namespace attnref
