#pragma once
/// ATB PagedAttentionOperation parameters (atb::infer::PagedAttentionParam), field for field,
/// with the vendor's enum values, and the checks of the parameters alone (docs/semantics.md §3).

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "attnref/core/error.hpp"

namespace attnref {

struct PagedAttentionParams {
  /// ATB MaskType.
  enum class MaskType : int {
    Undefined = 0,    ///< UNDEFINED: no mask
    Norm = 1,         ///< MASK_TYPE_NORM
    Alibi = 2,        ///< MASK_TYPE_ALIBI
    Spec = 3,         ///< MASK_TYPE_SPEC: parallel decoding
    MaskFree = 4,     ///< MASK_TYPE_MASK_FREE: fp16, Atlas 300I Duo (310P) only
    NormCompress = 5  ///< MASK_TYPE_NORM_COMPRESS: Atlas 300I Duo (310P) only
  };
  /// ATB QuantType (TYPE_QUANT_UNDEFINED and TYPE_QUANT_UNQUANT are both 0).
  enum class QuantType : int {
    Unquant = 0,        ///< no quantization
    DequantFusion = 1,  ///< TYPE_DEQUANT_FUSION: int8 K/V caches dequantized per channel
    QkvOffline = 2,     ///< TYPE_QUANT_QKV_OFFLINE
    QkvOnline = 3       ///< TYPE_QUANT_QKV_ONLINE
  };
  /// ATB outDataType (the values PagedAttention accepts).
  enum class OutDataType : int { Undefined = -1, Float16 = 1, BFloat16 = 27 };
  /// ATB CompressType.
  enum class CompressType : int {
    Undefined = 0,  ///< COMPRESS_TYPE_UNDEFINED
    KvHead = 1,     ///< COMPRESS_TYPE_KVHEAD (razor attention)
    KvHeadRope = 2  ///< COMPRESS_TYPE_KVHEAD_ROPE
  };
  /// ATB CalcType.
  enum class CalcType : int {
    Undefined = 0,  ///< CALC_TYPE_UNDEFINED: one query token per sequence
    Spec = 1        ///< CALC_TYPE_SPEC: several query tokens per sequence (parallel decoding)
  };
  /// ATB ScaleType.
  enum class ScaleType : int {
    Tor = 0,  ///< SCALE_TYPE_TOR
    LogN = 1  ///< SCALE_TYPE_LOGN: one logN value per sequence
  };
  /// ATB InputLayout.
  enum class InputLayout : int { BSND = 0, BNSD = 1 };

  int num_heads = 0;      ///< headNum
  float qk_scale = 1.0f;  ///< qkScale ("tor")
  int num_kv_heads = 0;   ///< kvHeadNum (0: same as num_heads)
  MaskType mask_type = MaskType::Undefined;
  bool batch_run_status_enable = false;  ///< batchRunStatusEnable
  QuantType quant_type = QuantType::Unquant;
  OutDataType out_data_type = OutDataType::Undefined;
  bool has_quant_offset = false;  ///< hasQuantOffset
  CompressType compress_type = CompressType::Undefined;
  CalcType calc_type = CalcType::Undefined;
  ScaleType scale_type = ScaleType::Tor;
  InputLayout input_layout = InputLayout::BSND;
  std::uint32_t mla_v_head_size = 0;  ///< mlaVHeadSize, [0, 576]
  float q_scale = 0.0f;               ///< qScale: 0 or 1 leave q unchanged
  /// attnref extension (not an ATB field): keys per block of the qkv-quantized P (quantType 2
  /// and 3). The NPU's block follows its tiling (the cache block size, or 256 / 512 for long
  /// contexts); the quantized result depends on it. [1, 1024].
  int quant_block_size = 128;
};

/// Checks the parameters alone: enum ranges, head counts, finite scales, mlaVHeadSize in
/// [0, 576], and the documented constraint between them (scaleType LOGN excludes quantType 2
/// and 3). Shapes, dtypes and the per-feature rules that need the inputs are the operator's.
inline void validate(const PagedAttentionParams& p) {
  using P = PagedAttentionParams;
  detail::check_enum("paged_attention", "params.mask_type", p.mask_type, 0, 5);
  detail::check_enum("paged_attention", "params.quant_type", p.quant_type, 0, 3);
  detail::check_enum("paged_attention", "params.compress_type", p.compress_type, 0, 2);
  detail::check_enum("paged_attention", "params.calc_type", p.calc_type, 0, 1);
  detail::check_enum("paged_attention", "params.scale_type", p.scale_type, 0, 1);
  detail::check_enum("paged_attention", "params.input_layout", p.input_layout, 0, 1);
  const int od = static_cast<int>(p.out_data_type);
  ATTNREF_CHECK(od == -1 || od == 1 || od == 27, std::invalid_argument, "paged_attention",
                "params.out_data_type", "not supported",
                "Undefined (-1), Float16 (1) or BFloat16 (27)", std::to_string(od));
  ATTNREF_CHECK(p.num_heads > 0, std::invalid_argument, "paged_attention", "params.num_heads",
                "not positive", ">= 1", std::to_string(p.num_heads));
  ATTNREF_CHECK(p.num_kv_heads >= 0, std::invalid_argument, "paged_attention",
                "params.num_kv_heads", "negative", ">= 0", std::to_string(p.num_kv_heads));
  if (p.num_kv_heads > 0)
    ATTNREF_CHECK(p.num_heads % p.num_kv_heads == 0, std::invalid_argument, "paged_attention",
                  "params.num_heads", "not a multiple of num_kv_heads",
                  "a multiple of " + std::to_string(p.num_kv_heads), std::to_string(p.num_heads));
  ATTNREF_CHECK(std::isfinite(p.qk_scale), std::invalid_argument, "paged_attention",
                "params.qk_scale", "not finite", "a finite value", std::to_string(p.qk_scale));
  ATTNREF_CHECK(std::isfinite(p.q_scale), std::invalid_argument, "paged_attention",
                "params.q_scale", "not finite", "a finite value", std::to_string(p.q_scale));
  ATTNREF_CHECK(p.mla_v_head_size <= 576, std::invalid_argument, "paged_attention",
                "params.mla_v_head_size", "out of range", "[0, 576]",
                std::to_string(p.mla_v_head_size));
  ATTNREF_CHECK(p.quant_block_size >= 1 && p.quant_block_size <= 1024, std::invalid_argument,
                "paged_attention", "params.quant_block_size", "out of range", "[1, 1024]",
                std::to_string(p.quant_block_size));
  const bool qkv =
      p.quant_type == P::QuantType::QkvOffline || p.quant_type == P::QuantType::QkvOnline;
  if (p.scale_type == P::ScaleType::LogN)
    ATTNREF_CHECK(!qkv, std::invalid_argument, "paged_attention", "params.scale_type",
                  "LogN not supported with qkv quantization", "Tor with quant_type 2 or 3", "LogN");
}

}  // namespace attnref
