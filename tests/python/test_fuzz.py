"""The Python layer's adversarial input harness: seeded perturbations of valid calls of every
attnref.torch_npu entry. Every call either succeeds or raises ValueError, IndexError or TypeError
(never another exception, never a crash of the interpreter), and a call that raises leaves the
caller's outputs and caches untouched. ATTNREF_PY_FUZZ_CASES sets the cases per entry (default
150), ATTNREF_PY_FUZZ_SEED the seed."""

import os

import numpy as np
import pytest

import attnref.torch_npu as torch_npu

CASES = int(os.environ.get("ATTNREF_PY_FUZZ_CASES", "150"))
SEED = int(os.environ.get("ATTNREF_PY_FUZZ_SEED", "1"))
ALLOWED = (ValueError, IndexError, TypeError)


def f16(rng, *shape):
    return rng.standard_normal(shape).astype(np.float16)


def lens_of(rng, b, top):
    return rng.integers(1, top + 1, b).astype(np.int32)


# Each builder returns (function, kwargs, names of the arguments written in place).

def reshape_and_cache(rng):
    t, h, d, blocks, bs = rng.integers(1, 6), rng.integers(1, 3), 16, 3, 4
    slots = rng.permutation(blocks * bs)[:t].astype(np.int32)
    return torch_npu._npu_reshape_and_cache, dict(
        key=f16(rng, t, h, d), value=f16(rng, t, h, d), key_cache=f16(rng, blocks, bs, h, d),
        value_cache=f16(rng, blocks, bs, h, d), slot_indices=slots), ("key_cache", "value_cache")


def paged(rng):
    b, g, hkv, d, bs = rng.integers(1, 4), rng.integers(1, 3), rng.integers(1, 3), 16, 8
    lens = lens_of(rng, b, 24)
    per = 3
    table = rng.permutation(b * per).reshape(b, per).astype(np.int32)
    return torch_npu._npu_paged_attention, dict(
        query=f16(rng, b, g * hkv, d), key_cache=f16(rng, b * per, bs, hkv, d),
        value_cache=f16(rng, b * per, bs, hkv, d), num_kv_heads=int(hkv), num_heads=int(g * hkv),
        scale_value=0.25, block_table=table, context_lens=lens,
        out=np.zeros((b, g * hkv, d), np.float16)), ("out",)


def splitfuse(rng):
    b, h, d, bs, per = rng.integers(1, 3), 2, 16, 8, 3
    ctx = lens_of(rng, b, 24)
    ql = np.minimum(ctx, rng.integers(1, 4, b)).astype(np.int32)
    t = int(ql.sum())
    mask = np.zeros((t, int(ctx.max())), np.float16)
    return torch_npu._npu_paged_attention_splitfuse, dict(
        query=f16(rng, t, h, d), key_cache=f16(rng, b * per, bs, 1, d),
        value_cache=f16(rng, b * per, bs, 1, d),
        block_table=rng.permutation(b * per).reshape(b, per).astype(np.int32), context_lens=ctx,
        mask=mask, seq_len=ql, num_kv_heads=1, num_heads=h, scale_value=0.3,
        out=np.zeros((t, h, d), np.float16)), ("out",)


def paged_mla(rng):
    b, h, bs, per = rng.integers(1, 3), rng.integers(1, 5), 16, 2
    return torch_npu._npu_paged_attention_mla, dict(
        query=f16(rng, b, h, 96), key_cache=f16(rng, b * per, bs, 1, 96), num_kv_heads=1,
        num_heads=int(h), scale_value=0.1,
        block_table=rng.permutation(b * per).reshape(b, per).astype(np.int32),
        context_lens=lens_of(rng, b, 32), mla_vheadsize=64,
        out=np.zeros((b, h, 64), np.float16)), ("out",)


