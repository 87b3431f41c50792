"""Layer 1, CANN: PromptFlashAttention, IncreFlashAttention, FusedInferAttentionScore.

Element types of the Python module: query / key / value float16, bfloat16 or float32 (attnref
extension) alike; int8 key / value with a float16 or bfloat16 query (antiquant: IFA and FIA).
Masks: bool, int8 or uint8 (nonzero = masked; viewed as uint8, not copied). The int8 query path,
int8 output, int4 (int32) key / value and MLA's full quantization exist in C++ only (TypeError
here). An output passed in (``attention_out=``, ``softmax_lse=``) is written in place and returned
as the caller's object.
"""

from . import _attnref
from ._attnref import (FusedInferAttentionScoreParams, IncreFlashAttentionParams,
                       PromptFlashAttentionParams, PseOrder)
from ._operators import make_operator


prompt_flash_attention = make_operator(
    "prompt_flash_attention", _attnref._prompt_flash_attention, PromptFlashAttentionParams,
    """CANN PromptFlashAttention (aclnnPromptFlashAttentionV3): prefill attention.

    Tensors: query, key, value in params.input_layout (BSH [B, S, N*D], BSND [B, S, N, D], BNSD /
    BNSD_BSND [B, N, S, D], TND [T, N, D]); optional pse_shift [B|1, N, >=S1, >=S2] (the query's
    type), atten_mask (bool / int8 / uint8, nonzero = masked; sparse modes 2-4: the 2048 x 2048
    compressed mask), actual_seq_lengths, actual_seq_lengths_kv (ints; TND: cumulative);
    attention_out (allocated when left out: the query's layout with the value's head size,
    BNSD_BSND writes BSND). deq_scale1 / quant_scale1 / deq_scale2 (int8 path) and quant_scale2 /
    quant_offset2 (int8 output) exist in C++ only. Returns attention_out.""",
    outputs=("attention_out",))

incre_flash_attention = make_operator(
    "incre_flash_attention", _attnref._incre_flash_attention, IncreFlashAttentionParams,
    """CANN IncreFlashAttention (aclnnIncreFlashAttentionV4): decode attention, one query token.

    Tensors: query BSH [B, 1, N*D], BSND [B, 1, N, D] or BNSD [B, N, 1, D]; key / value one
    tensor (batch B) or a list of B tensors of batch 1, in the query's layout; paged
    (block_table int32 [B, maxBlocks], params.block_size): one cache each, [blockNum, blockSize,
    KV_N*D] (BNSD also [blockNum, KV_N, blockSize, D]); optional pse_shift, atten_mask [B, S'],
    actual_seq_lengths (kv lengths; required when paged), antiquant_scale / antiquant_offset (the
    query's type, int8 key / value), antiquant_scale_per_token / antiquant_offset_per_token
    (float32 (2, B, S'), params.antiquant_mode 1), kv_padding_size (int64, one value);
    attention_out (allocated when left out: the query's shape). Returns attention_out.""",
    outputs=("attention_out",))

fused_infer_attention_score = make_operator(
    "fused_infer_attention_score", _attnref._fused_infer_attention_score,
    FusedInferAttentionScoreParams,
    """CANN FusedInferAttentionScore (V1-V4): IncreFlashAttention's branch for BSH / BSND / BNSD
    with Q_S == 1, PromptFlashAttention's otherwise; MLA with query_rope / key_rope and head
    size 512.

    Tensors (the C++ field names): query, key, value (one tensor, a list of B tensors with
    Q_S == 1, or a paged cache with block_table), pse_shift, atten_mask, actual_seq_lengths,
    actual_seq_lengths_kv, antiquant_scale, antiquant_offset, antiquant_scale_per_token,
    antiquant_offset_per_token, key_antiquant_scale, key_antiquant_offset, value_antiquant_scale,
    value_antiquant_offset (float32), key_shared_prefix, value_shared_prefix,
    actual_shared_prefix_len, block_table, query_padding_size, kv_padding_size (int64),
    learnable_sink (bfloat16 [N]), query_rope, key_rope, key_rope_antiquant_scale;
    attention_out and softmax_lse (allocated when left out). Returns (attention_out,
    softmax_lse): softmax_lse float32 [B, N, Q_S, 1] (TND [T, N, 1]) with
    params.softmax_lse_flag; without it, softmax_lse is neither checked nor written, and is
    returned as given, or as an empty float32 array of shape [0] (as op-plugin returns it).""",
    outputs=("attention_out", "softmax_lse"))

__all__ = ["PseOrder", "PromptFlashAttentionParams", "IncreFlashAttentionParams",
           "FusedInferAttentionScoreParams", "prompt_flash_attention", "incre_flash_attention",
           "fused_infer_attention_score"]
