// attnref_bench: prefill and decode throughput of the attention engine, next to the naive
// reference. Names are stable (other families add their own):
//   prefill/<kv dtype>/<dense|causal>/S:<S>/threads:<T>   B=1, Hq=32, Hkv=8, D=128
//   prefill/f32/swa:<W>/S:2048/threads:<T>                 causal sliding window of W keys
//   decode/<kv dtype>/B:<B>/KV:<kv>/threads:<T>           same heads, one query token
//   decode_paged/<kv dtype>/B:<B>/KV:<kv>/threads:<T>     the same over a block pool (block size
//                                                          128, shuffled block table): the engine
//                                                          path of PagedAttention
//   decode_bnsd/<kv dtype>/B:<B>/KV:<kv>/threads:<T>      decode over a head-major cache
//                                                          [B, Hkv, S, D] (ONNX Runtime, PyTorch
//                                                          SDPA, ATB's BNSD PagedAttention)
//   decode_g8/<kv dtype>/B:<B>/KV:<kv>/threads:<T>        decode with Hkv=4: 8 query heads per
//                                                          kv head (the score kernel's two-key
//                                                          step on AVX-512)
//   reference/<dense|causal>/S:<S>                          naive double loops, small sizes
// Counters: GFLOPS = useful FLOPs per second (4*B*Hq*Sq*Skv*D dense; causal counts unmasked pairs
// only) and of_peak = GFLOPS / the fp32 FMA peak of as many threads; decode also GBps = K and V
// bytes read per second and of_bw = GBps / the read bandwidth of a working set of that size
// (bench/limits.hpp, measured in the same run).

#include <benchmark/benchmark.h>

#include <algorithm>
#include <attnref/attnref.hpp>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "limits.hpp"
#include "reference/naive_attention.hpp"

