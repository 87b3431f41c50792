#pragma once
/// ATB SelfAttentionOperation parameters (atb::infer::SelfAttentionParam), the features they
/// enable and the vendor's co-existence table of those features.
///
/// Field and enum names map 1:1 to ATB (camelCase -> snake_case, UPPER_CASE -> PascalCase); the
/// numeric values of every enum are ATB's, so `static_cast` from the vendor values works. The
/// mapping table is in the README ("ATB SelfAttention").

#include <array>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnref/core/error.hpp"

namespace attnref {

struct SelfAttentionParams {
  /// ATB CalcType.
  enum class CalcType : int {
    Undefined = 0,     ///< UNDEFINED: encoder and decoder with the KV cache (flash attention)
    Encoder = 1,       ///< ENCODER: full (prefill) stage, KV cache written then read
    Decoder = 2,       ///< DECODER: incremental stage, one query token per batch
    PaEncoder = 3,     ///< PA_ENCODER: packed tokens, no cache (prefill of paged attention)
    PrefixEncoder = 4  ///< PREFIX_ENCODER: prefill over a paged prefix cache, bottom-right causal
  };
  /// ATB KernelType.
  enum class KernelType : int {
    Default = 0,       ///< KERNELTYPE_DEFAULT: fp16 scores (fp16 data)
    HighPrecision = 1  ///< KERNELTYPE_HIGH_PRECISION: fp32 scores and softmax
  };
  /// ATB ClampType.
  enum class ClampType : int {
    Undefined = 0,  ///< CLAMP_TYPE_UNDEFINED
    MinMax = 1      ///< CLAMP_TYPE_MIN_MAX: clamp the scaled score to [clamp_min, clamp_max]
  };
  /// ATB MaskType.
  enum class MaskType : int {
    Undefined = 0,               ///< MASK_TYPE_UNDEFINED: no mask
    Norm = 1,                    ///< MASK_TYPE_NORM
    Alibi = 2,                   ///< MASK_TYPE_ALIBI
    NormCompress = 3,            ///< MASK_TYPE_NORM_COMPRESS
    AlibiCompress = 4,           ///< MASK_TYPE_ALIBI_COMPRESS
    AlibiCompressSqrt = 5,       ///< MASK_TYPE_ALIBI_COMPRESS_SQRT
    AlibiCompressLeftAlign = 6,  ///< MASK_TYPE_ALIBI_COMPRESS_LEFT_ALIGN
    SlidingWindowNorm = 7,       ///< MASK_TYPE_SLIDING_WINDOW_NORM
    SlidingWindowCompress = 8,   ///< MASK_TYPE_SLIDING_WINDOW_COMPRESS
    CausalMask = 9               ///< MASK_TYPE_CAUSAL_MASK: generated internally
  };
  /// ATB KvCacheCfg.
  enum class KvCacheCfg : int {
    KCacheVCache = 0,   ///< K_CACHE_V_CACHE: new k/v written into the caches
    KBypassVBypass = 1  ///< K_BYPASS_V_BYPASS: caches used as given, nothing written
  };
  /// ATB ScaleType.
  enum class ScaleType : int {
    Tor = 0,  ///< SCALE_TYPE_TOR: scores times qk_scale
    LogN = 1  ///< SCALE_TYPE_LOGN: scores also times the logN input
  };
  /// ATB QuantType.
  enum class QuantType : int {
    Unquant = 0,        ///< TYPE_QUANT_UNQUANT (= TYPE_QUANT_UNDEFINED)
    DequantFusion = 1,  ///< TYPE_DEQUANT_FUSION: reserved by ATB, rejected
    QkvOffline = 2,     ///< TYPE_QUANT_QKV_OFFLINE
    QkvOnline = 3       ///< TYPE_QUANT_QKV_ONLINE
  };
  /// ATB outDataType (an aclDataType; only the values SelfAttention accepts).
  enum class OutDataType : int {
    Undefined = -1,  ///< ACL_DT_UNDEFINED
    Float16 = 1,     ///< ACL_FLOAT16
    BFloat16 = 27    ///< ACL_BF16
  };
  /// ATB InputLayout.
  enum class InputLayout : int {
    BSND = 0,  ///< TYPE_BSND
    BNSD = 1   ///< TYPE_BNSD
  };
  /// ATB CacheType.
  enum class CacheType : int {
    Norm = 0,  ///< CACHE_TYPE_NORM
    Swa = 1    ///< CACHE_TYPE_SWA: rolling cache of window_size slots
  };

