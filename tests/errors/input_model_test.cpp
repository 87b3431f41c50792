// Bad input at the edge of every operator (issue #18): null data, negative extents, sizes past
// 64 bits, messages naming the operator and its own argument, and the huge-scale rule. Each case
// was a crash, UB or a silent wrong answer once; each must now be a clear rejection (or, for the
// scale, a defined result) with the outputs untouched.

#include <gtest/gtest.h>

#include <attnref/attnref.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "reference/naive_attention.hpp"
#include "support/views.hpp"

namespace input_model_test {

using attnref::Index;
using attnref::StridedView;

constexpr Index kHuge = Index(1) << 33;

// Runs f, which must throw Exception whose message starts with "attnref::<fn>: " and contains
// every fragment.
template <class Exception, class F>
void expect_reject(F&& f, const std::string& fn, const std::vector<std::string>& fragments) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected attnref::" << fn;
  } catch (const Exception& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("attnref::" + fn + ": ", 0), 0u) << msg;
    for (const std::string& frag : fragments) EXPECT_NE(msg.find(frag), std::string::npos) << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

bool all_equal(const std::vector<float>& x, float v) {
  for (float e : x)
    if (!(e == v)) return false;
  return true;
}

// ---- views and size arithmetic ------------------------------------------------------------