namespace {

using attnref::Index;

constexpr Index kHeads = 32, kKvHeads = 8, kHeadSize = 128;

template <class T>
std::vector<T> random_vector(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<T> v(n);
  for (auto& x : v) x = T(nd(rng));
  return v;
}

// K and V bytes read per second, and that as a fraction of the machine's read bandwidth of the
// same working set with as many threads.
void bandwidth_counters(benchmark::State& state, double bytes, int threads) {
  state.counters["GBps"] =
      benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  const double limit = bench_limits::read_gbps(static_cast<std::size_t>(bytes), threads);
  state.counters["of_bw"] =
      benchmark::Counter(bytes * 1e-9 / limit, benchmark::Counter::kIsIterationInvariantRate);
}

// q and o in T, K and V in TKV (the f32-query / fp16-cache case of a CPU server: TKV = half).
template <class T, class TKV = T>
void run(benchmark::State& state, Index batch, Index sq, Index skv, bool causal, int threads,
         Index window = 0, bool head_major = false, Index kv_heads = kKvHeads) {
  const auto q = random_vector<T>(static_cast<size_t>(batch * sq * kHeads * kHeadSize), 1);
  const auto k = random_vector<TKV>(static_cast<size_t>(batch * skv * kv_heads * kHeadSize), 2);
  const auto v = random_vector<TKV>(static_cast<size_t>(batch * skv * kv_heads * kHeadSize), 3);
  std::vector<T> o(q.size());
  const auto kv_view = [&](const TKV* x) {
    return head_major ? attnref::bnsd_view(x, batch, kv_heads, skv, kHeadSize)
                      : attnref::bsnd_view(x, batch, skv, kv_heads, kHeadSize);
  };
  attnref::AttentionInputs<T, TKV> in{attnref::bsnd_view(q.data(), batch, sq, kHeads, kHeadSize),
                                      kv_view(k.data()), kv_view(v.data())};
  // The limits are measured once, before the first timed run that needs them.
  const double peak = bench_limits::fma_peak_gflops(threads);
  if (sq == 1)
    bench_limits::read_gbps(
        static_cast<std::size_t>(2.0 * batch * skv * kv_heads * kHeadSize * sizeof(TKV)), threads);
  attnref::AttentionOutputs<T> out{attnref::bsnd_view(o.data(), batch, sq, kHeads, kHeadSize)};
  attnref::AttentionParams p;
  p.scale = 1.0 / std::sqrt(static_cast<double>(kHeadSize));
  p.causal = causal ? attnref::CausalMode::BottomRight : attnref::CausalMode::None;
  p.window = window;
  for (auto _ : state) {
    attnref::attention(in, p, out, {threads});
    benchmark::DoNotOptimize(o.data());
    benchmark::ClobberMemory();
  }
  // Useful pairs: causal bottom-right, query i sees skv - sq + i + 1 keys (at most window).
  double pairs = static_cast<double>(sq) * static_cast<double>(skv);
  if (causal) {
    pairs = 0;
    for (Index i = 0; i < sq; ++i) {
      const Index seen = std::min(skv, skv - sq + i + 1);
      pairs += static_cast<double>(window > 0 ? std::min(seen, window) : seen);
    }
  }
  const double flops = 4.0 * batch * kHeads * pairs * kHeadSize;
  state.counters["GFLOPS"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["of_peak"] =
      benchmark::Counter(flops * 1e-9 / peak, benchmark::Counter::kIsIterationInvariantRate);
  if (sq == 1)
    bandwidth_counters(state, 2.0 * batch * skv * kv_heads * kHeadSize * sizeof(TKV), threads);
}

// Decode over a paged cache: K/V in a pool of blocks of 128 tokens, each sequence's blocks
// shuffled across the pool.
template <class T>
void run_paged(benchmark::State& state, Index batch, Index skv, int threads) {
  constexpr Index kBlock = 128;
  const Index per_seq = (skv + kBlock - 1) / kBlock, blocks = batch * per_seq;
  const auto q = random_vector<T>(static_cast<size_t>(batch * kHeads * kHeadSize), 1);
  const auto k = random_vector<T>(static_cast<size_t>(blocks * kBlock * kKvHeads * kHeadSize), 2);
  const auto v = random_vector<T>(k.size(), 3);
  std::vector<std::int32_t> ids(static_cast<size_t>(blocks));
  for (Index i = 0; i < blocks; ++i) ids[static_cast<size_t>(i)] = static_cast<std::int32_t>(i);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(7));
  std::vector<T> o(q.size());
  attnref::AttentionInputs<T> in{
      attnref::bsnd_view(q.data(), batch, 1, kHeads, kHeadSize),
      attnref::StridedView<const T, 4>(k.data(), {blocks, kBlock, kKvHeads, kHeadSize}),
      attnref::StridedView<const T, 4>(v.data(), {blocks, kBlock, kKvHeads, kHeadSize})};
  in.block_table = attnref::StridedView<const std::int32_t, 2>(ids.data(), {batch, per_seq});
  in.seq.kv.assign(static_cast<size_t>(batch), skv);
  attnref::AttentionOutputs<T> out{attnref::bsnd_view(o.data(), batch, 1, kHeads, kHeadSize)};
  attnref::AttentionParams p;
  p.scale = 1.0 / std::sqrt(static_cast<double>(kHeadSize));
  const double bytes = 2.0 * batch * skv * kKvHeads * kHeadSize * sizeof(T);
  bench_limits::read_gbps(static_cast<std::size_t>(bytes), threads);
  for (auto _ : state) {
    attnref::attention(in, p, out, {threads});
    benchmark::DoNotOptimize(o.data());
    benchmark::ClobberMemory();
  }
  bandwidth_counters(state, bytes, threads);
}

void reference(benchmark::State& state, Index s, bool causal) {
  ref::Problem pr;
  pr.num_heads = 4;
  pr.num_kv_heads = 2;
  pr.head_size = 64;
  pr.v_head_size = 64;
  pr.q_len = {static_cast<int>(s)};
  pr.kv_len = {static_cast<int>(s)};
  pr.scale = 0.125;
  pr.causal = causal ? ref::Causal::kBottomRight : ref::Causal::kNone;
  const auto q = random_vector<double>(static_cast<size_t>(s * 4 * 64), 1);
  const auto k = random_vector<double>(static_cast<size_t>(s * 2 * 64), 2);
  const auto v = random_vector<double>(static_cast<size_t>(s * 2 * 64), 3);
  for (auto _ : state) benchmark::DoNotOptimize(ref::attention(pr, {q}, {k}, {v}));
  double pairs = causal ? static_cast<double>(s) * static_cast<double>(s + 1) / 2.0
                        : static_cast<double>(s) * static_cast<double>(s);
  state.counters["GFLOPS"] = benchmark::Counter(4.0 * 4 * pairs * 64 * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

template <class T>
void register_dtype() {
  const std::string dt = attnref::dtype_name<T>();
  for (bool causal : {false, true})
    for (Index s : {512, 1024, 2048})
      for (int t : {1, 2}) {
        const std::string name = "prefill/" + dt + (causal ? "/causal" : "/dense") +
                                 "/S:" + std::to_string(s) + "/threads:" + std::to_string(t);
        benchmark::RegisterBenchmark(name.c_str(),
                                     [=](benchmark::State& st) { run<T>(st, 1, s, s, causal, t); })
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      }
  if (dt == "f32")
    for (Index w : {128, 512})
      for (int t : {1, 2}) {
        const std::string name =
            "prefill/" + dt + "/swa:" + std::to_string(w) + "/S:2048/threads:" + std::to_string(t);
        benchmark::RegisterBenchmark(
            name.c_str(), [=](benchmark::State& st) { run<T>(st, 1, 2048, 2048, true, t, w); })
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      }
  for (Index b : {1, 8})
    for (int t : {1, 2}) {
      const std::string name =
          "decode/" + dt + "/B:" + std::to_string(b) + "/KV:4096/threads:" + std::to_string(t);
      benchmark::RegisterBenchmark(name.c_str(),
                                   [=](benchmark::State& st) { run<T>(st, b, 1, 4096, false, t); })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
      const std::string bnsd =
          "decode_bnsd/" + dt + "/B:" + std::to_string(b) + "/KV:4096/threads:" + std::to_string(t);
      benchmark::RegisterBenchmark(
          bnsd.c_str(), [=](benchmark::State& st) { run<T>(st, b, 1, 4096, false, t, 0, true); })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
      const std::string g8 =
          "decode_g8/" + dt + "/B:" + std::to_string(b) + "/KV:4096/threads:" + std::to_string(t);
      benchmark::RegisterBenchmark(
          g8.c_str(), [=](benchmark::State& st) { run<T>(st, b, 1, 4096, false, t, 0, false, 4); })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
      if (dt == "f32") continue;
      const std::string paged = "decode_paged/" + dt + "/B:" + std::to_string(b) +
                                "/KV:4096/threads:" + std::to_string(t);
      benchmark::RegisterBenchmark(paged.c_str(),
                                   [=](benchmark::State& st) { run_paged<T>(st, b, 4096, t); })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
}

// f32 queries and outputs over an fp16 cache (what a CPU server keeps): prefill S 2048 and
// decode B 1 / 8, as `prefill|decode/f32q_f16kv/...`.
void register_mixed() {
  using attnref::half;
  for (int t : {1, 2}) {
    const std::string ts = "/threads:" + std::to_string(t);
    for (bool causal : {false, true})
      benchmark::RegisterBenchmark(
          (std::string("prefill/f32q_f16kv/") + (causal ? "causal" : "dense") + "/S:2048" + ts)
              .c_str(),
          [=](benchmark::State& st) { run<float, half>(st, 1, 2048, 2048, causal, t); })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    for (Index b : {1, 8})
      benchmark::RegisterBenchmark(
          ("decode/f32q_f16kv/B:" + std::to_string(b) + "/KV:4096" + ts).c_str(),
          [=](benchmark::State& st) { run<float, half>(st, b, 1, 4096, false, t); })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
  }
}

const bool registered = [] {
  register_dtype<float>();
  register_mixed();
  register_dtype<attnref::half>();
  register_dtype<attnref::bfloat16>();
  for (bool causal : {false, true})
    for (Index s : {64, 256}) {
      const std::string name =
          std::string("reference/") + (causal ? "causal" : "dense") + "/S:" + std::to_string(s);
      benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) {
        reference(st, s, causal);
      })->Unit(benchmark::kMillisecond);
    }
  return true;
}();

}  // namespace
