#pragma once
/// The engine hooks of ATB PagedAttention (attnref::paged_attention, atb/paged_attention.hpp):
/// the unquantized / dequant variant and the qkv-quant variant with its P quantization. Not part
/// of the API.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "attnref/attention/variant.hpp"
#include "attnref/core/types.hpp"
#include "attnref/core/view.hpp"
#include "attnref/detail/simd.hpp"

namespace attnref {

namespace detail {

/// The engine hooks of PagedAttention, in fp32: the qkv-quant score scaling, the dequant K-offset
/// term, logN and the additive masks (NORM rows or square, SPEC, ALIBI).
template <class TM>
struct AtbPagedVariant {
  StridedView<const TM, 3> mask;       // NORM
  bool square = false;                 // NORM mask [1, maxSeq, maxSeq]: row kv_len - q_len + i
  StridedView<const TM, 2> spec_mask;  // SPEC: [numTokens, maxSeq]
  StridedView<const TM, 4> alibi;
  StridedView<const float, 1> log_n;
  StridedView<const float, 1> head_scale;  // qkv quant: k_descale[h], then · qk_scale
  float qk_scale = 1.0f;
  const float* row_bias = nullptr;           // dequant: qk_scale · q'·k_offset per (token, head)
  const std::vector<Index>* q_cu = nullptr;  // first packed token of every sequence
  Index num_heads = 0;

  bool has_transform() const {
    return !mask.absent() || !spec_mask.absent() || !alibi.absent() || !log_n.absent() ||
           !head_scale.absent() || row_bias != nullptr;
  }
  KvRange kv_range(const SeqInfo& s, Index, Index) const { return {0, s.kv_len}; }
  TileMask classify(const SeqInfo&, Index, Index, Index, Index) const { return TileMask::None; }
  bool masked(const SeqInfo&, const Coord&) const { return false; }
  template <class Acc>
  Acc transform(const SeqInfo& si, const Coord& c, Acc score) const {
    float s = static_cast<float>(score);  // q · k (· qkScale unless qkv quant)
    const Index token = (*q_cu)[static_cast<size_t>(c.batch)] + c.q;
    if (!head_scale.absent()) s = s * head_scale(c.q_head) * qk_scale;
    if (row_bias != nullptr) s += row_bias[token * num_heads + c.q_head];
    if (!log_n.absent()) s *= log_n(c.batch);
    if (!mask.absent()) {
      if (square)
        s += static_cast<float>(mask(0, si.kv_len - si.q_len + c.q, c.kv));
      else
        s += static_cast<float>(mask(mask.size(0) == 1 ? 0 : c.batch, 0, c.kv));
    }
    if (!spec_mask.absent()) s += static_cast<float>(spec_mask(token, c.kv));
    if (!alibi.absent())
      s += static_cast<float>(alibi(alibi.size(0) == 1 ? 0 : c.batch, c.q_head, 0, c.kv));
    return static_cast<Acc>(s);
  }
};

/// qkv quantization (quantType 2 / 3): P quantized block by block (golden
/// `softmax_quant_numpy`). Online: P8 = rint(fp16(P̂ / (bmax / 127))) with bmax the block's
/// largest P̂, factor v_descale[h] · bmax / 127; offline: P8 = rint(fp16(P̂ · p_scale[h])),
/// factor v_descale[h]. The denominator takes the unrounded P̂.
template <class TM>
struct AtbPagedQuantVariant : AtbPagedVariant<TM> {
  StridedView<const float, 1> v_descale;  // [headNum]
  StridedView<const float, 1> p_scale;    // [headNum], offline
  bool online = true;

  template <class Acc>
  Acc quantize_p(const Coord& c, Acc* row, Index cols, Acc&, Acc& sum) const {
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
}  // namespace detail

}  // namespace attnref
