// ATB ReshapeAndCache: ND against an independent per-token copy (negative slots skipped, later
// tokens win a shared slot, untouched slots keep their contents), NZ == nd_to_nz of the ND
// result, K only (V bypass), every element type bit-exactly, bad input.

#include <gtest/gtest.h>

#include <attnref/atb/reshape_and_cache.hpp>
#include <attnref/core/nz.hpp>
#include <cstdint>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/bits.hpp"
#include "support/errors.hpp"

namespace reshape_and_cache_test {

using attnref::Index;
using attnref::StridedView;
using support::same_bits;

template <class T>
std::vector<T> filled(size_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int> u(-120, 120);
  std::vector<T> x(n);
  for (T& e : x) e = T(static_cast<float>(u(rng)));
  return x;
}

template <class T>
void check_type(bool with_value) {
  std::mt19937 rng(9);
  const Index tokens = 11, heads = 2, dk = 32, dv = 16, blocks = 5, bs = 16;
  const auto key = filled<T>(static_cast<size_t>(tokens * heads * dk), rng);
  const auto value = filled<T>(static_cast<size_t>(tokens * heads * dv), rng);
  // Shuffled slots with a skip (-1), a shared slot (tokens 3 and 8) and the last slot.
  const std::vector<std::int32_t> slots{17, 0, -1, 45, 79, 16, 33, -5, 45, 2, 64};
  auto kc = filled<T>(static_cast<size_t>(blocks * bs * heads * dk), rng);
  auto vc = filled<T>(static_cast<size_t>(blocks * bs * heads * dv), rng);
  // Expected: the caches' old contents with each token's rows copied in token order.
  auto kc_want = kc, vc_want = vc;
  for (Index i = 0; i < tokens; ++i) {
    const std::int32_t s = slots[static_cast<size_t>(i)];
    if (s < 0) continue;
    std::copy_n(&key[static_cast<size_t>(i * heads * dk)], heads * dk,
                &kc_want[static_cast<size_t>(s) * heads * dk]);
    if (with_value)
      std::copy_n(&value[static_cast<size_t>(i * heads * dv)], heads * dv,
                  &vc_want[static_cast<size_t>(s) * heads * dv]);
  }
  attnref::ReshapeAndCacheInputs<T> in;
  in.key = StridedView<const T, 3>(key.data(), {tokens, heads, dk});
  if (with_value) in.value = StridedView<const T, 3>(value.data(), {tokens, heads, dv});
  in.slot_mapping = StridedView<const std::int32_t, 1>(slots.data(), {tokens});
  // NZ caches start as the NZ form of the same old contents.
  constexpr Index c0 = attnref::nz_c0<T>();
  const auto kshape = attnref::nz_shape<T>(blocks, bs, heads * dk);
  const auto vshape = attnref::nz_shape<T>(blocks, bs, heads * dv);
  std::vector<T> kz(static_cast<size_t>(blocks * heads * dk * bs)),
      vz(static_cast<size_t>(blocks * heads * dv * bs));
  attnref::nd_to_nz(StridedView<const T, 3>(kc.data(), {blocks, bs, heads * dk}),
                    StridedView<T, 4>(kz.data(), kshape));
  attnref::nd_to_nz(StridedView<const T, 3>(vc.data(), {blocks, bs, heads * dv}),
                    StridedView<T, 4>(vz.data(), vshape));
  ASSERT_EQ(kshape[3], c0);

  attnref::reshape_and_cache(
      in, StridedView<T, 4>(kc.data(), {blocks, bs, heads, dk}),
      with_value ? StridedView<T, 4>(vc.data(), {blocks, bs, heads, dv}) : StridedView<T, 4>{});
  EXPECT_TRUE(same_bits(kc, kc_want));
  EXPECT_TRUE(same_bits(vc, with_value ? vc_want : vc));

  attnref::reshape_and_cache_nz(
      in, StridedView<T, 4>(kz.data(), kshape),
      with_value ? StridedView<T, 4>(vz.data(), vshape) : StridedView<T, 4>{});
  std::vector<T> k_back(kc.size()), v_back(vc.size());
  attnref::nz_to_nd(StridedView<const T, 4>(kz.data(), kshape),
                    StridedView<T, 3>(k_back.data(), {blocks, bs, heads * dk}));
  attnref::nz_to_nd(StridedView<const T, 4>(vz.data(), vshape),
                    StridedView<T, 3>(v_back.data(), {blocks, bs, heads * dv}));
  EXPECT_TRUE(same_bits(k_back, kc_want));
  if (with_value) {
    EXPECT_TRUE(same_bits(v_back, vc_want));
  }
}

TEST(ReshapeAndCache, NdAndNzAgainstPerTokenCopies) {
  for (bool v : {true, false}) {
    check_type<attnref::half>(v);
    check_type<attnref::bfloat16>(v);
    check_type<std::int8_t>(v);
    check_type<float>(v);
  }
}

struct BadCase {
  std::vector<attnref::half> key = std::vector<attnref::half>(4 * 2 * 16, attnref::half(1.0f));
  std::vector<attnref::half> value = key;
  std::vector<std::int32_t> slots{0, 5, 31, -1};
  std::vector<attnref::half> kc = std::vector<attnref::half>(2 * 16 * 2 * 16, attnref::half(3.0f));
  std::vector<attnref::half> vc = kc;
  attnref::ReshapeAndCacheInputs<attnref::half> in() const {
    attnref::ReshapeAndCacheInputs<attnref::half> r;
    r.key = StridedView<const attnref::half, 3>(key.data(), {4, 2, 16});
    r.value = StridedView<const attnref::half, 3>(value.data(), {4, 2, 16});
    r.slot_mapping = StridedView<const std::int32_t, 1>(slots.data(), {4});
    return r;
  }
  bool untouched() const {
    for (size_t i = 0; i < kc.size(); ++i)
      if (static_cast<float>(kc[i]) != 3.0f || static_cast<float>(vc[i]) != 3.0f) return false;
    return true;
  }
};

template <class E>
void expect_throw(const std::function<void(BadCase&)>& run, const std::string& what) {
  BadCase c;
  support::expect_rejected<E>([&] { run(c); }, what);
  EXPECT_TRUE(c.untouched()) << what;
}

TEST(ReshapeAndCache, BadInputThrowsBeforeWriting) {
  using H = attnref::half;
  auto nd = [](BadCase& c) { return StridedView<H, 4>(c.kc.data(), {2, 16, 2, 16}); };
  auto ndv = [](BadCase& c) { return StridedView<H, 4>(c.vc.data(), {2, 16, 2, 16}); };
  expect_throw<std::out_of_range>(
      [&](BadCase& c) {
        c.slots[2] = 32;
        attnref::reshape_and_cache(c.in(), nd(c), ndv(c));
      },
      "attnref::reshape_and_cache: slot_mapping[2] out of range: expected < 32 (numBlocks * "
      "blockSize), got 32");
  expect_throw<std::invalid_argument>(
      [&](BadCase& c) {
        auto in = c.in();
        in.slot_mapping = StridedView<const std::int32_t, 1>(c.slots.data(), {3});
        attnref::reshape_and_cache(in, nd(c), ndv(c));
      },
      "slot_mapping.shape[0] mismatch with key.shape[0] (numTokens): expected 4, got 3");
  expect_throw<std::invalid_argument>(
      [&](BadCase& c) {
        attnref::reshape_and_cache(c.in(), StridedView<H, 4>(c.kc.data(), {2, 16, 1, 32}), ndv(c));
      },
      "key_cache.shape mismatch with key");
  expect_throw<std::invalid_argument>(
      [&](BadCase& c) { attnref::reshape_and_cache(c.in(), nd(c)); },
      "value/value_cache given one without the other");
  expect_throw<std::invalid_argument>(
      [&](BadCase& c) {
        attnref::reshape_and_cache(c.in(), nd(c), StridedView<H, 4>(c.kc.data(), {2, 16, 2, 16}));
      },
      "value_cache overlaps key_cache");
  // NZ: blockSize not a multiple of 16, hidden not a multiple of C0.
  expect_throw<std::invalid_argument>(
      [&](BadCase& c) {
        attnref::reshape_and_cache_nz(c.in(), StridedView<H, 4>(c.kc.data(), {4, 2, 8, 16}),
                                      StridedView<H, 4>(c.vc.data(), {4, 2, 8, 16}));
      },
      "key_cache.shape[2] (blockSize) not a multiple of 16 (NZ)");
  expect_throw<std::out_of_range>(
      [&](BadCase& c) {
        c.slots[1] = 40;
        attnref::reshape_and_cache_nz(c.in(), StridedView<H, 4>(c.kc.data(), {2, 2, 16, 16}),
                                      StridedView<H, 4>(c.vc.data(), {2, 2, 16, 16}));
      },
      "slot_mapping[1] out of range");
}

}  // namespace reshape_and_cache_test
