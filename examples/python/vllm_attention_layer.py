"""One prefill step and one decode step of a vLLM-Ascend-style attention layer on CPU tensors.

The layer's NPU code is unchanged but for one line: `torch_npu` is attnref's (`import
attnref.torch_npu as torch_npu`). Prefill: the new keys and values go into the paged caches
(_npu_reshape_and_cache), then FusedInferAttentionScore runs over the caches (TND, sparse_mode
3); decode: one token per sequence, written, then PagedAttention. Both steps are checked against
scaled-dot-product attention in torch (torch.nn.functional's where it has it, else the formula).

    PYTHONPATH=build/default/python /usr/bin/python3 examples/python/vllm_attention_layer.py
"""

import math

import torch

import attnref.torch_npu as torch_npu

HEADS, KV_HEADS, HEAD_DIM, BLOCK, BLOCKS = 8, 2, 64, 128, 16
SCALE = 1.0 / math.sqrt(HEAD_DIM)


def sdpa(q, k, v):
    """Causal (bottom-right) attention of q [Sq, H, D] over k, v [Skv, Hkv, D], in float32."""
    q, k, v = (x.float().transpose(0, 1) for x in (q, k, v))
    k = k.repeat_interleave(HEADS // KV_HEADS, 0)
    v = v.repeat_interleave(HEADS // KV_HEADS, 0)
    sq, skv = q.shape[1], k.shape[1]
    visible = torch.ones(sq, skv, dtype=torch.bool).tril(skv - sq)
    f = getattr(torch.nn.functional, "scaled_dot_product_attention", None)
    if f is not None:
        return f(q, k, v, attn_mask=visible, scale=SCALE).transpose(0, 1)
    s = (q @ k.transpose(1, 2)) * SCALE
    return (s.masked_fill(~visible, -math.inf).softmax(-1) @ v).transpose(0, 1)


class AttentionLayer:
    """The attention part of a decoder layer, as vLLM-Ascend's backend drives the NPU."""

    def __init__(self, dtype):
        self.kv_cache = torch.zeros(2, BLOCKS, BLOCK, KV_HEADS, HEAD_DIM, dtype=dtype)
        # sparse_mode 3 (causal, bottom-right) takes the optimised 2048 x 2048 mask: 1 = masked.
        self.mask = torch.ones(2048, 2048, dtype=torch.bool).triu(1)

    def prefill(self, q, k, v, slots, block_table, q_lens, kv_lens):
        torch_npu._npu_reshape_and_cache(key=k, value=v, key_cache=self.kv_cache[0],
                                         value_cache=self.kv_cache[1], slot_indices=slots)
        out, _ = torch_npu.npu_fused_infer_attention_score(
            query=q, key=self.kv_cache[0].view(BLOCKS, BLOCK, -1),
            value=self.kv_cache[1].view(BLOCKS, BLOCK, -1), atten_mask=self.mask,
            block_table=block_table, input_layout="TND", block_size=BLOCK,
            actual_seq_lengths=torch.cumsum(q_lens, 0).tolist(),
            actual_seq_lengths_kv=kv_lens.tolist(),
            num_key_value_heads=KV_HEADS, num_heads=HEADS, scale=SCALE, sparse_mode=3)
        return out

    def decode(self, q, k, v, slots, block_table, kv_lens):
        torch_npu._npu_reshape_and_cache(k, v, self.kv_cache[0], self.kv_cache[1], slots)
        out = torch.empty_like(q)
        torch_npu._npu_paged_attention(query=q, key_cache=self.kv_cache[0],
                                       value_cache=self.kv_cache[1], num_kv_heads=KV_HEADS,
                                       num_heads=HEADS, scale_value=SCALE, block_table=block_table,
                                       context_lens=kv_lens, out=out)
        return out


def main():
    torch.manual_seed(0)
    dtype = torch.bfloat16
    layer = AttentionLayer(dtype)
    prompts = [37, 200]  # two requests, prefilled together (TND: tokens packed)
    block_table = torch.tensor([[3, 9], [5, 0]], dtype=torch.int32)  # a shuffled block pool
    slots = torch.cat([block_table[b, torch.arange(n) // BLOCK] * BLOCK + torch.arange(n) % BLOCK
                       for b, n in enumerate(prompts)]).int()
    t = sum(prompts)
    new = [torch.randn(t, h, HEAD_DIM).to(dtype) for h in (HEADS, KV_HEADS, KV_HEADS)]
    lens = torch.tensor(prompts, dtype=torch.int32)
    out = layer.prefill(*new, slots, block_table, lens, lens)
    worst, row = 0.0, 0
    for n in prompts:
        ref = sdpa(*(x[row:row + n] for x in new))
        worst = max(worst, (out[row:row + n].float() - ref).abs().max().item())
        row += n
    print(f"prefill: {t} tokens of {len(prompts)} requests, max |out - sdpa| = {worst:.2e}")
    assert worst < 0.05, worst

    # One decode step: each request's next token goes to slot `length`, then attends to all.
    q, k, v = (torch.randn(2, h, HEAD_DIM).to(dtype) for h in (HEADS, KV_HEADS, KV_HEADS))
    slots = torch.tensor([block_table[b, n // BLOCK] * BLOCK + n % BLOCK
                          for b, n in enumerate(prompts)], dtype=torch.int32)
    out = layer.decode(q, k, v, slots, block_table, lens + 1)
    worst, row = 0.0, 0
    for b, n in enumerate(prompts):
        keys = torch.cat([new[1][row:row + n], k[b:b + 1]])
        values = torch.cat([new[2][row:row + n], v[b:b + 1]])
        worst = max(worst, (out[b:b + 1].float() - sdpa(q[b:b + 1], keys, values)).abs().max().item())
        row += n
    print(f"decode: {len(prompts)} tokens over {prompts[0] + 1} and {prompts[1] + 1} keys, "
          f"max |out - sdpa| = {worst:.2e}")
    assert worst < 0.05, worst
    print("OK")


if __name__ == "__main__":
    main()
