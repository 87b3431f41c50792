// ATB SelfAttention PA_ENCODER against the independent reference (tests/reference).

#include <gtest/gtest.h>

#include <attnref/atb/self_attention.hpp>
#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "reference/atb_self_attention.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"
#include "support/outcome.hpp"
#include "support/simd_levels.hpp"

namespace self_attention_test {

using attnref::Index;
using P = attnref::SelfAttentionParams;

enum class Mask { None, NormBinary, NormAdditive, Causal };

struct Case {
  bool bf16 = false;
  bool high_precision = true;
  Mask mask = Mask::None;
  int group = 1;
  float q_scale = 1.0f;
  bool clamp = false;
  bool log_n = false;
  double value_scale = 1.0;  // magnitude of q and k
  std::vector<int> seq_len{5, 17, 1, 40};
};

struct Result {
  std::vector<double> got, want;
};

template <class T>
Result run_case(const Case& c) {
  const int nkv = 2, nh = nkv * c.group, d = 32, dv = 24;
  int tokens = 0, max_seq = 0;
  for (int l : c.seq_len) {
    tokens += l;
    max_seq = std::max(max_seq, l);
  }
  std::mt19937 rng(1234 + c.group * 7 + static_cast<int>(c.mask));
  std::normal_distribution<double> nd(0.0, 1.0);
  auto fill = [&](std::vector<T>& x, size_t n, double scale) {
    x.resize(n);
    for (auto& e : x) e = T(static_cast<float>(scale * nd(rng)));
  };
  std::vector<T> q, k, v, o(static_cast<size_t>(tokens * nh * dv));
  fill(q, static_cast<size_t>(tokens * nh * d), c.value_scale);
  fill(k, static_cast<size_t>(tokens * nkv * d), c.value_scale);
  fill(v, static_cast<size_t>(tokens * nkv * dv), 1.0);
  const int nb = static_cast<int>(c.seq_len.size());
  // NORM mask [batch, maxSeq, maxSeq]: random pattern plus the causal triangle.
  std::vector<T> mask(static_cast<size_t>(nb * max_seq * max_seq));
  std::uniform_real_distribution<double> ud(0, 1);
  for (int b = 0; b < nb; ++b)
    for (int i = 0; i < max_seq; ++i)
      for (int j = 0; j < max_seq; ++j) {
        const bool hide = j > i || ud(rng) < 0.2;
        mask[static_cast<size_t>((b * max_seq + i) * max_seq + j)] =
            T(hide ? (c.mask == Mask::NormAdditive ? -10000.0f : 1.0f) : 0.0f);
      }
  std::vector<float> log_n(static_cast<size_t>(max_seq));
  for (int i = 0; i < max_seq; ++i)
    log_n[static_cast<size_t>(i)] = 1.0f + 0.05f * static_cast<float>(i % 7);

  P p;
  p.num_heads = nh;
  p.num_kv_heads = nkv;
  p.calc_type = P::CalcType::PaEncoder;
  p.kernel_type = c.high_precision ? P::KernelType::HighPrecision : P::KernelType::Default;
  p.q_scale = c.q_scale;
  p.qk_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  if (c.clamp) {
    p.clamp_type = P::ClampType::MinMax;
    p.clamp_min = -1.5f;
    p.clamp_max = 1.0f;
  }
  if (c.log_n) p.scale_type = P::ScaleType::LogN;
  p.mask_type = c.mask == Mask::None     ? P::MaskType::Undefined
                : c.mask == Mask::Causal ? P::MaskType::CausalMask
                                         : P::MaskType::Norm;
  attnref::SelfAttentionInputs<T> in{attnref::StridedView<const T, 3>(q.data(), {tokens, nh, d}),
                                     attnref::StridedView<const T, 3>(k.data(), {tokens, nkv, d}),
                                     attnref::StridedView<const T, 3>(v.data(), {tokens, nkv, dv}),
                                     std::vector<Index>(c.seq_len.begin(), c.seq_len.end())};
  if (p.mask_type == P::MaskType::Norm)
    in.mask = attnref::StridedView<const T, 3>(mask.data(), {nb, max_seq, max_seq});
  if (c.log_n) in.log_n = attnref::StridedView<const float, 1>(log_n.data(), {max_seq});
  attnref::self_attention(
      p, in,
      attnref::SelfAttentionOutputs<T>{attnref::StridedView<T, 3>(o.data(), {tokens, nh, dv})});

  ref::AtbSelfAttention r;
  r.num_heads = nh;
  r.num_kv_heads = nkv;
  r.head_size = d;
  r.v_head_size = dv;
  r.seq_len = c.seq_len;
  r.q_scale = c.q_scale;
  r.qk_scale = static_cast<double>(p.qk_scale);
  r.fp16_scores = !c.bf16 && !c.high_precision;
  r.clamp = c.clamp;
  r.clamp_min = -1.5;
  r.clamp_max = 1.0;
  if (c.log_n) r.log_n = log_n;
  r.to_dtype = [](double x) {
    return static_cast<double>(static_cast<float>(T(static_cast<float>(x))));
  };
  const bool binary = c.bf16 || c.high_precision;
  if (c.mask == Mask::Causal) r.mask = [](int, int i, int j) { return j > i ? -3e38 : 0.0; };
  if (c.mask == Mask::NormBinary || c.mask == Mask::NormAdditive)
    r.mask = [&mask, max_seq, binary](int b, int i, int j) {
      const double m =
          static_cast<float>(mask[static_cast<size_t>((b * max_seq + i) * max_seq + j)]);
      return binary ? m * -3e38 : m;
    };
  std::vector<std::vector<double>> rq(nb), rk(nb), rv(nb);
  int t0 = 0;
  for (int b = 0; b < nb; ++b) {
    const int l = c.seq_len[static_cast<size_t>(b)];
    for (int t = t0; t < t0 + l; ++t) {
      for (int e = 0; e < nh * d; ++e)
        rq[b].push_back(static_cast<float>(q[static_cast<size_t>(t * nh * d + e)]));
      for (int e = 0; e < nkv * d; ++e)
        rk[b].push_back(static_cast<float>(k[static_cast<size_t>(t * nkv * d + e)]));
      for (int e = 0; e < nkv * dv; ++e)
        rv[b].push_back(static_cast<float>(v[static_cast<size_t>(t * nkv * dv + e)]));
    }
    t0 += l;
  }
  const auto want = ref::atb_self_attention(r, rq, rk, rv);
  Result res;
  for (const auto& w : want) res.want.insert(res.want.end(), w.begin(), w.end());
  for (const T& x : o) res.got.push_back(static_cast<float>(x));
  return res;
}

const char* const kMaskNames[] = {"NoMask", "NormBinary", "NormAdditive", "Causal"};

using Param =
    std::tuple<bool, bool, Mask, int, bool, bool>;  // bf16, HP, mask, group, clamp, qScale

class SelfAttentionPaEncoder : public ::testing::TestWithParam<Param> {};

TEST_P(SelfAttentionPaEncoder, MatchesReference) {
  const auto [bf16, hp, mask, group, clamp, qs] = GetParam();
  if (mask == Mask::NormAdditive && (bf16 || hp)) GTEST_SKIP() << "additive masks: fp16 DEFAULT";
  if (mask == Mask::NormBinary && !bf16 && !hp) GTEST_SKIP() << "binary masks: bf16 or HP";
  Case c;
  c.bf16 = bf16;
  c.high_precision = hp;
  c.mask = mask;
  c.group = group;
  c.clamp = clamp;
  c.q_scale = qs ? 0.5f : 1.0f;
  c.log_n = hp && !bf16 && group == 4;  // logN (PaEncoder needs high precision)
  const Result r = bf16 ? run_case<attnref::bfloat16>(c) : run_case<attnref::half>(c);
  const support::Tolerance tol =
      bf16 ? support::tolerance(support::Kind::BF16) : support::tolerance(support::Kind::F16);
  EXPECT_TRUE(support::all_close(r.want, r.got, tol));
}

INSTANTIATE_TEST_SUITE_P(DtypesKernelsMasks, SelfAttentionPaEncoder,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(),
                                            ::testing::Values(Mask::None, Mask::NormBinary,
                                                              Mask::NormAdditive, Mask::Causal),
                                            ::testing::Values(1, 4), ::testing::Bool(),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "Bf16" : "Fp16") +
                                  (std::get<1>(info.param) ? "HighPrecision" : "Default") +
                                  kMaskNames[static_cast<int>(std::get<2>(info.param))] + "G" +
                                  std::to_string(std::get<3>(info.param)) +
                                  (std::get<4>(info.param) ? "Clamp" : "") +
                                  (std::get<5>(info.param) ? "QScale" : "");
                         });