  int num_heads = 0;                     ///< headNum
  int num_kv_heads = 0;                  ///< kvHeadNum (0: same as num_heads)
  float q_scale = 1.0f;                  ///< qScale: multiplies q
  float qk_scale = 1.0f;                 ///< qkScale ("tor"): multiplies q·k
  bool batch_run_status_enable = false;  ///< batchRunStatusEnable
  std::uint32_t is_triu_mask = 0;        ///< isTriuMask
  CalcType calc_type = CalcType::Undefined;
  KernelType kernel_type = KernelType::Default;
  ClampType clamp_type = ClampType::Undefined;
  float clamp_min = 0.0f;  ///< clampMin
  float clamp_max = 0.0f;  ///< clampMax
  MaskType mask_type = MaskType::Undefined;
  KvCacheCfg kvcache_cfg = KvCacheCfg::KCacheVCache;
  ScaleType scale_type = ScaleType::Tor;
  QuantType quant_type = QuantType::Unquant;
  OutDataType out_data_type = OutDataType::Undefined;
  InputLayout input_layout = InputLayout::BSND;
  std::int64_t mla_v_head_size = 0;  ///< mlaVHeadSize, [0, 576]
  CacheType cache_type = CacheType::Norm;
  std::int64_t window_size = 0;  ///< windowSize (> 0 enables sliding-window attention)
  /// attnref extension (no ATB field): keys per block of the qkv-quantized path's online
  /// softmax, whose P is quantized block by block (the NPU kernel's 128), in [1, 1024].
  std::int64_t quant_block_size = 128;
};

/// The features of the vendor's co-existence table, in its order.
enum class SelfAttentionFeature : int {
  BatchRun = 0,   ///< batchRunStatus (batch_run_status_enable)
  EncDec,         ///< encoder/decoder split (calc_type Encoder or Decoder)
  HighPrecision,  ///< kernel_type HighPrecision
  Clamp,          ///< clamp_type MinMax
  CompressMask,   ///< is_triu_mask, or a *Compress mask type
  KvBypass,       ///< kvcache_cfg KBypassVBypass
  LogN,           ///< scale_type LogN
  QkvQuant,       ///< quant_type QkvOffline / QkvOnline
  BNSD,           ///< input_layout BNSD
  KvTensorList,   ///< caches passed as one tensor per batch
  Mla,            ///< mla_v_head_size > 0
  Swa,            ///< window_size > 0 (sliding-window attention)
};
inline constexpr int kNumSelfAttentionFeatures = 12;

inline const char* to_string(SelfAttentionFeature f) {
  static constexpr const char* kNames[kNumSelfAttentionFeatures] = {
      "batchRunStatus", "encoder/decoder split", "high precision",
      "clamp",          "compressed mask",       "kv-bypass",
      "logN scaling",   "qkv full quantization", "BNSD input",
      "kv tensorlist",  "MLA merged kv cache",   "SWA"};
  return kNames[static_cast<int>(f)];
}

/// The vendor's co-existence table (symmetric): true = the two features combine.
inline bool self_attention_features_combine(SelfAttentionFeature a, SelfAttentionFeature b) {
  // Rows / columns in SelfAttentionFeature order; 1 = Y, 0 = N (the diagonal is unused).
  static constexpr std::array<std::array<unsigned char, kNumSelfAttentionFeatures>,
                              kNumSelfAttentionFeatures>
      kTable = {{
          // bR eD hP cl cM kB lN qQ BN kL ML SW
          {{1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 0, 0}},  // batchRun
          {{1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 0, 1}},  // enc/dec
          {{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0}},  // highPrec
          {{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0}},  // clamp
          {{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1}},  // cmpMask
          {{1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 0, 1}},  // kvBypass
          {{1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0}},  // logN
          {{0, 0, 1, 1, 1, 0, 0, 1, 0, 0, 1, 0}},  // qkvQuant
          {{1, 1, 1, 1, 1, 1, 0, 0, 1, 0, 0, 0}},  // BNSD
          {{1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 0, 0}},  // kvList
          {{0, 0, 1, 1, 0, 0, 0, 1, 0, 0, 1, 0}},  // MLA
          {{0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0, 1}},  // SWA
      }};
  return kTable[static_cast<size_t>(a)][static_cast<size_t>(b)] != 0;
}

/// True for the ALiBi mask types.
inline bool is_alibi(SelfAttentionParams::MaskType m) {
  using M = SelfAttentionParams::MaskType;
  return m == M::Alibi || m == M::AlibiCompress || m == M::AlibiCompressSqrt ||
         m == M::AlibiCompressLeftAlign;
}

/// True for the compressed mask types.
inline bool is_compressed(SelfAttentionParams::MaskType m) {
  using M = SelfAttentionParams::MaskType;
  return m == M::NormCompress || m == M::AlibiCompress || m == M::AlibiCompressSqrt ||
         m == M::AlibiCompressLeftAlign || m == M::SlidingWindowCompress;
}

/// The features `p` enables (kv_tensor_list: the caches come as one tensor per batch).
inline std::vector<SelfAttentionFeature> self_attention_features(const SelfAttentionParams& p,
                                                                 bool kv_tensor_list) {
  using P = SelfAttentionParams;
  using F = SelfAttentionFeature;
  std::vector<F> f;
  if (p.batch_run_status_enable) f.push_back(F::BatchRun);
  if (p.calc_type == P::CalcType::Encoder || p.calc_type == P::CalcType::Decoder)
    f.push_back(F::EncDec);
  if (p.kernel_type == P::KernelType::HighPrecision) f.push_back(F::HighPrecision);
  if (p.clamp_type == P::ClampType::MinMax) f.push_back(F::Clamp);
  if (p.is_triu_mask != 0 || is_compressed(p.mask_type)) f.push_back(F::CompressMask);
  if (p.kvcache_cfg == P::KvCacheCfg::KBypassVBypass) f.push_back(F::KvBypass);
  if (p.scale_type == P::ScaleType::LogN) f.push_back(F::LogN);
  if (p.quant_type == P::QuantType::QkvOffline || p.quant_type == P::QuantType::QkvOnline)
    f.push_back(F::QkvQuant);
  if (p.input_layout == P::InputLayout::BNSD) f.push_back(F::BNSD);
  if (kv_tensor_list) f.push_back(F::KvTensorList);
  if (p.mla_v_head_size > 0) f.push_back(F::Mla);
  if (p.window_size > 0) f.push_back(F::Swa);
  return f;
}

namespace detail {

/// The enums, head counts, scales, clamp interval and sizes of SelfAttentionParams.
inline void sa_check_ranges(const SelfAttentionParams& p) {
  using P = SelfAttentionParams;
  check_enum("self_attention", "params.calc_type", p.calc_type, 0, 4);
  check_enum("self_attention", "params.kernel_type", p.kernel_type, 0, 1);
  check_enum("self_attention", "params.clamp_type", p.clamp_type, 0, 1);
  check_enum("self_attention", "params.mask_type", p.mask_type, 0, 9);
  check_enum("self_attention", "params.kvcache_cfg", p.kvcache_cfg, 0, 1);
  check_enum("self_attention", "params.scale_type", p.scale_type, 0, 1);
  check_enum("self_attention", "params.quant_type", p.quant_type, 0, 3);
  check_enum("self_attention", "params.input_layout", p.input_layout, 0, 1);
  check_enum("self_attention", "params.cache_type", p.cache_type, 0, 1);
  const int od = static_cast<int>(p.out_data_type);
  ATTNREF_CHECK(od == -1 || od == 1 || od == 27, std::invalid_argument, "self_attention",
                "params.out_data_type", "not supported",
                "Undefined (-1), Float16 (1) or BFloat16 (27)", std::to_string(od));
  ATTNREF_CHECK(p.num_heads > 0, std::invalid_argument, "self_attention", "params.num_heads",
                "not positive", ">= 1", std::to_string(p.num_heads));
  ATTNREF_CHECK(p.num_kv_heads >= 0, std::invalid_argument, "self_attention", "params.num_kv_heads",
                "negative", ">= 0", std::to_string(p.num_kv_heads));
  if (p.num_kv_heads > 0)
    ATTNREF_CHECK(p.num_heads % p.num_kv_heads == 0, std::invalid_argument, "self_attention",
                  "params.num_heads", "not a multiple of num_kv_heads",
                  "a multiple of " + std::to_string(p.num_kv_heads), std::to_string(p.num_heads));
  ATTNREF_CHECK(std::isfinite(p.q_scale), std::invalid_argument, "self_attention", "params.q_scale",
                "not finite", "a finite value", std::to_string(p.q_scale));
  ATTNREF_CHECK(std::isfinite(p.qk_scale), std::invalid_argument, "self_attention",
                "params.qk_scale", "not finite", "a finite value", std::to_string(p.qk_scale));
  if (p.clamp_type == P::ClampType::MinMax)
    ATTNREF_CHECK(
        std::isfinite(p.clamp_min) && std::isfinite(p.clamp_max) && p.clamp_min <= p.clamp_max,
        std::invalid_argument, "self_attention", "params.clamp_min/clamp_max", "not an interval",
        "finite clamp_min <= clamp_max",
        std::to_string(p.clamp_min) + " and " + std::to_string(p.clamp_max));
  ATTNREF_CHECK(p.quant_type != P::QuantType::DequantFusion, std::invalid_argument,
                "self_attention", "params.quant_type", "reserved by ATB (TYPE_DEQUANT_FUSION)",
                "Unquant, QkvOffline or QkvOnline", "DequantFusion");
  ATTNREF_CHECK(p.mla_v_head_size >= 0 && p.mla_v_head_size <= 576, std::invalid_argument,
                "self_attention", "params.mla_v_head_size", "out of range", "[0, 576]",
                std::to_string(p.mla_v_head_size));
  ATTNREF_CHECK(p.window_size >= 0, std::invalid_argument, "self_attention", "params.window_size",
                "negative", ">= 0", std::to_string(p.window_size));
}

/// The vendor's per-feature constraints (calc types, masks, logN, quantization).
inline void sa_check_features(const SelfAttentionParams& p) {
  using P = SelfAttentionParams;
  const bool pa = p.calc_type == P::CalcType::PaEncoder;
  const char* calc_names[] = {"Undefined", "Encoder", "Decoder", "PaEncoder", "PrefixEncoder"};
  const std::string calc = calc_names[static_cast<int>(p.calc_type)];
  if (p.batch_run_status_enable)
    ATTNREF_CHECK(!pa, std::invalid_argument, "self_attention", "params.calc_type",
                  "not supported with batchRunStatus", "not PaEncoder", calc);
  if (p.kvcache_cfg == P::KvCacheCfg::KBypassVBypass)
    ATTNREF_CHECK(!pa, std::invalid_argument, "self_attention", "params.calc_type",
                  "not supported with kv-bypass", "not PaEncoder", calc);
  if (p.mask_type == P::MaskType::AlibiCompress || p.mask_type == P::MaskType::AlibiCompressSqrt ||
      p.mask_type == P::MaskType::AlibiCompressLeftAlign)
    ATTNREF_CHECK(pa || p.calc_type == P::CalcType::PrefixEncoder, std::invalid_argument,
                  "self_attention", "params.calc_type",
                  "not supported with a compressed ALiBi mask", "PaEncoder or PrefixEncoder", calc);
  if (p.scale_type == P::ScaleType::LogN) {
    ATTNREF_CHECK(p.calc_type == P::CalcType::Decoder || pa, std::invalid_argument,
                  "self_attention", "params.calc_type", "not supported with logN scaling",
                  "Decoder or PaEncoder", calc);
    if (pa)
      ATTNREF_CHECK(p.kernel_type == P::KernelType::HighPrecision, std::invalid_argument,
                    "self_attention", "params.kernel_type",
                    "must be HighPrecision for logN scaling with PaEncoder", "HighPrecision",
                    "Default");
  }
  if (p.quant_type == P::QuantType::QkvOffline || p.quant_type == P::QuantType::QkvOnline) {
    ATTNREF_CHECK(pa, std::invalid_argument, "self_attention", "params.calc_type",
                  "not supported with qkv full quantization", "PaEncoder", calc);
    ATTNREF_CHECK(p.out_data_type != P::OutDataType::Undefined, std::invalid_argument,
                  "self_attention", "params.out_data_type", "required by qkv full quantization",
                  "Float16 or BFloat16", "Undefined");
    ATTNREF_CHECK(p.quant_block_size >= 1 && p.quant_block_size <= 1024, std::invalid_argument,
                  "self_attention", "params.quant_block_size", "out of range", "[1, 1024]",
                  std::to_string(p.quant_block_size));
    ATTNREF_CHECK(
        p.q_scale == 1.0f, std::invalid_argument, "self_attention", "params.q_scale",
        "not supported with qkv full quantization (q is int8: fold qScale into qk_descale)", "1",
        std::to_string(p.q_scale));
  }
  if (p.mask_type == P::MaskType::Undefined)
    ATTNREF_CHECK(p.is_triu_mask == 0, std::invalid_argument, "self_attention",
                  "params.is_triu_mask", "set without a mask type", "0", "1");
}

/// The vendor's per-feature constraints (layouts, PREFIX_ENCODER, the kv tensor list, MLA,
/// sliding windows and their caches).
inline void sa_check_layout_features(const SelfAttentionParams& p, bool kv_tensor_list) {
  using P = SelfAttentionParams;
  const bool pa = p.calc_type == P::CalcType::PaEncoder;
  const char* calc_names[] = {"Undefined", "Encoder", "Decoder", "PaEncoder", "PrefixEncoder"};
  const std::string calc = calc_names[static_cast<int>(p.calc_type)];
  if (p.input_layout == P::InputLayout::BNSD) {
    ATTNREF_CHECK(p.calc_type != P::CalcType::PrefixEncoder, std::invalid_argument,
                  "self_attention", "params.calc_type", "not supported with BNSD input",
                  "not PrefixEncoder", calc);
    if (pa) {
      // ATB's operation accepts BNSD PA_ENCODER (the feature list only names the bypass form):
      // no mask, default kernel.
      ATTNREF_CHECK(p.mask_type == P::MaskType::Undefined, std::invalid_argument, "self_attention",
                    "params.mask_type", "must be Undefined for BNSD input with PaEncoder",
                    "Undefined", std::to_string(static_cast<int>(p.mask_type)));
      ATTNREF_CHECK(p.kernel_type == P::KernelType::Default, std::invalid_argument,
                    "self_attention", "params.kernel_type",
                    "must be Default for BNSD input with PaEncoder", "Default", "HighPrecision");
    } else {
      ATTNREF_CHECK(p.kvcache_cfg == P::KvCacheCfg::KBypassVBypass, std::invalid_argument,
                    "self_attention", "params.kvcache_cfg", "must be KBypassVBypass for BNSD input",
                    "KBypassVBypass", "KCacheVCache");
      ATTNREF_CHECK(p.mask_type != P::MaskType::Undefined, std::invalid_argument, "self_attention",
                    "params.mask_type", "must be set for BNSD input", "not Undefined", "Undefined");
    }
  }
  if (p.calc_type == P::CalcType::PrefixEncoder) {
    // ATB's PREFIX_ENCODER parameter checks.
    const P::MaskType m = p.mask_type;
    ATTNREF_CHECK(m == P::MaskType::NormCompress || m == P::MaskType::CausalMask ||
                      m == P::MaskType::AlibiCompress || m == P::MaskType::AlibiCompressSqrt,
                  std::invalid_argument, "self_attention", "params.mask_type",
                  "not supported by PrefixEncoder",
                  "NormCompress, CausalMask, AlibiCompress or AlibiCompressSqrt",
                  std::to_string(static_cast<int>(m)));
    ATTNREF_CHECK(p.is_triu_mask == 1, std::invalid_argument, "self_attention",
                  "params.is_triu_mask", "must be 1 for PrefixEncoder", "1",
                  std::to_string(p.is_triu_mask));
    ATTNREF_CHECK(p.kernel_type == P::KernelType::HighPrecision, std::invalid_argument,
                  "self_attention", "params.kernel_type", "must be HighPrecision for PrefixEncoder",
                  "HighPrecision", "Default");
    ATTNREF_CHECK(p.q_scale == 1.0f, std::invalid_argument, "self_attention", "params.q_scale",
                  "must be 1 for PrefixEncoder", "1", std::to_string(p.q_scale));
    ATTNREF_CHECK(p.clamp_type == P::ClampType::Undefined, std::invalid_argument, "self_attention",
                  "params.clamp_type", "not supported by PrefixEncoder", "Undefined", "MinMax");
    ATTNREF_CHECK(p.kvcache_cfg == P::KvCacheCfg::KCacheVCache, std::invalid_argument,
                  "self_attention", "params.kvcache_cfg", "not supported by PrefixEncoder",
                  "KCacheVCache", "KBypassVBypass");
    ATTNREF_CHECK(p.scale_type == P::ScaleType::Tor, std::invalid_argument, "self_attention",
                  "params.scale_type", "not supported by PrefixEncoder", "Tor", "LogN");
    ATTNREF_CHECK(p.cache_type == P::CacheType::Norm, std::invalid_argument, "self_attention",
                  "params.cache_type", "not supported by PrefixEncoder", "Norm", "Swa");
    ATTNREF_CHECK(
        p.quant_type == P::QuantType::Unquant && p.out_data_type == P::OutDataType::Undefined,
        std::invalid_argument, "self_attention", "params.quant_type/out_data_type",
        "not supported by PrefixEncoder", "Unquant and Undefined", "a quantized configuration");
    ATTNREF_CHECK(p.window_size == 0, std::invalid_argument, "self_attention", "params.window_size",
                  "not supported by PrefixEncoder", "0", std::to_string(p.window_size));
    ATTNREF_CHECK(p.mla_v_head_size == 0, std::invalid_argument, "self_attention",
                  "params.mla_v_head_size", "not supported by PrefixEncoder", "0",
                  std::to_string(p.mla_v_head_size));
    ATTNREF_CHECK(!p.batch_run_status_enable, std::invalid_argument, "self_attention",
                  "params.batch_run_status_enable", "not supported by PrefixEncoder", "false",
                  "true");
  }
  if (kv_tensor_list) {
    ATTNREF_CHECK(p.kvcache_cfg == P::KvCacheCfg::KBypassVBypass, std::invalid_argument,
                  "self_attention", "params.kvcache_cfg",
                  "must be KBypassVBypass for kv tensorlist input", "KBypassVBypass",
                  "KCacheVCache");
    ATTNREF_CHECK(p.calc_type == P::CalcType::Decoder, std::invalid_argument, "self_attention",
                  "params.calc_type", "must be Decoder for kv tensorlist input", "Decoder", calc);
  }
  if (p.mla_v_head_size > 0) {
    ATTNREF_CHECK(pa, std::invalid_argument, "self_attention", "params.calc_type",
                  "not supported with the MLA merged kv cache", "PaEncoder", calc);
    ATTNREF_CHECK(!is_alibi(p.mask_type), std::invalid_argument, "self_attention",
                  "params.mask_type", "ALiBi not supported with the MLA merged kv cache",
                  "not an ALiBi mask", "ALiBi");
    ATTNREF_CHECK(p.mask_type == P::MaskType::Undefined || p.mask_type == P::MaskType::Norm ||
                      p.mask_type == P::MaskType::SlidingWindowNorm ||
                      p.mask_type == P::MaskType::SlidingWindowCompress,
                  std::invalid_argument, "self_attention", "params.mask_type",
                  "not supported with the MLA merged kv cache",
                  "Undefined, Norm, SlidingWindowNorm or SlidingWindowCompress",
                  std::to_string(static_cast<int>(p.mask_type)));
  }
  const bool swa_mask = p.mask_type == P::MaskType::SlidingWindowNorm ||
                        p.mask_type == P::MaskType::SlidingWindowCompress;
  if (p.window_size > 0)
    ATTNREF_CHECK(swa_mask, std::invalid_argument, "self_attention", "params.mask_type",
                  "must be a sliding-window mask when window_size > 0",
                  "SlidingWindowNorm or SlidingWindowCompress",
                  std::to_string(static_cast<int>(p.mask_type)));
  if (swa_mask)
    ATTNREF_CHECK(p.window_size > 0, std::invalid_argument, "self_attention", "params.window_size",
                  "must be positive with a sliding-window mask", "> 0",
                  std::to_string(p.window_size));
  if (p.cache_type == P::CacheType::Swa)
    ATTNREF_CHECK(p.window_size > 0, std::invalid_argument, "self_attention", "params.cache_type",
                  "Swa needs sliding-window attention", "window_size > 0",
                  std::to_string(p.window_size));
  if (p.window_size > 0 && p.calc_type == P::CalcType::Decoder)
    ATTNREF_CHECK(p.mask_type != P::MaskType::SlidingWindowCompress, std::invalid_argument,
                  "self_attention", "params.mask_type",
                  "SlidingWindowCompress not supported by the decoder", "SlidingWindowNorm",
                  "SlidingWindowCompress");
}

}  // namespace detail

/// Checks the parameters alone: ranges, the co-existence table (every conflicting pair throws
/// std::invalid_argument naming both features) and the per-feature constraints of the vendor's
/// feature list. Shapes and dtypes of the inputs are checked by the operator.
inline void validate(const SelfAttentionParams& p, bool kv_tensor_list = false) {
  detail::sa_check_ranges(p);
  // The co-existence table.
  const std::vector<SelfAttentionFeature> f = self_attention_features(p, kv_tensor_list);
  for (size_t i = 0; i < f.size(); ++i)
    for (size_t j = i + 1; j < f.size(); ++j)
      ATTNREF_CHECK(self_attention_features_combine(f[i], f[j]), std::invalid_argument,
                    "self_attention",
                    std::string("params ") + to_string(f[i]) + " + " + to_string(f[j]),
                    "not supported together", "at most one of them", "both");

  // Per-feature constraints.
  detail::sa_check_features(p);
  detail::sa_check_layout_features(p, kv_tensor_list);
}

}  // namespace attnref
