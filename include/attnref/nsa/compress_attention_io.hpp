#pragma once
/// The parameters, inputs and outputs of CANN aclnnNsaCompressAttentionInfer
/// (attnref::nsa_compress_attention_infer, nsa/compress_attention.hpp): the vendor's tensors
/// under their names, as views.

#include <cstdint>
#include <string>
#include <vector>

#include "attnref/core/types.hpp"
#include "attnref/core/view.hpp"

namespace attnref {

struct NsaCompressAttentionInferParams {
  std::int64_t num_heads = 1;               ///< numHeads (N)
  std::int64_t num_key_value_heads = 1;     ///< numKeyValueHeads (KV_N)
  std::int64_t select_block_size = 64;      ///< selectBlockSize l'
  std::int64_t select_block_count = 16;     ///< selectBlockCount k
  std::int64_t compress_block_size = 32;    ///< compressBlockSize l
  std::int64_t compress_block_stride = 16;  ///< compressBlockStride d
  double scale_value = 1.0;                 ///< scaleValue
  std::string layout = "TND";               ///< layoutOptional: TND or BSND
  std::int64_t page_block_size = 128;       ///< pageBlockSize
  std::int64_t sparse_mode = 0;             ///< sparseMode (0; the mask's presence is the flag)
  bool strict = true;                       ///< the vendor's constraint list (false: relaxed)
};

/// T: half or bfloat16 (float: attnref extension). The mask's content is not read: its
/// presence turns on the multi-token rule (as the kernel's attenMaskFlag).
template <class T>
struct NsaCompressAttentionInferInputs {
  StridedView<const T> query{};  ///< TND [T, N, Dqk] or BSND [B, S, N, Dqk]
  StridedView<const T> key{};    ///< [numBlocks, pageBlockSize, KV_N·Dqk] (compressed keys)
  StridedView<const T> value{};  ///< [numBlocks, pageBlockSize, KV_N·Dv]
  StridedView<const std::uint8_t> atten_mask{};
  StridedView<const std::int32_t> block_table{};      ///< [B, maxBlocks]
  std::vector<std::int64_t> actual_q_seq_len{};       ///< [B] per batch (empty: 1 each / S)
  std::vector<std::int64_t> actual_cmp_kv_seq_len{};  ///< [B] compressed lengths (required)
  std::vector<std::int64_t> actual_sel_kv_seq_len{};  ///< [B] raw lengths (multi-token mask)

  /// Calls f(name, view) for every tensor field.
  template <class F>
  void for_each_view(F&& f) {
    f("query", query), f("key", key), f("value", value), f("atten_mask", atten_mask);
    f("block_table", block_table);
  }
};

template <class T>
struct NsaCompressAttentionInferOutputs {
  StridedView<T> output;           ///< TND [T, N, Dv] or BSND [B, S, N, Dv]
  StridedView<std::int32_t> topk;  ///< TND [T, KV_N, k] or BSND [B, S, KV_N, k]
  /// Optional debug outputs (fp32): the probabilities [T, N, >= max cmp_len] (BSND: [B, S, N,
  /// ...]); the per-head scores [T, N, >= max n_sel]; the group scores with the forced blocks
  /// [T, KV_N, >= max n_sel]. Entries past a row's length are 0.
  StridedView<float> probs{};
  StridedView<float> head_scores{};
  StridedView<float> group_scores{};

  /// Calls f(name, view) for every tensor field.
  template <class F>
  void for_each_view(F&& f) {
    f("output", output), f("topk", topk), f("probs", probs), f("head_scores", head_scores);
    f("group_scores", group_scores);
  }
};

}  // namespace attnref
