#pragma once
/// attnref::self_attention — ATB SelfAttentionOperation on the attention engine.
///
/// Implemented: calcType PA_ENCODER (packed tokens, no cache; MLA merged kv cache),
/// ENCODER / DECODER / UNDEFINED (KV caches, written then read; kv-bypass; batchRunStatus; kv
/// tensorlist), PREFIX_ENCODER (paged KV cache with block tables, causal aligned bottom-right),
/// inputLayout BSND and BNSD (second overload), every maskType (NORM, NORM_COMPRESS, ALIBI and
/// the compressed ALiBi forms, SLIDING_WINDOW_NORM / _COMPRESS with the decoder's window and the
/// rolling SWA cache, CAUSAL_MASK), qScale, qkScale, logN (scaleType LOGN), clamp, GQA,
/// kernelType DEFAULT (fp16 score path) and HIGH_PRECISION, qkv full quantization (int8 q/k/v,
/// quantType QKV_OFFLINE / QKV_ONLINE: the SelfAttentionQuantInputs overload). ALiBi with the
/// BNSD inputs is validated (attnref::validate(SelfAttentionParams)) and then rejected as not
/// implemented yet.
///
/// Shapes (BSND; ATB's [nTokens, hidden] and [B, S, N, D] forms are the same memory):
///   query        [nTokens, headNum, headSize]   tokens of all sequences packed by seq_len
///   key, value   [nTokens, kvHeadNum, headSize(V)] the new tokens (absent with kv-bypass; the
///                MLA merged cache has no value: V = the first mlaVHeadSize elements of K);
///                PREFIX_ENCODER: the paged caches [numBlocks, blockSize, kvHeadNum * headSize(V)]
///   key_cache,   [layerNum, batch, maxSeqLen, kvHeadNum * headSize(V)] (ENCODER / DECODER /
///   value_cache   UNDEFINED): the new tokens of sequence b go to rows
///                 token_offset[b] - seq_len[b] + j of layer layer_id, then attention runs over
///                 rows [0, token_offset[b]); with kv-bypass nothing is written
///   key_cache_list, value_cache_list  kv tensorlist (DECODER + kv-bypass): one [maxSeqLen,
///                 kvHeadNum * headSize(V)] tensor per sequence, used instead of the caches
///                 (they hold the layer being run: layer_id is not used)
///   block_tables [batch, maxBlocks], kv_seq_len [batch]  PREFIX_ENCODER: key t of sequence b is
///                row t % blockSize of block block_tables[b][t / blockSize], t < kv_seq_len[b]
///   mask         NORM: [maxSeq, maxSeq] (as [1, maxSeq, maxSeq]), [batch, maxSeq, maxSeq], or
///                decoder [batch, 1, maxSeq]; sliced top-left (rows = query positions, columns =
///                key positions of the sequence); SLIDING_WINDOW_NORM the same (none with
///                DECODER). NORM_COMPRESS: the [128, 128] tile (as [1, 128, 128]), expanded as
///                in attnref/mask/norm_compress.hpp; ALIBI_COMPRESS*: the [256, 256] tile with
///                `slopes` (attnref/mask/alibi.hpp); SLIDING_WINDOW_COMPRESS: the [512, 512]
///                pattern (attnref/mask/sliding_window.hpp)
///   head_mask    ALIBI [batch or 1, headNum, maxSeq, maxSeq]; ALIBI_COMPRESS [1, headNum,
///                seqLen, 128] (then no tile, no slopes)
///   log_n        LOGN: float, [maxSeqLen] per query position (PA_ENCODER) or [batch] (DECODER)
///   out          [nTokens, headNum, headSizeV]
/// batchRunStatus (batch_run_status_enable): a sequence with status 0 gets zero output rows and
/// no cache write (docs/semantics.md §2.7, the choice of §10 item 4).
///
/// Per sequence b, head h, query i, key j (docs/semantics.md §2.2–2.3):
///   s = (q_i · qScale) · k_j  (fp32 accumulation)
///   s = s · logN[i] (LOGN) · qkScale
///   s = fp16(clamp(s, clampMin, clampMax))      (clampType MIN_MAX)
///   s = s + mask term                            (NORM / NORM_COMPRESS / SWA: binary mask ×
///                                                 −3e38 with HIGH_PRECISION or bf16, additive
///                                                 fp16 values with DEFAULT; ALiBi: additive in
///                                                 every dtype; CAUSAL_MASK, blocks a compressed
///                                                 mask skips and keys outside a window get
///                                                 probability 0)
///   out = softmax_j(s) · V                       (fp32), rounded to the data type
/// DEFAULT with fp16 data rounds s to fp16 after the product, after logN (a float32 factor),
/// after qkScale (rounded to fp16 first) and after the mask
/// addition, as the NPU's fp16 kernel does, so an fp16 overflow gives inf / NaN exactly where the
/// NPU does; HIGH_PRECISION (and bf16, always) keeps fp32. A fully masked row follows the −3e38
/// arithmetic: a uniform average of its values, as on the NPU.

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/atb/qkv_quant.hpp"
#include "attnref/atb/self_attention_params.hpp"
#include "attnref/attention/attention.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/view.hpp"
#include "attnref/detail/simd.hpp"
#include "attnref/mask/alibi.hpp"
#include "attnref/mask/norm_compress.hpp"
#include "attnref/mask/sliding_window.hpp"

namespace attnref {

template <class T>
struct SelfAttentionInputs {
  StridedView<const T, 3> query;
  StridedView<const T, 3> key{};  ///< new tokens (absent with kv-bypass); PrefixEncoder: cache
  StridedView<const T, 3> value{};
  std::vector<Index> seq_len;           ///< seqLen [batch]
  StridedView<const T, 3> mask{};       ///< NORM / NORM_COMPRESS mask (see above)
  StridedView<const float, 1> log_n{};  ///< logN (scaleType LOGN)
  /// ALiBi masks with a head axis: ALIBI [batch or 1, headNum, maxSeq, maxSeq] (ATB's 3-D
  /// [headNum, maxSeq, maxSeq] as [1, ...]); ALIBI_COMPRESS [headNum, seqLen, 128] as [1, ...]
  StridedView<const T, 4> head_mask{};
  StridedView<const float, 1> slopes{};          ///< ALIBI_COMPRESS*: [headNum] (with the 256 tile)
  std::vector<Index> token_offset{};             ///< tokenOffset [batch] (cache calcTypes)
  Index layer_id = 0;                            ///< layerId (cache calcTypes)
  std::vector<std::int32_t> batch_run_status{};  ///< batchRunStatus [batch], 0 or 1
  std::vector<Index> kv_seq_len{};               ///< kvSeqLen [batch] (PrefixEncoder)
  StridedView<const std::int32_t, 2> block_tables{};      ///< blockTables (PrefixEncoder)
  std::vector<StridedView<const T, 2>> key_cache_list{};  ///< kv tensorlist (Decoder + bypass)
  std::vector<StridedView<const T, 2>> value_cache_list{};
};

/// int8 inputs of the qkv full quantization (quantType QKV_OFFLINE / QKV_ONLINE; calcType
/// PA_ENCODER, BSND; docs/semantics.md §2.8). TO, the type of the output and of the masks, is
/// params.out_data_type: half (Float16) or bfloat16 (BFloat16).
template <class TO>
struct SelfAttentionQuantInputs {
  StridedView<const std::int8_t, 3> query;    ///< [nTokens, headNum, headSize]
  StridedView<const std::int8_t, 3> key;      ///< [nTokens, kvHeadNum, headSize]
  StridedView<const std::int8_t, 3> value{};  ///< [nTokens, kvHeadNum, headSizeV]; none with MLA
  std::vector<Index> seq_len;                 ///< seqLen [batch]
  StridedView<const TO, 3> mask{};            ///< as SelfAttentionInputs::mask
  StridedView<const TO, 4> head_mask{};       ///< as SelfAttentionInputs::head_mask
  StridedView<const float, 1> slopes{};       ///< as SelfAttentionInputs::slopes
  StridedView<const float, 1> qk_descale{};   ///< qkDescale [headNum]: dequant scale of q·k
  StridedView<const float, 1> vpv_descale{};  ///< vpvDescale [headNum]: offline of P·V, online of V
  StridedView<const float, 1> p_scale{};      ///< pScale [headNum]: offline only (none online)
  /// qkOffset / vpvOffset [headNum] int32: reserved by ATB ("any non-empty tensor"), never read.
  StridedView<const std::int32_t, 1> qk_offset{};
  StridedView<const std::int32_t, 1> vpv_offset{};
};

template <class T>
struct SelfAttentionOutputs {
  StridedView<T, 3> out;          ///< [nTokens, headNum, headSizeV]
  StridedView<T, 4> key_cache{};  ///< read and (unless kv-bypass) written
  StridedView<T, 4> value_cache{};
};

/// inputLayout TYPE_BNSD (docs/semantics.md §2.10). ENCODER / DECODER / UNDEFINED need kv-bypass
/// (the caches are read, never written); PA_ENCODER takes q, k, v and no mask.
template <class T>
struct SelfAttentionBnsdInputs {
  StridedView<const T, 4> query;    ///< [batch, headNum, S, headSize], S >= every seq_len
  StridedView<const T, 4> key{};    ///< PaEncoder: [batch, kvHeadNum, S, headSize]
  StridedView<const T, 4> value{};  ///< PaEncoder: [batch, kvHeadNum, S, headSizeV]
  std::vector<Index> seq_len;       ///< seqLen [batch]
  StridedView<const T, 3> mask{};   ///< NORM mask, as in the BSND form
  std::vector<Index> token_offset{};
  Index layer_id = 0;
  std::vector<std::int32_t> batch_run_status{};
};

template <class T>
struct SelfAttentionBnsdOutputs {
  StridedView<T, 4> out;  ///< [batch, headNum, S, headSizeV]; rows past seq_len[b] set to 0
  StridedView<const T, 5> key_cache{};  ///< [layerNum, batch, kvHeadNum, maxSeqLen, headSize]
  StridedView<const T, 5> value_cache{};
};

namespace detail {

/// The engine hooks of ATB SelfAttention: scaling, clamp, mask encodings and the fp16 score path.
template <class T>
struct AtbSelfAttentionVariant {
  using P = SelfAttentionParams;
  const SelfAttentionParams* p;
  bool fp16_scores;                   // DEFAULT kernel with fp16 data
  float mask_coeff;                   // -3e38 (binary masks) or 1 (additive fp16 masks)
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

