// IFA's per-token antiquant (antiquant_mode 1) dequantizes each key and value as the engine
// loads its tile: no allocation grows with the kv length. This executable's global operator new
// records the largest request made while a probe is armed; the largest request of a call over
// 8 times more keys must not be larger. (A dense fp32 copy of K and V, as an earlier version
// made, requests 4 bytes per element of each: 8 times more.) Both lengths are past 32 · 512
// keys, where the engine's split-KV partials stop growing (at most 32 per sequence).

#include <gtest/gtest.h>

#include <atomic>
#include <attnref/cann/incre_flash_attention.hpp>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <random>
#include <vector>

namespace {

std::atomic<bool> g_armed{false};
std::atomic<std::size_t> g_largest{0};

}  // namespace

// Not inlined: the compiler would otherwise pair an inlined std::free with the caller's new.
[[gnu::noinline]] void* operator new(std::size_t n) {
  if (g_armed.load(std::memory_order_relaxed)) {
    std::size_t seen = g_largest.load(std::memory_order_relaxed);
    while (n > seen && !g_largest.compare_exchange_weak(seen, n, std::memory_order_relaxed)) {
    }
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace ifa_memory_test {

using attnref::Index;
using attnref::StridedView;

// The largest single allocation of one per-token IFA call over `len` keys (int8 K / V, fp16 q).
std::size_t largest_allocation(Index len) {
  const Index B = 1, n = 4, kvn = 2, D = 64;
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> i8(-127, 127);
  std::uniform_real_distribution<float> u(0.01f, 0.03f);
  std::vector<Eigen::half> q(static_cast<size_t>(B * n * D), Eigen::half(0.25f));
  std::vector<std::int8_t> k(static_cast<size_t>(B * len * kvn * D)), v(k.size());
  for (auto& x : k) x = static_cast<std::int8_t>(i8(rng));
  for (auto& x : v) x = static_cast<std::int8_t>(i8(rng));
  std::vector<float> scale(static_cast<size_t>(2 * B * len)), offset(scale.size(), 1.0f);
  for (auto& x : scale) x = u(rng);
  attnref::IncreFlashAttentionParams p;
  p.num_heads = n;
  p.num_key_value_heads = kvn;
  p.scale_value = 0.125;
  p.input_layout = "BSND";
  p.antiquant_mode = 1;
  attnref::IncreFlashAttentionInputs<Eigen::half, std::int8_t> in;
  in.query = StridedView<const Eigen::half>(q.data(), {B, 1, n, D});
  in.key = {StridedView<const std::int8_t>(k.data(), {B, len, kvn, D})};
  in.value = {StridedView<const std::int8_t>(v.data(), {B, len, kvn, D})};
  in.antiquant_scale_per_token = StridedView<const float>(scale.data(), {2, B, len});
  in.antiquant_offset_per_token = StridedView<const float>(offset.data(), {2, B, len});
  std::vector<Eigen::half> o(q.size());
  const attnref::IncreFlashAttentionOutputs<Eigen::half> out{
      StridedView<Eigen::half>(o.data(), {B, 1, n, D})};
  g_largest = 0;
  g_armed = true;
  attnref::incre_flash_attention(p, in, out, {1});
  g_armed = false;
  for (const Eigen::half& x : o) EXPECT_TRUE(std::isfinite(static_cast<float>(x)));
  return g_largest.load();
}

TEST(IfaPerTokenAntiquant, AllocatesNothingProportionalToTheKvLength) {
  const std::size_t small = largest_allocation(16384);
  const std::size_t large = largest_allocation(131072);
  EXPECT_GT(small, 0u);  // the probe sees the call's allocations
  EXPECT_LE(large, small) << "largest request over 16384 keys: " << small
                          << " bytes, over 131072 keys: " << large;
  // A dense fp32 copy of the 131072 keys alone would be 131072 * 2 * 64 * 4 bytes.
  EXPECT_LT(large, std::size_t{131072} * 2 * 64 * 4 / 64);
}

}  // namespace ifa_memory_test
