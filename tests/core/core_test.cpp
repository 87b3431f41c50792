// Core pieces: views, layouts, the softmax state and merge, the error format, the causal hook.

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/attnref.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "support/simd_levels.hpp"

namespace core_test {

using attnref::Index;

TEST(StridedView, PackedViewHasRowMajorStrides) {
  std::vector<float> buf(2 * 3 * 4);
  auto v = attnref::make_view<3>(buf.data(), {2, 3, 4});
  EXPECT_EQ(v.stride(0), 12);
  EXPECT_EQ(v.stride(1), 4);
  EXPECT_EQ(v.stride(2), 1);
  EXPECT_EQ(v.numel(), 24);
  EXPECT_EQ(&v(1, 2, 3), &buf[23]);
  attnref::StridedView<const float, 3> c = v;  // mutable -> const
  EXPECT_EQ(c.data(), buf.data());
}

TEST(Layout, BnsdViewIndexesHeadMajorMemory) {
  // [B=2, N=3, S=4, D=5]: element (b, s, n, d) lives at ((b*3 + n)*4 + s)*5 + d.
  std::vector<int> buf(2 * 3 * 4 * 5);
  auto v = attnref::bnsd_view(buf.data(), 2, 3, 4, 5);
  for (int b = 0; b < 2; ++b)
    for (int s = 0; s < 4; ++s)
      for (int n = 0; n < 3; ++n)
        for (int d = 0; d < 5; ++d) EXPECT_EQ(v.offset(b, s, n, d), ((b * 3 + n) * 4 + s) * 5 + d);
  auto t = attnref::tnd_view(buf.data(), 6, 4, 5);
  EXPECT_EQ(t.size(0), 1);
  EXPECT_EQ(t.offset(0, 2, 3, 1), (2 * 4 + 3) * 5 + 1);
  auto m = attnref::make_qkv_view(buf.data(), attnref::Layout::BNSD, 2, 4, 3, 5);
  EXPECT_EQ(m.strides(), v.strides());
}

TEST(StridedView, OverlapDetection) {
  std::vector<float> buf(100);
  attnref::StridedView<float, 1> a(buf.data(), {10});
  attnref::StridedView<float, 1> b(buf.data() + 10, {10});
  attnref::StridedView<float, 1> c(buf.data() + 9, {2});
  EXPECT_FALSE(attnref::detail::overlaps(a, b));
  EXPECT_TRUE(attnref::detail::overlaps(a, c));
  EXPECT_TRUE(attnref::detail::overlaps(b, c));
  attnref::StridedView<float, 1> empty;
  EXPECT_FALSE(attnref::detail::overlaps(a, empty));
}

TEST(Softmax, MergeOfTwoHalvesEqualsWhole) {
  std::mt19937 rng(7);
  std::normal_distribution<double> nd(0, 3);
  const int n = 50, d = 3;
  std::vector<double> s(n), v(n * d);
  for (auto& x : s) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  auto partial = [&](int lo, int hi, std::vector<double>& o) {
    attnref::SoftmaxState<double> st;
    for (int j = lo; j < hi; ++j) st.m = std::max(st.m, s[j]);
    o.assign(d, 0.0);
    for (int j = lo; j < hi; ++j) {
      const double p = std::exp(s[j] - st.m);
      st.l += p;
      for (int e = 0; e < d; ++e) o[e] += p * v[j * d + e];
    }
    return st;
  };
  std::vector<double> ow, oa, ob;
  const auto whole = partial(0, n, ow);
  auto a = partial(0, 17, oa);
  const auto b = partial(17, n, ob);
  attnref::merge_partial(a, oa.data(), b, ob.data(), d);
  EXPECT_NEAR(a.lse(), whole.lse(), 1e-12);
  for (int e = 0; e < d; ++e) EXPECT_NEAR(oa[e] * a.inv_l(), ow[e] * whole.inv_l(), 1e-12);
  // Merging with an empty partial changes nothing; an empty state has lse -inf and 1/l = 0.
  attnref::SoftmaxState<double> empty;
  std::vector<double> oe(d, 0.0);
  EXPECT_EQ(empty.lse(), -std::numeric_limits<double>::infinity());
  EXPECT_EQ(empty.inv_l(), 0.0);
  const auto before = a;
  attnref::merge_partial(a, oa.data(), empty, oe.data(), d);
  EXPECT_EQ(a.m, before.m);
  EXPECT_EQ(a.l, before.l);
  attnref::merge_partial(empty, oe.data(), a, oa.data(), d);
  EXPECT_EQ(empty.l, a.l);
}

TEST(Softmax, ExpDiffOfMinusInfinityIsExactlyZero) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(attnref::exp_diff(-inf, -inf), 0.0f);
  EXPECT_EQ(attnref::exp_diff(-inf, 3.0f), 0.0f);
  EXPECT_FLOAT_EQ(attnref::exp_diff(1.0f, 2.0f), std::exp(-1.0f));
  EXPECT_DOUBLE_EQ(attnref::lse_to_base2(std::log(8.0)), 3.0);
  EXPECT_DOUBLE_EQ(attnref::lse_from_base2(3.0), std::log(8.0));
}

