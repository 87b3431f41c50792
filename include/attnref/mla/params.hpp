#pragma once
/// Parameters of the MLA (Multi-head Latent Attention) pieces: the model dimensions and ATB's
/// MlaPreprocessParam (docs/semantics.md §5).

#include <cstdint>

#include "attnref/core/types.hpp"

namespace attnref {

/// RmsNormQuant's quantization (ATB MlaPreprocessParam::QuantMode, same values).
enum class MlaQuantMode : std::uint16_t {
  PerTensorAsymm = 0,  ///< PER_TENSOR_QUANT_ASYMM: static scale and int8 offset
  PerTokenSymm = 1,    ///< PER_TOKEN_QUANT_SYMM: dynamic 127 / max|y| per token
  PerTokenAsymm = 2,   ///< PER_TOKEN_QUANT_ASYMM: attnref's choice (min/max, fp32 zero point)
  Unquant = 3,         ///< UNQUANT: no quantization, floating-point matmuls
};

/// The KV cache written by MlaPreprocess (ATB MlaPreprocessParam::CacheMode, same values).
enum class MlaCacheMode : std::uint8_t {
  KvCache = 0,      ///< KVCACHE: one ND cache [blocks, blockSize, 1, C + R]
  KRopeCtkv = 1,    ///< KROPE_CTKV: ND ctkv [.., 1, C] and krope [.., 1, R]
  Int8NzCache = 2,  ///< INT8_NZCACHE: int8 NZ ctkv (C0 32), NZ krope (C0 16), int8 q_nope out
  NzCache = 3,      ///< NZCACHE: NZ ctkv and krope (C0 16)
};

/// Model dimensions, DeepSeek-V3 defaults. wdqkv has kv_lora_rank + rope_dim + q_lora_rank rows
/// (2112); wuq has heads · (nope_dim + rope_dim) rows (heads × 192); wuk is [heads, nope_dim,
/// kv_lora_rank]; the cache row is kv_lora_rank + rope_dim (576) wide.
struct MlaDims {
  Index hidden_size = 7168;  ///< H0, the input's width
  Index kv_lora_rank = 512;  ///< C, the latent KV width (ATB: the 512 of 576)
  Index rope_dim = 64;       ///< R, qRopeDim = kRopeDim
  Index q_lora_rank = 1536;  ///< Q, the latent query width (ATB wdqDim)
  Index nope_dim = 128;      ///< P, the per-head query width before absorption
};

/// ATB MlaPreprocessParam. The three dims must be 0 (ATB's only accepted value: the fixed
/// DeepSeek dims) or equal to `dims`' values; the rotary coefficients must be 2 (rotate half).
struct MlaPreprocessParams {
  MlaDims dims{};
  std::uint32_t wdq_dim = 0;     ///< wdqDim (0 or dims.q_lora_rank)
  std::uint32_t q_rope_dim = 0;  ///< qRopeDim (0 or dims.rope_dim)
  std::uint32_t k_rope_dim = 0;  ///< kRopeDim (0 or dims.rope_dim)
  float epsilon = 1e-5f;
  std::int32_t q_rotary_coeff = 2;
  std::int32_t k_rotary_coeff = 2;
  bool transpose_wdq =
      true;  ///< true: wdqkv is [out, in] (ATB's only accepted value); false: [in, out]
  bool transpose_wuq = true;  ///< as transpose_wdq for wuq
  bool transpose_wuk = true;  ///< ATB accepts true only; attnref: wuk is [heads, P, C] either way
  MlaCacheMode cache_mode = MlaCacheMode::KvCache;
  MlaQuantMode quant_mode = MlaQuantMode::PerTensorAsymm;
};

}  // namespace attnref
