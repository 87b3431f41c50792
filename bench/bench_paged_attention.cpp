// attnref_bench, family paged_decode/: ATB PagedAttention at the foundation's shape (Hq=32,
// Hkv=8, D=128), block size 128, each sequence's blocks shuffled across the pool:
//   paged_decode/<f16|bf16|int8>/B:<B>/KV:<kv>/threads:<T>
// int8: the DEQUANT_FUSION mode (fp16 query, int8 caches, per-channel scales and offsets).
// Counter GBps: K and V bytes read per second. Compare with decode/ (contiguous) and
// decode_paged/ (the engine alone).

#include <benchmark/benchmark.h>

#include <algorithm>
#include <attnref/atb/paged_attention.hpp>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using attnref::Index;

constexpr Index kHeads = 32, kKvHeads = 8, kD = 128, kBlock = 128;

/// T: the query and output type; KV: the cache type (int8: dequant fusion).
template <class T, class KV = T>
void paged_decode(benchmark::State& state, Index batch, Index kv, int threads) {
  const Index per_seq = (kv + kBlock - 1) / kBlock, blocks = batch * per_seq;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  auto fill = [&](auto type, size_t n) {
    using E = decltype(type);
    std::vector<E> x(n);
    for (E& e : x) e = std::is_same_v<E, std::int8_t> ? E(nd(rng) * 40.0f) : E(nd(rng));
    return x;
  };
  const auto q = fill(T{}, static_cast<size_t>(batch * kHeads * kD));
  const auto kc = fill(KV{}, static_cast<size_t>(blocks * kBlock * kKvHeads * kD));
  const auto vc = fill(KV{}, kc.size());
  const std::vector<float> k_scale(static_cast<size_t>(kKvHeads * kD), 0.02f), v_scale(k_scale);
  const std::vector<std::int32_t> k_off(k_scale.size(), 3), v_off(k_scale.size(), -2);
  std::vector<std::int32_t> table(static_cast<size_t>(blocks));
  for (Index i = 0; i < blocks; ++i) table[static_cast<size_t>(i)] = static_cast<std::int32_t>(i);
  std::shuffle(table.begin(), table.end(), rng);
  std::vector<T> o(q.size());
  attnref::PagedAttentionParams p;
  p.num_heads = kHeads;
  p.num_kv_heads = kKvHeads;
  p.qk_scale = 0.088f;
  attnref::PagedAttentionInputs<T, KV> in;
  in.query = attnref::StridedView<const T, 3>(q.data(), {batch, kHeads, kD});
  in.key_cache = attnref::StridedView<const KV, 4>(kc.data(), {blocks, kBlock, kKvHeads, kD});
  in.value_cache = attnref::StridedView<const KV, 4>(vc.data(), {blocks, kBlock, kKvHeads, kD});
  if constexpr (std::is_same_v<KV, std::int8_t>) {
    p.quant_type = attnref::PagedAttentionParams::QuantType::DequantFusion;
    p.has_quant_offset = true;
    const Index ch = kKvHeads * kD;
    in.k_descale = attnref::StridedView<const float, 1>(k_scale.data(), {ch});
    in.v_descale = attnref::StridedView<const float, 1>(v_scale.data(), {ch});
    in.k_offset = attnref::StridedView<const std::int32_t, 1>(k_off.data(), {ch});
    in.v_offset = attnref::StridedView<const std::int32_t, 1>(v_off.data(), {ch});
  }
  in.block_tables = attnref::StridedView<const std::int32_t, 2>(table.data(), {batch, per_seq});
  in.context_lens.assign(static_cast<size_t>(batch), kv);
  const attnref::PagedAttentionOutputs<T> out{
      attnref::StridedView<T, 3>(o.data(), {batch, kHeads, kD})};
  for (auto _ : state) {
    attnref::paged_attention(p, in, out, {threads});
    benchmark::DoNotOptimize(o.data());
    benchmark::ClobberMemory();
  }
  const double bytes = 2.0 * batch * kv * kKvHeads * kD * sizeof(KV);
  state.counters["GBps"] =
      benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

const bool registered = [] {
  for (int t : {1, 2})
    for (Index b : {1, 8}) {
      const std::string tail = "/B:" + std::to_string(b) + "/KV:4096/threads:" + std::to_string(t);
      benchmark::RegisterBenchmark(
          ("paged_decode/f16" + tail).c_str(),
          [=](benchmark::State& st) { paged_decode<attnref::half>(st, b, 4096, t); })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(
          ("paged_decode/bf16" + tail).c_str(),
          [=](benchmark::State& st) { paged_decode<attnref::bfloat16>(st, b, 4096, t); })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(
          ("paged_decode/int8" + tail).c_str(),
          [=](benchmark::State& st) { paged_decode<attnref::half, std::int8_t>(st, b, 4096, t); })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  return true;
}();

}  // namespace
