// The MLA stages give the same bits at every SIMD level this build has (Portable, AVX2,
// AVX-512): the int8 products are exact integers whichever kernel sums them (the NZ streaming
// kernel for any token count, the gathered-row path for [in, out] weights), the conversions are
// exact and the fp32 steps are scalar. Extreme int8 values (-128, 127) everywhere.

#include "support/simd_levels.hpp"

#include <gtest/gtest.h>

#include <attnref/detail/simd.hpp>
#include <attnref/mla/int8_matmul.hpp>
#include <attnref/mla/rope.hpp>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "support/cast.hpp"
#include "support/random.hpp"

namespace simd_levels_test {

using attnref::half;
using attnref::Index;
using attnref::StridedView;
using support::z;
namespace simd = attnref::detail::simd;
using support::extreme_i8;

// int8_matmul with every weight format, per tensor and per token with a zero point, M = 1, 9
// and 17 (tiles of 8 plus a remainder), K = 96 and 7168, at every level: the same bits.
TEST(MlaSimdLevels, Int8MatmulIsTheSameAtEveryLevel) {
  std::mt19937 rng(3);
  for (Index M : {1, 9, 17})
    for (Index K : {96, 7168}) {
      const Index N = 300;
      const auto a = extreme_i8(z(M * K), rng);
      const auto w = extreme_i8(z(N * K), rng);
      std::vector<std::int8_t> wt(w.size());  // [in, out]
      for (Index n = 0; n < N; ++n)
        for (Index k = 0; k < K; ++k) wt[z(k * N + n)] = w[z(n * K + k)];
      const auto s = attnref::nz_shape<std::int8_t>(1, N, K);
      std::vector<std::int8_t> wnz(z(s[1] * s[2] * s[3]));
      attnref::nd_to_nz<std::int8_t>(
          attnref::StridedView<const std::int8_t, 3>(w.data(), {1, N, K}),
          attnref::StridedView<std::int8_t, 4>(wnz.data(), s));
      std::vector<float> ds(z(N)), ts(z(M)), zp(z(M));
      for (Index n = 0; n < N; ++n) ds[z(n)] = 1e-4f * static_cast<float>(1 + n % 7);
      for (Index m = 0; m < M; ++m)
        ts[z(m)] = 0.01f + 1e-3f * static_cast<float>(m), zp[z(m)] = 0.37f * static_cast<float>(m);
      const attnref::WeightRef<std::int8_t> forms[3] = {
          {StridedView<const std::int8_t>(w.data(), {N, K}), N, K, attnref::WeightFormat::NdOutIn},
          {StridedView<const std::int8_t>(wt.data(), {K, N}), N, K, attnref::WeightFormat::NdInOut},
          {StridedView<const std::int8_t>(wnz.data(), {s[1], s[2], s[3]}), N, K,
           attnref::WeightFormat::Nz}};
      for (bool per_token : {false, true}) {
        std::vector<float> first;
        for (const auto& wf : forms)
          for (simd::Level level : support::simd_levels()) {
            const simd::Level previous = simd::set_level(level);
            attnref::Int8MatmulInputs in{StridedView<const std::int8_t>(a.data(), {M, K}), wf};
            in.de_scale = StridedView<const float>(ds.data(), {N});
            if (per_token) {
              in.token_scale = StridedView<const float>(ts.data(), {M});
              in.zero_point = StridedView<const float>(zp.data(), {M});
            }
            std::vector<float> out(z(M * N));
            attnref::int8_matmul<float>(in, StridedView<float>(out.data(), {M, N}));
            simd::set_level(previous);
            if (first.empty())
              first = out;
            else
              EXPECT_EQ(std::memcmp(first.data(), out.data(), out.size() * sizeof(float)), 0)
                  << "M " << M << " K " << K << " format " << static_cast<int>(wf.format)
                  << " level " << static_cast<int>(level) << " per token " << per_token;
          }
      }
    }
}

TEST(MlaSimdLevels, QNopeAbsorbIsTheSameAtEveryLevel) {
  std::mt19937 rng(4);
  std::normal_distribution<float> nd;
  const Index N = 3, H = 2, P = 16, C = 64;
  std::vector<half> q(z(N * H * P)), wuk(z(H * P * C));
  for (half& x : q) x = half(nd(rng));
  for (half& x : wuk) x = half(nd(rng));
  std::vector<float> first;
  for (simd::Level level : support::simd_levels()) {
    const simd::Level previous = simd::set_level(level);
    std::vector<float> out(z(N * H * C));
    attnref::q_nope_absorb<half>(
        StridedView<const half>(q.data(), {N, H, P}),
        attnref::WukRef<half>{StridedView<const half>(wuk.data(), {H, P, C})},
        StridedView<float>(out.data(), {N, H, C}));
    simd::set_level(previous);
    if (first.empty())
      first = out;
    else
      EXPECT_EQ(std::memcmp(first.data(), out.data(), out.size() * sizeof(float)), 0)
          << static_cast<int>(level);
  }
}

}  // namespace simd_levels_test
