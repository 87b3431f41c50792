"""torch_npu's DSA calls: npu_lightning_indexer and npu_sparse_flash_attention (aclnn).

The length arguments are int32 tensors (torch_npu's ``Tensor?``), per batch or, with TND,
cumulative. The vendor's A2 / A3 limits are enforced (params.strict).
"""

import numpy as np

from . import _attnref
from ._arrays import Converter
from ._npu_common import EXEC, call, index32, tensor

_BIG = 2**63 - 1



def _lengths(conv, x, name):
    """A length tensor: int32, 1-D (as torch_npu's aclnn call takes it)."""
    if x is None:
        return None
    a = tensor(conv, x, name)
    if a.dtype != np.int32 or a.ndim != 1:
        raise TypeError(f"torch_npu.{conv.op}: {name} must be a 1-D int32 tensor, got "
                        f"{a.ndim}-D {a.dtype}")
    return a


def _empty(conv, dtype):
    """torch_npu's placeholder output of shape [0]."""
    return conv.result(np.empty((0,), dtype))


def npu_lightning_indexer(query, key, weights, *, actual_seq_lengths_query=None,
                          actual_seq_lengths_key=None, block_table=None, layout_query="BSND",
                          layout_key="BSND", sparse_count=2048, sparse_mode=3, pre_tokens=_BIG,
                          next_tokens=_BIG, return_value=False):
    """aclnnLightningIndexer: the top sparse_count keys of each query row (DeepSeek-V3.2).

    query BSND [B, S1, N1, 128] or TND [T1, N1, 128] (float16 / bfloat16); key BSND, TND or
    PA_BSND [blocks, blockSize, 1, 128] with block_table; weights [B, S1, N1] / [T1, N1] (the
    query's type or float32). Returns (sparse_indices int32 [.., 1, sparse_count],
    sparse_values: the scores with return_value, else an empty [0] tensor)."""
    conv = Converter("npu_lightning_indexer")
    q = tensor(conv, query, "query")
    kw = {"query": q, "key": tensor(conv, key, "key"), "weights": tensor(conv, weights, "weights"),
          "block_table": index32(conv, block_table, "block_table", False),
          "actual_seq_lengths_query": _lengths(conv, actual_seq_lengths_query,
                                               "actual_seq_lengths_query"),
          "actual_seq_lengths_key": _lengths(conv, actual_seq_lengths_key,
                                             "actual_seq_lengths_key")}

    def run():
        p = _attnref.LightningIndexerParams(
            layout_query=layout_query, layout_key=layout_key, sparse_count=sparse_count,
            sparse_mode=sparse_mode, pre_tokens=pre_tokens, next_tokens=next_tokens,
            return_value=return_value)
        return _attnref._lightning_indexer(p, kw, EXEC)

    idx, val = call(conv.op, run, {})
    return conv.result(idx), conv.result(val) if val is not None else _empty(conv, q.dtype)


def npu_sparse_flash_attention(query, key, value, sparse_indices, scale_value, *,
                               block_table=None, actual_seq_lengths_query=None,
                               actual_seq_lengths_kv=None, query_rope=None, key_rope=None,
                               sparse_block_size=1, layout_query="BSND", layout_kv="BSND",
                               sparse_mode=3, pre_tokens=_BIG, next_tokens=_BIG,
                               attention_mode=0, return_softmax_lse=False, sinks=None):
    """aclnnSparseFlashAttention (MLA-absorbed: attention_mode must be 2, as the vendor's tiling
    requires; value must be the key's tensor). query [.., N1, 512] and query_rope [.., N1, 64]
    (BSND or TND); key / value [.., 1, 512] and key_rope [.., 1, 64] (BSND, TND or PA_BSND with
    block_table); sparse_indices int32 [.., 1, K]. Returns (attention_out, softmax_max,
    softmax_sum); the last two are empty [0] float32 tensors (return_softmax_lse is not
    supported)."""
    conv = Converter("npu_sparse_flash_attention")
    if sinks is not None:
        raise ValueError("torch_npu.npu_sparse_flash_attention: sinks not supported by attnref "
                         "(aclnnSparseFlashAttentionV2's attention sinks)")
    kw = {"query": tensor(conv, query, "query"), "key": tensor(conv, key, "key"),
          "value": tensor(conv, value, "value"),
          "sparse_indices": index32(conv, sparse_indices, "sparse_indices"),
          "block_table": index32(conv, block_table, "block_table", False),
          "actual_seq_lengths_query": _lengths(conv, actual_seq_lengths_query,
                                               "actual_seq_lengths_query"),
          "actual_seq_lengths_kv": _lengths(conv, actual_seq_lengths_kv, "actual_seq_lengths_kv"),
          "query_rope": conv(query_rope, "query_rope"), "key_rope": conv(key_rope, "key_rope")}

    def run():
        p = _attnref.SparseFlashAttentionParams(
            scale_value=scale_value, sparse_block_size=sparse_block_size,
            layout_query=layout_query, layout_kv=layout_kv, sparse_mode=sparse_mode,
            pre_tokens=pre_tokens, next_tokens=next_tokens, attention_mode=attention_mode,
            return_softmax_lse=return_softmax_lse)
        return _attnref._sparse_flash_attention(p, kw, EXEC)

    out = call(conv.op, run, {})
    return conv.result(out), _empty(conv, np.float32), _empty(conv, np.float32)


__all__ = ["npu_lightning_indexer", "npu_sparse_flash_attention"]
