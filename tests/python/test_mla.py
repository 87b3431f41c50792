"""attnref's MLA operators from Python: layer 1 (attnref.mla_preprocess, its stages, the MLA cache
write, mla_decode) and layer 2 (attnref.torch_npu.atb.npu_mla_preprocess), against references
written here in NumPy float64 (no attnref code), at small DeepSeek-shaped dims."""

import numpy as np
import pytest

import attnref
import attnref.torch_npu as torch_npu

RNG = np.random.default_rng(2027)
H0, C, R, Q, P, HEADS, N = 96, 64, 16, 48, 16, 3, 5  # the C++ tests' small dims
DIMS = dict(hidden_size=H0, kv_lora_rank=C, rope_dim=R, q_lora_rank=Q, nope_dim=P)


def randn(*shape, dtype=np.float16, scale=1.0, mean=0.0):
    return (mean + scale * RNG.standard_normal(shape)).astype(dtype)


def f16(a):
    """Rounded to float16, as float64."""
    return np.asarray(a, np.float64).astype(np.float16).astype(np.float64)


def close(got, ref, rel):
    got = np.asarray(got, np.float64)
    err = np.abs(got - ref).max()
    assert err <= rel * np.abs(ref).max(), (err, np.abs(ref).max())


def nz(w, c0):
    """NZ of the trailing [rows, cols] matrices: [.., ceil(cols/c0), ceil(rows/16)*16, c0]."""
    rows, cols = w.shape[-2:]
    rp, cp = -(-rows // 16) * 16, -(-cols // c0) * c0
    pad = np.zeros(w.shape[:-2] + (rp, cp), w.dtype)
    pad[..., :rows, :cols] = w
    return np.ascontiguousarray(pad.reshape(w.shape[:-2] + (rp, cp // c0, c0)).swapaxes(-3, -2))


def nz_row(cache, block, row, c0):
    """Row (block, row) of an NZ cache [blocks, W/c0, bs, c0]."""
    return cache[block, :, row, :].reshape(-1)


# ---- the float64 reference of the MlaPreprocess chain -----------------------------------------

def rms(x, g, eps=1e-5):
    x = np.asarray(x, np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * np.asarray(g, np.float64)


def rope(x, sin, cos, rt):
    """Rotate half per head: x [N, .., R], sin / cos [N, R]; T(T(x cos) + T(rot sin))."""
    x = np.asarray(x, np.float64)
    h = x.shape[-1] // 2
    rot = np.concatenate([-x[..., h:], x[..., :h]], -1)
    s, c = (np.asarray(t, np.float64).reshape((x.shape[0],) + (1,) * (x.ndim - 2) + (-1,))
            for t in (sin, cos))
    return rt(rt(x * c) + rt(rot * s))


def norm_matmul(x, g, b, w, rt, mode, ds=None, qs=None, qo=None, bias=None):
    """One RmsNormQuant + matmul of the chain: mode 'token' (per-token symmetric), 'tensor'
    (per-tensor asymmetric) or 'unquant'; w [out, in] (int8 or T)."""
    y = rms(x, g) + (0 if b is None else np.asarray(b, np.float64))
    w = np.asarray(w, np.float64)
    if mode == "unquant":
        return rt(rt(y) @ w.T)
    if mode == "token":
        h = rt(y)
        s = 127.0 / np.abs(h).max(-1, keepdims=True)
        q = np.clip(np.rint(h * s), -128, 127)
        return rt((q @ w.T) * ds * (1.0 / s))
    q = np.clip(np.rint(y * (1.0 / float(qs)) + float(qo)), -128, 127)
    return rt((q @ w.T + (0 if bias is None else bias)) * ds)


def preprocess_reference(t, mode, rt=f16):
    """(q_nope absorbed [N, heads, C] fp32, q_rope [N, heads, R], k_nope [N, C], k_rope [N, R])."""
    kw = dict(mode=mode, rt=rt)
    mm1 = norm_matmul(t["input"], t["gamma0"], t.get("beta0"), t["w1"], ds=t.get("ds0"),
                      qs=t.get("quant_scale0"), qo=t.get("quant_offset0"), bias=t.get("bias0"), **kw)
    mm2 = norm_matmul(mm1[:, C + R:], t["gamma1"], t.get("beta1"), t["w2"], ds=t.get("ds1"),
                      qs=t.get("quant_scale1"), qo=t.get("quant_offset1"), bias=t.get("bias1"), **kw)
    mm2 = mm2.reshape(N, HEADS, P + R)
    q_nope = np.einsum("thp,hpc->thc", mm2[..., :P], np.asarray(t["wuk"], np.float64))
    q_rope = rope(mm2[..., P:], t["sin"], t["cos"], rt)
    k_nope = rt(rms(mm1[:, :C], t["gamma2"]))
    k_rope = rope(mm1[:, C:C + R], t["sin"], t["cos"], rt)
    return q_nope, q_rope, k_nope, k_rope


def problem(mode, dtype=np.float16):
    """The tensors of one mla_preprocess call (ND weights) and, for the reference, w1, w2, ds0, ds1."""
    t = {"input": randn(N, H0, dtype=dtype), "gamma0": randn(H0, dtype=dtype, scale=0.1, mean=1),
         "beta0": randn(H0, dtype=dtype, scale=0.1), "gamma1": randn(Q, dtype=dtype, scale=0.1, mean=1),
         "beta1": randn(Q, dtype=dtype, scale=0.1), "gamma2": randn(C, dtype=dtype, scale=0.1, mean=1),
         "wuk": randn(HEADS, P, C, dtype=dtype, scale=0.3)}
    th = RNG.uniform(-3.2, 3.2, (N, R))
    t["sin"], t["cos"] = np.sin(th).astype(dtype), np.cos(th).astype(dtype)
    t["slot_mapping"] = np.array([3, 17, -1, 130, 0], np.int32)
    if mode == "unquant":
        t["wdqkv_float"] = t["w1"] = randn(C + R + Q, H0, dtype=dtype, scale=0.1)
        t["wuq_float"] = t["w2"] = randn(HEADS * (P + R), Q, dtype=dtype, scale=0.15)
        return t
    t["wdqkv"] = t["w1"] = RNG.integers(-8, 9, (C + R + Q, H0)).astype(np.int8)
    t["wuq"] = t["w2"] = RNG.integers(-8, 9, (HEADS * (P + R), Q)).astype(np.int8)
    lo, hi = (1e-2, 3e-2) if mode == "token" else (2e-4, 4e-4)  # outputs of order 1
    t["de_scale0"] = t["ds0"] = RNG.uniform(lo, hi, C + R + Q).astype(np.float32)
    t["de_scale1"] = t["ds1"] = RNG.uniform(lo, hi, HEADS * (P + R)).astype(np.float32)
    if mode == "tensor":
        t["quant_scale0"], t["quant_scale1"] = (np.array([v], dtype) for v in (0.02, 0.03))
        t["quant_offset0"], t["quant_offset1"] = np.array([3], np.int8), np.array([-2], np.int8)
        t["bias0"] = RNG.integers(-50, 50, C + R + Q).astype(np.int32)
        t["bias1"] = RNG.integers(-50, 50, HEADS * (P + R)).astype(np.int32)
    return t


def inputs(t, drop=("w1", "w2", "ds0", "ds1")):
    return {k: v for k, v in t.items() if k not in drop}


QM = {"unquant": attnref.MlaQuantMode.Unquant, "token": attnref.MlaQuantMode.PerTokenSymm,
      "tensor": attnref.MlaQuantMode.PerTensorAsymm}


def params(mode, cache_mode):
    return attnref.MlaPreprocessParams(dims=attnref.MlaDims(**DIMS), quant_mode=QM[mode],
                                       cache_mode=cache_mode)


# ---- mla_preprocess (layer 1) -------------------------------------------------------------------

def test_mla_preprocess_unquant_kvcache_matches_the_reference():
    t = problem("unquant")
    cache = np.full((2, 128, 1, C + R), 7, np.float16)
    q_out, q_i8, q_rope = attnref.mla_preprocess(params("unquant", attnref.MlaCacheMode.KvCache),
                                                 kv_cache=cache, **inputs(t))
    assert q_i8 is None and q_rope is None and q_out.shape == (N, HEADS, C + R)
    qn, qr, kn, kr = preprocess_reference(t, "unquant")
    close(q_out[..., :C], f16(qn), 2e-3)
    close(q_out[..., C:], qr, 2e-3)
    written = np.zeros((2, 128), bool)
    for i, s in enumerate(t["slot_mapping"]):
        if s >= 0:
            close(cache[s // 128, s % 128, 0, :C], kn[i], 2e-3)
            close(cache[s // 128, s % 128, 0, C:], kr[i], 2e-3)
            written[s // 128, s % 128] = True
    assert (cache[~written] == 7).all()


def test_mla_preprocess_per_token_krope_ctkv_matches_the_reference():
    t = problem("token")
    ctkv, krope = np.zeros((3, 64, 1, C), np.float16), np.zeros((3, 64, 1, R), np.float16)
    t["de_scale0_bits"] = t.pop("de_scale0").view(np.int32).astype(np.int64)  # the fp16 form
    q_out, _, q_rope = attnref.mla_preprocess(params("token", attnref.MlaCacheMode.KRopeCtkv),
                                              ctkv=ctkv, krope=krope, **inputs(t))
    assert q_out.shape == (N, HEADS, C) and q_rope.shape == (N, HEADS, R)
    qn, qr, kn, kr = preprocess_reference(t, "token")
    # int8 quantization: a value on a rounding edge may land one step away from the float64 one.
    close(q_out, f16(qn), 1e-2)
    close(q_rope, qr, 1e-2)
    for i, s in enumerate(t["slot_mapping"]):
        if s >= 0:
            close(ctkv[s // 64, s % 64, 0], kn[i], 1e-2)
            close(krope[s // 64, s % 64, 0], kr[i], 1e-2)


def test_mla_preprocess_int8_nzcache_with_nz_weights_per_tensor():
    t = problem("tensor")
    ctkv_i8 = np.full((2, C // 32, 128, 32), -77, np.int8)
    krope = np.zeros((2, R // 16, 128, 16), np.float16)
    scales = {"ctkv_scale": np.array([0.05], np.float16),
              "q_nope_scale": RNG.uniform(40, 80, HEADS).astype(np.float16)}
    nd = inputs(t)
    nzw = dict(nd, wdqkv=nz(t["wdqkv"], 32), wuq=nz(t["wuq"], 32), wuk=nz(t["wuk"], 16))
    p = params("tensor", attnref.MlaCacheMode.Int8NzCache)
    q_out, q_i8, q_rope = attnref.mla_preprocess(p, ctkv_i8=ctkv_i8, krope=krope, **nzw, **scales)
    assert q_out is None and q_i8.dtype == np.int8
    qn, qr, kn, kr = preprocess_reference(t, "tensor")
    ref_q = np.clip(np.rint(f16(qn) * scales["q_nope_scale"].astype(np.float64)[None, :, None]), -128, 127)
    assert np.abs(q_i8.astype(np.int64) - ref_q).max() <= 1
    close(q_rope, qr, 1e-2)
    for i, s in enumerate(t["slot_mapping"]):
        if s >= 0:
            ref_k = np.clip(np.rint(kn[i] * (1 / 0.05)), -128, 127)
            assert np.abs(nz_row(ctkv_i8, s // 128, s % 128, 32).astype(np.int64) - ref_k).max() <= 1
            close(nz_row(krope, s // 128, s % 128, 16), kr[i], 1e-2)
    # The ND weights give the same bits.
    ctkv2, krope2 = np.full_like(ctkv_i8, -77), np.zeros_like(krope)
    _, q_i8_nd, q_rope_nd = attnref.mla_preprocess(p, ctkv_i8=ctkv2, krope=krope2, **nd, **scales)
    assert np.array_equal(q_i8, q_i8_nd) and np.array_equal(q_rope, q_rope_nd)
    assert np.array_equal(ctkv_i8, ctkv2) and np.array_equal(krope, krope2)


def test_mla_preprocess_bf16_torch_writes_the_callers_caches():
    torch = pytest.importorskip("torch")
    t = problem("unquant", np.float32)
    tt = {k: torch.from_numpy(v).bfloat16() if v.dtype == np.float32 else torch.from_numpy(v)
          for k, v in t.items()}
    kv = torch.zeros(2, 128, 1, C + R, dtype=torch.bfloat16)
    q_out, _, _ = attnref.mla_preprocess(params("unquant", 0), kv_cache=kv, **inputs(tt))
    assert isinstance(q_out, torch.Tensor) and q_out.dtype == torch.bfloat16

    def bf(a):
        return torch.from_numpy(np.asarray(a, np.float64)).bfloat16().double().numpy()
    ref = {k: v.double().numpy() if v.dtype == torch.bfloat16 else v.numpy() for k, v in tt.items()}
    qn, qr, kn, kr = preprocess_reference(ref, "unquant", rt=bf)
    close(q_out[..., :C].double().numpy(), bf(qn), 1.6e-2)
    close(q_out[..., C:].double().numpy(), qr, 1.6e-2)
    close(kv[0, 3, 0, :C].double().numpy(), kn[0], 1.6e-2)
    assert int((kv != 0).any(-1).sum()) == 4  # 4 slots written, -1 skipped


def test_mla_preprocess_rejects_before_writing_and_names_the_argument():
    t = problem("token")
    ctkv, krope = np.zeros((3, 64, 1, C), np.float16), np.zeros((3, 64, 1, R), np.float16)
    p = params("token", attnref.MlaCacheMode.KRopeCtkv)
    bad = dict(inputs(t), slot_mapping=np.array([3, 17, -1, 192, 0], np.int32))
    with pytest.raises(IndexError, match="slot_mapping"):
        attnref.mla_preprocess(p, ctkv=ctkv, krope=krope, **bad)
    assert not ctkv.any() and not krope.any()
    with pytest.raises(ValueError, match="bias0"):
        attnref.mla_preprocess(p, ctkv=ctkv, krope=krope, bias0=np.zeros(C + R + Q, np.int32), **inputs(t))
    with pytest.raises(TypeError, match="gamma1"):
        attnref.mla_preprocess(p, ctkv=ctkv, krope=krope, **dict(inputs(t), gamma1=t["gamma1"].astype(np.float32)))
    with pytest.raises(TypeError, match="kv_cach"):
        attnref.mla_preprocess(p, kv_cach=ctkv, **inputs(t))


# ---- the stages ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,rel", [(np.float16, 2e-3), (np.float32, 1e-6)])
def test_rms_norm_reads_a_strided_x(dtype, rel):
    big = randn(6, 40, dtype=dtype)
    x, g = big[::2, 4:36], randn(32, dtype=dtype, mean=1)
    out = attnref.rms_norm(x=x, gamma=g, epsilon=1e-6)
    assert out.dtype == dtype and out.shape == (3, 32)
    close(out, rms(x, g, 1e-6), rel)


def test_rms_norm_quant_per_token_and_per_tensor():
    x, g, b = randn(4, 32), randn(32, mean=1, scale=0.1), randn(32, scale=0.1)
    q, ds, zp, uq = attnref.rms_norm_quant(x=x, gamma=g, beta=b, mode=attnref.MlaQuantMode.PerTokenSymm)
    assert zp is None and uq is None and q.dtype == np.int8 and ds.dtype == np.float32
    h = f16(rms(x, g) + b.astype(np.float64))
    amax = np.abs(h).max(-1)
    assert np.abs(q - np.rint(h * (127 / amax)[:, None])).max() <= 1
    close(ds, amax / 127, 1e-6)
    q2, ds2, _, _ = attnref.rms_norm_quant(x=x, gamma=g, quant_scale=np.array([0.02], np.float16),
                                           quant_offset=np.array([5], np.int8), mode=0)
    assert ds2 is None
    ref = np.clip(np.rint((rms(x, g)) / np.float64(np.float16(0.02)) + 5), -128, 127)
    assert np.abs(q2 - ref).max() <= 1


@pytest.mark.parametrize("fmt", ["NdOutIn", "NdInOut", "Nz"])
def test_int8_matmul_in_every_weight_format(fmt):
    a = RNG.integers(-128, 128, (5, 64)).astype(np.int8)
    w = RNG.integers(-128, 128, (48, 64)).astype(np.int8)
    bias, ds = RNG.integers(-999, 999, 48).astype(np.int32), RNG.uniform(1e-4, 1e-3, 48).astype(np.float32)
    stored = {"NdOutIn": w, "NdInOut": np.ascontiguousarray(w.T), "Nz": nz(w, 32)}[fmt]
    out = attnref.int8_matmul(a=a, w=stored, w_format=getattr(attnref.WeightFormat, fmt), bias=bias,
                              de_scale=ds, dtype=np.float32)
    ref = (a.astype(np.int64) @ w.T.astype(np.int64) + bias) * ds.astype(np.float64)
    assert out.dtype == np.float32
    close(out, ref, 1e-6)


def test_int8_matmul_per_token_into_a_torch_bf16_out():
    torch = pytest.importorskip("torch")
    a, w = RNG.integers(-128, 128, (3, 32)).astype(np.int8), RNG.integers(-9, 9, (16, 32)).astype(np.int8)
    ts, ds = RNG.uniform(0.01, 0.02, 3).astype(np.float32), RNG.uniform(0.01, 0.02, 16).astype(np.float32)
    out = torch.full((3, 16), 7.0, dtype=torch.bfloat16)
    got = attnref.int8_matmul(a=torch.from_numpy(a), w=torch.from_numpy(w), de_scale=torch.from_numpy(ds),
                              token_scale=torch.from_numpy(ts), out=out)
    assert got is out
    ref = (a.astype(np.int64) @ w.T.astype(np.int64)) * ds[None, :].astype(np.float64) * ts[:, None]
    close(out.double().numpy(), ref, 1.6e-2)


def test_float_matmul_and_q_nope_absorb_nd_equals_nz():
    a, w = randn(4, 40), randn(24, 40, scale=0.2)
    out = attnref.float_matmul(a=a, w=w)
    close(out, f16(a.astype(np.float64) @ w.T.astype(np.float64)), 2e-3)
    assert np.array_equal(out, attnref.float_matmul(a=a, w=nz(w, 16), w_format=attnref.WeightFormat.Nz,
                                                    out=np.zeros((4, 24), np.float16)))
    q, wuk = randn(N, HEADS, P), randn(HEADS, P, C, scale=0.3)
    o = attnref.q_nope_absorb(q=q, wuk=wuk)
    assert o.dtype == np.float32 and o.shape == (N, HEADS, C)
    close(o, np.einsum("thp,hpc->thc", q.astype(np.float64), wuk.astype(np.float64)), 1e-6)
    assert np.array_equal(o, attnref.q_nope_absorb(q=q, wuk=nz(wuk, 16)))


def test_rope_rotate_half_in_place():
    x = randn(N, HEADS, R)
    th = RNG.uniform(-3, 3, (N, R))
    sin, cos = np.sin(th).astype(np.float16), np.cos(th).astype(np.float16)
    ref = rope(x, sin, cos, f16)
    flat = attnref.rope_rotate_half(x=x.reshape(N, HEADS * R), sin=sin, cos=cos)  # heads: 48 / R
    got = attnref.rope_rotate_half(x=x, sin=sin, cos=cos, heads=HEADS, out=x)
    assert got is x
    close(x, ref, 2e-3)
    assert np.array_equal(flat.reshape(N, HEADS, R), x)


# ---- mla_reshape_and_cache ------------------------------------------------------------------------

def test_mla_reshape_and_cache_nz_writes_the_slots_and_nothing_else():
    kn, kr = randn(4, C), randn(4, R)
    ctkv, krope = np.full((2, C // 16, 32, 16), 9, np.float16), np.full((2, R // 16, 32, 16), 9, np.float16)
    slots = np.array([33, -1, 0, 63], np.int32)
    assert attnref.mla_reshape_and_cache(mode=attnref.MlaCacheMode.NzCache, k_nope=kn, k_rope=kr,
                                         slot_mapping=slots, ctkv=ctkv, krope=krope) is None
    touched = np.zeros((2, 32), bool)
    for i, s in enumerate(slots):
        if s >= 0:
            assert np.array_equal(nz_row(ctkv, s // 32, s % 32, 16), kn[i])
            assert np.array_equal(nz_row(krope, s // 32, s % 32, 16), kr[i])
            touched[s // 32, s % 32] = True
    assert (ctkv.transpose(0, 2, 1, 3)[~touched] == 9).all()
    with pytest.raises(IndexError, match="slot_mapping"):
        attnref.mla_reshape_and_cache(mode=3, k_nope=kn, k_rope=kr, slot_mapping=slots + 40,
                                      ctkv=ctkv, krope=krope)


# ---- mla_decode ----------------------------------------------------------------------------------

def decode_case(dtype, B=3, H=4, bs=16, lens=(20, 1, 33)):
    q = randn(B, H, C + R, dtype=dtype)
    cache = randn(9, bs, 1, C + R, dtype=dtype)
    table = RNG.permutation(9)[:B * 3].reshape(B, 3).astype(np.int32)
    return q, cache, table, np.array(lens, np.int32)


def decode_reference(q, cache, table, lens, scale):
    out = np.zeros(q.shape[:2] + (C,))
    for b, n in enumerate(lens):
        rows = np.stack([cache[table[b, t // cache.shape[1]], t % cache.shape[1], 0] for t in range(n)])
        rows = rows.astype(np.float64)
        s = scale * q[b].astype(np.float64) @ rows.T
        p = np.exp(s - s.max(-1, keepdims=True))
        out[b] = (p / p.sum(-1, keepdims=True)) @ rows[:, :C]
    return out


@pytest.mark.parametrize("dtype,rel", [(np.float16, 2e-3), (np.float32, 1e-5)])
def test_mla_decode_matches_the_reference_and_the_unabsorbed_form(dtype, rel):
    q, cache, table, lens = decode_case(dtype)
    qs = np.concatenate([q, q], 1)[:, ::2]  # a strided query
    out = attnref.mla_decode(q=qs, kv_cache=cache, block_table=table, context_lens=lens,
                             kv_lora_rank=C, rope_dim=R, scale=0.1)
    assert out.dtype == dtype and out.shape == (3, 4, C)
    ref = decode_reference(qs, cache, table, lens, 0.1)
    close(out, ref, rel)
    # Un-absorbed: q_nope · (wuk c) == (wukᵀ q_nope) · c.
    q_nope, wuk = randn(3, 4, P, dtype=dtype), randn(4, P, C, dtype=dtype, scale=0.3)
    un = attnref.mla_decode_unabsorbed(attnref.MlaDecodeParams(kv_lora_rank=C, rope_dim=R, scale=0.1),
                                       q_nope=q_nope, q_rope=np.ascontiguousarray(qs[..., C:]), wuk=wuk,
                                       kv_cache=cache, block_table=table, context_lens=lens.tolist())
    absorbed = np.einsum("bhp,hpc->bhc", q_nope.astype(np.float64), wuk.astype(np.float64))
    close(un, decode_reference(np.concatenate([absorbed, qs[..., C:]], -1), cache, table, lens, 0.1), rel)


def test_mla_decode_bf16_torch_and_errors():
    torch = pytest.importorskip("torch")
    q, cache, table, lens = decode_case(np.float32)
    out = torch.empty(3, 4, C, dtype=torch.bfloat16)
    got = attnref.mla_decode(q=torch.from_numpy(q).bfloat16(), kv_cache=torch.from_numpy(cache).bfloat16(),
                             block_table=torch.from_numpy(table), context_lens=torch.from_numpy(lens),
                             out=out, kv_lora_rank=C, rope_dim=R, scale=0.1)
    assert got is out
    ref = decode_reference(torch.from_numpy(q).bfloat16().double().numpy(),
                           torch.from_numpy(cache).bfloat16().double().numpy(), table, lens, 0.1)
    close(out.double().numpy(), ref, 1.6e-2)
    bad = table.copy()
    bad[2, 1] = 99
    with pytest.raises(IndexError, match="block_table"):
        attnref.mla_decode(q=q, kv_cache=cache, block_table=bad, context_lens=lens, kv_lora_rank=C, rope_dim=R)
    with pytest.raises(ValueError, match="q.shape"):
        attnref.mla_decode(q=q, kv_cache=cache, block_table=table, context_lens=lens)  # C 512
    with pytest.raises(TypeError, match="kv_cache"):
        attnref.mla_decode(q=q, kv_cache=cache.astype(np.float16), block_table=table, context_lens=lens,
                           kv_lora_rank=C, rope_dim=R)


# ---- layer 2: torch_npu.atb.npu_mla_preprocess -----------------------------------------------------

def npu_args(t, nz_weights=False):
    """npu_mla_preprocess's positional arguments from a layer-1 problem (caches appended later)."""
    w1, w2, wuk = t["wdqkv"], t["wuq"], t["wuk"]
    if nz_weights:  # torch_npu holds NZ weights as [1, in/32, out, 32]
        w1, w2, wuk = nz(w1, 32)[None], nz(w2, 32)[None], nz(wuk, 16)
    ds0 = t["de_scale0"].view(np.int32).astype(np.int64)  # int64 with fp16 models
    return [t["input"], t["gamma0"], t["beta0"], w1, ds0, t["gamma1"], t["beta1"], w2, t["de_scale1"],
            t["gamma2"], t["cos"], t["sin"], wuk]


def test_npu_mla_preprocess_default_modes_are_layer_1_bit_for_bit():
    t = problem("token")
    ctkv, krope = np.zeros((3, 64, 1, C), np.float16), np.zeros((3, 64, 1, R), np.float16)
    q0, kc0, q1, kc1 = torch_npu.atb.npu_mla_preprocess(*npu_args(t), ctkv, krope, t["slot_mapping"])
    assert kc0 is ctkv and kc1 is krope
    c2, k2 = np.zeros_like(ctkv), np.zeros_like(krope)
    ref_q, _, ref_r = attnref.mla_preprocess(params("token", attnref.MlaCacheMode.KRopeCtkv), ctkv=c2,
                                             krope=k2, **inputs(t))
    assert np.array_equal(q0, ref_q) and np.array_equal(q1, ref_r)
    assert np.array_equal(ctkv, c2) and np.array_equal(krope, k2) and ctkv.any()


def test_npu_mla_preprocess_out_form_int8_nzcache_torch():
    torch = pytest.importorskip("torch")
    t = problem("tensor")
    kv = torch.full((2, C // 32, 128, 32), -77, dtype=torch.int8)
    kr = torch.zeros(2, R // 16, 128, 16, dtype=torch.float16)
    q0, q1 = torch.zeros(N, HEADS, C, dtype=torch.int8), torch.zeros(N, HEADS, R, dtype=torch.float16)
    scales = {"ctkv_scale": np.array([0.05], np.float16),
              "q_nope_scale": RNG.uniform(40, 80, HEADS).astype(np.float16)}
    tt = [torch.from_numpy(a) for a in npu_args(t, nz_weights=True)]
    res = torch_npu.atb.npu_mla_preprocess(
        *tt, kv, kr, torch.from_numpy(t["slot_mapping"]),
        quant_scale0=torch.from_numpy(t["quant_scale0"]), quant_offset0=torch.from_numpy(t["quant_offset0"]),
        bias0=torch.from_numpy(t["bias0"]), quant_scale1=torch.from_numpy(t["quant_scale1"]),
        quant_offset1=torch.from_numpy(t["quant_offset1"]), bias1=torch.from_numpy(t["bias1"]),
        ctkv_scale=torch.from_numpy(scales["ctkv_scale"]), q_nope_scale=torch.from_numpy(scales["q_nope_scale"]),
        cache_mode="int8_nzcache", quant_mode="per_tensor_quant_asymm",
        q_out0=q0, kv_cache_out0=kv, q_out1=q1, kv_cache_out1=kr)
    assert res[0] is q0 and res[1] is kv and res[2] is q1 and res[3] is kr
    c2, k2 = np.full((2, C // 32, 128, 32), -77, np.int8), np.zeros((2, R // 16, 128, 16), np.float16)
    _, ref_q, ref_r = attnref.mla_preprocess(params("tensor", attnref.MlaCacheMode.Int8NzCache),
                                             ctkv_i8=c2, krope=k2, **inputs(t), **scales)
    assert np.array_equal(q0.numpy(), ref_q) and np.array_equal(q1.numpy(), ref_r)
    assert np.array_equal(kv.numpy(), c2) and np.array_equal(kr.numpy(), k2)


def test_npu_mla_preprocess_rejections_name_the_torch_npu_argument():
    t = problem("token")
    ctkv, krope = np.zeros((3, 64, 1, C), np.float16), np.zeros((3, 64, 1, R), np.float16)
    args = npu_args(t) + [ctkv, krope, t["slot_mapping"]]
    with pytest.raises(ValueError, match="cache_mode 'kvcache' not supported"):
        torch_npu.atb.npu_mla_preprocess(*args, cache_mode="kvcache")
    with pytest.raises(ValueError, match="quant_mode 'unquant' not supported"):
        torch_npu.atb.npu_mla_preprocess(*args, quant_mode="unquant")
    with pytest.raises(ValueError, match="kv_cache_out0 not supported by attnref"):
        torch_npu.atb.npu_mla_preprocess(*args, kv_cache_out0=ctkv.copy())
    with pytest.raises(TypeError, match="descale0"):
        torch_npu.atb.npu_mla_preprocess(*(args[:4] + [args[4].astype(np.int32)] + args[5:]))
    bad = args[:-1] + [np.array([3, 17, -1, 999, 0], np.int32)]
    with pytest.raises(IndexError, match=r"torch_npu\.atb\.npu_mla_preprocess: .*slotmapping"):
        torch_npu.atb.npu_mla_preprocess(*bad)
    with pytest.raises(ValueError, match="q_out0"):
        torch_npu.atb.npu_mla_preprocess(*args, q_out0=np.zeros((N, HEADS, C + 1), np.float16))
    assert not ctkv.any() and not krope.any()


def test_params_repr_enums_and_vendor_integers():
    p = attnref.MlaPreprocessParams(cache_mode=2, quant_mode=attnref.MlaQuantMode.Unquant)
    assert p.cache_mode == attnref.MlaCacheMode.Int8NzCache
    assert "cache_mode=MlaCacheMode.Int8NzCache" in repr(p) and "hidden_size=7168" in repr(p)
    p.dims.hidden_size = 96
    assert p.dims == attnref.MlaDims(hidden_size=96)
    with pytest.raises(TypeError, match="no field named 'heads'"):
        attnref.MlaDecodeParams(heads=3)