TEST(SelfAttentionPaEncoder, Fp16OverflowGivesNanInDefaultAndFiniteInHighPrecision) {
  Case c;
  c.value_scale = 200.0;  // |q·k| mostly beyond 65504: some scores are +inf in fp16
  c.seq_len = {6, 9};
  c.high_precision = false;
  const Result def = run_case<attnref::half>(c);
  bool any_nan = false;
  for (double x : def.got) any_nan = any_nan || std::isnan(x);
  EXPECT_TRUE(any_nan) << "fp16 scores overflow on the NPU's DEFAULT path";
  c.high_precision = true;
  const Result hp = run_case<attnref::half>(c);
  for (double x : hp.got) ASSERT_TRUE(std::isfinite(x));
  EXPECT_TRUE(support::all_close(hp.want, hp.got, support::tolerance(support::Kind::F16)));
}

TEST(SelfAttentionPaEncoder, Fp16ScorePathMatchesTheReferenceAtEverySimdLevel) {
  // The DEFAULT path rounds whole score rows to fp16 (SIMD conversions, the same bits at every
  // level); the products around it are the panel kernels at the vector levels and Eigen's GEMM
  // at Portable: every level must match the reference.
  namespace simd = attnref::detail::simd;
  Case c;
  c.high_precision = false;
  c.mask = Mask::NormAdditive;
  c.clamp = true;
  c.value_scale = 3.0;
  c.seq_len = {40, 100, 300};
  support::at_every_level([&] {
    const Result r = run_case<attnref::half>(c);
    EXPECT_TRUE(support::all_close(r.want, r.got, support::tolerance(support::Kind::F16)));
  });
}

