// attnref_bench, family mla/: DeepSeek-V3 MLA at its real dimensions (hidden 7168, C 512, R 64,
// Q 1536, P 128):
//   mla/preprocess/tokens:<N>/threads:<T>      mla_preprocess, fp16, PER_TENSOR_QUANT_ASYMM,
//                                              KvCache, NZ int8 weights, 128 heads; GOPS = the
//                                              int8 multiply-adds of the two matmuls × 2 per
//                                              second (the int8 work dominates)
//   mla/decode/heads:<H>/KV:<kv>/threads:<T>   mla_decode (absorbed) of one token over a 576-wide
//                                              fp16 latent cache of kv tokens (128-token blocks,
//                                              shuffled); GFLOPS = 2·H·kv·(576 + 512) per second,
//                                              GBps = cache bytes read per second

#include <benchmark/benchmark.h>

#include <algorithm>
#include <attnref/mla/mla_attention.hpp>
#include <attnref/mla/mla_preprocess.hpp>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace {

using attnref::half;
using attnref::Index;
using attnref::StridedView;

template <class E>
std::vector<E> random_values(size_t n, unsigned seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<E> x(n);
  for (E& e : x) e = E(nd(rng) * scale);
  return x;
}

std::vector<std::int8_t> random_i8(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> ui(-128, 127);
  std::vector<std::int8_t> x(n);
  for (auto& e : x) e = static_cast<std::int8_t>(ui(rng));
  return x;
}

