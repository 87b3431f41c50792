"""torch_npu's CANN calls: npu_prompt_flash_attention, npu_incre_flash_attention,
npu_fused_infer_attention_score (and its ``.out`` form).

Every argument after ``value`` is keyword-only, as in torch_npu's schemas. The int[] arguments
(actual_seq_lengths, actual_seq_lengths_kv, actual_shared_prefix_len) take lists of ints or CPU
int32 / int64 tensors. What each call rejects (ValueError naming the argument): the int8 query
path and int8 output (C++ only in attnref), a sliding window with Q_S == 1 outside MLA (see
npu_fused_infer_attention_score). padding_mask is accepted and ignored, as op-plugin ignores it.
"""

import numpy as np

from . import _attnref
from ._arrays import Converter
from ._npu_common import EXEC, index32
from ._npu_common import call as _call

_PFA = _attnref.PromptFlashAttentionParams
_IFA = _attnref.IncreFlashAttentionParams
_FIA = _attnref.FusedInferAttentionScoreParams
_INT32_MAX = 2147483647


def _reject(op, name, value, why):
    if value is not None:
        raise ValueError(f"torch_npu.{op}: {name} is not supported by attnref ({why})")


def _float32(a):
    """A float16 / bfloat16 scale as float32 (attnref's separate K / V scales are float32)."""
    if a is None or a.dtype == np.float32:
        return a
    if a.dtype == np.uint16:  # bfloat16 bits
        return (a.astype(np.uint32) << 16).view(np.float32)
    if a.dtype == np.float16:
        return a.astype(np.float32)
    return a


def _ints(conv, x, name):
    """An int[] argument: a list / tuple of ints (each checked to be an integer), or a CPU
    integer tensor (SGLang passes int32)."""
    if isinstance(x, (list, tuple)):
        return list(x)
    return conv(x, name)


def _common_renames():
    return {"key[0]": "key", "value[0]": "value"}


def npu_prompt_flash_attention(query, key, value, *, padding_mask=None, atten_mask=None,
                               pse_shift=None, actual_seq_lengths=None, deq_scale1=None,
                               quant_scale1=None, deq_scale2=None, quant_scale2=None,
                               quant_offset2=None, num_heads=1, scale_value=1.0,
                               pre_tokens=2147483647, next_tokens=0, input_layout="BSH",
                               num_key_value_heads=0, actual_seq_lengths_kv=None, sparse_mode=0):
    """CANN PromptFlashAttention: maps onto attnref.prompt_flash_attention with op-plugin's
    inner_precise 1 (sparse_mode 10-14: sparse_mode - 10 with inner_precise 0, op-plugin's
    high-precision aliases). padding_mask is accepted and ignored, as op-plugin ignores it (it
    is not passed to aclnnPromptFlashAttentionV3). Returns attention_out (BNSD_BSND: BSND)."""
    del padding_mask
    op = "npu_prompt_flash_attention"
    conv = Converter(op)
    for n, v in (("deq_scale1", deq_scale1), ("quant_scale1", quant_scale1),
                 ("deq_scale2", deq_scale2)):
        _reject(op, n, v, "the int8 query / key / value path is not in the Python module")
    for n, v in (("quant_scale2", quant_scale2), ("quant_offset2", quant_offset2)):
        _reject(op, n, v, "int8 output is not in the Python module")
    inner_precise = 1
    if 10 <= sparse_mode <= 14:
        inner_precise, sparse_mode = 0, sparse_mode - 10
    p = _PFA(num_heads=num_heads, scale_value=scale_value, pre_tokens=pre_tokens,
             next_tokens=next_tokens, input_layout=input_layout,
             num_key_value_heads=num_key_value_heads, sparse_mode=sparse_mode,
             inner_precise=inner_precise)
    kw = {"query": conv(query, "query"), "key": conv(key, "key"), "value": conv(value, "value"),
          "atten_mask": conv(atten_mask, "atten_mask"), "pse_shift": conv(pse_shift, "pse_shift"),
          "actual_seq_lengths": _ints(conv, actual_seq_lengths, "actual_seq_lengths"),
          "actual_seq_lengths_kv": _ints(conv, actual_seq_lengths_kv, "actual_seq_lengths_kv")}
    out = _call(op, _attnref._prompt_flash_attention, _common_renames(), p, kw, EXEC)
    return conv.result(out)