TEST(SelfAttentionPaEncoder, CausalMaskEqualsTheBinaryTriangle) {
  // CAUSAL_MASK (generated) and a NORM mask holding only the upper triangle give the same bits.
  using T = attnref::bfloat16;
  const int tokens = 30, nh = 2, d = 16;
  std::vector<T> q(tokens * nh * d), k(q.size()), v(q.size()), o1(q.size()), o2(q.size());
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (auto* x : {&q, &k, &v})
    for (auto& e : *x) e = T(nd(rng));
  std::vector<T> tri(tokens * tokens);
  for (int i = 0; i < tokens; ++i)
    for (int j = 0; j < tokens; ++j)
      tri[static_cast<size_t>(i * tokens + j)] = T(j > i ? 1.0f : 0.0f);
  P p;
  p.num_heads = nh;
  p.calc_type = P::CalcType::PaEncoder;
  attnref::SelfAttentionInputs<T> in{attnref::StridedView<const T, 3>(q.data(), {tokens, nh, d}),
                                     attnref::StridedView<const T, 3>(k.data(), {tokens, nh, d}),
                                     attnref::StridedView<const T, 3>(v.data(), {tokens, nh, d}),
                                     {tokens}};
  p.mask_type = P::MaskType::CausalMask;
  attnref::self_attention(
      p, in,
      attnref::SelfAttentionOutputs<T>{attnref::StridedView<T, 3>(o1.data(), {tokens, nh, d})});
  p.mask_type = P::MaskType::Norm;
  in.mask = attnref::StridedView<const T, 3>(tri.data(), {1, tokens, tokens});
  attnref::self_attention(
      p, in,
      attnref::SelfAttentionOutputs<T>{attnref::StridedView<T, 3>(o2.data(), {tokens, nh, d})});
  for (size_t i = 0; i < o1.size(); ++i)
    ASSERT_EQ(Eigen::numext::bit_cast<std::uint16_t>(o1[i]),
              Eigen::numext::bit_cast<std::uint16_t>(o2[i]))
        << i;
}

