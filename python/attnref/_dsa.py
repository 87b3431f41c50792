"""Layer 1, DSA (DeepSeek-V3.2 sparse attention): LightningIndexer, QuantLightningIndexer,
SparseFlashAttention, KvQuantSparseFlashAttention and one DSA step.

Layouts: query BSND [B, S1, N1, D] or TND [T1, N1, D]; key BSND, TND or PA_BSND
[blockNum, blockSize, N2, D] with block_table [B, maxBlocks]. actual_seq_lengths_* are ints
(per batch; cumulative with TND). ``strict`` (default True) enforces the vendor's A2 / A3 limits.
"""

from . import _attnref
from ._attnref import (DsaStepParams, KvQuantSparseFlashAttentionParams, LightningIndexerParams,
                       QuantLightningIndexerParams, SparseFlashAttentionParams)
from ._operators import make_operator

lightning_indexer = make_operator(
    "lightning_indexer", _attnref._lightning_indexer, LightningIndexerParams,
    """CANN LightningIndexer: per query row, the top sparse_count keys by
    Σ_h weights[h] · ReLU(q[h] · k). query, key (float16 / bfloat16; float32 as attnref's
    extension), weights [B, S1, N1] or [T1, N1] (the query's type or float32), block_table,
    actual_seq_lengths_query, actual_seq_lengths_key. Returns (sparse_indices int32
    [.., N2, sparse_count] (−1 past the visible keys), sparse_values (with return_value, else
    None)).""", outputs=("sparse_indices", "sparse_values"))

quant_lightning_indexer = make_operator(
    "quant_lightning_indexer", _attnref._quant_lightning_indexer, QuantLightningIndexerParams,
    """CANN QuantLightningIndexer: lightning_indexer over int8 query / key with float16 weights,
    query_dequant_scale (the weights' shape) and key_dequant_scale (the key's shape without D).
    Returns sparse_indices int32 [.., N2, sparse_count].""", outputs=("sparse_indices",))

sparse_flash_attention = make_operator(
    "sparse_flash_attention", _attnref._sparse_flash_attention, SparseFlashAttentionParams,
    """CANN SparseFlashAttention (MLA-absorbed, attention_mode 2): softmax(scale_value ·
    (q·k + q_rope·k_rope)) · v over the blocks sparse_indices selects ([.., N2, K], int32, −1
    after the valid entries). query, key, value (absent or the key: V is the key), query_rope,
    key_rope, sparse_indices, block_table, actual_seq_lengths_query, actual_seq_lengths_kv.
    Returns attention_out (the query's shape).""", outputs=("attention_out",))

kv_quant_sparse_flash_attention = make_operator(
    "kv_quant_sparse_flash_attention", _attnref._kv_quant_sparse_flash_attention,
    KvQuantSparseFlashAttentionParams,
    """CANN KvQuantSparseFlashAttention: sparse_flash_attention over an int8 latent cache whose
    rows pack [512 int8 | 64 rope values | 4 float32 scales] (656 bytes). query [.., N1, 576]
    (latent then rope), key int8 [.., 1, 656]; value, key_dequant_scale, value_dequant_scale
    accepted and never read. Returns attention_out [.., N1, 512].""", outputs=("attention_out",))

dsa_step = make_operator(
    "dsa_step", _attnref._dsa_step, DsaStepParams,
    """One DSA step: lightning_indexer(index_query, weights, index_key) picks sparse_count tokens
    per row, then sparse_flash_attention(query, query_rope, key, key_rope) attends over them; both
    caches share the layout, the lengths and block_table. Returns (output (the query's shape),
    sparse_indices int32 [.., 1, sparse_count]).""", outputs=("output", "sparse_indices"))

__all__ = ["DsaStepParams", "KvQuantSparseFlashAttentionParams", "LightningIndexerParams",
           "QuantLightningIndexerParams", "SparseFlashAttentionParams", "lightning_indexer",
           "quant_lightning_indexer", "sparse_flash_attention", "kv_quant_sparse_flash_attention",
           "dsa_step"]