def npu_incre_flash_attention(query, key, value, *, padding_mask=None, atten_mask=None,
                              pse_shift=None, actual_seq_lengths=None, antiquant_scale=None,
                              antiquant_offset=None, block_table=None, dequant_scale1=None,
                              quant_scale1=None, dequant_scale2=None, quant_scale2=None,
                              quant_offset2=None, kv_padding_size=None, num_heads=1,
                              scale_value=1.0, input_layout="BSH", num_key_value_heads=0,
                              block_size=0, inner_precise=1):
    """CANN IncreFlashAttention: maps onto attnref.incre_flash_attention. key / value: one
    tensor (or a list of B tensors); paged with block_table, block_size and actual_seq_lengths
    (the kv lengths). int8 key / value with antiquant_scale (/ antiquant_offset) in the query's
    type. padding_mask is accepted and ignored, as op-plugin ignores it. Returns attention_out
    (the query's shape)."""
    del padding_mask
    op = "npu_incre_flash_attention"
    conv = Converter(op)
    for n, v in (("dequant_scale1", dequant_scale1), ("quant_scale1", quant_scale1),
                 ("dequant_scale2", dequant_scale2)):
        _reject(op, n, v, "IncreFlashAttention's int8 query path is not implemented")
    for n, v in (("quant_scale2", quant_scale2), ("quant_offset2", quant_offset2)):
        _reject(op, n, v, "int8 output is not in the Python module")
    p = _IFA(num_heads=num_heads, scale_value=scale_value, input_layout=input_layout,
             num_key_value_heads=num_key_value_heads, block_size=block_size,
             inner_precise=inner_precise)
    kw = {"query": conv(query, "query"), "key": conv(key, "key"), "value": conv(value, "value"),
          "atten_mask": conv(atten_mask, "atten_mask"), "pse_shift": conv(pse_shift, "pse_shift"),
          "actual_seq_lengths": _ints(conv, actual_seq_lengths, "actual_seq_lengths"),
          "antiquant_scale": conv(antiquant_scale, "antiquant_scale"),
          "antiquant_offset": conv(antiquant_offset, "antiquant_offset"),
          "block_table": index32(conv, block_table, "block_table", False),
          "kv_padding_size": conv(kv_padding_size, "kv_padding_size")}
    out = _call(op, _attnref._incre_flash_attention, _common_renames(), p, kw, EXEC)
    return conv.result(out)


def _fia_q_s(q, layout):
    """The query's S for the layouts whose Q_S == 1 takes the incremental branch (else None)."""
    if layout in ("BSH", "BSND") and q.ndim >= 2:
        return q.shape[1]
    if layout == "BNSD" and q.ndim == 4:
        return q.shape[2]
    return None


def _fia_window_decode(q, a):
    """True for a band (pre_tokens below the maximum, or next_tokens < 0) in a call that takes
    the incremental branch (BSH / BSND / BNSD with Q_S == 1, not MLA), which ignores it."""
    if a["pre_tokens"] == _INT32_MAX and a["next_tokens"] >= 0:
        return False
    if not isinstance(q, np.ndarray) or _fia_q_s(q, a["input_layout"]) != 1:
        return False
    head = q.shape[-1] // max(a["num_heads"], 1) if a["input_layout"] == "BSH" else q.shape[-1]
    return not (a["query_rope"] is not None and head == 512)


def _fia_kwargs(op, conv, a):
    """The C++ arguments and params of one npu_fused_infer_attention_score call (``a``: the
    torch_npu arguments by name)."""
    for n in ("dequant_scale1", "quant_scale1", "dequant_scale2"):
        _reject(op, n, a[n], "the int8 query / key / value path is not in the Python module")
    for n in ("quant_scale2", "quant_offset2"):
        _reject(op, n, a[n], "int8 output is not in the Python module")
    q = conv(a["query"], "query")
    if _fia_window_decode(q, a):
        raise ValueError(
            f"torch_npu.{op}: pre_tokens / next_tokens (a sliding window with Q_S == 1) are not "
            f"supported by attnref: the incremental branch ignores them (the vendor's documents "
            f"call them invalid there), so attnref would compute full attention; got "
            f"pre_tokens {a['pre_tokens']}, next_tokens {a['next_tokens']}")
    per_token = a["antiquant_mode"] == 1
    p = _FIA(num_heads=a["num_heads"], scale_value=a["scale"], pre_tokens=a["pre_tokens"],
             next_tokens=a["next_tokens"], input_layout=a["input_layout"],
             num_key_value_heads=a["num_key_value_heads"], sparse_mode=a["sparse_mode"],
             inner_precise=a["inner_precise"], block_size=a["block_size"],
             antiquant_mode=a["antiquant_mode"], key_antiquant_mode=a["key_antiquant_mode"],
             value_antiquant_mode=a["value_antiquant_mode"],
             softmax_lse_flag=bool(a["softmax_lse_flag"]))
    kw = {"query": q, "key": conv(a["key"], "key"), "value": conv(a["value"], "value")}
    kw["block_table"] = index32(conv, a["block_table"], "block_table", False)
    for n in ("pse_shift", "atten_mask", "query_padding_size", "kv_padding_size",
              "key_shared_prefix", "value_shared_prefix", "query_rope", "key_rope",
              "key_rope_antiquant_scale"):
        kw[n] = conv(a[n], n)
    for n in ("actual_seq_lengths", "actual_seq_lengths_kv", "actual_shared_prefix_len"):
        kw[n] = _ints(conv, a[n], n)
    suffix = "_per_token" if per_token else ""
    kw["antiquant_scale" + suffix] = conv(a["antiquant_scale"], "antiquant_scale")
    kw["antiquant_offset" + suffix] = conv(a["antiquant_offset"], "antiquant_offset")
    for n in ("key_antiquant_scale", "key_antiquant_offset", "value_antiquant_scale",
              "value_antiquant_offset"):
        kw[n] = _float32(conv(a[n], n))
    return p, kw


