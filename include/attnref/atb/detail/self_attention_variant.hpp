#pragma once
/// Internal (not part of the API): the engine hooks of ATB SelfAttention — q / qk scaling, logN,
/// clamp, every mask encoding, the fp16 score path of the DEFAULT kernel — and the qkv-quantized
/// variant that adds the P stage (PQuantStep, detail/hooks/quant_p.hpp); qScale through IoHooks.

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "attnref/atb/qkv_quant.hpp"
#include "attnref/atb/self_attention_params.hpp"
#include "attnref/attention/attention.hpp"
#include "attnref/core/view.hpp"
#include "attnref/detail/hooks/io.hpp"
#include "attnref/detail/hooks/quant_p.hpp"
#include "attnref/detail/simd.hpp"
#include "attnref/mask/alibi.hpp"
#include "attnref/mask/norm_compress.hpp"
#include "attnref/mask/sliding_window.hpp"

namespace attnref {
namespace detail {

/// The engine hooks of ATB SelfAttention: scaling, clamp, mask encodings and the fp16 score path.
template <class T>
struct AtbSelfAttentionVariant : IoHooks {
  using P = SelfAttentionParams;
  const SelfAttentionParams* p;
  bool fp16_scores;                   // DEFAULT kernel with fp16 data
  float mask_coeff;                   // -3e38 (binary masks) or 1 (additive masks)
  StridedView<const T, 3> mask;       // NORM mask or NORM_COMPRESS tile, absent otherwise
  StridedView<const float, 1> log_n;  // LOGN, absent otherwise
  bool log_n_per_batch;               // DECODER: one logN value per sequence
  bool transform_needed;              // false: plain scaled scores (qk_scale is the engine's scale)
  bool scale_folded;                  // qk_scale applied by the engine (fp32 path, no logN/clamp)
  CausalHook causal;                  // CAUSAL_MASK (top-left, or bottom-right for PREFIX_ENCODER)
  bool compressed;                    // 128-block causal structure: NORM_COMPRESS, ALIBI_COMPRESS*
  NormCompressHook compress;
  bool swa_compressed;  // SLIDING_WINDOW_COMPRESS
  SwaCompressHook swa;
  StridedView<const T, 4> head_mask;   // ALIBI: [batch or 1, heads, rows, keys]; ALIBI_COMPRESS
                                       // [1, heads, seqLen, 128]; absent otherwise
  StridedView<const float, 1> slopes;  // ALIBI_COMPRESS* with the [256, 256] tile
  AlibiCompressHook alibi;
  StridedView<const float, 1> qk_descale;  // qkv quant: [headNum], scores are int32(q·k)

  /// A full mask tensor read at (sequence, query, key): NORM, or SLIDING_WINDOW_NORM with one.
  bool full_mask() const {
    return !mask.absent() &&
           (p->mask_type == P::MaskType::Norm || p->mask_type == P::MaskType::SlidingWindowNorm);
  }

  // CAUSAL_MASK goes through the engine's mask predicate: its hidden keys get probability
  // exactly 0 either way (−3e38 absorbs any fp32 score, and fp16 overflows to −inf, while every
  // row keeps key 0), so the tiles above the diagonal are skipped instead of computed. The
  // blocks NORM_COMPRESS skips are skipped the same way.
  bool has_transform() const { return transform_needed; }
  KvRange kv_range(const SeqInfo& s, Index q0, Index q1) const {
    return compressed       ? compress.kv_range(s, q0, q1)
           : swa_compressed ? swa.kv_range(s, q0, q1)
                            : causal.kv_range(s, q0, q1);
  }
  TileMask classify(const SeqInfo& s, Index q0, Index q1, Index k0, Index k1) const {
    return compressed       ? compress.classify(s, q0, q1, k0, k1)
           : swa_compressed ? swa.classify(s, q0, q1, k0, k1)
                            : causal.classify(s, q0, q1, k0, k1);
  }
  bool row_interval(const SeqInfo& s, const Coord& c, KvRange& visible) const {
    visible = compressed       ? compress.visible(s, c.q)
              : swa_compressed ? swa.visible(s, c.q)
                               : causal.visible(s, c.q);
    return true;
  }
  bool masked(const SeqInfo& s, const Coord& c) const {
    return compressed       ? compress.masked(s, c.q, c.kv)
           : swa_compressed ? swa.masked(s, c.q, c.kv)
                            : causal.masked(s, c.q, c.kv);
  }

