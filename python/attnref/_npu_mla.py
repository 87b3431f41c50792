"""torch_npu's MLA calls: ``torch_npu.atb.npu_mla_preprocess`` (ATB MlaPreprocess), exposed as
``attnref.torch_npu.atb.npu_mla_preprocess``.

torch_npu's ``npu_mla_prolog`` / ``_v2`` / ``_v3`` (aclnn MlaProlog) are a different operator that
attnref does not implement; they are not provided.
"""

import types

import numpy as np

from . import _attnref
from ._arrays import Converter
from ._npu_common import EXEC, call, index32, out_tensor, tensor

_MP = _attnref.MlaPreprocessParams
_CM = _attnref.MlaCacheMode
_QM = _attnref.MlaQuantMode

# op-plugin's MLAPreprocessAtb.cpp maps (the only strings torch_npu accepts).
_CACHE_MODES = {"krope_ctkv": _CM.KRopeCtkv, "int8_nzcache": _CM.Int8NzCache,
                "nzcache": _CM.NzCache}
_QUANT_MODES = {"per_tensor_quant_asymm": _QM.PerTensorAsymm,
                "per_token_quant_symm": _QM.PerTokenSymm}

_OP = "atb.npu_mla_preprocess"
_RENAMES = {"de_scale0_bits": "descale0", "de_scale0": "descale0", "de_scale1_bits": "descale1",
            "de_scale1": "descale1", "slot_mapping": "slotmapping", "q_out_i8": "q_out0",
            "q_out": "q_out0", "q_rope_out": "q_out1", "ctkv_i8": "kv_cache", "ctkv": "kv_cache",
            "krope": "kv_cache_rope", "wdqkv_float": "wdqkv", "wuq_float": "wuq"}


def _call(impl, *args):
    return call(_OP, impl, _RENAMES, *args)


def _mode(table, value, default, name):
    key = default if value is None else value
    if key not in table:
        raise ValueError(f"torch_npu.{_OP}: {name} '{key}' not supported (torch_npu takes "
                         f"{', '.join(repr(k) for k in table)})")
    return table[key]


def _nz_weight(a):
    """An NZ weight as torch_npu holds it, [1, in/32, out, 32], seen as attnref's 3-D NZ."""
    return a[0] if a is not None and a.ndim == 4 and a.shape[0] == 1 else a


def _descale(conv, x, name, kw, field):
    a = tensor(conv, x, name)
    if a.dtype == np.int64:
        kw[field + "_bits"] = a
    elif a.dtype == np.float32:
        kw[field] = a
    else:
        raise TypeError(f"torch_npu.{_OP}: {name} must be int64 (float16 models) or float32 "
                        f"(bfloat16 models), got {a.dtype}")


