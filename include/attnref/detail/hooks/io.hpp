#pragma once
/// The query and output hooks the operators share (the engine's q_transform, o_transform and
/// quantize_o, attention/variant.hpp): one place for the algebra of
///   qScale           q[e] -> round(q[e] · q_scale) to the query's data type (ATB qScale)
///   row scale        q[e] -> q[e] · q_row_scale[row, head] (FIA's MLA full quantization)
///   key dequant      per channel c = kv_head · D + e (kv_head: q_head / group, or the
///                    sequence's index modulo batch_heads), keys read as (k8 + k_offset[c]) ·
///                    k_scale[c] without touching the cache: the scale folds into q (q'[e] = q[e] ·
///                    k_scale[c]) and the offset into one constant per row, bias_scale ·
///                    Σ_e q'[e] · k_offset[c] (summed in double), added to every score
///   value dequant    out[e] -> (out[e] + v_offset[c]) · v_scale[c], c = kv_head · Dv + e
///   rows without keys   0 (zero_empty: the sequence has kv length 0)
///   int8 output      sat(rint(x · post_scale[c'] + post_offset[c'])), c' = q_head · Dv + e (one
///                    value: per tensor); NaN -> 0 (a float -> int8 conversion of NaN is undefined)
/// ATB PagedAttention DEQUANT_FUSION and CANN IncreFlashAttention's per-channel antiquant use the
/// dequant maps, PagedAttention and SelfAttention qScale, PFA / IFA the int8 output. A variant
/// inherits IoHooks (all off by default) and the operator fills what its params ask for.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "attnref/attention/variant.hpp"
#include "attnref/core/types.hpp"

namespace attnref::detail {

struct IoHooks {
  // q_transform
  float q_scale = 1.0f;               ///< 1: off
  float (*round_q)(float) = nullptr;  ///< the query type's rounding (with q_scale != 1)
  std::vector<float> k_scale;         ///< [kv_heads · D] or empty
  std::vector<double> k_offset;       ///< [kv_heads · D] or empty
  float bias_scale = 1.0f;            ///< multiplies the offset term (the engine's score scale)
  /// A factor per query row and head (FIA's MLA full quantization: dqQ · dqK), element
  /// q_row_base[batch] + q · q_row_heads + q_head; null: none.
  const float* q_row_scale = nullptr;
  std::vector<Index> q_row_base;
  Index q_row_heads = 0;
  // o_transform
  std::vector<float> v_scale, v_offset;  ///< [kv_heads · Dv] or empty
  bool zero_empty = false;               ///< rows of sequences without keys are 0
  // quantize_o
  std::vector<float> post_scale, post_offset;  ///< 1 or [heads · Dv] values; offset optional
  Index post_width = 0;                        ///< Dv when per channel, 0 when per tensor
  bool post_zero_empty = false;                ///< rows of sequences without keys quantize to 0
  Index group = 1;                             ///< q heads per kv head
  /// > 0: the kv head of a row is its sequence's index modulo batch_heads, not q_head / group
  /// (ATB PagedAttention's compressType: sequence b is the (token, kv head b % kvHeadNum) pair).
  Index batch_heads = 0;

  Index kv_head(const SeqInfo& s, Index q_head) const {
    return batch_heads > 0 ? s.batch % batch_heads : q_head / group;
  }

  /// Sets qScale for a query of type TQ (rounded to TQ after the product, ATB's golden).
  template <class TQ>
  void scale_query(float s) {
    q_scale = s;
    round_q = [](float x) { return static_cast<float>(TQ(x)); };
  }

  bool has_q_transform() const {
    return q_scale != 1.0f || !k_scale.empty() || q_row_scale != nullptr;
  }
  template <class Acc>
  Acc q_transform(const SeqInfo& s, Index q, Index q_head, Acc* row, Index d) const {
    const Index c0 = kv_head(s, q_head) * d;
    if (q_row_scale != nullptr) {
      const float f =
          q_row_scale[q_row_base[static_cast<size_t>(s.batch)] + q * q_row_heads + q_head];
      for (Index e = 0; e < d; ++e) row[e] = static_cast<Acc>(static_cast<float>(row[e]) * f);
    }
    // One loop per map (each element's arithmetic unchanged): in a single loop the call through
    // round_q kept g++ from vectorising the k_scale product, which then cost int8 decode ~5 %
    // (every split item runs this).
    if (q_scale != 1.0f)
      for (Index e = 0; e < d; ++e)
        row[e] = static_cast<Acc>(round_q(static_cast<float>(row[e]) * q_scale));
    if (!k_scale.empty()) {
      const float* ks = k_scale.data() + c0;
      for (Index e = 0; e < d; ++e) row[e] = static_cast<Acc>(static_cast<float>(row[e]) * ks[e]);
    }
    if (k_offset.empty()) return Acc(0);
    // The offset term in double (each float product exact), four running sums in a fixed order:
    // a single chain of dependent additions cost decode ~5 % (every split item runs this).
    const double* off = k_offset.data() + c0;
    double acc[4] = {0.0, 0.0, 0.0, 0.0};
    Index e = 0;
    for (; e + 4 <= d; e += 4)
      for (int l = 0; l < 4; ++l)
        acc[l] += static_cast<double>(static_cast<float>(row[e + l])) * off[e + l];
    for (; e < d; ++e) acc[0] += static_cast<double>(static_cast<float>(row[e])) * off[e];
    const double sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    return static_cast<Acc>(bias_scale * static_cast<float>(sum));
  }

  bool has_o_transform() const { return zero_empty || !v_scale.empty() || !v_offset.empty(); }
  template <class Acc>
  void o_transform(const SeqInfo& s, Index, Index q_head, Acc* row, Index dv) const {
    if (zero_empty && s.kv_len == 0) {
      std::fill(row, row + dv, Acc(0));
      return;
    }
    const Index c0 = kv_head(s, q_head) * dv;
    for (Index e = 0; e < dv; ++e) {
      float v = static_cast<float>(row[e]);
      if (!v_offset.empty()) v += v_offset[static_cast<size_t>(c0 + e)];
      if (!v_scale.empty()) v *= v_scale[static_cast<size_t>(c0 + e)];
      row[e] = static_cast<Acc>(v);
    }
  }

  template <class Acc>
  std::int8_t quantize_o(const SeqInfo& s, Index q_head, Index e, Acc x) const {
    if (post_zero_empty && s.kv_len == 0) return 0;
    const size_t c = post_width == 0 ? 0 : static_cast<size_t>(q_head * post_width + e);
    const float y = std::nearbyint(static_cast<float>(x) * post_scale[c] +
                                   (post_offset.empty() ? 0.0f : post_offset[c]));
    if (std::isnan(y)) return 0;
    return static_cast<std::int8_t>(std::min(std::max(y, -128.0f), 127.0f));
  }
};

}  // namespace attnref::detail
