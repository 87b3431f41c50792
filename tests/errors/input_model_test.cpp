// Bad input at the edge of every operator (issue #18): null data, negative extents, sizes past
// 64 bits, messages naming the operator and its own argument, and the huge-scale rule. Each case
// was a crash, UB or a silent wrong answer once; each must now be a clear rejection (or, for the
// scale, a defined result) with the outputs untouched. (The cases the fuzz entries of NSA and of
// ATB SelfAttention's modes found: input_model_nsa_sa_test.cpp.)

#include <gtest/gtest.h>

#include <attnref/attnref.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "errors/input_model_support.hpp"
#include "reference/naive_attention.hpp"
#include "support/errors.hpp"
#include "support/views.hpp"

namespace input_model_test {

using namespace input_model_support;
using attnref::StridedView;

// ---- views and size arithmetic ------------------------------------------------------------

TEST(InputModel, DenseViewOfNegativeOrOverflowingShapeIsRejected) {
  float x = 0;
  support::expect_rejected_by<std::invalid_argument>(
      [&] {
        (void)StridedView<float, 2>(&x, {-1, 4});
      },
      "StridedView", {"shape[0]", "negative"});
  support::expect_rejected_by<std::invalid_argument>(
      [&] {
        (void)StridedView<float, 3>(&x, {kHuge, kHuge, kHuge});
      },
      "StridedView", {"size overflows"});
  support::expect_rejected_by<std::invalid_argument>(
      [&] { (void)attnref::bsnd_view(&x, kHuge, kHuge, 4, 8); }, "bsnd_view", {"size overflows"});
  support::expect_rejected_by<std::invalid_argument>([&] { (void)attnref::tnd_view(&x, 3, -2, 8); },
                                                     "tnd_view", {"shape[2]", "negative"});
  // numel of a view built with explicit strides is checked too.
  const StridedView<float, 3> big(&x, {kHuge, kHuge, kHuge}, {0, 0, 0});
  EXPECT_THROW((void)big.numel(), std::invalid_argument);
  EXPECT_EQ((StridedView<float, 3>(&x, {kHuge, 0, kHuge}, {0, 0, 0}).numel()), 0);
}

TEST(InputModel, CheckedArithmetic) {
  const Index max = std::numeric_limits<Index>::max();
  EXPECT_EQ(attnref::detail::checked_mul("f", "a", Index(1) << 31, Index(1) << 31), Index(1) << 62);
  EXPECT_THROW(attnref::detail::checked_mul("f", "a", Index(1) << 32, Index(1) << 31),
               std::invalid_argument);
  EXPECT_THROW(attnref::detail::checked_add("f", "a", max, 1), std::invalid_argument);
  EXPECT_EQ(attnref::detail::checked_add("f", "a", max - 1, 1), max);
}

// ---- attention ----------------------------------------------------------------------------

struct Small {
  std::vector<float> q = std::vector<float>(2 * 4 * 8, 0.5f), k = std::vector<float>(2 * 5 * 8),
                     v = std::vector<float>(2 * 5 * 8, 1.0f), o = std::vector<float>(2 * 4 * 8, 7);
  attnref::AttentionInputs<float> in;
  attnref::AttentionParams p;
  attnref::AttentionOutputs<float> out;
  Small() {
    in.q = attnref::bsnd_view<const float>(q.data(), 2, 4, 1, 8);
    in.k = attnref::bsnd_view<const float>(k.data(), 2, 5, 1, 8);
    in.v = attnref::bsnd_view<const float>(v.data(), 2, 5, 1, 8);
    out.o = attnref::bsnd_view(o.data(), 2, 4, 1, 8);
  }
};

TEST(InputModel, AttentionRejectsHugeAndNullViews) {
  {
    Small s;  // a q view claiming 2^99 elements through explicit strides
    s.in.q = StridedView<const float, 4>(s.q.data(), {kHuge, kHuge, kHuge, 8}, {0, 0, 0, 1});
    support::expect_rejected_by<std::invalid_argument>(
        [&] { attnref::attention(s.in, s.p, s.out); }, "attention", {"q.shape", "size overflows"});
    EXPECT_TRUE(all_equal(s.o, 7));
  }
  {
    Small s;  // strides whose span overflows
    s.in.k = StridedView<const float, 4>(s.k.data(), {2, 5, 1, 8}, {Index(1) << 62, 8, 8, 1});
    support::expect_rejected_by<std::invalid_argument>(
        [&] { attnref::attention(s.in, s.p, s.out); }, "attention",
        {"k memory span", "size overflows"});
  }
  {
    Small s;  // a block table of {B, 2^62}: more entries than 64 bits count
    const std::int32_t ids[2] = {0, 1};
    s.in.block_table = StridedView<const std::int32_t, 2>(ids, {2, Index(1) << 62}, {0, 0});
    s.in.seq.kv = {1, 1};
    support::expect_rejected_by<std::invalid_argument>(
        [&] { attnref::attention(s.in, s.p, s.out); }, "attention",
        {"block_table.shape", "size overflows"});
  }
  {
    Small s;  // {B, 2^61} entries fit, but times the block size they do not
    const std::int32_t ids[2] = {0, 1};
    s.in.block_table = StridedView<const std::int32_t, 2>(ids, {2, Index(1) << 61}, {0, 0});
    s.in.seq.kv = {1, 1};
    support::expect_rejected_by<std::invalid_argument>(
        [&] { attnref::attention(s.in, s.p, s.out); }, "attention",
        {"block_table.shape[1] * block_size"});
    EXPECT_TRUE(all_equal(s.o, 7));
  }
  {
    Small s;
    s.in.mask_bool = StridedView<const std::uint8_t, 4>(nullptr, {1, 1, 4, 5});
    support::expect_rejected_by<std::invalid_argument>(
        [&] { attnref::attention(s.in, s.p, s.out); }, "attention", {"mask_bool", "data is null"});
  }
  {
    Small s;
    s.in.q = StridedView<const float, 4>(s.q.data(), {2, -4, 1, 8}, {32, 8, 8, 1});
    support::expect_rejected_by<std::invalid_argument>(
        [&] { attnref::attention(s.in, s.p, s.out); }, "attention", {"q.shape[1]", "negative"});
  }
}

// ---- the huge-scale rule ------------------------------------------------------------------
// A score that overflows the compute type is -inf, +inf or NaN. Rule: when a row has at least one
// finite visible score the overflowed -inf ones contribute 0 (their exact limit) and the row is
// right; otherwise (every visible score -inf / NaN, or a +inf one) the row is NaN, LSE NaN. Never
// the zero row of a masked one. Checked against the double reference, whose logits do not
// overflow.

template <class Acc>
void check_huge_scale(double scale, Index q_len, Index kv_tile, bool must_be_finite) {
  const int N = 2, D = 16, Dv = 8, L = 37;
  std::mt19937 rng(static_cast<unsigned>(q_len * 131 + kv_tile));
  std::normal_distribution<float> nd;
  std::vector<float> q(static_cast<size_t>(q_len * N * D)), k(static_cast<size_t>(L * D)),
      v(static_cast<size_t>(L * Dv));
  for (float& x : q) x = nd(rng);
  for (float& x : k) x = nd(rng);
  for (float& x : v) x = nd(rng);
  std::vector<float> o(static_cast<size_t>(q_len * N * Dv), 7.0f),
      lse(static_cast<size_t>(N * q_len));
  attnref::AttentionInputs<float> in;
  in.q = attnref::bsnd_view<const float>(q.data(), 1, q_len, N, D);
  in.k = attnref::bsnd_view<const float>(k.data(), 1, L, 1, D);
  in.v = attnref::bsnd_view<const float>(v.data(), 1, L, 1, Dv);
  attnref::AttentionParams p;
  p.scale = scale;
  attnref::ExecConfig x;
  x.kv_tile = kv_tile;
  attnref::AttentionOutputs<float> out;
  out.o = attnref::bsnd_view(o.data(), 1, q_len, N, Dv);
  out.lse = StridedView<float, 3>(lse.data(), {1, N, q_len});
  attnref::attention<Acc>(in, p, out, x);

  ref::Problem pr;
  pr.num_heads = N;
  pr.head_size = D;
  pr.v_head_size = Dv;
  pr.q_len = {static_cast<int>(q_len)};
  pr.kv_len = {L};
  pr.scale = scale;
  const ref::Result want = ref::attention(pr, {std::vector<double>(q.begin(), q.end())},
                                          {std::vector<double>(k.begin(), k.end())},
                                          {std::vector<double>(v.begin(), v.end())});
  int nan_rows = 0;
  for (Index i = 0; i < q_len; ++i)
    for (int h = 0; h < N; ++h) {
      const float* row = &o[static_cast<size_t>((i * N + h) * Dv)];
      bool nan = std::isnan(row[0]), zero = true;
      for (int e = 0; e < Dv; ++e) {
        EXPECT_EQ(std::isnan(row[e]), nan) << "a row is either NaN or a number throughout";
        zero = zero && row[e] == 0.0f;
      }
      EXPECT_FALSE(zero) << "silent zero row at scale " << scale;
      if (nan) {
        ++nan_rows;
        EXPECT_TRUE(std::isnan(lse[static_cast<size_t>(h * q_len + i)]));
        continue;
      }
      for (int e = 0; e < Dv; ++e) {
        EXPECT_NEAR(row[e], want.o[0][static_cast<size_t>((i * N + h) * Dv + e)], 1e-5)
            << "scale " << scale << " row " << i << " head " << h;
      }
    }
  if (must_be_finite) {
    EXPECT_EQ(nan_rows, 0) << "scale " << scale;
  }
}

TEST(InputModel, HugeScalesGiveTheLimitOrNaN) {
  for (Index q_len : {1, 5})         // the small-row decode path and the GEMM path
    for (Index kv_tile : {8, 64}) {  // the overflow confined to some tiles, or one tile
      for (double s : {1e30, -1e30, 1e33}) check_huge_scale<float>(s, q_len, kv_tile, true);
      for (double s : {1e38, -1e38, 3e38, 1e300, -1e300})
        check_huge_scale<float>(s, q_len, kv_tile, false);
      for (double s : {1e300, -1e300}) check_huge_scale<double>(s, q_len, kv_tile, true);
    }
}

TEST(InputModel, AllScoresOverflowingGivesNaNNotZero) {
  // Every logit is -inf in float (q·k > 0, scale -1e300 -> -inf): the zero row of a masked row
  // would be a silent wrong answer; the row is NaN.
  std::vector<float> q(8, 1.0f), k(3 * 8, 1.0f), v(3 * 8, 2.0f), o(8, 7.0f), lse(1, 7.0f);
  attnref::AttentionInputs<float> in;
  in.q = attnref::bsnd_view<const float>(q.data(), 1, 1, 1, 8);
  in.k = attnref::bsnd_view<const float>(k.data(), 1, 3, 1, 8);
  in.v = attnref::bsnd_view<const float>(v.data(), 1, 3, 1, 8);
  attnref::AttentionParams p;
  p.scale = -1e300;
  attnref::AttentionOutputs<float> out;
  out.o = attnref::bsnd_view(o.data(), 1, 1, 1, 8);
  out.lse = StridedView<float, 3>(lse.data(), {1, 1, 1});
  attnref::attention(in, p, out);
  for (float x : o) EXPECT_TRUE(std::isnan(x));
  EXPECT_TRUE(std::isnan(lse[0]));
  // A fully masked row stays the documented zero row with LSE -inf.
  p.scale = 1.0;
  p.causal = attnref::CausalMode::BottomRight;
  in.seq.kv = {0};
  attnref::attention(in, p, out);
  for (float x : o) EXPECT_EQ(x, 0.0f);
  EXPECT_EQ(lse[0], -std::numeric_limits<float>::infinity());
}

// ---- ReshapeAndCache ----------------------------------------------------------------------

TEST(InputModel, ReshapeAndCacheNullNegativeAndOverflow) {
  std::vector<float> key(3 * 2 * 4, 1.0f), cache(4 * 2 * 2 * 4, 9.0f);
  const std::vector<std::int32_t> slots{0, 3, 5};
  const StridedView<float, 4> kc(cache.data(), {4, 2, 2, 4});
  auto inputs = [&] {
    attnref::ReshapeAndCacheInputs<float> in;
    in.key = StridedView<const float, 3>(key.data(), {3, 2, 4});
    in.slot_mapping = StridedView<const std::int32_t, 1>(slots.data(), {3});
    return in;
  };
  {
    auto in = inputs();
    in.slot_mapping = StridedView<const std::int32_t, 1>(nullptr, {3});
    support::expect_rejected_by<std::invalid_argument>([&] { attnref::reshape_and_cache(in, kc); },
                                                       "reshape_and_cache",
                                                       {"slot_mapping", "data is null"});
  }
  {
    auto in = inputs();
    in.key = StridedView<const float, 3>(nullptr, {3, 2, 4});
    support::expect_rejected_by<std::invalid_argument>(
        [&] { attnref::reshape_and_cache(in, kc); }, "reshape_and_cache", {"key", "data is null"});
  }
  {
    auto in = inputs();  // numTokens -2
    in.key = StridedView<const float, 3>(key.data(), {-2, 2, 4}, {8, 4, 1});
    in.slot_mapping = StridedView<const std::int32_t, 1>(slots.data(), {-2}, {1});
    support::expect_rejected_by<std::invalid_argument>([&] { attnref::reshape_and_cache(in, kc); },
                                                       "reshape_and_cache",
                                                       {"key.shape[0]", "negative"});
  }
  {
    auto in = inputs();  // numBlocks * blockSize past 2^63 (a broadcast cache view)
    const StridedView<float, 4> huge(cache.data(), {Index(1) << 40, Index(1) << 40, 2, 4},
                                     {0, 0, 4, 1});
    support::expect_rejected_by<std::invalid_argument>(
        [&] { attnref::reshape_and_cache_nz(in, huge); }, "reshape_and_cache_nz",
        {"size overflows"});
    support::expect_rejected_by<std::invalid_argument>(
        [&] { attnref::reshape_and_cache(in, huge); }, "reshape_and_cache", {"size overflows"});
  }
  EXPECT_TRUE(all_equal(cache, 9.0f));
}

// ---- PagedAttention -----------------------------------------------------------------------

struct Paged {
  std::vector<float> q = std::vector<float>(2 * 2 * 16, 0.25f),
                     kc = std::vector<float>(4 * 4 * 1 * 16, 0.5f),
                     vc = std::vector<float>(4 * 4 * 1 * 16, 1.0f),
                     o = std::vector<float>(2 * 2 * 16, 7.0f);
  std::vector<std::int32_t> table{0, -1, 1, 2};
  attnref::PagedAttentionParams p;
  attnref::PagedAttentionInputs<float> in;
  Paged() {
    p.num_heads = 2;
    p.num_kv_heads = 1;
    p.qk_scale = 0.25f;
    in.query = StridedView<const float, 3>(q.data(), {2, 2, 16});
    in.key_cache = StridedView<const float, 4>(kc.data(), {4, 4, 1, 16});
    in.value_cache = StridedView<const float, 4>(vc.data(), {4, 4, 1, 16});
    in.block_tables = StridedView<const std::int32_t, 2>(table.data(), {2, 2});
    in.context_lens = {3, 5};
  }
  attnref::PagedAttentionOutputs<float> out(Index dv = 16) {
    return {StridedView<float, 3>(o.data(), {2, 2, dv})};
  }
};

TEST(InputModel, PagedAttentionNullTableAndNamedShapes) {
  {
    Paged s;
    EXPECT_NO_THROW(attnref::paged_attention(s.p, s.in, s.out()));
    EXPECT_FALSE(all_equal(s.o, 7.0f));
  }
  {
    Paged s;
    s.in.block_tables = StridedView<const std::int32_t, 2>(nullptr, {2, 2});
    support::expect_rejected_by<std::invalid_argument>(
        [&] { attnref::paged_attention(s.p, s.in, s.out()); }, "paged_attention",
        {"block_tables", "data is null"});
    EXPECT_TRUE(all_equal(s.o, 7.0f));
  }
  {
    Paged s;  // a wrong output shape is named as the output's, not value_cache's
    std::vector<float> o2(2 * 2 * 12);
    support::expect_rejected_by<std::invalid_argument>(
        [&] {
          attnref::paged_attention(
              s.p, s.in,
              attnref::PagedAttentionOutputs<float>{StridedView<float, 3>(o2.data(), {2, 2, 12})});
        },
        "paged_attention", {"out.shape", "[2, 2, 16]", "[2, 2, 12]"});
  }
  {
    Paged s;  // MLA: V wider than K is named as params.mla_v_head_size
    s.p.mla_v_head_size = 17;
    s.in.value_cache = {};
    std::vector<float> o2(2 * 2 * 17);
    support::expect_rejected_by<std::invalid_argument>(
        [&] {
          attnref::paged_attention(
              s.p, s.in,
              attnref::PagedAttentionOutputs<float>{StridedView<float, 3>(o2.data(), {2, 2, 17})});
        },
        "paged_attention", {"params.mla_v_head_size", "<= 16", "got 17"});
  }
}

TEST(InputModel, OutputOverlapsNameTheOperator) {
  // Found by the fuzz harness: the overlap surfaced from the engine as attnref::attention's 'o'.
  Paged s;
  support::expect_rejected_by<std::invalid_argument>(
      [&] {
        attnref::paged_attention(
            s.p, s.in,
            attnref::PagedAttentionOutputs<float>{StridedView<float, 3>(s.kc.data(), {2, 2, 16})});
      },
      "paged_attention", {"out overlaps an input", "key_cache"});
  // ... and nsa_compress wrote its output over its input without a word.
  std::vector<float> x(40 * 16, 1.0f), w(8, 0.5f);
  attnref::NsaCompressParams p;
  p.strict = false;
  p.compress_block_size = 8;
  p.compress_stride = 8;
  support::expect_rejected_by<std::invalid_argument>(
      [&] {
        attnref::nsa_compress<float>(p, StridedView<const float>(x.data(), {40, 1, 16}),
                                     StridedView<const float>(w.data(), {8, 1}), {40},
                                     StridedView<float>(x.data() + 16, {5, 1, 16}));
      },
      "nsa_compress", {"output", "overlaps an input"});
  EXPECT_TRUE(all_equal(x, 1.0f));
}

// ---- CANN, MLA, NSA (TensorRef inputs) ------------------------------------------------------

TEST(InputModel, PromptFlashAttentionNegativeBatchAndHugeMask) {
  using attnref::half;
  std::vector<half> q(2 * 4 * 2 * 16, half(0.5f)), o(q.size(), half(7.0f));
  attnref::PromptFlashAttentionParams p;
  p.num_heads = 2;
  p.input_layout = "BSND";
  auto run = [&](const attnref::PromptFlashAttentionInputs<half>& in) {
    attnref::prompt_flash_attention(
        p, in,
        attnref::PromptFlashAttentionOutputs<half>{StridedView<half>(o.data(), {2, 4, 2, 16})});
  };
  attnref::PromptFlashAttentionInputs<half> in;
  in.query = StridedView<const half>(q.data(), {2, 4, 2, 16});
  in.key = in.query;
  in.value = in.query;
  EXPECT_NO_THROW(run(in));
  std::fill(o.begin(), o.end(), half(7.0f));
  {
    auto bad = in;  // a negative batch was a std::length_error from a vector constructor
    bad.query = StridedView<const half>(q.data(), {-2, 4, 2, 16});
    support::expect_rejected_by<std::invalid_argument>([&] { run(bad); }, "prompt_flash_attention",
                                                       {"query.shape[0]", "negative"});
  }
  {
    auto bad = in;
    const std::uint8_t m = 0;
    bad.atten_mask = StridedView<const std::uint8_t>(&m, {kHuge, kHuge});
    support::expect_rejected_by<std::invalid_argument>([&] { run(bad); }, "prompt_flash_attention",
                                                       {"atten_mask.shape", "size overflows"});
  }
  {
    auto bad = in;
    const half ps(0.0f);
    bad.pse_shift = StridedView<const half>(&ps, {1, 2, Index(1) << 40, Index(1) << 40});
    support::expect_rejected_by<std::invalid_argument>([&] { run(bad); }, "prompt_flash_attention",
                                                       {"pse_shift.shape", "size overflows"});
  }
  for (const half& x : o) EXPECT_EQ(static_cast<float>(x), 7.0f);
}

TEST(InputModel, MlaPreprocessHiddenSizePastTheInt8MatmulLimitIsNamed) {
  // Found by the mla_preprocess fuzz entry's author: H0 = 65537 passed mla_preprocess's checks
  // and was refused inside the computation as "a.shape[1] ... (in int8_matmul)".
  using attnref::half;
  const Index N = 1, H0 = 65537, C = 16, R = 2, Q = 1, P = 1, NH = 1, W1 = C + R + Q;
  const Index W2 = NH * (P + R);
  std::vector<half> input(N * H0, half(0.5f)), g0(H0, half(1.f)), g1(Q, half(1.f)),
      g2(C, half(1.f)), sn(N * R, half(0.f)), cs(N * R, half(1.f)), wuk(NH * P * C, half(0.1f)),
      q_out(N * NH * (C + R), half(-9.f)), kv(4 * (C + R), half(-9.f));
  std::vector<std::int8_t> wdqkv(W1 * H0, 1), wuq(W2 * Q, 1);
  std::vector<float> ds0(W1, 1e-3f), ds1(W2, 1e-3f);
  std::vector<std::int32_t> slots{0};
  attnref::MlaPreprocessParams p;
  p.dims = {H0, C, R, Q, P};
  p.quant_mode = attnref::MlaQuantMode::PerTokenSymm;
  attnref::MlaPreprocessInputs<half> in;
  in.input = StridedView<const half>(input.data(), {N, H0});
  in.gamma0 = StridedView<const half>(g0.data(), {H0});
  in.gamma1 = StridedView<const half>(g1.data(), {Q});
  in.gamma2 = StridedView<const half>(g2.data(), {C});
  in.sin = StridedView<const half>(sn.data(), {N, R});
  in.cos = StridedView<const half>(cs.data(), {N, R});
  in.wuk = {StridedView<const half>(wuk.data(), {NH, P, C}), false};
  in.slot_mapping = StridedView<const std::int32_t>(slots.data(), {N});
  in.wdqkv = {StridedView<const std::int8_t>(wdqkv.data(), {W1, H0}), W1, H0};
  in.wuq = {StridedView<const std::int8_t>(wuq.data(), {W2, Q}), W2, Q};
  in.de_scale0 = StridedView<const float>(ds0.data(), {W1});
  in.de_scale1 = StridedView<const float>(ds1.data(), {W2});
  attnref::MlaPreprocessOutputs<half> out;
  out.q_out = StridedView<half>(q_out.data(), {N, NH, C + R});
  out.caches.kv_cache = StridedView<half>(kv.data(), {1, 4, 1, C + R});
  support::expect_rejected_by<std::invalid_argument>(
      [&] { attnref::mla_preprocess<half>(p, in, out, {1}); }, "mla_preprocess",
      {"params.dims too large for the int8 matmuls", "H0 65537"});
  for (const half& x : q_out) EXPECT_EQ(static_cast<float>(x), -9.0f);
}

TEST(InputModel, PfaInt8OutputOfNaNIsZeroAndNonFiniteQuantScale2IsRejected) {
  // Found by the int8 fuzz entries' author: the int8 output cast NaN to int8 (undefined
  // behaviour; UBSan's float-cast-overflow) for a NaN in V or a NaN / inf quant_scale2.
  using attnref::half;
  const Index B = 1, S = 2, N = 1, D = 4;
  std::vector<half> q(B * S * N * D, half(0.5f)), k(q), v(q);
  v[0] = half(std::numeric_limits<float>::quiet_NaN());  // key 0's value, seen by every row
  attnref::PromptFlashAttentionParams p;
  p.num_heads = N, p.input_layout = "BSND";
  attnref::PromptFlashAttentionInputs<half> in;
  in.query = StridedView<const half>(q.data(), {B, S, N, D});
  in.key = StridedView<const half>(k.data(), {B, S, N, D});
  in.value = StridedView<const half>(v.data(), {B, S, N, D});
  float qs2 = 10.0f;
  in.quant_scale2 = StridedView<const float>(&qs2, {1});
  std::vector<std::int8_t> o(q.size(), 7);
  auto run = [&] {
    attnref::prompt_flash_attention(p, in,
                                    attnref::PromptFlashAttentionOutputs<std::int8_t>{
                                        StridedView<std::int8_t>(o.data(), {B, S, N, D})});
  };
  run();
  for (Index s = 0; s < S; ++s) {
    EXPECT_EQ(o[static_cast<size_t>(s * D)], 0) << "NaN quantizes to 0";
    EXPECT_EQ(o[static_cast<size_t>(s * D + 1)], 5) << "0.5 * 10";
  }
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    qs2 = bad;
    std::fill(o.begin(), o.end(), std::int8_t{7});
    support::expect_rejected_by<std::invalid_argument>(run, "prompt_flash_attention",
                                                       {"quant_scale2[0] not finite"});
    for (std::int8_t x : o) EXPECT_EQ(x, 7);
  }
}