  static constexpr float kMaskValue = -3e38f;

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
    if (fp16_scores) {  // each product in fp32, then rounded to fp16 (one pass each)
      if (!qk_descale.absent())
        simd::mul_round_to_half(row, n, qk_descale(c.q_head));
      else
        r16(row);
      if (!log_n.absent()) simd::mul_round_to_half(row, n, ln);
      simd::mul_round_to_half(row, n, fp16(p->qk_scale));
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
struct AtbQkvQuantVariant : AtbSelfAttentionVariant<T> {
  QkvQuantPHook p_stage;

  template <class Acc>
  Acc quantize_p(const Coord& c, Acc* row, Index cols, Acc& row_state, Acc& sum) const {
    return p_stage.template quantize_p<Acc>(c, row, cols, row_state, sum);
  }
};

/// What sa_run needs of the qkv-quantized path.
struct SaQuant {
  StridedView<const float, 1> qk_descale;
  QkvQuantPHook p_stage;
  Index block = 128;
};

/// [layer, batch, maxSeq, heads * d] cache -> engine view [batch, maxSeq, heads, d] of one layer.
template <class E>
StridedView<E, 4> cache_layer(const StridedView<E, 4>& c, Index layer, Index heads, Index d) {
  return StridedView<E, 4>(c.data() + layer * c.stride(0), {c.size(1), c.size(2), heads, d},
                           {c.stride(1), c.stride(2), d * c.stride(3), c.stride(3)});
}

/// [layer, batch, heads, maxSeq, d] BNSD cache -> engine view [batch, maxSeq, heads, d].
template <class E>
StridedView<E, 4> bnsd_cache_layer(const StridedView<E, 5>& c, Index layer) {
  return StridedView<E, 4>(c.data() + layer * c.stride(0),
                           {c.size(1), c.size(3), c.size(2), c.size(4)},
                           {c.stride(1), c.stride(3), c.stride(2), c.stride(4)});
}

/// [n, a, b] -> engine view [1, n, a, b] (packed tokens).
template <class E>
StridedView<E, 4> packed(const StridedView<E, 3>& v) {
  return StridedView<E, 4>(v.data(), {1, v.size(0), v.size(1), v.size(2)},
                           {0, v.stride(0), v.stride(1), v.stride(2)});
}

/// [b, n, s, d] -> engine view [b, s, n, d].
template <class E>
StridedView<E, 4> bnsd_to_engine(const StridedView<E, 4>& v) {
  return StridedView<E, 4>(v.data(), {v.size(0), v.size(2), v.size(1), v.size(3)},
                           {v.stride(0), v.stride(2), v.stride(1), v.stride(3)});
}

/// [rows, cols, heads * d] -> [rows, cols, heads, d] (ATB's hidden-size form of caches).
template <class E>
StridedView<E, 4> split_hidden(const StridedView<E, 3>& v, Index heads, Index d) {
  return StridedView<E, 4>(v.data(), {v.size(0), v.size(1), heads, d},
                           {v.stride(0), v.stride(1), d * v.stride(2), v.stride(2)});
}

/// Everything self_attention resolved from the ATB inputs, in the engine's terms (TIn: the
/// storage of q, k, v; T: of masks and the output).
template <class T, class TIn = T>
struct SelfAttentionPlan {
  AttentionInputs<TIn> ein;
  StridedView<T, 4> o;  // engine output view
  const StridedView<const T, 3>* mask = nullptr;
  const StridedView<const float, 1>* log_n = nullptr;
  const StridedView<const T, 4>* head_mask = nullptr;  // ALiBi masks with a head axis
  const StridedView<const float, 1>* slopes = nullptr;
  Index batch = 0, max_q = 0, max_kv = 0, nh = 0, nkv = 0, d = 0, dv = 0;
  std::vector<Index> q_len;   // per sequence
  std::vector<Index> kv_len;  // per sequence (0 for inactive sequences)
  bool decoder = false;
  bool bottom_right = false;            // PREFIX_ENCODER
  bool swa_rolling = false;             // cacheType SWA: the caches hold the last window tokens
  const KvPages<TIn>* pages = nullptr;  // kv tensorlist
};

/// Parameter combinations this version does not implement (they pass validate()).
inline void sa_check_implemented(const SelfAttentionParams& params) {
  using P = SelfAttentionParams;
  const P::MaskType m = params.mask_type;
  ATTNREF_NOT_IMPLEMENTED(m == P::MaskType::Undefined || m == P::MaskType::Norm ||
                              m == P::MaskType::CausalMask || m == P::MaskType::NormCompress ||
                              m == P::MaskType::SlidingWindowNorm ||
                              m == P::MaskType::SlidingWindowCompress ||
                              (is_alibi(m) && params.input_layout == P::InputLayout::BSND),
                          "self_attention", "params.mask_type",
                          std::to_string(static_cast<int>(m)) + " (ALiBi masks with BNSD inputs)");
}

/// Checks shared by both layouts, then the run: mask and logN shapes, qScale, output overlaps,
/// `prepare` (zeroing, cache writes: after every check), and the engine.
template <class T, class TIn, class Prepare>
void sa_run(const SelfAttentionParams& params, SelfAttentionPlan<T, TIn>& pl, int num_threads,
            const std::vector<StridedView<const TIn, 4>>& extra_inputs, Prepare&& prepare,
            const SaQuant* quant = nullptr) {
  using P = SelfAttentionParams;
  constexpr const char* fn = "self_attention";
  const StridedView<const T, 3> mask = pl.mask ? *pl.mask : StridedView<const T, 3>{};
  const StridedView<const float, 1> log_n = pl.log_n ? *pl.log_n : StridedView<const float, 1>{};
  const bool swa_norm = params.mask_type == P::MaskType::SlidingWindowNorm;
  if (swa_norm && pl.decoder)
    ATTNREF_CHECK(mask.absent(), std::invalid_argument, fn, "mask",
                  "given with SLIDING_WINDOW_NORM and DECODER (the window is generated)", "none",
                  shape_str(mask));
  if (params.mask_type == P::MaskType::Norm || (swa_norm && !pl.decoder)) {
    ATTNREF_CHECK(!mask.absent(), std::invalid_argument, fn, "mask",
                  swa_norm ? "missing for SLIDING_WINDOW_NORM" : "missing for NORM",
                  "a [maxSeq, maxSeq], [batch, maxSeq, maxSeq] or [batch, 1, maxSeq] mask", "none");
    ATTNREF_CHECK(mask.size(0) == 1 || mask.size(0) == pl.batch, std::invalid_argument, fn,
                  "mask.shape[0]", "mismatch", "1 or " + std::to_string(pl.batch), mask.size(0));
    ATTNREF_CHECK(mask.size(1) >= pl.max_q, std::invalid_argument, fn, "mask.shape[1]",
                  "smaller than the longest query sequence", ">= " + std::to_string(pl.max_q),
                  mask.size(1));
    ATTNREF_CHECK(mask.size(2) >= pl.max_kv, std::invalid_argument, fn, "mask.shape[2]",
                  "smaller than the longest key sequence", ">= " + std::to_string(pl.max_kv),
                  mask.size(2));
    check_view(fn, "mask", mask);
  }
  if (params.mask_type == P::MaskType::NormCompress) {
    ATTNREF_CHECK(!mask.absent(), std::invalid_argument, fn, "mask", "missing for NORM_COMPRESS",
                  "the [128, 128] tile (as [1, 128, 128])", "none");
    const std::array<Index, 3> want{1, NormCompressHook::kTile, NormCompressHook::kTile};
    ATTNREF_CHECK(mask.shape() == want, std::invalid_argument, fn, "mask.shape",
                  "mismatch for NORM_COMPRESS", shape_str<3>(want), shape_str(mask));
  }
  const StridedView<const T, 4> head_mask =
      pl.head_mask ? *pl.head_mask : StridedView<const T, 4>{};
  const StridedView<const float, 1> slopes = pl.slopes ? *pl.slopes : StridedView<const float, 1>{};
  const bool alibi_compressed = params.mask_type == P::MaskType::AlibiCompress ||
                                params.mask_type == P::MaskType::AlibiCompressSqrt ||
                                params.mask_type == P::MaskType::AlibiCompressLeftAlign;
  // ALIBI_COMPRESS takes either the [256, 256] tile with slopes or a [headNum, seqLen, 128] mask.
  const bool head_mask_form =
      params.mask_type == P::MaskType::AlibiCompress && !head_mask.absent() && mask.absent();
  if (params.mask_type == P::MaskType::Alibi) {
    ATTNREF_CHECK(!head_mask.absent(), std::invalid_argument, fn, "head_mask", "missing for ALIBI",
                  "[batch or 1, headNum, maxSeq, maxSeq]", "none");
    ATTNREF_CHECK(head_mask.size(0) == 1 || head_mask.size(0) == pl.batch, std::invalid_argument,
                  fn, "head_mask.shape[0]", "mismatch", "1 or " + std::to_string(pl.batch),
                  head_mask.size(0));
    ATTNREF_CHECK(head_mask.size(1) == pl.nh, std::invalid_argument, fn, "head_mask.shape[1]",
                  "mismatch with the number of heads", pl.nh, head_mask.size(1));
    ATTNREF_CHECK(head_mask.size(2) >= pl.max_q, std::invalid_argument, fn, "head_mask.shape[2]",
                  "smaller than the longest query sequence", ">= " + std::to_string(pl.max_q),
                  head_mask.size(2));
    ATTNREF_CHECK(head_mask.size(3) >= pl.max_kv, std::invalid_argument, fn, "head_mask.shape[3]",
                  "smaller than the longest key sequence", ">= " + std::to_string(pl.max_kv),
                  head_mask.size(3));
    check_view(fn, "head_mask", head_mask);
  }
  if (alibi_compressed) {
    ATTNREF_CHECK(pl.d <= 128 && pl.dv <= 128, std::invalid_argument, fn, "head size",
                  "above the compressed ALiBi limit", "<= 128", std::max(pl.d, pl.dv));
    ATTNREF_CHECK(!(std::is_same_v<T, half> && params.kernel_type == P::KernelType::Default),
                  std::invalid_argument, fn, "params.kernel_type",
                  "must be HighPrecision for a compressed ALiBi mask with fp16", "HighPrecision",
                  "Default");
    if (head_mask_form) {
      const Index rows = pl.bottom_right ? pl.max_kv : pl.max_q;
      ATTNREF_CHECK(head_mask.size(0) == 1 && head_mask.size(1) == pl.nh &&
                        head_mask.size(2) >= rows && head_mask.size(3) == AlibiCompressHook::kTile,
                    std::invalid_argument, fn, "head_mask.shape", "mismatch for ALIBI_COMPRESS",
                    "[1, " + std::to_string(pl.nh) + ", >= " + std::to_string(rows) + ", 128]",
                    shape_str(head_mask));
      check_view(fn, "head_mask", head_mask);
    } else {
      ATTNREF_CHECK(!mask.absent(), std::invalid_argument, fn, "mask",
                    "missing for a compressed ALiBi mask",
                    "the [256, 256] tile (as [1, 256, 256]) with slopes", "none");
      const std::array<Index, 3> want{1, 2 * AlibiCompressHook::kTile,
                                      2 * AlibiCompressHook::kTile};
      ATTNREF_CHECK(mask.shape() == want, std::invalid_argument, fn, "mask.shape",
                    "mismatch for a compressed ALiBi mask", shape_str<3>(want), shape_str(mask));
      check_view(fn, "mask", mask);
      ATTNREF_CHECK(!slopes.absent(), std::invalid_argument, fn, "slopes",
                    "missing for a compressed ALiBi mask", "[headNum] float", "none");
      ATTNREF_CHECK(slopes.size(0) == pl.nh, std::invalid_argument, fn, "slopes.shape[0]",
                    "mismatch with the number of heads", pl.nh, slopes.size(0));
    }
  }
  if (params.mask_type == P::MaskType::SlidingWindowCompress) {
    ATTNREF_CHECK(!mask.absent(), std::invalid_argument, fn, "mask",
                  "missing for SLIDING_WINDOW_COMPRESS",
                  "the [512, 512] pattern (as [1, 512, 512])", "none");
    const std::array<Index, 3> want{1, SwaCompressHook::kSize, SwaCompressHook::kSize};
    ATTNREF_CHECK(mask.shape() == want, std::invalid_argument, fn, "mask.shape",
                  "mismatch for SLIDING_WINDOW_COMPRESS", shape_str<3>(want), shape_str(mask));
    check_view(fn, "mask", mask);
  }
  if (params.scale_type == P::ScaleType::LogN) {
    ATTNREF_CHECK(!log_n.absent(), std::invalid_argument, fn, "log_n", "missing for LOGN",
                  pl.decoder ? "a [batch] float tensor" : "a [maxSeqLen] float tensor", "none");
    const Index need = pl.decoder ? pl.batch : pl.max_q;
    ATTNREF_CHECK(log_n.size(0) >= need, std::invalid_argument, fn, "log_n.shape[0]",
                  pl.decoder ? "smaller than the batch" : "smaller than the longest sequence",
                  ">= " + std::to_string(need), log_n.size(0));
  }

  // qScale multiplies q in the data type before the product (ATB golden); the engine's scale
  // would multiply in float, so a scaled copy of q (never of K/V) is made when qScale != 1.
  // (int8 q: validate() rejects qScale != 1 with qkv quantization.)
  std::vector<TIn> q_scaled;
  if constexpr (!std::is_same_v<TIn, std::int8_t>) {
    if (params.q_scale != 1.0f) {
      const auto& q = pl.ein.q;
      q_scaled.resize(static_cast<size_t>(q.numel()));
      StridedView<TIn, 4> qs(q_scaled.data(), q.shape());
      for (Index a = 0; a < q.size(0); ++a)
        for (Index t = 0; t < q.size(1); ++t)
          for (Index h = 0; h < q.size(2); ++h)
            for (Index e = 0; e < q.size(3); ++e)
              qs(a, t, h, e) = TIn(static_cast<float>(q(a, t, h, e)) * params.q_scale);
      pl.ein.q = qs;
    }
  }

  AttentionOutputs<T> eout{pl.o};
  // fp16 mask encodings: additive with the DEFAULT kernel, binary x -3e38 otherwise.
  const bool additive_mask =
      std::is_same_v<T, half> && params.kernel_type == P::KernelType::Default;
  // The qkv-quantized path always computes its scores in fp16 (docs/semantics.md §2.8).
  const bool fp16_scores = additive_mask || quant != nullptr;
  const bool alibi_blocks = alibi_compressed && !head_mask_form;  // the [256, 256] tile
  const bool compressed = params.mask_type == P::MaskType::NormCompress || alibi_compressed;
  const bool swa_compressed = params.mask_type == P::MaskType::SlidingWindowCompress;
  const bool mask_read = params.mask_type == P::MaskType::Norm ||
                         params.mask_type == P::MaskType::NormCompress || swa_compressed ||
                         (swa_norm && !pl.decoder) || alibi_blocks;
  const bool transform_needed = fp16_scores || params.scale_type == P::ScaleType::LogN ||
                                params.clamp_type == P::ClampType::MinMax || mask_read ||
                                params.mask_type == P::MaskType::Alibi || alibi_compressed;
  AlibiCompressHook alibi_hook;
  alibi_hook.blocks = NormCompressHook{pl.bottom_right};
  alibi_hook.kind =
      head_mask_form                                            ? AlibiCompressHook::Kind::HeadMask
      : params.mask_type == P::MaskType::AlibiCompressSqrt      ? AlibiCompressHook::Kind::Sqrt
      : params.mask_type == P::MaskType::AlibiCompressLeftAlign ? AlibiCompressHook::Kind::LeftAlign
                                                                : AlibiCompressHook::Kind::Distance;
  // Sliding window (SLIDING_WINDOW_NORM): the encoders' window is aligned top-left like their
  // masks; the decoder's query is the last token (bottom-right), and a rolling cache (cacheType
  // SWA) holds exactly the window, so nothing is hidden there.
  CausalHook causal{params.mask_type == P::MaskType::CausalMask
                        ? (pl.bottom_right ? CausalMode::BottomRight : CausalMode::TopLeft)
                        : CausalMode::None};
  if (swa_norm && !pl.swa_rolling)
    causal =
        CausalHook{pl.decoder ? CausalMode::BottomRight : CausalMode::TopLeft, params.window_size};
  AttentionParams ep;
  // Without a transform the scores are q·k·qkScale in fp32: the engine applies qkScale itself
  // (folded into its q tile, a rounding-level difference from scaling the product).
  // The same when the transform only adds a mask term in fp32.
  const bool scale_folded =
      !transform_needed || (!fp16_scores && params.scale_type != P::ScaleType::LogN &&
                            params.clamp_type != P::ClampType::MinMax);
  ep.scale = scale_folded ? static_cast<double>(params.qk_scale) : 1.0;
  ep.num_threads = num_threads;
  if (quant) ep.kv_tile = quant->block;  // P is quantized block by block
  validate(pl.ein, ep, eout);  // engine checks (overlaps included) before anything is written
  for (const auto& x : extra_inputs)
    ATTNREF_CHECK(!overlaps(pl.o, x), std::invalid_argument, fn, "out",
                  "overlaps an input or a cache", "memory disjoint from every input",
                  "overlapping memory");
  prepare();

  AtbSelfAttentionVariant<T> var{
      &params,
      fp16_scores,
      additive_mask ? 1.0f : AtbSelfAttentionVariant<T>::kMaskValue,
      mask_read ? mask : StridedView<const T, 3>{},
      params.scale_type == P::ScaleType::LogN ? log_n : StridedView<const float, 1>{},
      pl.decoder,
      transform_needed,
      scale_folded,
      causal,
      compressed,
      NormCompressHook{pl.bottom_right},
      swa_compressed,
      SwaCompressHook::make(params.window_size, pl.d, pl.dv),
      params.mask_type == P::MaskType::Alibi || head_mask_form ? head_mask
                                                               : StridedView<const T, 4>{},
      alibi_blocks ? slopes : StridedView<const float, 1>{},
      alibi_hook,
      quant ? quant->qk_descale : StridedView<const float, 1>{}};
  if (quant) {
    attention_with(AtbQkvQuantVariant<T>{var, quant->p_stage}, pl.ein, ep, eout);
    return;
  }
  if (pl.pages)
    attention_with_pages(var, pl.ein, ep, eout, *pl.pages);
  else
    attention_with(var, pl.ein, ep, eout);
}

/// seq_len / batchRunStatus checks shared by both layouts; returns the active flags.
inline std::vector<bool> sa_sequences(const SelfAttentionParams& params,
                                      const std::vector<Index>& seq_len,
                                      const std::vector<std::int32_t>& status, Index max_len,
                                      const char* max_name) {
  constexpr const char* fn = "self_attention";
  const Index batch = static_cast<Index>(seq_len.size());
  ATTNREF_CHECK(batch >= 1, std::invalid_argument, fn, "seq_len", "empty", ">= 1 sequence", 0);
  for (Index b = 0; b < batch; ++b) {
    const Index l = seq_len[static_cast<size_t>(b)];
    const std::string arg = "seq_len[" + std::to_string(b) + "]";
    ATTNREF_CHECK(l >= 0, std::invalid_argument, fn, arg, "negative", ">= 0", l);
    if (max_len >= 0)
      ATTNREF_CHECK(l <= max_len, std::invalid_argument, fn, arg,
                    std::string("exceeds ") + max_name, "<= " + std::to_string(max_len), l);
    if (params.calc_type == SelfAttentionParams::CalcType::Decoder)
      ATTNREF_CHECK(l == 1, std::invalid_argument, fn, arg, "not 1 for Decoder", 1, l);
  }
  std::vector<bool> active(static_cast<size_t>(batch), true);
  if (params.batch_run_status_enable) {
    ATTNREF_CHECK(static_cast<Index>(status.size()) == batch, std::invalid_argument, fn,
                  "batch_run_status", "size mismatch", batch, status.size());
    for (Index b = 0; b < batch; ++b) {
      const auto st = status[static_cast<size_t>(b)];
      ATTNREF_CHECK(st == 0 || st == 1, std::invalid_argument, fn,
                    "batch_run_status[" + std::to_string(b) + "]", "not 0 or 1", "0 or 1", st);
      active[static_cast<size_t>(b)] = st == 1;
    }
  }
  return active;
}

/// token_offset checks of the cache calcTypes; returns the kv lengths (0 when inactive).
inline std::vector<Index> sa_token_offsets(const std::vector<Index>& seq_len,
                                           const std::vector<Index>& token_offset,
                                           const std::vector<bool>& active, Index max_seq) {
  constexpr const char* fn = "self_attention";
  const Index batch = static_cast<Index>(seq_len.size());
  ATTNREF_CHECK(static_cast<Index>(token_offset.size()) == batch, std::invalid_argument, fn,
                "token_offset", "size mismatch", batch, token_offset.size());
  std::vector<Index> kv(static_cast<size_t>(batch));
  for (Index b = 0; b < batch; ++b) {
    const Index off = token_offset[static_cast<size_t>(b)];
    const std::string arg = "token_offset[" + std::to_string(b) + "]";
    ATTNREF_CHECK(off >= seq_len[static_cast<size_t>(b)], std::invalid_argument, fn, arg,
                  "smaller than seq_len", ">= " + std::to_string(seq_len[static_cast<size_t>(b)]),
                  off);
    ATTNREF_CHECK(off <= max_seq, std::invalid_argument, fn, arg, "exceeds maxSeqLen",
                  "<= " + std::to_string(max_seq), off);
    kv[static_cast<size_t>(b)] = active[static_cast<size_t>(b)] ? off : 0;
  }
  return kv;
}

template <class T, class TIn>
void sa_finish_lengths(SelfAttentionPlan<T, TIn>& pl) {
  pl.max_q = 0;
  pl.max_kv = 0;
  for (Index l : pl.q_len) pl.max_q = std::max(pl.max_q, l);
  for (Index l : pl.kv_len) pl.max_kv = std::max(pl.max_kv, l);
}

/// The BSND front matter shared by the float and the int8 overloads: mask pointers, head counts
/// and sizes (query and out), the MLA checks, and the packed-token offsets of seq_len (checked
/// against query.shape[0]). Returns the offsets.
template <class Plan, class In, class Out>
std::vector<Index> sa_bsnd_front(Plan& pl, const SelfAttentionParams& params, const In& in,
                                 const Out& out) {
  constexpr const char* fn = "self_attention";
  pl.mask = &in.mask;
  pl.head_mask = &in.head_mask;
  pl.slopes = &in.slopes;
  const Index tokens = in.query.size(0);
  pl.nh = in.query.size(1);
  pl.d = in.query.size(2);
  pl.nkv = params.num_kv_heads > 0 ? params.num_kv_heads : params.num_heads;
  pl.dv = out.out.size(2);
  ATTNREF_CHECK(pl.nh == params.num_heads, std::invalid_argument, fn, "query.shape[1]",
                "mismatch with params.num_heads", params.num_heads, pl.nh);
  if (params.mla_v_head_size > 0) {
    ATTNREF_CHECK(pl.dv == params.mla_v_head_size, std::invalid_argument, fn, "out.shape[2]",
                  "mismatch with params.mla_v_head_size", params.mla_v_head_size, pl.dv);
    ATTNREF_CHECK(pl.dv <= pl.d, std::invalid_argument, fn, "params.mla_v_head_size",
                  "larger than the head size", "<= " + std::to_string(pl.d), pl.dv);
    ATTNREF_CHECK(in.value.absent(), std::invalid_argument, fn, "value",
                  "given with the MLA merged kv cache (V is the first mlaVHeadSize dims of K)",
                  "absent", "a tensor");
  }
  std::vector<Index> cu(1, 0);
  for (Index l : in.seq_len) cu.push_back(cu.back() + l);
  ATTNREF_CHECK(cu.back() == tokens, std::invalid_argument, fn, "seq_len",
                "sum mismatch with query.shape[0]", tokens, cu.back());
  pl.batch = static_cast<Index>(in.seq_len.size());
  pl.q_len = in.seq_len;
  return cu;
}

template <class T>
constexpr void sa_check_type() {
  static_assert(std::is_same_v<T, half> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float>,
                "self_attention data: half, bfloat16 or float");
}

}  // namespace detail

/// ATB SelfAttention, inputLayout BSND. Validates the params (co-existence table and
/// constraints) and every input before writing anything (caches included). T: half or bfloat16
/// (the NPU's data types) or float. num_threads: worker threads of the engine (0 = OpenMP's
/// default); results never depend on it.
template <class T>
void self_attention(const SelfAttentionParams& params, const SelfAttentionInputs<T>& in,
                    const SelfAttentionOutputs<T>& out, int num_threads = 0) {
  using P = SelfAttentionParams;
  detail::sa_check_type<T>();
  constexpr const char* fn = "self_attention";
  detail::check_views(fn, "query", in.query, "key", in.key, "value", in.value, "mask", in.mask,
                      "log_n", in.log_n, "head_mask", in.head_mask, "slopes", in.slopes,
                      "block_tables", in.block_tables, "out", out.out, "key_cache", out.key_cache,
                      "value_cache", out.value_cache);
  for (size_t i = 0; i < in.key_cache_list.size(); ++i)
    detail::check_view(fn, "key_cache_list[" + std::to_string(i) + "]", in.key_cache_list[i]);
  for (size_t i = 0; i < in.value_cache_list.size(); ++i)
    detail::check_view(fn, "value_cache_list[" + std::to_string(i) + "]", in.value_cache_list[i]);
  detail::check_out_overlaps(fn, "out", out.out, "query", in.query, "key", in.key, "value",
                             in.value, "mask", in.mask, "log_n", in.log_n, "head_mask",
                             in.head_mask, "slopes", in.slopes, "block_tables", in.block_tables,
                             "key_cache", out.key_cache, "value_cache", out.value_cache);
  const bool kv_list = !in.key_cache_list.empty() || !in.value_cache_list.empty();
  validate(params, kv_list);
  ATTNREF_CHECK(params.input_layout == P::InputLayout::BSND, std::invalid_argument, fn,
                "params.input_layout", "BNSD with the BSND inputs",
                "BSND (use SelfAttentionBnsdInputs for BNSD)", "BNSD");
  detail::sa_check_implemented(params);
  ATTNREF_CHECK(params.quant_type == P::QuantType::Unquant, std::invalid_argument, fn,
                "query/key/value", "not int8 with qkv full quantization",
                "int8 (SelfAttentionQuantInputs)", "floating-point data");
  const bool pa = params.calc_type == P::CalcType::PaEncoder;
  const bool prefix = params.calc_type == P::CalcType::PrefixEncoder;
  const bool bypass = params.kvcache_cfg == P::KvCacheCfg::KBypassVBypass;
  const bool mla = params.mla_v_head_size > 0;
  if (!(pa || prefix || bypass || kv_list)) {  // the new tokens are written into the caches
    for (const auto* c : {&out.key_cache, &out.value_cache})
      detail::check_out_overlaps(fn, c == &out.key_cache ? "key_cache" : "value_cache", *c, "query",
                                 in.query, "key", in.key, "value", in.value, "mask", in.mask,
                                 "log_n", in.log_n, "head_mask", in.head_mask, "slopes", in.slopes);
    ATTNREF_CHECK(!detail::overlaps(out.key_cache, out.value_cache), std::invalid_argument, fn,
                  "value_cache", "overlaps key_cache", "disjoint caches", "overlapping memory");
  }

  detail::SelfAttentionPlan<T> pl;
  pl.decoder = params.calc_type == P::CalcType::Decoder;
  pl.bottom_right = prefix;
  pl.log_n = &in.log_n;
  const std::vector<bool> active =
      detail::sa_sequences(params, in.seq_len, in.batch_run_status, -1, "");
  const std::vector<Index> cu = detail::sa_bsnd_front(pl, params, in, out);
  const Index tokens = in.query.size(0);
  ATTNREF_CHECK(pl.d <= 576 && pl.dv <= 576, std::invalid_argument, fn, "head size",
                "above ATB's limit", "<= 576", std::max(pl.d, pl.dv));
  std::vector<StridedView<const T, 4>> extra{detail::packed(in.query)};

  // K/V: new tokens (PA_ENCODER), paged caches (PREFIX_ENCODER), per-sequence tensors (kv
  // tensorlist) or one layer of the caches.
  const bool new_tokens = pa || (!bypass && !prefix);
  if (new_tokens) {
    const std::array<Index, 3> ks{tokens, pl.nkv, pl.d};
    ATTNREF_CHECK(in.key.shape() == ks, std::invalid_argument, fn, "key.shape", "mismatch",
                  detail::shape_str<3>(ks), detail::shape_str(in.key));
    detail::check_view(fn, "key", in.key);
    extra.push_back(detail::packed(in.key));
    if (!mla) {
      const std::array<Index, 3> vs{tokens, pl.nkv, pl.dv};
      ATTNREF_CHECK(in.value.shape() == vs, std::invalid_argument, fn, "value.shape", "mismatch",
                    detail::shape_str<3>(vs), detail::shape_str(in.value));
      detail::check_view(fn, "value", in.value);
      extra.push_back(detail::packed(in.value));
    }
  }
  detail::KvPages<T> list_pages;
  AttentionInputs<T>& e = pl.ein;
  e.q = detail::packed(in.query);
  e.seq.q_cu = cu;
  if (pa) {
    e.k = detail::packed(in.key);
    e.v = mla ? StridedView<const T, 4>(in.key.data(), {1, tokens, pl.nkv, pl.dv},
                                        {0, in.key.stride(0), in.key.stride(1), in.key.stride(2)})
              : detail::packed(in.value);
    e.seq.kv_cu = cu;
    pl.kv_len = in.seq_len;
  } else if (prefix) {
    ATTNREF_CHECK(!in.key.absent() && !in.value.absent(), std::invalid_argument, fn, "key/value",
                  "missing for PrefixEncoder", "the paged caches [numBlocks, blockSize, hidden]",
                  "none");
    ATTNREF_CHECK(in.key.size(2) == pl.nkv * pl.d, std::invalid_argument, fn, "key.shape[2]",
                  "mismatch (kvHeadNum * headSize)", pl.nkv * pl.d, in.key.size(2));
    ATTNREF_CHECK(in.value.size(0) == in.key.size(0) && in.value.size(1) == in.key.size(1) &&
                      in.value.size(2) == pl.nkv * pl.dv,
                  std::invalid_argument, fn, "value.shape", "mismatch",
                  "[" + std::to_string(in.key.size(0)) + ", " + std::to_string(in.key.size(1)) +
                      ", " + std::to_string(pl.nkv * pl.dv) + "]",
                  detail::shape_str(in.value));
    // ATB's PREFIX_ENCODER limits.
    for (Index hs : {pl.d, pl.dv})
      ATTNREF_CHECK(hs <= 128 && hs % 16 == 0, std::invalid_argument, fn, "head size",
                    "not supported by PrefixEncoder", "a multiple of 16, <= 128", hs);
    const Index block_elems =
        detail::checked_mul(fn, "key.shape[1] (blockSize) * headSize", in.key.size(1), pl.d);
    ATTNREF_CHECK(block_elems <= 128 * 128, std::invalid_argument, fn,
                  "key.shape[1] (blockSize) * headSize", "above PrefixEncoder's limit", "<= 16384",
                  block_elems);
    ATTNREF_CHECK(static_cast<Index>(in.kv_seq_len.size()) == pl.batch, std::invalid_argument, fn,
                  "kv_seq_len", "size mismatch", pl.batch, in.kv_seq_len.size());
    for (Index b = 0; b < pl.batch; ++b)
      ATTNREF_CHECK(in.kv_seq_len[static_cast<size_t>(b)] >= in.seq_len[static_cast<size_t>(b)],
                    std::invalid_argument, fn, "kv_seq_len[" + std::to_string(b) + "]",
                    "smaller than seq_len",
                    ">= " + std::to_string(in.seq_len[static_cast<size_t>(b)]),
                    in.kv_seq_len[static_cast<size_t>(b)]);
    ATTNREF_CHECK(!in.block_tables.absent(), std::invalid_argument, fn, "block_tables",
                  "missing for PrefixEncoder", "[batch, maxBlocks]", "none");
    // The paged caches under PrefixEncoder's names (the engine would name its own arguments).
    detail::check_block_table(
        fn, {"block_tables", "kv_seq_len", "key.shape[1] (blockSize)", "blockSize"},
        in.block_tables, in.kv_seq_len, in.key.size(0), in.key.size(1));
    e.k = detail::split_hidden(in.key, pl.nkv, pl.d);
    e.v = detail::split_hidden(in.value, pl.nkv, pl.dv);
    e.block_table = in.block_tables;
    e.seq.kv = in.kv_seq_len;
    pl.kv_len = in.kv_seq_len;
    extra.push_back(e.k);
    extra.push_back(e.v);
  } else if (kv_list) {
    ATTNREF_CHECK(static_cast<Index>(in.key_cache_list.size()) == pl.batch &&
                      static_cast<Index>(in.value_cache_list.size()) == pl.batch,
                  std::invalid_argument, fn, "key_cache_list/value_cache_list", "size mismatch",
                  pl.batch,
                  std::to_string(in.key_cache_list.size()) + " and " +
                      std::to_string(in.value_cache_list.size()));
    const auto& k0 = in.key_cache_list[0];
    const auto& v0 = in.value_cache_list[0];
    ATTNREF_CHECK(k0.size(1) == pl.nkv * pl.d, std::invalid_argument, fn,
                  "key_cache_list[0].shape[1]", "mismatch (kvHeadNum * headSize)", pl.nkv * pl.d,
                  k0.size(1));
    ATTNREF_CHECK(v0.size(0) == k0.size(0) && v0.size(1) == pl.nkv * pl.dv, std::invalid_argument,
                  fn, "value_cache_list[0].shape", "mismatch",
                  "[" + std::to_string(k0.size(0)) + ", " + std::to_string(pl.nkv * pl.dv) + "]",
                  detail::shape_str(v0));
    for (Index b = 0; b < pl.batch; ++b) {
      const auto& kb = in.key_cache_list[static_cast<size_t>(b)];
      const auto& vb = in.value_cache_list[static_cast<size_t>(b)];
      const std::string i = "[" + std::to_string(b) + "]";
      ATTNREF_CHECK(kb.shape() == k0.shape() && kb.strides() == k0.strides(), std::invalid_argument,
                    fn, "key_cache_list" + i, "shape or strides differ from entry 0",
                    detail::shape_str(k0), detail::shape_str(kb));
      ATTNREF_CHECK(vb.shape() == v0.shape() && vb.strides() == v0.strides(), std::invalid_argument,
                    fn, "value_cache_list" + i, "shape or strides differ from entry 0",
                    detail::shape_str(v0), detail::shape_str(vb));
      detail::check_view(fn, "key_cache_list" + i, kb);
      detail::check_view(fn, "value_cache_list" + i, vb);
      for (const auto* x : {&kb, &vb})
        extra.push_back(StridedView<const T, 4>(x->data(), {1, x->size(0), 1, x->size(1)},
                                                {0, x->stride(0), 0, x->stride(1)}));
      list_pages.k.push_back(kb.data());
      list_pages.v.push_back(vb.data());
      list_pages.first.push_back(b);
    }
    list_pages.page_size = std::max<Index>(1, k0.size(0));
    pl.kv_len = detail::sa_token_offsets(in.seq_len, in.token_offset, active, k0.size(0));
    // The engine sees entry 0's shape and strides for every sequence; its pages are the list.
    e.k = StridedView<const T, 4>(k0.data(), {pl.batch, k0.size(0), pl.nkv, pl.d},
                                  {0, k0.stride(0), pl.d * k0.stride(1), k0.stride(1)});
    e.v = StridedView<const T, 4>(v0.data(), {pl.batch, v0.size(0), pl.nkv, pl.dv},
                                  {0, v0.stride(0), pl.dv * v0.stride(1), v0.stride(1)});
    e.seq.kv = pl.kv_len;
    pl.pages = &list_pages;
  } else {
    const auto& kc = out.key_cache;
    const auto& vc = out.value_cache;
    const bool rolling = params.cache_type == P::CacheType::Swa;
    const Index window = params.window_size;
    ATTNREF_CHECK(!kc.absent() && !vc.absent(), std::invalid_argument, fn, "key_cache/value_cache",
                  "missing", "[layerNum, batch, maxSeqLen, hidden]", "none");
    ATTNREF_CHECK(kc.size(1) == pl.batch && kc.size(3) == pl.nkv * pl.d, std::invalid_argument, fn,
                  "key_cache.shape", "mismatch",
                  "[layerNum, " + std::to_string(pl.batch) + ", maxSeqLen, " +
                      std::to_string(pl.nkv * pl.d) + "]",
                  detail::shape_str(kc));
    ATTNREF_CHECK(vc.size(0) == kc.size(0) && vc.size(1) == pl.batch && vc.size(2) == kc.size(2) &&
                      vc.size(3) == pl.nkv * pl.dv,
                  std::invalid_argument, fn, "value_cache.shape", "mismatch",
                  "[" + std::to_string(kc.size(0)) + ", " + std::to_string(pl.batch) + ", " +
                      std::to_string(kc.size(2)) + ", " + std::to_string(pl.nkv * pl.dv) + "]",
                  detail::shape_str(vc));
    ATTNREF_CHECK(in.layer_id >= 0 && in.layer_id < kc.size(0), std::out_of_range, fn, "layer_id",
                  "out of range", "[0, " + std::to_string(kc.size(0)) + ")", in.layer_id);
    if (!rolling) {
      pl.kv_len = detail::sa_token_offsets(in.seq_len, in.token_offset, active, kc.size(2));
    } else {
      // Rolling SWA cache: min(window, tokenOffset) slots in use, tokenOffset itself unbounded.
      pl.kv_len = detail::sa_token_offsets(in.seq_len, in.token_offset, active,
                                           std::numeric_limits<Index>::max());
      for (Index b = 0; b < pl.batch; ++b) {
        const Index off = in.token_offset[static_cast<size_t>(b)];
        const std::string arg = "token_offset[" + std::to_string(b) + "]";
        ATTNREF_CHECK(std::min(window, off) <= kc.size(2), std::invalid_argument, fn,
                      "key_cache.shape[2]", "smaller than the rolling cache's slots in use",
                      ">= " + std::to_string(std::min(window, off)), kc.size(2));
        if (pl.decoder) {
          pl.kv_len[static_cast<size_t>(b)] = std::min(window, pl.kv_len[static_cast<size_t>(b)]);
        } else {
          // A prompt into a rolling cache: attention over the new tokens themselves.
          ATTNREF_CHECK(off == in.seq_len[static_cast<size_t>(b)] && !bypass, std::invalid_argument,
                        fn, arg, "not supported with cacheType SWA outside DECODER",
                        "== seq_len[" + std::to_string(b) + "] (a whole prompt), KCacheVCache",
                        off);
        }
      }
      pl.swa_rolling = pl.decoder;
    }
    e.k = detail::cache_layer(StridedView<const T, 4>(kc), in.layer_id, pl.nkv, pl.d);
    e.v = detail::cache_layer(StridedView<const T, 4>(vc), in.layer_id, pl.nkv, pl.dv);
    e.seq.kv = pl.kv_len;
    if (rolling && !pl.decoder) {
      e.k = detail::packed(in.key);
      e.v = detail::packed(in.value);
      e.seq.kv.clear();
      e.seq.kv_cu = cu;
    }
    extra.push_back(StridedView<const T, 4>(kc));
    extra.push_back(StridedView<const T, 4>(vc));
  }
  detail::sa_finish_lengths(pl);
  const std::array<Index, 3> out_shape{tokens, pl.nh, pl.dv};
  ATTNREF_CHECK(out.out.shape() == out_shape, std::invalid_argument, fn, "out.shape", "mismatch",
                detail::shape_str<3>(out_shape), detail::shape_str(out.out));
  pl.o = detail::packed(out.out);

  // Cache write: rows token_offset - seq_len + j of the layer, active sequences only (rolling
  // SWA cache: slot (token_offset - seq_len + j) % window, the last window tokens only).
  auto write_caches = [&] {
    if (pa || prefix || bypass || kv_list) return;
    const bool rolling = params.cache_type == P::CacheType::Swa;
    const Index window = params.window_size;
    for (Index b = 0; b < pl.batch; ++b) {
      if (!active[static_cast<size_t>(b)]) continue;
      const Index len = in.seq_len[static_cast<size_t>(b)];
      const Index first = in.token_offset[static_cast<size_t>(b)] - len;
      for (Index j = rolling ? std::max<Index>(0, len - window) : 0; j < len; ++j) {
        const Index t = cu[static_cast<size_t>(b)] + j;
        const Index row = rolling ? swa_cache_slot(first + j, window) : first + j;
        for (Index h = 0; h < pl.nkv; ++h) {
          for (Index x = 0; x < pl.d; ++x)
            out.key_cache(in.layer_id, b, row, h * pl.d + x) = in.key(t, h, x);
          for (Index x = 0; x < pl.dv; ++x)
            out.value_cache(in.layer_id, b, row, h * pl.dv + x) = in.value(t, h, x);
        }
      }
    }
  };
  detail::sa_run(params, pl, num_threads, extra, write_caches);
}

/// ATB SelfAttention with qkv full quantization (quantType QkvOffline / QkvOnline),
/// docs/semantics.md §2.8. Per sequence b, head h (kv head h / G), query i, key j:
///   s = fp16(fp16(int32(q_i · k_j) · qkDescale[h]) · fp16(qkScale)), clamp (fp16), + mask (fp16)
/// then the online softmax over blocks of params.quant_block_size keys (128) with P quantized to
/// int8 per block (attnref/atb/qkv_quant.hpp): online with the running row amax / 127, offline
/// with pScale[h]; P8 · V8 exact; dequantized by vpvDescale[h] times the P scale; out = O / l,
/// rounded to TO. The scores are fp16 whatever the output type and kernel type (the vendor's
/// golden); masks follow the usual encodings of TO (fp16 DEFAULT: additive; bf16 or
/// HIGH_PRECISION: binary x -3e38). MLA (mla_v_head_size > 0): V = the first mlaVHeadSize
/// elements of each K head, no value input. Head sizes: multiples of 32, <= 256 (<= 576 with
/// MLA). qScale must be 1 (fold it into qkDescale). Everything is checked before `out` is written.
template <class TO>
void self_attention(const SelfAttentionParams& params, const SelfAttentionQuantInputs<TO>& in,
                    const SelfAttentionOutputs<TO>& out, int num_threads = 0) {
  using P = SelfAttentionParams;
  static_assert(std::is_same_v<TO, half> || std::is_same_v<TO, bfloat16>,
                "qkv-quantized self_attention output: half or bfloat16");
  constexpr const char* fn = "self_attention";
  detail::check_views(fn, "query", in.query, "key", in.key, "value", in.value, "mask", in.mask,
                      "head_mask", in.head_mask, "slopes", in.slopes, "qk_descale", in.qk_descale,
                      "vpv_descale", in.vpv_descale, "p_scale", in.p_scale, "qk_offset",
                      in.qk_offset, "vpv_offset", in.vpv_offset, "out", out.out, "key_cache",
                      out.key_cache, "value_cache", out.value_cache);
  detail::check_out_overlaps(
      fn, "out", out.out, "query", in.query, "key", in.key, "value", in.value, "mask", in.mask,
      "head_mask", in.head_mask, "slopes", in.slopes, "qk_descale", in.qk_descale, "vpv_descale",
      in.vpv_descale, "p_scale", in.p_scale, "qk_offset", in.qk_offset, "vpv_offset", in.vpv_offset,
      "key_cache", out.key_cache, "value_cache", out.value_cache);
  validate(params);
  const bool online = params.quant_type == P::QuantType::QkvOnline;
  ATTNREF_CHECK(online || params.quant_type == P::QuantType::QkvOffline, std::invalid_argument, fn,
                "params.quant_type", "not a qkv quantization with int8 inputs",
                "QkvOffline or QkvOnline", static_cast<int>(params.quant_type));
  const P::OutDataType want_out =
      std::is_same_v<TO, half> ? P::OutDataType::Float16 : P::OutDataType::BFloat16;
  ATTNREF_CHECK(params.out_data_type == want_out, std::invalid_argument, fn, "params.out_data_type",
                "mismatch with the output type", static_cast<int>(want_out),
                static_cast<int>(params.out_data_type));
  detail::sa_check_implemented(params);
  const bool mla = params.mla_v_head_size > 0;

  detail::SelfAttentionPlan<TO, std::int8_t> pl;
  detail::sa_sequences(params, in.seq_len, {}, -1, "");
  const std::vector<Index> cu = detail::sa_bsnd_front(pl, params, in, out);
  const Index tokens = in.query.size(0);
  const Index max_head = mla ? 576 : 256;
  for (Index hs : {pl.d, pl.dv})
    ATTNREF_CHECK(hs > 0 && hs % 32 == 0 && hs <= max_head, std::invalid_argument, fn, "head size",
                  "not supported by qkv full quantization",
                  "a multiple of 32, <= " + std::to_string(max_head), hs);
  const std::array<Index, 3> ks{tokens, pl.nkv, pl.d};
  ATTNREF_CHECK(in.key.shape() == ks, std::invalid_argument, fn, "key.shape", "mismatch",
                detail::shape_str<3>(ks), detail::shape_str(in.key));
  detail::check_view(fn, "key", in.key);
  std::vector<StridedView<const std::int8_t, 4>> extra{detail::packed(in.query),
                                                       detail::packed(in.key)};
  if (!mla) {
    const std::array<Index, 3> vs{tokens, pl.nkv, pl.dv};
    ATTNREF_CHECK(in.value.shape() == vs, std::invalid_argument, fn, "value.shape", "mismatch",
                  detail::shape_str<3>(vs), detail::shape_str(in.value));
    detail::check_view(fn, "value", in.value);
    extra.push_back(detail::packed(in.value));
  }
  // Per-head scales.
  auto check_scale = [&](const StridedView<const float, 1>& s, const char* name, bool positive) {
    ATTNREF_CHECK(!s.absent(), std::invalid_argument, fn, name, "missing for qkv full quantization",
                  "[headNum] float", "none");
    ATTNREF_CHECK(s.size(0) == pl.nh, std::invalid_argument, fn, std::string(name) + ".shape[0]",
                  "mismatch with the number of heads", pl.nh, s.size(0));
    for (Index h = 0; h < pl.nh; ++h)
      ATTNREF_CHECK(std::isfinite(s(h)) && (!positive || s(h) > 0.0f), std::invalid_argument, fn,
                    std::string(name) + "[" + std::to_string(h) + "]",
                    positive ? "not a positive finite scale" : "not finite",
                    positive ? "> 0 and finite" : "finite", s(h));
  };
  check_scale(in.qk_descale, "qk_descale", false);
  check_scale(in.vpv_descale, "vpv_descale", false);
  if (online)
    ATTNREF_CHECK(in.p_scale.absent(), std::invalid_argument, fn, "p_scale",
                  "given with QkvOnline (the P scale comes from the data)", "absent",
                  detail::shape_str(in.p_scale));
  else
    check_scale(in.p_scale, "p_scale", true);

  AttentionInputs<std::int8_t>& e = pl.ein;
  e.q = detail::packed(in.query);
  e.k = detail::packed(in.key);
  e.v = mla ? StridedView<const std::int8_t, 4>(
                  in.key.data(), {1, tokens, pl.nkv, pl.dv},
                  {0, in.key.stride(0), in.key.stride(1), in.key.stride(2)})
            : detail::packed(in.value);
  e.seq.q_cu = cu;
  e.seq.kv_cu = cu;
  pl.kv_len = in.seq_len;
  detail::sa_finish_lengths(pl);
  const std::array<Index, 3> out_shape{tokens, pl.nh, pl.dv};
  ATTNREF_CHECK(out.out.shape() == out_shape, std::invalid_argument, fn, "out.shape", "mismatch",
                detail::shape_str<3>(out_shape), detail::shape_str(out.out));
  pl.o = detail::packed(out.out);

  detail::SaQuant quant;
  quant.qk_descale = in.qk_descale;
  quant.p_stage.mode = online ? QkvQuantPHook::Mode::Online : QkvQuantPHook::Mode::Offline;
  quant.p_stage.vpv_descale = in.vpv_descale;
  quant.p_stage.p_scale = in.p_scale;
  quant.block = params.quant_block_size;
  detail::sa_run(
      params, pl, num_threads, extra, [] {}, &quant);
}

/// ATB SelfAttention, inputLayout BNSD (docs/semantics.md §2.10): ENCODER / DECODER / UNDEFINED
/// with kv-bypass over BNSD caches, or PA_ENCODER over BNSD q / k / v. The output has the query's
/// layout; its rows past seq_len[b] (and the rows of inactive sequences) are set to 0.
template <class T>
void self_attention(const SelfAttentionParams& params, const SelfAttentionBnsdInputs<T>& in,
                    const SelfAttentionBnsdOutputs<T>& out, int num_threads = 0) {
  using P = SelfAttentionParams;
  detail::sa_check_type<T>();
  constexpr const char* fn = "self_attention";
  detail::check_views(fn, "query", in.query, "key", in.key, "value", in.value, "mask", in.mask,
                      "out", out.out, "key_cache", out.key_cache, "value_cache", out.value_cache);
  detail::check_out_overlaps(fn, "out", out.out, "query", in.query, "key", in.key, "value",
                             in.value, "mask", in.mask, "key_cache", out.key_cache, "value_cache",
                             out.value_cache);
  validate(params);
  ATTNREF_CHECK(params.input_layout == P::InputLayout::BNSD, std::invalid_argument, fn,
                "params.input_layout", "BSND with the BNSD inputs",
                "BNSD (use SelfAttentionInputs for BSND)", "BSND");
  detail::sa_check_implemented(params);
  const bool pa = params.calc_type == P::CalcType::PaEncoder;

  detail::SelfAttentionPlan<T> pl;
  pl.decoder = params.calc_type == P::CalcType::Decoder;
  pl.mask = &in.mask;
  pl.batch = in.query.size(0);
  pl.nh = in.query.size(1);
  pl.d = in.query.size(3);
  pl.nkv = params.num_kv_heads > 0 ? params.num_kv_heads : params.num_heads;
  pl.dv = out.out.size(3);
  const Index S = in.query.size(2);
  ATTNREF_CHECK(pl.nh == params.num_heads, std::invalid_argument, fn, "query.shape[1]",
                "mismatch with params.num_heads", params.num_heads, pl.nh);
  ATTNREF_CHECK(static_cast<Index>(in.seq_len.size()) == pl.batch, std::invalid_argument, fn,
                "seq_len", "size mismatch with query.shape[0]", pl.batch, in.seq_len.size());
  const std::vector<bool> active =
      detail::sa_sequences(params, in.seq_len, in.batch_run_status, S, "query.shape[2]");
  ATTNREF_CHECK(pl.d <= 256 && pl.dv <= 256, std::invalid_argument, fn, "head size",
                "above ATB's BNSD limit", "<= 256", std::max(pl.d, pl.dv));
  pl.q_len = in.seq_len;
  std::vector<StridedView<const T, 4>> extra{in.query};
  AttentionInputs<T>& e = pl.ein;
  e.q = detail::bnsd_to_engine(in.query);
  e.seq.q = in.seq_len;
  if (pa) {
    const std::array<Index, 4> ks{pl.batch, pl.nkv, S, pl.d}, vs{pl.batch, pl.nkv, S, pl.dv};
    ATTNREF_CHECK(in.key.shape() == ks, std::invalid_argument, fn, "key.shape", "mismatch",
                  detail::shape_str<4>(ks), detail::shape_str(in.key));
    ATTNREF_CHECK(in.value.shape() == vs, std::invalid_argument, fn, "value.shape", "mismatch",
                  detail::shape_str<4>(vs), detail::shape_str(in.value));
    detail::check_view(fn, "key", in.key);
    detail::check_view(fn, "value", in.value);
    e.k = detail::bnsd_to_engine(in.key);
    e.v = detail::bnsd_to_engine(in.value);
    pl.kv_len = in.seq_len;
    extra.push_back(in.key);
    extra.push_back(in.value);
  } else {
    const auto& kc = out.key_cache;
    const auto& vc = out.value_cache;
    ATTNREF_CHECK(!kc.absent() && !vc.absent(), std::invalid_argument, fn, "key_cache/value_cache",
                  "missing", "[layerNum, batch, kvHeadNum, maxSeqLen, headSize]", "none");
    ATTNREF_CHECK(kc.size(1) == pl.batch && kc.size(2) == pl.nkv && kc.size(4) == pl.d,
                  std::invalid_argument, fn, "key_cache.shape", "mismatch",
                  "[layerNum, " + std::to_string(pl.batch) + ", " + std::to_string(pl.nkv) +
                      ", maxSeqLen, " + std::to_string(pl.d) + "]",
                  detail::shape_str(kc));
    ATTNREF_CHECK(vc.size(0) == kc.size(0) && vc.size(1) == pl.batch && vc.size(2) == pl.nkv &&
                      vc.size(3) == kc.size(3) && vc.size(4) == pl.dv,
                  std::invalid_argument, fn, "value_cache.shape", "mismatch",
                  "[" + std::to_string(kc.size(0)) + ", " + std::to_string(pl.batch) + ", " +
                      std::to_string(pl.nkv) + ", " + std::to_string(kc.size(3)) + ", " +
                      std::to_string(pl.dv) + "]",
                  detail::shape_str(vc));
    ATTNREF_CHECK(in.layer_id >= 0 && in.layer_id < kc.size(0), std::out_of_range, fn, "layer_id",
                  "out of range", "[0, " + std::to_string(kc.size(0)) + ")", in.layer_id);
    pl.kv_len = detail::sa_token_offsets(in.seq_len, in.token_offset, active, kc.size(3));
    e.k = detail::bnsd_cache_layer(kc, in.layer_id);
    e.v = detail::bnsd_cache_layer(vc, in.layer_id);
    extra.push_back(e.k);
    extra.push_back(e.v);
  }
  e.seq.kv = pl.kv_len;
  detail::sa_finish_lengths(pl);
  const std::array<Index, 4> out_shape{pl.batch, pl.nh, S, pl.dv};
  ATTNREF_CHECK(out.out.shape() == out_shape, std::invalid_argument, fn, "out.shape", "mismatch",
                detail::shape_str<4>(out_shape), detail::shape_str(out.out));
  pl.o = detail::bnsd_to_engine(out.out);
  auto zero_padding = [&] {
    for (Index b = 0; b < pl.batch; ++b)
      for (Index h = 0; h < pl.nh; ++h)
        for (Index i = in.seq_len[static_cast<size_t>(b)]; i < S; ++i)
          for (Index x = 0; x < pl.dv; ++x) out.out(b, h, i, x) = T(0.0f);
  };
  detail::sa_run(params, pl, num_threads, extra, zero_padding);
}

}  // namespace attnref
