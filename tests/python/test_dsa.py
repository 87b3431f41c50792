"""attnref's DSA operators from Python: layer 1 (attnref.lightning_indexer, quant_lightning_indexer,
sparse_flash_attention, kv_quant_sparse_flash_attention, dsa_step) and layer 2
(attnref.torch_npu.npu_lightning_indexer / npu_sparse_flash_attention, as vLLM-Ascend calls them:
TND query, PA_BSND paged key, sparse_mode 3), against references written here in NumPy float64."""

import numpy as np
import pytest

import attnref
import attnref.torch_npu as torch_npu

RNG = np.random.default_rng(2028)


def randn(*shape, dtype=np.float16, scale=1.0):
    return (scale * RNG.standard_normal(shape)).astype(dtype)


def close(got, ref, rel):
    got = np.asarray(got, np.float64)
    err = np.abs(got - ref).max()
    assert err <= rel * np.abs(ref).max(), (err, np.abs(ref).max())


def softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# ---- geometry: a TND query over a paged (PA_BSND) cache -------------------------------------------

Q_LENS, KV_LENS, BS = (2, 3), (20, 37), 16  # two prefill chunks: 2 and 3 new tokens
T1 = sum(Q_LENS)
BLOCKS = 7
TABLE = RNG.permutation(BLOCKS)[:6].reshape(2, 3).astype(np.int32)


def rows():
    """(batch, position in the batch's keys, visible limit with sparse_mode 3) of each TND row."""
    out = []
    for b, (q, s) in enumerate(zip(Q_LENS, KV_LENS)):
        out += [(b, i, s - q + i + 1) for i in range(q)]
    return out


