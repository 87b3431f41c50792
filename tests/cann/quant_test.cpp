// The CANN operators' int8 paths. PromptFlashAttention against the independent reference
// (tests/reference/cann_pfa_quant.hpp): int8 q / k / v with fp16 or int8 output (per-tensor and
// per-channel quant_scale2 / quant_offset2) over layouts, GQA, sparse modes 0 and 3 and the
// quantization block size; fp16 input with int8 output. IncreFlashAttention's int8 output
// (with fp16 and with antiquant int8 K/V). Bad input.

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/cann/incre_flash_attention.hpp>
#include <attnref/cann/prompt_flash_attention.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "reference/cann_pfa_quant.hpp"
#include "support/cast.hpp"
#include "support/errors.hpp"
#include "support/random.hpp"

namespace quant_test {

using attnref::half;
using attnref::Index;
using attnref::StridedView;
using support::z;
using i8 = std::int8_t;

struct QCase {
  std::string layout = "BSND";
  int batch = 2, seq = 37, heads = 4, kv_heads = 2, d = 32;
  bool causal = false;
  int block = 128;
  bool int8_out = false, per_channel = false;
  unsigned seed = 1;
};

/// BSND data -> the layout's memory (BSND or BNSD).
template <class T>
std::vector<T> to_layout(const std::vector<T>& x, const QCase& c, int heads) {
  if (c.layout == "BSND") return x;
  std::vector<T> y(x.size());
  for (int b = 0; b < c.batch; ++b)
    for (int s = 0; s < c.seq; ++s)
      for (int h = 0; h < heads; ++h)
        for (int e = 0; e < c.d; ++e)
          y[z(((b * heads + h) * c.seq + s) * c.d + e)] =
              x[z(((b * c.seq + s) * heads + h) * c.d + e)];
  return y;
}

std::vector<Index> shape(const QCase& c, int heads) {
  if (c.layout == "BSND") return {c.batch, c.seq, heads, c.d};
  return {c.batch, heads, c.seq, c.d};
}

void run_case(const QCase& c) {
  std::mt19937 rng(c.seed);
  auto fill = [&](size_t n) { return support::rand_i8(n, rng, -127, 127); };
  const auto q = fill(z(c.batch * c.seq * c.heads * c.d));
  const auto k = fill(z(c.batch * c.seq * c.kv_heads * c.d));
  const auto v = fill(k.size());
  ref::cann::PfaQuant rp;
  rp.batch = c.batch;
  rp.seq = c.seq;
  rp.heads = c.heads;
  rp.kv_heads = c.kv_heads;
  rp.d = c.d;
  rp.causal = c.causal;
  rp.block = c.block;
  rp.deq1 = 1.0f / 4096.0f * 1.37f;
  rp.qs1 = 100.0f;
  rp.deq2 = 0.5f / 100.0f;
  rp.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  const auto want = ref::cann::pfa_quant(rp, q, k, v);

  attnref::PromptFlashAttentionParams p;
  p.num_heads = c.heads;
  p.num_key_value_heads = c.kv_heads;
  p.input_layout = c.layout;
  p.scale_value = rp.scale;
  p.quant_block_size = c.block;
  std::vector<std::uint8_t> mask;
  const auto ql = to_layout(q, c, c.heads), kl = to_layout(k, c, c.kv_heads),
             vl = to_layout(v, c, c.kv_heads);
  attnref::PromptFlashAttentionInputs<i8> in{
      StridedView<const i8>(ql.data(), shape(c, c.heads)),
      StridedView<const i8>(kl.data(), shape(c, c.kv_heads)),
      StridedView<const i8>(vl.data(), shape(c, c.kv_heads))};
  if (c.causal) {
    p.sparse_mode = 3;
    mask.assign(2048 * 2048, 0);
    in.atten_mask = StridedView<const std::uint8_t>(mask.data(), {2048, 2048});
  }
  in.deq_scale1 = StridedView<const float>(&rp.deq1, {1});
  in.quant_scale1 = StridedView<const float>(&rp.qs1, {1});
  in.deq_scale2 = StridedView<const float>(&rp.deq2, {1});
  const std::string what =
      c.layout + " S " + std::to_string(c.seq) + " block " + std::to_string(c.block) +
      (c.causal ? " causal" : "") +
      (c.int8_out ? (c.per_channel ? " int8 out per channel" : " int8 out") : "");
  const size_t n_out = z(c.batch * c.seq * c.heads * c.d);
  // The reference's output back in the layout's order.
  auto at = [&](size_t idx) {  // layout index -> (b, s, h, e) in BSND
    if (c.layout == "BSND") return idx;
    const size_t e = idx % z(c.d), s = idx / z(c.d) % z(c.seq),
                 h = idx / z(c.d * c.seq) % z(c.heads), b = idx / z(c.d * c.seq * c.heads);
    return ((b * z(c.seq) + s) * z(c.heads) + h) * z(c.d) + e;
  };
  if (!c.int8_out) {
    std::vector<half> o(n_out, half(7.0f));
    attnref::prompt_flash_attention(
        p, in,
        attnref::PromptFlashAttentionOutputs<half>{StridedView<half>(o.data(), shape(c, c.heads))});
    int bad = 0;
    for (size_t idx = 0; idx < n_out; ++idx) {
      const size_t r = at(idx);
      const double w = want.out[r], got = static_cast<float>(o[idx]);
      const double tol = 1e-3 + 1e-3 * std::fabs(w) + want.slack[r / z(c.d)] * 1.01;
      if (!(std::fabs(got - w) <= tol) && ++bad <= 3)
        ADD_FAILURE() << what << ": element " << idx << " expected " << w << " got " << got;
    }
    EXPECT_EQ(bad, 0) << what;
    return;
  }
  std::vector<float> qs2(c.per_channel ? z(c.heads * c.d) : 1), qo2(qs2.size());
  for (size_t i = 0; i < qs2.size(); ++i) {
    qs2[i] = 20.0f + static_cast<float>(i % 7);
    qo2[i] = static_cast<float>(static_cast<int>(i % 5) - 2);
  }
  in.quant_scale2 = StridedView<const float>(qs2.data(), {static_cast<Index>(qs2.size())});
  in.quant_offset2 = StridedView<const float>(qo2.data(), {static_cast<Index>(qo2.size())});
  std::vector<i8> o(n_out, i8{7});
  attnref::prompt_flash_attention(
      p, in,
      attnref::PromptFlashAttentionOutputs<i8>{StridedView<i8>(o.data(), shape(c, c.heads))});
  int bad = 0;
  for (size_t idx = 0; idx < n_out; ++idx) {
    const size_t r = at(idx);
    const size_t ch = c.per_channel ? (r / z(c.d) % z(c.heads)) * z(c.d) + r % z(c.d) : 0;
    const double x = want.out[r] * qs2[ch] + qo2[ch];
    const double w = std::clamp(std::nearbyint(x), -128.0, 127.0);
    // One step either way where the value sits near a rounding boundary or a P8 tie moved it.
    const double slack = 1e-2 + want.slack[r / z(c.d)] * qs2[ch];
    const double lo = std::clamp(std::nearbyint(x - slack), -128.0, 127.0),
                 hi = std::clamp(std::nearbyint(x + slack), -128.0, 127.0);
    const double got = o[idx];
    if ((got < lo || got > hi) && ++bad <= 3)
      ADD_FAILURE() << what << ": element " << idx << " expected " << w << " got " << got;
  }
  EXPECT_EQ(bad, 0) << what;
}

TEST(PromptFlashAttentionQuant, Int8MatchesReference) {
  unsigned seed = 1;
  for (const std::string layout : {"BSND", "BNSD"})
    for (int seq : {1, 37, 130})
      for (bool causal : {false, true})
        for (int block : {16, 128}) {
          QCase c;
          c.layout = layout;
          c.seq = seq;
          c.causal = causal;
          c.block = block;
          c.seed = seed++;
          run_case(c);
          c.int8_out = true;
          run_case(c);
          c.per_channel = true;
          run_case(c);
        }
}

TEST(PromptFlashAttentionQuant, MhaAndLargeHeads) {
  QCase c;
  c.heads = 2;
  c.kv_heads = 2;
  c.d = 128;
  c.seq = 65;
  run_case(c);
  c.causal = true;
  c.block = 32;
  run_case(c);
}

TEST(PromptFlashAttentionQuant, Fp16InputWithInt8Output) {
  // sat(rint(O·qs2 + qo2)) of the fp16 path's output: all-equal keys make O the mean of V.
  const Index B = 1, S = 8, N = 2, D = 16;
  std::vector<half> q(z(B * S * N * D), half(0.25f)), k(q), v(q.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = half(static_cast<float>(i % 9) * 0.125f);
  attnref::PromptFlashAttentionParams p;
  p.num_heads = N;
  p.input_layout = "BSND";
  attnref::PromptFlashAttentionInputs<half> in{StridedView<const half>(q.data(), {B, S, N, D}),
                                               StridedView<const half>(k.data(), {B, S, N, D}),
                                               StridedView<const half>(v.data(), {B, S, N, D})};
  const float qs2 = 10.0f, qo2 = -3.0f;
  in.quant_scale2 = StridedView<const float>(&qs2, {1});
  in.quant_offset2 = StridedView<const float>(&qo2, {1});
  std::vector<i8> o(q.size(), i8{7});
  attnref::prompt_flash_attention(
      p, in, attnref::PromptFlashAttentionOutputs<i8>{StridedView<i8>(o.data(), {B, S, N, D})});
  for (Index h = 0; h < N; ++h)
    for (Index e = 0; e < D; ++e) {
      double mean = 0;
      for (Index j = 0; j < S; ++j) mean += static_cast<float>(v[z((j * N + h) * D + e)]);
      mean /= S;
      const double want = std::clamp(std::nearbyint(mean * qs2 + qo2), -128.0, 127.0);
      for (Index i = 0; i < S; ++i) EXPECT_EQ(o[z((i * N + h) * D + e)], want) << h << " " << e;
    }
}

TEST(PromptFlashAttentionQuant, BadInputThrowsBeforeWriting) {
  const Index B = 1, S = 4, N = 2, D = 8;
  std::vector<i8> q(z(B * S * N * D), 1), k(q), v(q);
  std::vector<half> o(q.size(), half(7.0f));
  std::vector<i8> o8(q.size(), i8{7});
  const float one = 1.0f;
  std::vector<float> two(2, 1.0f), three(3, 1.0f);
  attnref::PromptFlashAttentionParams p;
  p.num_heads = N;
  p.input_layout = "BSND";
  using In = attnref::PromptFlashAttentionInputs<i8>;
  auto base = [&] {
    In in{StridedView<const i8>(q.data(), {B, S, N, D}),
          StridedView<const i8>(k.data(), {B, S, N, D}),
          StridedView<const i8>(v.data(), {B, S, N, D})};
    in.deq_scale1 = StridedView<const float>(&one, {1});
    in.quant_scale1 = StridedView<const float>(&one, {1});
    in.deq_scale2 = StridedView<const float>(&one, {1});
    return in;
  };
  const attnref::PromptFlashAttentionOutputs<half> out{StridedView<half>(o.data(), {B, S, N, D})};
  const attnref::PromptFlashAttentionOutputs<i8> out8{StridedView<i8>(o8.data(), {B, S, N, D})};
  auto expect = [&](auto edit, const std::string& what, bool int8_out) {
    In in = base();
    auto pp = p;
    edit(in, pp);
    if (int8_out)
      support::expect_throw([&] { attnref::prompt_flash_attention(pp, in, out8); }, what, false);
    else
      support::expect_throw([&] { attnref::prompt_flash_attention(pp, in, out); }, what, false);
  };
  expect([](In& in, auto&) { in.deq_scale1 = {}; }, "deq_scale1 per-tensor scale required", false);
  expect([](In& in, auto&) { in.quant_scale1 = {}; }, "quant_scale1 per-tensor scale required",
         false);
  expect([&](In& in, auto&) { in.deq_scale2 = StridedView<const float>(two.data(), {2}); },
         "deq_scale2 per-tensor scale required", false);
  expect([&](In& in, auto&) { in.quant_scale2 = StridedView<const float>(&one, {1}); },
         "quant_scale2 / quant_offset2 given without int8 output", false);
  expect([](In&, auto& pp) { pp.quant_block_size = 0; }, "params.quant_block_size out of range",
         false);
  expect([](In&, auto&) {}, "quant_scale2 required for int8 output", true);
  expect([&](In& in, auto&) { in.quant_scale2 = StridedView<const float>(three.data(), {3}); },
         "quant_scale2 required for int8 output", true);
  expect(
      [&](In& in, auto&) {
        in.quant_scale2 = StridedView<const float>(&one, {1});
        in.quant_offset2 = StridedView<const float>(two.data(), {2});
      },
      "quant_offset2.shape differs from quant_scale2's", true);
  for (const half& x : o) EXPECT_EQ(static_cast<float>(x), 7.0f);
  for (i8 x : o8) EXPECT_EQ(x, 7);
  // fp16 data with int8 path scales.
  std::vector<half> qh(q.size(), half(0.5f));
  attnref::PromptFlashAttentionInputs<half> hin{StridedView<const half>(qh.data(), {B, S, N, D}),
                                                StridedView<const half>(qh.data(), {B, S, N, D}),
                                                StridedView<const half>(qh.data(), {B, S, N, D})};
  hin.deq_scale1 = StridedView<const float>(&one, {1});
  support::expect_throw([&] { attnref::prompt_flash_attention(p, hin, out); },
                        "deq_scale1 given without int8 query / key / value", false);
}

/// IFA with int8 output: keys all equal, so O is the mean of V over the kv length (the int8
/// K / V case dequantizes first, (V8 + offset)·scale); per tensor and per channel.
template <class TKV>
void ifa_int8_out(bool per_channel) {
  const Index B = 2, S = 12, N = 4, KV = 2, D = 16;
  std::vector<half> q(z(B * N * D), half(0.25f));
  std::vector<TKV> k(z(B * S * KV * D), TKV(1)), v(k.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = TKV(static_cast<float>(i % 9) - 4.0f);
  attnref::IncreFlashAttentionParams p;
  p.num_heads = N;
  p.num_key_value_heads = KV;
  p.input_layout = "BSND";
  attnref::IncreFlashAttentionInputs<half, TKV> in;
  in.query = StridedView<const half>(q.data(), {B, 1, N, D});
  in.key = {StridedView<const TKV>(k.data(), {B, S, KV, D})};
  in.value = {StridedView<const TKV>(v.data(), {B, S, KV, D})};
  in.actual_seq_lengths = {7, 0};
  std::vector<half> aq{half(0.5f), half(0.75f)}, ao{half(2.0f), half(-1.0f)};
  constexpr bool kInt8 = std::is_same_v<TKV, i8>;
  if (kInt8) {
    in.antiquant_scale = StridedView<const half>(aq.data(), {2});
    in.antiquant_offset = StridedView<const half>(ao.data(), {2});
  }
  std::vector<float> qs2(per_channel ? z(N * D) : 1), qo2(qs2.size());
  for (size_t i = 0; i < qs2.size(); ++i) {
    qs2[i] = 3.0f + static_cast<float>(i % 4);
    qo2[i] = static_cast<float>(i % 3);
  }
  in.quant_scale2 = StridedView<const float>(qs2.data(), {static_cast<Index>(qs2.size())});
  in.quant_offset2 = StridedView<const float>(qo2.data(), {static_cast<Index>(qo2.size())});
  std::vector<i8> o(q.size(), i8{7});
  attnref::incre_flash_attention(
      p, in, attnref::IncreFlashAttentionOutputs<i8>{StridedView<i8>(o.data(), {B, 1, N, D})});
  for (Index h = 0; h < N; ++h)
    for (Index e = 0; e < D; ++e) {
      double mean = 0;
      for (Index j = 0; j < 7; ++j) {
        const double x = static_cast<float>(v[z((j * KV + h / 2) * D + e)]);
        mean += kInt8 ? (x - 1.0) * 0.75 : x;  // value: offset ao[1], scale aq[1]
      }
      mean /= 7;
      const size_t c = per_channel ? z(h * D + e) : 0;
      const double x = mean * qs2[c] + qo2[c];
      const double lo = std::clamp(std::nearbyint(x - 1e-3), -128.0, 127.0),
                   hi = std::clamp(std::nearbyint(x + 1e-3), -128.0, 127.0);
      EXPECT_TRUE(o[z(h * D + e)] >= lo && o[z(h * D + e)] <= hi)
          << h << " " << e << ": " << int{o[z(h * D + e)]} << " vs " << x;
      EXPECT_EQ(o[z((N + h) * D + e)], 0) << "kv length 0 gives 0";
    }
}

TEST(IncreFlashAttentionQuant, Int8OutputPerTensorAndPerChannel) {
  ifa_int8_out<half>(false);
  ifa_int8_out<half>(true);
  ifa_int8_out<i8>(false);
  ifa_int8_out<i8>(true);
}

TEST(IncreFlashAttentionQuant, BadInputThrowsBeforeWriting) {
  const Index B = 1, S = 4, N = 2, D = 8;
  std::vector<half> q(z(B * N * D), half(0.5f)), k(z(B * S * N * D), half(0.5f));
  std::vector<half> o(q.size(), half(7.0f));
  std::vector<i8> o8(q.size(), i8{7});
  std::vector<float> three(3, 1.0f);
  const float one = 1.0f;
  attnref::IncreFlashAttentionParams p;
  p.num_heads = N;
  p.input_layout = "BSND";
  attnref::IncreFlashAttentionInputs<half> in;
  in.query = StridedView<const half>(q.data(), {B, 1, N, D});
  in.key = {StridedView<const half>(k.data(), {B, S, N, D})};
  in.value = in.key;
  const attnref::IncreFlashAttentionOutputs<i8> out8{StridedView<i8>(o8.data(), {B, 1, N, D})};
  const attnref::IncreFlashAttentionOutputs<half> out{StridedView<half>(o.data(), {B, 1, N, D})};
  support::expect_throw([&] { attnref::incre_flash_attention(p, in, out8); },
                        "quant_scale2 required for int8 output", false);
  auto wrong = in;
  wrong.quant_scale2 = StridedView<const float>(three.data(), {3});
  support::expect_throw([&] { attnref::incre_flash_attention(p, wrong, out8); },
                        "quant_scale2 required for int8 output: per tensor or per channel", false);
  auto extra = in;
  extra.quant_scale2 = StridedView<const float>(&one, {1});
  support::expect_throw([&] { attnref::incre_flash_attention(p, extra, out); },
                        "quant_scale2 / quant_offset2 given without int8 output", false);
  for (i8 x : o8) EXPECT_EQ(x, 7);
  for (const half& x : o) EXPECT_EQ(static_cast<float>(x), 7.0f);
}

}  // namespace quant_test
