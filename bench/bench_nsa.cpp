// attnref_bench, family nsa/: Native Sparse Attention decode at the seed's example shape
// (N 64, KV_N 4, Dqk 192, Dv 128, select block 64 × 16, compress block 32 stride 16, page block
// 128, fp16, one query token per batch):
//   nsa/compress_attention/B:<B>/cmpKV:<len>/threads:<T>   CANN NsaCompressAttentionInfer
//     GBps: compressed K and V bytes read per second (B · len · KV_N · (Dqk + Dv) · 2 bytes)
//   nsa/select_attention/B:<B>/selKV:<len>/threads:<T>     CANN NsaSelectedAttentionInfer
//     over 16 random blocks of 64 raw tokens per kv head (the raw caches of the batches share
//     one pool of 512 pages); GBps: selected K and V bytes read per second
//   nsa/decode_step/B:<B>/selKV:<len>/threads:<T>          nsa_decode_step: the compressed
//     branch (cmpKV = (len - 32) / 16 + 1), the selected branch on its top-k, a 512-token
//     window and the gated sum
//   nsa/decode_loop/B:<B>/selKV:<len>/threads:<T>          one step of the decode loop: one raw
//     K / V row appended per batch, nsa_update_compressed_cache, nsa_decode_step. Each batch's
//     raw length cycles through len - 15 .. len (staggered by batch), so a batch completes a
//     compress block every 16 steps; cmp_tokens: compressed K and V tokens written per step
//   nsa/compress_update/B:<B>/threads:<T>                  nsa_update_compressed_cache alone
//     for a step in which every batch completes a block (raw length 65552): B compressed K and
//     V tokens; GBps: raw K and V bytes read per second (B · 32 · KV_N · (Dqk + Dv) · 2 bytes)

#include <benchmark/benchmark.h>

#include <algorithm>
#include <attnref/nsa/compress_attention.hpp>
#include <attnref/nsa/compress_with_cache.hpp>
#include <attnref/nsa/decode_step.hpp>
#include <attnref/nsa/select_attention.hpp>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

using attnref::half;
using attnref::Index;
using attnref::StridedView;

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
      StridedView<const half>(q.data(), {batch, N, Dqk}),
      StridedView<const half>(k.data(), {nb, pbs, KVN * Dqk}),
      StridedView<const half>(v.data(), {nb, pbs, KVN * Dv})};
  in.block_table = StridedView<const std::int32_t>(table.data(), {batch, per});
  in.actual_cmp_kv_seq_len.assign(static_cast<size_t>(batch), cmp);
  std::vector<half> o(static_cast<size_t>(batch * N * Dv));
  std::vector<std::int32_t> topk(static_cast<size_t>(batch * KVN * 16));
  const attnref::NsaCompressAttentionInferOutputs<half> out{
      StridedView<half>(o.data(), {batch, N, Dv}),
      StridedView<std::int32_t>(topk.data(), {batch, KVN, 16})};
  for (auto _ : state) {
    attnref::nsa_compress_attention_infer(p, in, out, {threads});
    benchmark::DoNotOptimize(o.data());
    benchmark::ClobberMemory();
  }
  state.counters["GBps"] =
      benchmark::Counter(double(batch) * cmp * KVN * (Dqk + Dv) * sizeof(half) * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
}

/// A pool of `pages` random pages [pages, 128, KV_N·D] and a table mapping every batch's
/// logical blocks to random pages of it.
struct RawCache {
  static constexpr Index N = 64, KVN = 4, Dqk = 192, Dv = 128, pbs = 128, pages = 512;
  std::vector<half> k, v;
  std::vector<std::int32_t> table;
  Index per = 0;
  RawCache(Index batch, Index len, std::mt19937& rng) {
    std::normal_distribution<float> nd;
    k.resize(static_cast<size_t>(pages * pbs * KVN * Dqk));
    v.resize(static_cast<size_t>(pages * pbs * KVN * Dv));
    for (half& x : k) x = half(nd(rng));
    for (half& x : v) x = half(nd(rng));
    per = (len + pbs - 1) / pbs;
    std::uniform_int_distribution<std::int32_t> pick(0, pages - 1);
    table.resize(static_cast<size_t>(batch * per));
    for (std::int32_t& t : table) t = pick(rng);
  }
};