TEST(SelfAttentionPaEncoder, FullyMaskedRowIsTheUniformAverageAsOnTheNpu) {
  using T = attnref::bfloat16;
  const int tokens = 7, d = 8;
  std::vector<T> q(tokens * d), k(q.size()), v(q.size()), o(q.size());
  for (int i = 0; i < tokens * d; ++i) {
    q[static_cast<size_t>(i)] = T(0.1f * static_cast<float>(i % 5));
    k[static_cast<size_t>(i)] = T(0.2f * static_cast<float>(i % 3));
    v[static_cast<size_t>(i)] = T(static_cast<float>(i % 11) - 5.0f);
  }
  std::vector<T> mask(tokens * tokens, T(0.0f));
  for (int j = 0; j < tokens; ++j) mask[static_cast<size_t>(3 * tokens + j)] = T(1.0f);  // row 3
  P p;
  p.num_heads = 1;
  p.calc_type = P::CalcType::PaEncoder;
  p.mask_type = P::MaskType::Norm;
  attnref::SelfAttentionInputs<T> in{attnref::StridedView<const T, 3>(q.data(), {tokens, 1, d}),
                                     attnref::StridedView<const T, 3>(k.data(), {tokens, 1, d}),
                                     attnref::StridedView<const T, 3>(v.data(), {tokens, 1, d}),
                                     {tokens}};
  in.mask = attnref::StridedView<const T, 3>(mask.data(), {1, tokens, tokens});
  attnref::self_attention(
      p, in,
      attnref::SelfAttentionOutputs<T>{attnref::StridedView<T, 3>(o.data(), {tokens, 1, d})});
  for (int e = 0; e < d; ++e) {
    double mean = 0;
    for (int j = 0; j < tokens; ++j) mean += static_cast<float>(v[static_cast<size_t>(j * d + e)]);
    mean /= tokens;
    EXPECT_NEAR(static_cast<float>(o[static_cast<size_t>(3 * d + e)]), mean, 1e-2) << e;
  }
}

TEST(SelfAttentionPaEncoder, BadInputIsRejectedBeforeWriting) {
  using T = attnref::half;
  std::vector<T> q(10 * 2 * 8), o(q.size(), T(7.0f));
  P p;
  p.num_heads = 2;
  p.calc_type = P::CalcType::PaEncoder;
  attnref::SelfAttentionInputs<T> in{attnref::StridedView<const T, 3>(q.data(), {10, 2, 8}),
                                     attnref::StridedView<const T, 3>(q.data(), {10, 2, 8}),
                                     attnref::StridedView<const T, 3>(q.data(), {10, 2, 8}),
                                     {4, 5}};
  attnref::SelfAttentionOutputs<T> out{attnref::StridedView<T, 3>(o.data(), {10, 2, 8})};
  auto expect = [&](const std::string& fragment) {
    // validate() runs the same checks alone: the same outcome, nothing written.
    const std::string validated = support::outcome([&] { attnref::validate(p, in, out); });
    for (const T& x : o) ASSERT_EQ(static_cast<float>(x), 7.0f);
    support::expect_rejected([&] { attnref::self_attention(p, in, out); }, fragment);
    for (const T& x : o) ASSERT_EQ(static_cast<float>(x), 7.0f);
    EXPECT_EQ(validated, support::outcome([&] { attnref::self_attention(p, in, out); }));
  };
  expect("seq_len sum mismatch with query.shape[0]: expected 10, got 9");
  in.seq_len = {4, 6};
  p.mask_type = P::MaskType::Norm;
  expect("mask missing for NORM");
  p.mask_type = P::MaskType::Undefined;
  p.scale_type = P::ScaleType::LogN;
  p.kernel_type = P::KernelType::HighPrecision;
  expect("log_n missing for LOGN");
  p.scale_type = P::ScaleType::Tor;
  p.num_heads = 4;
  expect("query.shape[1] mismatch with params.num_heads: expected 4, got 2");
  p.num_heads = 2;
  p.quant_type = P::QuantType::QkvOnline;
  p.out_data_type = P::OutDataType::Float16;
  expect("query/key/value not int8 with qkv full quantization: expected int8");
}

}  // namespace self_attention_test
