// attnref_bench, family dsa/: DeepSeek-V3.2's sparse attention at its decode shapes (one query
// row, a bf16 paged cache of 128-token shuffled blocks, sparse_count 2048):
//   dsa/indexer/bf16/B:1/heads:64/KV:<kv>/threads:<T>       lightning_indexer: 64 heads of 128,
//                                                            one index-key head, the top 2048
//   dsa/sparse_attention/bf16/B:1/heads:128/KV:<kv>/threads:<T>
//                                                            sparse_flash_attention: 128 heads,
//                                                            512 + 64, over 2048 selected tokens
//   dsa/step/bf16/B:1/KV:<kv>/threads:<T>                    dsa_step: the two together
//   dsa/dense_mla/bf16/B:1/heads:128/KV:<kv>/threads:<T>     dense MLA decode over the same
//                                                            cache (FusedInferAttentionScore's
//                                                            MLA path), for the ratio
// Counters: GFLOPS (useful FLOPs: 2·heads·keys·(D_qk + D_v) for attention, 2·heads·keys·128 for
// the indexer), of_peak (GFLOPS over the FMA peak of as many threads, measured in this run) and
// GBps (the cache bytes a step must read: all index keys; the selected latent rows).

#include <benchmark/benchmark.h>

#include <algorithm>
#include <attnref/cann/fused_infer_attention_score.hpp>
#include <attnref/dsa/step.hpp>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "limits.hpp"

namespace {

using attnref::bfloat16;
using attnref::Index;
using attnref::StridedView;
using i32 = std::int32_t;

constexpr Index kC = 512, kR = 64, kDi = 128, kBs = 128, kCount = 2048;

std::vector<bfloat16> values(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<bfloat16> v(n);
  for (auto& x : v) x = bfloat16(nd(rng));
  return v;
}

/// One sequence of `kv` tokens: the latent cache, the index-key cache, their shared table.
struct Cache {
  Index kv, blocks;
  std::vector<bfloat16> c, kr, ik;
  std::vector<i32> table;
  explicit Cache(Index n) : kv(n), blocks((n + kBs - 1) / kBs) {
    c = values(static_cast<size_t>(blocks * kBs * kC), 3);
    kr = values(static_cast<size_t>(blocks * kBs * kR), 4);
    ik = values(static_cast<size_t>(blocks * kBs * kDi), 5);
    table.resize(static_cast<size_t>(blocks));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937(6));
  }
  StridedView<const i32> bt() const { return {table.data(), {1, blocks}}; }
};

