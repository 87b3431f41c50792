// attnref demo: one Llama-style GQA attention layer end to end.
//
//   1. prefill: two sequences of different lengths, causal, q in f32, K/V stored as fp16 in a
//      KV cache [B, max_seq, kv_heads, head_size];
//   2. decode: several steps, each appending one token per sequence to the cache and attending
//      over the whole cache (split-KV path);
//   3. the same layer through ATB's SelfAttention operator (bf16, HIGH_PRECISION, CAUSAL_MASK):
//      ENCODER writes the prompts into a [layer, batch, maxSeq, kvHead * headSize] cache, then
//      DECODER steps append and attend;
//   4. a paged serving loop (fp16, smaller GQA shapes): a causal prefill of three prompts whose
//      K/V ReshapeAndCache writes into a paged cache of blocks handed out in a shuffled order,
//      then decode steps that append one token per sequence (taking a new block at each block
//      boundary) and run ATB's PagedAttention; its reference gathers K/V from the token arrays,
//      not from the cache, so the check covers the slot mapping and the block table too;
//   5. a DeepSeek-V3 MLA step (MlaPreprocess into a latent paged cache, absorbed decode);
//   6. a Native Sparse Attention decode loop: two prompts written into a paged raw K/V cache
//      and compressed by nsa_update_compressed_cache straight into paged compressed caches,
//      then 2 * d + 1 steps, each appending one raw token per sequence, updating the compressed
//      caches and running nsa_decode_step (compressed branch with top-k block selection,
//      selected branch, sliding window, gated sum), printing the blocks chosen at the first
//      and the last step;
//   7. one decode step of a paged serving loop through FusedInferAttentionScore with a shared
//      system prompt (fp16, 8 q heads / 2 kv heads): three sequences begin with the same
//      100-token prompt, whose full blocks are stored once in a paged cache and begin every
//      block table (the rest handed out shuffled); the step (Q_S 1, softmax_lse) is checked
//      against the reference, and the same step with the prompt as key_shared_prefix /
//      value_shared_prefix and the own tokens in a contiguous cache must equal it bit for bit;
// every output is checked against the independent naive reference (double loops) and the
// throughput of the engine is printed.

#include <algorithm>
#include <attnref/attnref.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "reference/mla_attention.hpp"
#include "reference/mla_preprocess.hpp"
#include "reference/naive_attention.hpp"
#include "reference/nsa.hpp"
#include "reference/nsa_compress.hpp"

namespace {

/// FNV-1a over the bits of every error worse_of sees: the distance of each output element from
/// its reference. Printed at the end, it tells two builds apart when any output bit differs.
std::uint64_t g_digest = 0xcbf29ce484222325ull;

/// max(m, e), except that a NaN (an output the reference does not produce) sticks.
double worse_of(double m, double e) {
  unsigned char bits[sizeof e];
  std::memcpy(bits, &e, sizeof e);
  for (unsigned char b : bits) g_digest = (g_digest ^ b) * 0x100000001b3ull;
  return std::isnan(m) || std::isnan(e) ? std::numeric_limits<double>::quiet_NaN() : std::max(m, e);
}

using attnref::half;
using attnref::Index;
using Clock = std::chrono::steady_clock;

constexpr Index kHeads = 32, kKvHeads = 8, kHeadSize = 128, kMaxSeq = 512;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// ATB SelfAttention ENCODER then DECODER on a bf16 cache, checked against the naive reference.
bool atb_self_attention_run(const std::vector<Index>& prompt, std::mt19937& rng) {
  using T = attnref::bfloat16;
  using P = attnref::SelfAttentionParams;
  const Index batch = static_cast<Index>(prompt.size());
  const int steps = 4;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<T> k_cache(static_cast<size_t>(batch * kMaxSeq * kKvHeads * kHeadSize));
  std::vector<T> v_cache(k_cache.size());
  ref::Seqs ref_k(batch), ref_v(batch);
  P p;
  p.num_heads = static_cast<int>(kHeads);
  p.num_kv_heads = static_cast<int>(kKvHeads);
  p.qk_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(kHeadSize)));
  p.kernel_type = P::KernelType::HighPrecision;
  p.mask_type = P::MaskType::CausalMask;
  bool ok = true;
  std::vector<Index> offset(static_cast<size_t>(batch), 0);
  for (int step = 0; step <= steps; ++step) {
    const bool encoder = step == 0;
    p.calc_type = encoder ? P::CalcType::Encoder : P::CalcType::Decoder;
    p.mask_type = encoder ? P::MaskType::CausalMask : P::MaskType::Undefined;
    std::vector<Index> seq_len;
    Index tokens = 0;
    for (Index b = 0; b < batch; ++b) {
      seq_len.push_back(encoder ? prompt[static_cast<size_t>(b)] : 1);
      tokens += seq_len.back();
      offset[static_cast<size_t>(b)] += seq_len.back();
    }
    auto random_bf16 = [&](Index n) {
      std::vector<T> x(static_cast<size_t>(n));
      for (auto& e : x) e = T(nd(rng));
      return x;
    };
    const auto q = random_bf16(tokens * kHeads * kHeadSize);
    const auto k = random_bf16(tokens * kKvHeads * kHeadSize);
    const auto v = random_bf16(tokens * kKvHeads * kHeadSize);
    std::vector<T> o(q.size());
    attnref::SelfAttentionInputs<T> in;
    in.query = attnref::StridedView<const T, 3>(q.data(), {tokens, kHeads, kHeadSize});
    in.key = attnref::StridedView<const T, 3>(k.data(), {tokens, kKvHeads, kHeadSize});
    in.value = attnref::StridedView<const T, 3>(v.data(), {tokens, kKvHeads, kHeadSize});
    in.seq_len = seq_len;
    in.token_offset = offset;
    attnref::SelfAttentionOutputs<T> out;
    out.out = attnref::StridedView<T, 3>(o.data(), {tokens, kHeads, kHeadSize});
    out.key_cache =
        attnref::StridedView<T, 4>(k_cache.data(), {1, batch, kMaxSeq, kKvHeads * kHeadSize});
    out.value_cache =
        attnref::StridedView<T, 4>(v_cache.data(), {1, batch, kMaxSeq, kKvHeads * kHeadSize});
    const auto t0 = Clock::now();
    attnref::self_attention(p, in, out);
    const double t = seconds_since(t0);

    // Reference: the cache as the operator must have written it, then causal attention.
    ref::Problem pr;
    pr.num_heads = static_cast<int>(kHeads);
    pr.num_kv_heads = static_cast<int>(kKvHeads);
    pr.head_size = static_cast<int>(kHeadSize);
    pr.v_head_size = static_cast<int>(kHeadSize);
    pr.scale = p.qk_scale;
    pr.causal = ref::Causal::kBottomRight;  // top-left within the prompt (q_len == kv_len), and
                                            // the decoder's single query sees every key
    ref::Seqs rq(batch);
    Index t_begin = 0;
    for (Index b = 0; b < batch; ++b) {
      const Index n = seq_len[static_cast<size_t>(b)];
      for (Index e = t_begin * kKvHeads * kHeadSize; e < (t_begin + n) * kKvHeads * kHeadSize;
           ++e) {
        ref_k[b].push_back(static_cast<float>(k[static_cast<size_t>(e)]));
        ref_v[b].push_back(static_cast<float>(v[static_cast<size_t>(e)]));
      }
      for (Index e = t_begin * kHeads * kHeadSize; e < (t_begin + n) * kHeads * kHeadSize; ++e)
        rq[b].push_back(static_cast<float>(q[static_cast<size_t>(e)]));
      pr.q_len.push_back(static_cast<int>(n));
      pr.kv_len.push_back(static_cast<int>(offset[static_cast<size_t>(b)]));
      t_begin += n;
    }
    const ref::Result want = ref::attention(pr, rq, ref_k, ref_v);
    double err = 0.0;
    t_begin = 0;
    for (Index b = 0; b < batch; ++b) {
      for (size_t i = 0; i < want.o[b].size(); ++i)
        err = worse_of(
            err, std::fabs(
                     want.o[b][i] -
                     static_cast<float>(o[static_cast<size_t>(t_begin * kHeads * kHeadSize) + i])));
      t_begin += seq_len[static_cast<size_t>(b)];
    }
    std::printf(
        "ATB SelfAttention %s (bf16, HIGH_PRECISION) kv lengths %ld, %ld: %.3f ms, max |err| "
        "%.2e\n",
        encoder ? "ENCODER" : "DECODER", static_cast<long>(offset[0]), static_cast<long>(offset[1]),
        t * 1e3, err);
    ok = ok && err < 2e-2;  // bf16 output rounding
  }
  return ok;
}

