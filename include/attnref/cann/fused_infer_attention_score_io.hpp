#pragma once
/// The parameters, inputs and outputs of CANN FusedInferAttentionScore
/// (attnref::fused_infer_attention_score, cann/fused_infer_attention_score.hpp): the vendor's
/// tensors under their names, as views.

#include <cstdint>
#include <string>
#include <vector>

#include "attnref/cann/prompt_flash_attention_io.hpp"
#include "attnref/core/types.hpp"
#include "attnref/core/view.hpp"

namespace attnref {

/// The scalar attributes (aclnn names in snake case; defaults those of the operator's IR and
/// torch_npu except inner_precise, whose IR default 1 is kept).
struct FusedInferAttentionScoreParams {
  std::int64_t num_heads = 1;             ///< numHeads
  double scale_value = 1.0;               ///< scaleValue
  std::int64_t pre_tokens = 2147483647;   ///< preTokens (prompt branch)
  std::int64_t next_tokens = 2147483647;  ///< nextTokens (prompt branch)
  /// BSH, BSND, BNSD, BNSD_BSND (Q_S > 1), TND, NTD_TND (inputs [N, T, D], outputs TND's; not
  /// MLA); MLA also BSH_NBSD, BSND_NBSD, BNSD_NBSD and TND_NTD (the output head-major:
  /// [N, B, S, D], [N, T, D])
  std::string input_layout = "BSH";
  std::int64_t num_key_value_heads = 0;  ///< 0: num_heads
  std::int64_t sparse_mode = 0;          ///< 0–4 (prompt branch)
  std::int64_t inner_precise = 1;        ///< 0–3 (incremental branch: 0 or 1)
  std::int64_t block_size = 0;           ///< paged KV (with block_table)
  std::int64_t antiquant_mode = 0;       ///< 0 per channel / tensor, 1 per token (Q_S == 1)
  bool softmax_lse_flag = false;         ///< write softmax_lse
  /// Separate K / V antiquant (Q_S == 1): 0 per channel / tensor, 1 per token, 2 per tensor and
  /// head, 3 per token and head, 4 / 5 per token (and head) page-managed; key 0 with value 1.
  /// Q_S > 1 (bf16): 0 / 0 or 1 / 1 (cann/detail/fia_prompt_aq.hpp).
  std::int64_t key_antiquant_mode = 0;
  std::int64_t value_antiquant_mode = 0;
  /// V4: 3 (per token and head) with dequant_scale_query: MLA's full quantization (int8 query and
  /// NZ caches, cann/detail/fia_mla_quant.hpp); 0 otherwise.
  std::int64_t query_quant_mode = 0;
  PseOrder pse_order = PseOrder::ScaleThenAdd;  ///< attnref extension (see PseOrder)
  int quant_block_size = 128;  ///< attnref extension: the int8 path's P block (PFA's)
};

namespace detail {
/// The rope inputs' type: the query's, bfloat16 with an int8 query (MLA's full quantization).
template <class T>
struct fia_rope_type {
  using type = T;
};
template <>
struct fia_rope_type<std::int8_t> {
  using type = bfloat16;
};
}  // namespace detail

/// T: half or bfloat16 (float: attnref extension), or int8 (the prompt branch's int8 path; MLA's
/// full quantization).
/// TKV: T, or int8 with a floating T (antiquant; Q_S > 1: bf16), or int32 with a floating T:
/// int4 packed eight to a word (cann/detail/fia_int4.hpp). TM: bool, int8 or uint8.
/// TP: the pse type (T; half with int8 data).
template <class T, class TKV = T, class TM = std::uint8_t,
          class TP = typename detail::pfa_pse<T>::type>
struct FusedInferAttentionScoreInputs {
  StridedView<const T> query;  ///< BSH, BSND, BNSD(_BSND) or TND, as PromptFlashAttention's
  /// One tensor (batch B), or (Q_S == 1) B tensors of batch 1; paged (block_table): the cache
  /// [blockNum, blockSize, KV_N·D] or [blockNum, KV_N, blockSize, D] (BNSD).
  std::vector<StridedView<const TKV>> key;
  std::vector<StridedView<const TKV>> value;
  StridedView<const TP> pse_shift{};                  ///< [B or 1, N, Q_S', KV_S']
  StridedView<const TM> atten_mask{};                 ///< Q_S > 1: PFA's shapes; Q_S == 1: IFA's
  std::vector<std::int64_t> actual_seq_lengths{};     ///< query lengths (TND: cumulative)
  std::vector<std::int64_t> actual_seq_lengths_kv{};  ///< kv lengths (TND: cumulative)
  /// int8 query / key / value (prompt branch): per-tensor fp32 scales, as PromptFlashAttention.
  StridedView<const float> deq_scale1{};
  StridedView<const float> quant_scale1{};
  StridedView<const float> deq_scale2{};
  /// int8 output: per tensor or per channel (N·Dv values); the offset is optional.
  StridedView<const float> quant_scale2{};
  StridedView<const float> quant_offset2{};
  /// int8 key / value with Q_S == 1, as IncreFlashAttention: antiquant_mode 0 in the query's
  /// type, (2, KV_N, 1, D), (2, 1, KV_N, D), (2, KV_N, D), (2, KV_N·D) or (2); antiquant_mode 1
  /// fp32 (2, B, S') in the *_per_token fields. Offsets optional.
  StridedView<const T> antiquant_scale{};
  StridedView<const T> antiquant_offset{};
  StridedView<const float> antiquant_scale_per_token{};
  StridedView<const float> antiquant_offset_per_token{};
  /// Separate K / V antiquant (V2+; int8 K / V; Q_S > 1: fia_prompt_aq.hpp's shapes): fp32 for
  /// every mode (the vendor's fp16 / bf16 scales of modes 0 and 2 convert exactly). Mode 0: (1,
  /// KV_N, 1, D), (1, KV_N, D), (1, KV_N·D) or (1); mode 1: (1, B, S'); mode 2: (KV_N); mode 3: (B,
  /// KV_N, S'); mode 4: (blockNum, blockSize); mode 5: (blockNum, KV_N, blockSize) (4 and 5 with
  /// block_table: a key's scale sits where the key does). Offsets optional, both or neither. Given,
  /// they win over antiquant_scale / antiquant_offset (the vendor's rule).
  StridedView<const float> key_antiquant_scale{};
  StridedView<const float> key_antiquant_offset{};
  StridedView<const float> value_antiquant_scale{};
  StridedView<const float> value_antiquant_offset{};
  /// The shared prefix (V2+): key / value rows in the key's layout with batch 1 ([1, Ps, KV_N·D],
  /// [1, Ps, KV_N, D] or [1, KV_N, Ps, D]); the first actual_shared_prefix_len of them (one value;
  /// empty: Ps) stand in front of every sequence's keys. Not with TND, a paged cache, left
  /// padding, tensor lists, int8 query / key / value, or the separate K / V scales with Q_S > 1
  /// (int8 K / V otherwise: an int8 prefix read with the same maps).
  StridedView<const TKV> key_shared_prefix{};
  StridedView<const TKV> value_shared_prefix{};
  std::vector<std::int64_t> actual_shared_prefix_len{};
  StridedView<const std::int32_t> block_table{};  ///< [B, maxBlocksPerSeq]
  /// Left padding: one value each ([] or [1]; negative counts as 0). kv_padding_size: Q_S == 1
  /// as IncreFlashAttention; Q_S > 1 with query_padding_size as the prompt branch's windows
  /// [S - pad - len_b, S - pad) (fia_parts.hpp, fia_left_padding). query_padding_size is
  /// ignored with Q_S == 1 (the documents call it invalid there).
  StridedView<const std::int64_t> query_padding_size{};
  StridedView<const std::int64_t> kv_padding_size{};
  /// V4's learnable sink (in the vendor's code, not its document): bf16 [N], one logit per
  /// query head joining every row's softmax denominator as exp(sink - max) with no value row;
  /// TND only, head sizes 64 or 128.
  StridedView<const bfloat16> learnable_sink{};
  /// Split rope inputs (V3+): the query's / key's shape with head size 64, in the query's
  /// type; the score is scale · (q·k + q_rope·k_rope), V the value alone. Head size 512: MLA
  /// (a paged latent cache [blockNum, blockSize, 512], key_rope [blockNum, blockSize, 64]);
  /// head size 128: TND, bf16. key_rope_antiquant_scale: reserved by the vendor, ignored.
  /// With an int8 query (MLA's full quantization): bf16.
  StridedView<const typename detail::fia_rope_type<T>::type> query_rope{};
  StridedView<const typename detail::fia_rope_type<T>::type> key_rope{};
  StridedView<const typename detail::fia_rope_type<T>::type> key_rope_antiquant_scale{};
  /// V4's query dequant scale (MLA's full quantization, query_quant_mode 3): fp32, one per query
  /// row and head: [B, S, N] (BSH, BSND and their _NBSD forms) or [T, N] (TND, TND_NTD).
  StridedView<const float> dequant_scale_query{};

