// attnref_bench, families pfa/ and ifa/: CANN PromptFlashAttention and IncreFlashAttention at the
// foundation's shapes (Hq=32, Hkv=8, D=128, BSND):
//   pfa/<f16|bf16>/<dense|causal>/S:<S>/threads:<T>   dense: sparse_mode 0 without a mask;
//                                                     causal: sparse_mode 3 (2048² mask)
//   pfa/int8/<dense|causal>/S:<S>/threads:<T>         int8 q / k / v, fp16 output (deq_scale1,
//                                                     quant_scale1, deq_scale2 per tensor)
//   ifa/<f16|bf16|int8>/B:<B>/KV:<kv>/threads:<T>     contiguous KV; int8: antiquant per channel
//                                                     with offsets (fp16 query)
//   ifa_paged/f16/B:<B>/KV:<kv>/threads:<T>           128-token blocks, shuffled
//   fia_paged/<f16|int8>/B:<B>/KV:<kv>/threads:<T>    the same decode step through
//                                                     FusedInferAttentionScore (its incremental
//                                                     branch; int8: antiquant per channel)
//   fia_mla/bf16/B:<B>/heads:<H>/KV:<kv>/threads:<T>  DeepSeek-style MLA decode through FIA's
//                                                     rope inputs (512 + 64, one latent head,
//                                                     128-token shuffled blocks); compare with
//                                                     mla/decode (ATB's MLA, one 576-wide cache)
// Compare with prefill/ and decode/ (the engine alone). Counters as there: GFLOPS (useful
// FLOPs), GBps (K and V bytes read per second); pfa/int8 also of_int8_peak (its GFLOPS, int8
// operations there, over limits/int8_peak of as many threads, where the build has AVX-512 VNNI).

#include <benchmark/benchmark.h>

#include <algorithm>
#include <attnref/cann/fused_infer_attention_score.hpp>
#include <attnref/cann/incre_flash_attention.hpp>
#include <attnref/cann/prompt_flash_attention.hpp>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "limits.hpp"