/// A paged serving loop with ATB's operators on fp16 data: prefill (the engine, causal, packed
/// prompts) + ReshapeAndCache into a paged cache whose blocks are handed out in a shuffled order,
/// then decode steps of ReshapeAndCache + PagedAttention. Every output is checked against the
/// naive reference on K/V gathered from the per-sequence token arrays (never from the cache).
bool paged_serving_run(std::mt19937& rng) {
  constexpr Index kQh = 8, kKvh = 2, kD = 64, kBs = 16, kPool = 16;
  constexpr int kSteps = 12;  // every sequence crosses a block boundary while decoding
  const std::vector<Index> prompt = {37, 90, 5};
  const Index batch = static_cast<Index>(prompt.size());
  const float qk_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(kD)));
  const double tol = 2.5e-3;  // fp16 output rounding: half an ulp is at most 1.95e-3 below 8
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto random_half = [&](Index n) {
    std::vector<half> x(static_cast<size_t>(n));
    for (auto& e : x) e = half(nd(rng));
    return x;
  };

  // The block pool (NaN until written: a read of a slot never written would show), the free
  // list in a shuffled order and the block table [batch, maxBlocksPerSeq], -1 padded.
  Index max_blocks = 0;
  for (Index p : prompt) max_blocks = std::max(max_blocks, (p + kSteps + kBs - 1) / kBs);
  const size_t pool_elems = static_cast<size_t>(kPool * kBs * kKvh * kD);
  std::vector<half> k_pool(pool_elems, half(std::numeric_limits<float>::quiet_NaN()));
  std::vector<half> v_pool(k_pool);
  const attnref::StridedView<half, 4> key_cache(k_pool.data(), {kPool, kBs, kKvh, kD});
  const attnref::StridedView<half, 4> value_cache(v_pool.data(), {kPool, kBs, kKvh, kD});
  std::vector<std::int32_t> free_blocks(static_cast<size_t>(kPool));
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), std::mt19937(7));
  size_t next_free = 0;
  std::vector<std::int32_t> table(static_cast<size_t>(batch * max_blocks), -1);
  const attnref::StridedView<const std::int32_t, 2> block_tables(table.data(), {batch, max_blocks});
  // The slot of token t of sequence b, taking a block from the pool at a block boundary.
  auto slot_for = [&](Index b, Index t) {
    std::int32_t& blk = table[static_cast<size_t>(b * max_blocks + t / kBs)];
    if (t % kBs == 0) blk = free_blocks.at(next_free++);
    return static_cast<std::int32_t>(blk * kBs + t % kBs);
  };
  auto write_cache = [&](const std::vector<half>& k, const std::vector<half>& v,
                         const std::vector<std::int32_t>& slots) {
    const Index n = static_cast<Index>(slots.size());
    attnref::ReshapeAndCacheInputs<half> rin;
    rin.key = attnref::StridedView<const half, 3>(k.data(), {n, kKvh, kD});
    rin.value = attnref::StridedView<const half, 3>(v.data(), {n, kKvh, kD});
    rin.slot_mapping = attnref::StridedView<const std::int32_t, 1>(slots.data(), {n});
    attnref::reshape_and_cache(rin, key_cache, value_cache);
  };

  // The token arrays of each sequence, [len][kvHead][D]: what the reference reads.
  std::vector<std::vector<half>> k_tok(static_cast<size_t>(batch)), v_tok(k_tok);
  auto reference = [&](const ref::Problem& problem, const ref::Seqs& q) {
    ref::Seqs rk(batch), rv(batch);
    for (Index b = 0; b < batch; ++b) {
      const size_t n = static_cast<size_t>(problem.kv_len[static_cast<size_t>(b)] * kKvh * kD);
      for (size_t e = 0; e < n; ++e) {
        rk[b].push_back(static_cast<float>(k_tok[static_cast<size_t>(b)][e]));
        rv[b].push_back(static_cast<float>(v_tok[static_cast<size_t>(b)][e]));
      }
    }
    return ref::attention(problem, q, rk, rv);
  };
  ref::Problem pr;
  pr.num_heads = static_cast<int>(kQh);
  pr.num_kv_heads = static_cast<int>(kKvh);
  pr.head_size = static_cast<int>(kD);
  pr.v_head_size = static_cast<int>(kD);
  pr.scale = qk_scale;
  pr.causal = ref::Causal::kBottomRight;

  // ---- prefill: packed (TND) prompts, causal, on the new K/V; ReshapeAndCache writes them ----
  std::vector<Index> cu = {0};
  for (Index p : prompt) cu.push_back(cu.back() + p);
  const Index total = cu.back();
  const auto q = random_half(total * kQh * kD);
  const auto k = random_half(total * kKvh * kD);
  const auto v = random_half(total * kKvh * kD);
  std::vector<half> o(q.size());
  std::vector<std::int32_t> slots;
  for (Index b = 0; b < batch; ++b) {
    for (Index t = 0; t < prompt[static_cast<size_t>(b)]; ++t) slots.push_back(slot_for(b, t));
    const auto first = static_cast<std::ptrdiff_t>(cu[static_cast<size_t>(b)] * kKvh * kD);
    const auto last = static_cast<std::ptrdiff_t>(cu[static_cast<size_t>(b) + 1] * kKvh * kD);
    k_tok[static_cast<size_t>(b)].assign(k.begin() + first, k.begin() + last);
    v_tok[static_cast<size_t>(b)].assign(v.begin() + first, v.begin() + last);
  }
  const size_t prefill_blocks = next_free;
  attnref::AttentionInputs<half> in{attnref::tnd_view<const half>(q.data(), total, kQh, kD),
                                    attnref::tnd_view<const half>(k.data(), total, kKvh, kD),
                                    attnref::tnd_view<const half>(v.data(), total, kKvh, kD)};
  in.seq.q_cu = cu;
  in.seq.kv_cu = cu;
  attnref::AttentionParams params;
  params.scale = qk_scale;
  params.causal = attnref::CausalMode::BottomRight;
  attnref::AttentionOutputs<half> out{attnref::tnd_view(o.data(), total, kQh, kD)};
  auto t0 = Clock::now();
  attnref::attention(in, params, out);
  write_cache(k, v, slots);
  const double t_prefill = seconds_since(t0);

  ref::Problem pp = pr;
  ref::Seqs rq(batch);
  for (Index b = 0; b < batch; ++b) {
    pp.q_len.push_back(static_cast<int>(prompt[static_cast<size_t>(b)]));
    pp.kv_len.push_back(static_cast<int>(prompt[static_cast<size_t>(b)]));
    for (Index e = cu[static_cast<size_t>(b)] * kQh * kD;
         e < cu[static_cast<size_t>(b) + 1] * kQh * kD; ++e)
      rq[b].push_back(static_cast<float>(q[static_cast<size_t>(e)]));
  }
  const ref::Result want = reference(pp, rq);
  double prefill_err = 0.0;
  for (Index b = 0; b < batch; ++b)
    for (size_t i = 0; i < want.o[b].size(); ++i)
      prefill_err = worse_of(
          prefill_err,
          std::fabs(want.o[b][i] -
                    static_cast<float>(
                        o[static_cast<size_t>(cu[static_cast<size_t>(b)] * kQh * kD) + i])));

  // ---- decode: per step one token per sequence, ReshapeAndCache + PagedAttention ----
  attnref::PagedAttentionParams pa;
  pa.num_heads = static_cast<int>(kQh);
  pa.num_kv_heads = static_cast<int>(kKvh);
  pa.qk_scale = qk_scale;
  std::vector<Index> len = prompt;
  double decode_err = 0.0, t_decode = 0.0;
  for (int step = 0; step < kSteps; ++step) {
    const auto qd = random_half(batch * kQh * kD);
    const auto kd = random_half(batch * kKvh * kD);
    const auto vd = random_half(batch * kKvh * kD);
    std::vector<half> od(qd.size());
    std::vector<std::int32_t> dslots;
    for (Index b = 0; b < batch; ++b) {
      dslots.push_back(slot_for(b, len[static_cast<size_t>(b)]++));
      const auto first = static_cast<std::ptrdiff_t>(b * kKvh * kD);
      const auto last = static_cast<std::ptrdiff_t>((b + 1) * kKvh * kD);
      k_tok[static_cast<size_t>(b)].insert(k_tok[static_cast<size_t>(b)].end(), kd.begin() + first,
                                           kd.begin() + last);
      v_tok[static_cast<size_t>(b)].insert(v_tok[static_cast<size_t>(b)].end(), vd.begin() + first,
                                           vd.begin() + last);
    }
    attnref::PagedAttentionInputs<half> pin;
    pin.query = attnref::StridedView<const half, 3>(qd.data(), {batch, kQh, kD});
    pin.key_cache = key_cache;
    pin.value_cache = value_cache;
    pin.block_tables = block_tables;
    pin.context_lens = len;
    attnref::PagedAttentionOutputs<half> pout;
    pout.out = attnref::StridedView<half, 3>(od.data(), {batch, kQh, kD});
    t0 = Clock::now();
    write_cache(kd, vd, dslots);
    attnref::paged_attention(pa, pin, pout);
    t_decode += seconds_since(t0);

    ref::Problem dp = pr;
    ref::Seqs dq(batch);
    for (Index b = 0; b < batch; ++b) {
      dp.q_len.push_back(1);
      dp.kv_len.push_back(static_cast<int>(len[static_cast<size_t>(b)]));
      for (Index e = b * kQh * kD; e < (b + 1) * kQh * kD; ++e)
        dq[b].push_back(static_cast<float>(qd[static_cast<size_t>(e)]));
    }
    const ref::Result dw = reference(dp, dq);
    for (Index b = 0; b < batch; ++b)
      for (size_t i = 0; i < dw.o[b].size(); ++i)
        decode_err = worse_of(
            decode_err,
            std::fabs(dw.o[b][i] - static_cast<float>(od[static_cast<size_t>(b * kQh * kD) + i])));
  }

  std::printf(
      "paged serving loop: %ld sequences (prompts %ld, %ld, %ld), %ld q heads / %ld kv heads, "
      "head size %ld, fp16, key/value caches [%ld, %ld, %ld, %ld] (blocks handed out shuffled)\n",
      static_cast<long>(batch), static_cast<long>(prompt[0]), static_cast<long>(prompt[1]),
      static_cast<long>(prompt[2]), static_cast<long>(kQh), static_cast<long>(kKvh),
      static_cast<long>(kD), static_cast<long>(kPool), static_cast<long>(kBs),
      static_cast<long>(kKvh), static_cast<long>(kD));
  std::printf(
      "paged prefill  q [T=%ld, %ld, %ld] (TND), causal, + ReshapeAndCache of %ld tokens: "
      "%.3f ms, max |err| %.2e\n",
      static_cast<long>(total), static_cast<long>(kQh), static_cast<long>(kD),
      static_cast<long>(total), t_prefill * 1e3, prefill_err);
  std::printf(
      "paged decode   %d steps of ReshapeAndCache + PagedAttention q [%ld, %ld, %ld], kv lengths "
      "%ld, %ld, %ld: %.0f tokens/s, max |err| %.2e\n",
      kSteps, static_cast<long>(batch), static_cast<long>(kQh), static_cast<long>(kD),
      static_cast<long>(len[0]), static_cast<long>(len[1]), static_cast<long>(len[2]),
      static_cast<double>(batch * kSteps) / t_decode, decode_err);
  std::printf(
      "paged blocks   %zu of %ld used (%zu after prefill); block_tables [%ld, %ld], sequence 0:",
      next_free, static_cast<long>(kPool), prefill_blocks, static_cast<long>(batch),
      static_cast<long>(max_blocks));
  for (Index j = 0; j < max_blocks; ++j)
    std::printf("%s%d", j == 0 ? " [" : ", ", block_tables(0, j));
  std::printf("]\n");
  return prefill_err < tol && decode_err < tol;  // false for NaN
}

