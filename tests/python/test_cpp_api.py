"""The Python layer against the C++ API, bit for bit, on the same inputs.

The C++ side is the test families' ``PythonGolden`` tests (tests/atb/python_golden_test.cpp,
tests/cann/python_golden_test.cpp): run with ATTNREF_GOLDEN_DIR set, they call the C++ API as a
C++ caller would and save their inputs and results as .npy files. Here the same inputs go
through ``attnref.torch_npu`` (layer 2) and ``attnref.<operator>`` (layer 1), and every result
must have the C++ result's bits. ctest sets ATTNREF_TEST_BIN_DIR (where the family executables
are); run alone, without it, these tests skip."""

import os
import subprocess

import numpy as np
import pytest

import attnref
import attnref.torch_npu as torch_npu

BIN = os.environ.get("ATTNREF_TEST_BIN_DIR")
pytestmark = pytest.mark.skipif(not BIN, reason="needs the C++ test executables: run by ctest "
                                "(ATTNREF_TEST_BIN_DIR)")


@pytest.fixture(scope="module")
def cpp(tmp_path_factory):
    out = tmp_path_factory.mktemp("golden")
    for family in ("attnref_atb_tests", "attnref_cann_tests"):
        run = subprocess.run([os.path.join(BIN, family), "--gtest_filter=PythonGolden.*"],
                             env=dict(os.environ, ATTNREF_GOLDEN_DIR=str(out)),
                             capture_output=True, text=True)
        assert run.returncode == 0 and "[  PASSED  ] 1 test" in run.stdout, run.stdout
    return lambda name: np.load(out / f"{name}.npy")


def same_bits(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
    assert a.tobytes() == b.tobytes(), np.flatnonzero(a.reshape(-1) != b.reshape(-1))[:8]


def test_reshape_and_cache(cpp):
    key, value, slots = cpp("rac_key"), cpp("rac_value"), cpp("rac_slot_mapping")
    kc, vc = cpp("rac_key_cache_before"), cpp("rac_value_cache_before")
    assert not np.array_equal(kc, cpp("rac_key_cache"))  # the C++ call wrote the cache
    k2, v2 = kc.copy(), vc.copy()
    torch_npu._npu_reshape_and_cache(key, value, k2, v2, slots)
    same_bits(k2, cpp("rac_key_cache")), same_bits(v2, cpp("rac_value_cache"))
    k1, v1 = kc.copy(), vc.copy()
    attnref.reshape_and_cache(key=key, value=value, key_cache=k1, value_cache=v1,
                              slot_mapping=slots)
    same_bits(k1, cpp("rac_key_cache")), same_bits(v1, cpp("rac_value_cache"))


def test_paged_attention(cpp):
    q, kc, vc = cpp("pa_query"), cpp("pa_key_cache"), cpp("pa_value_cache")
    table, lens = cpp("pa_block_tables"), cpp("pa_context_lens")
    out = np.zeros_like(q)
    torch_npu._npu_paged_attention(q, kc, vc, 2, 8, 0.0625, table, lens.astype(np.int32), out)
    same_bits(out, cpp("pa_out"))
    same_bits(attnref.paged_attention(query=q, key_cache=kc, value_cache=vc, block_tables=table,
                                      context_lens=lens, num_heads=8, num_kv_heads=2,
                                      qk_scale=0.0625), cpp("pa_out"))


def test_paged_attention_mla(cpp):
    q, kc = cpp("mla_query"), cpp("mla_key_cache")  # bf16 as uint16
    table, lens = cpp("mla_block_tables"), cpp("mla_context_lens")
    out = np.zeros((2, 16, 512), np.uint16)
    torch_npu._npu_paged_attention_mla(q, kc, 1, 16, 0.0625, table, lens.astype(np.int32), 512,
                                       out)
    same_bits(out, cpp("mla_out"))
    same_bits(attnref.paged_attention(query=q, key_cache=kc, block_tables=table,
                                      context_lens=lens, num_heads=16, num_kv_heads=1,
                                      qk_scale=0.0625, mla_v_head_size=512), cpp("mla_out"))


def test_flash_attention(cpp):
    q, k, v, mask = cpp("sa_query"), cpp("sa_key"), cpp("sa_value"), cpp("sa_mask")
    lens = cpp("sa_seq_len").astype(np.int32)
    out = np.zeros_like(q)
    torch_npu._npu_flash_attention(q, k, v, mask[0], lens, 0.125, 4, 2, out)
    same_bits(out, cpp("sa_out"))
    SA = attnref.SelfAttentionParams
    same_bits(attnref.self_attention(query=q, key=k, value=v, mask=mask, seq_len=lens,
                                     num_heads=4, num_kv_heads=2, qk_scale=0.125,
                                     calc_type=SA.CalcType.PaEncoder, mask_type=SA.MaskType.Norm),
              cpp("sa_out"))


def test_fused_infer_attention_score(cpp):
    q, k, v = cpp("fia_query"), cpp("fia_key"), cpp("fia_value")
    table, mask = cpp("fia_block_table"), cpp("fia_atten_mask")
    ql, kl = list(cpp("fia_actual_seq_lengths")), list(cpp("fia_actual_seq_lengths_kv"))
    out, lse = torch_npu.npu_fused_infer_attention_score(
        q, k, v, atten_mask=mask.astype(bool), block_table=table, actual_seq_lengths=ql,
        actual_seq_lengths_kv=kl, num_heads=4, num_key_value_heads=2, scale=0.125,
        input_layout="TND", block_size=128, sparse_mode=3, next_tokens=0, softmax_lse_flag=True)
    same_bits(out, cpp("fia_attention_out")), same_bits(lse, cpp("fia_softmax_lse"))
    out, lse = attnref.fused_infer_attention_score(
        query=q, key=k, value=v, atten_mask=mask, block_table=table, actual_seq_lengths=ql,
        actual_seq_lengths_kv=kl, num_heads=4, num_key_value_heads=2, scale_value=0.125,
        input_layout="TND", block_size=128, sparse_mode=3, next_tokens=0, softmax_lse_flag=True)
    same_bits(out, cpp("fia_attention_out")), same_bits(lse, cpp("fia_softmax_lse"))
