#pragma once
/// The int8 toolkit of ATB SelfAttention's Q/K/V path (quantType QKV_OFFLINE = 2 and QKV_ONLINE =
/// 3, docs/semantics.md §2.8): quantize_qkv and choose_scales. Its probability stage, the
/// engine's quantize_p hook, is detail::PQuantStep's SelfAttention form (detail/hooks/quant_p.hpp):
///
/// Per kv block of `block` keys (128 by default; the engine's kv tile, counted from key 0), for
/// query row i of head h, with m the running row maximum after the block:
///   P̂   = fp16(exp(s - m))                      the block's probabilities, rounded to fp16
///   l   = l · exp(m_old - m) + Σ P̂              (fp32)
///   online:  amax = max(amax, max P̂) over the blocks so far, r = amax / 127,
///            P8 = clamp(rint(P̂ / r), -128, 127), factor = vpvDescale[h] · r
///   offline: P8 = clamp(rint(P̂ / pScale[h]), -128, 127), factor = vpvDescale[h] · pScale[h]
///   O   = O · exp(m_old - m) + factor · (P8 · V8)     (P8 · V8 exact, as in int32)
/// and at the end O / l. rint rounds half to even. The vendor's golden does not clamp the
/// offline P8; it fits int8 whenever pScale >= 1/127 (P̂ <= 1), and attnref saturates it below
/// that, as int8 storage of P must. The golden keeps l and O in fp16; attnref keeps them in fp32
/// (its rounding-free "golden_true" form), so P̂ and P8 are the only roundings of the stage.

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "attnref/attention/variant.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/quant.hpp"
#include "attnref/core/types.hpp"
#include "attnref/core/view.hpp"
#include "attnref/detail/simd.hpp"

namespace attnref {

/// int8 q / k / v and the scales of SelfAttentionQuantInputs, made from floating-point data.
struct QkvQuantized {
  std::vector<std::int8_t> query;  ///< [nTokens, headNum, headSize], contiguous
  std::vector<std::int8_t> key;    ///< [nTokens, kvHeadNum, headSize]
  std::vector<std::int8_t> value;  ///< [nTokens, kvHeadNum, headSizeV] (empty without value)
  std::vector<float> q_scale, k_scale, v_scale;  ///< the per-head scales: x ≈ x8 · scale
  std::vector<float> qk_descale;                 ///< [headNum]: q_scale[h] · k_scale[h / G]
  std::vector<float> vpv_descale;                ///< [headNum]: v_scale[h / G] (both modes)
  std::vector<float> p_scale;  ///< [headNum]: 1/127 (offline: P̂ in [0, 1] -> [0, 127])
};

/// Quantizes a float model's q, k, v for the qkv-quantized SelfAttention: symmetric, one scale
/// per head (amax / 127 over the head's tokens and elements; an all-zero head gets scale 1),
/// round half to even. value may be absent (MLA: V is part of K). T: float, double, half or
/// bfloat16. Pass qk_descale, vpv_descale and (offline) p_scale on to SelfAttentionQuantInputs.
template <class T>
QkvQuantized quantize_qkv(const StridedView<const T, 3>& query, const StridedView<const T, 3>& key,
                          const StridedView<const T, 3>& value = {}) {
  constexpr const char* fn = "quantize_qkv";
  const Index tokens = query.size(0), nh = query.size(1), nkv = key.size(1);
  ATTNREF_CHECK(key.size(0) == tokens, std::invalid_argument, fn, "key.shape[0]",
                "mismatch with query.shape[0]", tokens, key.size(0));
  ATTNREF_CHECK(nkv > 0 && nh % nkv == 0, std::invalid_argument, fn, "key.shape[1]",
                "does not divide the query heads", "a divisor of " + std::to_string(nh), nkv);
  ATTNREF_CHECK(key.size(2) == query.size(2), std::invalid_argument, fn, "key.shape[2]",
                "mismatch with query.shape[2]", query.size(2), key.size(2));
  if (!value.absent())
    ATTNREF_CHECK(value.size(0) == tokens && value.size(1) == nkv, std::invalid_argument, fn,
                  "value.shape", "mismatch with key",
                  "[" + std::to_string(tokens) + ", " + std::to_string(nkv) + ", headSizeV]",
                  detail::shape_str(value));
  // One head of x as a 2-D [tokens, elements] view; quantized into `dst` (contiguous).
  auto per_head = [](const StridedView<const T, 3>& x, std::vector<std::int8_t>& dst,
                     std::vector<float>& scales) {
    const Index n = x.size(0), heads = x.size(1), e = x.size(2);
    dst.assign(static_cast<size_t>(n * heads * e), 0);
    for (Index h = 0; h < heads; ++h) {
      const StridedView<const T, 2> xh(x.ptr(0, h, 0), {n, e}, {x.stride(0), x.stride(2)});
      const QuantScales s = choose_scales(xh, QuantGranularity::PerTensor, true);
      quantize(xh, s, StridedView<std::int8_t, 2>(dst.data() + h * e, {n, e}, {heads * e, 1}));
      scales.push_back(s.scale[0]);
    }
  };
  QkvQuantized r;
  per_head(query, r.query, r.q_scale);
  per_head(key, r.key, r.k_scale);
  if (!value.absent()) per_head(value, r.value, r.v_scale);
  const Index group = nh / nkv;
  for (Index h = 0; h < nh; ++h) {
    const size_t hk = static_cast<size_t>(h / group);
    r.qk_descale.push_back(r.q_scale[static_cast<size_t>(h)] * r.k_scale[hk]);
    r.vpv_descale.push_back(value.absent() ? r.k_scale[hk] : r.v_scale[hk]);
    r.p_scale.push_back(1.0f / 127.0f);
  }
  return r;
}

}  // namespace attnref