def _same_tensor(a, b):
    return (a is not None and b is not None and a.shape == b.shape and a.strides == b.strides
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def _dims(kw):
    """MlaDims from the tensors (torch_npu's are fixed by the shapes: 7168, 512, 64, 1536, 128)."""
    def extent(name, axis):
        a = kw.get(name)
        try:
            return int(a.shape[axis]) if axis is not None else int(a.size)
        except (AttributeError, IndexError, TypeError):
            return 0
    wuk = kw.get("wuk")
    p_axis = 2 if wuk is not None and getattr(wuk, "ndim", 0) == 4 else 1
    return _attnref.MlaDims(hidden_size=extent("input", -1), kv_lora_rank=extent("gamma2", None),
                            rope_dim=extent("cos", -1), q_lora_rank=extent("gamma1", None),
                            nope_dim=extent("wuk", p_axis))


def _caches(conv, cm, kv_cache, kv_cache_rope, kv_cache_out0, kv_cache_out1, kw):
    kc, kr = tensor(conv, kv_cache, "kv_cache"), tensor(conv, kv_cache_rope, "kv_cache_rope")
    for out, cache, name, cname in ((kv_cache_out0, kc, "kv_cache_out0", "kv_cache"),
                                    (kv_cache_out1, kr, "kv_cache_out1", "kv_cache_rope")):
        if out is not None and not _same_tensor(tensor(conv, out, name), cache):
            raise ValueError(f"torch_npu.{_OP}: {name} not supported by attnref unless it is "
                             f"{cname} itself (the cache is updated in place)")
    kw["ctkv_i8" if cm == _CM.Int8NzCache else "ctkv"] = kc
    kw["krope"] = kr


def npu_mla_preprocess(input, gamma0, beta0, wdqkv, descale0, gamma1, beta1, wuq, descale1,
                       gamma2, cos, sin, wuk, kv_cache, kv_cache_rope, slotmapping, *,
                       quant_scale0=None, quant_offset0=None, bias0=None, quant_scale1=None,
                       quant_offset1=None, bias1=None, ctkv_scale=None, q_nope_scale=None,
                       cache_mode=None, quant_mode=None, q_out0=None, kv_cache_out0=None,
                       q_out1=None, kv_cache_out1=None):
    """ATB MlaPreprocess (torch_npu.atb.npu_mla_preprocess and its .out form).

    cache_mode: 'krope_ctkv' (default; kv_cache [blocks, bs, 1, C], kv_cache_rope
    [blocks, bs, 1, R]), 'int8_nzcache' (int8 NZ kv_cache [blocks, C/32, bs, 32], NZ
    kv_cache_rope [blocks, R/16, bs, 16], int8 q_out0) or 'nzcache'. quant_mode:
    'per_token_quant_symm' (default) or 'per_tensor_quant_asymm'. wdqkv / wuq: ND [out, in] or
    NZ [1, in/32, out, 32]; wuk ND [heads, P, C] or NZ [heads, C/16, P, 16]; descale int64
    (fp32 bits) or float32. epsilon 1e-5. The caches are updated in place; kv_cache_out0 /
    kv_cache_out1, when passed, must be those caches. Returns (q_out0 [T, heads, C],
    kv_cache, q_out1 [T, heads, R], kv_cache_rope); q_out0 / q_out1 passed in are written in
    place (contiguous)."""
    conv = Converter(_OP)
    cm = _mode(_CACHE_MODES, cache_mode, "krope_ctkv", "cache_mode")
    qm = _mode(_QUANT_MODES, quant_mode, "per_token_quant_symm", "quant_mode")
    req = {"input": input, "gamma0": gamma0, "beta0": beta0, "wdqkv": wdqkv, "gamma1": gamma1,
           "beta1": beta1, "wuq": wuq, "gamma2": gamma2, "cos": cos, "sin": sin, "wuk": wuk}
    kw = {k: tensor(conv, v, k) for k, v in req.items()}
    kw["wdqkv"], kw["wuq"] = _nz_weight(kw["wdqkv"]), _nz_weight(kw["wuq"])
    kw["slot_mapping"] = index32(conv, slotmapping, "slotmapping")
    opt = {"quant_scale0": quant_scale0, "quant_offset0": quant_offset0, "bias0": bias0,
           "quant_scale1": quant_scale1, "quant_offset1": quant_offset1, "bias1": bias1,
           "ctkv_scale": ctkv_scale, "q_nope_scale": q_nope_scale}
    kw.update({k: None if v is None else tensor(conv, v, k) for k, v in opt.items()})
    _descale(conv, descale0, "descale0", kw, "de_scale0")
    _descale(conv, descale1, "descale1", kw, "de_scale1")
    _caches(conv, cm, kv_cache, kv_cache_rope, kv_cache_out0, kv_cache_out1, kw)
    if q_out0 is not None:
        kw["q_out_i8" if cm == _CM.Int8NzCache else "q_out"] = out_tensor(conv, q_out0, "q_out0")
    if q_out1 is not None:
        kw["q_rope_out"] = out_tensor(conv, q_out1, "q_out1")
    p = _MP(dims=_dims(kw), cache_mode=cm, quant_mode=qm, epsilon=1e-5)
    q, q8, qr = _call(_attnref._mla_preprocess, p, kw, EXEC)
    if q is None:
        q = q8
    kc = kv_cache_out0 if kv_cache_out0 is not None else kv_cache
    kr = kv_cache_out1 if kv_cache_out1 is not None else kv_cache_rope
    return (q_out0 if q_out0 is not None else conv.result(q), kc,
            q_out1 if q_out1 is not None else conv.result(qr), kr)


atb = types.SimpleNamespace(npu_mla_preprocess=npu_mla_preprocess)
atb.__doc__ = "torch_npu.atb: the ATB calls bound under torch_npu.atb (npu_mla_preprocess)."

__all__ = ["atb"]
