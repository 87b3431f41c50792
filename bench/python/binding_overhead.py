"""What the Python layer adds to a call: attnref.torch_npu against the same kernel timed in C++.

    python3 bench/python/binding_overhead.py [--threads N] [--rounds R]

Needs an `attnref` built optimised (`pip install .`, or PYTHONPATH=<a CMake build>/python: the test
preset's module is built at -O0). Two cases, with the inputs of a serving stack:
  decode   _npu_paged_attention, a small decode: B 1, 8 / 2 heads, D 128, 256 keys, fp16 paged
           cache (the kernel takes microseconds, so what the binding adds shows);
  prefill  _npu_flash_attention, one sequence of 2048 tokens, 32 / 8 heads, D 128, fp16, causal.
For each: the kernel alone, timed in C++ on the converted arguments (`repeats`), and the whole
call from Python (torch_npu layer, NumPy and torch tensors), min over rounds of the mean of a batch
of calls. The goals (issue #25): under 10 us added on the decode, within 2 % on the prefill.
"""

import argparse
import platform
import time

import numpy as np

import attnref
import attnref.torch_npu as torch_npu
from attnref import _attnref, _npu_common


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def best_mean(f, calls, rounds):
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            f()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def decode_case(rng):
    b, h, hkv, d, bs, ctx = 1, 8, 2, 128, 128, 256
    per = ctx // bs
    q = rng.standard_normal((b, h, d)).astype(np.float16)
    kc = rng.standard_normal((b * per, bs, hkv, d)).astype(np.float16)
    vc = rng.standard_normal((b * per, bs, hkv, d)).astype(np.float16)
    table = rng.permutation(b * per).reshape(b, per).astype(np.int32)
    lens = np.full(b, ctx, np.int32)
    return q, kc, vc, table, lens, np.zeros_like(q)


def prefill_case(rng):
    s, h, hkv, d = 2048, 32, 8, 128
    q = rng.standard_normal((s, h, d)).astype(np.float16)
    k = rng.standard_normal((s, hkv, d)).astype(np.float16)
    v = rng.standard_normal((s, hkv, d)).astype(np.float16)
    mask = np.triu(np.full((s, s), -np.inf, np.float16), 1)
    return q, k, v, mask, np.array([s], np.int32), np.zeros_like(q)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    ex = attnref.ExecConfig(threads=args.threads)
    _npu_common.EXEC.threads = args.threads  # the torch_npu layer's threads (0: OpenMP's default)
    rng = np.random.default_rng(0)
    print(f"CPU: {cpu_model()}; attnref {attnref.__version__}, SIMD {attnref.simd_level().name}, "
          f"threads {args.threads}")
    print(f"{'case':<9}{'C++ kernel':>14}{'torch_npu (NumPy)':>20}{'added':>12}"
          f"{'torch_npu (torch)':>20}{'added':>12}")

    q, kc, vc, table, lens, out = decode_case(rng)
    p = attnref.PagedAttentionParams(num_heads=8, num_kv_heads=2, qk_scale=0.088)
    kw = dict(query=q, key_cache=kc, value_cache=vc, block_tables=table, context_lens=lens, out=out)
    calls = 2000
    cpp = min(_attnref._paged_attention(p, kw, ex, calls) for _ in range(args.rounds))
    py = best_mean(lambda: torch_npu._npu_paged_attention(q, kc, vc, 2, 8, 0.088, table, lens, out),
                   calls, args.rounds)
    row = [cpp, py]
    try:
        import torch
        t = [torch.from_numpy(x) for x in (q, kc, vc, table, lens, out)]
        row.append(best_mean(lambda: torch_npu._npu_paged_attention(t[0], t[1], t[2], 2, 8, 0.088,
                                                                    t[3], t[4], t[5]),
                             calls, args.rounds))
    except ImportError:
        row.append(float("nan"))
    print(f"{'decode':<9}{row[0] * 1e6:>11.1f} us{row[1] * 1e6:>17.1f} us{(row[1] - row[0]) * 1e6:>9.1f} us"
          f"{row[2] * 1e6:>17.1f} us{(row[2] - row[0]) * 1e6:>9.1f} us")

    q, k, v, mask, lens, out = prefill_case(rng)
    p = attnref.SelfAttentionParams(num_heads=32, num_kv_heads=8, qk_scale=0.088, calc_type=3,
                                    mask_type=1)
    kw = dict(query=q, key=k, value=v, mask=mask[None], seq_len=lens, out=out)
    calls, rounds = 1, max(3, args.rounds // 2)
    cpp = min(_attnref._self_attention(p, kw, ex, calls) for _ in range(rounds))
    py = best_mean(lambda: torch_npu._npu_flash_attention(q, k, v, mask, lens, 0.088, 32, 8, out),
                   calls, rounds)
    print(f"{'prefill':<9}{cpp * 1e3:>11.1f} ms{py * 1e3:>17.1f} ms{(py / cpp - 1) * 100:>10.1f} %")


if __name__ == "__main__":
    main()
