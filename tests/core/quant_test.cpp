// The int8 quantization toolkit: rounding and saturation, scale selection for every
// granularity, quantize / dequantize round trips, fp32 scales as 64-bit bit patterns, and the
// exact int32 dot product at every SIMD level.

#include <gtest/gtest.h>

#include <attnref/core/quant.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "support/errors.hpp"
#include "support/random.hpp"
#include "support/simd_levels.hpp"

namespace quant_test {

using attnref::Index;
using attnref::QuantGranularity;
using attnref::StridedView;
namespace simd = attnref::detail::simd;
using support::at_every_level;

TEST(Quant, RoundsHalfToEvenAndSaturates) {
  struct Case {
    double x;
    int want;
  };
  for (const Case& c : {Case{0.5, 0}, Case{1.5, 2}, Case{2.5, 2}, Case{-0.5, 0}, Case{-1.5, -2},
                        Case{-2.5, -2}, Case{126.5, 126}, Case{127.5, 127}, Case{1e9, 127},
                        Case{-128.5, -128}, Case{-1e9, -128}, Case{3.49, 3}, Case{-3.51, -4}})
    EXPECT_EQ(attnref::saturate_i8(c.x), c.want) << c.x;
  EXPECT_EQ(attnref::saturate_i8(std::nan("")), 0);
  EXPECT_EQ(attnref::saturate_i8(std::numeric_limits<double>::infinity()), 127);
  // x / scale + offset, then the rounding: 1.25 / 0.5 = 2.5 -> 2; + offset 3 -> 5.5 -> 6.
  EXPECT_EQ(attnref::quantize_value(1.25f, 0.5f), 2);
  EXPECT_EQ(attnref::quantize_value(1.75f, 0.5f), 4);
  EXPECT_EQ(attnref::quantize_value(1.25f, 0.5f, 3.0f), 6);
}

TEST(Quant, ScalesTravelAsFp32BitPatterns) {
  for (float s : {1.0f, 0.0078125f, 3.3e-5f, 1234.5f, -2.0f}) {
    const std::uint64_t bits = attnref::scale_to_bits(s);
    EXPECT_LT(bits, 1ull << 32);
    EXPECT_EQ(attnref::scale_from_bits(bits), s);
    EXPECT_EQ(attnref::scale_from_bits(static_cast<std::int64_t>(bits)), s);
    EXPECT_EQ(attnref::scale_from_bits(static_cast<std::uint64_t>(bits | 0xabcd000000000000ull)), s)
        << "high bits ignored";
  }
  EXPECT_EQ(attnref::scale_to_bits(1.0f), 0x3f800000u);
}

std::vector<float> random_matrix(Index rows, Index cols, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.3f, 2.0f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (auto& e : x) e = nd(rng);
  return x;
}

TEST(Quant, RoundTripsWithinHalfAStepForEveryGranularity) {
  const Index rows = 37, cols = 19;
  const auto x = random_matrix(rows, cols, 3);
  const StridedView<const float, 2> xv(x.data(), {rows, cols});
  for (auto g :
       {QuantGranularity::PerTensor, QuantGranularity::PerChannel, QuantGranularity::PerToken})
    for (bool sym : {true, false}) {
      const attnref::QuantScales s = attnref::choose_scales(xv, g, sym);
      const Index n = g == QuantGranularity::PerTensor    ? 1
                      : g == QuantGranularity::PerChannel ? cols
                                                          : rows;
      ASSERT_EQ(static_cast<Index>(s.scale.size()), n);
      ASSERT_EQ(s.offset.empty(), sym);
      std::vector<std::int8_t> q(x.size());
      std::vector<float> back(x.size());
      attnref::quantize(xv, s, StridedView<std::int8_t, 2>(q.data(), {rows, cols}));
      attnref::dequantize(StridedView<const std::int8_t, 2>(q.data(), {rows, cols}), s,
                          StridedView<float, 2>(back.data(), {rows, cols}));
      // Every group uses its range: its extreme value lands on +-127 (symmetric) or on -128 and
      // 127 (asymmetric), and every value comes back within half a step.
      std::vector<int> qmin(static_cast<size_t>(n), 127), qmax(static_cast<size_t>(n), -128);
      for (Index r = 0; r < rows; ++r)
        for (Index c = 0; c < cols; ++c) {
          const size_t i = static_cast<size_t>(r * cols + c);
          const Index k = s.index(r, c);
          ASSERT_LE(std::abs(back[i] - x[i]), 0.5f * s.scale_at(r, c) * (1 + 1e-5f))
              << r << "," << c;
          qmin[static_cast<size_t>(k)] = std::min<int>(qmin[static_cast<size_t>(k)], q[i]);
          qmax[static_cast<size_t>(k)] = std::max<int>(qmax[static_cast<size_t>(k)], q[i]);
        }
      for (Index k = 0; k < n; ++k) {
        if (sym) {
          EXPECT_TRUE(qmin[static_cast<size_t>(k)] == -127 || qmax[static_cast<size_t>(k)] == 127);
        } else {
          EXPECT_EQ(qmin[static_cast<size_t>(k)], -128);
          EXPECT_EQ(qmax[static_cast<size_t>(k)], 127);
        }
      }
    }
}

TEST(Quant, AllZeroGroupsGetUnitScale) {
  std::vector<float> z(12, 0.0f);
  const auto s = attnref::choose_scales(StridedView<const float, 2>(z.data(), {3, 4}),
                                        QuantGranularity::PerToken, true);
  for (float x : s.scale) EXPECT_EQ(x, 1.0f);
}

TEST(Quant, BadScalesAreRejected) {
  std::vector<float> x(6, 1.0f);
  std::vector<std::int8_t> q(6, 5);
  const StridedView<const float, 2> xv(x.data(), {2, 3});
  attnref::QuantScales s;
  s.granularity = QuantGranularity::PerChannel;
  s.scale = {1.0f, 2.0f};
  support::expect_rejected(
      [&] {
        attnref::quantize(xv, s, StridedView<std::int8_t, 2>(q.data(), {2, 3}));
      },
      "attnref::quantize: scales.scale size mismatch: expected 3, got 2");
  s.scale = {1.0f, 0.0f, 1.0f};
  EXPECT_THROW(attnref::quantize(xv, s, StridedView<std::int8_t, 2>(q.data(), {2, 3})),
               std::invalid_argument);
  s.scale = {1.0f, 1.0f, 1.0f};
  s.offset = {0.0f};
  EXPECT_THROW(attnref::quantize(xv, s, StridedView<std::int8_t, 2>(q.data(), {2, 3})),
               std::invalid_argument);
  s.offset.clear();
  EXPECT_THROW(attnref::quantize(xv, s, StridedView<std::int8_t, 2>(q.data(), {3, 2})),
               std::invalid_argument);
  for (std::int8_t v : q) EXPECT_EQ(v, 5) << "nothing written";
}

TEST(Quant, DotIsExactInInt32AtEveryLevel) {
  std::mt19937 rng(9);
  std::uniform_int_distribution<int> u(-128, 127);
  at_every_level([&] {
    for (Index n : {0, 1, 15, 16, 17, 33, 128, 1000, 4096}) {
      std::vector<std::int8_t> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
      for (Index i = 0; i < n; ++i) {
        a[static_cast<size_t>(i)] = static_cast<std::int8_t>(u(rng));
        b[static_cast<size_t>(i)] = static_cast<std::int8_t>(u(rng));
      }
      std::int64_t want = 0;
      for (Index i = 0; i < n; ++i)
        want += static_cast<std::int64_t>(a[static_cast<size_t>(i)]) * b[static_cast<size_t>(i)];
      EXPECT_EQ(attnref::dot_i8(a.data(), b.data(), n), want) << n;
    }
    // The extremes: -128 * -128 everywhere (a pairwise unsigned trick would saturate here).
    std::vector<std::int8_t> m(4096, -128);
    EXPECT_EQ(attnref::dot_i8(m.data(), m.data(), 4096), 4096 * 16384);
    std::vector<std::int8_t> p(4096, 127);
    EXPECT_EQ(attnref::dot_i8(m.data(), p.data(), 4096), -4096 * 128 * 127);
  });
}

TEST(Quant, Int8ProductsAreExactAtEveryLevel) {
  std::mt19937 rng(11);
  const Index m = 7, k = 133, n = 37;
  const auto a = support::rand_i8(m * k, rng);
  auto b = support::rand_i8(n * k, rng);
  const auto v = support::rand_i8(k * n, rng);
  for (Index i = 0; i < n; ++i) b[static_cast<size_t>(i * k)] = -128;  // extremes included
  at_every_level([&] {
    std::vector<std::int32_t> c(m * n, 0), pv(m * n, 0);
    attnref::gemm_i8_nt(StridedView<const std::int8_t, 2>(a.data(), {m, k}),
                        StridedView<const std::int8_t, 2>(b.data(), {n, k}),
                        StridedView<std::int32_t, 2>(c.data(), {m, n}));
    attnref::gemm_i8_nn(StridedView<const std::int8_t, 2>(a.data(), {m, k}),
                        StridedView<const std::int8_t, 2>(v.data(), {k, n}),
                        StridedView<std::int32_t, 2>(pv.data(), {m, n}));
    for (Index i = 0; i < m; ++i)
      for (Index j = 0; j < n; ++j) {
        std::int64_t qk = 0, p = 0;
        for (Index t = 0; t < k; ++t) {
          qk += static_cast<std::int64_t>(a[static_cast<size_t>(i * k + t)]) *
                b[static_cast<size_t>(j * k + t)];
          p += static_cast<std::int64_t>(a[static_cast<size_t>(i * k + t)]) *
               v[static_cast<size_t>(t * n + j)];
        }
        ASSERT_EQ(c[static_cast<size_t>(i * n + j)], qk) << i << "," << j;
        ASSERT_EQ(pv[static_cast<size_t>(i * n + j)], p) << i << "," << j;
      }
    // accumulate = true adds to what is there.
    attnref::gemm_i8_nt(StridedView<const std::int8_t, 2>(a.data(), {m, k}),
                        StridedView<const std::int8_t, 2>(b.data(), {n, k}),
                        StridedView<std::int32_t, 2>(c.data(), {m, n}), true);
    std::int64_t twice = 0;
    for (Index t = 0; t < k; ++t)
      twice += 2 * static_cast<std::int64_t>(a[static_cast<size_t>(t)]) * b[static_cast<size_t>(t)];
    EXPECT_EQ(c[0], twice);
  });
  std::vector<std::int32_t> c(4);
  EXPECT_THROW(attnref::gemm_i8_nt(StridedView<const std::int8_t, 2>(a.data(), {m, k}),
                                   StridedView<const std::int8_t, 2>(b.data(), {n, k - 1}),
                                   StridedView<std::int32_t, 2>(c.data(), {2, 2})),
               std::invalid_argument);
}

}  // namespace quant_test
