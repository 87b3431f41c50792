// A paged KV cache: ReshapeAndCache writes two prompts' K/V (fp16, packed tokens) into a pool
// of 16-token blocks handed out in a shuffled order (the slot mapping), then ATB PagedAttention
// decodes one query token per sequence through the shuffled block table. Check: the result
// equals attnref::attention on the same K/V stored contiguously, bit for bit.
#include <algorithm>
#include <attnref/attnref.hpp>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

using attnref::half;
using attnref::Index;
using attnref::StridedView;

int main() {
  constexpr Index Hq = 8, Hkv = 2, D = 64, bs = 16, pool = 8, max_blocks = 3;
  const std::vector<Index> len = {37, 20}, cu = {0, 37, 57};  // prompts of 3 and 2 blocks
  const Index B = 2, T = cu[B];
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  auto random_half = [&](Index n) {
    std::vector<half> x(static_cast<size_t>(n));
    for (half& e : x) e = half(nd(rng));
    return x;
  };
  const auto k = random_half(T * Hkv * D), v = random_half(T * Hkv * D),
             q = random_half(B * Hq * D);

  // Blocks handed out from a shuffled free list; token t of sequence b goes to slot
  // block * bs + t % bs. The pool starts as NaN: a slot read but never written would show.
  std::vector<std::int32_t> free_list(pool), table(B * max_blocks, -1), slots;
  std::iota(free_list.begin(), free_list.end(), 0);
  std::shuffle(free_list.begin(), free_list.end(), rng);
  Index next = 0;
  for (Index b = 0; b < B; ++b)
    for (Index t = 0; t < len[b]; ++t) {
      std::int32_t& blk = table[static_cast<size_t>(b * max_blocks + t / bs)];
      if (t % bs == 0) blk = free_list[static_cast<size_t>(next++)];
      slots.push_back(static_cast<std::int32_t>(blk * bs + t % bs));
    }
  std::vector<half> k_pool(pool * bs * Hkv * D, half(NAN)), v_pool(k_pool);
  const StridedView<half, 4> k_cache(k_pool.data(), {pool, bs, Hkv, D}),
      v_cache(v_pool.data(), {pool, bs, Hkv, D});
  attnref::ReshapeAndCacheInputs<half> rin;
  rin.key = StridedView<const half, 3>(k.data(), {T, Hkv, D});
  rin.value = StridedView<const half, 3>(v.data(), {T, Hkv, D});
  rin.slot_mapping = StridedView<const std::int32_t, 1>(slots.data(), {T});
  attnref::reshape_and_cache(rin, k_cache, v_cache);

  // PagedAttention decode: one query token per sequence over its context.
  attnref::PagedAttentionParams pa;
  pa.num_heads = Hq;
  pa.num_kv_heads = Hkv;
  pa.qk_scale = 0.125f;  // 1 / sqrt(64)
  attnref::PagedAttentionInputs<half> pin;
  pin.query = StridedView<const half, 3>(q.data(), {B, Hq, D});
  pin.key_cache = k_cache;
  pin.value_cache = v_cache;
  pin.block_tables = StridedView<const std::int32_t, 2>(table.data(), {B, max_blocks});
  pin.context_lens = len;
  std::vector<half> o(q.size());
  attnref::paged_attention(pa, pin, attnref::PagedAttentionOutputs<half>{{o.data(), {B, Hq, D}}});

  // The same keys stored contiguously (the packed token arrays, TND), through the engine.
  attnref::AttentionInputs<half> in{attnref::tnd_view<const half>(q.data(), B, Hq, D),
                                    attnref::tnd_view<const half>(k.data(), T, Hkv, D),
                                    attnref::tnd_view<const half>(v.data(), T, Hkv, D)};
  in.seq.q_cu = {0, 1, 2};
  in.seq.kv_cu = cu;
  attnref::AttentionParams params;
  params.scale = 0.125;
  std::vector<half> o2(q.size());
  attnref::attention(in, params,
                     attnref::AttentionOutputs<half>{attnref::tnd_view(o2.data(), B, Hq, D)});

  std::printf("ReshapeAndCache: %ld tokens into a pool of %ld blocks x %ld; block table:", long(T),
              long(pool), long(bs));
  for (Index b = 0; b < B; ++b) {
    std::printf(" seq %ld [", long(b));
    for (Index j = 0; j < max_blocks; ++j)
      std::printf("%s%d", j ? " " : "", table[b * max_blocks + j]);
    std::printf("]");
  }
  std::printf("\nPagedAttention decode (fp16, %ld q / %ld kv heads, D %ld), contexts %ld and %ld\n",
              long(Hq), long(Hkv), long(D), long(len[0]), long(len[1]));
  const bool same = std::memcmp(o.data(), o2.data(), o.size() * sizeof(half)) == 0;
  std::printf("  paged == contiguous attention bit for bit: %s\n", same ? "yes" : "NO");
  if (!same) {
    std::printf("FAILED: the paged result differs from attention on contiguous K/V\n");
    return 1;
  }
  std::printf("OK\n");
  return 0;
}
