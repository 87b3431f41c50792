// attnref_bench, family self_attention/: ATB SelfAttention at the foundation's shapes
// (Hq=32, Hkv=8, D=128), to compare with prefill/ and decode/ (the operator layer must not copy
// K/V):
//   self_attention/pa_encoder/<f16|bf16>/<default|high_precision>/S:<S>/threads:<T>  causal
//   self_attention/encoder/f16/S:<S>/threads:<T>  cache write + causal prefill (high precision)
//   prefill/f32/alibi_compress/S:2048/threads:<T>  PA_ENCODER, ALIBI_COMPRESS tile + slopes, next
//   to self_attention/pa_encoder/f32/causal/S:2048 (CAUSAL_MASK, same shape)
//   self_attention/decoder/f16/B:<B>/KV:4096/threads:<T>  cache write + decode (high precision)
//   quant/self_attention/<offline|online>/S:<S>/threads:<T>  qkv full quantization: int8 q/k/v
//   (quantize_qkv of normal data), CAUSAL_MASK, fp16 output; compare with prefill/f32/causal;
//   GOPS (useful operations, counted as GFLOPS) and of_int8_peak (GOPS over limits/int8_peak of as
//   many threads, where the build has AVX-512 VNNI)

#include <benchmark/benchmark.h>

#include <attnref/atb/qkv_quant.hpp>
#include <attnref/atb/self_attention.hpp>
#include <attnref/mask/builders.hpp>
#include <random>
#include <string>
#include <vector>

#include "limits.hpp"

