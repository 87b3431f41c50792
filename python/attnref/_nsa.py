"""Layer 1, NSA: the Native Sparse Attention operators (docs/nsa.md).

Compression (nsa_compress, nsa_compress_with_cache, nsa_update_compressed_cache), the compressed
branch with the block selection (nsa_compress_attention_infer), the selected branch
(nsa_selected_attention_infer), the window branch (nsa_sliding_window_attention), the gate
(nsa_gated_sum) and the whole decode step (nsa_decode_step). Every operator takes float16,
bfloat16 and float32 (attnref's extension) tensors; block tables, slot mappings and top-k indices
are int32; lengths are sequences of ints or 1-D int32 / int64 arrays. An output passed by the
caller is written in place and returned as the caller's object.
"""

from . import _attnref
from ._attnref import (NsaCompressAttentionInferParams, NsaCompressParams,
                       NsaCompressWithCacheParams, NsaDecodeParams,
                       NsaSelectedAttentionInferParams, nsa_compressed_count,
                       nsa_select_block_count)
from ._operators import make_operator, no_exec

nsa_compress = make_operator(
    "nsa_compress", _attnref._nsa_compress, NsaCompressParams,
    """aclnnNsaCompress: the weighted block compression of NSA (a whole prompt).

    Tensors: input [T, N, D] (TND), weight [compress_block_size, N], act_seq_len (B cumulative
    lengths, the last = T); output [T', N, D], T' = sum of nsa_compressed_count over the batches
    (allocated when left out). Compressed token i of a batch, head n:
    sum_{j<l} weight[j][n] * input[start + i*d + j][n], fp32 in j order, rounded once.
    Returns output.""", outputs=("output",))

nsa_compress_with_cache = make_operator(
    "nsa_compress_with_cache", _attnref._nsa_compress_with_cache, NsaCompressWithCacheParams,
    """aclnnNsaCompressWithCache: decode-time compression. A batch whose newest raw token
    completes a block (s >= l and (s - l) % d == 0, s = act_seq_len[b]) writes the compressed
    token of raw tokens [s - l, s) at row slot_mapping[b] of output_cache, in place.

    Tensors: input [blockNum, page_block_size, N, D] (raw tokens, paged), weight [l, N],
    slot_mapping [B] int32, act_seq_len (B per-batch lengths), block_table [B, maxBlocks] int32,
    output_cache [result_len, N, D] (required, updated in place). Returns output_cache.""",
    outputs=("output_cache",))

nsa_update_compressed_cache = make_operator(
    "nsa_update_compressed_cache", _attnref._nsa_update_compressed_cache, NsaDecodeParams,
    """The decode loop's compressed-cache bookkeeping: after new raw tokens were appended,
    compresses K (key_weight) and V (value_weight) of every block they completed into the paged
    compressed caches cmp_key / cmp_value (in place), through cmp_block_table.

    Tensors: key [numBlocks, page_block_size, KV_N*Dqk], value [.., KV_N*Dv], block_table,
    key_weight / value_weight [l, KV_N], cmp_block_table, actual_sel_kv_seq_len (lengths after
    the append), actual_new_kv_len (tokens appended; empty: 1 each), cmp_key / cmp_value
    [numCmpBlocks, cmp_page_block_size, KV_N*D] (required). Returns None.""",
    outputs=())

nsa_compress_attention_infer = make_operator(
    "nsa_compress_attention_infer", _attnref._nsa_compress_attention_infer,
    NsaCompressAttentionInferParams,
    """aclnnNsaCompressAttentionInfer: NSA's compressed branch for decode, with the importance
    scores and the top-k block selection.

    Tensors: query TND [T, N, Dqk] or BSND [B, S, N, Dqk]; key / value (compressed tokens,
    paged) [numBlocks, page_block_size, KV_N*Dqk] / [.., KV_N*Dv]; atten_mask (optional, uint8
    or bool; only its presence is read: the multi-token rule); block_table [B, maxBlocks] int32;
    actual_q_seq_len (per batch), actual_cmp_kv_seq_len (required), actual_sel_kv_seq_len.
    Outputs (allocated when left out): output [T, N, Dv] (BSND [B, S, N, Dv]), topk int32
    [T, KV_N, k] (BSND [B, S, KV_N, k]); optional fp32 debug outputs written when given: probs,
    head_scores, group_scores. Returns (output, topk).""", outputs=("output", "topk"))

nsa_selected_attention_infer = make_operator(
    "nsa_selected_attention_infer", _attnref._nsa_selected_attention_infer,
    NsaSelectedAttentionInferParams,
    """aclnnNsaSelectedAttentionInfer: NSA's selected branch for decode, attention over the raw
    tokens of the select blocks each kv head chose (topk_indices, -1 = empty slot).

    Tensors: query TND [T, N, Dqk], BSND [B, S, N, Dqk] or BSH [B, S, N*Dqk]; key / value (raw,
    paged) [numBlocks, page_block_size, KV_N*D] or [.., KV_N, D]; topk_indices int32 TND
    [T, KV_N, k], else [B, S, KV_N, k]; block_table [B, maxBlocks] int32; actual_q_seq_len,
    actual_sel_kv_seq_len (required). output shaped like query with Dv (allocated when left out).
    Returns output.""", outputs=("output",))

nsa_sliding_window_attention = make_operator(
    "nsa_sliding_window_attention", _attnref._nsa_sliding_window_attention, NsaDecodeParams,
    """NSA's window branch: query token i of a batch (raw position t = sel - q_len + i) over the
    raw keys (t - window_size, t] of the paged cache (BottomRight-causal sliding window).

    Tensors as nsa_decode_step (query, key, value, block_table, actual_q_seq_len,
    actual_sel_kv_seq_len are read). output shaped like query with Dv. Returns output.""",
    outputs=("output",))

nsa_gated_sum = make_operator(
    "nsa_gated_sum", no_exec(_attnref._nsa_gated_sum), None,
    """out = T(g0 * o_cmp + g1 * o_sel + g2 * o_win) in fp32: gates float32 [rows, N, 3], the
    branch outputs and out [rows, N, Dv] (or [B, S, N, Dv]). Returns out.""")

nsa_decode_step = make_operator(
    "nsa_decode_step", _attnref._nsa_decode_step, NsaDecodeParams,
    """One NSA decode step: the compressed branch (with the multi-token rule and the top-k), the
    selected branch on that top-k, the window branch and the gated sum.

    Tensors: query TND [T, N, Dqk] or BSND [B, S, N, Dqk]; key / value raw paged
    [numBlocks, page_block_size, KV_N*D]; block_table; cmp_key / cmp_value compressed paged
    [numCmpBlocks, cmp_page_block_size, KV_N*D]; cmp_block_table; gates float32 [rows, N, 3];
    actual_q_seq_len, actual_sel_kv_seq_len (required). output (allocated when left out); topk,
    cmp_out, sel_out, win_out are written when given. Returns output.""", outputs=("output",))

__all__ = [
    "NsaCompressParams", "NsaCompressWithCacheParams", "NsaCompressAttentionInferParams",
    "NsaSelectedAttentionInferParams", "NsaDecodeParams",
    "nsa_compress", "nsa_compress_with_cache", "nsa_update_compressed_cache",
    "nsa_compress_attention_infer", "nsa_selected_attention_infer",
    "nsa_sliding_window_attention", "nsa_gated_sum", "nsa_decode_step",
    "nsa_compressed_count", "nsa_select_block_count",
]