TEST(InputModel, MlaDecodeOverflowingWidthAndNullCache) {
  std::vector<float> q(1 * 2 * 8), cache(2 * 4 * 8), out(1 * 2 * 6, 7.0f);
  const std::vector<std::int32_t> table{0, 1};
  attnref::MlaDecodeParams p;
  p.kv_lora_rank = 6;
  p.rope_dim = 2;
  attnref::MlaDecodeInputs<float> in;
  in.q = StridedView<const float>(q.data(), {1, 2, 8});
  in.kv_cache = StridedView<const float>(cache.data(), {2, 4, 1, 8});
  in.block_table = StridedView<const std::int32_t>(table.data(), {1, 2});
  in.context_lens = {5};
  const StridedView<float> o(out.data(), {1, 2, 6});
  EXPECT_NO_THROW(attnref::mla_decode(p, in, {o}));
  std::fill(out.begin(), out.end(), 7.0f);
  {
    auto bad_p = p;
    bad_p.kv_lora_rank = std::numeric_limits<Index>::max();
    support::expect_rejected_by<std::invalid_argument>(
        [&] { attnref::mla_decode(bad_p, in, {o}); }, "mla_decode",
        {"kv_lora_rank + rope_dim", "size overflows"});
  }
  {
    auto bad = in;
    bad.kv_cache = StridedView<const float>(nullptr, {2, 4, 1, 8});
    support::expect_rejected_by<std::invalid_argument>([&] { attnref::mla_decode(p, bad, {o}); },
                                                       "mla_decode", {"kv_cache", "data is null"});
  }
  {
    auto bad = in;
    bad.block_table = StridedView<const std::int32_t>(table.data(), {1, Index(1) << 61});
    support::expect_rejected_by<std::invalid_argument>([&] { attnref::mla_decode(p, bad, {o}); },
                                                       "mla_decode", {"size overflows"});
  }
  EXPECT_TRUE(all_equal(out, 7.0f));
}

}  // namespace input_model_test