TEST(Error, MessageFollowsTheCanonicalFormat) {
  try {
    ATTNREF_CHECK(1 == 2, std::out_of_range, "paged_attention", "block_table[2][5]", "out of range",
                  "[0, 64)", 97);
    FAIL() << "no throw";
  } catch (const std::out_of_range& e) {
    EXPECT_STREQ(e.what(),
                 "attnref::paged_attention: block_table[2][5] out of range: expected [0, 64), "
                 "got 97");
  }
  EXPECT_NO_THROW(ATTNREF_CHECK(true, std::invalid_argument, "f", "a", "w", 1, 2));
}

// The tile classification must agree with the per-position predicate, for every tile.
TEST(CausalHook, ClassificationAgreesWithPredicate) {
  for (auto mode : {attnref::CausalMode::None, attnref::CausalMode::TopLeft,
                    attnref::CausalMode::BottomRight}) {
    attnref::CausalHook hook{mode};
    for (Index ql : {1, 3, 7, 12})
      for (Index kl : {0, 1, 5, 12, 20}) {
        const attnref::SeqInfo s{0, ql, kl};
        for (Index q0 = 0; q0 < ql; ++q0)
          for (Index q1 = q0 + 1; q1 <= ql; ++q1) {
            const auto range = hook.kv_range(s, q0, q1);
            for (Index i = q0; i < q1; ++i)
              for (Index j = 0; j < kl; ++j)
                if (!hook.masked(s, i, j)) {
                  EXPECT_GE(j, range.begin);
                  EXPECT_LT(j, range.end);
                }
            for (Index j0 = 0; j0 < kl; ++j0)
              for (Index j1 = j0 + 1; j1 <= kl; ++j1) {
                const auto tm = hook.classify(s, q0, q1, j0, j1);
                bool any = false, all = true;
                for (Index i = q0; i < q1; ++i)
                  for (Index j = j0; j < j1; ++j) {
                    const bool m = hook.masked(s, i, j);
                    any = any || m;
                    all = all && m;
                  }
                if (tm == attnref::TileMask::None) {
                  EXPECT_FALSE(any);
                }
                if (tm == attnref::TileMask::All) {
                  EXPECT_TRUE(all);
                }
              }
          }
      }
  }
}

TEST(CausalHook, AlignmentDefinitions) {
  const attnref::SeqInfo s{0, 2, 5};  // 2 queries, 5 keys
  attnref::CausalHook tl{attnref::CausalMode::TopLeft};
  attnref::CausalHook br{attnref::CausalMode::BottomRight};
  EXPECT_FALSE(tl.masked(s, 0, 0));
  EXPECT_TRUE(tl.masked(s, 0, 1));
  EXPECT_FALSE(br.masked(s, 0, 3));  // query 0 sees keys 0..3
  EXPECT_TRUE(br.masked(s, 0, 4));
  EXPECT_FALSE(br.masked(s, 1, 4));  // the last query sees every key
}

}  // namespace core_test