/// DeepSeek-V3 MLA: MlaPreprocess of a prompt into the latent cache, then decode steps.
bool mla_run(std::mt19937& rng) {
  using attnref::StridedView;
  attnref::MlaPreprocessParams p;  // DeepSeek-V3 dims, PER_TENSOR_QUANT_ASYMM, KvCache
  p.epsilon = 1e-6f;
  const attnref::MlaDims d = p.dims;
  const Index H = 16, H0 = d.hidden_size, C = d.kv_lora_rank, R = d.rope_dim, Q = d.q_lora_rank,
              P = d.nope_dim, W1 = C + R + Q, W2 = H * (P + R), W = C + R;
  const Index prompt = 6, steps = 2, total = prompt + steps, bs = 16, blocks = 4;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> ui(-128, 127);
  // Weights and norm parameters, kept as halves and as the reference's floats.
  auto halves = [&](Index n, float scale, std::vector<float>& ref) {
    std::vector<half> v(static_cast<size_t>(n));
    ref.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) ref[i] = static_cast<float>(v[i] = half(nd(rng) * scale));
    return v;
  };
  ref::mla::ChainIn ci;
  auto g0 = halves(H0, 1.0f, ci.gamma0), b0 = halves(H0, 0.05f, ci.beta0);
  auto g1 = halves(Q, 1.0f, ci.gamma1), b1 = halves(Q, 0.05f, ci.beta1);
  auto g2 = halves(C, 1.0f, ci.gamma2);
  std::vector<float> wuk_ref;
  auto wuk = halves(H * P * C, 0.05f, wuk_ref);
  ci.wuk = wuk_ref;
  ci.wdqkv.resize(static_cast<size_t>(W1 * H0));
  ci.wuq.resize(static_cast<size_t>(W2 * Q));
  for (auto& x : ci.wdqkv) x = static_cast<std::int8_t>(ui(rng));
  for (auto& x : ci.wuq) x = static_cast<std::int8_t>(ui(rng));
  ci.descale0.assign(static_cast<size_t>(W1), 1.0f / 4096.0f);
  ci.descale1.assign(static_cast<size_t>(W2), 1.0f / 8192.0f);
  ci.bias0.assign(static_cast<size_t>(W1), 7);
  ci.bias1.assign(static_cast<size_t>(W2), -3);
  const half qs(0.02f);
  const std::int8_t qo = 2;
  ci.quant_scale0 = ci.quant_scale1 = static_cast<float>(qs);
  ci.quant_offset0 = ci.quant_offset1 = qo;
  // The weights as the NPU takes them: int8 NZ.
  auto to_nz = [](const std::vector<std::int8_t>& nd_w, Index rows, Index cols) {
    const auto s = attnref::nz_shape<std::int8_t>(1, rows, cols);
    std::vector<std::int8_t> nz(static_cast<size_t>(s[1] * s[2] * s[3]));
    attnref::nd_to_nz<std::int8_t>(
        attnref::StridedView<const std::int8_t, 3>(nd_w.data(), {1, rows, cols}),
        attnref::StridedView<std::int8_t, 4>(nz.data(), s));
    return nz;
  };
  const auto wdq_nz = to_nz(ci.wdqkv, W1, H0), wuq_nz = to_nz(ci.wuq, W2, Q);
  const auto s1 = attnref::nz_shape<std::int8_t>(1, W1, H0),
             s2 = attnref::nz_shape<std::int8_t>(1, W2, Q);
  // The latent cache: blocks handed out in a shuffled order, NaN until written.
  std::vector<half> cache(static_cast<size_t>(blocks * bs * W), half(NAN));
  std::vector<std::int32_t> table = {2, 0, 3, 1};
  // Token embeddings and per-token sin / cos (YaRN tables are the caller's; any values do).
  std::vector<float> x_ref, cos_ref, sin_ref;
  auto x = halves(total * H0, 1.0f, x_ref);
  auto cs = halves(total * R, 0.7f, cos_ref), sn = halves(total * R, 0.7f, sin_ref);
  std::vector<float> ref_cache(static_cast<size_t>(blocks * bs * W), NAN);  // the reference's
  std::vector<double> ref_q;                                                // last q (absorbed)
  double pre_err = 0.0, dec_err = 0.0, t_pre = 0.0, t_dec = 0.0;
  attnref::MlaDecodeParams dp;  // 512 + 64, scale 1/sqrt(192)
  // Step 0 preprocesses the prompt; steps 1.. one token each; each then decodes the last token.
  for (Index s = 0, first = 0; s <= steps; ++s) {
    const Index n = s == 0 ? prompt : 1;
    std::vector<std::int32_t> slots(static_cast<size_t>(n));
    for (Index t = 0; t < n; ++t) {
      const Index pos = first + t;
      slots[static_cast<size_t>(t)] =
          table[static_cast<size_t>(pos / bs)] * static_cast<std::int32_t>(bs) +
          static_cast<std::int32_t>(pos % bs);
    }
    attnref::MlaPreprocessInputs<half> in;
    in.input = {x.data() + first * H0, {n, H0}};
    in.gamma0 = {g0.data(), {H0}};
    in.beta0 = {b0.data(), {H0}};
    in.quant_scale0 = in.quant_scale1 = {&qs, {1}};
    in.quant_offset0 = in.quant_offset1 = {&qo, {1}};
    in.wdqkv = {{wdq_nz.data(), {s1[1], s1[2], s1[3]}}, W1, H0, attnref::WeightFormat::Nz};
    in.de_scale0 = {ci.descale0.data(), {W1}};
    in.bias0 = {ci.bias0.data(), {W1}};
    in.gamma1 = {g1.data(), {Q}};
    in.beta1 = {b1.data(), {Q}};
    in.wuq = {{wuq_nz.data(), {s2[1], s2[2], s2[3]}}, W2, Q, attnref::WeightFormat::Nz};
    in.de_scale1 = {ci.descale1.data(), {W2}};
    in.bias1 = {ci.bias1.data(), {W2}};
    in.gamma2 = {g2.data(), {C}};
    in.cos = {cs.data() + first * R, {n, R}};
    in.sin = {sn.data() + first * R, {n, R}};
    in.wuk.tensor = {wuk.data(), {H, P, C}};
    in.slot_mapping = {slots.data(), {n}};
    std::vector<half> q_out(static_cast<size_t>(n * H * W));
    attnref::MlaPreprocessOutputs<half> out;
    out.q_out = {q_out.data(), {n, H, W}};
    out.caches.kv_cache = {cache.data(), {blocks, bs, 1, W}};
    auto t0 = Clock::now();
    attnref::mla_preprocess(p, in, out);
    t_pre += seconds_since(t0);
    // The reference chain on the same tokens; its k rows go to the reference cache.
    ci.input.assign(x_ref.begin() + first * H0, x_ref.begin() + (first + n) * H0);
    ci.cos.assign(cos_ref.begin() + first * R, cos_ref.begin() + (first + n) * R);
    ci.sin.assign(sin_ref.begin() + first * R, sin_ref.begin() + (first + n) * R);
    ref::mla::Dims rd{static_cast<int>(H0), static_cast<int>(C), static_cast<int>(R),
                      static_cast<int>(Q),  static_cast<int>(P), static_cast<int>(H)};
    const auto co =
        ref::mla::chain(rd, 0, 0, ci, static_cast<int>(n), p.epsilon, ref::mla::Dt::F16);
    for (Index t = 0; t < n; ++t) {
      float* row = ref_cache.data() + slots[static_cast<size_t>(t)] * W;
      for (Index c = 0; c < C; ++c) row[c] = co.k_nope[static_cast<size_t>(t * C + c)];
      for (Index r = 0; r < R; ++r) row[C + r] = co.k_rope[static_cast<size_t>(t * R + r)];
      for (Index h = 0; h < H; ++h)
        for (Index c = 0; c < W; ++c) {
          const double want = c < C ? co.q_nope_T[static_cast<size_t>((t * H + h) * C + c)]
                                    : co.q_rope[static_cast<size_t>((t * H + h) * R + c - C)];
          pre_err = worse_of(
              pre_err, std::fabs(want - static_cast<float>(
                                            q_out[static_cast<size_t>((t * H + h) * W + c)])) /
                           (1.0 + std::fabs(want)));
        }
    }
    for (size_t i = 0; i < cache.size(); ++i)
      if (!std::isnan(ref_cache[i]))
        pre_err = worse_of(pre_err, std::fabs(ref_cache[i] - static_cast<float>(cache[i])) /
                                        (1.0 + std::fabs(ref_cache[i])));
    first += n;
    // Decode: the newest token's absorbed query over every cached token.
    std::vector<half> o(static_cast<size_t>(H * C));
    const attnref::MlaDecodeInputs<half> din{
        StridedView<const half>(q_out.data() + (n - 1) * H * W, {1, H, W}),
        StridedView<const half>(cache.data(), {blocks, bs, 1, W}),
        StridedView<const std::int32_t>(table.data(), {1, blocks}),
        {first}};
    t0 = Clock::now();
    attnref::mla_decode(dp, din, {StridedView<half>(o.data(), {1, H, C})});
    t_dec += seconds_since(t0);
    ref_q.assign(static_cast<size_t>(H * W), 0.0);
    for (Index h = 0; h < H; ++h)
      for (Index c = 0; c < W; ++c)
        ref_q[static_cast<size_t>(h * W + c)] =
            c < C ? co.q_nope_T[static_cast<size_t>(((n - 1) * H + h) * C + c)]
                  : co.q_rope[static_cast<size_t>(((n - 1) * H + h) * R + c - C)];
    const std::vector<double> rc(ref_cache.begin(), ref_cache.end());
    const auto want = ref::mla::mla_decode(
        ref_q, 1, static_cast<int>(H), static_cast<int>(C), static_cast<int>(R), rc,
        static_cast<int>(bs), table, static_cast<int>(blocks), {static_cast<int>(first)}, dp.scale);
    for (size_t i = 0; i < o.size(); ++i)
      dec_err = worse_of(
          dec_err, std::fabs(want[i] - static_cast<float>(o[i])) / (1.0 + std::fabs(want[i])));
  }
  std::printf(
      "MLA (DeepSeek-V3 dims, %ld heads, fp16, int8 NZ weights): MlaPreprocess of %ld + %ld x 1 "
      "tokens %.2f ms, max rel err %.2e; absorbed decode over %ld..%ld cached tokens %.3f ms, "
      "max rel err %.2e\n",
      static_cast<long>(H), static_cast<long>(prompt), static_cast<long>(steps), t_pre * 1e3,
      pre_err, static_cast<long>(prompt), static_cast<long>(total), t_dec * 1e3, dec_err);
  return pre_err < 2e-3 && dec_err < 2e-3;  // false for NaN
}

