"""torch_npu's NSA calls (op-plugin's op_plugin_functions.yaml, the npu_nsa_* entries).

The inference calls map onto attnref's NSA operators with the vendor's constraint lists on
(params.strict): npu_nsa_compress -> nsa_compress, npu_nsa_compress_infer (the ``.cache``
overload) -> nsa_compress_with_cache, npu_nsa_compress_attention_infer ->
nsa_compress_attention_infer, npu_nsa_select_attention_infer -> nsa_selected_attention_infer.
The two training calls (npu_nsa_compress_attention, npu_nsa_select_attention) return the softmax
statistics softmax_max / softmax_sum for the backward pass, which attnref does not compute: they
raise ValueError.
"""

import numpy as np

from . import _attnref
from ._arrays import Converter
from ._npu_common import EXEC, call, index32

_FLAG = np.ones(1, np.uint8)  # a present attention mask (its content is never read)


def _strict(op):
    """The vendor rules' hint, for layer 2 (which has no strict argument)."""
    return {"params.strict = false relaxes it": f"attnref.{op}(..., strict=False) relaxes it"}


_COMPRESS_RENAMES = {
    "params.compress_block_size": "compress_block_size",
    "params.compress_stride": "compress_stride",
    "params.page_block_size": "page_block_size",
    "act_seq_len": "actual_seq_len",
    "output_cache": "cache",
    "output": "out",
}

_ATTENTION_RENAMES = {
    "params.num_heads": "head_num",
    "params.num_key_value_heads": "key_value_head_num",
    "params.compress_block_size": "compress_block_size",
    "params.compress_block_stride": "compress_stride",
    "params.select_block_size": "select_block_size",
    "params.select_block_count": "select_block_count",
    "params.page_block_size": "page_block_size",
    "params.scale_value": "scale_value",
    "params.layout": "layout",
    "num_key_value_heads": "key_value_head_num",
    "num_heads": "head_num",
    "compress_block_stride": "compress_stride",
    "actual_q_seq_len": "actual_seq_qlen",
    "actual_cmp_kv_seq_len": "actual_cmp_seq_kvlen",
}


def _lengths(x):
    """An ``int[]?`` argument: None stays None (the operator says when it is required)."""
    return None if x is None else [int(v) for v in x]


def npu_nsa_compress(input, weight, compress_block_size, compress_stride, *, actual_seq_len=None):
    """aclnnNsaCompress (TND, cumulative actual_seq_len): input [T, N, D], weight
    [compress_block_size, N]. Returns the compressed tokens [T', N, D]."""
    conv = Converter("npu_nsa_compress")
    p = _attnref.NsaCompressParams(compress_block_size=compress_block_size,
                                   compress_stride=compress_stride, layout="TND",
                                   act_seq_len_type=0)
    kw = {"input": conv(input, "input"), "weight": conv(weight, "weight"),
          "act_seq_len": _lengths(actual_seq_len)}
    return conv.result(call(conv.op, _attnref._nsa_compress,
                                dict(_COMPRESS_RENAMES, **_strict("nsa_compress")), p, kw, EXEC))


def npu_nsa_compress_infer(input, weight, slot_mapping, compress_block_size, compress_stride,
                           page_block_size, *, block_table=None, actual_seq_len=None, cache):
    """torch_npu.npu_nsa_compress_infer.cache, aclnnNsaCompressWithCache (actual_seq_len per
    batch): the batches whose newest raw token completes a compress block write its compressed
    token into cache[slot_mapping[b]] in place. input [block_num, page_block_size, N, D],
    slot_mapping int32 [B], block_table int32 [B, maxBlocks] (attnref requires it, as the
    vendor's kernel reads the input through it). Returns cache."""
    conv = Converter("npu_nsa_compress_infer")
    if block_table is None:
        raise ValueError("torch_npu.npu_nsa_compress_infer: block_table=None is not supported by "
                         "attnref: the raw input is read through block_table (paged)")
    p = _attnref.NsaCompressWithCacheParams(compress_block_size=compress_block_size,
                                            compress_stride=compress_stride,
                                            page_block_size=page_block_size,
                                            act_seq_len_type=1, layout="TND")
    kw = {"input": conv(input, "input"), "weight": conv(weight, "weight"),
          "slot_mapping": index32(conv, slot_mapping, "slot_mapping"),
          "block_table": index32(conv, block_table, "block_table", False),
          "act_seq_len": _lengths(actual_seq_len), "output_cache": conv(cache, "cache")}
    renames = dict(_COMPRESS_RENAMES, **_strict("nsa_compress_with_cache"))
    call(conv.op, _attnref._nsa_compress_with_cache, renames, p, kw, EXEC)
    return cache


npu_nsa_compress_infer.cache = npu_nsa_compress_infer


def npu_nsa_compress_attention(query, key, value, scale_value, head_num, compress_block_size,
                               compress_stride, select_block_size, select_block_count, *,
                               topk_mask=None, atten_mask=None, actual_seq_qlen=None,
                               actual_cmp_seq_kvlen=None, actual_sel_seq_kvlen=None):
    """aclnnNsaCompressAttention (training): not supported by attnref (ValueError). It returns
    softmax_max / softmax_sum for the backward pass, which attnref does not compute, and its
    prompt-length queries with [S, S] atten_mask / topk_mask have no attnref operator; the
    inference call npu_nsa_compress_attention_infer is supported."""
    raise ValueError(
        "torch_npu.npu_nsa_compress_attention: not supported by attnref: its softmax_max / "
        "softmax_sum outputs (training statistics) are not computed, nor its training selection "
        "(prompt-length queries, atten_mask / topk_mask [S, S]); use "
        "npu_nsa_compress_attention_infer (decode, paged)")