void counters(benchmark::State& st, double flops, double bytes, int threads) {
  const double peak = bench_limits::fma_peak_gflops(threads);
  st.counters["GFLOPS"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["of_peak"] =
      benchmark::Counter(flops * 1e-9 / peak, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["GBps"] =
      benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void indexer(benchmark::State& st, Index kv, int threads) {
  const Cache cache(kv);
  const auto q = values(64 * kDi, 1), w = values(64, 2);
  std::vector<i32> idx(kCount);
  attnref::LightningIndexerParams p;
  p.layout_key = "PA_BSND";
  attnref::LightningIndexerInputs<bfloat16> in;
  in.query = {q.data(), {1, 1, 64, kDi}};
  in.weights = {w.data(), {1, 1, 64}};
  in.key = {cache.ik.data(), {cache.blocks, kBs, 1, kDi}};
  in.block_table = cache.bt();
  in.actual_seq_lengths_key = {kv};
  for (auto _ : st) {
    attnref::lightning_indexer(p, in, {{idx.data(), {1, 1, 1, kCount}}, {}}, {threads});
    benchmark::DoNotOptimize(idx.data());
  }
  counters(st, 2.0 * 64 * kv * kDi, double(kv) * kDi * 2, threads);
}

/// 2048 distinct tokens of the cache, ascending (what the indexer would hand over).
std::vector<i32> chosen(Index kv) {
  std::vector<i32> all(static_cast<size_t>(kv));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), std::mt19937(7));
  all.resize(static_cast<size_t>(std::min(kv, kCount)));
  std::sort(all.begin(), all.end());
  all.resize(kCount, -1);
  return all;
}

void sparse_attention(benchmark::State& st, Index kv, int threads) {
  const Cache cache(kv);
  const auto q = values(128 * kC, 1), qr = values(128 * kR, 2);
  std::vector<bfloat16> o(q.size());
  const std::vector<i32> idx = chosen(kv);
  attnref::SparseFlashAttentionParams p;
  p.layout_kv = "PA_BSND", p.scale_value = 0.0417;
  attnref::SparseFlashAttentionInputs<bfloat16> in;
  in.query = {q.data(), {1, 1, 128, kC}};
  in.query_rope = {qr.data(), {1, 1, 128, kR}};
  in.key = {cache.c.data(), {cache.blocks, kBs, 1, kC}};
  in.key_rope = {cache.kr.data(), {cache.blocks, kBs, 1, kR}};
  in.sparse_indices = {idx.data(), {1, 1, 1, kCount}};
  in.block_table = cache.bt();
  in.actual_seq_lengths_kv = {kv};
  for (auto _ : st) {
    attnref::sparse_flash_attention(p, in, {{o.data(), {1, 1, 128, kC}}}, {threads});
    benchmark::DoNotOptimize(o.data());
  }
  const double n = static_cast<double>(std::min(kv, kCount));
  counters(st, 2.0 * 128 * n * (kC + kR + kC), n * (kC + kR) * 2, threads);
}

void step(benchmark::State& st, Index kv, int threads) {
  const Cache cache(kv);
  const auto iq = values(64 * kDi, 1), w = values(64, 2);
  const auto q = values(128 * kC, 8), qr = values(128 * kR, 9);
  std::vector<bfloat16> o(q.size());
  attnref::DsaStepParams p;
  p.layout_query = "BSND", p.scale_value = 0.0417;
  attnref::DsaStepInputs<bfloat16> in;
  in.index_query = {iq.data(), {1, 1, 64, kDi}};
  in.weights = {w.data(), {1, 1, 64}};
  in.index_key = {cache.ik.data(), {cache.blocks, kBs, 1, kDi}};
  in.query = {q.data(), {1, 1, 128, kC}};
  in.query_rope = {qr.data(), {1, 1, 128, kR}};
  in.key = {cache.c.data(), {cache.blocks, kBs, 1, kC}};
  in.key_rope = {cache.kr.data(), {cache.blocks, kBs, 1, kR}};
  in.block_table = cache.bt();
  in.actual_seq_lengths_kv = {kv};
  for (auto _ : st) {
    attnref::dsa_step(p, in, {{o.data(), {1, 1, 128, kC}}, {}}, {threads});
    benchmark::DoNotOptimize(o.data());
  }
  const double n = static_cast<double>(std::min(kv, kCount));
  counters(st, 2.0 * 64 * kv * kDi + 2.0 * 128 * n * (kC + kR + kC),
           double(kv) * kDi * 2 + n * (kC + kR) * 2, threads);
}

void dense_mla(benchmark::State& st, Index kv, int threads) {
  const Cache cache(kv);
  const auto q = values(128 * kC, 1), qr = values(128 * kR, 2);
  std::vector<bfloat16> o(q.size());
  attnref::FusedInferAttentionScoreParams p;
  p.num_heads = 128, p.num_key_value_heads = 1, p.input_layout = "BSND";
  p.scale_value = 0.0417, p.block_size = kBs;
  attnref::FusedInferAttentionScoreInputs<bfloat16> in;
  in.query = StridedView<const bfloat16>(q.data(), {1, 1, 128, kC});
  in.query_rope = StridedView<const bfloat16>(qr.data(), {1, 1, 128, kR});
  in.key = {StridedView<const bfloat16>(cache.c.data(), {cache.blocks, kBs, kC})};
  in.value = in.key;
  in.key_rope = StridedView<const bfloat16>(cache.kr.data(), {cache.blocks, kBs, kR});
  in.block_table = cache.bt();
  in.actual_seq_lengths_kv = {kv};
  attnref::FusedInferAttentionScoreOutputs<bfloat16> out;
  out.attention_out = StridedView<bfloat16>(o.data(), {1, 1, 128, kC});
  for (auto _ : st) {
    attnref::fused_infer_attention_score(p, in, out, {threads});
    benchmark::DoNotOptimize(o.data());
  }
  counters(st, 2.0 * 128 * kv * (kC + kR + kC), double(kv) * (kC + kR) * 2, threads);
}

template <class F>
void reg(const std::string& name, F f) {
  benchmark::RegisterBenchmark(name.c_str(), f)->UseRealTime()->Unit(benchmark::kMillisecond);
}

const bool registered = [] {
  for (int t : {1, 2})
    for (Index kv : {8192, 32768, 131072}) {
      const std::string tail = "/KV:" + std::to_string(kv) + "/threads:" + std::to_string(t);
      reg("dsa/indexer/bf16/B:1/heads:64" + tail,
          [=](benchmark::State& st) { indexer(st, kv, t); });
      reg("dsa/sparse_attention/bf16/B:1/heads:128" + tail,
          [=](benchmark::State& st) { sparse_attention(st, kv, t); });
      reg("dsa/step/bf16/B:1" + tail, [=](benchmark::State& st) { step(st, kv, t); });
      reg("dsa/dense_mla/bf16/B:1/heads:128" + tail,
          [=](benchmark::State& st) { dense_mla(st, kv, t); });
    }
  return true;
}();

}  // namespace
