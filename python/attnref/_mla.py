"""Layer 1, MLA: MlaPreprocess, its public stages, the MLA cache write and the MLA decode attention.

Operators with several outputs return the tuple of their C++ Outputs fields in order (None where
the mode writes none); an output passed in is written in place and returned as the caller's own
object. Scalars that are not params fields (``mode``, ``epsilon``, ``heads``, ``rotary_coeff``,
``w_format``, ``dtype``) are plain keyword arguments.
"""

from . import _attnref
from ._arrays import Converter
from ._attnref import (MlaCacheMode, MlaDecodeParams, MlaDims, MlaPreprocessParams, MlaQuantMode,
                       WeightFormat)
from ._operators import _exec_config, _params, make_operator


def _dtype_name(x):
    """A dtype (NumPy, torch or a name) as 'float16', 'bfloat16' or 'float32'."""
    if x is None or isinstance(x, str):
        return x
    s = str(x)
    if s.startswith("torch."):
        return s[len("torch."):]
    import numpy as np
    return np.dtype(x).name


def _as_callers(conv, result, given):
    """NumPy results as the caller's kind; an array the caller passed as that caller's object."""
    if isinstance(result, tuple):
        return tuple(_as_callers(conv, r, given) for r in result)
    if result is None:
        return None
    mine = given.get(id(result))
    return mine if mine is not None else conv.result(result)


def _operator(op, impl, params_cls, doc, scalars=(), takes_exec=True, returns=True):
    """A Python function for the bound ``impl(params, kw, exec)`` (``impl(kw[, exec])`` without
    params): tensors converted, ``scalars`` passed as they are, outputs as the caller's."""
    names = frozenset(params_cls.fields) if params_cls is not None else frozenset()
    plain = frozenset(scalars)

    def operator(params=None, *, exec=None, threads=None, **kwargs):
        conv = Converter(op)
        fields = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
        kw = {k: (v if k in plain else conv(v, k)) for k, v in kwargs.items()}
        if "dtype" in plain and "dtype" in kw:
            kw["dtype"] = _dtype_name(kw["dtype"])
        x = _exec_config(op, exec, threads)
        if params_cls is None:
            if params is not None or fields:
                raise TypeError(f"attnref.{op}: takes no params")
            result = impl(kw, x) if takes_exec else impl(kw)
        else:
            result = impl(_params(op, params_cls, params, fields), kw, x)
        if not returns:
            return None
        given = {id(kw[k]): v for k, v in kwargs.items() if k not in plain and v is not None}
        return _as_callers(conv, result, given)

    operator.__name__ = op
    operator.__qualname__ = op
    operator.__doc__ = doc
    return operator


mla_preprocess = make_operator(
    "mla_preprocess", _attnref._mla_preprocess, MlaPreprocessParams,
    """ATB MlaPreprocess: hidden state -> query and latent paged KV cache (DeepSeek MLA).

    Dims come from params.dims (MlaDims: hidden_size H0, kv_lora_rank C, rope_dim R, q_lora_rank
    Q, nope_dim P; heads = wuk.shape[0]). Tensors (MlaPreprocessInputs): input [N, H0]; gamma0,
    beta0 (H0); quant_scale0, quant_offset0 ([1], PerTensorAsymm); wdqkv int8 (or wdqkv_float in
    Unquant), logically [C + R + Q, H0]: 2-D [out, in] ([in, out] with transpose_wdq False) or
    3-D NZ; de_scale0 float32 or de_scale0_bits int64; bias0 int32; gamma1, beta1, quant_scale1,
    quant_offset1, wuq (wuq_float), de_scale1 (_bits), bias1 likewise for [heads·(P + R), Q];
    gamma2 (C); cos, sin [N, R]; wuk [heads, P, C] (4-D: NZ); slot_mapping int32 [N];
    ctkv_scale, q_nope_scale (Int8NzCache). Caches, updated in place (the cache_mode's only):
    kv_cache (KvCache), ctkv + krope (KRopeCtkv, NzCache), ctkv_i8 + krope (Int8NzCache).
    Returns (q_out, q_out_i8, q_rope_out): q_out [N, heads, C + R] (KvCache) or [N, heads, C];
    q_out_i8 int8 [N, heads, C] (Int8NzCache); q_rope_out [N, heads, R] (not KvCache); None
    where the mode writes none. float16 or bfloat16 models.""",
    outputs=("q_out", "q_out_i8", "q_rope_out"))

