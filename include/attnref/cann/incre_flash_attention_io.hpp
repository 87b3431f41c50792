#pragma once
/// The parameters, inputs and outputs of CANN IncreFlashAttention (attnref::incre_flash_attention,
/// cann/incre_flash_attention.hpp): the vendor's tensors under their names, as views.

#include <cstdint>
#include <string>
#include <vector>

#include "attnref/cann/prompt_flash_attention_io.hpp"  // PseOrder
#include "attnref/core/types.hpp"
#include "attnref/core/view.hpp"

namespace attnref {

struct IncreFlashAttentionParams {
  std::int64_t num_heads = 1;            ///< numHeads
  double scale_value = 1.0;              ///< scaleValue
  std::string input_layout = "BSH";      ///< BSH, BSND, BNSD
  std::int64_t num_key_value_heads = 0;  ///< 0: num_heads
  std::int64_t block_size = 0;           ///< paged KV (with block_table)
  std::int64_t inner_precise = 1;        ///< 0 or 1 (no row-invalid fix in IFA)
  PseOrder pse_order = PseOrder::ScaleThenAdd;
  /// FusedInferAttentionScore's antiquantMode: 0 per channel / per tensor (antiquant_scale),
  /// 1 per token (antiquant_scale_per_token).
  std::int64_t antiquant_mode = 0;
};

/// T: half or bfloat16 (float: attnref extension); TKV: T, or int8 with antiquant; TM: bool,
/// int8 or uint8.
template <class T, class TKV = T, class TM = std::uint8_t>
struct IncreFlashAttentionInputs {
  StridedView<const T> query;  ///< BSH [B, 1, H], BSND [B, 1, N, D], BNSD [B, N, 1, D]
  /// One tensor with batch B, or B tensors with batch 1 (layout of the query, S = kv length);
  /// paged: one cache tensor [blockNum, blockSize, KV_N·D] (or [blockNum, KV_N, blockSize, D]
  /// with BNSD).
  std::vector<StridedView<const TKV>> key;
  std::vector<StridedView<const TKV>> value;
  StridedView<const T> pse_shift{};                ///< [B or 1, N, 1, >= S]
  StridedView<const TM> atten_mask{};              ///< [B, S'], [B, 1, S'], [B, 1, 1, S']
  std::vector<std::int64_t> actual_seq_lengths{};  ///< kv lengths per batch (required if paged)
  StridedView<const T>
      antiquant_scale{};  ///< int8 K/V: (2, N, 1, D), (2, 1, N, D), (2, N, D), (2, N·D), (2)
  StridedView<const T> antiquant_offset{};  ///< optional, same shape
  /// antiquant_mode 1: (2, B, S') fp32, [0][b][p] the scale of key position p of batch b,
  /// [1][b][p] its value's; S' covers every position read. The offset is optional.
  StridedView<const float> antiquant_scale_per_token{};
  StridedView<const float> antiquant_offset_per_token{};
  /// kv left padding: one int64 (shape [] or [1]); needs one contiguous key / value tensor and
  /// actual_seq_lengths.
  StridedView<const std::int64_t> kv_padding_size{};
  StridedView<const std::int32_t> block_table{};  ///< [B, maxBlocksPerSeq]
  /// int8 output: out = sat(rint(O·quant_scale2 + quant_offset2)), per tensor or per channel
  /// (N·D values); the offset is optional.
  StridedView<const float> quant_scale2{};
  StridedView<const float> quant_offset2{};

  /// Calls f(name, view) for every tensor field (key[i], value[i] for the lists).
  template <class F>
  void for_each_view(F&& f) {
    f("query", query);
    for (size_t i = 0; i < key.size(); ++i) f("key[" + std::to_string(i) + "]", key[i]);
    for (size_t i = 0; i < value.size(); ++i) f("value[" + std::to_string(i) + "]", value[i]);
    f("pse_shift", pse_shift), f("atten_mask", atten_mask);
    f("antiquant_scale", antiquant_scale), f("antiquant_offset", antiquant_offset);
    f("antiquant_scale_per_token", antiquant_scale_per_token);
    f("antiquant_offset_per_token", antiquant_offset_per_token);
    f("kv_padding_size", kv_padding_size), f("block_table", block_table);
    f("quant_scale2", quant_scale2), f("quant_offset2", quant_offset2);
  }
};

template <class T>
struct IncreFlashAttentionOutputs {
  StridedView<T> attention_out;  ///< the query's shape

  template <class F>
  void for_each_view(F&& f) {
    f("attention_out", attention_out);
  }
};

}  // namespace attnref
