// nsa_compress_with_cache (aclnnNsaCompressWithCache) against the independent references
// tests/reference/nsa_compress.hpp: bit for bit against the vendor kernel's fp32 summation tree
// (compress_block_vendor) and within the dtype's tolerance of the double sum, for every block
// size / stride pair of the vendor's list and odd relaxed ones; step by step it rebuilds
// nsa_compress of the whole sequence at every token count; bad input throws before anything
// is written.

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/nsa/compress_with_cache.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <type_traits>
#include <vector>

#include "nsa/compress_with_cache_support.hpp"
#include "reference/nsa_compress.hpp"
#include "support/cast.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"
#include "support/nsa_paged.hpp"

namespace compress_with_cache_test {

using attnref::bfloat16;
using attnref::half;
using attnref::Index;
using attnref::StridedView;
using compress_with_cache_support::tokens;
using compress_with_cache_support::vendor_token;
using support::dbl;
using support::z;
using i32 = std::int32_t;
constexpr float kSentinel = 7.0f;

/// B sequences in a shuffled paged pool, weights, distinct random slots in an output cache that
/// meets the vendor's result_len rule.
template <class T>
struct Wc {
  Index N = 3, D = 32, l = 32, d = 16, page = 64, rows = 0;
  std::vector<long> lens;
  std::vector<std::vector<double>> x;
  support::PagedPool<T> pool;
  std::vector<double> wd;
  std::vector<T> w, cache;
  std::vector<i32> slot;
  attnref::NsaCompressWithCacheParams p;

