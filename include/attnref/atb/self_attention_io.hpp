#pragma once
/// The inputs and outputs of attnref::self_attention (ATB SelfAttentionOperation): the BSND
/// inputs, the qkv-quantized (int8) inputs, the BNSD inputs and their outputs. Shapes and
/// meanings: attnref/atb/self_attention.hpp and docs/self_attention.md.

#include <cstdint>
#include <vector>

#include "attnref/core/types.hpp"
#include "attnref/core/view.hpp"

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

}  // namespace attnref
