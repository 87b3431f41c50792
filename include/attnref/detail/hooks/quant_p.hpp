#pragma once
/// The one P quantization step of attnref's int8 Q/K/V paths: the engine's quantize_p hook
/// (attention/variant.hpp), in the three forms the vendor operators define. Per kv block of
/// kv_tile keys counted from key 0, for one query row of head h, `row` holds P̂ = exp(s - m)
/// against the running row max (0 for masked keys); the step leaves the integers P8 that multiply
/// V8, sets the block's share of the softmax denominator and returns the factor of its P8·V8:
///
///   SelfAttention (§2.8)   P̂ rounded to fp16 first; l += Σ P̂; r = (running max of P̂ over the
///                          row's blocks) / 127 online, ps[h] offline; P8 = clamp(rint(P̂ / r));
///                          factor vd[h] · r
///   PagedAttention (§3)    l += Σ P̂; online r = (this block's max P̂) / 127, P8 =
///                          clamp(rint(fp16(P̂ / r))), factor vd[h] · r; offline P8 =
///                          clamp(rint(fp16(P̂ · ps[h]))), factor vd[h]
///   PromptFlash (§7)       l += Σ P̂; P8 = clamp(rint(P̂ · quant_scale1)); factor deq_scale2
///   MlaFullQuant (§7.1)    l += Σ P̂; pmax = (this block's max P̂) + 2^-52; P8 = rint(fp16(P̂ ·
///                          (127 / pmax))) (in [0, 127]); factor fp16(pmax) · factor (FIA's
///                          MLA full quantization: dqV / 127)
///
/// (vd: the per-head value descale, ps: the per-head P scale; offline PagedAttention and PFA
/// multiply by their scale rather than divide, as their goldens do; clamp to [-128, 127], rint
/// half to even; an online block whose P̂ are all 0 so far gives P8 = 0 and factor 0.) The section
/// numbers are docs/semantics.md's. Each form keeps its golden's order of operations, so its bits
/// are those of the operator's own reference.

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "attnref/attention/variant.hpp"
#include "attnref/core/types.hpp"
#include "attnref/core/view.hpp"
#include "attnref/detail/simd.hpp"

namespace attnref::detail {

struct PQuantStep {
  enum class Form { SelfAttention, PagedAttention, PromptFlash, MlaFullQuant };
  Form form = Form::SelfAttention;
  bool online = true;
  StridedView<const float, 1> v_descale{};  ///< [heads] (SelfAttention, PagedAttention)
  StridedView<const float, 1> p_scale{};    ///< [heads], offline (SelfAttention, PagedAttention)
  float scale1 = 1.0f;                      ///< PromptFlash: quant_scale1
  float factor = 1.0f;                      ///< PromptFlash: deq_scale2; MlaFullQuant: dqV / 127

  template <class Acc>
  Acc quantize_p(const Coord& c, Acc* row, Index cols, Acc& row_state, Acc& sum) const {
    switch (form) {
      case Form::SelfAttention:
        return self_attention(c, row, cols, row_state, sum);
      case Form::PagedAttention:
        return paged_attention(c, row, cols, sum);
      case Form::MlaFullQuant:
        return mla_full_quant(row, cols, sum);
      case Form::PromptFlash:
        break;
    }
    return prompt_flash(row, cols, sum);
  }

 private:
  /// FIA's MLA full quantization: the block's own max (plus 2^-52) maps to 127, P̂ unrounded in
  /// the sum, fp16(pmax) in the factor.
  template <class Acc>
  Acc mla_full_quant(Acc* row, Index cols, Acc& sum) const {
    float mx = 0.0f, sm = 0.0f;
    for (Index j = 0; j < cols; ++j) {
      mx = std::max(mx, static_cast<float>(row[j]));
      sm += static_cast<float>(row[j]);
    }
    sum = static_cast<Acc>(sm);
    const float pmax = mx + 2.220446049250313e-16f;
    const float q = 127.0f / pmax;
    for (Index j = 0; j < cols; ++j)
      row[j] = static_cast<Acc>(
          std::nearbyint(static_cast<float>(half(static_cast<float>(row[j]) * q))));
    return static_cast<Acc>(static_cast<float>(half(pmax)) * factor);
  }