def flash(rng):
    lens = lens_of(rng, rng.integers(1, 4), 8)
    t, m = int(lens.sum()), int(lens.max())
    return torch_npu._npu_flash_attention, dict(
        query=f16(rng, t, 2, 16), key=f16(rng, t, 1, 16), value=f16(rng, t, 1, 16),
        mask=np.triu(np.full((m, m), -10000, np.float16), 1), seq_len=lens, scale_value=0.25,
        num_heads=2, num_kv_heads=1, out=np.zeros((t, 2, 16), np.float16)), ("out",)


def flash_qlens(rng):
    b, bs, per = rng.integers(1, 3), 16, 3
    ctx = lens_of(rng, b, 40)
    ql = np.minimum(ctx, rng.integers(1, 5, b)).astype(np.int32)
    t = int(ql.sum())
    return torch_npu._npu_flash_attention_qlens, dict(
        query=f16(rng, t, 2, 16), key_cache=f16(rng, b * per, bs, 1, 16),
        value_cache=f16(rng, b * per, bs, 1, 16),
        block_table=rng.permutation(b * per).reshape(b, per).astype(np.int32),
        mask=np.triu(np.full((128, 128), -10000, np.float16), 1), seq_len=ql, context_lens=ctx,
        num_kv_heads=1, num_heads=2, scale_value=0.25,
        out=np.zeros((t, 2, 16), np.float16)), ("out",)


MASK2048 = np.triu(np.ones((2048, 2048), np.bool_), 1)


def pfa(rng):
    b, n, kvn, s, d = rng.integers(1, 3), 4, 2, rng.integers(1, 9), 16
    return torch_npu.npu_prompt_flash_attention, dict(
        query=f16(rng, b, n, s, d), key=f16(rng, b, kvn, s, d), value=f16(rng, b, kvn, s, d),
        atten_mask=MASK2048, num_heads=n, scale_value=0.25, input_layout="BNSD",
        num_key_value_heads=kvn, sparse_mode=3), ()


def ifa_paged(rng):
    b, n, kvn, d, bs, per = rng.integers(1, 3), 4, 2, 16, 16, 2
    lens = [int(x) for x in rng.integers(1, bs * per + 1, b)]
    return torch_npu.npu_incre_flash_attention, dict(
        query=f16(rng, b, 1, n * d), key=f16(rng, b * per, bs, kvn * d),
        value=f16(rng, b * per, bs, kvn * d), actual_seq_lengths=lens,
        block_table=rng.permutation(b * per).reshape(b, per).astype(np.int32), num_heads=n,
        scale_value=0.25, input_layout="BSH", num_key_value_heads=kvn, block_size=bs), ()


def fia_tnd_paged(rng):
    n, kvn, d, bs, per = 4, 2, 16, 128, 2
    ql = [int(x) for x in rng.integers(1, 5, rng.integers(1, 3))]
    kl = [q + int(rng.integers(0, 100)) for q in ql]
    b = len(ql)
    return torch_npu.npu_fused_infer_attention_score, dict(
        query=f16(rng, sum(ql), n, d), key=f16(rng, b * per, bs, kvn * d),
        value=f16(rng, b * per, bs, kvn * d), atten_mask=MASK2048,
        block_table=rng.permutation(b * per).reshape(b, per).astype(np.int32),
        actual_seq_lengths=np.cumsum(ql).tolist(), actual_seq_lengths_kv=kl, num_heads=n,
        scale=0.25, input_layout="TND", num_key_value_heads=kvn, sparse_mode=3,
        block_size=bs, softmax_lse_flag=bool(rng.integers(2))), ()


def fia_bnsd_decode(rng):
    b, n, kvn, s, d = rng.integers(1, 3), 4, 2, rng.integers(1, 20), 16
    return torch_npu.npu_fused_infer_attention_score, dict(
        query=f16(rng, b, n, 1, d), key=f16(rng, b, kvn, s, d), value=f16(rng, b, kvn, s, d),
        actual_seq_lengths_kv=[int(s)] * int(b), num_heads=n, scale=0.25, input_layout="BNSD",
        num_key_value_heads=kvn), ()


