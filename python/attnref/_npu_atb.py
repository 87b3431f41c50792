"""torch_npu's ATB calls (the _npu_* functions)."""

import functools

from . import _attnref
from ._arrays import Converter
from ._npu_common import (EXEC, call, heads_view, host_int32, index32, merge_heads, out_tensor,
                          tensor)

_PA = _attnref.PagedAttentionParams
_SA = _attnref.SelfAttentionParams


def _make_pa_params(num_heads, num_kv_heads, scale_value):
    return _PA(num_heads=num_heads, num_kv_heads=num_kv_heads, qk_scale=scale_value)


_cached_pa_params = functools.lru_cache(maxsize=64)(_make_pa_params)


def _pa_params(num_heads, num_kv_heads, scale_value):
    """The PagedAttention params of a decode call. A serving loop repeats them at every step, so
    they are built once (and never changed: the C++ only reads them)."""
    try:
        return _cached_pa_params(num_heads, num_kv_heads, scale_value)
    except TypeError:  # an unhashable argument: built anew, to raise the field's own error
        return _make_pa_params(num_heads, num_kv_heads, scale_value)


def _npu_reshape_and_cache(key, value, key_cache, value_cache, slot_indices):
    """ATB ReshapeAndCache (ND caches): writes key / value rows into key_cache / value_cache in
    place at slot_indices (int32). Returns None."""
    conv = Converter("_npu_reshape_and_cache")
    kw = {"key": tensor(conv, key, "key"), "value": tensor(conv, value, "value"),
          "key_cache": tensor(conv, key_cache, "key_cache"),
          "value_cache": tensor(conv, value_cache, "value_cache"),
          "slot_mapping": index32(conv, slot_indices, "slot_indices")}
    call(conv.op, _attnref._reshape_and_cache, {"slot_mapping": "slot_indices"}, kw)


def _npu_flash_attention(query, key, value, mask, seq_len, scale_value, num_heads, num_kv_heads,
                         out):
    """ATB SelfAttention, calcType PA_ENCODER, kernel DEFAULT, mask NORM: prefill of packed
    sequences without a cache. mask [maxSeq, maxSeq] or [batch, maxSeq, maxSeq]; seq_len int32.
    Writes out in place; returns None."""
    conv = Converter("_npu_flash_attention")
    m = tensor(conv, mask, "mask")
    if m.ndim == 2:
        m = m[None]
    p = _SA(num_heads=num_heads, num_kv_heads=num_kv_heads, qk_scale=scale_value,
            calc_type=_SA.CalcType.PaEncoder, kernel_type=_SA.KernelType.Default,
            mask_type=_SA.MaskType.Norm)
    o = out_tensor(conv, out)
    kw = {"query": heads_view(tensor(conv, query, "query"), num_heads),
          "key": heads_view(tensor(conv, key, "key"), num_kv_heads),
          "value": heads_view(tensor(conv, value, "value"), num_kv_heads),
          "mask": m, "seq_len": host_int32(conv, seq_len, "seq_len"),
          "out": heads_view(o, num_heads)}
    call(conv.op, _attnref._self_attention, {"params.qk_scale": "scale_value"}, p, kw, EXEC)


def _npu_flash_attention_qlens(query, key_cache, value_cache, block_table, mask, seq_len,
                               context_lens, num_kv_heads, num_heads, scale_value, out):
    """ATB SelfAttention, calcType PREFIX_ENCODER, kernel HIGH_PRECISION, mask NORM_COMPRESS
    (is_triu_mask 1): prefill of new tokens (seq_len) over a paged prefix (context_lens keys in
    all). Caches [numBlocks, blockSize, kvHeads, D]; mask the [128, 128] tile. Writes out in
    place; returns None."""
    conv = Converter("_npu_flash_attention_qlens")
    m = tensor(conv, mask, "mask")
    if m.ndim == 2:
        m = m[None]
    p = _SA(num_heads=num_heads, num_kv_heads=num_kv_heads, qk_scale=scale_value,
            calc_type=_SA.CalcType.PrefixEncoder, kernel_type=_SA.KernelType.HighPrecision,
            mask_type=_SA.MaskType.NormCompress, is_triu_mask=1)
    o = out_tensor(conv, out)
    kw = {"query": heads_view(tensor(conv, query, "query"), num_heads),
          "key": merge_heads(tensor(conv, key_cache, "key_cache")),
          "value": merge_heads(tensor(conv, value_cache, "value_cache")),
          "block_tables": index32(conv, block_table, "block_table"), "mask": m,
          "seq_len": host_int32(conv, seq_len, "seq_len"),
          "kv_seq_len": host_int32(conv, context_lens, "context_lens"),
          "out": heads_view(o, num_heads)}
    renames = {"block_tables": "block_table", "kv_seq_len": "context_lens", "key": "key_cache",
               "value": "value_cache", "params.qk_scale": "scale_value"}
    call(conv.op, _attnref._self_attention, renames, p, kw, EXEC)