namespace core_test {

namespace simd = attnref::detail::simd;
using support::at_every_level;

// Every 16-bit pattern converts to the same float bits as Eigen's scalar conversion; NaNs stay
// NaN (F16C quietens signalling NaNs, so their payload may differ).
template <class T>
void expect_exact_conversion() {
  at_every_level([] {
    std::vector<T> x(65536);
    for (int i = 0; i < 65536; ++i)
      x[static_cast<size_t>(i)] = Eigen::numext::bit_cast<T>(static_cast<std::uint16_t>(i));
    std::vector<float> fast(x.size()), slow(x.size());
    simd::to_float(x.data(), static_cast<Index>(x.size()), fast.data());
    for (size_t i = 0; i < x.size(); ++i) slow[i] = static_cast<float>(x[i]);
    for (size_t i = 0; i < x.size(); ++i) {
      if (std::isnan(slow[i])) {
        ASSERT_TRUE(std::isnan(fast[i])) << "bits 0x" << std::hex << i;
        continue;
      }
      ASSERT_EQ(std::memcmp(&fast[i], &slow[i], sizeof(float)), 0) << "bits 0x" << std::hex << i;
    }
  });
}

TEST(Simd, HalfToFloatIsExactForEveryBitPattern) { expect_exact_conversion<attnref::half>(); }

TEST(Simd, BfloatToFloatIsExactForEveryBitPattern) { expect_exact_conversion<attnref::bfloat16>(); }

// round_to_half gives Eigen's scalar float -> half -> float at every level: a stride through
// all float bit patterns plus the ties, the overflow edge, subnormals, zeros, infinities.
TEST(Simd, RoundToHalfMatchesTheScalarConversion) {
  std::vector<float> x;
  for (std::uint64_t b = 0; b < (1ull << 32); b += 4093)
    x.push_back(Eigen::numext::bit_cast<float>(static_cast<std::uint32_t>(b)));
  for (float v : {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, -65520.0f, 1.0f + 1.0f / 2048,
                  1.0f + 3.0f / 2048, 5.96e-8f, 2.98e-8f, 2.99e-8f, 1e-5f,
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min()})
    x.push_back(v);
  at_every_level([&] {
    std::vector<float> fast = x;
    simd::round_to_half(fast.data(), static_cast<Index>(fast.size()));
    for (size_t i = 0; i < x.size(); ++i) {
      const float slow = static_cast<float>(attnref::half(x[i]));
      if (std::isnan(slow)) {
        ASSERT_TRUE(std::isnan(fast[i])) << x[i];
        continue;
      }
      ASSERT_EQ(std::memcmp(&fast[i], &slow, sizeof(float)), 0)
          << std::hexfloat << x[i] << " -> " << fast[i] << " vs " << slow;
    }
  });
}

// mul_round_to_half gives half(x · a), and with b half(half(x · a) · b), as Eigen's scalar
// conversion does, at every level: values near fp16's ties and overflow edge, a row whose length
// leaves a tail after every vector width.
TEST(Simd, MulRoundToHalfMatchesTheScalarSteps) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-70000.0f, 70000.0f);
  std::vector<float> x(1000 + 13);
  for (float& v : x) v = u(rng);
  x[0] = 65519.99f, x[1] = 1.0f + 1.0f / 2048, x[2] = -0.0f, x[3] = 2.98e-8f;
  for (const auto& [a, b] :
       {std::pair<float, float>{1.0f, 0.0883789f}, {0.000244140625f, 1.5f}, {3.0f, 31.5f}})
    for (bool two : {false, true})
      at_every_level([&] {
        std::vector<float> fast = x;
        simd::mul_round_to_half(fast.data(), static_cast<Index>(fast.size()), a,
                                two ? &b : nullptr);
        for (size_t i = 0; i < x.size(); ++i) {
          float slow = static_cast<float>(attnref::half(x[i] * a));
          if (two) slow = static_cast<float>(attnref::half(slow * b));
          ASSERT_EQ(std::memcmp(&fast[i], &slow, sizeof(float)), 0)
              << x[i] << " a " << a << " b " << b << " two " << two << ": " << fast[i] << " vs "
              << slow;
        }
      });
}