/// The NSA decode loop's state (fp16, 16 q heads / 2 kv heads, Dqk 192, Dv 128, compress 32 /
/// stride 16, select blocks of 64, top 6, window 128, pages of 64): the raw paged K/V cache and
/// the paged compressed K/V caches, both allocated for the final length and NaN until written
/// (pages handed out shuffled), the compression weights, and every sequence's raw tokens as the
/// references read them (never from the caches).
struct NsaLoop {
  static constexpr Index N = 16, KVN = 2, Dqk = 192, Dv = 128, l = 32, d = 16, ls = 64, k = 6;
  static constexpr Index w = 128, pbs = 64, cpbs = 64;
  attnref::NsaDecodeParams p;
  std::vector<Index> len;                   // raw tokens of each sequence so far
  Index per = 0, cper = 0;                  // raw / compressed pages per sequence
  std::vector<std::int32_t> table, ctable;  // [B, per], [B, cper]
  std::vector<half> kc, vc, ckc, cvc;       // [pages, page size, KV_N * D]
  std::vector<half> wk, wv;                 // [l, KV_N]
  std::vector<std::vector<double>> rk, rv;  // sequence b's raw tokens [len][KV_N][D]

  Index B() const { return static_cast<Index>(len.size()); }
  /// Appends one random raw K/V token to sequence b: its row of the raw paged cache and the
  /// reference's copy.
  void append(Index b, std::mt19937& rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const size_t sb = static_cast<size_t>(b);
    const Index t = len[sb]++;
    const Index slot = table[static_cast<size_t>(b * per + t / pbs)] * pbs + t % pbs;
    for (Index e = 0; e < KVN * Dqk; ++e) {
      const half x(nd(rng));
      kc[static_cast<size_t>(slot * KVN * Dqk + e)] = x;
      rk[sb].push_back(static_cast<float>(x));
    }
    for (Index e = 0; e < KVN * Dv; ++e) {
      const half x(nd(rng));
      vc[static_cast<size_t>(slot * KVN * Dv + e)] = x;
      rv[sb].push_back(static_cast<float>(x));
    }
  }
  attnref::NsaCacheUpdateInputs<half> update_inputs(std::vector<std::int64_t> added) const {
    attnref::NsaCacheUpdateInputs<half> in;
    const Index nb = B() * per;
    in.key = {kc.data(), {nb, pbs, KVN * Dqk}};
    in.value = {vc.data(), {nb, pbs, KVN * Dv}};
    in.block_table = {table.data(), {B(), per}};
    in.key_weight = {wk.data(), {l, KVN}};
    in.value_weight = {wv.data(), {l, KVN}};
    in.cmp_block_table = {ctable.data(), {B(), cper}};
    in.actual_sel_kv_seq_len.assign(len.begin(), len.end());
    in.actual_new_kv_len = std::move(added);
    return in;
  }
  attnref::NsaCacheUpdateOutputs<half> cmp_outputs() {
    const Index cnb = B() * cper;
    return {{ckc.data(), {cnb, cpbs, KVN * Dqk}}, {cvc.data(), {cnb, cpbs, KVN * Dv}}};
  }
  /// Row of compressed token i of sequence b in the compressed caches.
  Index cmp_row(Index b, Index i) const {
    return ctable[static_cast<size_t>(b * cper + i / cpbs)] * cpbs + i % cpbs;
  }
  /// Rows of the compressed caches written so far (K and V both no longer NaN).
  Index written_rows() const {
    Index n = 0;
    for (Index r = 0; r < B() * cper * cpbs; ++r)
      n += !std::isnan(static_cast<float>(ckc[static_cast<size_t>(r * KVN * Dqk)])) &&
           !std::isnan(static_cast<float>(cvc[static_cast<size_t>(r * KVN * Dv)]));
    return n;
  }
};

