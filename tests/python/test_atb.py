"""attnref's ATB operators from Python: layer 1 (attnref.*) and layer 2 (attnref.torch_npu._npu_*),
against references written here in NumPy float64 (no attnref code)."""

import numpy as np
import pytest

import attnref
import attnref.torch_npu as torch_npu

RNG = np.random.default_rng(2026)


def randn(*shape, dtype=np.float16):
    return RNG.standard_normal(shape).astype(dtype)


def softmax_rows(s):
    s = s - s.max(axis=-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(axis=-1, keepdims=True)


def attend(q, k, v, scale, visible=None):
    """q [Sq, H, D], k / v [Skv, Hkv, D(v)], visible [Sq, Skv] bool -> [Sq, H, Dv] in float64."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    out = np.zeros((q.shape[0], q.shape[1], v.shape[2]))
    for h in range(q.shape[1]):
        s = scale * q[:, h] @ k[:, h // g].T
        if visible is not None:
            s = np.where(visible, s, -np.inf)
        out[:, h] = softmax_rows(s) @ v[:, h // g]
    return out


def gather_paged(cache, table, length):
    """The first `length` token rows of one sequence of a paged cache [blocks, bs, H, D]."""
    bs = cache.shape[1]
    return np.concatenate([cache[table[t // bs], t % bs][None] for t in range(length)])


def close(got, ref, dtype):
    tol = {np.float16: 2e-3, np.float32: 1e-5}.get(dtype, 1.6e-2)
    got = np.asarray(got, dtype=np.float64)
    assert np.abs(got - ref).max() <= tol * max(1.0, np.abs(ref).max()), np.abs(got - ref).max()


# ---- ReshapeAndCache --------------------------------------------------------------------------

def test_reshape_and_cache_writes_the_slots_and_nothing_else():
    key, value = randn(5, 2, 16), randn(5, 2, 8)
    kc = np.full((3, 4, 2, 16), 7, np.float16)
    vc = np.full((3, 4, 2, 8), 7, np.float16)
    slots = np.array([9, 0, -1, 4, 11], np.int32)
    attnref.reshape_and_cache(key=key, value=value, key_cache=kc, value_cache=vc, slot_mapping=slots)
    written = np.zeros((3, 4), bool)
    for i, s in enumerate(slots):
        if s >= 0:
            assert np.array_equal(kc[s // 4, s % 4], key[i]) and np.array_equal(vc[s // 4, s % 4], value[i])
            written[s // 4, s % 4] = True
    assert (kc[~written] == 7).all() and (vc[~written] == 7).all()


def test_npu_reshape_and_cache_writes_the_callers_torch_caches_in_place():
    torch = pytest.importorskip("torch")
    key, value = torch.randn(4, 2, 16).bfloat16(), torch.randn(4, 2, 16).bfloat16()
    cache = torch.zeros(2, 3, 4, 2, 16, dtype=torch.bfloat16)  # vLLM's [2, blocks, bs, H, D]
    kc, vc = cache[0], cache[1]
    slots = torch.tensor([5, 0, 11, 6], dtype=torch.int32)
    assert torch_npu._npu_reshape_and_cache(key, value, kc, vc, slots) is None
    for i, s in enumerate(slots.tolist()):
        assert torch.equal(cache[0, s // 4, s % 4], key[i]) and torch.equal(cache[1, s // 4, s % 4], value[i])
    assert int((cache != 0).any(dim=-1).any(dim=-1).sum()) == 8


def test_npu_reshape_and_cache_names_slot_indices_when_a_slot_is_out_of_range():
    kc = np.zeros((2, 4, 1, 8), np.float16)
    with pytest.raises(IndexError, match="slot_indices"):
        torch_npu._npu_reshape_and_cache(randn(2, 1, 8), randn(2, 1, 8), kc, kc.copy(),
                                         np.array([1, 8], np.int32))
    assert (kc == 0).all()


# ---- PagedAttention ---------------------------------------------------------------------------

def paged_case(dtype, lens=(10, 16, 1), heads=4, kv_heads=2, d=16, bs=8, blocks=9, per_seq=3):
    q = randn(len(lens), heads, d, dtype=dtype)
    kc, vc = randn(blocks, bs, kv_heads, d, dtype=dtype), randn(blocks, bs, kv_heads, d, dtype=dtype)
    table = RNG.permutation(blocks)[: len(lens) * per_seq].reshape(len(lens), per_seq).astype(np.int32)
    return q, kc, vc, table, np.array(lens, np.int32)


def paged_reference(q, kc, vc, table, lens, scale, vcache_dims=None):
    out = []
    for b, n in enumerate(lens):
        k = gather_paged(kc, table[b], n)
        v = gather_paged(vc, table[b], n) if vc is not None else k[..., :vcache_dims]
        out.append(attend(q[b:b + 1], k, v, scale)[0])
    return np.stack(out)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_paged_attention_decode_matches_the_reference(dtype):
    q, kc, vc, table, lens = paged_case(dtype)
    out = attnref.paged_attention(query=q, key_cache=kc, value_cache=vc, block_tables=table,
                                  context_lens=lens, num_heads=4, num_kv_heads=2, qk_scale=0.25)
    assert out.dtype == dtype and out.shape == q.shape
    close(out, paged_reference(q, kc, vc, table, lens, 0.25), dtype)


def test_npu_paged_attention_is_layer_1_bit_for_bit_and_writes_out_in_place():
    q, kc, vc, table, lens = paged_case(np.float16)
    ref = attnref.paged_attention(query=q, key_cache=kc, value_cache=vc, block_tables=table,
                                  context_lens=lens, num_heads=4, num_kv_heads=2, qk_scale=0.3)
    out = np.zeros_like(q)
    assert torch_npu._npu_paged_attention(q, kc, vc, 2, 4, 0.3, table, lens, out) is None
    assert np.array_equal(out, ref)


def test_paged_attention_reads_strided_inputs_without_a_copy():
    q, kc, vc, table, lens = paged_case(np.float16)
    wide = np.zeros((3, 4, 40), np.float16)
    wide[:, :, 3:19] = q  # a query sliced out of a wider buffer
    pool = np.zeros((2,) + kc.shape, np.float16)
    pool[0], pool[1] = kc, vc  # one [2, blocks, bs, H, D] allocation, as vLLM keeps it
    out = attnref.paged_attention(query=wide[:, :, 3:19], key_cache=pool[0], value_cache=pool[1],
                                  block_tables=table, context_lens=lens, num_heads=4,
                                  num_kv_heads=2, qk_scale=0.25)
    dense = attnref.paged_attention(query=q, key_cache=kc, value_cache=vc, block_tables=table,
                                    context_lens=lens, num_heads=4, num_kv_heads=2, qk_scale=0.25)
    assert np.array_equal(out, dense)


def test_npu_paged_attention_bf16_torch_tensors():
    torch = pytest.importorskip("torch")
    q, kc, vc, table, lens = paged_case(np.float32)
    tq, tk, tv = (torch.from_numpy(x).bfloat16() for x in (q, kc, vc))
    out = torch.empty(3, 4, 16, dtype=torch.bfloat16)
    torch_npu._npu_paged_attention(query=tq, key_cache=tk, value_cache=tv, num_kv_heads=2, num_heads=4,
                                   scale_value=0.25, block_table=torch.from_numpy(table),
                                   context_lens=torch.from_numpy(lens), out=out)
    ref = paged_reference(*(x.float().numpy() for x in (tq, tk, tv)), table, lens, 0.25)
    close(out.float().numpy(), ref, "bf16")
    layer1 = attnref.paged_attention(query=tq, key_cache=tk, value_cache=tv,
                                     block_tables=torch.from_numpy(table), context_lens=lens,
                                     num_heads=4, num_kv_heads=2, qk_scale=0.25)
    assert isinstance(layer1, torch.Tensor) and layer1.dtype == torch.bfloat16
    assert torch.equal(layer1, out)


def test_npu_paged_attention_splitfuse_chunked_prefill():
    q_lens, ctx = np.array([3, 1, 4], np.int32), np.array([10, 7, 4], np.int32)
    q = randn(int(q_lens.sum()), 4, 16)
    _, kc, vc, table, _ = paged_case(np.float16, lens=(10, 7, 4))
    max_seq = int(ctx.max())
    mask = np.zeros((q.shape[0], max_seq), np.float16)
    row, refs = 0, []
    for b in range(3):
        k, v = gather_paged(kc, table[b], ctx[b]), gather_paged(vc, table[b], ctx[b])
        pos = ctx[b] - q_lens[b] + np.arange(q_lens[b])
        visible = np.arange(ctx[b])[None, :] <= pos[:, None]
        mask[row:row + q_lens[b], : ctx[b]][~visible] = -np.inf
        refs.append(attend(q[row:row + q_lens[b]], k, v, 0.25, visible))
        row += q_lens[b]
    out = np.zeros_like(q)
    torch_npu._npu_paged_attention_splitfuse(q, kc, vc, table, ctx, mask, q_lens, 2, 4, 0.25, out)
    close(out, np.concatenate(refs), np.float16)


def test_npu_paged_attention_mla_576_512():
    lens = np.array([17, 5], np.int32)
    q, kc = randn(2, 8, 576), randn(6, 16, 1, 576)
    table = np.array([[4, 1], [0, 5]], np.int32)
    out = np.zeros((2, 8, 512), np.float16)
    torch_npu._npu_paged_attention_mla(q, kc, 1, 8, 0.04, table, lens, 512, out)
    close(out, paged_reference(q, kc, None, table, lens, 0.04, vcache_dims=512), np.float16)


# ---- SelfAttention ----------------------------------------------------------------------------

def causal_mask(n, dtype, masked):
    return np.triu(np.full((n, n), masked, dtype), 1)


@pytest.mark.parametrize("dtype,masked", [(np.float16, -np.inf), (np.float16, -10000.0)])
def test_npu_flash_attention_packed_prefill(dtype, masked):
    lens = np.array([5, 3, 8], np.int32)
    t = int(lens.sum())
    q, k, v = randn(t, 4, 16, dtype=dtype), randn(t, 2, 16, dtype=dtype), randn(t, 2, 16, dtype=dtype)
    out = np.zeros_like(q)
    torch_npu._npu_flash_attention(q, k, v, causal_mask(8, dtype, masked), lens, 0.25, 4, 2, out)
    refs, row = [], 0
    for n in lens:
        sl = slice(row, row + n)
        refs.append(attend(q[sl], k[sl], v[sl], 0.25, np.tril(np.ones((n, n), bool))))
        row += n
    close(out, np.concatenate(refs), dtype)
    layer1 = attnref.self_attention(query=q, key=k, value=v, mask=causal_mask(8, dtype, masked)[None],
                                    seq_len=lens, num_heads=4, num_kv_heads=2, qk_scale=0.25,
                                    calc_type=attnref.SelfAttentionParams.CalcType.PaEncoder,
                                    mask_type=1)
    assert np.array_equal(layer1, out)


def test_npu_flash_attention_bf16_takes_the_binary_mask():
    torch = pytest.importorskip("torch")
    lens = torch.tensor([6, 2], dtype=torch.int32)
    q, k, v = torch.randn(8, 2, 32).bfloat16(), torch.randn(8, 1, 32).bfloat16(), torch.randn(8, 1, 32).bfloat16()
    mask = torch.triu(torch.ones(6, 6), 1).bfloat16()  # vLLM-Ascend's bf16 mask: 1 above the diagonal
    out = torch.empty(8, 2, 32, dtype=torch.bfloat16)
    torch_npu._npu_flash_attention(query=q, key=k, value=v, mask=mask, seq_len=lens, scale_value=0.2,
                                   num_heads=2, num_kv_heads=1, out=out)
    qn, kn, vn = (x.float().numpy() for x in (q, k, v))
    ref = np.concatenate([attend(qn[:6], kn[:6], vn[:6], 0.2, np.tril(np.ones((6, 6), bool))),
                          attend(qn[6:], kn[6:], vn[6:], 0.2, np.tril(np.ones((2, 2), bool)))])
    close(out.float().numpy(), ref, "bf16")


def test_npu_flash_attention_qlens_prefix_cache_hit():
    q_lens, ctx = np.array([3, 2], np.int32), np.array([3 + 128, 2], np.int32)
    kc, vc = randn(20, 16, 2, 32), randn(20, 16, 2, 32)
    table = RNG.permutation(20)[:18].reshape(2, 9).astype(np.int32)
    q = randn(5, 4, 32)
    mask = causal_mask(128, np.float16, -np.inf)
    out = np.zeros_like(q)
    torch_npu._npu_flash_attention_qlens(q, kc, vc, table, mask, q_lens, ctx, 2, 4, 0.125, out)
    refs, row = [], 0
    for b in range(2):
        k, v = gather_paged(kc, table[b], ctx[b]), gather_paged(vc, table[b], ctx[b])
        pos = ctx[b] - q_lens[b] + np.arange(q_lens[b])
        refs.append(attend(q[row:row + q_lens[b]], k, v, 0.125,
                           np.arange(ctx[b])[None, :] <= pos[:, None]))
        row += q_lens[b]
    close(out, np.concatenate(refs), np.float16)


# ---- Errors and types -------------------------------------------------------------------------

def test_errors_name_the_torch_npu_argument():
    q, kc, vc, table, lens = paged_case(np.float16)
    out = np.zeros_like(q)
    bad_table = table.copy()
    bad_table[1, 0] = 99
    with pytest.raises(IndexError, match="block_table"):
        torch_npu._npu_paged_attention(q, kc, vc, 2, 4, 0.3, bad_table, lens, out)
    with pytest.raises(TypeError, match="context_lens must be int32"):
        torch_npu._npu_paged_attention(q, kc, vc, 2, 4, 0.3, table, lens.astype(np.int64), out)
    with pytest.raises(ValueError, match="out must be contiguous"):
        torch_npu._npu_paged_attention(q, kc, vc, 2, 4, 0.3, table, lens, np.zeros((3, 4, 32), np.float16)[..., ::2])
    with pytest.raises(TypeError, match="key_cache must hold float16"):
        torch_npu._npu_paged_attention(q, kc.astype(np.float32), vc, 2, 4, 0.3, table, lens, out)
    with pytest.raises(ValueError, match="num_heads"):
        torch_npu._npu_paged_attention(q, kc, vc, 2, 3, 0.3, table, lens, out)
    assert (out == 0).all()


def test_layer_1_rejects_unknown_arguments_wrong_ranks_and_devices():
    q, kc, vc, table, lens = paged_case(np.float16)
    kw = dict(query=q, key_cache=kc, value_cache=vc, block_tables=table, context_lens=lens,
              num_heads=4, num_kv_heads=2)
    with pytest.raises(TypeError, match="blocktables is not an argument"):
        attnref.paged_attention(blocktables=table, **kw)
    with pytest.raises(ValueError, match="query must have 3 dimensions"):
        attnref.paged_attention(**{**kw, "query": q[None]})
    with pytest.raises(TypeError, match="query must be"):
        attnref.paged_attention(**{**kw, "query": "q"})
    with pytest.raises(ValueError, match="read-only"):
        ro = np.zeros_like(q)
        ro.flags.writeable = False
        attnref.paged_attention(out=ro, **kw)
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="meta"):
        attnref.paged_attention(**{**kw, "query": torch.empty(3, 4, 16, dtype=torch.float16, device="meta")})


def test_params_types_take_fields_enums_and_vendor_integers():
    p = attnref.PagedAttentionParams(num_heads=8, mask_type=3, calc_type=attnref.PagedAttentionParams.CalcType.Spec)
    assert p.mask_type == attnref.PagedAttentionParams.MaskType.Spec and p.num_heads == 8
    assert "num_heads=8" in repr(p) and "MaskType.Spec" in repr(p)
    assert p == attnref.PagedAttentionParams(num_heads=8, mask_type=3, calc_type=1)
    with pytest.raises(TypeError, match="no field named 'heads'"):
        attnref.PagedAttentionParams(heads=8)
    with pytest.raises(ValueError, match="mask_type"):
        q, kc, vc, table, lens = paged_case(np.float16)
        attnref.paged_attention(query=q, key_cache=kc, value_cache=vc, block_tables=table,
                                context_lens=lens, num_heads=4, mask_type=42)


def test_results_do_not_depend_on_threads_or_simd_level():
    q, kc, vc, table, lens = paged_case(np.float32, lens=(200, 64, 5), bs=16, blocks=45, d=64,
                                         per_seq=15)
    kw = dict(query=q, key_cache=kc, value_cache=vc, block_tables=table, context_lens=lens,
              num_heads=4, num_kv_heads=2, qk_scale=0.125)
    one = attnref.paged_attention(threads=1, **kw)
    assert np.array_equal(one, attnref.paged_attention(threads=2, **kw))
    previous = attnref.set_simd_level(attnref.SimdLevel.Portable)
    try:
        portable = attnref.paged_attention(threads=2, **kw)
    finally:
        attnref.set_simd_level(previous)
    close(portable, paged_reference(q, kc, vc, table, lens, 0.125), np.float32)


def test_torch_tensors_are_viewed_where_they_lie():
    """The extension module's view of torch tensors (what Tensor.numpy() sees): offsets, strides,
    stride 0, bf16, bool, requires_grad; the kinds it does not read fall back to the Python path
    and its errors."""
    torch = pytest.importorskip("torch")
    from attnref._attnref import _torch_view
    base = torch.arange(60, dtype=torch.float32).reshape(3, 4, 5)
    for t in (base, base.transpose(0, 2), base[1:, ::2, 3:], base[:, :1].expand(3, 6, 5),
              base.to(torch.float16), base.to(torch.int8), base.to(torch.int64),
              base > 20, torch.zeros(0, 3), base.clone().requires_grad_()):
        a = _torch_view(t)
        want = t.detach().numpy()
        assert a.shape == want.shape and a.strides == want.strides and a.dtype == want.dtype
        if t.numel():  # an empty tensor's data pointer is null: any empty array will do
            assert a.ctypes.data == want.ctypes.data and a.base is t and a.flags.writeable
    b = torch.randn(3, 5).to(torch.bfloat16)
    assert _torch_view(b).dtype == np.uint16
    assert np.array_equal(_torch_view(b), b.view(torch.int16).numpy().view(np.uint16))
    for t in (torch.zeros(3, dtype=torch.complex64), torch.zeros(2, 2).to_sparse(),
              torch.zeros(2, device="meta"), torch.zeros(2, dtype=torch.int16)):
        assert _torch_view(t) is None
    q, kc, vc, table, lens = paged_case(np.float16)
    kw = dict(key_cache=kc, value_cache=vc, block_tables=table, context_lens=lens, num_heads=4,
              num_kv_heads=2)
    with pytest.raises(TypeError, match="query must hold float32, float16 or bfloat16"):
        attnref.paged_attention(query=torch.zeros(q.shape, dtype=torch.complex64), **kw)
    quantized = torch.quantize_per_tensor(torch.zeros(q.shape), 0.1, 0, torch.quint8)
    with pytest.raises(TypeError, match="query has dtype torch.quint8, not supported"):
        attnref.paged_attention(query=quantized, **kw)
    with pytest.raises(TypeError, match="query is a torch.sparse_coo tensor"):
        attnref.paged_attention(query=torch.from_numpy(q).to_sparse(), **kw)
    out = torch.full(q.shape, 7.0, dtype=torch.float16)[:, :, :]
    got = attnref.paged_attention(query=torch.from_numpy(q), out=out, **kw)
    assert got is out and np.array_equal(out.numpy(), attnref.paged_attention(query=q, **kw))


def test_attnref_works_and_never_imports_torch_when_torch_is_not_loaded():
    import subprocess
    import sys
    code = ("import sys, numpy as np, attnref\n"
            "q = np.ones((1, 2, 16), np.float16); kc = np.ones((1, 8, 1, 16), np.float16)\n"
            "out = attnref.paged_attention(query=q, key_cache=kc, value_cache=kc,\n"
            "    block_tables=np.zeros((1, 1), np.int32), context_lens=[3], num_heads=2,\n"
            "    num_kv_heads=1, qk_scale=0.5)\n"
            "assert (out == 1).all() and attnref._attnref._torch_view(q) is None\n"
            "assert 'torch' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)
