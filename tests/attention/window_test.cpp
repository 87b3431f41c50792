// Sliding-window attention (AttentionParams::window): against the reference, its metamorphic
// relations, and the hook's tile classification against its own predicate.

#include <gtest/gtest.h>

#include <attnref/attnref.hpp>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "support/case.hpp"

namespace window_test {

using attnref::Index;
using support::Lay;
using support::Spec;

struct Shape {
  const char* name;
  std::vector<int> q_len, kv_len;
};

const Shape kShapes[] = {
    {"Prefill", {7, 130, 300}, {7, 130, 300}},
    {"PrefixQltKv", {5, 64, 1}, {300, 200, 257}},
    {"Decode", {1, 1}, {1000, 513}},
    {"QgtKv", {40}, {9}},  // bottom-right: the first rows see no key
};

using Param = std::tuple<int, ref::Causal, int, bool, bool>;  // window, causal, shape, f16, tiles

class SlidingWindow : public ::testing::TestWithParam<Param> {};

TEST_P(SlidingWindow, MatchesReference) {
  const auto [window, causal, shape, f16, small_tiles] = GetParam();
  Spec s;
  s.nq = 4;
  s.nkv = 2;
  s.d = 24;
  s.dv = 16;
  s.q_len = kShapes[shape].q_len;
  s.kv_len = kShapes[shape].kv_len;
  s.causal = causal;
  s.window = window;
  s.threads = 2;
  if (small_tiles) {
    s.q_tile = 16;
    s.kv_tile = 32;
    s.kv_split = 64;
  }
  s.seed = static_cast<unsigned>(window * 7 + shape);
  EXPECT_TRUE(f16 ? support::check_against_reference<attnref::half>(s)
                  : support::check_against_reference<float>(s));
}

INSTANTIATE_TEST_SUITE_P(
    WindowsShapes, SlidingWindow,
    ::testing::Combine(::testing::Values(1, 2, 3, 17, 128, 129, 1000),
                       ::testing::Values(ref::Causal::kTopLeft, ref::Causal::kBottomRight),
                       ::testing::Range(0, 4), ::testing::Bool(), ::testing::Bool()),
    [](const auto& info) {
      return "W" + std::to_string(std::get<0>(info.param)) +
             (std::get<1>(info.param) == ref::Causal::kTopLeft ? "TopLeft" : "BottomRight") +
             kShapes[std::get<2>(info.param)].name + (std::get<3>(info.param) ? "F16" : "F32") +
             (std::get<4>(info.param) ? "SmallTiles" : "");
    });

template <class T>
std::vector<double> run_o(const Spec& s) {
  support::Data d = support::make_data<T>(s);
  support::bind_masks(d, s);
  return support::flat(support::run_lib<T>(s, d).o);
}

TEST(SlidingWindowMetamorphic, WindowCoveringEveryKeyIsPlainCausal) {
  for (auto causal : {ref::Causal::kTopLeft, ref::Causal::kBottomRight}) {
    Spec s;
    s.nq = 4;
    s.nkv = 1;
    s.d = 16;
    s.dv = 16;
    s.q_len = {33, 1, 100};
    s.kv_len = {33, 70, 140};
    s.causal = causal;
    s.q_tile = 8;
    s.kv_tile = 16;
    const auto plain = run_o<float>(s);
    for (int w : {140, 141, 100000}) {
      s.window = w;
      const auto windowed = run_o<float>(s);
      ASSERT_EQ(plain.size(), windowed.size());
      EXPECT_EQ(std::memcmp(plain.data(), windowed.data(), plain.size() * sizeof(double)), 0)
          << "window " << w;
    }
  }
}

TEST(SlidingWindowMetamorphic, PagedAndThreadsGiveTheSameBits) {
  Spec s;
  s.nq = 8;
  s.nkv = 2;
  s.d = 32;
  s.dv = 32;
  s.q_len = {1, 50, 1};
  s.kv_len = {900, 50, 333};
  s.causal = ref::Causal::kBottomRight;
  s.window = 77;
  s.threads = 1;
  const auto one = run_o<attnref::half>(s);
  s.threads = 2;
  s.layout = Lay::Paged;
  s.block_size = 13;
  const auto paged = run_o<attnref::half>(s);
  EXPECT_EQ(std::memcmp(one.data(), paged.data(), one.size() * sizeof(double)), 0);
}

// The hook's kv_range and classify agree with its own masked() on every tile of random problems.
TEST(SlidingWindowHook, RangeAndClassificationAgreeWithThePredicate) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> len(1, 60), w(0, 20), mode(0, 1);
  for (int trial = 0; trial < 300; ++trial) {
    attnref::CausalHook h{
        mode(rng) ? attnref::CausalMode::TopLeft : attnref::CausalMode::BottomRight, w(rng)};
    const attnref::SeqInfo si{0, len(rng), len(rng)};
    for (Index q0 = 0; q0 < si.q_len; q0 += 7) {
      const Index q1 = std::min(si.q_len, q0 + 7);
      const attnref::KvRange r = h.kv_range(si, q0, q1);
      for (Index i = q0; i < q1; ++i)
        for (Index j = 0; j < si.kv_len; ++j)
          if (!h.masked(si, i, j)) {
            ASSERT_TRUE(j >= r.begin && j < r.end) << trial;
          }
      for (Index k0 = 0; k0 < si.kv_len; k0 += 5) {
        const Index k1 = std::min(si.kv_len, k0 + 5);
        const attnref::TileMask tm = h.classify(si, q0, q1, k0, k1);
        for (Index i = q0; i < q1; ++i)
          for (Index j = k0; j < k1; ++j) {
            if (tm == attnref::TileMask::All) {
              ASSERT_TRUE(h.masked(si, i, j)) << trial;
            } else if (tm == attnref::TileMask::None) {
              ASSERT_FALSE(h.masked(si, i, j)) << trial;
            }
          }
      }
    }
  }
}

}  // namespace window_test