void select_attention(benchmark::State& state, Index batch, Index len, int threads) {
  constexpr Index N = RawCache::N, KVN = RawCache::KVN, Dqk = RawCache::Dqk, Dv = RawCache::Dv;
  constexpr Index k = 16, ls = 64;
  std::mt19937 rng(2);
  RawCache c(batch, len, rng);
  std::normal_distribution<float> nd;
  std::vector<half> q(static_cast<size_t>(batch * N * Dqk)), o(static_cast<size_t>(batch * N * Dv));
  for (half& x : q) x = half(nd(rng));
  const Index n_sel = (len + ls - 1) / ls;
  std::vector<std::int32_t> topk;
  std::vector<std::int32_t> all(static_cast<size_t>(n_sel));
  for (Index i = 0; i < n_sel; ++i) all[static_cast<size_t>(i)] = static_cast<std::int32_t>(i);
  for (Index r = 0; r < batch * KVN; ++r) {
    std::shuffle(all.begin(), all.end(), rng);
    topk.insert(topk.end(), all.begin(), all.begin() + k);
  }
  attnref::NsaSelectedAttentionInferParams p;
  p.num_heads = N;
  p.num_key_value_heads = KVN;
  p.select_block_size = ls;
  p.select_block_count = k;
  p.scale_value = 0.072;
  p.layout = "TND";
  attnref::NsaSelectedAttentionInferInputs<half> in;
  in.query = StridedView<const half>(q.data(), {batch, N, Dqk});
  in.key = StridedView<const half>(c.k.data(), {RawCache::pages, RawCache::pbs, KVN * Dqk});
  in.value = StridedView<const half>(c.v.data(), {RawCache::pages, RawCache::pbs, KVN * Dv});
  in.topk_indices = StridedView<const std::int32_t>(topk.data(), {batch, KVN, k});
  in.block_table = StridedView<const std::int32_t>(c.table.data(), {batch, c.per});
  in.actual_sel_kv_seq_len.assign(static_cast<size_t>(batch), len);
  const attnref::NsaSelectedAttentionInferOutputs<half> out{
      StridedView<half>(o.data(), {batch, N, Dv})};
  for (auto _ : state) {
    attnref::nsa_selected_attention_infer(p, in, out, {threads});
    benchmark::DoNotOptimize(o.data());
    benchmark::ClobberMemory();
  }
  state.counters["GBps"] =
      benchmark::Counter(double(batch) * k * ls * KVN * (Dqk + Dv) * sizeof(half) * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
}

void decode_step(benchmark::State& state, Index batch, Index len, int threads) {
  constexpr Index N = RawCache::N, KVN = RawCache::KVN, Dqk = RawCache::Dqk, Dv = RawCache::Dv;
  constexpr Index k = 16, cpbs = 128;
  std::mt19937 rng(3);
  RawCache c(batch, len, rng);
  std::normal_distribution<float> nd;
  const Index cmp = attnref::nsa_compressed_count(len, 32, 16);
  const Index cper = (cmp + cpbs - 1) / cpbs, cnb = batch * cper;
  std::vector<half> q(static_cast<size_t>(batch * N * Dqk)),
      ck(static_cast<size_t>(cnb * cpbs * KVN * Dqk)),
      cv(static_cast<size_t>(cnb * cpbs * KVN * Dv)), o(static_cast<size_t>(batch * N * Dv));
  for (half& x : q) x = half(nd(rng));
  for (half& x : ck) x = half(nd(rng));
  for (half& x : cv) x = half(nd(rng));
  std::vector<std::int32_t> ctable(static_cast<size_t>(cnb));
  for (Index i = 0; i < cnb; ++i) ctable[static_cast<size_t>(i)] = static_cast<std::int32_t>(i);
  std::shuffle(ctable.begin(), ctable.end(), rng);
  std::vector<float> gates(static_cast<size_t>(batch * N * 3));
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (float& g : gates) g = u(rng);
  attnref::NsaDecodeParams p;
  p.num_heads = N;
  p.num_key_value_heads = KVN;
  p.select_block_count = k;
  p.window_size = 512;
  p.scale_value = 0.072;
  attnref::NsaDecodeInputs<half> in;
  in.query = StridedView<const half>(q.data(), {batch, N, Dqk});
  in.key = StridedView<const half>(c.k.data(), {RawCache::pages, RawCache::pbs, KVN * Dqk});
  in.value = StridedView<const half>(c.v.data(), {RawCache::pages, RawCache::pbs, KVN * Dv});
  in.block_table = StridedView<const std::int32_t>(c.table.data(), {batch, c.per});
  in.cmp_key = StridedView<const half>(ck.data(), {cnb, cpbs, KVN * Dqk});
  in.cmp_value = StridedView<const half>(cv.data(), {cnb, cpbs, KVN * Dv});
  in.cmp_block_table = StridedView<const std::int32_t>(ctable.data(), {batch, cper});
  in.gates = StridedView<const float>(gates.data(), {batch, N, 3});
  in.actual_sel_kv_seq_len.assign(static_cast<size_t>(batch), len);
  attnref::NsaDecodeOutputs<half> out;
  out.output = StridedView<half>(o.data(), {batch, N, Dv});
  for (auto _ : state) {
    attnref::nsa_decode_step(p, in, out, {threads});
    benchmark::DoNotOptimize(o.data());
    benchmark::ClobberMemory();
  }
}

/// RawCache as a decode loop keeps it, with the paged compressed caches of nsa_decode_step
/// (shuffled pages of 128, random as if compressed from a prompt, room for the compressed tokens
/// of `len` raw tokens), the compression weights and one raw K / V row to append.
struct LoopCache {
  static constexpr Index N = RawCache::N, KVN = RawCache::KVN, Dqk = RawCache::Dqk,
                         Dv = RawCache::Dv, pbs = RawCache::pbs, cpbs = 128;
  RawCache raw;
  Index cper = 0, cnb = 0;
  std::vector<half> ck, cv, wk, wv, k_row, v_row;
  std::vector<std::int32_t> ctable;
  attnref::NsaDecodeParams p;
  LoopCache(Index batch, Index len, std::mt19937& rng) : raw(batch, len, rng) {
    std::normal_distribution<float> nd;
    cper = (attnref::nsa_compressed_count(len, 32, 16) + cpbs - 1) / cpbs;
    cnb = batch * cper;
    ck.resize(static_cast<size_t>(cnb * cpbs * KVN * Dqk));
    cv.resize(static_cast<size_t>(cnb * cpbs * KVN * Dv));
    k_row.resize(static_cast<size_t>(KVN * Dqk));
    v_row.resize(static_cast<size_t>(KVN * Dv));
    for (auto* x : {&ck, &cv, &k_row, &v_row})
      for (half& e : *x) e = half(nd(rng));
    std::uniform_real_distribution<float> u(0.5f / 32, 1.5f / 32);
    wk.resize(static_cast<size_t>(32 * KVN));
    wv.resize(wk.size());
    for (half& e : wk) e = half(u(rng));
    for (half& e : wv) e = half(u(rng));
    ctable.resize(static_cast<size_t>(cnb));
    for (Index i = 0; i < cnb; ++i) ctable[static_cast<size_t>(i)] = static_cast<std::int32_t>(i);
    std::shuffle(ctable.begin(), ctable.end(), rng);
    p.num_heads = N;
    p.num_key_value_heads = KVN;
    p.select_block_count = 16;
    p.window_size = 512;
    p.scale_value = 0.072;
  }
  Index batch() const { return static_cast<Index>(ctable.size()) / cper; }
  /// Writes the new row as raw token t of batch b.
  void append(Index b, Index t) {
    const Index page = raw.table[static_cast<size_t>(b * raw.per + t / pbs)];
    const size_t row = static_cast<size_t>(page * pbs + t % pbs);
    std::memcpy(raw.k.data() + row * KVN * Dqk, k_row.data(), k_row.size() * sizeof(half));
    std::memcpy(raw.v.data() + row * KVN * Dv, v_row.data(), v_row.size() * sizeof(half));
  }
  /// The update's inputs after one new token per batch, raw lengths `sel`.
  attnref::NsaCacheUpdateInputs<half> update_inputs(const std::vector<std::int64_t>& sel) const {
    attnref::NsaCacheUpdateInputs<half> in;
    in.key = StridedView<const half>(raw.k.data(), {RawCache::pages, pbs, KVN * Dqk});
    in.value = StridedView<const half>(raw.v.data(), {RawCache::pages, pbs, KVN * Dv});
    in.block_table = StridedView<const std::int32_t>(raw.table.data(), {batch(), raw.per});
    in.key_weight = StridedView<const half>(wk.data(), {32, KVN});
    in.value_weight = StridedView<const half>(wv.data(), {32, KVN});
    in.cmp_block_table = StridedView<const std::int32_t>(ctable.data(), {batch(), cper});
    in.actual_sel_kv_seq_len = sel;
    return in;
  }
  attnref::NsaCacheUpdateOutputs<half> cmp_outputs() {
    return {StridedView<half>(ck.data(), {cnb, cpbs, KVN * Dqk}),
            StridedView<half>(cv.data(), {cnb, cpbs, KVN * Dv})};
  }
};

void decode_loop(benchmark::State& state, Index batch, Index len, int threads) {
  constexpr Index N = LoopCache::N, KVN = LoopCache::KVN, Dqk = LoopCache::Dqk;
  constexpr Index Dv = LoopCache::Dv, cpbs = LoopCache::cpbs;
  std::mt19937 rng(4);
  LoopCache c(batch, len, rng);
  std::normal_distribution<float> nd;
  std::vector<half> q(static_cast<size_t>(batch * N * Dqk)), o(static_cast<size_t>(batch * N * Dv));
  for (half& x : q) x = half(nd(rng));
  std::vector<float> gates(static_cast<size_t>(batch * N * 3));
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (float& g : gates) g = u(rng);
  const attnref::NsaCacheUpdateOutputs<half> cmp_out = c.cmp_outputs();
  attnref::NsaDecodeInputs<half> in;
  in.query = StridedView<const half>(q.data(), {batch, N, Dqk});
  in.key = StridedView<const half>(c.raw.k.data(), {RawCache::pages, RawCache::pbs, KVN * Dqk});
  in.value = StridedView<const half>(c.raw.v.data(), {RawCache::pages, RawCache::pbs, KVN * Dv});
  in.block_table = StridedView<const std::int32_t>(c.raw.table.data(), {batch, c.raw.per});
  in.cmp_key = StridedView<const half>(c.ck.data(), {c.cnb, cpbs, KVN * Dqk});
  in.cmp_value = StridedView<const half>(c.cv.data(), {c.cnb, cpbs, KVN * Dv});
  in.cmp_block_table = StridedView<const std::int32_t>(c.ctable.data(), {batch, c.cper});
  in.gates = StridedView<const float>(gates.data(), {batch, N, 3});
  attnref::NsaDecodeOutputs<half> out;
  out.output = StridedView<half>(o.data(), {batch, N, Dv});
  std::vector<std::int64_t> sel(static_cast<size_t>(batch));
  Index step = 0, written = 0;
  for (auto _ : state) {
    for (Index b = 0; b < batch; ++b) {  // raw length len - 15 + (step + b) % 16, newest row
      const Index s = len - 15 + (step + b) % 16;
      sel[static_cast<size_t>(b)] = s;
      c.append(b, s - 1);
      written += s >= 32 && (s - 32) % 16 == 0;
    }
    ++step;
    attnref::nsa_update_compressed_cache(c.p, c.update_inputs(sel), cmp_out, {threads});
    in.actual_sel_kv_seq_len = sel;
    attnref::nsa_decode_step(c.p, in, out, {threads});
    benchmark::DoNotOptimize(o.data());
    benchmark::ClobberMemory();
  }
  state.counters["cmp_tokens"] = benchmark::Counter(static_cast<double>(written) /
                                                    static_cast<double>(std::max<Index>(1, step)));
}

void compress_update(benchmark::State& state, Index batch, Index len, int threads) {
  constexpr Index KVN = LoopCache::KVN, Dqk = LoopCache::Dqk, Dv = LoopCache::Dv, l = 32;
  std::mt19937 rng(5);
  LoopCache c(batch, len, rng);
  for (Index b = 0; b < batch; ++b) c.append(b, len - 1);
  const std::vector<std::int64_t> sel(static_cast<size_t>(batch), len);
  const bool ends_block = len >= l && (len - l) % 16 == 0;  // 65552 = 32 + 16 * 4095
  const attnref::NsaCacheUpdateInputs<half> in = c.update_inputs(sel);
  const attnref::NsaCacheUpdateOutputs<half> out = c.cmp_outputs();
  for (auto _ : state) {
    attnref::nsa_update_compressed_cache(c.p, in, out, {threads});
    benchmark::DoNotOptimize(c.ck.data());
    benchmark::ClobberMemory();
  }
  const double writes = ends_block ? static_cast<double>(batch) : 0.0;
  state.counters["cmp_tokens"] = benchmark::Counter(writes);
  state.counters["GBps"] = benchmark::Counter(writes * l * KVN * (Dqk + Dv) * sizeof(half) * 1e-9,
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
  for (int t : {1, 2})
    for (Index b : {1, 20}) {
      const std::string tail =
          "/B:" + std::to_string(b) + "/selKV:65552/threads:" + std::to_string(t);
      benchmark::RegisterBenchmark(("nsa/select_attention" + tail).c_str(),
                                   [=](benchmark::State& st) { select_attention(st, b, 65552, t); })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("nsa/decode_step" + tail).c_str(),
                                   [=](benchmark::State& st) { decode_step(st, b, 65552, t); })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  for (int t : {1, 2}) {
    const std::string threads = "/threads:" + std::to_string(t);
    benchmark::RegisterBenchmark(("nsa/decode_loop/B:20/selKV:65552" + threads).c_str(),
                                 [=](benchmark::State& st) { decode_loop(st, 20, 65552, t); })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("nsa/compress_update/B:20" + threads).c_str(),
                                 [=](benchmark::State& st) { compress_update(st, 20, 65552, t); })
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }
  return true;
}();

}  // namespace
