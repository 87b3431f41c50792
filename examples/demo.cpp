// attnref demo: one Llama-style GQA attention layer end to end.
//
//   1. prefill: two sequences of different lengths, causal, q in f32, K/V stored as fp16 in a
//      KV cache [B, max_seq, kv_heads, head_size];
//   2. decode: several steps, each appending one token per sequence to the cache and attending
//      over the whole cache (split-KV path);
//   3. the same layer through ATB's SelfAttention operator (bf16, HIGH_PRECISION, CAUSAL_MASK):
//      ENCODER writes the prompts into a [layer, batch, maxSeq, kvHead * headSize] cache, then
//      DECODER steps append and attend;
// every output is checked against the independent naive reference (double loops) and the
// throughput of the engine is printed.

#include <attnref/attnref.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "../tests/reference/naive_attention.hpp"

namespace {

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
        err = std::max(
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
      max_err = std::max(
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
        err = std::max(err,
                       std::fabs(dw.o[b][i] - od[static_cast<size_t>(b * kHeads * kHeadSize) + i]));
    double bytes = 0;
    for (Index l : len) bytes += 2.0 * static_cast<double>(l) * kKvHeads * kHeadSize * sizeof(half);
    std::printf("decode %d  kv lengths %ld, %ld: %.3f ms, %.2f GB/s of KV, max |err| %.2e\n", step,
                static_cast<long>(len[0]), static_cast<long>(len[1]), t * 1e3, bytes / t * 1e-9,
                err);
    ok = ok && err < 1e-4;
  }
  ok = atb_self_attention_run(prompt, rng) && ok;
  std::printf("%s\n",
              ok ? "OK: every step matches the reference" : "FAILED: error above tolerance");
  return ok ? 0 : 1;
}
