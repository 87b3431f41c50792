"""attnref's NSA operators from Python: layer 1 (attnref.nsa_*) and layer 2
(attnref.torch_npu.npu_nsa_*), against references written here in NumPy float64 (no attnref code).

Shapes: the vendor's example (N 64, KV_N 4, Dqk 192, Dv 128, compress 32 / 16, select 16 blocks
of 64, pages of 128) scaled down to N 8, KV_N 2, select 4 blocks of 64, raw pages of 64 and
compressed pages of 32, with the vendor's constraint lists on (strict)."""

import inspect

import numpy as np
import pytest

import attnref
import attnref.torch_npu as torch_npu

RNG = np.random.default_rng(2025)
N, KVN, DQK, DV = 8, 2, 192, 128
L, D, LS, K = 32, 16, 64, 4  # compress block / stride, select block size / count
PBS, CPBS = 64, 32  # raw and compressed page sizes
SCALE = 1.0 / np.sqrt(DQK)


def randn(*shape, dtype=np.float16):
    return RNG.standard_normal(shape).astype(dtype)


def close(got, ref, dtype):
    tol = {np.float16: 2e-3, np.float32: 1e-5}.get(dtype, 1.6e-2)
    got = np.asarray(got, dtype=np.float64)
    err = np.abs(got - ref).max()
    assert err <= tol * max(1.0, np.abs(ref).max()), err


def count(n, l=L, d=D):
    return 0 if n < l else (n - l) // d + 1