  static float fp16(float x) { return static_cast<float>(half(x)); }

  /// The mask term added to the score of a visible position (0 without a mask).
  float mask_term(const SeqInfo& si, const Coord& c) const {
    using M = P::MaskType;
    switch (p->mask_type) {
      case M::Norm:
      case M::SlidingWindowNorm:
        if (mask.absent()) return 0.0f;  // the decoder's generated window
        return static_cast<float>(mask(mask.size(0) == 1 ? 0 : c.batch, c.q, c.kv)) * mask_coeff;
      case M::NormCompress:
        if (!compress.on_diagonal(si, c.q, c.kv)) return 0.0f;
        return static_cast<float>(
                   mask(0, compress.tile_row(si, c.q), NormCompressHook::tile_col(c.kv))) *
               mask_coeff;
      case M::SlidingWindowCompress: {
        const Index r = swa.pattern_row(c.q, c.kv);
        return r >= 0 ? static_cast<float>(mask(0, r, swa.pattern_col(c.kv))) * mask_coeff : 0.0f;
      }
      case M::Alibi:  // additive, with a head axis
        return static_cast<float>(
            head_mask(head_mask.size(0) == 1 ? 0 : c.batch, c.q_head, c.q, c.kv));
      case M::AlibiCompress:
      case M::AlibiCompressSqrt:
      case M::AlibiCompressLeftAlign:
        if (alibi.kind == AlibiCompressHook::Kind::HeadMask)
          return alibi.value(si, c.q, c.kv, [&](Index r, Index col) {
            return static_cast<float>(head_mask(0, c.q_head, r, col));
          });
        return alibi.value(si, c.q, c.kv, [&](Index r, Index col) {
          return static_cast<float>(mask(0, r, col));
        }) * slopes(c.q_head);
      default:
        return 0.0f;
    }
  }

  template <class Acc>
  Acc transform(const SeqInfo& si, const Coord& c, Acc raw) const {
    // raw = (q · qScale) · k, accumulated in float (the engine's scale is 1).
    float s = static_cast<float>(raw);
    if (fp16_scores) {
      s = qk_descale.absent() ? fp16(s) : fp16(s * qk_descale(c.q_head));
      if (!log_n.absent()) s = fp16(s * log_n(log_n_per_batch ? c.batch : c.q));
      s = fp16(s * fp16(p->qk_scale));
    } else {
      if (!log_n.absent()) s *= log_n(log_n_per_batch ? c.batch : c.q);
      if (!scale_folded) s *= p->qk_scale;
    }
    if (p->clamp_type == P::ClampType::MinMax)
      s = fp16(std::min(std::max(s, p->clamp_min), p->clamp_max));
    const float m = mask_term(si, c);  // CAUSAL_MASK: only visible keys reach the transform
    if (fp16_scores) return static_cast<Acc>(fp16(s + fp16(m)));
    return static_cast<Acc>(s + m);
  }

  /// transform() on `cols` consecutive keys of one query row (c: the first): the same
  /// operations in the same order on whole rows, with the fp16 roundings vectorised
  /// (simd::round_to_half: the same bits at every SIMD level). The engine discards the entries
  /// of masked keys.
  template <class Acc>
  void transform_row(const SeqInfo& si, const Coord& c, Acc* row, Index cols) const {
    if constexpr (!std::is_same_v<Acc, float>) {
      for (Index j = 0; j < cols; ++j)
        row[j] = transform<Acc>(si, Coord{c.batch, c.q, c.kv + j, c.q_head, c.kv_head}, row[j]);
    } else {
      constexpr Index kChunk = 256;
      for (Index j0 = 0; j0 < cols; j0 += kChunk) {
        const Index n = std::min(kChunk, cols - j0);
        row_chunk(si, Coord{c.batch, c.q, c.kv + j0, c.q_head, c.kv_head}, row + j0, n);
      }
    }
  }

 private:
  using RowArray = Eigen::Array<float, Eigen::Dynamic, 1>;

