// MLA decode attention (include/attnref/mla/mla_attention.hpp) against the independent reference
// tests/reference/mla_attention.hpp (double): absorbed form over shuffled paged latent caches
// with -1 padded tables and NaN in every block the call must not read, fp16 / bf16 / f32, heads
// 1-16, context lengths 0-130, block sizes 16 and 128, DeepSeek's 512 + 64 and a small 64 + 16.
// Metamorphic: absorbed == un-absorbed (q_nope · (wuk c) == (wukᵀ q_nope) · c); threads 1 == 2
// bit for bit; mla_preprocess (KvCache) feeding mla_decode == the un-absorbed form on
// mla_preprocess's own k / q parts. Bad input throws before writing.

#include "reference/mla_attention.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/mla/mla_attention.hpp>
#include <attnref/mla/rope.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "support/cast.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"
#include "support/views.hpp"

namespace mla_attention_test {

using attnref::bfloat16;
using attnref::half;
using attnref::Index;
using attnref::StridedView;
using support::dbl;
using support::z;

template <class T>
support::Tolerance tol() {
  using K = support::Kind;
  return support::tolerance(std::is_same_v<T, half>    ? K::F16
                            : std::is_same_v<T, float> ? K::F32
                                                       : K::BF16);
}

struct Case {
  int B, H, C, R, bs;
  std::vector<int> lens;
  unsigned seed = 1;
};

// A shuffled paged latent cache: blocks of the sequences in random order, -1 padding in the
// table, two spare blocks; every row the call must not read is NaN.
template <class T>
struct Built {
  Case c;
  std::vector<T> q, cache, out;
  std::vector<std::int32_t> table;
  int maxb = 0, blocks = 0;
  attnref::MlaDecodeParams p;
  attnref::MlaDecodeInputs<T> in() const {
    const Index W = c.C + c.R;
    return {StridedView<const T>(q.data(), {c.B, c.H, W}),
            StridedView<const T>(cache.data(), {blocks, c.bs, 1, W}),
            StridedView<const std::int32_t>(table.data(), {c.B, maxb}),
            std::vector<Index>(c.lens.begin(), c.lens.end())};
  }
  StridedView<T> o() { return StridedView<T>(out.data(), {c.B, c.H, c.C}); }
};

template <class T>
Built<T> build(const Case& c) {
  Built<T> r;
  r.c = c;
  const int W = c.C + c.R;
  std::mt19937 rng(c.seed);
  std::normal_distribution<float> nd;
  r.q.resize(z(c.B * c.H * W));
  for (T& x : r.q) x = T(nd(rng));
  std::vector<int> nb;
  for (int l : c.lens) {
    nb.push_back((l + c.bs - 1) / c.bs);
    r.maxb = std::max(r.maxb, nb.back() + 1);
    r.blocks += nb.back();
  }
  r.blocks += 2;
  std::vector<std::int32_t> ids(z(r.blocks));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(i);
  std::shuffle(ids.begin(), ids.end(), rng);
  r.table.assign(z(c.B * r.maxb), -1);
  r.cache.assign(z(r.blocks * c.bs * W), T(NAN));
  for (int b = 0, next = 0; b < c.B; ++b) {
    for (int j = 0; j < nb[z(b)]; ++j) r.table[z(b * r.maxb + j)] = ids[z(next++)];
    for (int t = 0; t < c.lens[z(b)]; ++t) {
      const int blk = r.table[z(b * r.maxb + t / c.bs)];
      for (int e = 0; e < W; ++e) r.cache[z((blk * c.bs + t % c.bs) * W + e)] = T(nd(rng));
    }
  }
  r.out.assign(z(c.B * c.H * c.C), T(7.0f));
  r.p.kv_lora_rank = c.C;
  r.p.rope_dim = c.R;
  r.p.scale = 1.0 / std::sqrt(static_cast<double>(c.C / 4 + c.R));
  return r;
}

template <class T>
std::vector<double> expected(const Built<T>& r) {
  std::vector<double> q, cache;
  for (const T& x : r.q) q.push_back(dbl(x));
  for (const T& x : r.cache) cache.push_back(dbl(x));
  return ref::mla::mla_decode(q, r.c.B, r.c.H, r.c.C, r.c.R, cache, r.c.bs, r.table, r.maxb,
                              r.c.lens, r.p.scale);
}

template <class T>
::testing::AssertionResult close(const std::vector<double>& want, const std::vector<T>& got,
                                 support::Tolerance t) {
  std::vector<double> w, g;
  for (double x : want) w.push_back(dbl(T(static_cast<float>(x))));
  for (const T& x : got) g.push_back(dbl(x));
  return support::all_close(w, g, t);
}

template <class T>
void check(const Case& c) {
  auto r = build<T>(c);
  attnref::mla_decode(r.p, r.in(), {r.o()});
  EXPECT_TRUE(close(expected(r), r.out, tol<T>()))
      << "H " << c.H << " C " << c.C << " bs " << c.bs << " seed " << c.seed;
}

TEST(MlaDecode, MatchesReference) {
  unsigned seed = 10;
  const std::vector<Case> cases = {{3, 3, 64, 16, 16, {1, 37, 130}},
                                   {2, 16, 64, 16, 128, {130, 0}},  // a sequence without keys
                                   {1, 1, 64, 16, 16, {16}},
                                   {2, 2, 512, 64, 128, {200, 5}}};
  for (Case c : cases) {
    c.seed = seed++;
    check<half>(c);
    check<bfloat16>(c);
    check<float>(c);
  }
}

TEST(MlaDecode, SequenceWithoutKeysGivesZero) {
  auto r = build<half>({2, 3, 64, 16, 16, {0, 9}});
  attnref::mla_decode(r.p, r.in(), {r.o()});
  for (int i = 0; i < 3 * 64; ++i) EXPECT_EQ(dbl(r.out[z(i)]), 0.0) << i;
}

TEST(MlaDecode, ThreadCountDoesNotChangeBits) {
  auto a = build<bfloat16>({3, 16, 64, 16, 16, {1, 100, 130}});
  auto b = a;
  attnref::mla_decode(a.p, a.in(), {a.o()}, {1});
  attnref::mla_decode(b.p, b.in(), {b.o()}, {2});
  for (size_t i = 0; i < a.out.size(); ++i) ASSERT_EQ(dbl(a.out[i]), dbl(b.out[i])) << i;
}

// The absorbed query is T(wukᵀ q_nope) (q_nope_absorb, then rounded as mla_preprocess does); the
// un-absorbed form expands the latent through wuk per head in fp32. They agree within the
// rounding of the absorbed query.
template <class T>
void absorbed_vs_unabsorbed(int H, int P, double rtol) {
  auto r = build<T>({3, H, 64, 16, 16, {1, 37, 130}, 77});
  const int B = 3, C = 64, R = 16, W = C + R;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<T> qn(z(B * H * P)), qr(z(B * H * R)), wuk(z(H * P * C));
  for (T& x : qn) x = T(nd(rng));
  for (T& x : qr) x = T(nd(rng));
  for (T& x : wuk) x = T(nd(rng) * 0.15f);
  std::vector<float> qa(z(B * H * C));
  attnref::q_nope_absorb<T>(StridedView<const T>(qn.data(), {B, H, P}),
                            attnref::WukRef<T>{StridedView<const T>(wuk.data(), {H, P, C})},
                            StridedView<float>(qa.data(), {B, H, C}));
  for (int i = 0; i < B * H; ++i) {
    for (int c = 0; c < C; ++c) r.q[z(i * W + c)] = T(qa[z(i * C + c)]);
    for (int j = 0; j < R; ++j) r.q[z(i * W + C + j)] = qr[z(i * R + j)];
  }
  attnref::mla_decode(r.p, r.in(), {r.o()});
  std::vector<T> un(r.out.size(), T(7.0f));
  const attnref::MlaUnabsorbedInputs<T> ui{StridedView<const T>(qn.data(), {B, H, P}),
                                           StridedView<const T>(qr.data(), {B, H, R}),
                                           StridedView<const T>(wuk.data(), {H, P, C}),
                                           r.in().kv_cache,
                                           r.in().block_table,
                                           r.in().context_lens};
  attnref::mla_decode_unabsorbed(r.p, ui, {StridedView<T>(un.data(), {B, H, C})});
  std::vector<double> a, b;
  for (const T& x : r.out) a.push_back(dbl(x));
  for (const T& x : un) b.push_back(dbl(x));
  EXPECT_TRUE(support::all_close(a, b, {rtol, rtol})) << "H " << H << " P " << P;
}

TEST(MlaDecode, AbsorbedEqualsUnabsorbed) {
  absorbed_vs_unabsorbed<float>(3, 16, 1e-4);
  absorbed_vs_unabsorbed<float>(8, 32, 1e-4);
  absorbed_vs_unabsorbed<half>(3, 16, 2e-2);
  absorbed_vs_unabsorbed<bfloat16>(3, 16, 8e-2);
}

TEST(MlaDecode, RejectsBadInputBeforeWriting) {
  const auto base = build<half>({2, 3, 64, 16, 16, {20, 9}});
  {  // validate() accepts the base and writes nothing; the call writes
    auto r = base;
    EXPECT_NO_THROW(attnref::validate(r.p, r.in(), attnref::MlaDecodeOutputs<half>{r.o()}));
    EXPECT_TRUE(std::all_of(r.out.begin(), r.out.end(), [](half x) { return dbl(x) == 7.0; }));
    attnref::mla_decode(r.p, r.in(), {r.o()});
    EXPECT_FALSE(std::all_of(r.out.begin(), r.out.end(), [](half x) { return dbl(x) == 7.0; }));
  }
  using In = attnref::MlaDecodeInputs<half>;
  using Edit = std::function<void(In&, attnref::MlaDecodeParams&, StridedView<half>&)>;
  static std::vector<std::int32_t> bad_table;
  const std::vector<std::pair<Edit, std::string>> edits = {
      {[](In& in, auto&, auto&) { in.q = support::resized(in.q, 2, 79); }, "q.shape"},
      {[](In& in, auto&, auto&) { in.q = support::with_data(in.q, nullptr); }, "q data is null"},
      {[](auto&, auto&, StridedView<half>& o) { o = support::resized(o, 2, 80); }, "out.shape"},
      {[](auto&, auto&, StridedView<half>& o) { o = support::resized(o, 0, 1); }, "out.shape"},
      {[](In& in, auto&, auto&) { in.kv_cache = support::resized(in.kv_cache, 3, 64); },
       "kv_cache.shape"},
      {[](In& in, auto&, auto&) { in.kv_cache = support::resized(in.kv_cache, 2, 2); },
       "kv_cache.shape"},
      {[](In& in, auto&, auto&) { in.block_table = support::resized(in.block_table, 0, 3); },
       "block_table.shape"},
      {[](In& in, auto&, auto&) { in.context_lens.pop_back(); }, "context_lens"},
      {[](In& in, auto&, auto&) { in.context_lens[1] = 1000; }, "context_lens[1]"},
      {[](In& in, auto&, auto&) { in.context_lens[0] = -1; }, "context_lens[0]"},
      {[](auto&, attnref::MlaDecodeParams& p, auto&) { p.scale = NAN; }, "params.scale"},
      {[](auto&, attnref::MlaDecodeParams& p, auto&) { p.rope_dim = 8; }, "q.shape"},
  };
  for (const auto& [edit, what] : edits) {
    auto r = base;
    In in = r.in();
    auto p = r.p;
    StridedView<half> o = r.o();
    edit(in, p, o);
    support::expect_validate_agrees(
        [&] { attnref::validate(p, in, attnref::MlaDecodeOutputs<half>{o}); },
        [&] { attnref::mla_decode(p, in, {o}); });
    support::expect_throw([&] { attnref::mla_decode(p, in, {o}); }, what, false);
    EXPECT_TRUE(std::all_of(r.out.begin(), r.out.end(), [](half x) { return dbl(x) == 7.0; }))
        << what;
  }
  // A used table entry outside the pool: std::out_of_range naming it; -1 past the last used
  // block is fine.
  auto r = base;
  bad_table = r.table;
  bad_table[z(1 * r.maxb + 0)] = r.blocks;
  In in = r.in();
  in.block_table = support::with_data(in.block_table, bad_table.data());
  support::expect_validate_agrees(
      [&] { attnref::validate(r.p, in, attnref::MlaDecodeOutputs<half>{r.o()}); },
      [&] { attnref::mla_decode(r.p, in, {r.o()}); });
  support::expect_throw([&] { attnref::mla_decode(r.p, in, {r.o()}); }, "block_table[1][0]", true);
  EXPECT_TRUE(std::all_of(r.out.begin(), r.out.end(), [](half x) { return dbl(x) == 7.0; }));
}

}  // namespace mla_attention_test
