// attnref_bench, family nsa/: CANN NsaCompressAttentionInfer at the seed's example shape
// (N 64, KV_N 4, Dqk 192, Dv 128, select block 64 × 16, compress block 32 stride 16, page block
// 128, fp16, one query token per batch):
//   nsa/compress_attention/B:<B>/cmpKV:<len>/threads:<T>
// GBps: compressed K and V bytes read per second (B · len · KV_N · (Dqk + Dv) · 2 bytes).

#include <benchmark/benchmark.h>

#include <algorithm>
#include <attnref/nsa/compress_attention.hpp>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace {

using attnref::half;
using attnref::Index;
using attnref::TensorRef;

void compress_attention(benchmark::State& state, Index batch, Index cmp, int threads) {
  constexpr Index N = 64, KVN = 4, Dqk = 192, Dv = 128, pbs = 128;
  attnref::NsaCompressAttentionInferParams p;
  p.num_heads = N;
  p.num_key_value_heads = KVN;
  p.select_block_size = 64;
  p.select_block_count = 16;
  p.compress_block_size = 32;
  p.compress_block_stride = 16;
  p.scale_value = 0.072;
  p.page_block_size = pbs;
  const Index per = (cmp + pbs - 1) / pbs, nb = batch * per;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<half> q(static_cast<size_t>(batch * N * Dqk)),
      k(static_cast<size_t>(nb * pbs * KVN * Dqk)), v(static_cast<size_t>(nb * pbs * KVN * Dv));
  for (half& x : q) x = half(nd(rng));
  for (half& x : k) x = half(nd(rng));
  for (half& x : v) x = half(nd(rng));
  std::vector<std::int32_t> table(static_cast<size_t>(nb));
  for (Index i = 0; i < nb; ++i) table[static_cast<size_t>(i)] = static_cast<std::int32_t>(i);
  std::shuffle(table.begin(), table.end(), rng);
  attnref::NsaCompressAttentionInferInputs<half> in{
      TensorRef<const half>(q.data(), {batch, N, Dqk}),
      TensorRef<const half>(k.data(), {nb, pbs, KVN * Dqk}),
      TensorRef<const half>(v.data(), {nb, pbs, KVN * Dv})};
  in.block_table = TensorRef<const std::int32_t>(table.data(), {batch, per});
  in.actual_cmp_kv_seq_len.assign(static_cast<size_t>(batch), cmp);
  std::vector<half> o(static_cast<size_t>(batch * N * Dv));
  std::vector<std::int32_t> topk(static_cast<size_t>(batch * KVN * 16));
  const attnref::NsaCompressAttentionInferOutputs<half> out{
      TensorRef<half>(o.data(), {batch, N, Dv}),
      TensorRef<std::int32_t>(topk.data(), {batch, KVN, 16})};
  for (auto _ : state) {
    attnref::nsa_compress_attention_infer(p, in, out, threads);
    benchmark::DoNotOptimize(o.data());
    benchmark::ClobberMemory();
  }
  state.counters["GBps"] =
      benchmark::Counter(double(batch) * cmp * KVN * (Dqk + Dv) * sizeof(half) * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
}

const bool registered = [] {
  for (int t : {1, 2})
    for (Index b : {1, 20}) {
      const std::string name = "nsa/compress_attention/B:" + std::to_string(b) +
                               "/cmpKV:4096/threads:" + std::to_string(t);
      benchmark::RegisterBenchmark(
          name.c_str(), [=](benchmark::State& st) { compress_attention(st, b, 4096, t); })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  return true;
}();

}  // namespace