def nsa_compress(rng):
    n, d = 2, 16
    cu = np.cumsum(rng.integers(0, 80, rng.integers(1, 3))).tolist()
    return torch_npu.npu_nsa_compress, dict(
        input=f16(rng, max(cu[-1], 1), n, d), weight=f16(rng, 32, n), compress_block_size=32,
        compress_stride=16, actual_seq_len=cu), ()


def nsa_select_infer(rng):
    from test_nsa import K, KVN, LS, N, PBS, SCALE, decode_case, random_topk
    c = decode_case(qlen=[1, 1, 1])
    return torch_npu.npu_nsa_select_attention_infer, dict(
        query=c["q"], key=c["kr"], value=c["vr"], topk_indices=random_topk(c, 3),
        scale_value=SCALE, head_num=N, key_value_head_num=KVN, select_block_size=LS,
        select_block_count=K, page_block_size=PBS, layout="TND", block_table=c["table"],
        actual_seq_qlen=[1, 1, 1], actual_seq_kvlen=c["sel"]), ()


def nsa_compress_attention_infer(rng):
    from test_nsa import CPBS, D, K, KVN, L, LS, N, SCALE, decode_case
    c = decode_case()
    return torch_npu.npu_nsa_compress_attention_infer, dict(
        query=c["q"], key=c["kc"], value=c["vc"], scale_value=SCALE, head_num=N,
        key_value_head_num=KVN, select_block_size=LS, select_block_count=K,
        page_block_size=CPBS, compress_block_size=L, compress_stride=D,
        atten_mask=np.ones((4, 4), np.bool_), block_table=c["ctab"],
        actual_seq_qlen=list(c["qlen"]), actual_cmp_seq_kvlen=c["cmp"],
        actual_sel_seq_kvlen=c["sel"]), ()


def mla_preprocess(rng):
    import test_mla as M
    t = M.problem("token")
    names = ["input", "gamma0", "beta0", "wdqkv", "descale0", "gamma1", "beta1", "wuq", "descale1",
             "gamma2", "cos", "sin", "wuk"]
    kw = dict(zip(names, M.npu_args(t)))
    kw.update(kv_cache=np.zeros((3, 64, 1, M.C), np.float16),
              kv_cache_rope=np.zeros((3, 64, 1, M.R), np.float16), slotmapping=t["slot_mapping"],
              cache_mode="krope_ctkv", quant_mode="per_token_quant_symm")
    return torch_npu.atb.npu_mla_preprocess, kw, ("kv_cache", "kv_cache_rope")


def lightning_indexer(rng):
    import test_dsa as D
    q, k, w = D.indexer_problem()
    return torch_npu.npu_lightning_indexer, dict(
        query=q, key=k, weights=w, actual_seq_lengths_query=D.cumulative(D.Q_LENS),
        actual_seq_lengths_key=np.array(D.KV_LENS, np.int32), block_table=D.TABLE,
        layout_query="TND", layout_key="PA_BSND", sparse_count=24, sparse_mode=3), ()


def sparse_flash_attention(rng):
    import test_dsa as D
    q, qr, cache, idx = D.sfa_problem()
    key = np.ascontiguousarray(cache[..., :512])
    return torch_npu.npu_sparse_flash_attention, dict(
        query=q, key=key, value=key, sparse_indices=idx, scale_value=0.05, block_table=D.TABLE,
        actual_seq_lengths_query=D.cumulative(D.Q_LENS),
        actual_seq_lengths_kv=np.array(D.KV_LENS, np.int32), query_rope=qr,
        key_rope=np.ascontiguousarray(cache[..., 512:]), layout_query="TND", layout_kv="PA_BSND",
        sparse_mode=3, attention_mode=2), ()