  template <class F>
  void for_each_view(F&& f) {
    f("query", query);
    for (size_t i = 0; i < key.size(); ++i) f("key[" + std::to_string(i) + "]", key[i]);
    for (size_t i = 0; i < value.size(); ++i) f("value[" + std::to_string(i) + "]", value[i]);
    f("pse_shift", pse_shift), f("atten_mask", atten_mask);
    f("deq_scale1", deq_scale1), f("quant_scale1", quant_scale1), f("deq_scale2", deq_scale2);
    f("quant_scale2", quant_scale2), f("quant_offset2", quant_offset2);
    f("antiquant_scale", antiquant_scale), f("antiquant_offset", antiquant_offset);
    f("antiquant_scale_per_token", antiquant_scale_per_token);
    f("antiquant_offset_per_token", antiquant_offset_per_token);
    f("key_antiquant_scale", key_antiquant_scale);
    f("key_antiquant_offset", key_antiquant_offset);
    f("value_antiquant_scale", value_antiquant_scale);
    f("value_antiquant_offset", value_antiquant_offset);
    f("key_shared_prefix", key_shared_prefix), f("value_shared_prefix", value_shared_prefix);
    f("block_table", block_table), f("query_padding_size", query_padding_size);
    f("kv_padding_size", kv_padding_size);
    f("learnable_sink", learnable_sink);
    f("query_rope", query_rope), f("key_rope", key_rope);
    f("key_rope_antiquant_scale", key_rope_antiquant_scale);
    f("dequant_scale_query", dequant_scale_query);
  }
};

template <class TO>
struct FusedInferAttentionScoreOutputs {
  StridedView<TO> attention_out;     ///< the query's layout (BNSD_BSND: BSND), head size Dv
  StridedView<float> softmax_lse{};  ///< [B, N, Q_S, 1] (TND: [T, N, 1]) with the flag

  template <class F>
  void for_each_view(F&& f) {
    f("attention_out", attention_out), f("softmax_lse", softmax_lse);
  }
};

}  // namespace attnref