/// The loop's caches, sized for prompt + steps tokens per sequence, with the prompts written
/// into the raw cache (the compressed caches still NaN).
NsaLoop nsa_setup(const std::vector<Index>& prompt, Index steps, std::mt19937& rng) {
  using L = NsaLoop;
  NsaLoop s;
  attnref::NsaDecodeParams& p = s.p;
  p.num_heads = L::N;
  p.num_key_value_heads = L::KVN;
  p.compress_block_size = L::l;
  p.compress_block_stride = L::d;
  p.select_block_size = L::ls;
  p.select_block_count = L::k;
  p.window_size = L::w;
  p.page_block_size = L::pbs;
  p.cmp_page_block_size = L::cpbs;
  p.scale_value = 1.0 / std::sqrt(static_cast<double>(L::Dqk));
  const Index B = static_cast<Index>(prompt.size());
  const Index last = *std::max_element(prompt.begin(), prompt.end()) + steps;
  s.per = (last + L::pbs - 1) / L::pbs;
  s.cper = (attnref::nsa_compressed_count(last, L::l, L::d) + L::cpbs - 1) / L::cpbs;
  for (auto [t, n] : {std::pair{&s.table, B * s.per}, std::pair{&s.ctable, B * s.cper}}) {
    t->resize(static_cast<size_t>(n));
    std::iota(t->begin(), t->end(), 0);
    std::shuffle(t->begin(), t->end(), rng);
  }
  const half nan(std::numeric_limits<float>::quiet_NaN());
  s.kc.assign(static_cast<size_t>(B * s.per * L::pbs * L::KVN * L::Dqk), nan);
  s.vc.assign(static_cast<size_t>(B * s.per * L::pbs * L::KVN * L::Dv), nan);
  s.ckc.assign(static_cast<size_t>(B * s.cper * L::cpbs * L::KVN * L::Dqk), nan);
  s.cvc.assign(static_cast<size_t>(B * s.cper * L::cpbs * L::KVN * L::Dv), nan);
  // Learned-looking compression weights (positive, summing to about 1 per head).
  std::uniform_real_distribution<float> u(0.5f, 1.5f);
  for (auto* wt : {&s.wk, &s.wv}) {
    wt->resize(static_cast<size_t>(L::l * L::KVN));
    for (half& e : *wt) e = half(u(rng) / L::l);
  }
  s.len.assign(prompt.size(), 0);
  s.rk.resize(prompt.size());
  s.rv.resize(prompt.size());
  for (Index b = 0; b < B; ++b)
    for (Index t = 0; t < prompt[static_cast<size_t>(b)]; ++t) s.append(b, rng);
  return s;
}

/// One decode step's query and gates (fresh, random; gates from a sigmoid) and its outputs.
struct NsaStep {
  std::vector<half> q, o, oc, os, ow;  // query, gated output, compressed / selected / window
  std::vector<float> gates;
  std::vector<std::int32_t> topk;
};

/// nsa_decode_step over the loop's current caches; returns its time in seconds.
double nsa_decode(const NsaLoop& s, NsaStep& st, std::mt19937& rng) {
  using L = NsaLoop;
  const Index B = s.B();
  std::normal_distribution<float> nd(0.0f, 1.0f);
  st.q.resize(static_cast<size_t>(B * L::N * L::Dqk));
  for (half& x : st.q) x = half(nd(rng));
  st.gates.resize(static_cast<size_t>(B * L::N * 3));
  for (float& g : st.gates) g = 1.0f / (1.0f + std::exp(-nd(rng)));
  const auto u = s.update_inputs({});
  attnref::NsaDecodeInputs<half> in;
  in.query = {st.q.data(), {B, L::N, L::Dqk}};
  in.key = u.key;
  in.value = u.value;
  in.block_table = u.block_table;
  in.cmp_key = {s.ckc.data(), {B * s.cper, L::cpbs, L::KVN * L::Dqk}};
  in.cmp_value = {s.cvc.data(), {B * s.cper, L::cpbs, L::KVN * L::Dv}};
  in.cmp_block_table = u.cmp_block_table;
  in.gates = {st.gates.data(), {B, L::N, 3}};
  in.actual_sel_kv_seq_len = u.actual_sel_kv_seq_len;
  for (auto* o : {&st.o, &st.oc, &st.os, &st.ow})
    o->assign(static_cast<size_t>(B * L::N * L::Dv), half(0.0f));
  st.topk.assign(static_cast<size_t>(B * L::KVN * L::k), -2);
  attnref::NsaDecodeOutputs<half> out;
  out.output = {st.o.data(), {B, L::N, L::Dv}};
  out.topk = {st.topk.data(), {B, L::KVN, L::k}};
  out.cmp_out = {st.oc.data(), {B, L::N, L::Dv}};
  out.sel_out = {st.os.data(), {B, L::N, L::Dv}};
  out.win_out = {st.ow.data(), {B, L::N, L::Dv}};
  const auto t0 = Clock::now();
  attnref::nsa_decode_step(s.p, in, out);
  return seconds_since(t0);
}

/// The largest errors over the loop: compressed tokens, branches and gated output (relative),
/// and whether every top-k equalled the reference's.
struct NsaErrors {
  double cmp = 0.0, out = 0.0;
  bool topk = true;
};

/// Sequence b's compressed K and V in the paged caches against ref::nsa::compress of its raw
/// tokens (worse_of into e.cmp); returns the reference [cmp][KV_N][D], rounded to fp16.
std::pair<std::vector<double>, std::vector<double>> nsa_check_compressed(const NsaLoop& s, Index b,
                                                                         NsaErrors& e) {
  using L = NsaLoop;
  auto weights = [](const std::vector<half>& x) { return std::vector<double>(x.begin(), x.end()); };
  const std::vector<std::int64_t> cu = {s.len[static_cast<size_t>(b)]};
  auto want_k = ref::nsa::compress(s.rk[static_cast<size_t>(b)], L::KVN, L::Dqk, weights(s.wk),
                                   L::l, L::d, cu);
  auto want_v = ref::nsa::compress(s.rv[static_cast<size_t>(b)], L::KVN, L::Dv, weights(s.wv), L::l,
                                   L::d, cu);
  for (auto [want, cache, D] :
       {std::tuple{&want_k, &s.ckc, L::Dqk}, std::tuple{&want_v, &s.cvc, L::Dv}}) {
    const Index c = static_cast<Index>(want->size()) / (L::KVN * D);
    for (Index i = 0; i < c; ++i)
      for (Index x = 0; x < L::KVN * D; ++x) {
        const double a = (*want)[static_cast<size_t>(i * L::KVN * D + x)];
        const float got =
            static_cast<float>((*cache)[static_cast<size_t>(s.cmp_row(b, i) * L::KVN * D + x)]);
        e.cmp = worse_of(e.cmp, std::fabs(a - got) / (1.0 + std::fabs(a)));
      }
    for (double& x : *want) x = ref::nsa::round_to(ref::nsa::Dt::F16, x);
  }
  return {std::move(want_k), std::move(want_v)};
}

/// The naive attention of sequence b's query heads of kv head kh over the raw tokens `toks`
/// (the selected and window branches): [G][Dv].
std::vector<double> nsa_branch_ref(const NsaLoop& s, const std::vector<double>& q, Index b,
                                   Index kh, const std::vector<Index>& toks) {
  using L = NsaLoop;
  constexpr Index G = L::N / L::KVN;
  ref::Problem pr;
  pr.num_heads = static_cast<int>(G);
  pr.num_kv_heads = 1;
  pr.head_size = static_cast<int>(L::Dqk);
  pr.v_head_size = static_cast<int>(L::Dv);
  pr.scale = s.p.scale_value;
  pr.q_len = {1};
  pr.kv_len = {static_cast<int>(toks.size())};
  ref::Seqs qs(1), ks(1), vs(1);
  qs[0].assign(q.begin() + (b * L::N + kh * G) * L::Dqk,
               q.begin() + (b * L::N + (kh + 1) * G) * L::Dqk);
  const auto& rk = s.rk[static_cast<size_t>(b)];
  const auto& rv = s.rv[static_cast<size_t>(b)];
  for (Index t : toks) {
    ks[0].insert(ks[0].end(), rk.begin() + (t * L::KVN + kh) * L::Dqk,
                 rk.begin() + (t * L::KVN + kh + 1) * L::Dqk);
    vs[0].insert(vs[0].end(), rv.begin() + (t * L::KVN + kh) * L::Dv,
                 rv.begin() + (t * L::KVN + kh + 1) * L::Dv);
  }
  return ref::attention(pr, qs, ks, vs).o[0];
}