// rint_clamp and half_rint_clamp (the P quantization steps) give the scalar formula's bits at
// every level: quotients and products on both sides of the clamp bounds, exact ties (half to
// even) and values whose fp16 rounding decides the integer, rows with a tail after every width.
TEST(Simd, RintClampStepsMatchTheScalarFormula) {
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> u(-300.0f, 300.0f);
  std::vector<float> x(1000 + 13);
  for (float& v : x) v = u(rng);
  for (int i = 0; i < 40; ++i) x[static_cast<size_t>(i)] = static_cast<float>(i - 20) + 0.5f;
  x[40] = 127.5f, x[41] = -128.5f, x[42] = 100.06f, x[43] = 0.0f, x[44] = -0.0f;
  for (const auto& [d, divide] :
       {std::pair<float, bool>{1.0f, true}, {0.37f, true}, {0.37f, false}, {1.0f / 3.0f, false}})
    for (bool half_first : {false, true})
      at_every_level([&] {
        std::vector<float> fast = x;
        if (half_first)
          simd::half_rint_clamp(fast.data(), static_cast<Index>(fast.size()), d, divide, -128.0f,
                                127.0f);
        else
          simd::rint_clamp(fast.data(), static_cast<Index>(fast.size()), d, divide, -128.0f,
                           127.0f);
        for (size_t i = 0; i < x.size(); ++i) {
          float q = divide ? x[i] / d : x[i] * d;
          if (half_first) q = static_cast<float>(attnref::half(q));
          const float slow = std::min(std::max(std::nearbyint(q), -128.0f), 127.0f);
          ASSERT_EQ(std::memcmp(&fast[i], &slow, sizeof(float)), 0)
              << x[i] << " d " << d << " divide " << divide << " half " << half_first << ": "
              << fast[i] << " vs " << slow;
        }
      });
}

// round_to_bfloat16 gives Eigen's scalar float -> bfloat16 -> float at every level, bit for bit
// (NaNs included: the quiet NaN of the input's sign): a stride through all float bit patterns
// plus the ties, the overflow edge, subnormals, zeros, infinities and signed NaNs.
TEST(Simd, RoundToBfloat16MatchesTheScalarConversion) {
  std::vector<float> x;
  for (std::uint64_t b = 0; b < (1ull << 32); b += 4093)
    x.push_back(Eigen::numext::bit_cast<float>(static_cast<std::uint32_t>(b)));
  for (std::uint32_t b : {0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x7f7f8000u, 0x7f7fffffu,
                          0xff7f8000u, 0x00008000u, 0x00018000u, 0x80000000u, 0x7f800000u,
                          0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u, 0xff812345u})
    x.push_back(Eigen::numext::bit_cast<float>(b));
  at_every_level([&] {
    std::vector<float> fast = x;
    simd::round_to_bfloat16(fast.data(), static_cast<Index>(fast.size()));
    for (size_t i = 0; i < x.size(); ++i) {
      const float slow = static_cast<float>(attnref::bfloat16(x[i]));
      ASSERT_EQ(std::memcmp(&fast[i], &slow, sizeof(float)), 0)
          << std::hexfloat << x[i] << " -> " << fast[i] << " vs " << slow;
    }
  });
}

// The softmax exponential: every vector lane and the scalar tail give the same bits, within
// 2 ulp of exp in double over [-87.33, 0]; exactly 0 below the normal floats and for -inf.
TEST(Simd, SoftmaxExpMatchesDoubleAndTheScalarForm) {
  std::vector<float> x;
  for (float v = -88.5f; v <= 0.0f; v += 0.00731f) x.push_back(v);
  for (float v : {0.0f, -0.0f, -1e-30f, -87.3365f, -87.3366f, -87.34f, -100.0f, -1e30f,
                  -std::numeric_limits<float>::infinity()})
    x.push_back(v);
  at_every_level([&] {
    std::vector<float> e = x;  // exp(x - 0), vector lanes and a scalar tail
    const float sum = attnref::detail::exp_shift_sum(simd::level(), e.data(),
                                                     static_cast<Index>(e.size()), 0.0f, nullptr);
    double want_sum = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double want = std::exp(static_cast<double>(x[i]));
      want_sum += want;
      if (simd::level() == simd::Level::Portable) continue;  // Eigen's exp: near, not ours
      ASSERT_EQ(e[i], simd::exp_nonpositive(x[i])) << std::hexfloat << x[i];
      if (x[i] < simd::expf_consts::kLow) {
        ASSERT_EQ(e[i], 0.0f) << x[i];
        continue;
      }
      ASSERT_LE(std::abs(e[i] - want), 2 * std::numeric_limits<float>::epsilon() * want) << x[i];
    }
    EXPECT_NEAR(sum, want_sum, 1e-5 * want_sum);
    // NaN (an overflowed row's scores) stays NaN, in a vector lane and in the tail alike.
    std::vector<float> n(19, -1.0f);
    n[2] = n[17] = std::numeric_limits<float>::quiet_NaN();
    attnref::detail::exp_shift_sum(simd::level(), n.data(), 19, 0.0f, nullptr);
    EXPECT_TRUE(std::isnan(n[2]) && std::isnan(n[17]) && n[3] == n[18]);
  });
}