ENTRIES = {f.__name__: f for f in (
    reshape_and_cache, paged, splitfuse, paged_mla, flash, flash_qlens, pfa, ifa_paged,
    fia_tnd_paged, fia_bnsd_decode, nsa_compress, nsa_select_infer, nsa_compress_attention_infer,
    mla_preprocess, lightning_indexer, sparse_flash_attention)}


def perturb(rng, kw):
    """One random change of one argument; returns a description."""
    name = list(kw)[rng.integers(len(kw))]
    x = kw[name]
    if isinstance(x, np.ndarray):
        choice = rng.integers(11)
        if choice == 0:
            kw[name] = None
        elif choice == 1:
            kw[name] = x.astype(rng.choice([np.float32, np.int64, np.int8, np.float64, np.uint8]))
        elif choice == 2:
            kw[name] = x[None]
        elif choice == 3 and x.ndim > 1:
            kw[name] = x[..., 0]
        elif choice == 4:
            kw[name] = np.ascontiguousarray(np.swapaxes(x, 0, -1)) if x.ndim > 1 else x[::-1]
        elif choice == 5:
            kw[name] = x[:0]
        elif choice == 6 and x.dtype.kind == "i":
            y = x.copy()
            if y.size:
                y.flat[rng.integers(y.size)] = rng.choice([-1, -2**31, 2**31 - 1, 10**6])
            kw[name] = y
        elif choice == 7 and x.dtype.kind == "f":
            y = x.copy()
            if y.size:
                y.flat[rng.integers(y.size)] = rng.choice([np.nan, np.inf, -np.inf, 1.0, 6e4])
            kw[name] = y
        elif choice == 8 and x.size < 10000:
            kw[name] = x.tolist()
        elif choice == 9:
            kw[name] = np.concatenate([x, x]) if x.ndim else x
        else:
            kw[name] = x[::2] if x.ndim else x
    elif isinstance(x, list):
        y = list(x)
        choice = rng.integers(4)
        if choice == 0 and y:
            y[rng.integers(len(y))] = int(rng.choice([-1, 0, 2**31, 2**63 - 1]))
        elif choice == 1 and y:
            y.pop()
        elif choice == 2:
            y.append(int(rng.integers(0, 300)))
        else:
            y = np.array(y, rng.choice([np.int32, np.int64, np.float32]))
        kw[name] = y
    elif isinstance(x, str):
        kw[name] = str(rng.choice(["BSH", "BSND", "BNSD", "TND", "NTD", "", x.lower()]))
    elif isinstance(x, bool):
        kw[name] = not x
    elif isinstance(x, int):
        kw[name] = int(rng.choice([0, -1, 2**31, 2**40, x + 1, x * 2]))
    elif isinstance(x, float):
        kw[name] = float(rng.choice([0.0, -1.0, np.nan, np.inf, 1e30]))
    return name


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_bad_input_raises_a_python_error_and_writes_nothing(entry):
    rng = np.random.default_rng([SEED, sorted(ENTRIES).index(entry)])
    outcomes = {"ok": 0, "error": 0}
    for case in range(CASES):
        fn, kw, written = ENTRIES[entry](rng)
        if case == 0:
            fn(**kw)  # the unperturbed call is valid
            outcomes["ok"] += 1
            continue
        with np.errstate(invalid="ignore"):  # NaN / inf cast to an integer type
            for _ in range(rng.integers(1, 3)):
                perturb(rng, kw)
        before = {n: kw[n].copy() for n in written if isinstance(kw[n], np.ndarray)}
        try:
            fn(**kw)
            outcomes["ok"] += 1
        except ALLOWED as e:
            outcomes["error"] += 1
            assert str(e), "an empty error message"
            for n, b in before.items():
                assert np.array_equal(kw[n], b, equal_nan=True), f"{entry}: {n} written before {e}"
    assert outcomes["ok"] >= 1 and outcomes["error"] >= CASES // 10, outcomes