  Wc(Index l_, Index d_, Index page_, std::vector<long> lens_, unsigned seed, bool exact = false,
     Index N_ = 3, Index D_ = 32)
      : N(N_), D(D_), l(l_), d(d_), page(page_), lens(std::move(lens_)) {
    std::mt19937 rng(seed);
    for (long n : lens) x.push_back(tokens<T>(n, N, D, rng, exact));
    const std::vector<double> none;
    pool = support::page_tokens<T>(
        lens, static_cast<int>(page), static_cast<int>(N * D), 0,
        [&](size_t b) -> const std::vector<double>& { return x[b]; },
        [&](size_t) -> const std::vector<double>& { return none; }, 2, seed + 1);
    std::uniform_int_distribution<int> pick(0, 3);
    const double ws[] = {-0.5, 0.25, 0.5, 1.0};
    std::normal_distribution<double> nd;
    for (Index i = 0; i < l * N; ++i)
      wd.push_back(exact ? ws[pick(rng)] : support::rnd<T>(0.3 * nd(rng)));
    for (double v : wd) w.push_back(T(static_cast<float>(v)));
    rows = pool.blocks * page / d + 2;
    cache.assign(z(rows * N * D), T(kSentinel));
    std::vector<i32> all(z(rows));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    slot.assign(all.begin(), all.begin() + static_cast<long>(lens.size()));
    p.compress_block_size = l;
    p.compress_stride = d;
    p.page_block_size = page;
  }
  Index B() const { return static_cast<Index>(lens.size()); }
  bool writes(Index b) const {
    const Index s = lens[z(b)];
    return s >= l && (s - l) % d == 0;
  }
  attnref::NsaCompressWithCacheInputs<T> inputs() const {
    attnref::NsaCompressWithCacheInputs<T> in;
    in.input = StridedView<const T>(pool.k.data(), {pool.blocks, page, N, D});
    in.weight = StridedView<const T>(w.data(), {l, N});
    in.slot_mapping = StridedView<const i32>(slot.data(), {B()});
    in.act_seq_len.assign(lens.begin(), lens.end());
    in.block_table = StridedView<const i32>(pool.table.data(), {B(), pool.max_blocks});
    return in;
  }
  attnref::NsaCompressWithCacheOutputs<T> outputs() {
    return {StridedView<T>(cache.data(), {rows, N, D})};
  }
  void run(const attnref::ExecConfig& exec = {}) {
    attnref::nsa_compress_with_cache(p, inputs(), outputs(), exec);
  }
  bool untouched() const {
    return std::all_of(cache.begin(), cache.end(), [](T v) { return dbl(v) == kSentinel; });
  }
};

template <class T>
void check_case(Index l, Index d, Index page, bool strict, unsigned seed) {
  SCOPED_TRACE(::testing::Message() << "l " << l << " d " << d << " page " << page);
  const std::vector<long> lens = {l - 1,         l,         l + d,       l + d + 1, l + 5 * d, 0,
                                  l + 3 * d - 1, l + 2 * d, 3 * page + l};
  Wc<T> c(l, d, page, lens, seed);
  c.p.strict = strict;
  c.run();
  std::vector<bool> written(z(c.rows), false);
  for (Index b = 0; b < c.B(); ++b) {
    if (!c.writes(b)) continue;
    const Index row = c.slot[z(b)];
    written[z(row)] = true;
    const std::vector<T> want = vendor_token<T>(c.x[z(b)], c.lens[z(b)], c.N, c.D, c.wd, l);
    EXPECT_EQ(std::memcmp(want.data(), &c.cache[z(row * c.N * c.D)], want.size() * sizeof(T)), 0)
        << "batch " << b;
    // The double sum, as a check on the tree reference itself.
    const Index s = c.lens[z(b)];
    const std::vector<double> blk(c.x[z(b)].begin() + (s - l) * c.N * c.D,
                                  c.x[z(b)].begin() + s * c.N * c.D);
    std::vector<double> exact =
        ref::nsa::compress(blk, static_cast<int>(c.N), static_cast<int>(c.D), c.wd,
                           static_cast<int>(l), static_cast<int>(d), {l});
    std::vector<double> got;
    for (Index i = 0; i < c.N * c.D; ++i) got.push_back(dbl(c.cache[z(row * c.N * c.D + i)]));
    for (double& e : exact) e = support::rnd<T>(e);
    EXPECT_TRUE(support::all_close(exact, got, support::tolerance(support::kind_of<T>())));
  }
  for (Index r = 0; r < c.rows; ++r) {
    if (written[z(r)]) continue;
    for (Index i = 0; i < c.N * c.D; ++i)
      ASSERT_EQ(dbl(c.cache[z(r * c.N * c.D + i)]), kSentinel) << "row " << r;
  }
}

TEST(NsaCompressWithCache, WritesTheCompletedBlocksLikeTheVendorKernel) {
  unsigned seed = 1;
  for (const auto& [l, d] : std::vector<std::pair<Index, Index>>{
           {16, 16}, {32, 16}, {48, 16}, {48, 48}, {64, 16}, {64, 32}, {64, 64}})
    for (Index page : {64, 128}) {
      check_case<half>(l, d, page, true, seed++);
      check_case<bfloat16>(l, d, page, true, seed++);
      check_case<float>(l, d, page, true, seed++);
    }
  // Relaxed mode: blocks that are not a multiple of the kernel's 8-token runs, tiny pages.
  for (const auto& [l, d] : std::vector<std::pair<Index, Index>>{{1, 1}, {5, 2}, {12, 12}, {21, 4}})
    for (Index page : {3, 16}) {
      check_case<half>(l, d, page, false, seed++);
      check_case<float>(l, d, page, false, seed++);
    }
}

// Tokens 0 .. 15 of one head: 2^24, 1, 0, 1, 0 ... 0, then −2^24 at token 8, weights 1. The
// kernel sums each run of 8 by halving (2^24 + 2 exactly), then the two runs: 2. Summed in token
// order, each +1 rounds away at 2^24 and the result is 0 (nsa_compress's order).
TEST(NsaCompressWithCache, SumsInTheKernelsTreeNotInTokenOrder) {
  std::vector<float> x(16 * 16, 0.0f), w(16, 1.0f), out(1, kSentinel), tnd(16, 0.0f);
  std::vector<i32> table = {0}, slot = {0};
  tnd[0] = 16777216.0f, tnd[1] = 1.0f, tnd[3] = 1.0f, tnd[8] = -16777216.0f;
  std::copy(tnd.begin(), tnd.end(), x.begin());
  attnref::NsaCompressWithCacheParams p;
  p.compress_block_size = p.compress_stride = 16;
  p.page_block_size = 16;
  p.strict = false;
  attnref::NsaCompressWithCacheInputs<float> in;
  in.input = StridedView<const float>(x.data(), {16, 16, 1, 1});
  in.weight = StridedView<const float>(w.data(), {16, 1});
  in.slot_mapping = StridedView<const i32>(slot.data(), {1});
  in.act_seq_len = {16};
  in.block_table = StridedView<const i32>(table.data(), {1, 1});
  attnref::nsa_compress_with_cache(p, in, {StridedView<float>(out.data(), {1, 1, 1})});
  EXPECT_EQ(out[0], 2.0f);
  float seq = kSentinel;
  attnref::NsaCompressParams cp;
  cp.compress_block_size = cp.compress_stride = 16;
  cp.strict = false;
  attnref::nsa_compress<float>(cp, StridedView<const float>(tnd.data(), {16, 1, 1}),
                               StridedView<const float>(w.data(), {16, 1}), {16},
                               StridedView<float>(&seq, {1, 1, 1}));
  EXPECT_EQ(seq, 0.0f);
}

// One sequence grows a token at a time; every call writes at row (s − l) / d. After each call
// the rows written so far equal nsa_compress of the prefix: bit for bit on data whose sums are
// exact in fp32 (so the two summation orders agree), within the dtype's tolerance otherwise.
template <class T>
void step_by_step(Index l, Index d, Index page, bool exact, unsigned seed) {
  SCOPED_TRACE(::testing::Message() << "l " << l << " d " << d << (exact ? " exact" : ""));
  const Index L = 3 * l + 2 * d + 5;
  Wc<T> c(l, d, page, {static_cast<long>(L)}, seed, exact);
  c.p.strict = false;
  const Index total = attnref::nsa_compressed_count(L, l, d);
  std::vector<T> tnd;
  for (double v : c.x[0]) tnd.push_back(T(static_cast<float>(v)));
  std::vector<T> cache(z(total * c.N * c.D), T(kSentinel));
  for (Index s = 0; s <= L; ++s) {
    attnref::NsaCompressWithCacheInputs<T> in = c.inputs();
    in.act_seq_len = {s};
    const i32 row = static_cast<i32>(s >= l ? std::min((s - l) / d, total - 1) : 0);
    in.slot_mapping = StridedView<const i32>(&row, {1});
    attnref::nsa_compress_with_cache(c.p, in, {StridedView<T>(cache.data(), {total, c.N, c.D})});
    const Index n = attnref::nsa_compressed_count(s, l, d);
    std::vector<T> want(z(std::max<Index>(n, 1) * c.N * c.D));
    attnref::NsaCompressParams cp;
    cp.compress_block_size = l;
    cp.compress_stride = d;
    cp.strict = false;
    attnref::nsa_compress<T>(cp, StridedView<const T>(tnd.data(), {s, c.N, c.D}),
                             StridedView<const T>(c.w.data(), {l, c.N}), {s},
                             StridedView<T>(want.data(), {n, c.N, c.D}));
    const size_t live = z(n * c.N * c.D);
    if (exact) {
      ASSERT_EQ(std::memcmp(want.data(), cache.data(), live * sizeof(T)), 0) << "s " << s;
    } else {
      std::vector<double> a(live), b(live);
      for (size_t i = 0; i < live; ++i) a[i] = dbl(want[i]), b[i] = dbl(cache[i]);
      ASSERT_TRUE(support::all_close(a, b, support::tolerance(support::kind_of<T>()))) << "s " << s;
    }
    for (size_t i = live; i < cache.size(); ++i)
      ASSERT_EQ(dbl(cache[i]), kSentinel) << "s " << s << ": a block written early";
  }
}

TEST(NsaCompressWithCache, StepByStepEqualsNsaCompressOfTheWholeSequence) {
  unsigned seed = 50;
  for (const auto& [l, d] : std::vector<std::pair<Index, Index>>{
           {16, 16}, {32, 16}, {32, 32}, {48, 16}, {64, 32}, {5, 2}, {12, 12}})
    for (Index page : {7, 64}) {
      step_by_step<half>(l, d, page, true, seed++);
      step_by_step<bfloat16>(l, d, page, true, seed++);
      step_by_step<float>(l, d, page, true, seed++);
      step_by_step<bfloat16>(l, d, page, false, seed++);
    }
}

TEST(NsaCompressWithCache, BitsDoNotDependOnTheThreadCount) {
  Wc<half> one(32, 16, 64, {48, 32, 64, 80, 96, 112, 128, 144}, 7);
  Wc<half> two = one;
  one.run({1});
  two.run({2});
  EXPECT_EQ(std::memcmp(one.cache.data(), two.cache.data(), one.cache.size() * sizeof(half)), 0);
}

// Padded views (every row of the input, the weight and the output cache padded) give the dense
// call's bits, and the padding and the unwritten rows stay as they were.
TEST(NsaCompressWithCache, PaddedViewsGiveTheDenseBits) {
  Wc<half> c(32, 16, 64, {48, 80, 70, 32}, 21);
  Wc<half> dense = c;
  dense.run();
  const Index pad = 5, N = c.N, D = c.D, nb = c.pool.blocks;
  std::vector<half> x(z(nb * 64 * N * (D + pad)), half(NAN)), w(z(c.l * (N + 2)), half(NAN)),
      o(z(c.rows * N * (D + pad)), half(kSentinel));
  for (Index r = 0; r < nb * 64 * N; ++r) std::copy_n(&c.pool.k[z(r * D)], D, &x[z(r * (D + pad))]);
  for (Index j = 0; j < c.l; ++j) std::copy_n(&c.w[z(j * N)], N, &w[z(j * (N + 2))]);
  auto in = c.inputs();
  in.input = StridedView<const half>(x.data(), {nb, 64, N, D},
                                     {64 * N * (D + pad), N * (D + pad), D + pad, 1});
  in.weight = StridedView<const half>(w.data(), {c.l, N}, {N + 2, 1});
  attnref::nsa_compress_with_cache(
      c.p, in, {StridedView<half>(o.data(), {c.rows, N, D}, {N * (D + pad), D + pad, 1})});
  for (Index r = 0; r < c.rows * N; ++r) {
    EXPECT_EQ(std::memcmp(&o[z(r * (D + pad))], &dense.cache[z(r * D)], z(D) * sizeof(half)), 0)
        << "row " << r / N << " head " << r % N;
    for (Index e = D; e < D + pad; ++e) EXPECT_EQ(dbl(o[z(r * (D + pad) + e)]), kSentinel);
  }
}

TEST(NsaCompressWithCache, RejectsBadInputBeforeWriting) {
  using Wh = Wc<half>;
  using P = attnref::NsaCompressWithCacheParams;
  const Wh base(32, 16, 64, {48, 100, 64, 10}, 3);  // batches 0 and 2 write
  ASSERT_TRUE(base.writes(0) && !base.writes(1) && base.writes(2) && !base.writes(3));
  struct Edit {
    std::function<void(Wh&, P&, attnref::NsaCompressWithCacheInputs<half>&,
                       attnref::NsaCompressWithCacheOutputs<half>&)>
        f;
    const char* what;
    bool oor;
  };
  const std::vector<Edit> edits = {
      {[](Wh& c, P&, auto&, auto&) { c.slot[2] = static_cast<i32>(c.rows); }, "slot_mapping[2]",
       true},
      {[](Wh& c, P&, auto&, auto&) { c.slot[0] = -1; }, "slot_mapping[0]", true},
      {[](Wh& c, P&, auto&, auto&) { c.slot[2] = c.slot[0]; }, "slot_mapping maps two", false},
      {[](Wh& c, P&, auto&, auto&) { c.pool.table[z(2 * c.pool.max_blocks)] = c.pool.blocks; },
       "block_table[2][0]", true},
      {[](Wh& c, P&, auto&, auto&) { c.pool.table[0] = -1; }, "block_table[0][0]", true},
      {[](Wh&, P&, auto& in, auto&) { in.act_seq_len[1] = -1; }, "act_seq_len[1]", false},
      {[](Wh& c, P&, auto& in, auto&) { in.act_seq_len[3] = c.pool.max_blocks * 64 + 1; },
       "act_seq_len[3]", false},
      {[](Wh&, P&, auto& in, auto&) { in.act_seq_len.pop_back(); }, "slot_mapping.shape", false},
      {[](Wh&, P&, auto& in, auto&) { in.act_seq_len.clear(); }, "act_seq_len", false},
      {[](Wh&, P& p, auto&, auto&) { p.act_seq_len_type = 0; }, "params.act_seq_len_type", false},
      {[](Wh&, P& p, auto&, auto&) { p.layout = "NSD"; }, "params.layout", false},
      {[](Wh&, P& p, auto&, auto&) { p.page_block_size = 128; }, "input.shape[1]", false},
      {[](Wh&, P& p, auto&, auto&) { p.compress_stride = 33; }, "compress_stride", false},
      {[](Wh&, P& p, auto&, auto&) { p.compress_stride = 8; }, "vendor rule", false},
      {[](Wh& c, P&, auto& in, auto&) {
         in.weight = StridedView<const half>(c.w.data(), {31, 3});
       },
       "weight.shape", false},
      {[](Wh& c, P&, auto&, auto& out) {
         out.output_cache = StridedView<half>(c.cache.data(), {c.rows, c.N, c.D - 1});
       },
       "output_cache.shape", false},
      {[](Wh& c, P&, auto&, auto& out) {
         out.output_cache = StridedView<half>(c.cache.data(), {4, c.N, c.D});
       },
       "output_cache.shape[0] too small", false},
      {[](Wh& c, P&, auto& in, auto&) {
         in.block_table = StridedView<const i32>(c.pool.table.data(), {3, c.pool.max_blocks});
       },
       "block_table.shape", false},
      {[](Wh& c, P&, auto& in, auto&) {
         in.input = StridedView<const half>(nullptr, {c.pool.blocks, 64, 3, 32});
       },
       "input", false},
  };
  for (const Edit& e : edits) {
    Wh c = base;
    P p = c.p;
    auto in = c.inputs();
    auto out = c.outputs();
    e.f(c, p, in, out);
    support::expect_validate_agrees([&] { attnref::validate(p, in, out); },
                                    [&] { attnref::nsa_compress_with_cache(p, in, out); });
    support::expect_throw([&] { attnref::nsa_compress_with_cache(p, in, out); }, e.what, e.oor);
    EXPECT_TRUE(c.untouched()) << e.what;
  }
  // A batch that writes nothing: its slot is not read (-1 is fine); its length still is.
  Wh c = base;
  c.slot[1] = -1;
  c.slot[3] = 1 << 30;
  EXPECT_NO_THROW(c.run());
}

TEST(NsaCompressWithCache, VendorRulesAreRelaxedByStrictFalse) {
  struct Rule {
    Index N, D, l, d, page;
    bool small_cache;
    const char* what;
  };
  for (const Rule& r : {Rule{51, 16, 32, 16, 64, false, "input.shape[2]"},
                        Rule{65, 16, 32, 16, 64, false, "input.shape[2]"},
                        Rule{2, 8, 32, 16, 64, false, "input.shape[3]"},
                        Rule{2, 272, 32, 16, 64, false, "input.shape[3]"},
                        Rule{2, 16, 80, 16, 64, false, "compress_block_size"},
                        Rule{2, 16, 32, 16, 32, false, "params.page_block_size"},
                        Rule{2, 16, 32, 16, 64, true, "output_cache.shape[0]"}}) {
    Wc<half> s(r.l, r.d, r.page, {r.l, 2 * r.l}, 11, false, r.N, r.D);
    if (r.small_cache) {
      s.rows = 2;
      s.cache.assign(z(s.rows * r.N * r.D), half(kSentinel));
      s.slot = {0, 1};
    }
    SCOPED_TRACE(r.what);
    support::expect_throw([&] { s.run(); }, r.what, false);
    EXPECT_TRUE(s.untouched());
    s.p.strict = false;
    EXPECT_NO_THROW(s.run());
    EXPECT_FALSE(s.untouched());
  }
}

}  // namespace compress_with_cache_test