mla_decode = make_operator(
    "mla_decode", _attnref._mla_decode, MlaDecodeParams,
    """MLA decode attention, absorbed form: q [B, heads, C + R] (mla_preprocess's KvCache q_out)
    over kv_cache [blocks, blockSize, 1, C + R] (V = the first C channels), block_table int32
    [B, maxBlocks], context_lens (B ints). Returns out [B, heads, C]. float16, bfloat16 or
    float32.""")

mla_decode_unabsorbed = make_operator(
    "mla_decode_unabsorbed", _attnref._mla_decode_unabsorbed, MlaDecodeParams,
    """MLA decode with the latent expanded per head (verification form): q_nope [B, heads, P],
    q_rope [B, heads, R], wuk [heads, P, C], kv_cache, block_table, context_lens as mla_decode.
    Returns out [B, heads, C].""")

mla_reshape_and_cache = _operator(
    "mla_reshape_and_cache", _attnref._mla_reshape_and_cache, None,
    """MlaPreprocess's cache write: k_nope [N, C] and k_rope [N, R] into the caches of ``mode``
    (an MlaCacheMode, default KvCache) at slot_mapping (int32 [N]; negative: skipped):
    kv_cache, or ctkv + krope, or ctkv_i8 + krope (Int8NzCache, with quant_scale3 [1]). In place;
    returns None. float16 or bfloat16.""",
    scalars=("mode",), takes_exec=False, returns=False)

rms_norm = _operator(
    "rms_norm", _attnref._rms_norm, None,
    """RmsNorm: out [rows, n] = T(x · rsqrt(mean(x²) + epsilon) · gamma); x [rows, n], gamma (n),
    epsilon (default 1e-5). Returns out.""", scalars=("epsilon",), takes_exec=False)

rms_norm_quant = _operator(
    "rms_norm_quant", _attnref._rms_norm_quant, None,
    """RmsNormQuant in ``mode`` (an MlaQuantMode, default PerTensorAsymm), epsilon (default 1e-5):
    x [rows, n], gamma, beta (optional), quant_scale [1] and quant_offset int8 [1]
    (PerTensorAsymm). Returns (q int8 [rows, n], descale float32 [rows] (per-token modes),
    zero_point float32 [rows] (PerTokenAsymm), unquant [rows, n] (Unquant)), None where the mode
    writes none.""", scalars=("mode", "epsilon"), takes_exec=False)

int8_matmul = _operator(
    "int8_matmul", _attnref._int8_matmul, None,
    """out [M, N] = dequant(a int8 [M, K] · wᵀ): w int8, logically [N, K], stored as w_format
    (WeightFormat, default NdOutIn; NdInOut [K, N]; Nz); exactly one of de_scale float32 (N) and
    de_scale_bits int64 (N); bias int32 (N, per-tensor form), token_scale and zero_point float32
    (M, per-token forms). out's type: out's, else ``dtype`` (float16 default, bfloat16,
    float32). Returns out.""", scalars=("w_format", "dtype"))

float_matmul = _operator(
    "float_matmul", _attnref._float_matmul, None,
    """out [M, N] = a [M, K] · wᵀ (fp32 sums), w logically [N, K] in w_format (default NdOutIn;
    with Nz, N is out's last extent when out is given, else the padded row count). Returns
    out.""", scalars=("w_format",))

rope_rotate_half = _operator(
    "rope_rotate_half", _attnref._rope_rotate_half, None,
    """Rotate-half RoPE: x and out [N, heads·R] or [N, heads, R], sin / cos [N, R], ``heads``
    (default 1), rotary_coeff (2 only). out may be x (in place). Returns out.""",
    scalars=("heads", "rotary_coeff"), takes_exec=False)

q_nope_absorb = make_operator(
    "q_nope_absorb", _attnref._q_nope_absorb, None,
    """out float32 [N, heads, C] = q [N, heads, P] · wuk[h] per head; wuk [heads, P, C] or 4-D
    NZ [heads, C/C0, ceil(P/16)·16, C0]. Returns out.""")

__all__ = ["MlaCacheMode", "MlaDecodeParams", "MlaDims", "MlaPreprocessParams", "MlaQuantMode",
           "WeightFormat", "mla_preprocess", "mla_decode", "mla_decode_unabsorbed",
           "mla_reshape_and_cache", "rms_norm", "rms_norm_quant", "int8_matmul", "float_matmul",
           "rope_rotate_half", "q_nope_absorb"]