def paged(lens, page, width, dtype=np.float16, spare=2):
    """A shuffled paged pool [blocks, page, width] holding len_b tokens per sequence; the table
    is padded with -1."""
    need = [-(-n // page) for n in lens]
    blocks = sum(need) + spare
    cache = randn(blocks, page, width, dtype=dtype)
    order = RNG.permutation(blocks).astype(np.int32)
    table = np.full((len(lens), max(max(need), 1) + 1), -1, np.int32)
    at = 0
    for b, n in enumerate(need):
        table[b, :n] = order[at:at + n]
        at += n
    return cache, table


def gather(cache, table_row, n):
    """The first n token rows of one sequence of a paged cache, float64 [n, ...]."""
    page = cache.shape[1]
    return np.array([cache[table_row[t // page], t % page] for t in range(n)], np.float64)


def softmax(s):
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# ---- References -------------------------------------------------------------------------------

def compress_ref(x, w, cu, l=L, d=D):
    """x [T, N, D] TND, w [l, N], cumulative lengths -> float64 [T', N, D]."""
    x, w, out, start = x.astype(np.float64), w.astype(np.float64), [], 0
    for end in cu:
        for i in range(count(end - start, l, d)):
            out.append(np.einsum("jn,jnd->nd", w, x[start + i * d:start + i * d + l]))
        start = end
    return np.array(out).reshape(-1, x.shape[1], x.shape[2])


def select_scores(p, l=L, d=D, ls=LS):
    """One head's importance per select block: sum_{m<l'/d} sum_{n<l/d} P[a(j+1) - m - n]."""
    cmp, a, c = len(p), ls // d, l // d
    n_sel = 0 if cmp == 0 else -(-((cmp - 1) * d + l) // ls)
    s = np.zeros(n_sel)
    for j in range(n_sel):
        for m in range(a):
            for n in range(c):
                if 0 <= a * (j + 1) - m - n < cmp:
                    s[j] += p[a * (j + 1) - m - n]
    return s


def topk_of(score, k=K):
    n = len(score)
    s = score.copy()
    s[[i for i in {0, n - 2, n - 1} if 0 <= i < n]] = np.inf  # forced blocks
    order = sorted(range(n), key=lambda i: (-s[i], i))[:k]
    return order + [-1] * (k - len(order))


def cmp_ref(q, kc, vc, ctab, cmp, qlen, sel=None, mask=False, k_sel=K):
    """Compressed branch: q TND [T, N, Dqk] -> (out [T, N, Dv], topk [T, KVN, k], P per row)."""
    g = N // KVN
    out, topk, probs, row = np.zeros((q.shape[0], N, DV)), [], [], 0
    for b, (c, ql) in enumerate(zip(cmp, qlen)):
        k = gather(kc, ctab[b], c).reshape(c, KVN, DQK)
        v = gather(vc, ctab[b], c).reshape(c, KVN, DV)
        tail = sel[b] - ((c - 1) * D + L) if mask else 0
        for i in range(ql):
            group, pr = np.zeros((KVN, 0 if c == 0 else -(-((c - 1) * D + L) // LS))), []
            for h in range(N):
                if c == 0:
                    pr.append(np.zeros(0))
                    continue
                s = SCALE * k[:, h // g] @ q[row, h].astype(np.float64)
                if mask and ql > 1 and ql - i - 1 > tail:
                    s[c - 1] = -np.inf
                p = softmax(s)
                pr.append(p)
                out[row, h] = p @ v[:, h // g]
                group[h // g] += select_scores(p)
            topk.append([topk_of(group[kh], k_sel) for kh in range(KVN)])
            probs.append(pr)
            row += 1
    return out, np.array(topk, np.int32), probs


def sel_ref(q, kr, vr, table, topk, sel, qlen, key_dims=None):
    """Selected branch: q TND [T, N, Dqk], raw caches [.., PBS, KVN*D] -> [T, N, Dv]."""
    g = N // KVN
    out, row = np.zeros((q.shape[0], N, DV)), 0
    for b, (s, ql) in enumerate(zip(sel, qlen)):
        k = gather(kr, table[b], s).reshape(s, KVN, DQK)
        v = gather(vr, table[b], s).reshape(s, KVN, DV)
        for i in range(ql):
            lim = s - (ql - 1 - i)
            for kh in range(KVN):
                pos = sorted({t for j in topk[row, kh] if j >= 0
                              for t in range(j * LS, min((j + 1) * LS, lim))})
                for h in range(kh * g, (kh + 1) * g):
                    if pos:
                        p = softmax(SCALE * k[pos, kh] @ q[row, h].astype(np.float64))
                        out[row, h] = p @ v[pos, kh]
            row += 1
    return out


def win_ref(q, kr, vr, table, sel, qlen, w):
    g = N // KVN
    out, row = np.zeros((q.shape[0], N, DV)), 0
    for b, (s, ql) in enumerate(zip(sel, qlen)):
        k = gather(kr, table[b], s).reshape(s, KVN, DQK)
        v = gather(vr, table[b], s).reshape(s, KVN, DV)
        for i in range(ql):
            t = s - ql + i
            pos = list(range(max(0, t - w + 1), t + 1))
            for h in range(N):
                p = softmax(SCALE * k[pos, h // g] @ q[row, h].astype(np.float64))
                out[row, h] = p @ v[pos, h // g]
            row += 1
    return out


# ---- Fixtures ---------------------------------------------------------------------------------

SEL = [300, 517, 290]  # raw lengths: 17, 31 and 17 compressed tokens, >= K select blocks each
QLEN = [1, 2, 4]


def decode_case(dtype=np.float16, sel=SEL, qlen=QLEN):
    cmp = [count(s) for s in sel]
    kr, table = paged(sel, PBS, KVN * DQK, dtype)
    vr = randn(*kr.shape[:2], KVN * DV, dtype=dtype)
    kc, ctab = paged(cmp, CPBS, KVN * DQK, dtype)
    vc = randn(*kc.shape[:2], KVN * DV, dtype=dtype)
    q = randn(sum(qlen), N, DQK, dtype=dtype)
    return dict(q=q, kr=kr, vr=vr, table=table, kc=kc, vc=vc, ctab=ctab, sel=sel, cmp=cmp,
                qlen=qlen)


CMP_PARAMS = dict(num_heads=N, num_key_value_heads=KVN, select_block_size=LS,
                  select_block_count=K, compress_block_size=L, compress_block_stride=D,
                  scale_value=SCALE, page_block_size=CPBS)
SEL_PARAMS = dict(num_heads=N, num_key_value_heads=KVN, select_block_size=LS,
                  select_block_count=K, page_block_size=PBS, scale_value=SCALE)


def cmp_layer1(c, mask=True, **extra):
    params = dict(CMP_PARAMS, **extra)
    return attnref.nsa_compress_attention_infer(
        query=c["q"], key=c["kc"], value=c["vc"], block_table=c["ctab"],
        atten_mask=np.ones(1, np.uint8) if mask else None, actual_q_seq_len=c["qlen"],
        actual_cmp_kv_seq_len=c["cmp"], actual_sel_kv_seq_len=c["sel"], **params)


def random_topk(c, rows):
    """Distinct random select blocks per (row, kv head), each a block of its batch, -1 padded."""
    topk, row = np.full((rows, KVN, K), -1, np.int32), 0
    for s, ql in zip(c["sel"], c["qlen"]):
        for _ in range(ql):
            for kh in range(KVN):
                n = RNG.integers(1, K + 1)
                topk[row, kh, RNG.permutation(K)[:n]] = RNG.permutation(-(-s // LS))[:n]
            row += 1
    return topk


# ---- nsa_compress, nsa_compress_with_cache, nsa_update_compressed_cache ------------------------

@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_nsa_compress_matches_the_reference_over_batches(dtype):
    cu = [70, 70 + 20, 90 + 129]  # 3, 0 and 7 compressed tokens
    x, w = randn(cu[-1], 4, 32, dtype=dtype), randn(L, 4, dtype=dtype)
    out = attnref.nsa_compress(input=x, weight=w, act_seq_len=cu)
    assert out.dtype == dtype and out.shape == (10, 4, 32)
    close(out, compress_ref(x, w, cu), dtype)


def test_nsa_compress_reads_a_strided_input_and_writes_the_callers_output():
    cu = [64, 100]
    wide = randn(100, 4, 48)
    x, w = wide[:, :, 8:40], randn(L, 4)  # a head slice of a wider buffer
    out = np.full((4, 4, 32), 7, np.float16)  # 3 + 1 compressed tokens
    assert attnref.nsa_compress(input=x, weight=w, act_seq_len=np.array(cu), output=out) is out
    assert np.array_equal(out, attnref.nsa_compress(input=np.ascontiguousarray(x), weight=w,
                                                    act_seq_len=cu))


def test_nsa_compress_bf16_torch_and_layer_2():
    torch = pytest.importorskip("torch")
    cu = [48, 112]
    x, w = torch.randn(112, 2, 16).bfloat16(), torch.randn(L, 2).bfloat16()
    out = attnref.nsa_compress(input=x, weight=w, act_seq_len=cu)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16 and out.shape == (5, 2, 16)
    close(out.float().numpy(), compress_ref(x.float().numpy(), w.float().numpy(), cu), "bf16")
    npu = torch_npu.npu_nsa_compress(x, w, L, D, actual_seq_len=cu)
    assert isinstance(npu, torch.Tensor) and torch.equal(npu, out)


def test_npu_nsa_compress_is_layer_1_bit_for_bit():
    cu = [33, 33 + 80]
    x, w = randn(cu[-1], 3, 64), randn(L, 3)
    assert np.array_equal(torch_npu.npu_nsa_compress(x, w, L, D, actual_seq_len=cu),
                          attnref.nsa_compress(input=x, weight=w, act_seq_len=cu,
                                               compress_block_size=L, compress_stride=D))


def with_cache_case(dtype=np.float16):
    lens = [48, 50, 32, 64]  # 48, 32 and 64 complete a block; 50 does not
    nh, hd = 4, 32
    raw, table = paged(lens, PBS, nh * hd, dtype)
    raw = raw.reshape(raw.shape[0], PBS, nh, hd)
    w = randn(L, nh, dtype=dtype)
    slots = np.array([5, -1, 0, 17], np.int32)  # the batch that writes nothing: slot not read
    rows = raw.shape[0] * PBS // D + 1
    cache = np.full((rows, nh, hd), 7, dtype)
    return lens, raw, table, w, slots, cache


def with_cache_ref(lens, raw, table, w, slots, cache):
    ref, written = cache.astype(np.float64), []
    for b, s in enumerate(lens):
        if s >= L and (s - L) % D == 0:
            x = gather(raw, table[b], s)[s - L:]
            ref[slots[b]] = np.einsum("jn,jnd->nd", w.astype(np.float64), x)
            written.append(slots[b])
    return ref, written


def test_nsa_compress_with_cache_writes_only_the_completing_batches():
    lens, raw, table, w, slots, cache = with_cache_case()
    ref, written = with_cache_ref(lens, raw, table, w, slots, cache)
    out = attnref.nsa_compress_with_cache(input=raw, weight=w, slot_mapping=slots, act_seq_len=lens,
                                          block_table=table, output_cache=cache,
                                          compress_block_size=L, compress_stride=D,
                                          page_block_size=PBS)
    assert out is cache
    close(cache[written], ref[written], np.float16)
    rest = np.setdiff1d(np.arange(cache.shape[0]), written)
    assert (cache[rest] == 7).all()


def test_npu_nsa_compress_infer_writes_the_torch_cache_in_place():
    torch = pytest.importorskip("torch")
    lens, raw, table, w, slots, cache = with_cache_case(np.float32)
    traw, tw = torch.from_numpy(raw).bfloat16(), torch.from_numpy(w).bfloat16()
    tcache = torch.from_numpy(cache).bfloat16()
    ref, written = with_cache_ref(lens, traw.float().numpy(), table, tw.float().numpy(), slots,
                                  tcache.float().numpy())
    got = torch_npu.npu_nsa_compress_infer.cache(
        traw, tw, torch.from_numpy(slots), L, D, PBS, block_table=torch.from_numpy(table),
        actual_seq_len=lens, cache=tcache)
    assert got is tcache
    close(tcache.float().numpy()[written], ref[written], "bf16")
    layer1 = attnref.nsa_compress_with_cache(
        input=traw, weight=tw, slot_mapping=slots, act_seq_len=lens, block_table=table,
        output_cache=torch.from_numpy(cache).bfloat16(), compress_block_size=L,
        compress_stride=D, page_block_size=PBS)
    assert torch.equal(layer1, tcache)


def test_npu_nsa_compress_infer_rejects_a_missing_block_table_and_bad_slots():
    lens, raw, table, w, slots, cache = with_cache_case()
    with pytest.raises(ValueError, match="block_table"):
        torch_npu.npu_nsa_compress_infer(raw, w, slots, L, D, PBS, actual_seq_len=lens,
                                         cache=cache)
    bad = slots.copy()
    bad[3] = cache.shape[0]
    with pytest.raises(IndexError, match=r"slot_mapping\[3\]"):
        torch_npu.npu_nsa_compress_infer(raw, w, bad, L, D, PBS, block_table=table,
                                         actual_seq_len=lens, cache=cache)
    assert (cache == 7).all()  # checked before anything is written
    with pytest.raises(ValueError, match="actual_seq_len"):
        torch_npu.npu_nsa_compress_infer(raw, w, slots, L, D, PBS, block_table=table, cache=cache)


def test_nsa_update_compressed_cache_compresses_a_prompt_into_the_paged_caches():
    c = decode_case()
    wk, wv = randn(L, KVN), randn(L, KVN)
    ck, cv = np.full_like(c["kc"], 7), np.full_like(c["vc"], 7)
    assert attnref.nsa_update_compressed_cache(
        key=c["kr"], value=c["vr"], block_table=c["table"], key_weight=wk, value_weight=wv,
        cmp_block_table=c["ctab"], actual_sel_kv_seq_len=c["sel"], actual_new_kv_len=c["sel"],
        cmp_key=ck, cmp_value=cv, num_key_value_heads=KVN, page_block_size=PBS,
        cmp_page_block_size=CPBS) is None
    touched = np.zeros(ck.shape[:2], bool)
    for b, s in enumerate(c["sel"]):
        kx = gather(c["kr"], c["table"][b], s).reshape(s, KVN, DQK)
        vx = gather(c["vr"], c["table"][b], s).reshape(s, KVN, DV)
        kref = compress_ref(kx, wk, [s]).reshape(-1, KVN * DQK)
        vref = compress_ref(vx, wv, [s]).reshape(-1, KVN * DV)
        close(gather(ck, c["ctab"][b], c["cmp"][b]), kref, np.float16)
        close(gather(cv, c["ctab"][b], c["cmp"][b]), vref, np.float16)
        for t in range(c["cmp"][b]):
            touched[c["ctab"][b][t // CPBS], t % CPBS] = True
    assert (ck[~touched] == 7).all() and (cv[~touched] == 7).all()


# ---- nsa_compress_attention_infer -------------------------------------------------------------

def test_nsa_compress_attention_infer_multi_token_matches_the_reference():
    c = decode_case()
    probs = np.zeros((sum(QLEN), N, max(c["cmp"])), np.float32)
    out, topk = cmp_layer1(c, probs=probs)
    assert out.shape == (7, N, DV) and topk.shape == (7, KVN, K) and topk.dtype == np.int32
    ref, ref_topk, ref_p = cmp_ref(c["q"], c["kc"], c["vc"], c["ctab"], c["cmp"], QLEN, SEL,
                                   mask=True)
    close(out, ref, np.float16)
    assert np.array_equal(topk, ref_topk)
    for row, pr in enumerate(ref_p):
        for h, p in enumerate(pr):
            assert np.allclose(probs[row, h, :len(p)], p, rtol=1e-5, atol=1e-7)
    # The mask's last-key rule bites: token 0 of batch 2 (4 tokens, tail 2) sees 16 of 17 keys.
    assert probs[3, 0, 16] == 0 and probs[6, 0, 16] > 0


def test_nsa_compress_attention_infer_selects_the_reference_blocks_of_long_sequences():
    # 17 and 10 select blocks, 8 picked: 5 and 5 chosen by score beside the 3 forced ones.
    c = decode_case(sel=[1100, 700], qlen=[1, 3])
    out, topk = cmp_layer1(c, select_block_count=8)
    ref, ref_topk, _ = cmp_ref(c["q"], c["kc"], c["vc"], c["ctab"], c["cmp"], [1, 3],
                               [1100, 700], mask=True, k_sel=8)
    close(out, ref, np.float16)
    assert np.array_equal(topk, ref_topk)


def test_nsa_compress_attention_infer_without_mask_and_bsnd_is_tnd():
    c = decode_case(qlen=[1, 1, 1])
    out, topk = cmp_layer1(c, mask=False)
    ref, ref_topk, _ = cmp_ref(c["q"], c["kc"], c["vc"], c["ctab"], c["cmp"], [1, 1, 1])
    close(out, ref, np.float16)
    assert np.array_equal(topk, ref_topk)
    out4, topk4 = cmp_layer1(dict(c, q=c["q"][:, None]), mask=False, layout="BSND")
    assert np.array_equal(out4[:, 0], out) and np.array_equal(topk4[:, 0], topk)


def test_npu_nsa_compress_attention_infer_is_layer_1_bit_for_bit():
    c = decode_case()
    out, topk = torch_npu.npu_nsa_compress_attention_infer(
        c["q"], c["kc"], c["vc"], SCALE, N, KVN, LS, K, CPBS, L, D,
        atten_mask=np.ones((4, 4), np.bool_), block_table=c["ctab"], actual_seq_qlen=QLEN,
        actual_cmp_seq_kvlen=c["cmp"], actual_sel_seq_kvlen=SEL)
    out1, topk1 = cmp_layer1(c)
    assert np.array_equal(out, out1) and np.array_equal(topk, topk1)


def test_npu_nsa_compress_attention_infer_bf16_torch():
    torch = pytest.importorskip("torch")
    c = decode_case(np.float32, qlen=[1, 1, 1])
    t = {k: torch.from_numpy(c[k]).bfloat16() for k in ("q", "kc", "vc")}
    out, topk = torch_npu.npu_nsa_compress_attention_infer(
        t["q"], t["kc"], t["vc"], SCALE, N, KVN, LS, K, CPBS, L, D, layout="TND",
        block_table=torch.from_numpy(c["ctab"]), actual_cmp_seq_kvlen=c["cmp"])
    assert out.dtype == torch.bfloat16 and topk.dtype == torch.int32
    ref, ref_topk, _ = cmp_ref(*(t[k].float().numpy() for k in ("q", "kc", "vc")), c["ctab"],
                               c["cmp"], [1, 1, 1])
    close(out.float().numpy(), ref, "bf16")
    assert np.array_equal(topk.numpy(), ref_topk)
    o1, t1 = attnref.nsa_compress_attention_infer(
        query=t["q"], key=t["kc"], value=t["vc"], block_table=c["ctab"],
        atten_mask=torch.ones(1, 1, dtype=torch.bool), actual_cmp_kv_seq_len=c["cmp"],
        **CMP_PARAMS)
    assert torch.equal(o1, out) and torch.equal(t1, topk)


def test_nsa_compress_attention_infer_writes_the_callers_outputs():
    torch = pytest.importorskip("torch")
    c = decode_case(qlen=[1, 1, 1])
    out = torch.zeros(3, N, DV, dtype=torch.float16)
    topk = torch.zeros(3, KVN, K, dtype=torch.int32)
    got = attnref.nsa_compress_attention_infer(
        query=torch.from_numpy(c["q"]), key=c["kc"], value=c["vc"], block_table=c["ctab"],
        actual_cmp_kv_seq_len=c["cmp"], output=out, topk=topk, **CMP_PARAMS)
    assert got[0] is out and got[1] is topk
    ref_out, ref_topk = cmp_layer1(c, mask=False)
    assert np.array_equal(out.numpy(), ref_out) and np.array_equal(topk.numpy(), ref_topk)


# ---- nsa_selected_attention_infer -------------------------------------------------------------

def test_nsa_selected_attention_infer_tnd_matches_the_reference():
    c = decode_case()
    topk = random_topk(c, 7)
    out = attnref.nsa_selected_attention_infer(
        query=c["q"], key=c["kr"], value=c["vr"], topk_indices=topk, block_table=c["table"],
        actual_q_seq_len=QLEN, actual_sel_kv_seq_len=SEL, layout="TND", **SEL_PARAMS)
    close(out, sel_ref(c["q"], c["kr"], c["vr"], c["table"], topk, SEL, QLEN), np.float16)


def test_npu_nsa_select_attention_infer_bsh_with_the_vendors_3d_topk():
    c = decode_case(qlen=[1, 1, 1])
    topk = random_topk(c, 3)
    q = c["q"].reshape(3, 1, N * DQK)  # BSH, S = 1
    out = torch_npu.npu_nsa_select_attention_infer(
        q, c["kr"], c["vr"], topk, SCALE, N, KVN, LS, K, PBS, layout="BSH",
        block_table=c["table"], actual_seq_kvlen=SEL)
    assert out.shape == (3, 1, N * DV)
    ref = sel_ref(c["q"], c["kr"], c["vr"], c["table"], topk, SEL, [1, 1, 1])
    close(out.reshape(3, N, DV), ref, np.float16)


def test_npu_nsa_select_attention_infer_bsnd_4d_caches_equal_tnd_and_layer_1():
    c = decode_case(qlen=[1, 1, 1])
    topk = random_topk(c, 3)
    pool = np.stack([c["kr"], np.zeros_like(c["kr"])])  # caches sliced out of a bigger buffer
    k4 = pool[0].reshape(-1, PBS, KVN, DQK)
    v4 = c["vr"].reshape(-1, PBS, KVN, DV)
    bsnd = torch_npu.npu_nsa_select_attention_infer(
        c["q"][:, None], k4, v4, topk[:, None], SCALE, N, KVN, LS, K, PBS,
        block_table=c["table"], actual_seq_kvlen=SEL)
    tnd = torch_npu.npu_nsa_select_attention_infer(
        c["q"], c["kr"], c["vr"], topk, SCALE, N, KVN, LS, K, PBS, layout="TND",
        block_table=c["table"], actual_seq_qlen=[1, 1, 1], actual_seq_kvlen=SEL)
    layer1 = attnref.nsa_selected_attention_infer(
        query=c["q"], key=c["kr"], value=c["vr"], topk_indices=topk, block_table=c["table"],
        actual_sel_kv_seq_len=SEL, layout="TND", **SEL_PARAMS)
    assert np.array_equal(bsnd[:, 0], tnd) and np.array_equal(tnd, layer1)


def test_npu_nsa_select_attention_infer_bf16_torch_strided_query():
    torch = pytest.importorskip("torch")
    c = decode_case(np.float32, qlen=[1, 1, 1])
    topk = random_topk(c, 3)
    wide = torch.zeros(3, N, DQK + 64, dtype=torch.bfloat16)
    wide[:, :, 32:32 + DQK] = torch.from_numpy(c["q"]).bfloat16()
    q = wide[:, :, 32:32 + DQK]
    kr, vr = torch.from_numpy(c["kr"]).bfloat16(), torch.from_numpy(c["vr"]).bfloat16()
    out = torch_npu.npu_nsa_select_attention_infer(
        q, kr, vr, torch.from_numpy(topk), SCALE, N, KVN, LS, K, PBS, layout="TND",
        block_table=torch.from_numpy(c["table"]), actual_seq_kvlen=SEL)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
    ref = sel_ref(q.float().numpy(), kr.float().numpy(), vr.float().numpy(), c["table"], topk,
                  SEL, [1, 1, 1])
    close(out.float().numpy(), ref, "bf16")


# ---- window, gate, decode step ----------------------------------------------------------------

STEP = dict(num_heads=N, num_key_value_heads=KVN, compress_block_size=L, compress_block_stride=D,
            select_block_size=LS, select_block_count=K, window_size=100, page_block_size=PBS,
            cmp_page_block_size=CPBS, scale_value=SCALE)


def step_inputs(c, gates):
    return dict(query=c["q"], key=c["kr"], value=c["vr"], block_table=c["table"],
                cmp_key=c["kc"], cmp_value=c["vc"], cmp_block_table=c["ctab"], gates=gates,
                actual_q_seq_len=c["qlen"], actual_sel_kv_seq_len=c["sel"])


def test_nsa_sliding_window_attention_matches_the_reference():
    c = decode_case()
    out = attnref.nsa_sliding_window_attention(**step_inputs(c, None), **STEP)
    close(out, win_ref(c["q"], c["kr"], c["vr"], c["table"], SEL, QLEN, 100), np.float16)


def test_nsa_gated_sum_matches_the_reference():
    gates = RNG.random((5, N, 3)).astype(np.float32)
    o = [randn(5, N, DV) for _ in range(3)]
    out = attnref.nsa_gated_sum(gates=gates, o_cmp=o[0], o_sel=o[1], o_win=o[2])
    ref = sum(gates[..., i:i + 1].astype(np.float64) * o[i] for i in range(3))
    close(out, ref, np.float16)


def test_nsa_decode_step_composes_the_three_branches():
    c = decode_case()
    gates = RNG.random((7, N, 3)).astype(np.float32)
    topk = np.zeros((7, KVN, K), np.int32)
    branches = {n: np.zeros((7, N, DV), np.float16) for n in ("cmp_out", "sel_out", "win_out")}
    out = attnref.nsa_decode_step(**step_inputs(c, gates), topk=topk, **branches, **STEP)
    ref_cmp, ref_topk, _ = cmp_ref(c["q"], c["kc"], c["vc"], c["ctab"], c["cmp"], QLEN, SEL,
                                   mask=True)
    assert np.array_equal(topk, ref_topk)
    ref_sel = sel_ref(c["q"], c["kr"], c["vr"], c["table"], ref_topk, SEL, QLEN)
    ref_win = win_ref(c["q"], c["kr"], c["vr"], c["table"], SEL, QLEN, 100)
    for got, ref in zip(branches.values(), (ref_cmp, ref_sel, ref_win)):
        close(got, ref, np.float16)
    ref = sum(gates[..., i:i + 1] * r for i, r in enumerate((ref_cmp, ref_sel, ref_win)))
    close(out, ref, np.float16)
    one = attnref.nsa_decode_step(**step_inputs(c, gates), params=attnref.NsaDecodeParams(**STEP),
                                  threads=1)  # the bits do not depend on the thread count
    assert np.array_equal(one, out)


# ---- Params, helpers, errors, signatures ------------------------------------------------------

def test_params_are_python_types_with_a_readable_repr():
    p = attnref.NsaSelectedAttentionInferParams(num_heads=8, layout="TND")
    assert "num_heads=8" in repr(p) and "layout='TND'" in repr(p) and "strict=True" in repr(p)
    assert attnref.NsaDecodeParams().window_size == 512
    assert set(attnref.NsaCompressWithCacheParams.fields) >= {"page_block_size", "act_seq_len_type"}
    with pytest.raises(TypeError, match="no field named 'heads'"):
        attnref.NsaCompressParams(heads=1)
    assert attnref.nsa_compressed_count(300, 32, 16) == 17
    assert attnref.nsa_select_block_count(17, 32, 16, 64) == 5


def test_layer_1_errors_name_the_argument_and_write_nothing():
    c = decode_case(qlen=[1, 1, 1])
    topk = random_topk(c, 3)
    topk[1, 1, 0] = 9  # batch 1 has ceil(517 / 64) = 9 select blocks: 0..8
    out = np.full((3, N, DV), 7, np.float16)
    kw = dict(query=c["q"], key=c["kr"], value=c["vr"], block_table=c["table"], output=out,
              actual_sel_kv_seq_len=SEL, layout="TND", **SEL_PARAMS)
    with pytest.raises(IndexError, match=r"topk_indices\[1\]\[1\]\[0\]"):
        attnref.nsa_selected_attention_infer(topk_indices=topk, **kw)
    assert (out == 7).all()
    with pytest.raises(TypeError, match="block_table must hold int32 or int64 indices, got int16"):
        attnref.nsa_selected_attention_infer(topk_indices=random_topk(c, 3),
                                             **dict(kw, block_table=c["table"].astype(np.int16)))
    with pytest.raises(ValueError, match="strict"):  # Dv 128 is a vendor rule
        attnref.nsa_selected_attention_infer(topk_indices=random_topk(c, 3),
                                             **dict(kw, value=c["vr"][..., :KVN * 64], output=None))
    with pytest.raises(TypeError, match="query is required"):
        attnref.nsa_decode_step(key=c["kr"])
    with pytest.raises(TypeError, match="'bogus' is not an argument|bogus"):
        attnref.nsa_gated_sum(gates=np.zeros((1, 1, 3), np.float32), o_cmp=randn(1, 1, 8),
                              o_sel=randn(1, 1, 8), o_win=randn(1, 1, 8), bogus=1)


def test_layer_2_errors_name_the_torch_npu_argument():
    c = decode_case(qlen=[1, 1, 1])
    args = (c["q"], c["kc"], c["vc"], SCALE, N, KVN, LS, K, CPBS, L, D)
    with pytest.raises(ValueError, match="torch_npu.npu_nsa_compress_attention_infer: .*"
                                         "actual_cmp_seq_kvlen"):
        torch_npu.npu_nsa_compress_attention_infer(*args, block_table=c["ctab"])
    with pytest.raises(ValueError, match="head_num"):
        torch_npu.npu_nsa_compress_attention_infer(c["q"], c["kc"], c["vc"], SCALE, 6, KVN, LS, K,
                                                   CPBS, L, D, block_table=c["ctab"],
                                                   actual_cmp_seq_kvlen=c["cmp"])
    with pytest.raises(ValueError, match=r"compress_stride not supported .*"
                                         r"attnref.nsa_compress_attention_infer\(\.\.\., "
                                         r"strict=False\)"):
        torch_npu.npu_nsa_compress_attention_infer(c["q"], c["kc"], c["vc"], SCALE, N, KVN, LS, K,
                                                   CPBS, L, 8, block_table=c["ctab"],
                                                   actual_cmp_seq_kvlen=c["cmp"])
    with pytest.raises(ValueError, match="actual_seq_kvlen"):
        torch_npu.npu_nsa_select_attention_infer(c["q"], c["kr"], c["vr"], random_topk(c, 3),
                                                 SCALE, N, KVN, LS, K, PBS, layout="TND",
                                                 block_table=c["table"])


def test_training_calls_are_rejected_naming_their_statistics():
    q = randn(4, N, DQK)
    with pytest.raises(ValueError, match="npu_nsa_compress_attention: .*softmax_max"):
        torch_npu.npu_nsa_compress_attention(q, q, q, SCALE, N, L, D, LS, K)
    with pytest.raises(ValueError, match="npu_nsa_select_attention: .*softmax_max"):
        torch_npu.npu_nsa_select_attention(q, q, q, q, SCALE, N, LS, K)


CONTRACTS = {
    "npu_nsa_compress": "(input, weight, compress_block_size, compress_stride, *, "
                        "actual_seq_len=None)",
    "npu_nsa_compress_infer": "(input, weight, slot_mapping, compress_block_size, compress_stride, "
                              "page_block_size, *, block_table=None, actual_seq_len=None, cache)",
    "npu_nsa_compress_attention": "(query, key, value, scale_value, head_num, compress_block_size, "
                                  "compress_stride, select_block_size, select_block_count, *, "
                                  "topk_mask=None, atten_mask=None, actual_seq_qlen=None, "
                                  "actual_cmp_seq_kvlen=None, actual_sel_seq_kvlen=None)",
    "npu_nsa_compress_attention_infer": "(query, key, value, scale_value, head_num, "
                                        "key_value_head_num, select_block_size, "
                                        "select_block_count, page_block_size, "
                                        "compress_block_size, compress_stride, *, layout='TND', "
                                        "atten_mask=None, block_table=None, topk_mask=None, "
                                        "actual_seq_qlen=None, actual_cmp_seq_kvlen=None, "
                                        "actual_sel_seq_kvlen=None)",
    "npu_nsa_select_attention": "(query, key, value, topk_indices, scale_value, head_num, "
                                "select_block_size, select_block_count, *, atten_mask=None, "
                                "actual_seq_qlen=None, actual_seq_kvlen=None)",
    "npu_nsa_select_attention_infer": "(query, key, value, topk_indices, scale_value, head_num, "
                                      "key_value_head_num, select_block_size, select_block_count, "
                                      "page_block_size, *, layout='BSND', atten_mask=None, "
                                      "block_table=None, actual_seq_qlen=None, "
                                      "actual_seq_kvlen=None)",
}


@pytest.mark.parametrize("name", sorted(CONTRACTS))
def test_layer_2_signatures_are_torch_npus(name):
    assert str(inspect.signature(getattr(torch_npu, name))) == CONTRACTS[name]
    assert torch_npu.npu_nsa_compress_infer.cache is torch_npu.npu_nsa_compress_infer