/// One step against the independent references: the compressed tokens (ref::nsa::compress), the
/// compressed branch and its top-k (ref::nsa::run), the selected blocks and the window (the naive
/// attention), the gated sum. With `show`, prints the chosen blocks, one line per sequence and
/// kv head.
void nsa_check_step(const NsaLoop& s, const NsaStep& st, bool show, NsaErrors& e) {
  using L = NsaLoop;
  constexpr Index G = L::N / L::KVN, k = L::k;
  ref::nsa::Problem np;
  np.N = L::N;
  np.KVN = L::KVN;
  np.Dqk = L::Dqk;
  np.Dv = L::Dv;
  np.scale = s.p.scale_value;
  np.g = {L::l, L::d, L::ls};
  np.k = k;
  const std::vector<double> qd(st.q.begin(), st.q.end());
  for (Index b = 0; b < s.B(); ++b) {
    const Index n = s.len[static_cast<size_t>(b)];
    ref::nsa::Batch nb;
    std::tie(nb.k, nb.v) = nsa_check_compressed(s, b, e);
    nb.cmp = attnref::nsa_compressed_count(n, L::l, L::d);
    nb.sel = n;
    nb.q.assign(qd.begin() + b * L::N * L::Dqk, qd.begin() + (b + 1) * L::N * L::Dqk);
    const ref::nsa::Result cr = ref::nsa::run(np, nb);
    for (Index kh = 0; kh < L::KVN; ++kh) {
      const std::int32_t* got = st.topk.data() + (b * L::KVN + kh) * k;
      e.topk = e.topk && std::equal(got, got + k, cr.topk.begin() + kh * k);
      std::vector<std::int32_t> sorted(cr.topk.begin() + kh * k, cr.topk.begin() + (kh + 1) * k);
      std::vector<Index> sel_toks, win_toks;
      if (show) {
        std::printf(
            "    sequence %ld (%ld raw tokens, %ld compressed, %ld select blocks), kv head %ld: "
            "blocks",
            static_cast<long>(b), static_cast<long>(n), static_cast<long>(nb.cmp),
            static_cast<long>(cr.n_sel), static_cast<long>(kh));
        for (std::int32_t j : sorted) std::printf(" %d", j);
      }
      std::sort(sorted.begin(), sorted.end());
      for (std::int32_t j : sorted)
        for (Index t = j * L::ls; j >= 0 && t < std::min<Index>((j + 1) * L::ls, n); ++t)
          sel_toks.push_back(t);
      for (Index t = std::max<Index>(0, n - L::w); t < n; ++t) win_toks.push_back(t);
      if (show) std::printf(" (%zu tokens)\n", sel_toks.size());
      const auto want_sel = nsa_branch_ref(s, qd, b, kh, sel_toks);
      const auto want_win = nsa_branch_ref(s, qd, b, kh, win_toks);
      for (Index g = 0; g < G; ++g) {
        const Index h = kh * G + g;
        const float* gt = st.gates.data() + (b * L::N + h) * 3;
        for (Index x = 0; x < L::Dv; ++x) {
          const size_t at = static_cast<size_t>((b * L::N + h) * L::Dv + x);
          const double wc = cr.out[static_cast<size_t>(h * L::Dv + x)],
                       ws = want_sel[static_cast<size_t>(g * L::Dv + x)],
                       ww = want_win[static_cast<size_t>(g * L::Dv + x)];
          const double want = gt[0] * wc + gt[1] * ws + gt[2] * ww;
          for (const auto& [a, got] : {std::pair{wc, st.oc[at]}, std::pair{ws, st.os[at]},
                                       std::pair{ww, st.ow[at]}, std::pair{want, st.o[at]}})
            e.out = worse_of(e.out, std::fabs(a - static_cast<float>(got)) / (1.0 + std::fabs(a)));
        }
      }
    }
  }
}

/// A Native Sparse Attention decode loop over two sequences (NsaLoop's shapes): the prompts
/// written into the raw paged cache and compressed by nsa_update_compressed_cache straight into
/// the paged compressed caches, then 2 * d + 1 steps, each appending one raw token per sequence,
/// updating the compressed caches and running nsa_decode_step; every step's compressed tokens,
/// top-k, branches and gated output are checked against the references.
bool nsa_run(std::mt19937& rng) {
  using L = NsaLoop;
  const std::vector<Index> prompt = {700, 1043};
  const Index steps = 2 * L::d + 1;
  NsaLoop s = nsa_setup(prompt, steps, rng);
  auto t0 = Clock::now();
  attnref::nsa_update_compressed_cache(s.p, s.update_inputs({prompt.begin(), prompt.end()}),
                                       s.cmp_outputs());
  const double t_prompt = seconds_since(t0);
  const Index prompt_rows = s.written_rows();
  Index prompt_cmp = 0;  // the prompts' compressed tokens, each written once
  for (Index n : prompt) prompt_cmp += attnref::nsa_compressed_count(n, L::l, L::d);
  std::printf(
      "NSA decode loop (fp16, %ld q heads / %ld kv heads, Dqk %ld, Dv %ld, compress %ld/%ld, "
      "select %ld x %ld, window %ld): prompts of %ld and %ld raw tokens, %ld steps\n",
      static_cast<long>(L::N), static_cast<long>(L::KVN), static_cast<long>(L::Dqk),
      static_cast<long>(L::Dv), static_cast<long>(L::l), static_cast<long>(L::d),
      static_cast<long>(L::k), static_cast<long>(L::ls), static_cast<long>(L::w),
      static_cast<long>(prompt[0]), static_cast<long>(prompt[1]), static_cast<long>(steps));
  NsaErrors e;
  NsaStep st;
  double t_update = 0.0, t_step = 0.0;
  for (Index step = 0; step < steps; ++step) {
    for (Index b = 0; b < s.B(); ++b) s.append(b, rng);
    t0 = Clock::now();
    attnref::nsa_update_compressed_cache(s.p, s.update_inputs({}), s.cmp_outputs());
    t_update += seconds_since(t0);
    t_step += nsa_decode(s, st, rng);
    const bool show = step == 0 || step == steps - 1;
    if (show) std::printf("  step %ld, chosen blocks:\n", static_cast<long>(step + 1));
    nsa_check_step(s, st, show, e);
  }
  Index expected = 0;  // compressed tokens completed by the loop's tokens
  for (Index b = 0; b < s.B(); ++b)
    expected += attnref::nsa_compressed_count(s.len[static_cast<size_t>(b)], L::l, L::d) -
                attnref::nsa_compressed_count(prompt[static_cast<size_t>(b)], L::l, L::d);
  const Index written = s.written_rows() - prompt_rows;
  std::printf(
      "  prompt compression (%ld K and V tokens) %.2f ms; per step: update %.3f ms, "
      "nsa_decode_step %.2f ms; %ld K and V tokens written during the loop (%ld expected)\n"
      "  compression max rel err %.2e, top-k %s the reference at every step, branches and gated "
      "output max rel err %.2e\n",
      static_cast<long>(prompt_rows), t_prompt * 1e3, t_update / steps * 1e3, t_step / steps * 1e3,
      static_cast<long>(written), static_cast<long>(expected), e.cmp,
      e.topk ? "equals" : "DIFFERS FROM", e.out);
  return e.topk && prompt_rows == prompt_cmp && written == expected && e.cmp < 2e-3 &&
         e.out < 2e-3;  // false for NaN
}

/// Section 7's data (fp16, 8 q heads / 2 kv heads, head size 64): a system prompt of P tokens
/// that begins three sequences, each sequence's own tokens after it (its newest token last),
/// and the decode step's query. Blocks of bs = 32 tokens: the prompt's first P / bs blocks are
/// full and shared, as a serving stack's prefix cache shares them.
struct FiaServe {
  static constexpr Index N = 8, KVN = 2, D = 64, P = 100, bs = 32, pool = 12;
  const std::vector<Index> own = {37, 5, 80};
  std::vector<half> pk, pv;                     // the prompt's K / V [P][KVN][D]
  std::vector<std::vector<half>> own_k, own_v;  // sequence b's own K / V [own[b]][KVN][D]
  std::vector<half> q;                          // [B, 1, N, D]

  Index B() const { return static_cast<Index>(own.size()); }
  Index max_own() const { return *std::max_element(own.begin(), own.end()); }
  Index kv_len(Index b) const { return P + own[static_cast<size_t>(b)]; }
  /// The K (or V) row [KVN][D] of token t of sequence b: the prompt's rows, then its own.
  const half* row(bool value, Index b, Index t) const {
    if (t < P) return (value ? pv : pk).data() + t * KVN * D;
    return (value ? own_v : own_k)[static_cast<size_t>(b)].data() + (t - P) * KVN * D;
  }
};

FiaServe fia_serve_setup(std::mt19937& rng) {
  using S = FiaServe;
  FiaServe s;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto random_half = [&](Index n) {
    std::vector<half> x(static_cast<size_t>(n));
    for (auto& e : x) e = half(nd(rng));
    return x;
  };
  s.pk = random_half(S::P * S::KVN * S::D);
  s.pv = random_half(S::P * S::KVN * S::D);
  for (Index n : s.own) {
    s.own_k.push_back(random_half(n * S::KVN * S::D));
    s.own_v.push_back(random_half(n * S::KVN * S::D));
  }
  s.q = random_half(s.B() * S::N * S::D);
  return s;
}

/// One FusedInferAttentionScore decode step's outputs: attention_out [B, 1, N, D], softmax_lse
/// [B, N, 1, 1], and the call's time in seconds.
struct FiaStep {
  std::vector<half> o;
  std::vector<float> lse;
  double t = 0.0;
};