_PA_RENAMES = {"block_tables": "block_table", "params.qk_scale": "scale_value",
               "q_seq_lens": "seq_len", "spec_mask": "mask",
               "params.mla_v_head_size": "mla_vheadsize"}


def _paged(conv, p, query, key_cache, value_cache, block_table, context_lens, out, **extra):
    kw = {"query": heads_view(tensor(conv, query, "query"), p.num_heads),
          "key_cache": tensor(conv, key_cache, "key_cache"),
          "value_cache": None if p.mla_v_head_size else tensor(conv, value_cache, "value_cache"),
          "block_tables": index32(conv, block_table, "block_table"),
          "context_lens": host_int32(conv, context_lens, "context_lens"),
          "out": heads_view(out_tensor(conv, out), p.num_heads)}
    kw.update(extra)
    call(conv.op, _attnref._paged_attention, _PA_RENAMES, p, kw, EXEC)


def _npu_paged_attention(query, key_cache, value_cache, num_kv_heads, num_heads, scale_value,
                         block_table, context_lens, out, *, workspace=None):
    """ATB PagedAttention (one query token per sequence, no mask) over ND caches [numBlocks,
    blockSize, kvHeads, D]; context_lens int32. Writes out in place; returns None. workspace is
    accepted and ignored (the NPU's scratch memory)."""
    del workspace
    conv = Converter("_npu_paged_attention")
    p = _pa_params(num_heads, num_kv_heads, scale_value)
    _paged(conv, p, query, key_cache, value_cache, block_table, context_lens, out)


def _npu_paged_attention_splitfuse(query, key_cache, value_cache, block_table, context_lens, mask,
                                   seq_len, num_kv_heads, num_heads, scale_value, out):
    """ATB PagedAttention, calcType SPEC, mask SPEC: chunked prefill / mixed batches. seq_len
    (int32) query tokens per sequence, the last of its context_lens (int32) keys; mask
    [sum(seq_len), maxSeq], one row per query token. Writes out in place; returns None."""
    conv = Converter("_npu_paged_attention_splitfuse")
    p = _PA(num_heads=num_heads, num_kv_heads=num_kv_heads, qk_scale=scale_value,
            calc_type=_PA.CalcType.Spec,
            mask_type=_PA.MaskType.Spec)
    _paged(conv, p, query, key_cache, value_cache, block_table, context_lens, out,
           spec_mask=tensor(conv, mask, "mask"), q_seq_lens=host_int32(conv, seq_len, "seq_len"))


def _npu_paged_attention_mla(query, key_cache, num_kv_heads, num_heads, scale_value, block_table,
                             context_lens, mla_vheadsize, out):
    """ATB PagedAttention with mlaVHeadSize: MLA decode over one cache [numBlocks, blockSize,
    kvHeads, 576] whose first mla_vheadsize channels are V. Writes out in place; returns None."""
    conv = Converter("_npu_paged_attention_mla")
    p = _PA(num_heads=num_heads, num_kv_heads=num_kv_heads, qk_scale=scale_value,
            mla_v_head_size=mla_vheadsize)
    _paged(conv, p, query, key_cache, None, block_table, context_lens, out)


__all__ = [
    "_npu_reshape_and_cache", "_npu_flash_attention", "_npu_flash_attention_qlens",
    "_npu_paged_attention", "_npu_paged_attention_splitfuse", "_npu_paged_attention_mla",
]
