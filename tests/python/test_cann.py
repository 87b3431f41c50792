"""attnref's CANN operators from Python: layer 1 (attnref.prompt_flash_attention,
incre_flash_attention, fused_infer_attention_score) and layer 2 (attnref.torch_npu's
npu_prompt_flash_attention, npu_incre_flash_attention, npu_fused_infer_attention_score and its
.out form), against float64 NumPy references written here, on the shapes serving stacks pass."""

import numpy as np
import pytest

import attnref
import attnref.torch_npu as tnpu

INT32_MAX = 2147483647
MASK2048 = np.triu(np.ones((2048, 2048), dtype=np.uint8), 1)  # content unread in modes 2-4


# ---- references (float64, plain NumPy) ----------------------------------------------------

def attend(q, k, v, scale, keep=None, bias=None):
    """q [N, Sq, D], k [KVN, Skv, D], v [KVN, Skv, Dv]; keep [Sq, Skv] (None: every key); bias
    [N, Sq, Skv] added after scaling (None: none). Returns out [N, Sq, Dv] (rows without a key:
    0) and lse [N, Sq] (+inf there)."""
    n, sq = q.shape[:2]
    g = n // k.shape[0]
    out = np.zeros((n, sq, v.shape[2]))
    lse = np.full((n, sq), np.inf)
    for h in range(n):
        s = np.einsum("id,jd->ij", q[h], k[h // g]) * scale
        if bias is not None:
            s = s + bias[h]
        if keep is not None:
            s = np.where(keep, s, -np.inf)
        for i in range(sq):
            if not np.isfinite(s[i]).any():
                continue
            m = s[i].max()
            p = np.exp(s[i] - m)
            out[h, i] = p @ v[h // g] / p.sum()
            lse[h, i] = m + np.log(p.sum())
    return out, lse


def keep_band(sq, skv, mode, pre=INT32_MAX, nxt=INT32_MAX):
    """Which keys each row keeps: 0 all, 3 bottom-right causal, 4 bottom-right band."""
    i = np.arange(sq)[:, None]
    j = np.arange(skv)[None, :]
    d = j - i - (skv - sq)
    if mode == 0:
        return np.ones((sq, skv), bool)
    if mode == 3:
        return d <= 0
    return (d >= -pre) & (d <= nxt)


def f64(a):
    return np.asarray(a, dtype=np.float64)


def to_layout(x, layout):
    """Canonical [B, N, S, D] into a layout (contiguous)."""
    b, n, s, d = x.shape
    if layout == "BSH":
        return np.ascontiguousarray(x.transpose(0, 2, 1, 3).reshape(b, s, n * d))
    if layout == "BSND":
        return np.ascontiguousarray(x.transpose(0, 2, 1, 3))
    return np.ascontiguousarray(x)


def from_out(o, layout, n):
    """An output in a layout back to canonical [B, N, S, Dv] (BNSD_BSND writes BSND)."""
    if layout == "BSH":
        b, s, h = o.shape
        return o.reshape(b, s, n, h // n).transpose(0, 2, 1, 3)
    if layout in ("BSND", "BNSD_BSND"):
        return o.transpose(0, 2, 1, 3)
    return o


def close(out, ref, tol):
    out = f64(out)
    err = np.abs(out - ref).max()
    assert err <= tol * max(1.0, np.abs(ref).max()), err


def rnd(rng, shape, dtype=np.float16):
    return rng.standard_normal(shape).astype(dtype)


def paged(rng, kv, bs, extra=2, dtype=np.float16):
    """Per-sequence keys kv[b] [KVN, L_b, D] into a shuffled cache [nb, bs, KVN, D] (unused rows
    NaN, or 0 for int8) and its block table [B, maxBlocks] int32."""
    kvn, d = kv[0].shape[0], kv[0].shape[2]
    need = [(x.shape[1] + bs - 1) // bs for x in kv]
    nb = sum(need) + extra
    fill = 0 if np.dtype(dtype).kind == "i" else np.nan
    cache = np.full((nb, bs, kvn, d), fill, dtype=dtype)
    ids = rng.permutation(nb)
    table = np.zeros((len(kv), max(max(need), 1)), np.int32)
    used = 0
    for b, x in enumerate(kv):
        for c in range(need[b]):
            blk = ids[used]
            used += 1
            table[b, c] = blk
            rows = x[:, c * bs:(c + 1) * bs].transpose(1, 0, 2)
            cache[blk, :rows.shape[0]] = rows
    return cache, table


# ---- PromptFlashAttention ------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["BSH", "BSND", "BNSD", "BNSD_BSND"])
def test_pfa_layouts_gqa_lengths(layout):
    rng = np.random.default_rng(1)
    b, n, kvn, s1, s2, d, dv = 2, 4, 2, 5, 7, 16, 8
    q, k, v = rnd(rng, (b, n, s1, d)), rnd(rng, (b, kvn, s2, d)), rnd(rng, (b, kvn, s2, dv))
    ql, kl = [5, 3], [7, 4]
    o = attnref.prompt_flash_attention(
        query=to_layout(q, layout), key=to_layout(k, layout[:4]), value=to_layout(v, layout[:4]),
        actual_seq_lengths=ql, actual_seq_lengths_kv=kl, num_heads=n, num_key_value_heads=kvn,
        scale_value=0.25, input_layout=layout)
    assert o.dtype == np.float16
    o = from_out(o, layout, n)
    for bi in range(b):
        ref, _ = attend(f64(q[bi, :, :ql[bi]]), f64(k[bi, :, :kl[bi]]), f64(v[bi, :, :kl[bi]]),
                        0.25)
        close(o[bi, :, :ql[bi]], ref, 2e-3)
        assert not o[bi, :, ql[bi]:].any()  # padded rows are 0


@pytest.mark.parametrize("mode,pre,nxt", [(3, INT32_MAX, 0), (4, 2, 1)])
def test_pfa_bottom_right_modes(mode, pre, nxt):
    rng = np.random.default_rng(2)
    n, s1, s2, d = 2, 4, 9, 16
    q, k, v = rnd(rng, (1, n, s1, d)), rnd(rng, (1, n, s2, d)), rnd(rng, (1, n, s2, d))
    o = attnref.prompt_flash_attention(
        query=q, key=k, value=v, atten_mask=MASK2048.astype(bool), num_heads=n,
        scale_value=0.25, input_layout="BNSD", sparse_mode=mode, pre_tokens=pre,
        next_tokens=nxt)
    ref, _ = attend(f64(q[0]), f64(k[0]), f64(v[0]), 0.25, keep_band(s1, s2, mode, pre, nxt))
    close(o[0], ref, 2e-3)


def test_pfa_mask_pse_sparse0_default_next_tokens_is_causal():
    # sparse 0 with a mask: the band -pre <= j - i <= next_tokens (default 0), then the mask;
    # pse_shift [1, N, S1', S2'] (larger than needed) added after scaling
    rng = np.random.default_rng(3)
    n, s, d = 2, 6, 16
    q, k, v = rnd(rng, (1, s, n * d)), rnd(rng, (1, s, n * d)), rnd(rng, (1, s, n * d))
    mask = rng.random((s, s)) < 0.3
    np.fill_diagonal(mask, False)
    pse = rnd(rng, (1, n, s + 1, s + 2))
    o = attnref.prompt_flash_attention(query=q, key=k, value=v, atten_mask=mask.astype(np.int8),
                                       pse_shift=pse, num_heads=n, scale_value=0.25)
    keep = np.tril(np.ones((s, s), bool)) & ~mask
    split = lambda x: f64(x[0].reshape(s, n, d).transpose(1, 0, 2))  # noqa: E731
    ref, _ = attend(split(q), split(k), split(v), 0.25, keep, f64(pse[0, :, :s, :s]))
    close(split(o), ref, 2e-3)


def test_pfa_tnd_varlen_causal():
    rng = np.random.default_rng(4)
    n, kvn, d = 4, 1, 16
    ql, kl = [3, 5], [6, 5]
    q, k, v = rnd(rng, (8, n, d)), rnd(rng, (11, kvn, d)), rnd(rng, (11, kvn, d))
    o = attnref.prompt_flash_attention(
        query=q, key=k, value=v, atten_mask=MASK2048, actual_seq_lengths=np.cumsum(ql),
        actual_seq_lengths_kv=np.cumsum(kl), num_heads=n, num_key_value_heads=kvn,
        scale_value=0.25, input_layout="TND", sparse_mode=3)
    q0 = k0 = 0
    for a, c in zip(ql, kl):
        tr = lambda x, lo, ln: f64(x[lo:lo + ln].transpose(1, 0, 2))  # noqa: E731
        ref, _ = attend(tr(q, q0, a), tr(k, k0, c), tr(v, k0, c), 0.25, keep_band(a, c, 3))
        close(o[q0:q0 + a].transpose(1, 0, 2), ref, 2e-3)
        q0, k0 = q0 + a, k0 + c


def test_pfa_float32_strided_inputs_bitwise():
    rng = np.random.default_rng(5)
    n, s, d = 2, 5, 16
    big = rnd(rng, (1, n, 2 * s, 2 * d), np.float32)
    q, k, v = big[:, :, ::2, ::2], big[:, :, 1::2, ::2], big[:, :, 1::2, 1::2]
    assert not q.flags.c_contiguous
    kw = dict(num_heads=n, scale_value=0.25, input_layout="BNSD", sparse_mode=0)
    o1 = attnref.prompt_flash_attention(query=q, key=k, value=v, **kw)
    o2 = attnref.prompt_flash_attention(query=q.copy(), key=k.copy(), value=v.copy(), **kw)
    assert o1.dtype == np.float32 and np.array_equal(o1, o2)
    ref, _ = attend(f64(q[0]), f64(k[0]), f64(v[0]), 0.25)
    close(o1[0], ref, 1e-5)


def test_pfa_in_place_untouched_memory():
    rng = np.random.default_rng(6)
    n, s, d = 2, 4, 16
    q, k, v = rnd(rng, (1, n, s, d)), rnd(rng, (1, n, s, d)), rnd(rng, (1, n, s, d))
    buf = np.full((3, n, s, d), 7, np.float16)
    out = buf[1:2]
    r = attnref.prompt_flash_attention(query=q, key=k, value=v, attention_out=out, num_heads=n,
                                       input_layout="BNSD", scale_value=0.25)
    assert r is out
    assert (buf[0] == 7).all() and (buf[2] == 7).all()
    fresh = attnref.prompt_flash_attention(query=q, key=k, value=v, num_heads=n,
                                           input_layout="BNSD", scale_value=0.25)
    assert np.array_equal(out, fresh)


# ---- IncreFlashAttention -------------------------------------------------------------------

def test_ifa_contiguous_bsh_lengths_and_threads():
    rng = np.random.default_rng(7)
    b, n, kvn, s, d = 3, 4, 2, 9, 16
    q, k, v = rnd(rng, (b, n, 1, d)), rnd(rng, (b, kvn, s, d)), rnd(rng, (b, kvn, s, d))
    lens = [9, 4, 1]
    kw = dict(query=to_layout(q, "BSH"), key=to_layout(k, "BSH"), value=to_layout(v, "BSH"),
              actual_seq_lengths=lens, num_heads=n, num_key_value_heads=kvn, scale_value=0.25)
    o = attnref.incre_flash_attention(**kw)
    assert np.array_equal(o, attnref.incre_flash_attention(threads=2, **kw))
    o = from_out(o, "BSH", n)
    for bi in range(b):
        ref, _ = attend(f64(q[bi]), f64(k[bi, :, :lens[bi]]), f64(v[bi, :, :lens[bi]]), 0.25)
        close(o[bi], ref, 2e-3)


def test_ifa_paged_bnsd_cache():
    rng = np.random.default_rng(8)
    n, kvn, d, bs = 4, 2, 16, 16
    lens = [37, 5]
    kv = [rnd(rng, (kvn, ln, d)) for ln in lens]
    vv = [rnd(rng, (kvn, ln, d)) for ln in lens]
    kc, table = paged(np.random.default_rng(9), kv, bs)
    vc, _ = paged(np.random.default_rng(9), vv, bs)
    q = rnd(rng, (2, n, 1, d))
    o = attnref.incre_flash_attention(
        query=q, key=kc.transpose(0, 2, 1, 3), value=vc.transpose(0, 2, 1, 3), block_table=table,
        actual_seq_lengths=lens, num_heads=n, num_key_value_heads=kvn, scale_value=0.25,
        input_layout="BNSD", block_size=bs)
    for bi in range(2):
        ref, _ = attend(f64(q[bi]), f64(kv[bi]), f64(vv[bi]), 0.25)
        close(o[bi], ref, 2e-3)


def antiquant_ref(x8, scale, offset):
    return (f64(x8) + f64(offset)) * f64(scale)


def test_ifa_int8_antiquant_paged_bsh():
    # vLLM-Ascend's w8a8 decode: BSH query, a 3-D int8 cache, antiquant_scale (2, KV_N * D)
    rng = np.random.default_rng(10)
    n, kvn, d, bs = 4, 2, 16, 32
    lens = [40, 9]
    k8 = [rng.integers(-100, 100, (kvn, ln, d)).astype(np.int8) for ln in lens]
    v8 = [rng.integers(-100, 100, (kvn, ln, d)).astype(np.int8) for ln in lens]
    kc, table = paged(np.random.default_rng(11), k8, bs, dtype=np.int8)
    vc, _ = paged(np.random.default_rng(11), v8, bs, dtype=np.int8)
    sc = (rng.random((2, kvn * d)) * 0.02 + 0.005).astype(np.float16)
    off = rng.integers(-3, 3, (2, kvn * d)).astype(np.float16)
    q = rnd(rng, (2, 1, n * d))
    o = attnref.incre_flash_attention(
        query=q, key=kc.reshape(kc.shape[0], bs, -1), value=vc.reshape(vc.shape[0], bs, -1),
        block_table=table, actual_seq_lengths=lens, antiquant_scale=sc, antiquant_offset=off,
        num_heads=n, num_key_value_heads=kvn, scale_value=0.25, block_size=bs)
    for bi in range(2):
        ch = lambda x, i: x[i].reshape(kvn, 1, d)  # noqa: E731
        kk = antiquant_ref(k8[bi], ch(sc, 0), ch(off, 0))
        vv = antiquant_ref(v8[bi], ch(sc, 1), ch(off, 1))
        ref, _ = attend(f64(q[bi, 0].reshape(n, 1, d)), kk, vv, 0.25)
        close(o[bi, 0].reshape(n, 1, d), ref, 2e-3)


# ---- FusedInferAttentionScore --------------------------------------------------------------

def tnd_paged_case(rng, ql, kl, n=4, kvn=2, d=64, bs=128, dtype=np.float16):
    kv = [rnd(rng, (kvn, c, d), dtype) for c in kl]
    vv = [rnd(rng, (kvn, c, d), dtype) for c in kl]
    kc, table = paged(np.random.default_rng(20), kv, bs, dtype=dtype)
    vc, _ = paged(np.random.default_rng(20), vv, bs, dtype=dtype)
    q = rnd(rng, (sum(ql), n, d), dtype)
    return q, kv, vv, kc, vc, table


@pytest.mark.parametrize("mode,pre", [(3, INT32_MAX), (4, 5)])
def test_fia_tnd_paged_prefill_vllm(mode, pre):
    # vLLM-Ascend: key = key_cache.view(num_block, block_size, -1), TND, cumulative query ends,
    # per-sequence kv lengths; the second sequence is a chunked prefill (kv longer than q)
    rng = np.random.default_rng(12)
    ql, kl = [6, 3], [6, 140]
    n, kvn, d, bs = 4, 2, 64, 128
    q, kv, vv, kc, vc, table = tnd_paged_case(rng, ql, kl)
    o, lse = attnref.fused_infer_attention_score(
        query=q, key=kc.reshape(kc.shape[0], bs, -1), value=vc.reshape(vc.shape[0], bs, -1),
        block_table=table, atten_mask=MASK2048, actual_seq_lengths=list(np.cumsum(ql)),
        actual_seq_lengths_kv=kl, num_heads=n, num_key_value_heads=kvn, scale_value=0.125,
        input_layout="TND", block_size=bs, sparse_mode=mode, pre_tokens=pre, next_tokens=0,
        softmax_lse_flag=True)
    assert o.shape == (9, n, d) and lse.shape == (9, n, 1) and lse.dtype == np.float32
    q0 = 0
    for a, c, kk, vvv in zip(ql, kl, kv, vv):
        ref, rl = attend(f64(q[q0:q0 + a].transpose(1, 0, 2)), f64(kk), f64(vvv), 0.125,
                         keep_band(a, c, mode, pre, 0))
        close(o[q0:q0 + a].transpose(1, 0, 2), ref, 2e-3)
        np.testing.assert_allclose(lse[q0:q0 + a, :, 0].T, rl, rtol=1e-5, atol=1e-4)
        q0 += a


@pytest.mark.parametrize("layout", ["BSH", "BNSD"])
def test_fia_paged_decode(layout):
    rng = np.random.default_rng(13)
    n, kvn, d, bs = 4, 2, 16, 16
    lens = [33, 0, 16]
    kv = [rnd(rng, (kvn, ln, d)) for ln in lens]
    vv = [rnd(rng, (kvn, ln, d)) for ln in lens]
    kc, table = paged(np.random.default_rng(14), kv, bs)
    vc, _ = paged(np.random.default_rng(14), vv, bs)
    q = rnd(rng, (3, n, 1, d))
    cache = (lambda c: c.reshape(c.shape[0], bs, -1)) if layout == "BSH" else (
        lambda c: c.transpose(0, 2, 1, 3))
    o, lse = attnref.fused_infer_attention_score(
        query=to_layout(q, layout), key=cache(kc), value=cache(vc), block_table=table,
        actual_seq_lengths_kv=lens, num_heads=n, num_key_value_heads=kvn, scale_value=0.25,
        input_layout=layout, block_size=bs)
    assert lse.shape == (0,) and lse.dtype == np.float32
    o = from_out(o, layout, n)
    for bi in range(3):
        ref, _ = attend(f64(q[bi]), f64(kv[bi]), f64(vv[bi]), 0.25)
        close(o[bi], ref, 2e-3)


def mla_case(rng, lens, n=4, bs=16, dtype=np.float16):
    ck = [rnd(rng, (1, ln, 512), dtype) for ln in lens]
    kr = [rnd(rng, (1, ln, 64), dtype) for ln in lens]
    cache, table = paged(np.random.default_rng(30), ck, bs, dtype=dtype)
    rope, _ = paged(np.random.default_rng(30), kr, bs, dtype=dtype)
    qn, qr = rnd(rng, (len(lens), n, 1, 512), dtype), rnd(rng, (len(lens), n, 1, 64), dtype)
    return ck, kr, cache.transpose(0, 2, 1, 3), rope.transpose(0, 2, 1, 3), table, qn, qr


def mla_ref(qn, qr, ck, kr, scale, keep=None):
    q = np.concatenate([f64(qn), f64(qr)], axis=-1)
    k = np.concatenate([f64(ck), f64(kr)], axis=-1)
    return attend(q, k, f64(ck), scale, keep)[0]


def test_fia_mla_paged_decode_bnsd():
    # SGLang's MLA decode: q_nope [B, N, 1, 512], cache [blocks, 1, page, 512], rope 64
    rng = np.random.default_rng(15)
    lens = [20, 37]
    ck, kr, cache, rope, table, qn, qr = mla_case(rng, lens)
    o, _ = attnref.fused_infer_attention_score(
        query=qn, key=cache, value=cache, query_rope=qr, key_rope=rope, block_table=table,
        actual_seq_lengths_kv=lens, num_heads=4, num_key_value_heads=1, input_layout="BNSD",
        scale_value=0.05, block_size=16)
    assert o.shape == (2, 4, 1, 512)
    for bi in range(2):
        close(o[bi], mla_ref(qn[bi], qr[bi], ck[bi], kr[bi], 0.05), 2e-3)


def test_fia_mla_sliding_window_decode():
    # MLA's sparse_mode 4: BSND, 128 heads, keys [kv - 1 - pre_tokens, kv - 1]
    rng = np.random.default_rng(16)
    lens, pre, n = [30, 9], 6, 128
    ck, kr, cache, rope, table, qn, qr = mla_case(rng, lens, n=n, bs=64)
    o, _ = attnref.fused_infer_attention_score(
        query=qn.transpose(0, 2, 1, 3), key=cache[:, 0], value=cache[:, 0],
        query_rope=qr.transpose(0, 2, 1, 3), key_rope=rope[:, 0], block_table=table,
        actual_seq_lengths_kv=lens, atten_mask=MASK2048, num_heads=n, num_key_value_heads=1,
        input_layout="BSND", scale_value=0.05, block_size=64, sparse_mode=4, pre_tokens=pre,
        next_tokens=0)
    for bi in range(2):
        keep = keep_band(1, lens[bi], 4, pre, 0)
        close(o[bi].transpose(1, 0, 2), mla_ref(qn[bi], qr[bi], ck[bi], kr[bi], 0.05, keep),
              2e-3)


def test_fia_int8_kv_antiquant_decode_and_lse():
    rng = np.random.default_rng(17)
    b, n, kvn, s, d = 2, 4, 2, 12, 16
    q = rnd(rng, (b, 1, n, d))
    k8 = rng.integers(-90, 90, (b, s, kvn, d)).astype(np.int8)
    v8 = rng.integers(-90, 90, (b, s, kvn, d)).astype(np.int8)
    ks = (rng.random((1, kvn * d)) * 0.02 + 0.01).astype(np.float32)
    vs = (rng.random((1, kvn * d)) * 0.02 + 0.01).astype(np.float32)
    o, lse = attnref.fused_infer_attention_score(
        query=q, key=k8, value=v8, key_antiquant_scale=ks, value_antiquant_scale=vs,
        actual_seq_lengths_kv=[12, 5], num_heads=n, num_key_value_heads=kvn, scale_value=0.25,
        input_layout="BSND", softmax_lse_flag=True)
    assert lse.shape == (b, n, 1, 1)
    for bi, ln in enumerate([12, 5]):
        kk = f64(k8[bi, :ln].transpose(1, 0, 2)) * f64(ks).reshape(kvn, 1, d)
        vv = f64(v8[bi, :ln].transpose(1, 0, 2)) * f64(vs).reshape(kvn, 1, d)
        ref, rl = attend(f64(q[bi].transpose(1, 0, 2)), kk, vv, 0.25)
        close(o[bi].transpose(1, 0, 2), ref, 2e-3)
        np.testing.assert_allclose(lse[bi, :, 0, 0], rl[:, 0], rtol=1e-5, atol=1e-4)


def test_fia_outputs_in_place_and_lse_untouched_without_flag():
    rng = np.random.default_rng(18)
    n, s, d = 2, 4, 16
    q, k, v = rnd(rng, (1, n, s, d)), rnd(rng, (1, n, 6, d)), rnd(rng, (1, n, 6, d))
    out = np.full((1, n, s, d), 5, np.float16)
    lse = np.full((3,), 9, np.float32)
    r = attnref.fused_infer_attention_score(query=q, key=k, value=v, attention_out=out,
                                            softmax_lse=lse, num_heads=n, input_layout="BNSD")
    assert r[0] is out and r[1] is lse and (lse == 9).all()
    ref, _ = attend(f64(q[0]), f64(k[0]), f64(v[0]), 1.0)
    close(out[0], ref, 2e-3)
    p = attnref.FusedInferAttentionScoreParams(num_heads=n, input_layout="BNSD",
                                               softmax_lse_flag=True)
    lse2 = np.zeros((1, n, s, 1), np.float32)
    o2, l2 = attnref.fused_infer_attention_score(p, query=q, key=k, value=v, softmax_lse=lse2)
    assert l2 is lse2 and np.array_equal(o2, out)
    np.testing.assert_allclose(lse2[0, :, :, 0], attend(f64(q[0]), f64(k[0]), f64(v[0]), 1.0)[1],
                               rtol=1e-5)


# ---- params and layer-1 errors -------------------------------------------------------------

def test_params_types():
    p = attnref.FusedInferAttentionScoreParams(num_heads=8, input_layout="TND")
    assert "num_heads=8" in repr(p) and "pse_order=PseOrder.ScaleThenAdd" in repr(p)
    p.pse_order = 1
    assert p.pse_order == attnref.PseOrder.AddThenScale
    assert attnref.PromptFlashAttentionParams().next_tokens == 0
    assert attnref.IncreFlashAttentionParams().inner_precise == 1
    assert "antiquant_mode" in attnref.IncreFlashAttentionParams.fields
    with pytest.raises(TypeError, match="no field named 'scale'"):
        attnref.PromptFlashAttentionParams(scale=1.0)


def small():
    rng = np.random.default_rng(19)
    return rnd(rng, (1, 2, 4, 16)), rnd(rng, (1, 2, 6, 16))


def test_layer1_errors():
    q, k = small()
    kw = dict(num_heads=2, input_layout="BNSD")
    with pytest.raises(TypeError, match="query"):
        attnref.prompt_flash_attention(query=q.astype(np.float64), key=k, value=k, **kw)
    with pytest.raises(TypeError, match="atten_mask"):
        attnref.prompt_flash_attention(query=q, key=k, value=k, atten_mask=np.zeros((4, 6)), **kw)
    with pytest.raises(TypeError, match="bogus"):
        attnref.fused_infer_attention_score(query=q, key=k, value=k, bogus=k, **kw)
    with pytest.raises(ValueError, match="sparse_mode"):
        attnref.prompt_flash_attention(query=q, key=k, value=k, sparse_mode=7, **kw)
    with pytest.raises(TypeError, match="key"):
        attnref.fused_infer_attention_score(query=q.astype(np.float32), key=k.astype(np.int8),
                                            value=k.astype(np.int8), **kw)
    with pytest.raises(TypeError, match="key"):
        attnref.fused_infer_attention_score(query=q, key=k.astype(np.int32),
                                            value=k.astype(np.int32), **kw)
    out = np.full((1, 2, 4, 16), 3, np.float16)
    with pytest.raises(ValueError, match="actual_seq_lengths_kv"):
        attnref.fused_infer_attention_score(query=q, key=k, value=k, attention_out=out,
                                            actual_seq_lengths_kv=[9], **kw)
    assert (out == 3).all()


def test_layer1_block_table_out_of_range():
    rng = np.random.default_rng(21)
    q, kc = rnd(rng, (1, 1, 32)), rnd(rng, (2, 16, 32))
    with pytest.raises(IndexError, match="block_table"):
        attnref.incre_flash_attention(query=q, key=kc, value=kc, block_table=np.array(
            [[0, 5]], np.int32), actual_seq_lengths=[20], num_heads=2, block_size=16)


# ---- layer 2: torch_npu's calls --------------------------------------------------------------

def test_npu_prompt_flash_attention_matches_layer1():
    rng = np.random.default_rng(22)
    n, s, d = 2, 5, 16
    q, k, v = rnd(rng, (2, s, n * d)), rnd(rng, (2, s, n * d)), rnd(rng, (2, s, n * d))
    o2 = tnpu.npu_prompt_flash_attention(q, k, v, atten_mask=MASK2048, num_heads=n,
                                         scale_value=0.25, sparse_mode=13,  # 3, high precision
                                         actual_seq_lengths=[5, 3], actual_seq_lengths_kv=[5, 4])
    o1 = attnref.prompt_flash_attention(query=q, key=k, value=v, atten_mask=MASK2048,
                                        num_heads=n, scale_value=0.25, sparse_mode=3,
                                        inner_precise=0, actual_seq_lengths=[5, 3],
                                        actual_seq_lengths_kv=[5, 4])
    assert np.array_equal(o1, o2)
    split = lambda x, ln: f64(x[:ln].reshape(ln, n, d).transpose(1, 0, 2))  # noqa: E731
    ref, _ = attend(split(q[1], 3), split(k[1], 4), split(v[1], 4), 0.25, keep_band(3, 4, 3))
    close(split(o2[1], 3), ref, 2e-3)


def test_npu_layer2_rejections_name_arguments():
    q, k = small()
    with pytest.raises(ValueError, match="torch_npu.npu_prompt_flash_attention: quant_scale2"):
        tnpu.npu_prompt_flash_attention(q, k, k, quant_scale2=np.ones(1, np.float32),
                                        num_heads=2, input_layout="BNSD")
    with pytest.raises(ValueError, match="dequant_scale1"):
        tnpu.npu_incre_flash_attention(q[:, :, :1], k, k, dequant_scale1=np.ones(1, np.float32),
                                       num_heads=2, input_layout="BNSD")
    with pytest.raises(ValueError, match="pre_tokens"):  # sliding window with Q_S == 1
        tnpu.npu_fused_infer_attention_score(q[:, :, :1], k, k, num_heads=2,
                                             input_layout="BNSD", pre_tokens=3)
    head = r"^torch_npu.npu_fused_infer_attention_score: "
    with pytest.raises(ValueError, match=head + r".*\bscale\b"):
        tnpu.npu_fused_infer_attention_score(q, k, k, num_heads=2, input_layout="BNSD",
                                             scale=float("nan"))
    with pytest.raises(ValueError) as e:
        tnpu.npu_fused_infer_attention_score(q, k[..., :8], k, num_heads=2, input_layout="BNSD")
    assert "key.shape" in str(e.value) and "key[0]" not in str(e.value)
    with pytest.raises(TypeError, match="out must be"):
        tnpu.npu_fused_infer_attention_score.out(q, k, k, num_heads=2, input_layout="BNSD",
                                                 out=q)


# ---- layer 2 with torch tensors (vLLM-Ascend and SGLang calls, bf16) --------------------------

def bf16_close(out, ref):
    close(out.float().numpy(), ref, 1.6e-2)


def test_npu_fia_vllm_tnd_prefill_bf16():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(23)
    ql, kl = [4, 2], [4, 130]
    n, kvn, d, bs = 4, 2, 64, 128
    q, kv, vv, kc, vc, table = tnd_paged_case(rng, ql, kl, dtype=np.float32)
    tb = lambda x: torch.from_numpy(x).to(torch.bfloat16)  # noqa: E731
    key_cache, value_cache = tb(kc), tb(vc)
    mask = torch.from_numpy(MASK2048.astype(bool))
    args = (tb(q), key_cache.view(kc.shape[0], bs, -1), value_cache.view(vc.shape[0], bs, -1))
    kw = dict(atten_mask=mask, block_table=torch.from_numpy(table), input_layout="TND",
              block_size=bs, actual_seq_lengths=[4, 6], actual_seq_lengths_kv=kl,
              num_key_value_heads=kvn, num_heads=n, scale=0.125, sparse_mode=3)
    o, lse = tnpu.npu_fused_infer_attention_score(*args, **kw)
    assert o.dtype == torch.bfloat16 and o.shape == (6, n, d) and lse.shape == (0,)
    o1, _ = attnref.fused_infer_attention_score(
        query=args[0], key=args[1], value=args[2], atten_mask=mask,
        block_table=kw["block_table"], input_layout="TND", block_size=bs,
        actual_seq_lengths=[4, 6], actual_seq_lengths_kv=kl, num_key_value_heads=kvn,
        num_heads=n, scale_value=0.125, sparse_mode=3, inner_precise=0)
    assert torch.equal(o, o1)
    q0 = 0
    for a, c, kk, vvv in zip(ql, kl, kv, vv):
        r = lambda x: x.to(torch.bfloat16).double().numpy()  # noqa: E731
        ref, _ = attend(r(torch.from_numpy(q[q0:q0 + a])).transpose(1, 0, 2),
                        r(torch.from_numpy(kk)), r(torch.from_numpy(vvv)), 0.125,
                        keep_band(a, c, 3))
        bf16_close(o[q0:q0 + a].transpose(0, 1), ref)
        q0 += a


def test_npu_fia_decode_cpu_int32_lengths_and_out():
    # SGLang passes actual_seq_lengths_kv as a CPU int32 tensor; vLLM-Ascend's graph capture
    # calls .out(..., workspace=..., out=[output, softmax_lse])
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(24)
    n, kvn, d, bs = 4, 2, 16, 16
    lens = [21, 7]
    kv = [rnd(rng, (kvn, ln, d)) for ln in lens]
    kc, table = paged(np.random.default_rng(25), kv, bs)
    q = torch.from_numpy(rnd(rng, (2, 1, n * d)))
    cache = torch.from_numpy(kc).view(kc.shape[0], bs, -1)
    kw = dict(num_heads=n, num_key_value_heads=kvn, input_layout="BSH", scale=0.25,
              block_table=torch.from_numpy(table), block_size=bs)
    o, _ = tnpu.npu_fused_infer_attention_score(
        q, cache, cache, actual_seq_lengths_kv=torch.tensor(lens, dtype=torch.int32), **kw)
    buf = torch.full((4, 1, n * d), 3.0, dtype=torch.float16)
    lse = torch.empty(1)
    r = tnpu.npu_fused_infer_attention_score.out(q, cache, cache, actual_seq_lengths_kv=lens,
                                                 workspace=torch.empty(8), out=[buf[1:3], lse],
                                                 **kw)
    assert r[1] is lse and torch.equal(buf[1:3], o) and (buf[0] == 3).all() and (buf[3] == 3).all()
    for bi in range(2):
        ref, _ = attend(f64(q[bi, 0].numpy().reshape(n, 1, d)), f64(kv[bi]), f64(kv[bi]), 0.25)
        close(o[bi, 0].numpy().reshape(n, 1, d), ref, 2e-3)


def test_npu_fia_mla_sglang_out_bf16():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(26)
    lens = [19, 40]
    ck, kr, cache, rope, table, qn, qr = mla_case(rng, lens, bs=128, dtype=np.float32)
    tb = lambda x: torch.from_numpy(np.ascontiguousarray(x)).to(torch.bfloat16)  # noqa: E731
    c_kv, k_rope, q_nope, q_rope = tb(cache), tb(rope), tb(qn), tb(qr)
    output = torch.empty_like(q_nope)
    softmax_lse = torch.empty(1, dtype=torch.float32)
    tnpu.npu_fused_infer_attention_score.out(
        q_nope, c_kv, c_kv, query_rope=q_rope, key_rope=k_rope, num_heads=4,
        num_key_value_heads=1, block_table=torch.from_numpy(table), block_size=128,
        input_layout="BNSD", scale=0.05, actual_seq_lengths_kv=lens, antiquant_mode=0,
        antiquant_scale=None, sparse_mode=0, workspace=None, out=[output, softmax_lse])
    def r(x):
        return torch.from_numpy(np.ascontiguousarray(x)).to(torch.bfloat16).double().numpy()
    for bi in range(2):
        bf16_close(output[bi], mla_ref(r(qn[bi]), r(qr[bi]), r(ck[bi]), r(kr[bi]), 0.05))


def test_npu_incre_flash_attention_w8a8_matches_layer1():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(27)
    n, kvn, d, bs = 4, 2, 16, 32
    lens = [33, 8]
    k8 = [rng.integers(-100, 100, (kvn, ln, d)).astype(np.int8) for ln in lens]
    kc, table = paged(np.random.default_rng(28), k8, bs, dtype=np.int8)
    sc = torch.from_numpy((rng.random((2, kvn * d)) * 0.02 + 0.005).astype(np.float32))
    sc = sc.to(torch.bfloat16)
    q = torch.from_numpy(rnd(rng, (2, 1, n * d), np.float32)).to(torch.bfloat16)
    cache = torch.from_numpy(kc).view(kc.shape[0], bs, -1)
    o = tnpu.npu_incre_flash_attention(q, cache, cache, num_key_value_heads=kvn, num_heads=n,
                                       actual_seq_lengths=lens, scale_value=0.25,
                                       input_layout="BSH", block_size=bs,
                                       block_table=torch.from_numpy(table), antiquant_scale=sc)
    o1 = attnref.incre_flash_attention(query=q, key=[cache], value=[cache], num_heads=n,
                                       num_key_value_heads=kvn, actual_seq_lengths=lens,
                                       scale_value=0.25, block_size=bs,
                                       block_table=torch.from_numpy(table), antiquant_scale=sc)
    assert o.dtype == torch.bfloat16 and torch.equal(o, o1)
    scd = sc.double().numpy()
    for bi in range(2):
        kk = f64(k8[bi]) * scd[0].reshape(kvn, 1, d)
        vv = f64(k8[bi]) * scd[1].reshape(kvn, 1, d)
        ref, _ = attend(q[bi, 0].double().numpy().reshape(n, 1, d), kk, vv, 0.25)
        bf16_close(o[bi, 0].reshape(n, 1, d), ref)


def test_npu_fia_per_token_antiquant_and_fp16_separate_scales():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(29)
    b, n, kvn, s, d = 2, 4, 2, 10, 16
    q = torch.from_numpy(rnd(rng, (b, 1, n, d)))
    k8 = torch.from_numpy(rng.integers(-90, 90, (b, s, kvn, d)).astype(np.int8))
    tok = torch.from_numpy((rng.random((2, b, s)) * 0.02 + 0.01).astype(np.float32))
    o, _ = tnpu.npu_fused_infer_attention_score(q, k8, k8, antiquant_scale=tok, antiquant_mode=1,
                                                num_heads=n, num_key_value_heads=kvn,
                                                input_layout="BSND", scale=0.25)
    for bi in range(b):
        kk = f64(k8[bi].numpy().transpose(1, 0, 2)) * f64(tok[0, bi].numpy())[None, :, None]
        vv = f64(k8[bi].numpy().transpose(1, 0, 2)) * f64(tok[1, bi].numpy())[None, :, None]
        ref, _ = attend(f64(q[bi].numpy().transpose(1, 0, 2)), kk, vv, 0.25)
        close(o[bi].numpy().transpose(1, 0, 2), ref, 2e-3)
    ch = torch.from_numpy((rng.random((1, kvn * d)) * 0.02 + 0.01).astype(np.float16))
    o2, _ = tnpu.npu_fused_infer_attention_score(q, k8, k8, key_antiquant_scale=ch,
                                                 value_antiquant_scale=ch, num_heads=n,
                                                 num_key_value_heads=kvn, input_layout="BSND",
                                                 scale=0.25)
    o1, _ = attnref.fused_infer_attention_score(query=q, key=k8, value=k8,
                                                key_antiquant_scale=ch.float(),
                                                value_antiquant_scale=ch.float(), num_heads=n,
                                                num_key_value_heads=kvn, input_layout="BSND",
                                                scale_value=0.25)
    assert torch.equal(o1, o2)


def test_npu_pfa_bnsd_bf16_torch_in_torch_out():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(31)
    n, s, d = 2, 6, 16
    q, k, v = (torch.from_numpy(rnd(rng, (1, n, s, d), np.float32)).to(torch.bfloat16)
               for _ in range(3))
    o = tnpu.npu_prompt_flash_attention(q, k, v, input_layout="BNSD", num_heads=n,
                                        scale_value=0.25)
    assert isinstance(o, torch.Tensor) and o.dtype == torch.bfloat16
    ref, _ = attend(q[0].double().numpy(), k[0].double().numpy(), v[0].double().numpy(), 0.25)
    bf16_close(o[0], ref)
    with pytest.raises(TypeError, match="cpu|CPU|meta"):
        tnpu.npu_prompt_flash_attention(q.to("meta"), k, v, input_layout="BNSD", num_heads=n)