/// The step through fused_infer_attention_score (BSND, softmax_lse_flag) with the caller's K/V.
FiaStep fia_serve_call(const FiaServe& s, attnref::FusedInferAttentionScoreParams p,
                       attnref::FusedInferAttentionScoreInputs<half> in) {
  using S = FiaServe;
  p.num_heads = S::N;
  p.num_key_value_heads = S::KVN;
  p.input_layout = "BSND";
  p.scale_value = 1.0 / std::sqrt(static_cast<double>(S::D));
  p.softmax_lse_flag = true;
  in.query = {s.q.data(), {s.B(), 1, S::N, S::D}};
  FiaStep r;
  r.o.assign(s.q.size(), half(std::numeric_limits<float>::quiet_NaN()));
  r.lse.assign(static_cast<size_t>(s.B() * S::N), std::numeric_limits<float>::quiet_NaN());
  const attnref::FusedInferAttentionScoreOutputs<half> out{{r.o.data(), {s.B(), 1, S::N, S::D}},
                                                           {r.lse.data(), {s.B(), S::N, 1, 1}}};
  const auto t0 = Clock::now();
  attnref::fused_infer_attention_score(p, in, out);
  r.t = seconds_since(t0);
  return r;
}

/// Part A: the paged cache [pool, bs, KVN * D] (NaN until written). Blocks 0 .. P / bs - 1 hold
/// the prompt's full blocks once and begin every block table; the other blocks are handed out
/// shuffled, each sequence's first one taking the prompt's tail (a partial block is not shared:
/// the sequence's own tokens follow it) and its own tokens. `table` gets the block table
/// [B, maxBlocksPerSeq], -1 padded.
FiaStep fia_serve_paged(const FiaServe& s, std::mt19937& rng, std::vector<std::int32_t>& table,
                        Index& max_blocks) {
  using S = FiaServe;
  constexpr Index shared = S::P / S::bs, W = S::KVN * S::D;
  std::vector<half> kc(static_cast<size_t>(S::pool * S::bs * W),
                       half(std::numeric_limits<float>::quiet_NaN()));
  std::vector<half> vc(kc);
  std::vector<std::int32_t> free_blocks(static_cast<size_t>(S::pool - shared));
  std::iota(free_blocks.begin(), free_blocks.end(), static_cast<std::int32_t>(shared));
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
  max_blocks = (S::P + s.max_own() + S::bs - 1) / S::bs;
  table.assign(static_cast<size_t>(s.B() * max_blocks), -1);
  size_t next_free = 0;
  auto put = [&](Index b, Index t, std::int32_t blk) {  // token t of sequence b into block blk
    const size_t at = static_cast<size_t>((blk * S::bs + t % S::bs) * W);
    std::copy_n(s.row(false, b, t), W, kc.begin() + static_cast<std::ptrdiff_t>(at));
    std::copy_n(s.row(true, b, t), W, vc.begin() + static_cast<std::ptrdiff_t>(at));
  };
  for (Index t = 0; t < shared * S::bs; ++t) put(0, t, static_cast<std::int32_t>(t / S::bs));
  std::vector<std::int64_t> lens;
  for (Index b = 0; b < s.B(); ++b) {
    std::int32_t* bt = table.data() + b * max_blocks;
    for (Index j = 0; j < shared; ++j) bt[j] = static_cast<std::int32_t>(j);
    for (Index t = shared * S::bs; t < s.kv_len(b); ++t) {
      if (t % S::bs == 0) bt[t / S::bs] = free_blocks.at(next_free++);
      put(b, t, bt[t / S::bs]);
    }
    lens.push_back(s.kv_len(b));
  }
  attnref::FusedInferAttentionScoreParams p;
  p.block_size = S::bs;
  attnref::FusedInferAttentionScoreInputs<half> in;
  in.key = {{kc.data(), {S::pool, S::bs, W}}};
  in.value = {{vc.data(), {S::pool, S::bs, W}}};
  in.block_table = {table.data(), {s.B(), max_blocks}};
  in.actual_seq_lengths_kv = lens;
  return fia_serve_call(s, p, in);
}

/// Part B: the prompt as key_shared_prefix / value_shared_prefix [1, P, KVN, D] and each
/// sequence's own tokens in a contiguous cache [B, maxOwn, KVN, D] (NaN past its length).
FiaStep fia_serve_prefix(const FiaServe& s) {
  using S = FiaServe;
  constexpr Index W = S::KVN * S::D;
  const Index m = s.max_own();
  std::vector<half> kc(static_cast<size_t>(s.B() * m * W),
                       half(std::numeric_limits<float>::quiet_NaN()));
  std::vector<half> vc(kc);
  std::vector<std::int64_t> lens;
  for (Index b = 0; b < s.B(); ++b) {
    const auto at = static_cast<std::ptrdiff_t>(b * m * W);
    std::copy(s.own_k[static_cast<size_t>(b)].begin(), s.own_k[static_cast<size_t>(b)].end(),
              kc.begin() + at);
    std::copy(s.own_v[static_cast<size_t>(b)].begin(), s.own_v[static_cast<size_t>(b)].end(),
              vc.begin() + at);
    lens.push_back(s.own[static_cast<size_t>(b)]);
  }
  attnref::FusedInferAttentionScoreInputs<half> in;
  in.key = {{kc.data(), {s.B(), m, S::KVN, S::D}}};
  in.value = {{vc.data(), {s.B(), m, S::KVN, S::D}}};
  in.key_shared_prefix = {s.pk.data(), {1, S::P, S::KVN, S::D}};
  in.value_shared_prefix = {s.pv.data(), {1, S::P, S::KVN, S::D}};
  in.actual_seq_lengths_kv = lens;
  return fia_serve_call(s, {}, in);
}

/// The step's output and lse against the naive reference over each sequence's tokens (the
/// prompt's, then its own; never read from a cache): worse_of into out_err and lse_err.
void fia_serve_check(const FiaServe& s, const FiaStep& r, double& out_err, double& lse_err) {
  using S = FiaServe;
  ref::Problem pr;
  pr.num_heads = static_cast<int>(S::N);
  pr.num_kv_heads = static_cast<int>(S::KVN);
  pr.head_size = static_cast<int>(S::D);
  pr.v_head_size = static_cast<int>(S::D);
  pr.scale = 1.0 / std::sqrt(static_cast<double>(S::D));
  ref::Seqs rq(s.B()), rk(s.B()), rv(s.B());
  for (Index b = 0; b < s.B(); ++b) {
    pr.q_len.push_back(1);
    pr.kv_len.push_back(static_cast<int>(s.kv_len(b)));
    for (Index e = b * S::N * S::D; e < (b + 1) * S::N * S::D; ++e)
      rq[b].push_back(static_cast<float>(s.q[static_cast<size_t>(e)]));
    for (Index t = 0; t < s.kv_len(b); ++t)
      for (Index e = 0; e < S::KVN * S::D; ++e) {
        rk[b].push_back(static_cast<float>(s.row(false, b, t)[e]));
        rv[b].push_back(static_cast<float>(s.row(true, b, t)[e]));
      }
  }
  const ref::Result want = ref::attention(pr, rq, rk, rv);
  for (Index b = 0; b < s.B(); ++b) {
    for (size_t i = 0; i < want.o[b].size(); ++i)
      out_err = worse_of(
          out_err, std::fabs(want.o[b][i] -
                             static_cast<float>(r.o[static_cast<size_t>(b * S::N * S::D) + i])));
    for (Index h = 0; h < S::N; ++h)  // lse [B, N, 1, 1]; the reference's [N][q_len = 1]
      lse_err = worse_of(lse_err, std::fabs(want.lse[b][static_cast<size_t>(h)] -
                                            r.lse[static_cast<size_t>(b * S::N + h)]));
  }
}

/// One decode step of a paged serving loop through FusedInferAttentionScore with a shared system
/// prompt: A over a paged cache whose prompt blocks every block table shares, B with the prompt
/// as the shared prefix and the sequences' own tokens contiguous; A is checked against the
/// reference, B must equal A bit for bit (output and softmax_lse).
bool fia_serving_run(std::mt19937& rng) {
  using S = FiaServe;
  const FiaServe s = fia_serve_setup(rng);
  std::vector<std::int32_t> table;
  Index max_blocks = 0;
  const FiaStep a = fia_serve_paged(s, rng, table, max_blocks);
  const FiaStep b = fia_serve_prefix(s);
  double out_err = 0.0, lse_err = 0.0;
  fia_serve_check(s, a, out_err, lse_err);
  const bool same = std::memcmp(a.o.data(), b.o.data(), a.o.size() * sizeof(half)) == 0 &&
                    std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)) == 0;
  std::printf(
      "FIA serving step (fp16, %ld q heads / %ld kv heads, head size %ld): %ld sequences = a "
      "%ld-token system prompt + %ld, %ld, %ld own tokens; paged cache [%ld, %ld, %ld], the "
      "prompt's %ld full blocks stored once, block_tables [%ld, %ld], sequence 1:",
      static_cast<long>(S::N), static_cast<long>(S::KVN), static_cast<long>(S::D),
      static_cast<long>(s.B()), static_cast<long>(S::P), static_cast<long>(s.own[0]),
      static_cast<long>(s.own[1]), static_cast<long>(s.own[2]), static_cast<long>(S::pool),
      static_cast<long>(S::bs), static_cast<long>(S::KVN * S::D), static_cast<long>(S::P / S::bs),
      static_cast<long>(s.B()), static_cast<long>(max_blocks));
  for (Index j = 0; j < max_blocks; ++j)
    std::printf("%s%d", j == 0 ? " [" : ", ", table[static_cast<size_t>(max_blocks + j)]);
  std::printf(
      "]\n  paged q [%ld, 1, %ld, %ld] (BSND), kv lengths %ld, %ld, %ld: %.3f ms, max |err| %.2e, "
      "lse max |err| %.2e; key_shared_prefix [1, %ld, %ld, %ld] + own K/V [%ld, %ld, %ld, %ld]: "
      "%.3f ms; prefix == shared blocks: %s\n",
      static_cast<long>(s.B()), static_cast<long>(S::N), static_cast<long>(S::D),
      static_cast<long>(s.kv_len(0)), static_cast<long>(s.kv_len(1)),
      static_cast<long>(s.kv_len(2)), a.t * 1e3, out_err, lse_err, static_cast<long>(S::P),
      static_cast<long>(S::KVN), static_cast<long>(S::D), static_cast<long>(s.B()),
      static_cast<long>(s.max_own()), static_cast<long>(S::KVN), static_cast<long>(S::D), b.t * 1e3,
      same ? "bit for bit" : "OUTPUTS DIFFER");
  return same && out_err < 2.5e-3 && lse_err < 1e-4;  // false for NaN
}

}  // namespace

