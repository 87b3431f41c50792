"""Index tensors (block tables, slot mappings, sparse and top-k indices) as int32 or int64.

Layer 1 takes both: int32 is viewed, int64 is converted (a value outside int32 raises IndexError
naming the element). Layer 2 takes int32 only, as torch_npu's kernels read int32 indices. The
calls are the valid ones of the fuzz harness, one per torch_npu entry: every index array that
reaches the extension module is swapped for a strided int64 copy, and the results must be the
same bits."""

import numpy as np
import pytest

import attnref
import test_fuzz
from attnref import _attnref

INDEX_NAMES = ("block_table", "block_tables", "cmp_block_table", "slot_mapping", "sparse_indices",
               "topk_indices")
# The torch_npu arguments that carry those index arrays, by entry (the others carry none).
LAYER2_INDEX_ARGS = {
    "reshape_and_cache": "slot_indices", "paged": "block_table", "splitfuse": "block_table",
    "paged_mla": "block_table", "flash_qlens": "block_table", "ifa_paged": "block_table",
    "fia_tnd_paged": "block_table", "nsa_select_infer": "topk_indices",
    "nsa_compress_attention_infer": "block_table", "mla_preprocess": "slotmapping",
    "lightning_indexer": "block_table", "sparse_flash_attention": "sparse_indices",
}


def strided_int64(a):
    """``a`` as int64 with a stride of two elements along its last axis (not contiguous)."""
    big = np.full(a.shape[:-1] + (2 * a.shape[-1],), -7, np.int64)
    big[..., ::2] = a
    return big[..., ::2]


def run(fn, kw, written):
    """The call's results and its in-place arguments afterwards (written into copies)."""
    kw = dict(kw, **{n: kw[n].copy() for n in written})
    result = fn(**kw)
    return result, kw


def same_bits(a, b):
    if isinstance(a, tuple):
        return len(a) == len(b) and all(same_bits(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    return a == b


@pytest.mark.parametrize("entry", sorted(LAYER2_INDEX_ARGS))
def test_int64_indices_give_the_bits_of_int32_ones(entry, monkeypatch):
    fn, kw, written = test_fuzz.ENTRIES[entry](np.random.default_rng(11))
    want_result, want_kw = run(fn, kw, written)
    swapped = []

    def widen(impl):
        def wrapper(*args):
            for a in args:
                if isinstance(a, dict):
                    for name in INDEX_NAMES:
                        x = a.get(name)
                        if isinstance(x, np.ndarray) and x.dtype == np.int32 and x.ndim:
                            a[name] = strided_int64(x)
                            swapped.append(name)
            return impl(*args)
        return wrapper

    for name in dir(_attnref):
        if name.startswith("_") and not name.startswith("__"):
            monkeypatch.setattr(_attnref, name, widen(getattr(_attnref, name)))
    got_result, got_kw = run(fn, kw, written)
    assert swapped, f"{entry}: no index array reached the module"
    assert same_bits(got_result, want_result)
    for n in written:
        assert same_bits(got_kw[n], want_kw[n]), n


@pytest.mark.parametrize("entry", sorted(LAYER2_INDEX_ARGS))
def test_layer_2_requires_int32_indices_as_torch_npu_does(entry):
    fn, kw, written = test_fuzz.ENTRIES[entry](np.random.default_rng(12))
    name = LAYER2_INDEX_ARGS[entry]
    kw[name] = kw[name].astype(np.int64)
    before = {n: kw[n].copy() for n in written}
    with pytest.raises(TypeError, match=rf"torch_npu\.[\w.]+: {name} must be int32"):
        fn(**kw)
    for n in written:
        assert np.array_equal(kw[n], before[n])


def paged_case():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 4, 16)).astype(np.float16)
    kc = rng.standard_normal((6, 8, 2, 16)).astype(np.float16)
    vc = rng.standard_normal((6, 8, 2, 16)).astype(np.float16)
    table = np.array([[4, 1, 0], [2, 5, 3]], np.int64)
    return dict(query=q, key_cache=kc, value_cache=vc, block_tables=table,
                context_lens=[20, 9], num_heads=4, num_kv_heads=2, qk_scale=0.25)


def test_layer_1_reads_int64_tables_and_rejects_values_outside_int32():
    kw = paged_case()
    want = attnref.paged_attention(**dict(kw, block_tables=kw["block_tables"].astype(np.int32)))
    got = attnref.paged_attention(**kw)
    assert got.tobytes() == want.tobytes()
    table = kw["block_tables"].copy()
    table[1, 2] = 2**32 + 3  # would wrap to the valid block 3 if it were cast
    out = np.full_like(want, 5)
    with pytest.raises(IndexError, match=r"block_tables\[1, 2\] holds 4294967299"):
        attnref.paged_attention(**dict(kw, block_tables=table, out=out))
    assert (out == 5).all()
    with pytest.raises(TypeError, match="block_tables must hold int32 or int64 indices, got uint"):
        attnref.paged_attention(**dict(kw, block_tables=table.astype(np.uint32)))
    with pytest.raises(ValueError, match="block_tables must have 2 dimensions, got 1"):
        attnref.paged_attention(**dict(kw, block_tables=table[0]))


def test_layer_1_int64_index_out_of_its_table_is_the_operator_s_index_error():
    kw = paged_case()
    table = kw["block_tables"].copy()
    table[0, 1] = 6  # fits int32, but the cache has 6 blocks: 0..5
    with pytest.raises(IndexError, match="block_tables"):
        attnref.paged_attention(**dict(kw, block_tables=table))