_FIA_RENAMES = dict(_common_renames(), **{
    "params.scale_value": "scale", "antiquant_scale_per_token": "antiquant_scale",
    "antiquant_offset_per_token": "antiquant_offset"})


def npu_fused_infer_attention_score(
        query, key, value, *, pse_shift=None, atten_mask=None, actual_seq_lengths=None,
        actual_seq_lengths_kv=None, dequant_scale1=None, quant_scale1=None, dequant_scale2=None,
        quant_scale2=None, quant_offset2=None, antiquant_scale=None, antiquant_offset=None,
        key_antiquant_scale=None, key_antiquant_offset=None, value_antiquant_scale=None,
        value_antiquant_offset=None, block_table=None, query_padding_size=None,
        kv_padding_size=None, key_shared_prefix=None, value_shared_prefix=None,
        actual_shared_prefix_len=None, query_rope=None, key_rope=None,
        key_rope_antiquant_scale=None, num_heads=1, scale=1.0, pre_tokens=2147483647,
        next_tokens=2147483647, input_layout="BSH", num_key_value_heads=0, sparse_mode=0,
        inner_precise=0, block_size=0, antiquant_mode=0, key_antiquant_mode=0,
        value_antiquant_mode=0, softmax_lse_flag=False):
    """CANN FusedInferAttentionScore: maps onto attnref.fused_infer_attention_score (scale ->
    scale_value; antiquant_scale / antiquant_offset with antiquant_mode 1 -> the per-token
    fields; float16 / bfloat16 separate K / V scales converted to float32). Returns
    (attention_out, softmax_lse); without softmax_lse_flag softmax_lse is an empty float32 tensor
    of shape [0], as op-plugin allocates it.

    ``npu_fused_infer_attention_score.out(..., workspace=None, out=[attention_out,
    softmax_lse])`` writes the caller's tensors in place (vLLM-Ascend's and SGLang's graph
    capture) and returns them; workspace (the NPU's scratch memory) is ignored."""
    a = dict(locals())
    op = "npu_fused_infer_attention_score"
    conv = Converter(op)
    p, kw = _fia_kwargs(op, conv, a)
    result = _call(op, _attnref._fused_infer_attention_score, _FIA_RENAMES, p, kw, EXEC)
    return conv.result(result)


def _npu_fused_infer_attention_score_out(
        query, key, value, *, pse_shift=None, atten_mask=None, actual_seq_lengths=None,
        actual_seq_lengths_kv=None, dequant_scale1=None, quant_scale1=None, dequant_scale2=None,
        quant_scale2=None, quant_offset2=None, antiquant_scale=None, antiquant_offset=None,
        key_antiquant_scale=None, key_antiquant_offset=None, value_antiquant_scale=None,
        value_antiquant_offset=None, block_table=None, query_padding_size=None,
        kv_padding_size=None, key_shared_prefix=None, value_shared_prefix=None,
        actual_shared_prefix_len=None, query_rope=None, key_rope=None,
        key_rope_antiquant_scale=None, num_heads=1, scale=1.0, pre_tokens=2147483647,
        next_tokens=2147483647, input_layout="BSH", num_key_value_heads=0, sparse_mode=0,
        inner_precise=0, block_size=0, antiquant_mode=0, key_antiquant_mode=0,
        value_antiquant_mode=0, softmax_lse_flag=False, workspace=None, out):
    """npu_fused_infer_attention_score.out: as npu_fused_infer_attention_score, writing
    out = [attention_out, softmax_lse] in place (softmax_lse only with softmax_lse_flag);
    returns (attention_out, softmax_lse), the caller's tensors. workspace is ignored."""
    a = dict(locals())
    del workspace
    op = "npu_fused_infer_attention_score.out"
    conv = Converter(op)
    if not isinstance(out, (list, tuple)) or len(out) != 2:
        raise TypeError(f"torch_npu.{op}: out must be [attention_out, softmax_lse]")
    p, kw = _fia_kwargs(op, conv, a)
    kw["attention_out"] = conv(out[0], "out[0]")
    kw["softmax_lse"] = conv(out[1], "out[1]")
    renames = dict(_FIA_RENAMES, attention_out="out[0]", softmax_lse="out[1]")
    _call(op, _attnref._fused_infer_attention_score, renames, p, kw, EXEC)
    return out[0], out[1]


npu_fused_infer_attention_score.out = _npu_fused_infer_attention_score_out

__all__ = ["npu_prompt_flash_attention", "npu_incre_flash_attention",
           "npu_fused_infer_attention_score"]
