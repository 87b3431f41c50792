#pragma once
/// The parameters, inputs and outputs of CANN PromptFlashAttention
/// (attnref::prompt_flash_attention, cann/prompt_flash_attention.hpp), and where pseShift enters
/// the score (PseOrder, shared with IncreFlashAttention): the vendor's tensors under their names,
/// as views.

#include <cstdint>
#include <string>
#include <vector>

#include "attnref/core/types.hpp"
#include "attnref/core/view.hpp"

namespace attnref {

/// Where pseShift enters the score. The kernels compute QKᵀ·scale + pse; the design documents
/// write (QKᵀ + pse)·scale.
enum class PseOrder { ScaleThenAdd, AddThenScale };

struct PromptFlashAttentionParams {
  std::int64_t num_heads = 1;                   ///< numHeads (query heads)
  double scale_value = 1.0;                     ///< scaleValue (the caller passes 1/sqrt(D))
  std::int64_t pre_tokens = 2147483647;         ///< preTokens
  std::int64_t next_tokens = 0;                 ///< nextTokens
  std::string input_layout = "BSH";             ///< BSH, BSND, BNSD, BNSD_BSND, TND
  std::int64_t num_key_value_heads = 0;         ///< numKeyValueHeads (0: num_heads)
  std::int64_t sparse_mode = 0;                 ///< 0–4
  std::int64_t inner_precise = 1;               ///< 0–3; bit 1: fully masked rows give 0
  PseOrder pse_order = PseOrder::ScaleThenAdd;  ///< attnref extension (see PseOrder)
  /// attnref extension: keys per block of the int8 path's quantized P (the NPU's block follows
  /// its tiling; P8 is taken against the running row max, so the block size changes the bits).
  /// [1, 1024].
  int quant_block_size = 128;
};

namespace detail {
template <class T>
struct pfa_pse {
  using type = T;
};
template <>
struct pfa_pse<std::int8_t> {
  using type = half;
};
}  // namespace detail

/// T: half or bfloat16 (float: attnref extension), or int8 (the quantized path). TM: bool, int8
/// or uint8 (nonzero = masked). TP: the pse type (T; half with int8 data).
template <class T, class TM = std::uint8_t, class TP = typename detail::pfa_pse<T>::type>
struct PromptFlashAttentionInputs {
  StridedView<const T>
      query;  ///< BSH [B, S1, N·D], BSND [B, S1, N, D], BNSD(_BSND) [B, N, S1, D], TND [T1, N, D]
  StridedView<const T> key;            ///< the same layout with S2 and numKeyValueHeads
  StridedView<const T> value;          ///< as key, head size Dv (may differ from D)
  StridedView<const TP> pse_shift{};   ///< [B or 1, N, >= S1, >= S2]
  StridedView<const TM> atten_mask{};  ///< [S1', S2'], [B|1, S1', S2'], [B|1, 1, S1', S2']
  std::vector<std::int64_t> actual_seq_lengths{};     ///< per batch (TND: cumulative); empty: S1
  std::vector<std::int64_t> actual_seq_lengths_kv{};  ///< per batch (TND: cumulative); empty: S2
  /// int8 q / k / v: per-tensor [1] fp32 scales (scale_from_bits converts the uint64 form):
  /// S = int32(q·k)·deq_scale1, P8 = sat(rint(P̂·quant_scale1)), O += deq_scale2·(P8·V8).
  StridedView<const float> deq_scale1{};
  StridedView<const float> quant_scale1{};
  StridedView<const float> deq_scale2{};
  /// int8 output: out = sat(rint(O·quant_scale2 + quant_offset2)), per tensor [1] or per channel
  /// (N·Dv values, any shape with that many elements); the offset is optional.
  StridedView<const float> quant_scale2{};
  StridedView<const float> quant_offset2{};

  /// Calls f(name, view) for every tensor field.
  template <class F>
  void for_each_view(F&& f) {
    f("query", query), f("key", key), f("value", value), f("pse_shift", pse_shift);
    f("atten_mask", atten_mask), f("deq_scale1", deq_scale1), f("quant_scale1", quant_scale1);
    f("deq_scale2", deq_scale2), f("quant_scale2", quant_scale2);
    f("quant_offset2", quant_offset2);
  }
};

template <class T>
struct PromptFlashAttentionOutputs {
  StridedView<T> attention_out;  ///< query's layout (BNSD_BSND: BSND) with head size Dv

  template <class F>
  void for_each_view(F&& f) {
    f("attention_out", attention_out);
  }
};

}  // namespace attnref