// The key panel of the prefill kernels: element d of key c at [(c / W · n + d) · W + c % W],
// zero past the last key, for every width, fp16, bf16 and float keys, and a head size with
// whole blocks and a vector tail. The keys are spread over pages (row_of), and every element
// differs from its neighbours in sign and magnitude.
template <class T>
void check_key_panel() {
  const Index cols = 37, n = 40;
  std::vector<T> k(static_cast<size_t>(cols * n));
  for (size_t i = 0; i < k.size(); ++i)
    k[i] = T(static_cast<float>(i % 997) / 64 * (i % 3 == 0 ? -1.0f : 1.0f));
  // Key c in the page of its parity (pages apart in memory, rows not evenly spaced).
  std::vector<T> pages(static_cast<size_t>(2 * cols * n + 7));
  const auto row_of = [&](Index c) {
    return pages.data() + (c % 2) * (cols * n + 7) + (c / 2) * n;
  };
  for (Index c = 0; c < cols; ++c) std::copy_n(k.data() + c * n, n, row_of(c));
  const auto check = [&](auto vec) {
    constexpr Index W = decltype(vec)::kWidth;
    const Index blocks = (cols + W - 1) / W;
    std::vector<float> panel(static_cast<size_t>(blocks * n * W), -1.0f);
    simd::pack_keys<decltype(vec)>([&](Index c) { return static_cast<const T*>(row_of(c)); }, cols,
                                   n, panel.data());
    for (Index c = 0; c < blocks * W; ++c)
      for (Index d = 0; d < n; ++d)
        ASSERT_EQ(panel[static_cast<size_t>((c / W * n + d) * W + c % W)],
                  c < cols ? static_cast<float>(k[static_cast<size_t>(c * n + d)]) : 0.0f)
            << "width " << W << " key " << c << " element " << d;
  };
  at_every_level([&] { simd::with_vector(simd::level(), check); });
}

TEST(Simd, KeyPanelIsTheTransposeInBlocksOfOneVector) {
  check_key_panel<attnref::half>();
  check_key_panel<attnref::bfloat16>();
  check_key_panel<float>();
}

// The lane score kernel (the rows of q in the vector lanes, keys converted but not packed) gives
// the bits of the packed panel kernel for every row count up to the width, a key count with a
// partial last block, head sizes with and without a vector tail, keys spread over pages and
// starting at a column offset; scores past the last key are 0, rows past `rows` untouched, and
// every score is within float rounding of the double-precision sum.
template <class T>
void check_lane_scores() {
  namespace kn = attnref::detail::kernels;
  for (const Index n : {Index{40}, Index{48}, Index{3}}) {
    const Index c0 = 5, cols = 37, all = c0 + cols;
    std::mt19937 rng(static_cast<unsigned>(n));
    std::normal_distribution<float> nd;
    std::vector<T> pages(static_cast<size_t>(2 * all * n + 7));
    for (T& x : pages) x = T(nd(rng));
    std::vector<const T*> row(static_cast<size_t>(all));
    for (Index c = 0; c < all; ++c)
      row[static_cast<size_t>(c)] = pages.data() + (c % 2) * (all * n + 7) + (c / 2) * n;
    const kn::TileRows<T> keys{row.data(), 0, nullptr, 0};
    std::vector<float> q(static_cast<size_t>(16 * n));
    for (float& x : q) x = nd(rng);
    const auto check = [&](auto vec) {
      constexpr Index W = decltype(vec)::kWidth;
      const Index lds = 64, padded = (cols + W - 1) / W * W;
      std::vector<float> panel(static_cast<size_t>(padded * n)),
          buf(static_cast<size_t>(kn::lane_buffer(n)));
      std::vector<const T*> shifted(row.begin() + c0, row.end());
      kn::pack_key_panel(simd::level(), kn::TileRows<T>{shifted.data(), 0, nullptr, 0}, 0, cols, n,
                         panel.data());
      for (Index rows = 1; rows <= W; ++rows) {
        std::vector<float> want(static_cast<size_t>(W * lds), -7.0f), got = want;
        kn::panel_scores(simd::level(), q.data(), n, rows, panel.data(), cols, n, want.data(), lds);
        kn::lane_scores(simd::level(), q.data(), n, rows, keys, 0, c0, cols, n, buf.data(),
                        got.data(), lds);
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
            << "width " << W << " rows " << rows << " n " << n;
        for (Index r = 0; r < W; ++r)
          for (Index c = 0; c < padded; ++c) {
            const float s = got[static_cast<size_t>(r * lds + c)];
            if (r >= rows || c >= cols) {
              ASSERT_EQ(s, r >= rows ? -7.0f : 0.0f) << "row " << r << " column " << c;
              continue;
            }
            double exact = 0, mag = 0;
            for (Index d = 0; d < n; ++d) {
              const double x =
                  q[static_cast<size_t>(r * n + d)] *
                  static_cast<double>(static_cast<float>(row[static_cast<size_t>(c0 + c)][d]));
              exact += x, mag += std::abs(x);
            }
            ASSERT_NEAR(s, exact, 1e-6 * mag + 1e-30) << "row " << r << " column " << c;
          }
      }
    };
    at_every_level([&] { simd::with_vector(simd::level(), check); });
  }
}