namespace {

using attnref::Index;
using attnref::StridedView;

constexpr Index kHeads = 32, kKvHeads = 8, kD = 128;

template <class E>
std::vector<E> random_values(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<E> x(n);
  for (E& e : x) e = std::is_same_v<E, std::int8_t> ? E(nd(rng) * 40.0f) : E(nd(rng));
  return x;
}

/// T: q / k / v type (int8: the quantized path with fp16 output).
template <class T>
void pfa(benchmark::State& state, Index s, bool causal, int threads) {
  constexpr bool kInt8 = std::is_same_v<T, std::int8_t>;
  using TO = std::conditional_t<kInt8, attnref::half, T>;
  const auto q = random_values<T>(static_cast<size_t>(s * kHeads * kD), 1);
  const auto k = random_values<T>(static_cast<size_t>(s * kKvHeads * kD), 2);
  const auto v = random_values<T>(k.size(), 3);
  std::vector<TO> o(q.size());
  std::vector<std::uint8_t> mask;
  const float deq1 = 1.0f / 1600.0f, qs1 = 127.0f, deq2 = 1.0f / (127.0f * 40.0f);
  attnref::PromptFlashAttentionParams p;
  p.num_heads = kHeads;
  p.num_key_value_heads = kKvHeads;
  p.input_layout = "BSND";
  p.scale_value = 0.088;
  attnref::PromptFlashAttentionInputs<T> in{StridedView<const T>(q.data(), {1, s, kHeads, kD}),
                                            StridedView<const T>(k.data(), {1, s, kKvHeads, kD}),
                                            StridedView<const T>(v.data(), {1, s, kKvHeads, kD})};
  if (causal) {
    p.sparse_mode = 3;
    mask.assign(2048 * 2048, 0);
    for (Index i = 0; i < 2048; ++i)
      for (Index j = i + 1; j < 2048; ++j) mask[static_cast<size_t>(i * 2048 + j)] = 1;
    in.atten_mask = StridedView<const std::uint8_t>(mask.data(), {2048, 2048});
  }
  if (kInt8) {
    in.deq_scale1 = StridedView<const float>(&deq1, {1});
    in.quant_scale1 = StridedView<const float>(&qs1, {1});
    in.deq_scale2 = StridedView<const float>(&deq2, {1});
  }
  const attnref::PromptFlashAttentionOutputs<TO> out{StridedView<TO>(o.data(), {1, s, kHeads, kD})};
  const double int8_peak = kInt8 ? bench_limits::int8_peak_gops(threads) : 0.0;  // before timing
  for (auto _ : state) {
    attnref::prompt_flash_attention(p, in, out, {threads});
    benchmark::DoNotOptimize(o.data());
    benchmark::ClobberMemory();
  }
  const double pairs = causal ? static_cast<double>(s) * static_cast<double>(s + 1) / 2.0
                              : static_cast<double>(s) * static_cast<double>(s);
  bench_limits::int8_rate_counters(state, "GFLOPS", 4.0 * kHeads * pairs * kD, int8_peak);
}

/// T: query / output type; KV: cache type (int8: antiquant). block: 0 contiguous, else paged.
/// An IncreFlashAttention decode step (fused: the same step through FusedInferAttentionScore).
template <class T, class KV = T>
void ifa(benchmark::State& state, Index batch, Index kv, Index block, int threads,
         bool fused = false) {
  const auto q = random_values<T>(static_cast<size_t>(batch * kHeads * kD), 1);
  const Index rows = block ? (kv + block - 1) / block * block * batch : batch * kv;
  const auto k = random_values<KV>(static_cast<size_t>(rows * kKvHeads * kD), 2);
  const auto v = random_values<KV>(k.size(), 3);
  std::vector<T> o(q.size());
  attnref::IncreFlashAttentionParams p;
  p.num_heads = kHeads;
  p.num_key_value_heads = kKvHeads;
  p.input_layout = "BSND";
  p.scale_value = 0.088;
  attnref::IncreFlashAttentionInputs<T, KV> in;
  in.query = StridedView<const T>(q.data(), {batch, 1, kHeads, kD});
  std::vector<std::int32_t> table;
  if (block) {
    const Index per_seq = (kv + block - 1) / block, blocks = batch * per_seq;
    table.resize(static_cast<size_t>(blocks));
    for (Index i = 0; i < blocks; ++i) table[static_cast<size_t>(i)] = static_cast<std::int32_t>(i);
    std::shuffle(table.begin(), table.end(), std::mt19937(4));
    in.key = {StridedView<const KV>(k.data(), {blocks, block, kKvHeads * kD})};
    in.value = {StridedView<const KV>(v.data(), {blocks, block, kKvHeads * kD})};
    in.block_table = StridedView<const std::int32_t>(table.data(), {batch, per_seq});
    in.actual_seq_lengths = {kv};
    p.block_size = block;
  } else {
    in.key = {StridedView<const KV>(k.data(), {batch, kv, kKvHeads, kD})};
    in.value = {StridedView<const KV>(v.data(), {batch, kv, kKvHeads, kD})};
  }
  std::vector<T> scale, offset;
  if constexpr (std::is_same_v<KV, std::int8_t>) {
    scale.assign(static_cast<size_t>(2 * kKvHeads * kD), T(0.02f));
    offset.assign(scale.size(), T(1.0f));
    in.antiquant_scale = StridedView<const T>(scale.data(), {2, kKvHeads, kD});
    in.antiquant_offset = StridedView<const T>(offset.data(), {2, kKvHeads, kD});
  }
  const attnref::IncreFlashAttentionOutputs<T> out{
      StridedView<T>(o.data(), {batch, 1, kHeads, kD})};
  // FusedInferAttentionScore: the same call, its kv lengths in actual_seq_lengths_kv.
  attnref::FusedInferAttentionScoreParams fp;
  fp.num_heads = p.num_heads;
  fp.num_key_value_heads = p.num_key_value_heads;
  fp.input_layout = p.input_layout;
  fp.scale_value = p.scale_value;
  fp.block_size = p.block_size;
  attnref::FusedInferAttentionScoreInputs<T, KV> fin;
  fin.query = in.query;
  fin.key = in.key;
  fin.value = in.value;
  fin.block_table = in.block_table;
  fin.actual_seq_lengths_kv = in.actual_seq_lengths;
  fin.antiquant_scale = in.antiquant_scale;
  fin.antiquant_offset = in.antiquant_offset;
  const attnref::FusedInferAttentionScoreOutputs<T> fout{out.attention_out};
  for (auto _ : state) {
    if (fused)
      attnref::fused_infer_attention_score(fp, fin, fout, {threads});
    else
      attnref::incre_flash_attention(p, in, out, {threads});
    benchmark::DoNotOptimize(o.data());
    benchmark::ClobberMemory();
  }
  const double bytes = 2.0 * batch * kv * kKvHeads * kD * sizeof(KV);
  state.counters["GBps"] =
      benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

/// Times an MLA decode call of FusedInferAttentionScore into `o` ([batch, 1, heads, 512]):
/// GFLOPS of the two products (512 + 64 wide, then 512), GBps of `bytes` cache bytes per call.
template <class In>
void time_mla(benchmark::State& state, const attnref::FusedInferAttentionScoreParams& p,
              const In& in, std::vector<attnref::bfloat16>& o, Index batch, Index heads, Index kv,
              int threads, double bytes) {
  const attnref::FusedInferAttentionScoreOutputs<attnref::bfloat16> out{
      StridedView<attnref::bfloat16>(o.data(), {batch, 1, heads, 512})};
  for (auto _ : state) {
    attnref::fused_infer_attention_score(p, in, out, {threads});
    benchmark::DoNotOptimize(o.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOPS"] =
      benchmark::Counter(2.0 * batch * heads * kv * (512.0 + 64 + 512) * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GBps"] =
      benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

/// DeepSeek-style MLA decode through FusedInferAttentionScore's rope inputs: one query token per
/// sequence, `heads` query heads on one latent head, q 512 + rope 64, a bf16 paged latent cache
/// (key = value [blocks, 128, 512], key_rope [blocks, 128, 64]) handed out shuffled.
void fia_mla(benchmark::State& state, Index batch, Index heads, Index kv, int threads) {
  using attnref::bfloat16;
  const Index C = 512, R = 64, bs = 128, per_seq = (kv + bs - 1) / bs, blocks = batch * per_seq;
  const auto q = random_values<bfloat16>(static_cast<size_t>(batch * heads * C), 1);
  const auto qr = random_values<bfloat16>(static_cast<size_t>(batch * heads * R), 2);
  const auto c = random_values<bfloat16>(static_cast<size_t>(blocks * bs * C), 3);
  const auto kr = random_values<bfloat16>(static_cast<size_t>(blocks * bs * R), 4);
  std::vector<bfloat16> o(q.size());
  std::vector<std::int32_t> table(static_cast<size_t>(blocks));
  for (Index i = 0; i < blocks; ++i) table[static_cast<size_t>(i)] = static_cast<std::int32_t>(i);
  std::shuffle(table.begin(), table.end(), std::mt19937(5));
  attnref::FusedInferAttentionScoreParams p;
  p.num_heads = heads;
  p.num_key_value_heads = 1;
  p.input_layout = "BSND";
  p.scale_value = 0.0417;  // DeepSeek-V3: 1 / sqrt(192) times its YaRN factor
  p.block_size = bs;
  attnref::FusedInferAttentionScoreInputs<bfloat16> in;
  in.query = StridedView<const bfloat16>(q.data(), {batch, 1, heads, C});
  in.query_rope = StridedView<const bfloat16>(qr.data(), {batch, 1, heads, R});
  in.key = {StridedView<const bfloat16>(c.data(), {blocks, bs, C})};
  in.value = in.key;
  in.key_rope = StridedView<const bfloat16>(kr.data(), {blocks, bs, R});
  in.block_table = StridedView<const std::int32_t>(table.data(), {batch, per_seq});
  in.actual_seq_lengths_kv.assign(static_cast<size_t>(batch), kv);
  time_mla(state, p, in, o, batch, heads, kv, threads, double(batch * kv) * (C + R) * 2);
}

template <class F>
void reg(const std::string& name, F f) {
  benchmark::RegisterBenchmark(name.c_str(), f)->UseRealTime()->Unit(benchmark::kMillisecond);
}

const bool registered = [] {
  for (int t : {1, 2}) {
    const std::string th = "/threads:" + std::to_string(t);
    for (bool causal : {false, true}) {
      const std::string c = causal ? "/causal" : "/dense";
      reg("pfa/f16" + c + "/S:2048" + th,
          [=](benchmark::State& st) { pfa<attnref::half>(st, 2048, causal, t); });
      reg("pfa/bf16" + c + "/S:2048" + th,
          [=](benchmark::State& st) { pfa<attnref::bfloat16>(st, 2048, causal, t); });
      reg("pfa/int8" + c + "/S:2048" + th,
          [=](benchmark::State& st) { pfa<std::int8_t>(st, 2048, causal, t); });
    }
    for (Index b : {1, 8}) {
      const std::string tail = "/B:" + std::to_string(b) + "/KV:4096" + th;
      reg("ifa/f16" + tail, [=](benchmark::State& st) { ifa<attnref::half>(st, b, 4096, 0, t); });
      reg("ifa/bf16" + tail,
          [=](benchmark::State& st) { ifa<attnref::bfloat16>(st, b, 4096, 0, t); });
      reg("ifa/int8" + tail,
          [=](benchmark::State& st) { ifa<attnref::half, std::int8_t>(st, b, 4096, 0, t); });
      reg("ifa_paged/f16" + tail,
          [=](benchmark::State& st) { ifa<attnref::half>(st, b, 4096, 128, t); });
      reg("fia_paged/f16" + tail,
          [=](benchmark::State& st) { ifa<attnref::half>(st, b, 4096, 128, t, true); });
      reg("fia_paged/int8" + tail, [=](benchmark::State& st) {
        ifa<attnref::half, std::int8_t>(st, b, 4096, 128, t, true);
      });
    }
    for (Index h : {16, 128})
      reg("fia_mla/bf16/B:1/heads:" + std::to_string(h) + "/KV:4096" + th,
          [=](benchmark::State& st) { fia_mla(st, 1, h, 4096, t); });
    reg("fia_mla/bf16/B:8/heads:16/KV:4096" + th,
        [=](benchmark::State& st) { fia_mla(st, 8, 16, 4096, t); });
  }
  return true;
}();

}  // namespace