  /// P̂ unrounded in the sum (summed in vector lanes, as PagedAttention's), P8 = clamp(rint(P̂ ·
  /// quant_scale1)). (Summed key after key, and quantized in the same loop, the step took a
  /// fifth of pfa/int8/dense/S:2048.)
  template <class Acc>
  Acc prompt_flash(Acc* row, Index cols, Acc& sum) const {
    if constexpr (std::is_same_v<Acc, float>) {
      sum = Eigen::Map<const Eigen::ArrayXf>(row, cols).sum();
      simd::rint_clamp(row, cols, scale1, /*divide=*/false, -128.0f, 127.0f);
    } else {
      Acc sm = Acc(0);
      for (Index j = 0; j < cols; ++j) {
        sm += row[j];
        const float q = std::nearbyint(static_cast<float>(row[j]) * scale1);
        row[j] = static_cast<Acc>(std::min(std::max(q, -128.0f), 127.0f));
      }
      sum = sm;
    }
    return static_cast<Acc>(factor);
  }

  /// amax: the row's running max of P̂ over its blocks (online).
  template <class Acc>
  Acc self_attention(const Coord& c, Acc* row, Index cols, Acc& amax, Acc& sum) const {
    Acc mx;
    if constexpr (std::is_same_v<Acc, float>) {
      simd::round_to_half_sum_max(row, cols, sum, mx);
    } else {
      sum = Acc(0);
      mx = -std::numeric_limits<Acc>::infinity();
      for (Index j = 0; j < cols; ++j) {
        row[j] = static_cast<Acc>(static_cast<float>(half(static_cast<float>(row[j]))));
        sum += row[j];
        mx = std::max(mx, row[j]);
      }
    }
    const Acc vd = static_cast<Acc>(v_descale(c.q_head));
    Acc scale;
    if (online) {
      amax = std::max(amax, mx);  // P̂ >= 0: the largest |P̂|
      if (amax == Acc(0)) {       // nothing visible yet: P8 = 0
        std::fill(row, row + cols, Acc(0));
        return Acc(0);
      }
      scale = amax / Acc(127);
    } else {
      scale = static_cast<Acc>(p_scale(c.q_head));
    }
    if constexpr (std::is_same_v<Acc, float>) {
      simd::rint_clamp(row, cols, scale, /*divide=*/true, -128.0f, 127.0f);
    } else {
      for (Index j = 0; j < cols; ++j)
        row[j] = std::min(std::max(std::nearbyint(row[j] / scale), Acc(-128)), Acc(127));
    }
    return vd * scale;
  }

  /// The golden's softmax_quant_numpy: the block's own max (online), P̂ unrounded in the sum.
  template <class Acc>
  Acc paged_attention(const Coord& c, Acc* row, Index cols, Acc& sum) const {
    float mx = 0.0f, sm = 0.0f;
    for (Index j = 0; j < cols; ++j) mx = std::max(mx, static_cast<float>(row[j]));
    if constexpr (std::is_same_v<Acc, float>) {
      sm = Eigen::Map<const Eigen::ArrayXf>(row, cols).sum();
    } else {
      for (Index j = 0; j < cols; ++j) sm += static_cast<float>(row[j]);
    }
    sum = static_cast<Acc>(sm);
    const float vd = v_descale(c.q_head);
    if (online && mx == 0.0f) {  // every P̂ of the block underflowed: P8 = 0
      std::fill(row, row + cols, Acc(0));
      return Acc(0);
    }
    const float d = online ? mx / 127.0f : p_scale(c.q_head);
    if constexpr (std::is_same_v<Acc, float>) {
      simd::half_rint_clamp(row, cols, d, online, -128.0f, 127.0f);
    } else {
      for (Index j = 0; j < cols; ++j) {
        const float v = static_cast<float>(row[j]);
        const float q = online ? v / d : v * d;
        row[j] = static_cast<Acc>(
            std::min(std::max(std::nearbyint(static_cast<float>(half(q))), -128.0f), 127.0f));
      }
    }
    return static_cast<Acc>(online ? vd * mx / 127.0f : vd);
  }
};

}  // namespace attnref::detail