TEST(Simd, LaneScoresGiveThePanelKernelsBits) {
  check_lane_scores<attnref::half>();
  check_lane_scores<attnref::bfloat16>();
  check_lane_scores<float>();
}

// The panel kernels' fetch-ahead stream visits every cache line of each row's byte range once,
// row after row in order (a line is the 64-byte block holding an address), then stops: rows at
// every alignment, one ending on a line boundary, a range inside one line, and an empty stream.
TEST(Simd, LineStreamWalksEachRowsLinesOnceInOrder) {
  alignas(64) static char buf[4096];
  // (the range of buf + 55 ends on a line boundary, at byte 128)
  const char* rows[] = {buf + 5, buf + 1000, buf + 130, buf + 2047, buf + 64, buf + 55};
  const Index count = 6, offset = 3, bytes = 70;
  std::vector<std::uintptr_t> want;
  for (const char* r : rows) {
    const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(r + offset);
    for (std::uintptr_t line = a / 64 * 64; line < a + bytes; line += 64) want.push_back(line);
  }
  simd::LineStream s(rows, count, offset, bytes);
  std::vector<std::uintptr_t> got;
  for (int i = 0; i < 100; ++i) {  // far more steps than lines: the extra ones do nothing
    if (s.r < s.count) got.push_back(s.at);
    s.step();
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(s.r, count);
  const char* one[] = {buf + 10};
  simd::LineStream inside(one, 1, 0, 20);  // bytes 10..29: a single line
  EXPECT_EQ(inside.at, reinterpret_cast<std::uintptr_t>(buf));
  inside.step();
  EXPECT_EQ(inside.r, 1);
  simd::LineStream empty(rows, count, 0, 0), none;
  empty.step(), none.step();
  EXPECT_EQ(empty.count, 0);
  EXPECT_EQ(none.r, 0);
}

TEST(Simd, LevelIsClampedToTheCompiledOneAndRestorable) {
  const simd::Level previous = simd::set_level(simd::Level::Portable);
  EXPECT_FALSE(simd::enabled());
  EXPECT_EQ(simd::set_level(simd::Level::Avx512), simd::Level::Portable);
  EXPECT_EQ(simd::level(), simd::compiled_level());
  simd::set_level(previous);
  EXPECT_EQ(simd::level(), previous);
}

TEST(Simd, PublicLevelApiSelectsClampsAndRestores) {
  const attnref::SimdLevel outer = attnref::simd_level();
  {
    attnref::ScopedSimdLevel portable(attnref::SimdLevel::Portable);
    EXPECT_EQ(attnref::simd_level(), attnref::SimdLevel::Portable);
    EXPECT_FALSE(simd::enabled());
    EXPECT_EQ(attnref::set_simd_level(attnref::SimdLevel::Avx512), attnref::SimdLevel::Portable);
    EXPECT_EQ(attnref::simd_level(), attnref::compiled_simd_level());  // clamped
  }
  EXPECT_EQ(attnref::simd_level(), outer);  // the scope restored the level it found
  EXPECT_STREQ(attnref::to_string(attnref::SimdLevel::Avx2), "avx2");
}

}  // namespace core_test
