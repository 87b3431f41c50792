// attnref::attention against the independent naive reference, over parameter grids.

#include <gtest/gtest.h>

#include <attnref/attnref.hpp>
#include <tuple>

#include "support/case.hpp"

namespace attention_test {

using support::Dtype;
using support::Lay;
using support::MaskKind;
using support::Spec;

::testing::AssertionResult check(const Spec& s, Dtype t) {
  switch (t) {
    case Dtype::F32:
      return support::check_against_reference<float>(s);
    case Dtype::F64:
      return support::check_against_reference<double>(s);
    case Dtype::F16:
      return support::check_against_reference<attnref::half>(s);
    case Dtype::BF16:
      return support::check_against_reference<attnref::bfloat16>(s);
  }
  return ::testing::AssertionFailure() << "unknown dtype";
}

// ---------------------------------------------------------------------------------------------
// Grid 1: head sizes x sequence lengths (including tile - 1, tile, tile + 1 of the default tiles
// and of small explicit tiles), f32, causal bottom-right with q_len != kv_len, GQA 2.

class ShapeGrid : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(ShapeGrid, MatchesReference) {
  const auto [d, len] = GetParam();
  if (len >= 1000 && d > 64) GTEST_SKIP() << "reference too slow for this size";
  Spec s;
  s.nq = 4;
  s.nkv = 2;
  s.d = d;
  s.dv = d;
  s.q_len = {len, std::max(1, len / 2)};
  s.kv_len = {len, len + 3};
  s.causal = ref::Causal::kBottomRight;
  s.seed = static_cast<unsigned>(d * 1000 + len);
  EXPECT_TRUE(check(s, Dtype::F32)) << "d=" << d << " len=" << len;
  // Same shapes with small tiles so tile boundaries fall inside the sequence.
  s.q_tile = 3;
  s.kv_tile = 16;
  s.kv_split = 32;
  EXPECT_TRUE(check(s, Dtype::F32)) << "small tiles, d=" << d << " len=" << len;
}

INSTANTIATE_TEST_SUITE_P(HeadSizesTimesLengths, ShapeGrid,
                         ::testing::Combine(::testing::Values(1, 16, 40, 64, 128, 192, 256),
                                            ::testing::Values(1, 2, 3, 7, 15, 16, 17, 31, 113, 255,
                                                              256, 257, 1000)),
                         [](const auto& info) {
                           return "D" + std::to_string(std::get<0>(info.param)) + "S" +
                                  std::to_string(std::get<1>(info.param));
                         });

// ---------------------------------------------------------------------------------------------
// Grid 2: layouts x dtypes x GQA ratios x mask kinds, varlen batches with q_len != kv_len.

using FeatureParam = std::tuple<Lay, Dtype, int, int>;  // layout, dtype, group, mask index

struct MaskCase {
  ref::Causal causal;
  MaskKind mask;
};
const MaskCase kMasks[] = {
    {ref::Causal::kNone, MaskKind::None},
    {ref::Causal::kTopLeft, MaskKind::None},
    {ref::Causal::kBottomRight, MaskKind::None},
    {ref::Causal::kNone, MaskKind::Bool},
    {ref::Causal::kNone, MaskKind::BoolPerHead},
    {ref::Causal::kNone, MaskKind::Additive},
    {ref::Causal::kBottomRight, MaskKind::Additive},
};
constexpr int kNumMasks = sizeof(kMasks) / sizeof(kMasks[0]);

class FeatureGrid : public ::testing::TestWithParam<FeatureParam> {};

TEST_P(FeatureGrid, MatchesReference) {
  const auto [lay, dt, group, mi] = GetParam();
  Spec s;
  s.nkv = group == 0 ? 1 : 2;  // 0 = "all heads share one kv head" (MQA)
  s.nq = group == 0 ? 6 : 2 * group;
  s.d = 24;
  s.dv = 20;
  s.q_len = {13, 1, 40, 0};
  s.kv_len = {29, 17, 40, 9};
  s.layout = lay;
  s.block_size = 5;  // Lay::Paged: kv tiles of 8 cross block boundaries
  s.causal = kMasks[mi].causal;
  s.mask = kMasks[mi].mask;
  s.q_tile = 4;
  s.kv_tile = 8;
  s.seed = static_cast<unsigned>(17 + mi * 7 + group);
  EXPECT_TRUE(check(s, dt));
}

INSTANTIATE_TEST_SUITE_P(
    LayoutsDtypesGqaMasks, FeatureGrid,
    ::testing::Combine(::testing::Values(Lay::BSND, Lay::BNSD, Lay::TND, Lay::Padded, Lay::Paged),
                       ::testing::Values(Dtype::F32, Dtype::F64, Dtype::F16, Dtype::BF16),
                       ::testing::Values(1, 2, 4, 0), ::testing::Range(0, kNumMasks)),
    [](const auto& info) {
      const int g = std::get<2>(info.param);
      const MaskCase m = kMasks[std::get<3>(info.param)];
      return std::string(support::name(std::get<0>(info.param))) +
             support::name(std::get<1>(info.param)) + "G" + (g == 0 ? "All" : std::to_string(g)) +
             support::name(m.causal) + support::name(m.mask);
    });

// ---------------------------------------------------------------------------------------------
// Default tiling (no explicit tiles) on mid-size shapes, both threads counts.

TEST(Attention, DefaultTilingDecodeSplitsMatchReference) {
  Spec s;
  s.nq = 8;
  s.nkv = 2;
  s.d = 64;
  s.dv = 64;
  s.q_len = {1, 1, 3};
  s.kv_len = {1500, 700, 1100};
  s.causal = ref::Causal::kBottomRight;
  s.threads = 2;
  EXPECT_TRUE(support::check_against_reference<float>(s));
  EXPECT_TRUE(support::check_against_reference<attnref::half>(s));
}

TEST(Attention, ProbabilitiesDebugOutputMatchesReference) {
  Spec s;
  s.nq = 4;
  s.nkv = 1;
  s.d = 16;
  s.dv = 8;
  s.q_len = {9, 4};
  s.kv_len = {21, 4};
  s.causal = ref::Causal::kBottomRight;
  s.mask = MaskKind::Bool;
  s.q_tile = 2;
  s.kv_tile = 8;
  s.want_probs = true;
  EXPECT_TRUE(support::check_against_reference<float>(s));
  EXPECT_TRUE(support::check_against_reference<double>(s));
}

TEST(Attention, DifferentValueHeadSize) {
  Spec s;
  s.nq = 4;
  s.nkv = 4;
  s.d = 48;
  s.dv = 5;
  s.q_len = {33};
  s.kv_len = {70};
  EXPECT_TRUE(support::check_against_reference<float>(s));
}

TEST(Attention, LargeLogitsAreStable) {
  Spec s;
  s.d = 16;
  s.dv = 16;
  s.q_len = {20};
  s.kv_len = {40};
  s.scale = 25.0;  // logits near +-100: exp without the running max would overflow in f32
  s.kv_tile = 8;
  EXPECT_TRUE(support::check_against_reference<float>(s));
  EXPECT_TRUE(support::check_against_reference<double>(s));
}

// ---------------------------------------------------------------------------------------------
// Both paths of the hand-vectorised code: the small-row kernels (decode) and the fp16/bf16
// conversions, enabled and disabled at run time, against the reference.

namespace simd = attnref::detail::simd;

class SimdPaths : public ::testing::TestWithParam<simd::Level> {};

TEST_P(SimdPaths, DecodeShapesMatchReference) {
  if (GetParam() > simd::compiled_level()) GTEST_SKIP() << "level not compiled in";
  const simd::Level previous = simd::set_level(GetParam());
  for (int group : {1, 3, 8})
    for (int mi = 0; mi < kNumMasks; ++mi) {
      Spec s;
      s.nkv = 2;
      s.nq = 2 * group;
      s.d = 72;  // not a multiple of 16: vector body plus scalar tail
      s.dv = 40;
      s.q_len = {1, 2, 1};
      s.kv_len = {300, 45, 1};
      s.causal = kMasks[mi].causal;
      s.mask = kMasks[mi].mask;
      s.kv_tile = 32;
      s.kv_split = 96;
      s.seed = static_cast<unsigned>(100 + group * 10 + mi);
      for (Dtype dt : {Dtype::F32, Dtype::F16, Dtype::BF16})
        EXPECT_TRUE(check(s, dt)) << "group " << group << " mask " << mi << " "
                                  << support::name(dt);
    }
  simd::set_level(previous);
}

TEST_P(SimdPaths, PrefillShapesMatchReference) {
  // Row blocks above 8 rows take the register-blocked panel kernels at the vector levels: a head
  // size of 40 packs two full transposed blocks of 16 (five of 8) plus a scalar tail, 72 value
  // elements leave a vector-block tail and a scalar tail, kv tiles of 40 keys end in a partial
  // key block, and 14 or 28 rows end in a partial block of 6.
  if (GetParam() > simd::compiled_level()) GTEST_SKIP() << "level not compiled in";
  const simd::Level previous = simd::set_level(GetParam());
  for (int group : {1, 2})
    for (int mi = 0; mi < kNumMasks; ++mi) {
      Spec s;
      s.nkv = 2;
      s.nq = 2 * group;
      s.d = 40;
      s.dv = 72;
      s.q_len = {50, 14, 3};
      s.kv_len = {70, 29, 45};
      s.causal = kMasks[mi].causal;
      s.mask = kMasks[mi].mask;
      s.q_tile = 14;
      s.kv_tile = 40;
      s.seed = static_cast<unsigned>(300 + group * 10 + mi);
      for (Dtype dt : {Dtype::F32, Dtype::F16, Dtype::BF16})
        EXPECT_TRUE(check(s, dt)) << "group " << group << " mask " << mi << " "
                                  << support::name(dt);
    }
  simd::set_level(previous);
}

INSTANTIATE_TEST_SUITE_P(EveryLevel, SimdPaths,
                         ::testing::Values(simd::Level::Portable, simd::Level::Avx2,
                                           simd::Level::Avx512),
                         [](const auto& info) { return std::string(simd::to_string(info.param)); });

}  // namespace attention_test