TEST(InputModel, DenseViewOfNegativeOrOverflowingShapeIsRejected) {
  float x = 0;
  expect_reject<std::invalid_argument>(
      [&] {
        (void)StridedView<float, 2>(&x, {-1, 4});
      },
      "StridedView", {"shape[0]", "negative"});
  expect_reject<std::invalid_argument>(
      [&] {
        (void)StridedView<float, 3>(&x, {kHuge, kHuge, kHuge});
      },
      "StridedView", {"size overflows"});
  expect_reject<std::invalid_argument>([&] { (void)attnref::bsnd_view(&x, kHuge, kHuge, 4, 8); },
                                       "bsnd_view", {"size overflows"});
  expect_reject<std::invalid_argument>([&] { (void)attnref::tnd_view(&x, 3, -2, 8); }, "tnd_view",
                                       {"shape[2]", "negative"});
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
    expect_reject<std::invalid_argument>([&] { attnref::attention(s.in, s.p, s.out); }, "attention",
                                         {"q.shape", "size overflows"});
    EXPECT_TRUE(all_equal(s.o, 7));
  }
  {
    Small s;  // strides whose span overflows
    s.in.k = StridedView<const float, 4>(s.k.data(), {2, 5, 1, 8}, {Index(1) << 62, 8, 8, 1});
    expect_reject<std::invalid_argument>([&] { attnref::attention(s.in, s.p, s.out); }, "attention",
                                         {"k memory span", "size overflows"});
  }
  {
    Small s;  // a block table of {B, 2^62}: more entries than 64 bits count
    const std::int32_t ids[2] = {0, 1};
    s.in.block_table = StridedView<const std::int32_t, 2>(ids, {2, Index(1) << 62}, {0, 0});
    s.in.seq.kv = {1, 1};
    expect_reject<std::invalid_argument>([&] { attnref::attention(s.in, s.p, s.out); }, "attention",
                                         {"block_table.shape", "size overflows"});
  }
  {
    Small s;  // {B, 2^61} entries fit, but times the block size they do not
    const std::int32_t ids[2] = {0, 1};
    s.in.block_table = StridedView<const std::int32_t, 2>(ids, {2, Index(1) << 61}, {0, 0});
    s.in.seq.kv = {1, 1};
    expect_reject<std::invalid_argument>([&] { attnref::attention(s.in, s.p, s.out); }, "attention",
                                         {"block_table.shape[1] * block_size"});
    EXPECT_TRUE(all_equal(s.o, 7));
  }
  {
    Small s;
    s.in.mask_bool = StridedView<const std::uint8_t, 4>(nullptr, {1, 1, 4, 5});
    expect_reject<std::invalid_argument>([&] { attnref::attention(s.in, s.p, s.out); }, "attention",
                                         {"mask_bool", "data is null"});
  }
  {
    Small s;
    s.in.q = StridedView<const float, 4>(s.q.data(), {2, -4, 1, 8}, {32, 8, 8, 1});
    expect_reject<std::invalid_argument>([&] { attnref::attention(s.in, s.p, s.out); }, "attention",
                                         {"q.shape[1]", "negative"});
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
  p.kv_tile = kv_tile;
  attnref::AttentionOutputs<float> out;
  out.o = attnref::bsnd_view(o.data(), 1, q_len, N, Dv);
  out.lse = StridedView<float, 3>(lse.data(), {1, N, q_len});
  attnref::attention<Acc>(in, p, out);

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
    expect_reject<std::invalid_argument>([&] { attnref::reshape_and_cache(in, kc); },
                                         "reshape_and_cache", {"slot_mapping", "data is null"});
  }
  {
    auto in = inputs();
    in.key = StridedView<const float, 3>(nullptr, {3, 2, 4});
    expect_reject<std::invalid_argument>([&] { attnref::reshape_and_cache(in, kc); },
                                         "reshape_and_cache", {"key", "data is null"});
  }
  {
    auto in = inputs();  // numTokens -2
    in.key = StridedView<const float, 3>(key.data(), {-2, 2, 4}, {8, 4, 1});
    in.slot_mapping = StridedView<const std::int32_t, 1>(slots.data(), {-2}, {1});
    expect_reject<std::invalid_argument>([&] { attnref::reshape_and_cache(in, kc); },
                                         "reshape_and_cache", {"key.shape[0]", "negative"});
  }
  {
    auto in = inputs();  // numBlocks * blockSize past 2^63 (a broadcast cache view)
    const StridedView<float, 4> huge(cache.data(), {Index(1) << 40, Index(1) << 40, 2, 4},
                                     {0, 0, 4, 1});
    expect_reject<std::invalid_argument>([&] { attnref::reshape_and_cache_nz(in, huge); },
                                         "reshape_and_cache_nz", {"size overflows"});
    expect_reject<std::invalid_argument>([&] { attnref::reshape_and_cache(in, huge); },
                                         "reshape_and_cache", {"size overflows"});
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
    expect_reject<std::invalid_argument>([&] { attnref::paged_attention(s.p, s.in, s.out()); },
                                         "paged_attention", {"block_tables", "data is null"});
    EXPECT_TRUE(all_equal(s.o, 7.0f));
  }
  {
    Paged s;  // a wrong output shape is named as the output's, not value_cache's
    std::vector<float> o2(2 * 2 * 12);
    expect_reject<std::invalid_argument>(
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
    expect_reject<std::invalid_argument>(
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
  expect_reject<std::invalid_argument>(
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
  expect_reject<std::invalid_argument>(
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
    expect_reject<std::invalid_argument>([&] { run(bad); }, "prompt_flash_attention",
                                         {"query.shape[0]", "negative"});
  }
  {
    auto bad = in;
    const std::uint8_t m = 0;
    bad.atten_mask = StridedView<const std::uint8_t>(&m, {kHuge, kHuge});
    expect_reject<std::invalid_argument>([&] { run(bad); }, "prompt_flash_attention",
                                         {"atten_mask.shape", "size overflows"});
  }
  {
    auto bad = in;
    const half ps(0.0f);
    bad.pse_shift = StridedView<const half>(&ps, {1, 2, Index(1) << 40, Index(1) << 40});
    expect_reject<std::invalid_argument>([&] { run(bad); }, "prompt_flash_attention",
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
  expect_reject<std::invalid_argument>([&] { attnref::mla_preprocess<half>(p, in, out, 1); },
                                       "mla_preprocess",
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
    expect_reject<std::invalid_argument>(run, "prompt_flash_attention",
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
  EXPECT_NO_THROW(attnref::mla_decode(p, in, o));
  std::fill(out.begin(), out.end(), 7.0f);
  {
    auto bad_p = p;
    bad_p.kv_lora_rank = std::numeric_limits<Index>::max();
    expect_reject<std::invalid_argument>([&] { attnref::mla_decode(bad_p, in, o); }, "mla_decode",
                                         {"kv_lora_rank + rope_dim", "size overflows"});
  }
  {
    auto bad = in;
    bad.kv_cache = StridedView<const float>(nullptr, {2, 4, 1, 8});
    expect_reject<std::invalid_argument>([&] { attnref::mla_decode(p, bad, o); }, "mla_decode",
                                         {"kv_cache", "data is null"});
  }
  {
    auto bad = in;
    bad.block_table = StridedView<const std::int32_t>(table.data(), {1, Index(1) << 61});
    expect_reject<std::invalid_argument>([&] { attnref::mla_decode(p, bad, o); }, "mla_decode",
                                         {"size overflows"});
  }
  EXPECT_TRUE(all_equal(out, 7.0f));
}

// ---- found by the fuzz entries of NSA and of ATB SelfAttention's modes ----------------------

// A one-batch TND decode step: N = KV_N = 1, D 16, sel 64 raw tokens (one page of 64), l 32 /
// d 16 / l' 64 (3 compressed tokens, one page of 16), k 1, window 4.
struct NsaStep {
  static constexpr Index D = 16;
  std::vector<float> q = std::vector<float>(D, 0.5f), k = std::vector<float>(64 * D, 0.1f),
                     v = std::vector<float>(64 * D, 1.0f), kc = std::vector<float>(16 * D, 0.1f),
                     vc = std::vector<float>(16 * D, 2.0f), gates{0.25f, 0.25f, 0.5f},
                     out = std::vector<float>(D, 7.0f);
  std::vector<std::int32_t> bt{0}, cbt{0};
  attnref::NsaDecodeParams p;
  attnref::NsaDecodeInputs<float> in;
  NsaStep() {
    p.compress_block_size = 32, p.compress_block_stride = 16, p.select_block_size = 64;
    p.select_block_count = 1, p.window_size = 4, p.page_block_size = 64;
    p.cmp_page_block_size = 16, p.strict = false;
    in.query = StridedView<const float>(q.data(), {1, 1, D});
    in.key = StridedView<const float>(k.data(), {1, 64, D});
    in.value = StridedView<const float>(v.data(), {1, 64, D});
    in.block_table = StridedView<const std::int32_t>(bt.data(), {1, 1});
    in.cmp_key = StridedView<const float>(kc.data(), {1, 16, D});
    in.cmp_value = StridedView<const float>(vc.data(), {1, 16, D});
    in.cmp_block_table = StridedView<const std::int32_t>(cbt.data(), {1, 1});
    in.gates = StridedView<const float>(gates.data(), {1, 1, 3});
    in.actual_sel_kv_seq_len = {64};
  }
  void run(const attnref::NsaDecodeParams& pp, const attnref::NsaDecodeInputs<float>& ii) {
    attnref::nsa_decode_step<float>(pp, ii, {StridedView<float>(out.data(), {1, 1, D})});
  }
};

TEST(InputModel, NsaDecodeStepRejectionsNameTheStep) {
  // The branch operators' rejections came out under their own names; now under the step's,
  // with the branch after the argument.
  NsaStep s;
  EXPECT_NO_THROW(s.run(s.p, s.in));
  std::fill(s.out.begin(), s.out.end(), 7.0f);
  s.bt[0] = 5;
  expect_reject<std::out_of_range>(
      [&] { s.run(s.p, s.in); }, "nsa_decode_step",
      {"block_table[0][0] out of range (in nsa_selected_attention_infer): expected [0, 1)"});
  s.bt[0] = 0;
  auto p = s.p;
  p.compress_block_size = 24;  // d 16 divides neither l nor l'
  expect_reject<std::invalid_argument>([&] { s.run(p, s.in); }, "nsa_decode_step",
                                       {"params.compress_block_stride", "nsa_compress_attention"});
  // The compressed table's width times its page size past 64 bits: was signed overflow.
  // (The table is really 128 entries wide: a view claiming more memory than it has would
  // overlap the output, a rejection of its own.)
  auto in = s.in;
  p = s.p;
  p.cmp_page_block_size = Index(1) << 56;
  const std::vector<std::int32_t> wide_table(128, 0);
  in.cmp_key = support::reshaped(in.cmp_key, {0, Index(1) << 56, 16});
  in.cmp_value = support::reshaped(in.cmp_value, {0, Index(1) << 56, 16});
  in.cmp_block_table = StridedView<const std::int32_t>(wide_table.data(), {1, 128});
  expect_reject<std::invalid_argument>([&] { s.run(p, in); }, "nsa_decode_step",
                                       {"cmp_block_table.shape[1] * cmp_page_block_size"});
  // BSND with a raw key that is not [numBlocks, pbs, KV_N * D]: its shape was read past its end.
  p = s.p;
  p.layout = "BSND";
  in = s.in;
  in.query = support::reshaped(in.query, {1, 1, 1, 16});
  in.key = support::reshaped(in.key, {64 * 16});
  const attnref::NsaDecodeOutputs<float> o{StridedView<float>(s.out.data(), {1, 1, 1, 16})};
  expect_reject<std::invalid_argument>([&] { attnref::nsa_decode_step<float>(p, in, o); },
                                       "nsa_decode_step", {"key.shape"});
  in.key = {};
  expect_reject<std::invalid_argument>([&] { attnref::nsa_decode_step<float>(p, in, o); },
                                       "nsa_decode_step", {"key.shape"});
  EXPECT_TRUE(all_equal(s.out, 7.0f));
  // The window branch on its own named the engine ("attention") for a bad block table entry.
  s.bt[0] = -1;
  expect_reject<std::out_of_range>(
      [&] {
        attnref::nsa_sliding_window_attention<float>(s.p, s.in,
                                                     StridedView<float>(s.out.data(), {1, 1, 16}));
      },
      "nsa_sliding_window_attention", {"block_table[0][0]"});
  EXPECT_TRUE(all_equal(s.out, 7.0f));
}

TEST(InputModel, NsaCompressAttentionAndGatedSumOutputsMustNotAliasInputs) {
  // Both wrote over their inputs without a word; now rejected before any write.
  constexpr Index D = 16;
  std::vector<float> q(D, 0.5f), kc(16 * D, 0.1f), vc(16 * D, 2.0f), out(D, 7.0f);
  std::vector<std::int32_t> topk(1, 9), bt{0};
  attnref::NsaCompressAttentionInferParams p;
  p.select_block_count = 1, p.page_block_size = 16, p.strict = false;
  attnref::NsaCompressAttentionInferInputs<float> in;
  in.query = StridedView<const float>(q.data(), {1, 1, D});
  in.key = StridedView<const float>(kc.data(), {1, 16, D});
  in.value = StridedView<const float>(vc.data(), {1, 16, D});
  in.block_table = StridedView<const std::int32_t>(bt.data(), {1, 1});
  in.actual_cmp_kv_seq_len = {3};
  const attnref::NsaCompressAttentionInferOutputs<float> ok{
      StridedView<float>(out.data(), {1, 1, D}), StridedView<std::int32_t>(topk.data(), {1, 1, 1})};
  EXPECT_NO_THROW(attnref::nsa_compress_attention_infer(p, in, ok));
  std::fill(out.begin(), out.end(), 7.0f);
  topk[0] = 9;
  const std::vector<float> kc0 = kc, vc0 = vc;
  // output over the values the branch reads, probs over the query.
  attnref::NsaCompressAttentionInferOutputs<float> bad = ok;
  bad.output = StridedView<float>(vc.data() + D, {1, 1, D});
  expect_reject<std::invalid_argument>([&] { attnref::nsa_compress_attention_infer(p, in, bad); },
                                       "nsa_compress_attention_infer",
                                       {"output overlaps an input"});
  bad = ok;
  bad.probs = StridedView<float>(q.data(), {1, 1, 3});
  expect_reject<std::invalid_argument>([&] { attnref::nsa_compress_attention_infer(p, in, bad); },
                                       "nsa_compress_attention_infer", {"probs overlaps an input"});
  bad = ok;
  bad.head_scores = StridedView<float>(out.data(), {1, 1, 1});
  expect_reject<std::invalid_argument>([&] { attnref::nsa_compress_attention_infer(p, in, bad); },
                                       "nsa_compress_attention_infer",
                                       {"output overlaps head_scores"});
  EXPECT_TRUE(all_equal(out, 7.0f));
  EXPECT_EQ(kc, kc0);
  EXPECT_EQ(vc, vc0);
  EXPECT_EQ(topk[0], 9);
  // The gated sum: out shifted by one element over a branch output.
  std::vector<float> gates{0.25f, 0.25f, 0.5f}, a(D + 1, 1.0f), b(D, 2.0f), c(D, 3.0f);
  const std::vector<float> a0 = a;
  auto gated = [&](float* o) {
    attnref::nsa_gated_sum<float>(StridedView<const float>(gates.data(), {1, 1, 3}),
                                  StridedView<const float>(a.data(), {1, 1, D}),
                                  StridedView<const float>(b.data(), {1, 1, D}),
                                  StridedView<const float>(c.data(), {1, 1, D}),
                                  StridedView<float>(o, {1, 1, D}));
  };
  expect_reject<std::invalid_argument>([&] { gated(a.data() + 1); }, "nsa_gated_sum",
                                       {"out overlaps an input", "the memory of o_cmp"});
  EXPECT_EQ(a, a0);
  std::vector<float> o(D, 7.0f);
  EXPECT_NO_THROW(gated(o.data()));
  EXPECT_FLOAT_EQ(o[0], 0.25f * 1 + 0.25f * 2 + 0.5f * 3);
}

TEST(InputModel, NsaSelectedEmptyCacheHugeSelectBlockAndTableWidth) {
  attnref::NsaSelectedAttentionInferParams p;
  p.strict = false, p.layout = "TND", p.select_block_size = 4, p.select_block_count = 1;
  p.page_block_size = 4;
  std::vector<float> q(2, 0.5f), o(2, 7.0f), k(4 * 2), v(4 * 2);
  for (size_t i = 0; i < k.size(); ++i) k[i] = 0.1f * static_cast<float>(i), v[i] = k[i] - 1.0f;
  std::vector<std::int32_t> bt{-1}, topk{-1};
  attnref::NsaSelectedAttentionInferInputs<float> in;
  in.query = StridedView<const float>(q.data(), {1, 1, 2});
  in.key = StridedView<const float>(nullptr, {0, 4, 2});  // an empty pool: null data is fine
  in.value = StridedView<const float>(nullptr, {0, 4, 2});
  in.block_table = StridedView<const std::int32_t>(bt.data(), {1, 1});
  in.topk_indices = StridedView<const std::int32_t>(topk.data(), {1, 1, 1});
  in.actual_sel_kv_seq_len = {0};
  const attnref::NsaSelectedAttentionInferOutputs<float> out{
      StridedView<float>(o.data(), {1, 1, 2})};
  // Nothing to select from an empty cache: output 0 (was rejected by the engine, as
  // "attnref::attention_with: k data is null").
  EXPECT_NO_THROW(attnref::nsa_selected_attention_infer<float>(p, in, out));
  EXPECT_TRUE(all_equal(o, 0.0f));
  // block_table.size(1) * page_block_size past 64 bits: was signed overflow, then accepted.
  std::fill(o.begin(), o.end(), 7.0f);
  // (2^58 · 32 = 2^63 with a table really 32 entries wide.)
  auto wide = in;
  auto pw = p;
  pw.page_block_size = Index(1) << 58;
  const std::vector<std::int32_t> wide_table(32, -1);
  wide.key = support::reshaped(wide.key, {0, Index(1) << 58, 2});
  wide.value = support::reshaped(wide.value, {0, Index(1) << 58, 2});
  wide.block_table = StridedView<const std::int32_t>(wide_table.data(), {1, 32});
  expect_reject<std::invalid_argument>(
      [&] { attnref::nsa_selected_attention_infer<float>(pw, wide, out); },
      "nsa_selected_attention_infer", {"block_table.shape[1] * page_block_size", "size overflows"});
  EXPECT_TRUE(all_equal(o, 7.0f));
  // A select block longer than every length: one block holds them all (its count was
  // (sel + l' - 1) / l', signed overflow at l' = 2^63 - 1).
  bt[0] = 0, topk[0] = 0;
  in.key = StridedView<const float>(k.data(), {1, 4, 2});
  in.value = StridedView<const float>(v.data(), {1, 4, 2});
  in.actual_sel_kv_seq_len = {3};
  attnref::nsa_selected_attention_infer<float>(p, in, out);
  const std::vector<float> want = o;
  p.select_block_size = std::numeric_limits<Index>::max();
  std::fill(o.begin(), o.end(), 7.0f);
  attnref::nsa_selected_attention_infer<float>(p, in, out);
  for (size_t i = 0; i < o.size(); ++i) EXPECT_NEAR(o[i], want[i], 1e-6) << i;
  // The compressed branch had the same overflow in block_table.size(1) * page_block_size.
  attnref::NsaCompressAttentionInferParams cp;
  cp.strict = false, cp.select_block_size = 4, cp.select_block_count = 1;
  cp.compress_block_size = 4, cp.compress_block_stride = 4, cp.page_block_size = Index(1) << 58;
  attnref::NsaCompressAttentionInferInputs<float> ci;
  ci.query = in.query;
  ci.key = ci.value = StridedView<const float>(nullptr, {0, Index(1) << 58, 2});
  ci.block_table = wide.block_table;
  ci.actual_cmp_kv_seq_len = {0};
  std::vector<std::int32_t> tk{9};
  std::fill(o.begin(), o.end(), 7.0f);
  expect_reject<std::invalid_argument>(
      [&] {
        attnref::nsa_compress_attention_infer<float>(
            cp, ci,
            {StridedView<float>(o.data(), {1, 1, 2}),
             StridedView<std::int32_t>(tk.data(), {1, 1, 1})});
      },
      "nsa_compress_attention_infer", {"block_table.shape[1] * page_block_size", "size overflows"});
  EXPECT_TRUE(all_equal(o, 7.0f));
  EXPECT_EQ(tk[0], 9);
}

TEST(InputModel, SelfAttentionWrittenCachesMustNotAliasInputs) {
  // DECODER writes the new token into the caches before attending: a cache over the query or
  // the value, or the two caches over each other, were accepted (and the inputs overwritten).
  using P = attnref::SelfAttentionParams;
  P p;
  p.num_heads = 1, p.calc_type = P::CalcType::Decoder, p.kernel_type = P::KernelType::HighPrecision;
  std::vector<float> q(4, 0.5f), k(4, 1.0f), v(4, 2.0f), kc(16, 0.25f), vc(16, 0.75f), o(4, 7.0f);
  attnref::SelfAttentionInputs<float> in;
  in.query = StridedView<const float, 3>(q.data(), {1, 1, 4});
  in.key = StridedView<const float, 3>(k.data(), {1, 1, 4});
  in.value = StridedView<const float, 3>(v.data(), {1, 1, 4});
  in.seq_len = {1}, in.token_offset = {2};
  attnref::SelfAttentionOutputs<float> out{StridedView<float, 3>(o.data(), {1, 1, 4}),
                                           StridedView<float, 4>(kc.data(), {1, 1, 4, 4}),
                                           StridedView<float, 4>(vc.data(), {1, 1, 4, 4})};
  const std::vector<float> kc0 = kc, vc0 = vc;
  {
    auto bad = in;
    bad.query = StridedView<const float, 3>(kc.data() + 4, {1, 1, 4});  // row 1: written
    expect_reject<std::invalid_argument>([&] { attnref::self_attention(p, bad, out); },
                                         "self_attention",
                                         {"key_cache overlaps an input", "query"});
  }
  {
    auto bad = in;
    bad.value = StridedView<const float, 3>(vc.data(), {1, 1, 4});
    expect_reject<std::invalid_argument>([&] { attnref::self_attention(p, bad, out); },
                                         "self_attention",
                                         {"value_cache overlaps an input", "value"});
  }
  {
    auto bad = out;
    bad.value_cache = StridedView<float, 4>(kc.data(), {1, 1, 4, 4});
    expect_reject<std::invalid_argument>([&] { attnref::self_attention(p, in, bad); },
                                         "self_attention", {"value_cache overlaps key_cache"});
  }
  EXPECT_TRUE(all_equal(o, 7.0f));
  EXPECT_EQ(kc, kc0);
  EXPECT_EQ(vc, vc0);
  // With kv-bypass nothing is written: a query inside the (read-only) key cache is fine.
  p.kvcache_cfg = P::KvCacheCfg::KBypassVBypass;
  auto ro = in;
  ro.query = StridedView<const float, 3>(kc.data() + 4, {1, 1, 4});
  ro.key = {}, ro.value = {};
  EXPECT_NO_THROW(attnref::self_attention(p, ro, out));
  EXPECT_NEAR(o[0], 0.75f, 1e-6);
}

TEST(InputModel, SelfAttentionPrefixPagedCacheNamesItsArguments) {
  // PREFIX_ENCODER left its block tables and kv_seq_len to the engine, whose messages named
  // attnref::attention and its own arguments (block_table, seq.kv).
  using P = attnref::SelfAttentionParams;
  P p;
  p.num_heads = 1, p.calc_type = P::CalcType::PrefixEncoder, p.mask_type = P::MaskType::CausalMask;
  p.is_triu_mask = 1, p.kernel_type = P::KernelType::HighPrecision;
  std::vector<float> q(16, 0.5f), kc(2 * 2 * 16, 0.25f), vc(kc.size(), 1.0f), o(16, 7.0f);
  std::vector<std::int32_t> table{1, 0};
  attnref::SelfAttentionInputs<float> in;
  in.query = StridedView<const float, 3>(q.data(), {1, 1, 16});
  in.key = StridedView<const float, 3>(kc.data(), {2, 2, 16});
  in.value = StridedView<const float, 3>(vc.data(), {2, 2, 16});
  in.block_tables = StridedView<const std::int32_t, 2>(table.data(), {1, 2});
  in.seq_len = {1}, in.kv_seq_len = {3};
  const attnref::SelfAttentionOutputs<float> out{StridedView<float, 3>(o.data(), {1, 1, 16})};
  EXPECT_NO_THROW(attnref::self_attention(p, in, out));
  std::fill(o.begin(), o.end(), 7.0f);
  table[1] = 2;
  expect_reject<std::out_of_range>([&] { attnref::self_attention(p, in, out); }, "self_attention",
                                   {"block_tables[0][1] out of range: expected [0, 2), got 2"});
  table[1] = 0;
  auto bad = in;
  bad.kv_seq_len = {5};
  expect_reject<std::invalid_argument>([&] { attnref::self_attention(p, bad, out); },
                                       "self_attention", {"kv_seq_len[0] exceeds", "<= 4"});
  bad = in;
  bad.block_tables = StridedView<const std::int32_t, 2>(table.data(), {2, 1});
  expect_reject<std::invalid_argument>([&] { attnref::self_attention(p, bad, out); },
                                       "self_attention", {"block_tables.shape[0]"});
  bad = in;
  bad.key = StridedView<const float, 3>(kc.data(), {2, 0, 16});
  bad.value = StridedView<const float, 3>(vc.data(), {2, 0, 16});
  expect_reject<std::invalid_argument>([&] { attnref::self_attention(p, bad, out); },
                                       "self_attention", {"blockSize", "not positive"});
  EXPECT_TRUE(all_equal(o, 7.0f));
}

}  // namespace input_model_test