def npu_nsa_compress_attention_infer(query, key, value, scale_value, head_num, key_value_head_num,
                                     select_block_size, select_block_count, page_block_size,
                                     compress_block_size, compress_stride, *, layout="TND",
                                     atten_mask=None, block_table=None, topk_mask=None,
                                     actual_seq_qlen=None, actual_cmp_seq_kvlen=None,
                                     actual_sel_seq_kvlen=None):
    """aclnnNsaCompressAttentionInfer: the compressed branch with the top-k selection. query TND
    [T, N, D] or BSND; key / value paged [block_num, page_block_size, KV_N*D]; block_table
    int32 (required); actual_seq_qlen per batch; atten_mask: only its presence is read (the
    multi-token rule), as by the kernel; topk_mask is reserved by the vendor and not read.
    Returns (out, topk_indices int32 [T, KV_N, select_block_count])."""
    conv = Converter("npu_nsa_compress_attention_infer")
    mask = conv(atten_mask, "atten_mask")
    conv(topk_mask, "topk_mask")  # reserved by the vendor: checked as a tensor, not read
    p = _attnref.NsaCompressAttentionInferParams(
        num_heads=head_num, num_key_value_heads=key_value_head_num,
        select_block_size=select_block_size, select_block_count=select_block_count,
        compress_block_size=compress_block_size, compress_block_stride=compress_stride,
        scale_value=scale_value, layout=layout, page_block_size=page_block_size, sparse_mode=0)
    kw = {"query": conv(query, "query"), "key": conv(key, "key"), "value": conv(value, "value"),
          "atten_mask": None if mask is None else _FLAG,
          "block_table": index32(conv, block_table, "block_table", False),
          "actual_q_seq_len": _lengths(actual_seq_qlen),
          "actual_cmp_kv_seq_len": _lengths(actual_cmp_seq_kvlen),
          "actual_sel_kv_seq_len": _lengths(actual_sel_seq_kvlen)}
    renames = dict(_ATTENTION_RENAMES, actual_sel_kv_seq_len="actual_sel_seq_kvlen", output="out",
                   **_strict("nsa_compress_attention_infer"))
    return conv.result(call(conv.op, _attnref._nsa_compress_attention_infer, renames, p, kw,
                            EXEC))


def npu_nsa_select_attention(query, key, value, topk_indices, scale_value, head_num,
                             select_block_size, select_block_count, *, atten_mask=None,
                             actual_seq_qlen=None, actual_seq_kvlen=None):
    """aclnnNsaSelectedAttention (training): not supported by attnref (ValueError). It returns
    softmax_max / softmax_sum for the backward pass, which attnref does not compute; the
    inference call npu_nsa_select_attention_infer is supported."""
    raise ValueError(
        "torch_npu.npu_nsa_select_attention: not supported by attnref: its softmax_max / "
        "softmax_sum outputs (training statistics) are not computed, nor its training layout "
        "(prompt-length TND queries with cumulative actual_seq_qlen / actual_seq_kvlen, "
        "atten_mask); use npu_nsa_select_attention_infer (decode, paged)")


def npu_nsa_select_attention_infer(query, key, value, topk_indices, scale_value, head_num,
                                   key_value_head_num, select_block_size, select_block_count,
                                   page_block_size, *, layout="BSND", atten_mask=None,
                                   block_table=None, actual_seq_qlen=None, actual_seq_kvlen=None):
    """aclnnNsaSelectedAttentionInfer: attention over the raw tokens of the selected blocks.
    query BSND [B, S, N, D] (key / value [block_num, page_block_size, KV_N, D]), BSH [B, S, H]
    or TND [T, N, D] (key / value [block_num, page_block_size, KV_N*D]); topk_indices int32
    [B, S, KV_N, count] or, with one query token per batch, [B, KV_N, count] (TND: [T, KV_N,
    count]); block_table int32 (required); actual_seq_qlen / actual_seq_kvlen per batch.
    atten_mask is reserved by the vendor and not read. Returns the attention output."""
    conv = Converter("npu_nsa_select_attention_infer")
    conv(atten_mask, "atten_mask")  # reserved by the vendor: checked as a tensor, not read
    topk = index32(conv, topk_indices, "topk_indices")
    if (isinstance(topk, np.ndarray) and topk.ndim == 3 and str(layout).upper() != "TND"):
        topk = topk[:, None]  # [B, KV_N, count]: one query token per batch
    p = _attnref.NsaSelectedAttentionInferParams(
        num_heads=head_num, num_key_value_heads=key_value_head_num,
        select_block_size=select_block_size, select_block_count=select_block_count,
        page_block_size=page_block_size, scale_value=scale_value, layout=layout, sparse_mode=0)
    kw = {"query": conv(query, "query"), "key": conv(key, "key"), "value": conv(value, "value"),
          "topk_indices": topk, "block_table": index32(conv, block_table, "block_table", False),
          "actual_q_seq_len": _lengths(actual_seq_qlen),
          "actual_sel_kv_seq_len": _lengths(actual_seq_kvlen)}
    renames = dict(_ATTENTION_RENAMES, actual_sel_kv_seq_len="actual_seq_kvlen", output="out",
                   **_strict("nsa_selected_attention_infer"))
    return conv.result(call(conv.op, _attnref._nsa_selected_attention_infer, renames, p, kw, EXEC))


__all__ = [
    "npu_nsa_compress", "npu_nsa_compress_infer", "npu_nsa_compress_attention",
    "npu_nsa_compress_attention_infer", "npu_nsa_select_attention",
    "npu_nsa_select_attention_infer",
]