namespace {

using attnref::Index;
using P = attnref::SelfAttentionParams;

constexpr Index kHeads = 32, kKvHeads = 8, kD = 128;

// The foundation's shape: Hq=32, Hkv=8, qkScale ~ 1/sqrt(128).
P params(P::CalcType calc) {
  P p;
  p.num_heads = kHeads;
  p.num_kv_heads = kKvHeads;
  p.qk_scale = 0.088f;
  p.calc_type = calc;
  return p;
}

template <class T>
std::vector<T> random_data(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<T> v(n);
  for (auto& x : v) x = T(nd(rng));
  return v;
}

template <class T>
void pa_encoder(benchmark::State& state, Index s, bool high_precision, int threads) {
  const auto q = random_data<T>(static_cast<size_t>(s * kHeads * kD), 1);
  const auto k = random_data<T>(static_cast<size_t>(s * kKvHeads * kD), 2);
  const auto v = random_data<T>(k.size(), 3);
  std::vector<T> o(q.size());
  P p = params(P::CalcType::PaEncoder);
  p.mask_type = P::MaskType::CausalMask;
  p.kernel_type = high_precision ? P::KernelType::HighPrecision : P::KernelType::Default;
  attnref::SelfAttentionInputs<T> in;
  in.query = attnref::StridedView<const T, 3>(q.data(), {s, kHeads, kD});
  in.key = attnref::StridedView<const T, 3>(k.data(), {s, kKvHeads, kD});
  in.value = attnref::StridedView<const T, 3>(v.data(), {s, kKvHeads, kD});
  in.seq_len = {s};
  attnref::SelfAttentionOutputs<T> out;
  out.out = attnref::StridedView<T, 3>(o.data(), {s, kHeads, kD});
  for (auto _ : state) {
    attnref::self_attention(p, in, out, {threads});
    benchmark::DoNotOptimize(o.data());
  }
  const double pairs = static_cast<double>(s) * static_cast<double>(s + 1) / 2.0;
  state.counters["GFLOPS"] = benchmark::Counter(4.0 * kHeads * pairs * kD * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

// ALIBI_COMPRESS ([256, 256] tile + slopes) against the same shape's CAUSAL_MASK, f32 data.
void alibi_compress(benchmark::State& state, Index s, bool alibi, int threads) {
  using T = float;
  const auto q = random_data<T>(static_cast<size_t>(s * kHeads * kD), 1);
  const auto k = random_data<T>(static_cast<size_t>(s * kKvHeads * kD), 2);
  const auto v = random_data<T>(k.size(), 3);
  std::vector<T> o(q.size());
  const auto tile = attnref::alibi_compress_mask<T>();
  const auto slopes = attnref::alibi_compress_slopes(attnref::alibi_slopes(kHeads));
  P p = params(P::CalcType::PaEncoder);
  p.kernel_type = P::KernelType::HighPrecision;
  p.mask_type = alibi ? P::MaskType::AlibiCompress : P::MaskType::CausalMask;
  attnref::SelfAttentionInputs<T> in;
  in.query = attnref::StridedView<const T, 3>(q.data(), {s, kHeads, kD});
  in.key = attnref::StridedView<const T, 3>(k.data(), {s, kKvHeads, kD});
  in.value = attnref::StridedView<const T, 3>(v.data(), {s, kKvHeads, kD});
  in.seq_len = {s};
  if (alibi) {
    in.mask = attnref::StridedView<const T, 3>(tile.data(), {1, 256, 256});
    in.slopes = attnref::StridedView<const float, 1>(slopes.data(), {kHeads});
  }
  attnref::SelfAttentionOutputs<T> out;
  out.out = attnref::StridedView<T, 3>(o.data(), {s, kHeads, kD});
  for (auto _ : state) {
    attnref::self_attention(p, in, out, {threads});
    benchmark::DoNotOptimize(o.data());
  }
  const double pairs = static_cast<double>(s) * static_cast<double>(s + 1) / 2.0;
  state.counters["GFLOPS"] = benchmark::Counter(4.0 * kHeads * pairs * kD * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

template <class T>
void encoder(benchmark::State& state, Index s, int threads) {
  auto kc = random_data<T>(static_cast<size_t>(s * kKvHeads * kD), 4);
  auto vc = random_data<T>(kc.size(), 5);
  const auto q = random_data<T>(static_cast<size_t>(s * kHeads * kD), 1);
  const auto k = random_data<T>(kc.size(), 2);
  const auto v = random_data<T>(kc.size(), 3);
  std::vector<T> o(q.size());
  P p = params(P::CalcType::Encoder);
  p.mask_type = P::MaskType::CausalMask;
  p.kernel_type = P::KernelType::HighPrecision;
  attnref::SelfAttentionInputs<T> in;
  in.query = attnref::StridedView<const T, 3>(q.data(), {s, kHeads, kD});
  in.key = attnref::StridedView<const T, 3>(k.data(), {s, kKvHeads, kD});
  in.value = attnref::StridedView<const T, 3>(v.data(), {s, kKvHeads, kD});
  in.seq_len = {s};
  in.token_offset = {s};
  attnref::SelfAttentionOutputs<T> out;
  out.out = attnref::StridedView<T, 3>(o.data(), {s, kHeads, kD});
  out.key_cache = attnref::StridedView<T, 4>(kc.data(), {1, 1, s, kKvHeads * kD});
  out.value_cache = attnref::StridedView<T, 4>(vc.data(), {1, 1, s, kKvHeads * kD});
  for (auto _ : state) {
    attnref::self_attention(p, in, out, {threads});
    benchmark::DoNotOptimize(o.data());
  }
  const double pairs = static_cast<double>(s) * static_cast<double>(s + 1) / 2.0;
  state.counters["GFLOPS"] = benchmark::Counter(4.0 * kHeads * pairs * kD * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

template <class T>
void decoder(benchmark::State& state, Index batch, Index kv, int threads) {
  const Index max_seq = kv;
  auto kc = random_data<T>(static_cast<size_t>(batch * max_seq * kKvHeads * kD), 4);
  auto vc = random_data<T>(kc.size(), 5);
  const auto q = random_data<T>(static_cast<size_t>(batch * kHeads * kD), 6);
  const auto k = random_data<T>(static_cast<size_t>(batch * kKvHeads * kD), 7);
  const auto v = random_data<T>(k.size(), 8);
  std::vector<T> o(q.size());
  P p = params(P::CalcType::Decoder);
  p.kernel_type = P::KernelType::HighPrecision;
  attnref::SelfAttentionInputs<T> in;
  in.query = attnref::StridedView<const T, 3>(q.data(), {batch, kHeads, kD});
  in.key = attnref::StridedView<const T, 3>(k.data(), {batch, kKvHeads, kD});
  in.value = attnref::StridedView<const T, 3>(v.data(), {batch, kKvHeads, kD});
  in.seq_len.assign(static_cast<size_t>(batch), 1);
  in.token_offset.assign(static_cast<size_t>(batch), kv);
  attnref::SelfAttentionOutputs<T> out;
  out.out = attnref::StridedView<T, 3>(o.data(), {batch, kHeads, kD});
  out.key_cache = attnref::StridedView<T, 4>(kc.data(), {1, batch, max_seq, kKvHeads * kD});
  out.value_cache = attnref::StridedView<T, 4>(vc.data(), {1, batch, max_seq, kKvHeads * kD});
  for (auto _ : state) {
    attnref::self_attention(p, in, out, {threads});
    benchmark::DoNotOptimize(o.data());
  }
  const double bytes = 2.0 * batch * kv * kKvHeads * kD * sizeof(T);
  state.counters["GBps"] =
      benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// qkv full quantization (PA_ENCODER, causal), int8 q/k/v and fp16 output.
void quant(benchmark::State& state, Index s, bool online, int threads) {
  const auto qf = random_data<float>(static_cast<size_t>(s * kHeads * kD), 1);
  const auto kf = random_data<float>(static_cast<size_t>(s * kKvHeads * kD), 2);
  const auto vf = random_data<float>(kf.size(), 3);
  const attnref::QkvQuantized qz =
      attnref::quantize_qkv(attnref::StridedView<const float, 3>(qf.data(), {s, kHeads, kD}),
                            attnref::StridedView<const float, 3>(kf.data(), {s, kKvHeads, kD}),
                            attnref::StridedView<const float, 3>(vf.data(), {s, kKvHeads, kD}));
  std::vector<attnref::half> o(qf.size());
  P p = params(P::CalcType::PaEncoder);
  p.mask_type = P::MaskType::CausalMask;
  p.quant_type = online ? P::QuantType::QkvOnline : P::QuantType::QkvOffline;
  p.out_data_type = P::OutDataType::Float16;
  attnref::SelfAttentionQuantInputs<attnref::half> in;
  in.query = attnref::StridedView<const std::int8_t, 3>(qz.query.data(), {s, kHeads, kD});
  in.key = attnref::StridedView<const std::int8_t, 3>(qz.key.data(), {s, kKvHeads, kD});
  in.value = attnref::StridedView<const std::int8_t, 3>(qz.value.data(), {s, kKvHeads, kD});
  in.seq_len = {s};
  in.qk_descale = attnref::StridedView<const float, 1>(qz.qk_descale.data(), {kHeads});
  in.vpv_descale = attnref::StridedView<const float, 1>(qz.vpv_descale.data(), {kHeads});
  if (!online) in.p_scale = attnref::StridedView<const float, 1>(qz.p_scale.data(), {kHeads});
  attnref::SelfAttentionOutputs<attnref::half> out;
  out.out = attnref::StridedView<attnref::half, 3>(o.data(), {s, kHeads, kD});
  const double int8_peak = bench_limits::int8_peak_gops(threads);  // measured before timing
  for (auto _ : state) {
    attnref::self_attention(p, in, out, {threads});
    benchmark::DoNotOptimize(o.data());
  }
  const double pairs = static_cast<double>(s) * static_cast<double>(s + 1) / 2.0;
  bench_limits::int8_rate_counters(state, "GOPS", 4.0 * kHeads * pairs * kD, int8_peak);
}

const bool registered = [] {
  auto reg = [](const std::string& name, auto fn) {
    benchmark::RegisterBenchmark(name.c_str(), fn)->UseRealTime()->Unit(benchmark::kMillisecond);
  };
  for (int t : {1, 2}) {
    const std::string th = "/threads:" + std::to_string(t);
    for (bool hp : {false, true})
      for (Index s : {512, 2048})
        reg(std::string("self_attention/pa_encoder/f16/") + (hp ? "high_precision" : "default") +
                "/S:" + std::to_string(s) + th,
            [=](benchmark::State& st) { pa_encoder<attnref::half>(st, s, hp, t); });
    for (Index s : {512, 2048})
      reg("self_attention/pa_encoder/bf16/high_precision/S:" + std::to_string(s) + th,
          [=](benchmark::State& st) { pa_encoder<attnref::bfloat16>(st, s, true, t); });
    reg("prefill/f32/alibi_compress/S:2048" + th,
        [=](benchmark::State& st) { alibi_compress(st, 2048, true, t); });
    reg("self_attention/pa_encoder/f32/causal/S:2048" + th,
        [=](benchmark::State& st) { alibi_compress(st, 2048, false, t); });
    for (Index s : {512, 2048})
      reg("self_attention/encoder/f16/S:" + std::to_string(s) + th,
          [=](benchmark::State& st) { encoder<attnref::half>(st, s, t); });
    for (Index b : {1, 8})
      reg("self_attention/decoder/f16/B:" + std::to_string(b) + "/KV:4096" + th,
          [=](benchmark::State& st) { decoder<attnref::half>(st, b, 4096, t); });
    for (bool online : {false, true})
      for (Index s : {512, 2048})
        reg(std::string("quant/self_attention/") + (online ? "online" : "offline") +
                "/S:" + std::to_string(s) + th,
            [=](benchmark::State& st) { quant(st, s, online, t); });
  }
  return true;
}();

}  // namespace