int main() {
  const std::vector<Index> prompt = {200, 131};
  const Index batch = static_cast<Index>(prompt.size());
  const int decode_steps = 8;
  const double scale = 1.0 / std::sqrt(static_cast<double>(kHeadSize));
  std::mt19937 rng(2026);
  std::normal_distribution<float> nd(0.0f, 1.0f);

  // The KV cache (fp16) and the per-sequence reference copies (double, same rounded values).
  std::vector<half> k_cache(static_cast<size_t>(batch * kMaxSeq * kKvHeads * kHeadSize));
  std::vector<half> v_cache(k_cache.size());
  ref::Seqs ref_k(batch), ref_v(batch);
  auto append_kv = [&](Index b, Index pos) {
    for (Index h = 0; h < kKvHeads; ++h)
      for (Index d = 0; d < kHeadSize; ++d) {
        const size_t idx =
            static_cast<size_t>(((b * kMaxSeq + pos) * kKvHeads + h) * kHeadSize + d);
        k_cache[idx] = half(nd(rng));
        v_cache[idx] = half(nd(rng));
        ref_k[b].push_back(static_cast<float>(k_cache[idx]));
        ref_v[b].push_back(static_cast<float>(v_cache[idx]));
      }
  };
  auto cache_view = [&](const std::vector<half>& c) {
    return attnref::bsnd_view<const half>(c.data(), batch, kMaxSeq, kKvHeads, kHeadSize);
  };

  std::printf(
      "attnref %d.%d.%d demo: GQA layer, %ld q heads / %ld kv heads, head size %ld, "
      "fp16 KV cache [%ld, %ld, %ld, %ld]\n",
      attnref::kVersionMajor, attnref::kVersionMinor, attnref::kVersionPatch,
      static_cast<long>(kHeads), static_cast<long>(kKvHeads), static_cast<long>(kHeadSize),
      static_cast<long>(batch), static_cast<long>(kMaxSeq), static_cast<long>(kKvHeads),
      static_cast<long>(kHeadSize));

  // ---- prefill: packed (TND) queries of both prompts, causal ----
  Index total = 0;
  std::vector<Index> q_cu = {0};
  for (Index len : prompt) q_cu.push_back(total += len);
  std::vector<float> q(static_cast<size_t>(total * kHeads * kHeadSize));
  for (auto& x : q) x = nd(rng);
  std::vector<float> o(q.size());
  for (Index b = 0; b < batch; ++b)
    for (Index pos = 0; pos < prompt[static_cast<size_t>(b)]; ++pos) append_kv(b, pos);

  attnref::AttentionInputs<float, half> in{
      attnref::tnd_view<const float>(q.data(), total, kHeads, kHeadSize), cache_view(k_cache),
      cache_view(v_cache)};
  in.seq.q_cu = q_cu;
  in.seq.kv = prompt;
  attnref::AttentionParams params;
  params.scale = scale;
  params.causal = attnref::CausalMode::BottomRight;
  attnref::AttentionOutputs<float> out{attnref::tnd_view(o.data(), total, kHeads, kHeadSize)};

  attnref::attention(in, params, out);  // first call: thread start-up and first-touch pages
  auto t0 = Clock::now();
  attnref::attention(in, params, out);  // timed call (same inputs, same outputs)
  const double t_prefill = seconds_since(t0);

  ref::Problem pr;
  pr.num_heads = kHeads;
  pr.num_kv_heads = kKvHeads;
  pr.head_size = kHeadSize;
  pr.v_head_size = kHeadSize;
  pr.scale = scale;
  pr.causal = ref::Causal::kBottomRight;
  ref::Seqs ref_q(batch);
  for (Index b = 0; b < batch; ++b) {
    pr.q_len.push_back(static_cast<int>(prompt[static_cast<size_t>(b)]));
    pr.kv_len.push_back(static_cast<int>(prompt[static_cast<size_t>(b)]));
    ref_q[b].assign(q.begin() + q_cu[b] * kHeads * kHeadSize,
                    q.begin() + q_cu[b + 1] * kHeads * kHeadSize);
  }
  const ref::Result want = ref::attention(pr, ref_q, ref_k, ref_v);
  double max_err = 0.0;
  for (Index b = 0; b < batch; ++b)
    for (size_t i = 0; i < want.o[b].size(); ++i)
      max_err = worse_of(
          max_err,
          std::fabs(want.o[b][i] - o[static_cast<size_t>(q_cu[b] * kHeads * kHeadSize) + i]));
  double pairs = 0;
  for (Index len : prompt) pairs += static_cast<double>(len) * static_cast<double>(len + 1) / 2.0;
  std::printf(
      "prefill  q [T=%ld, %ld, %ld] (TND, lengths %ld and %ld), causal: %.2f ms, "
      "%.1f GFLOPS, max |err| vs reference %.2e\n",
      static_cast<long>(total), static_cast<long>(kHeads), static_cast<long>(kHeadSize),
      static_cast<long>(prompt[0]), static_cast<long>(prompt[1]), t_prefill * 1e3,
      4.0 * kHeads * pairs * kHeadSize / t_prefill * 1e-9, max_err);
  bool ok = max_err < 1e-4;

  // ---- decode: one new token per sequence per step ----
  std::vector<Index> len = prompt;
  for (int step = 0; step < decode_steps; ++step) {
    for (Index b = 0; b < batch; ++b) append_kv(b, len[static_cast<size_t>(b)]++);
    std::vector<float> qd(static_cast<size_t>(batch * kHeads * kHeadSize));
    for (auto& x : qd) x = nd(rng);
    std::vector<float> od(qd.size());
    attnref::AttentionInputs<float, half> din{
        attnref::bsnd_view<const float>(qd.data(), batch, 1, kHeads, kHeadSize),
        cache_view(k_cache), cache_view(v_cache)};
    din.seq.kv = len;
    attnref::AttentionOutputs<float> dout{
        attnref::bsnd_view(od.data(), batch, 1, kHeads, kHeadSize)};
    t0 = Clock::now();
    attnref::attention(din, params, dout);
    const double t = seconds_since(t0);

    ref::Problem dp = pr;
    ref::Seqs dq(batch);
    for (Index b = 0; b < batch; ++b) {
      dp.q_len[b] = 1;
      dp.kv_len[b] = static_cast<int>(len[static_cast<size_t>(b)]);
      dq[b].assign(qd.begin() + b * kHeads * kHeadSize, qd.begin() + (b + 1) * kHeads * kHeadSize);
    }
    const ref::Result dw = ref::attention(dp, dq, ref_k, ref_v);
    double err = 0.0;
    for (Index b = 0; b < batch; ++b)
      for (size_t i = 0; i < dw.o[b].size(); ++i)
        err = worse_of(err,
                       std::fabs(dw.o[b][i] - od[static_cast<size_t>(b * kHeads * kHeadSize) + i]));
    double bytes = 0;
    for (Index l : len) bytes += 2.0 * static_cast<double>(l) * kKvHeads * kHeadSize * sizeof(half);
    std::printf("decode %d  kv lengths %ld, %ld: %.3f ms, %.2f GB/s of KV, max |err| %.2e\n", step,
                static_cast<long>(len[0]), static_cast<long>(len[1]), t * 1e3, bytes / t * 1e-9,
                err);
    ok = ok && err < 1e-4;
  }
  ok = atb_self_attention_run(prompt, rng) && ok;
  ok = paged_serving_run(rng) && ok;
  ok = mla_run(rng) && ok;
  ok = nsa_run(rng) && ok;
  ok = fia_serving_run(rng) && ok;
  std::printf("digest of the output errors: %016llx\n", static_cast<unsigned long long>(g_digest));
  std::printf("%s\n",
              ok ? "OK: every step matches the reference" : "FAILED: error above tolerance");
  return ok ? 0 : 1;
}