void preprocess(benchmark::State& state, Index tokens, int threads) {
  attnref::MlaPreprocessParams p;
  const attnref::MlaDims d = p.dims;
  const Index H = 128, H0 = d.hidden_size, C = d.kv_lora_rank, R = d.rope_dim, Q = d.q_lora_rank,
              P = d.nope_dim, W1 = C + R + Q, W2 = H * (P + R);
  const Index blocks = 64, bs = 128;
  auto input = random_values<half>(static_cast<size_t>(tokens * H0), 1, 1.0f);
  auto g0 = random_values<half>(static_cast<size_t>(H0), 2, 1.0f);
  auto b0 = random_values<half>(static_cast<size_t>(H0), 3, 0.1f);
  auto g1 = random_values<half>(static_cast<size_t>(Q), 4, 1.0f);
  auto b1 = random_values<half>(static_cast<size_t>(Q), 5, 0.1f);
  auto g2 = random_values<half>(static_cast<size_t>(C), 6, 1.0f);
  auto cs = random_values<half>(static_cast<size_t>(tokens * R), 7, 1.0f);
  auto sn = random_values<half>(static_cast<size_t>(tokens * R), 8, 1.0f);
  auto wuk = random_values<half>(static_cast<size_t>(H * P * C), 9, 0.05f);
  const auto s1 = attnref::nz_shape<std::int8_t>(1, W1, H0);
  const auto s2 = attnref::nz_shape<std::int8_t>(1, W2, Q);
  auto wdq = random_i8(static_cast<size_t>(s1[1] * s1[2] * s1[3]), 10);
  auto wuq = random_i8(static_cast<size_t>(s2[1] * s2[2] * s2[3]), 11);
  std::vector<float> ds0(static_cast<size_t>(W1), 2e-4f), ds1(static_cast<size_t>(W2), 2e-4f);
  std::vector<std::int32_t> bias0(static_cast<size_t>(W1), 1), bias1(static_cast<size_t>(W2), 1);
  const half qs(0.02f);
  const std::int8_t qo = 0;
  std::vector<std::int32_t> slots(static_cast<size_t>(tokens));
  for (Index t = 0; t < tokens; ++t)
    slots[static_cast<size_t>(t)] = static_cast<std::int32_t>(t * 3);
  attnref::MlaPreprocessInputs<half> in;
  in.input = {input.data(), {tokens, H0}};
  in.gamma0 = {g0.data(), {H0}};
  in.beta0 = {b0.data(), {H0}};
  in.quant_scale0 = {&qs, {1}};
  in.quant_offset0 = {&qo, {1}};
  in.wdqkv = {{wdq.data(), {s1[1], s1[2], s1[3]}}, W1, H0, attnref::WeightFormat::Nz};
  in.de_scale0 = {ds0.data(), {W1}};
  in.bias0 = {bias0.data(), {W1}};
  in.gamma1 = {g1.data(), {Q}};
  in.beta1 = {b1.data(), {Q}};
  in.quant_scale1 = {&qs, {1}};
  in.quant_offset1 = {&qo, {1}};
  in.wuq = {{wuq.data(), {s2[1], s2[2], s2[3]}}, W2, Q, attnref::WeightFormat::Nz};
  in.de_scale1 = {ds1.data(), {W2}};
  in.bias1 = {bias1.data(), {W2}};
  in.gamma2 = {g2.data(), {C}};
  in.cos = {cs.data(), {tokens, R}};
  in.sin = {sn.data(), {tokens, R}};
  in.wuk.tensor = {wuk.data(), {H, P, C}};
  in.slot_mapping = {slots.data(), {tokens}};
  std::vector<half> q_out(static_cast<size_t>(tokens * H * (C + R)));
  std::vector<half> cache(static_cast<size_t>(blocks * bs * (C + R)));
  attnref::MlaPreprocessOutputs<half> out;
  out.q_out = {q_out.data(), {tokens, H, C + R}};
  out.caches.kv_cache = {cache.data(), {blocks, bs, 1, C + R}};
  for (auto _ : state) {
    attnref::mla_preprocess(p, in, out, {threads});
    benchmark::DoNotOptimize(q_out.data());
    benchmark::ClobberMemory();
  }
  const double ops = 2.0 * static_cast<double>(tokens) * (double(W1) * H0 + double(W2) * Q);
  state.counters["GOPS"] =
      benchmark::Counter(ops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void decode(benchmark::State& state, Index heads, Index kv, int threads) {
  const Index C = 512, R = 64, W = C + R, bs = 128, nb = (kv + bs - 1) / bs;
  auto q = random_values<half>(static_cast<size_t>(heads * W), 1, 1.0f);
  auto cache = random_values<half>(static_cast<size_t>(nb * bs * W), 2, 1.0f);
  std::vector<std::int32_t> table(static_cast<size_t>(nb));
  for (Index i = 0; i < nb; ++i) table[static_cast<size_t>(i)] = static_cast<std::int32_t>(i);
  std::shuffle(table.begin(), table.end(), std::mt19937(3));
  std::vector<half> o(static_cast<size_t>(heads * C));
  attnref::MlaDecodeParams p;
  const attnref::MlaDecodeInputs<half> in{StridedView<const half>(q.data(), {1, heads, W}),
                                          StridedView<const half>(cache.data(), {nb, bs, 1, W}),
                                          StridedView<const std::int32_t>(table.data(), {1, nb}),
                                          {kv}};
  const StridedView<half> out(o.data(), {1, heads, C});
  for (auto _ : state) {
    attnref::mla_decode(p, in, {out}, {threads});
    benchmark::DoNotOptimize(o.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOPS"] = benchmark::Counter(2.0 * heads * kv * double(W + C) * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GBps"] = benchmark::Counter(double(kv) * W * sizeof(half) * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}

template <class F>
void reg(const std::string& name, F f) {
  benchmark::RegisterBenchmark(name.c_str(), f)->UseRealTime()->Unit(benchmark::kMillisecond);
}

const bool registered = [] {
  for (int t : {1, 2}) {
    const std::string th = "/threads:" + std::to_string(t);
    for (Index n : {1, 16, 64})
      reg("mla/preprocess/tokens:" + std::to_string(n) + th,
          [=](benchmark::State& st) { preprocess(st, n, t); });
    for (Index h : {16, 128})
      reg("mla/decode/heads:" + std::to_string(h) + "/KV:4096" + th,
          [=](benchmark::State& st) { decode(st, h, 4096, t); });
  }
  return true;
}();

}  // namespace