  /// Compressed ALiBi terms of keys c.kv .. c.kv + n − 1 of one query, a key block at a time:
  /// one contiguous mask row per block, converted and transformed as a vector.
  void alibi_run(const SeqInfo& si, const Coord& c, float* out, Index n) const {
    const bool heads = alibi.kind == AlibiCompressHook::Kind::HeadMask;
    const float slope = heads ? 1.0f : slopes(c.q_head);
    for (Index j = 0; j < n;) {
      const Index key = c.kv + j, blk = key / AlibiCompressHook::kTile;
      const Index b0 = key % AlibiCompressHook::kTile;
      const Index len = std::min(n - j, AlibiCompressHook::kTile - b0);
      const AlibiCompressHook::BlockRead r = alibi.block_read(si, c.q, blk);
      const T* src = heads ? head_mask.ptr(0, c.q_head, r.row, b0) : mask.ptr(0, r.row, b0);
      const Index stride = heads ? head_mask.stride(3) : mask.stride(2);
      if (stride == 1)
        simd::to_float(src, len, out + j);
      else
        for (Index x = 0; x < len; ++x) out[j + x] = static_cast<float>(src[x * stride]);
      Eigen::Map<RowArray> seg(out + j, len);
      if (r.sqrt)
        seg = (seg * seg + r.add).sqrt();
      else if (r.add != 0.0f)
        seg += r.add;
      if (!heads) seg *= slope;
      j += len;
    }
  }

  void row_chunk(const SeqInfo& si, const Coord& c, float* row, Index n) const {
    Eigen::Map<RowArray> s(row, n);
    const auto r16 = [n](float* x) { simd::round_to_half(x, n); };
    const float ln = log_n.absent() ? 1.0f : log_n(log_n_per_batch ? c.batch : c.q);
    if (fp16_scores) {  // each product in fp32, then rounded to fp16
      const float scale = fp16(p->qk_scale);
      if (!qk_descale.absent() && log_n.absent()) {  // (qkv quant: both steps in one pass)
        simd::mul_round_to_half(row, n, qk_descale(c.q_head), &scale);
      } else {
        if (!qk_descale.absent())
          simd::mul_round_to_half(row, n, qk_descale(c.q_head));
        else
          r16(row);
        if (!log_n.absent()) simd::mul_round_to_half(row, n, ln);
        simd::mul_round_to_half(row, n, scale);
      }
    } else {
      if (!log_n.absent()) s *= ln;
      if (!scale_folded) s *= p->qk_scale;
    }
    if (p->clamp_type == P::ClampType::MinMax) {  // Eigen's max / min keep std::max's NaN rule
      s = s.max(p->clamp_min).min(p->clamp_max);
      r16(row);
    }
    alignas(64) float mbuf[256];
    Eigen::Map<RowArray> m(mbuf, n);
    if (full_mask()) {  // a contiguous run of one mask row: vectorised conversion
      const Index b = mask.size(0) == 1 ? 0 : c.batch;
      const T* src = mask.ptr(b, c.q, c.kv);
      if (mask.stride(2) == 1)
        simd::to_float(src, n, mbuf);
      else
        for (Index j = 0; j < n; ++j) mbuf[j] = static_cast<float>(src[j * mask.stride(2)]);
      m *= mask_coeff;
    } else if (is_alibi(p->mask_type) && p->mask_type != P::MaskType::Alibi) {
      alibi_run(si, c, mbuf, n);
    } else if (p->mask_type != P::MaskType::Undefined && p->mask_type != P::MaskType::CausalMask &&
               !(p->mask_type == P::MaskType::SlidingWindowNorm && mask.absent())) {
      for (Index j = 0; j < n; ++j)
        mbuf[j] = mask_term(si, Coord{c.batch, c.q, c.kv + j, c.q_head, c.kv_head});
    } else {
      return;  // no mask term: adding 0 changes no score (fp16 values stay fp16)
    }
    if (fp16_scores) {
      r16(mbuf);
      s += m;
      r16(row);
    } else {
      s += m;
    }
  }
};

/// The qkv-quantized path: the SelfAttention hooks (with qk_descale) plus the P stage.
template <class T>
struct AtbQkvQuantVariant : AtbSelfAttentionVariant<T>, PQuantStep {};

/// What sa_run needs of the qkv-quantized path.
struct SaQuant {
  StridedView<const float, 1> qk_descale;
  PQuantStep p_stage;
  Index block = 128;
};

}  // namespace detail
}  // namespace attnref
