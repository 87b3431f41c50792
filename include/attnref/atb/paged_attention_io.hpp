#pragma once
/// The inputs and outputs of ATB PagedAttention (attnref::paged_attention,
/// atb/paged_attention.hpp): the vendor's tensors under their names, as views.

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/core/types.hpp"
#include "attnref/core/view.hpp"

namespace attnref {

namespace detail {
template <class TQ>
struct pa_mask {
  using type = TQ;
};
template <>
struct pa_mask<std::int8_t> {
  using type = half;
};
}  // namespace detail

/// The inputs of PagedAttention. TQ: query type (half, bfloat16, float; int8 with qkv
/// quantization); TKV: cache type (TQ, or int8 with dequant fusion); TM: mask type (TQ, or the
/// output type with qkv quantization: half by default).
///
/// "Sequence" below is one entry of context_lens: a request, or with compressType KVHEAD /
/// KVHEAD_ROPE one (query token t, kv head g) pair b = t · kvHeadNum + g. A sequence whose
/// context length is 0 takes no query row and no output row: the rows are packed over the
/// sequences with keys (ATB's kernel; see atb/paged_attention.hpp).
template <class TQ, class TKV = TQ, class TM = typename detail::pa_mask<TQ>::type>
struct PagedAttentionInputs {
  StridedView<const TQ, 3> query;  ///< [numTokens, headNum, headSize]
  /// [numBlocks, blockSize, kvHeadNum, headSize]; inputLayout BNSD: [numBlocks, kvHeadNum,
  /// blockSize, headSize]; compressType: kvHeadNum extent 1.
  StridedView<const TKV, 4> key_cache;
  /// [numBlocks, blockSize, kvHeadNum, headSizeV]; BNSD: [numBlocks, kvHeadNum, blockSize,
  /// headSize] (headSizeV = headSize); compressType: kvHeadNum extent 1.
  StridedView<const TKV, 4> value_cache;
  StridedView<const std::int32_t, 2> block_tables;  ///< [batch, maxBlocksPerSeq]
  std::vector<Index> context_lens;  ///< [batch]; compressType: [numTokens · kvHeadNum]
  /// calcType SPEC: query tokens of each sequence [batch] (token i of sequence b is query
  /// position context_lens[b] - q_seq_lens[b] + i; a sequence with context 0 takes none, whatever
  /// its entry says). Empty: one each.
  std::vector<Index> q_seq_lens{};
  /// NORM: [batch or 1, 1, maxSeq] (one row per sequence; one query token each), or the square
  /// [1, maxSeq, maxSeq] (ATB's [maxSeq, maxSeq]: query i of sequence b reads row
  /// context_lens[b] - q_seq_lens[b] + i). compressType KVHEAD: [numTokens or 1, 1, maxSeq], row
  /// = query token.
  StridedView<const TM, 3> mask{};
  StridedView<const TM, 2> spec_mask{};  ///< SPEC: [numTokens, maxSeq], row = query token
  /// ALIBI: [batch or 1, headNum, 1, maxSeq]; compressType KVHEAD: [numTokens or 1, headNum, 1,
  /// maxSeq], indexed by query token and query head.
  StridedView<const TM, 4> alibi_mask{};
  StridedView<const float, 1> log_n{};           ///< LOGN: [batch]
  std::vector<std::int32_t> batch_run_status{};  ///< batchRunStatus [batch], 0 or 1
  /// quantType DEQUANT_FUSION: per channel [kvHeadNum * headSize(V)]; qkv quantization: per
  /// query head [headNum]. fp32 values (core/quant.hpp converts ATB's int64 bit patterns).
  StridedView<const float, 1> k_descale{};
  StridedView<const float, 1> v_descale{};
  /// DEQUANT_FUSION with hasQuantOffset: per channel, added before scaling.
  StridedView<const std::int32_t, 1> k_offset{};
  StridedView<const std::int32_t, 1> v_offset{};
  StridedView<const float, 1> p_scale{};  ///< QKV_OFFLINE: [headNum], P8 = rint(P * p_scale)
  /// compressType KVHEAD_ROPE (razorOffset): [numBlocks, blockSize], one value per cache slot,
  /// added to q·k before qkScale for every head of the pair.
  StridedView<const float, 2> razor_offset{};
};

template <class TO>
struct PagedAttentionOutputs {
  StridedView<TO, 3> out;  ///< [numTokens, headNum, headSizeV]
};

namespace detail {

template <class T>
inline std::string pa_len(const StridedView<T, 1>& v) {
  return v.absent() ? std::string("none") : "[" + std::to_string(v.size(0)) + "]";
}

template <class T>
inline constexpr bool pa_float_v =
    std::is_same_v<T, half> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float>;

}  // namespace detail

}  // namespace attnref