def gather(cache, b, n):
    """The first n tokens of batch b from a paged cache [blocks, BS, 1, D] -> [n, D]."""
    return np.stack([cache[TABLE[b, t // BS], t % BS, 0] for t in range(n)]).astype(np.float64)


def cumulative(lens):
    return np.cumsum(lens).astype(np.int32)


def check_topk(idx, scores, count, rel=1e-5):
    """idx: one row's list; scores: float64 over the visible keys. The top min(count, visible) keys
    in descending order up to rounding, −1 after."""
    k = min(count, len(scores))
    assert (idx[k:] == -1).all()
    valid = idx[:k]
    assert len(set(valid.tolist())) == k and (valid >= 0).all() and (valid < len(scores)).all()
    tol = rel * max(1e-30, np.abs(scores).max())
    s = scores[valid]
    assert (np.diff(s) <= tol).all()
    rest = np.setdiff1d(np.arange(len(scores)), valid)
    if len(rest):
        assert scores[rest].max() <= s.min() + tol


def indexer_problem(dtype=np.float16, n1=8):
    q = randn(T1, n1, 128, dtype=dtype)
    k = randn(BLOCKS, BS, 1, 128, dtype=dtype)
    w = randn(T1, n1, dtype=dtype)
    return q, k, w


def indexer_scores(q, k, w, r, b, limit):
    keys = gather(k, b, limit)
    return (w[r].astype(np.float64)[:, None] *
            np.maximum(q[r].astype(np.float64) @ keys.T, 0)).sum(0)


# ---- lightning_indexer ---------------------------------------------------------------------------

def test_lightning_indexer_tnd_paged_matches_the_reference():
    q, k, w = indexer_problem()
    idx, val = attnref.lightning_indexer(query=q, key=k, weights=w, block_table=TABLE,
                                         actual_seq_lengths_query=cumulative(Q_LENS),
                                         actual_seq_lengths_key=list(KV_LENS), layout_query="TND",
                                         layout_key="PA_BSND", sparse_count=24)
    assert val is None and idx.dtype == np.int32 and idx.shape == (T1, 1, 24)
    for r, (b, _, limit) in enumerate(rows()):
        check_topk(idx[r, 0], indexer_scores(q, k, w, r, b, limit), 24)


def test_lightning_indexer_relaxed_bsnd_with_float_weights_and_values():
    q = randn(2, 3, 8, 48)[:, :, ::2]  # strided heads: [2, 3, 4, 48]
    k, w = randn(2, 10, 2, 48), randn(2, 3, 4, dtype=np.float32)
    idx, val = attnref.lightning_indexer(query=q, key=k, weights=w, actual_seq_lengths_key=[10, 7],
                                         sparse_count=6, sparse_mode=0, return_value=True, strict=False)
    assert idx.shape == val.shape == (2, 3, 2, 6) and val.dtype == np.float16
    for b in range(2):
        for i in range(3):
            for g in range(2):
                keys = k[b, :(10, 7)[b], g].astype(np.float64)
                qs = q[b, i, 2 * g:2 * g + 2].astype(np.float64)
                sc = (w[b, i, 2 * g:2 * g + 2, None] * np.maximum(qs @ keys.T, 0)).sum(0)
                check_topk(idx[b, i, g], sc, 6)
                close(val[b, i, g], sc[idx[b, i, g]], 2e-3)


def test_quant_lightning_indexer_bsnd_matches_the_reference():
    q = RNG.integers(-128, 128, (2, 2, 4, 128)).astype(np.int8)
    k = RNG.integers(-128, 128, (2, 24, 1, 128)).astype(np.int8)
    w = RNG.uniform(-1, 1, (2, 2, 4)).astype(np.float16)
    qs = RNG.uniform(0.5, 1.5, (2, 2, 4)).astype(np.float16)
    ks = RNG.uniform(0.5, 1.5, (2, 24, 1)).astype(np.float16)
    idx = attnref.quant_lightning_indexer(query=q, key=k, weights=w, query_dequant_scale=qs,
                                          key_dequant_scale=ks, sparse_count=10, sparse_mode=3)
    assert idx.shape == (2, 2, 1, 10)
    f16 = lambda a: np.asarray(a, np.float64).astype(np.float16).astype(np.float64)  # noqa: E731
    for b in range(2):
        for i in range(2):
            limit = 24 - 2 + i + 1
            dot = q[b, i].astype(np.int64) @ k[b, :limit, 0].T.astype(np.int64)  # [heads, keys]
            r = f16(np.maximum(dot, 0) / 1024)
            wq = f16(w[b, i].astype(np.float64) * qs[b, i])
            check_topk(idx[b, i, 0], ks[b, :limit, 0].astype(np.float64) * (wq[:, None] * r).sum(0), 10, 1e-3)


# ---- sparse_flash_attention ------------------------------------------------------------------------

def sfa_problem(dtype=np.float16, n1=4, count=12):
    """Query [T1, n1, 512 | 64], a combined latent cache [BLOCKS, BS, 1, 576] (key = its first 512
    channels, key_rope the last 64: strided views), valid-first token lists [T1, 1, count]."""
    q, qr = randn(T1, n1, 512, dtype=dtype), randn(T1, n1, 64, dtype=dtype)
    cache = randn(BLOCKS, BS, 1, 576, dtype=dtype, scale=0.5)
    idx = np.full((T1, 1, count), -1, np.int32)
    for r, (_, _, limit) in enumerate(rows()):
        n = min(count, limit)
        idx[r, 0, :n] = RNG.choice(limit, n, replace=False)
    return q, qr, cache, idx


def sfa_reference(q, qr, cache, idx, scale):
    out = np.zeros(q.shape)
    for r, (b, _, limit) in enumerate(rows()):
        sel = idx[r, 0][idx[r, 0] >= 0]
        keys = gather(cache, b, limit)[sel]
        s = scale * (q[r].astype(np.float64) @ keys[:, :512].T + qr[r].astype(np.float64) @ keys[:, 512:].T)
        out[r] = softmax(s) @ keys[:, :512]
    return out


SFA_SETUP = dict(layout_query="TND", layout_kv="PA_BSND", sparse_mode=3)


def test_sparse_flash_attention_tnd_paged_strided_cache_matches_the_reference():
    q, qr, cache, idx = sfa_problem()
    key, key_rope = cache[..., :512], cache[..., 512:]
    out = attnref.sparse_flash_attention(query=q, query_rope=qr, key=key, value=key, key_rope=key_rope,
                                         sparse_indices=idx, block_table=TABLE,
                                         actual_seq_lengths_query=cumulative(Q_LENS),
                                         actual_seq_lengths_kv=list(KV_LENS), scale_value=0.05, **SFA_SETUP)
    assert out.shape == q.shape and out.dtype == np.float16
    close(out, sfa_reference(q, qr, cache, idx, 0.05), 2e-3)
    again = attnref.sparse_flash_attention(query=q, query_rope=qr, key=key, key_rope=key_rope, sparse_indices=idx,
                                           block_table=TABLE, actual_seq_lengths_query=cumulative(Q_LENS),
                                           actual_seq_lengths_kv=list(KV_LENS), scale_value=0.05, threads=2,
                                           **SFA_SETUP)
    assert np.array_equal(out, again)  # value absent (V = the key), two threads: the same bits


def test_kv_quant_sparse_flash_attention_bsnd_matches_the_reference():
    lat = RNG.integers(-127, 128, (1, 20, 512)).astype(np.int8)
    rope = randn(1, 20, 64)
    scales = RNG.uniform(0.005, 0.01, (1, 20, 4)).astype(np.float32)
    key = np.concatenate([lat, rope.view(np.int8), scales.view(np.int8)], -1)[:, :, None]  # [1, 20, 1, 656]
    query = randn(1, 2, 2, 576)
    idx = np.full((1, 2, 1, 8), -1, np.int32)
    idx[0, 0, 0, :8] = RNG.choice(19, 8, replace=False)
    idx[0, 1, 0, :5] = RNG.choice(20, 5, replace=False)
    out = attnref.kv_quant_sparse_flash_attention(query=query, key=key, sparse_indices=idx, scale_value=0.1)
    assert out.shape == (1, 2, 2, 512)
    deq = (lat.astype(np.float64) * np.repeat(scales, 128, -1)).astype(np.float16).astype(np.float64)
    for i in range(2):
        sel = idx[0, i, 0][idx[0, i, 0] >= 0]
        s = 0.1 * (query[0, i, :, :512].astype(np.float64) @ deq[0, sel].T +
                   query[0, i, :, 512:].astype(np.float64) @ rope[0, sel].T.astype(np.float64))
        close(out[0, i], softmax(s) @ deq[0, sel], 2e-3)


def test_dsa_step_with_every_token_kept_is_causal_mla_attention():
    iq, ik, w = indexer_problem()
    q, qr, cache, _ = sfa_problem(n1=2)
    kw = dict(index_query=iq, weights=w, index_key=ik, query=q, query_rope=qr, key=cache[..., :512],
              key_rope=cache[..., 512:], block_table=TABLE, actual_seq_lengths_query=cumulative(Q_LENS),
              actual_seq_lengths_kv=list(KV_LENS))
    out, idx = attnref.dsa_step(sparse_count=64, scale_value=0.05, **kw)
    assert idx.shape == (T1, 1, 64)
    li, _ = attnref.lightning_indexer(query=iq, key=ik, weights=w, block_table=TABLE, sparse_count=64,
                                      actual_seq_lengths_query=cumulative(Q_LENS),
                                      actual_seq_lengths_key=list(KV_LENS), layout_query="TND",
                                      layout_key="PA_BSND")
    assert np.array_equal(idx, li)
    every = np.full((T1, 1, 64), -1, np.int32)
    for r, (_, _, limit) in enumerate(rows()):
        every[r, 0, :limit] = np.arange(limit)
    close(out, sfa_reference(q, qr, cache, every, 0.05), 2e-3)


def test_layer_1_errors_name_the_argument_and_leave_outputs_untouched():
    q, qr, cache, idx = sfa_problem()
    out = np.full(q.shape, 5, np.float16)
    kw = dict(query=q, query_rope=qr, key=cache[..., :512], key_rope=cache[..., 512:], block_table=TABLE,
              actual_seq_lengths_query=cumulative(Q_LENS), actual_seq_lengths_kv=list(KV_LENS), **SFA_SETUP)
    bad = idx.copy()
    bad[4, 0, 0] = 40  # past batch 1's 37 keys
    with pytest.raises(IndexError, match=r"sparse_indices\[4\]\[0\]\[0\]"):
        attnref.sparse_flash_attention(sparse_indices=bad, attention_out=out, **kw)
    assert (out == 5).all()
    with pytest.raises(ValueError, match="params.sparse_block_size"):
        attnref.sparse_flash_attention(sparse_indices=idx, sparse_block_size=3, **kw)
    with pytest.raises(TypeError, match="query_rope"):
        attnref.sparse_flash_attention(sparse_indices=idx, **dict(kw, query_rope=qr.astype(np.float32)))
    iq, ik, w = indexer_problem()
    with pytest.raises(ValueError, match="params.sparse_count"):
        attnref.lightning_indexer(query=iq, key=ik, weights=w, block_table=TABLE, sparse_count=3000,
                                  actual_seq_lengths_query=cumulative(Q_LENS),
                                  actual_seq_lengths_key=list(KV_LENS), layout_query="TND", layout_key="PA_BSND")
    with pytest.raises(TypeError, match="weights"):
        attnref.lightning_indexer(query=iq, key=ik, weights=w.astype(np.float64), layout_query="TND")


# ---- layer 2 ---------------------------------------------------------------------------------------

def npu_lengths(torch):
    return (torch.from_numpy(cumulative(Q_LENS)), torch.tensor(KV_LENS, dtype=torch.int32))


def test_npu_lightning_indexer_vllm_ascend_call_is_layer_1_bit_for_bit():
    torch = pytest.importorskip("torch")
    q, k, w = indexer_problem(np.float32)
    tq, tk, tw = torch.from_numpy(q).bfloat16(), torch.from_numpy(k).bfloat16(), torch.from_numpy(w).bfloat16()
    sq, skv = npu_lengths(torch)
    idx, val = torch_npu.npu_lightning_indexer(
        query=tq, key=tk, weights=tw, actual_seq_lengths_query=sq, actual_seq_lengths_key=skv,
        block_table=torch.from_numpy(TABLE), layout_query="TND", layout_key="PA_BSND", sparse_count=24,
        sparse_mode=3)
    assert idx.dtype == torch.int32 and idx.shape == (T1, 1, 24)
    assert val.shape == (0,) and val.dtype == torch.bfloat16
    ref, _ = attnref.lightning_indexer(query=tq, key=tk, weights=tw, block_table=TABLE, sparse_count=24,
                                       actual_seq_lengths_query=cumulative(Q_LENS),
                                       actual_seq_lengths_key=list(KV_LENS), layout_query="TND",
                                       layout_key="PA_BSND")
    assert torch.equal(idx, ref)
    qb, kb, wb = (x.double().numpy() for x in (tq, tk, tw))
    for r, (b, _, limit) in enumerate(rows()):
        check_topk(idx[r, 0].numpy(), indexer_scores(qb, kb, wb, r, b, limit), 24)


def test_npu_sparse_flash_attention_vllm_ascend_call_is_layer_1_bit_for_bit():
    torch = pytest.importorskip("torch")
    q, qr, cache, idx = sfa_problem(np.float32)
    tq, tqr, tc = (torch.from_numpy(x).bfloat16() for x in (q, qr, cache))
    kv = tc[..., :512]  # the latent cache's nope part: K and V share storage (attention_mode 2)
    sq, skv = npu_lengths(torch)
    out, smax, ssum = torch_npu.npu_sparse_flash_attention(
        tq, kv, kv, torch.from_numpy(idx), 0.05, block_table=torch.from_numpy(TABLE),
        actual_seq_lengths_query=sq, actual_seq_lengths_kv=skv, query_rope=tqr, key_rope=tc[..., 512:],
        sparse_block_size=1, layout_query="TND", layout_kv="PA_BSND", sparse_mode=3, attention_mode=2)
    assert out.dtype == torch.bfloat16 and out.shape == tq.shape
    assert smax.shape == ssum.shape == (0,) and smax.dtype == torch.float32
    ref = attnref.sparse_flash_attention(query=tq, query_rope=tqr, key=kv, key_rope=tc[..., 512:],
                                         sparse_indices=idx, block_table=TABLE,
                                         actual_seq_lengths_query=cumulative(Q_LENS),
                                         actual_seq_lengths_kv=list(KV_LENS), scale_value=0.05, **SFA_SETUP)
    assert torch.equal(out, ref)
    close(out.double().numpy(), sfa_reference(tq.double().numpy(), tqr.double().numpy(), tc.double().numpy(),
                                              idx, 0.05), 1.6e-2)


def test_npu_sparse_flash_attention_fp16_numpy_bsnd():
    q = randn(2, 1, 4, 512)
    qr = randn(2, 1, 4, 64)
    key, key_rope = randn(2, 24, 1, 512, scale=0.5), randn(2, 24, 1, 64, scale=0.5)
    idx = np.stack([RNG.choice(24, 8, replace=False) for _ in range(2)]).astype(np.int32).reshape(2, 1, 1, 8)
    out, _, _ = torch_npu.npu_sparse_flash_attention(q, key, key, idx, 0.08, query_rope=qr, key_rope=key_rope,
                                                     attention_mode=2)
    for b in range(2):
        ks = key[b, idx[b, 0, 0], 0].astype(np.float64)
        krs = key_rope[b, idx[b, 0, 0], 0].astype(np.float64)
        s = 0.08 * (q[b, 0].astype(np.float64) @ ks.T + qr[b, 0].astype(np.float64) @ krs.T)
        close(out[b, 0], softmax(s) @ ks, 2e-3)


def test_npu_errors_name_the_torch_npu_argument():
    q, qr, cache, idx = sfa_problem()
    key = cache[..., :512]
    kw = dict(block_table=TABLE, actual_seq_lengths_query=cumulative(Q_LENS),
              actual_seq_lengths_kv=np.array(KV_LENS, np.int32), query_rope=qr, key_rope=cache[..., 512:],
              layout_query="TND", layout_kv="PA_BSND")
    with pytest.raises(ValueError, match=r"torch_npu\.npu_sparse_flash_attention: .*attention_mode not supported"):
        torch_npu.npu_sparse_flash_attention(q, key, key, idx, 0.05, **kw)  # torch_npu's default 0
    with pytest.raises(ValueError, match="return_softmax_lse"):
        torch_npu.npu_sparse_flash_attention(q, key, key, idx, 0.05, attention_mode=2, return_softmax_lse=True, **kw)
    with pytest.raises(ValueError, match="sinks not supported by attnref"):
        torch_npu.npu_sparse_flash_attention(q, key, key, idx, 0.05, attention_mode=2,
                                             sinks=np.zeros(4, np.float32), **kw)
    with pytest.raises(ValueError, match="value"):
        torch_npu.npu_sparse_flash_attention(q, key, key.copy(), idx, 0.05, attention_mode=2, **kw)
    with pytest.raises(TypeError, match="actual_seq_lengths_kv"):
        torch_npu.npu_sparse_flash_attention(q, key, key, idx, 0.05, attention_mode=2,
                                             **dict(kw, actual_seq_lengths_kv=np.array(KV_LENS, np.int64)))
    iq, ik, w = indexer_problem()
    bad = TABLE.copy()
    bad[1, 2] = 99
    lk = dict(actual_seq_lengths_query=cumulative(Q_LENS), actual_seq_lengths_key=np.array(KV_LENS, np.int32),
              layout_query="TND", layout_key="PA_BSND")
    with pytest.raises(IndexError, match=r"torch_npu\.npu_lightning_indexer: .*block_table"):
        torch_npu.npu_lightning_indexer(iq, ik, w, block_table=bad, **lk)
    with pytest.raises(ValueError, match=r"npu_lightning_indexer: .*return_value not supported"):
        torch_npu.npu_lightning_indexer(iq, ik, w, block_table=TABLE, return_value=True, **lk)
    with pytest.raises(ValueError, match="sparse_count"):
        torch_npu.npu_lightning_indexer(iq, ik, w, block_table=TABLE, sparse_count=0, **lk)


def test_params_repr():
    p = attnref.SparseFlashAttentionParams(scale_value=0.5, layout_kv="PA_BSND")
    assert "layout_kv='PA_BSND'" in repr(p) and "attention_mode=2" in repr(p)
    assert attnref.DsaStepParams().layout_query == "TND"
    assert attnref.KvQuantSparseFlashAttentionParams(tile_size=64).tile_size == 64
