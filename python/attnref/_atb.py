"""Layer 1, ATB: SelfAttention, PagedAttention, ReshapeAndCache (ND and NZ)."""

from . import _attnref
from ._attnref import PagedAttentionParams, SelfAttentionParams
from ._operators import make_operator, no_exec

paged_attention = make_operator(
    "paged_attention", _attnref._paged_attention, PagedAttentionParams,
    """ATB PagedAttention: decode (or SPEC multi-token) attention over a paged KV cache.

    Tensors: query [numTokens, headNum, headSize]; key_cache / value_cache [numBlocks, blockSize,
    kvHeadNum, headSize(V)] (BNSD: [numBlocks, kvHeadNum, blockSize, headSize]); block_tables
    [batch, maxBlocks] int32; context_lens [batch] (ints); optional q_seq_lens, mask, spec_mask,
    alibi_mask, log_n, batch_run_status, k_descale, v_descale, k_offset, v_offset, p_scale,
    razor_offset; out [numTokens, headNum, headSizeV] (allocated when left out).
    Dtypes: query, caches and masks float16, bfloat16 or float32 alike; int8 caches with
    quant_type DequantFusion; int8 query and caches with QkvOffline / QkvOnline (out float16 or
    bfloat16). Returns out.""")

self_attention = make_operator(
    "self_attention", _attnref._self_attention, SelfAttentionParams,
    """ATB SelfAttention (every calc_type), BSND or BNSD (params.input_layout).

    Tensors: query, key, value, seq_len (ints), mask, head_mask, slopes, log_n, token_offset,
    layer_id, batch_run_status, kv_seq_len, block_tables, key_cache_list, value_cache_list;
    key_cache / value_cache (read and, with KCacheVCache, written in place); int8 query, key and
    value with QkvOffline / QkvOnline and qk_descale, vpv_descale, p_scale, qk_offset, vpv_offset.
    out [nTokens, headNum, headSizeV] (BNSD [batch, headNum, S, headSizeV]) is allocated when left
    out. Returns out.""")

reshape_and_cache = make_operator(
    "reshape_and_cache", no_exec(_attnref._reshape_and_cache), None,
    """ATB ReshapeAndCache into ND caches: writes key [numTokens, kvHead, headSize] (and value)
    into key_cache (value_cache) [numBlocks, blockSize, kvHead, headSize(V)] in place at the
    int32 slot_mapping [numTokens] (a negative slot skips the token). Returns None.""",
    outputs=())

reshape_and_cache_nz = make_operator(
    "reshape_and_cache_nz", no_exec(_attnref._reshape_and_cache_nz), None,
    """ATB ReshapeAndCache into FRACTAL_NZ caches [numBlocks, kvHead*headSize/C0, blockSize,
    C0] (C0 = 16 for float16 / bfloat16, 32 for int8), in place. Returns None.""",
    outputs=())

__all__ = ["PagedAttentionParams", "SelfAttentionParams", "paged_attention", "self_attention",
           "reshape_and_cache", "reshape_and_cache_nz"]
