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
#include "attnref/detail/hooks/io.hpp"
#include "attnref/detail/hooks/quant_p.hpp"
#include "attnref/detail/simd.hpp"

namespace attnref {

namespace detail {

/// The engine hooks of PagedAttention, in fp32: the qkv-quant score scaling, logN and the
/// masks (NORM rows or square, SPEC, ALIBI; additive, or binary x -3e38 on the MLA multi-token
/// kernel), razor attention's pairs and razor offset;
/// qScale and the dequant fold through the shared query / output hooks (IoHooks).
template <class TM>
struct AtbPagedVariant : IoHooks {
  StridedView<const TM, 3> mask;       // NORM
  bool square = false;                 // NORM mask [1, maxSeq, maxSeq]: row kv_len - q_len + i
  StridedView<const TM, 2> spec_mask;  // SPEC: [numTokens, maxSeq]
  float mask_factor = 1.0f;            // NORM / SPEC: 1 (additive) or -3e38 (binary, MLA SPEC)
  StridedView<const TM, 4> alibi;
  StridedView<const float, 1> log_n;
  StridedView<const float, 1> head_scale;  // qkv quant: k_descale[h], then · qk_scale
  float qk_scale = 1.0f;
  const std::vector<Index>* q_cu = nullptr;  // first packed token of every sequence
  // compressType: sequence b is the pair (token b / compress, kv head b % compress), whose
  // pair_heads query heads are the real heads g · pair_heads + i; 0: off.
  Index compress = 0, pair_heads = 1;
  // KVHEAD_ROPE: s = (q·k + razor[block of key j][j % blockSize]) · razor_scale (the engine's
  // scale is 1), the block read through the pair's row of the block table.
  StridedView<const float, 2> razor;
  StridedView<const std::int32_t, 2> table;
  float razor_scale = 1.0f;

  bool has_transform() const {
    return !mask.absent() || !spec_mask.absent() || !alibi.absent() || !log_n.absent() ||
           !head_scale.absent() || !razor.absent();
  }
  KvRange kv_range(const SeqInfo& s, Index, Index) const { return {0, s.kv_len}; }
  TileMask classify(const SeqInfo&, Index, Index, Index, Index) const { return TileMask::None; }
  bool masked(const SeqInfo&, const Coord&) const { return false; }
  template <class Acc>
  Acc transform(const SeqInfo& si, const Coord& c, Acc score) const {
    float s = static_cast<float>(score);  // q · k (· qkScale unless qkv quant)
    const Index token = (*q_cu)[static_cast<size_t>(c.batch)] + c.q;
    // The mask row and the real query head (compressType: the pair's token and head).
    const Index mb = compress > 0 ? c.batch / compress : c.batch;
    const Index head = compress > 0 ? (c.batch % compress) * pair_heads + c.q_head : c.q_head;
    if (!razor.absent()) {
      const Index bs = razor.size(1);
      s = (s + razor(table(c.batch, c.kv / bs), c.kv % bs)) * razor_scale;
    }
    if (!head_scale.absent()) s = s * head_scale(c.q_head) * qk_scale;
    if (!log_n.absent()) s *= log_n(c.batch);
    if (!mask.absent()) {
      if (square)
        s += static_cast<float>(mask(0, si.kv_len - si.q_len + c.q, c.kv)) * mask_factor;
      else
        s += static_cast<float>(mask(mask.size(0) == 1 ? 0 : mb, 0, c.kv)) * mask_factor;
    }
    if (!spec_mask.absent()) s += static_cast<float>(spec_mask(token, c.kv)) * mask_factor;
    if (!alibi.absent()) s += static_cast<float>(alibi(alibi.size(0) == 1 ? 0 : mb, head, 0, c.kv));
    return static_cast<Acc>(s);
  }
};

/// qkv quantization (quantType 2 / 3): P quantized block by block, PQuantStep's PagedAttention
/// form (the golden `softmax_quant_numpy`).
template <class TM>
struct AtbPagedQuantVariant : AtbPagedVariant<TM>, PQuantStep {};
}  // namespace detail

}  // namespace attnref
