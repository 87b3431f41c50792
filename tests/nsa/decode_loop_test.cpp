// nsa_update_compressed_cache and the NSA decode loop: raw tokens appended step by step (one to
// four at a time, some steps none) with the compressed caches kept current, checked after every
// update against the vendor-tree reference (every compressed token written exactly once, when
// its block completes, nothing else touched); N loop steps of nsa_decode_step equal N
// independent steps on freshly compressed caches, bit for bit; bad input throws with the caches
// untouched.

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/nsa/compress_with_cache.hpp>
#include <attnref/nsa/decode_step.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "nsa/compress_with_cache_support.hpp"
#include "support/cast.hpp"
#include "support/errors.hpp"
#include "support/nsa_paged.hpp"

namespace decode_loop_test {

using attnref::half;
using attnref::Index;
using attnref::StridedView;
using compress_with_cache_support::tokens;
using compress_with_cache_support::vendor_token;
using support::dbl;
using support::z;
using i32 = std::int32_t;
constexpr float kSentinel = 7.0f;

/// B sequences whose raw K / V grow from a prompt to `final` tokens in a paged cache (rows of
/// tokens not yet appended hold NaN), and paged compressed caches (sentinel until written) with
/// distinct shuffled blocks per sequence.
template <class T>
struct Loop {
  Index KVN = 2, Dqk = 32, Dv = 16, cpbs = 4;
  attnref::NsaDecodeParams p;
  std::vector<long> len, fin;
  std::vector<std::vector<double>> kx, vx;
  support::PagedPool<T> full;
  std::vector<T> k, v, ck, cv, wk, wv;
  std::vector<double> wkd, wvd;
  std::vector<i32> ctable;
  Index cnb = 0, cmb = 0;

  Loop(Index l, Index d, Index pbs, std::vector<long> prompt, std::vector<long> final_len,
       unsigned seed)
      : len(std::move(prompt)), fin(std::move(final_len)) {
    p.num_heads = 4;
    p.num_key_value_heads = KVN;
    p.compress_block_size = l;
    p.compress_block_stride = d;
    p.select_block_size = 4 * d;
    p.select_block_count = 2;
    p.window_size = 8;
    p.page_block_size = pbs;
    p.cmp_page_block_size = cpbs;
    p.scale_value = 0.2;
    p.strict = false;
    std::mt19937 rng(seed);
    for (long n : fin) {
      kx.push_back(tokens<T>(n, KVN, Dqk, rng, false));
      vx.push_back(tokens<T>(n, KVN, Dv, rng, false));
    }
    full = support::page_tokens<T>(
        fin, static_cast<int>(pbs), static_cast<int>(KVN * Dqk), static_cast<int>(KVN * Dv),
        [&](size_t b) -> const std::vector<double>& { return kx[b]; },
        [&](size_t b) -> const std::vector<double>& { return vx[b]; }, 1, seed + 1);
    k = full.k, v = full.v;
    for (Index b = 0; b < B(); ++b)
      for (long t = len[z(b)]; t < fin[z(b)]; ++t) set_row(b, t, true);
    std::normal_distribution<double> nd;
    for (Index i = 0; i < l * KVN; ++i) {
      wkd.push_back(support::rnd<T>(0.2 * nd(rng)));
      wvd.push_back(support::rnd<T>(0.2 * nd(rng)));
    }
    for (double x : wkd) wk.push_back(T(static_cast<float>(x)));
    for (double x : wvd) wv.push_back(T(static_cast<float>(x)));
    for (long n : fin)
      cmb = std::max(cmb, (attnref::nsa_compressed_count(n, l, d) + cpbs - 1) / cpbs);
    cnb = B() * cmb + 3;
    std::vector<i32> pool(z(cnb));
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);
    ctable.assign(pool.begin(), pool.begin() + B() * cmb);
    ck.assign(z(cnb * cpbs * KVN * Dqk), T(kSentinel));
    cv.assign(z(cnb * cpbs * KVN * Dv), T(kSentinel));
  }
  Index B() const { return static_cast<Index>(len.size()); }
  // Token t of batch b in the live caches: NaN (not yet appended) or its value.
  void set_row(Index b, long t, bool nan) {
    const Index pbs = p.page_block_size;
    const Index r = full.table[z(b * full.max_blocks + t / pbs)] * pbs + t % pbs;
    for (Index e = 0; e < KVN * Dqk; ++e)
      k[z(r * KVN * Dqk + e)] = nan ? T(NAN) : full.k[z(r * KVN * Dqk + e)];
    for (Index e = 0; e < KVN * Dv; ++e)
      v[z(r * KVN * Dv + e)] = nan ? T(NAN) : full.v[z(r * KVN * Dv + e)];
  }
  void append(Index b, long n) {
    for (long t = len[z(b)]; t < len[z(b)] + n; ++t) set_row(b, t, false);
    len[z(b)] += n;
  }
  attnref::NsaCacheUpdateInputs<T> update_inputs(std::vector<std::int64_t> added) const {
    attnref::NsaCacheUpdateInputs<T> in;
    const Index pbs = p.page_block_size, nb = full.blocks;
    in.key = StridedView<const T>(k.data(), {nb, pbs, KVN * Dqk});
    in.value = StridedView<const T>(v.data(), {nb, pbs, KVN * Dv});
    in.block_table = StridedView<const i32>(full.table.data(), {B(), full.max_blocks});
    in.key_weight = StridedView<const T>(wk.data(), {p.compress_block_size, KVN});
    in.value_weight = StridedView<const T>(wv.data(), {p.compress_block_size, KVN});
    in.cmp_block_table = StridedView<const i32>(ctable.data(), {B(), cmb});
    in.actual_sel_kv_seq_len.assign(len.begin(), len.end());
    in.actual_new_kv_len = std::move(added);
    return in;
  }
  attnref::NsaCacheUpdateOutputs<T> cmp_outputs() {
    return {StridedView<T>(ck.data(), {cnb, cpbs, KVN * Dqk}),
            StridedView<T>(cv.data(), {cnb, cpbs, KVN * Dv})};
  }
  void update(std::vector<std::int64_t> added) {
    attnref::nsa_update_compressed_cache(p, update_inputs(std::move(added)), cmp_outputs());
  }
  bool untouched() const {
    auto sentinel = [](T x) { return dbl(x) == kSentinel; };
    return std::all_of(ck.begin(), ck.end(), sentinel) &&
           std::all_of(cv.begin(), cv.end(), sentinel);
  }
};

/// Every compressed token of every batch is the vendor-tree compression of its raw block (K and
/// V), and every other row of both compressed caches still holds the sentinel.
template <class T>
void expect_current(const Loop<T>& s) {
  const Index l = s.p.compress_block_size, d = s.p.compress_block_stride, cpbs = s.cpbs;
  std::vector<bool> live(z(s.cnb * cpbs), false);
  for (Index b = 0; b < s.B(); ++b)
    for (Index i = 0; i < attnref::nsa_compressed_count(s.len[z(b)], l, d); ++i) {
      const Index row = s.ctable[z(b * s.cmb + i / cpbs)] * cpbs + i % cpbs;
      live[z(row)] = true;
      const auto wk = vendor_token<T>(s.kx[z(b)], i * d + l, s.KVN, s.Dqk, s.wkd, l);
      const auto wv = vendor_token<T>(s.vx[z(b)], i * d + l, s.KVN, s.Dv, s.wvd, l);
      ASSERT_EQ(std::memcmp(wk.data(), &s.ck[z(row * s.KVN * s.Dqk)], wk.size() * sizeof(T)), 0)
          << "K batch " << b << " compressed token " << i << " (raw length " << s.len[z(b)] << ")";
      ASSERT_EQ(std::memcmp(wv.data(), &s.cv[z(row * s.KVN * s.Dv)], wv.size() * sizeof(T)), 0)
          << "V batch " << b << " compressed token " << i;
    }
  for (Index row = 0; row < s.cnb * cpbs; ++row) {
    if (live[z(row)]) continue;
    for (Index e = 0; e < s.KVN * s.Dqk; ++e)
      ASSERT_EQ(dbl(s.ck[z(row * s.KVN * s.Dqk + e)]), kSentinel) << "K row " << row;
    for (Index e = 0; e < s.KVN * s.Dv; ++e)
      ASSERT_EQ(dbl(s.cv[z(row * s.KVN * s.Dv + e)]), kSentinel) << "V row " << row;
  }
}

// A prompt compressed whole (new = its length), then steps that append 1, 1..4 or 0/1/4 tokens
// per sequence, across more than two strides' worth of block boundaries.
template <class T>
void grow(Index l, Index d, Index pbs, unsigned seed) {
  SCOPED_TRACE(::testing::Message() << "l " << l << " d " << d << " page " << pbs);
  const std::vector<long> prompt = {static_cast<long>(l) - 1, static_cast<long>(l + d) + 3, 0};
  const long steps = 2 * d + 3;
  std::vector<long> fin;
  for (long n : prompt) fin.push_back(n + 4 * steps);
  Loop<T> s(l, d, pbs, prompt, fin, seed);
  s.update({prompt.begin(), prompt.end()});
  expect_current(s);
  const std::vector<std::vector<long>> added = {{1}, {1, 2, 3, 4}, {0, 1, 4}};
  for (long step = 0; step < steps; ++step) {
    std::vector<std::int64_t> n;
    for (Index b = 0; b < s.B(); ++b) {
      const auto& cycle = added[z(b)];
      n.push_back(step % 5 == 0 ? 1 : cycle[z(step) % cycle.size()]);
      s.append(b, n.back());
    }
    if (step % 5 == 0) n.clear();  // empty: one new token each
    s.update(n);
    expect_current(s);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(NsaUpdateCompressedCache, KeepsTheCompressedCachesCurrentStepByStep) {
  grow<half>(32, 16, 64, 1);
  grow<half>(16, 16, 16, 2);
  grow<float>(5, 2, 3, 3);  // several blocks complete in one multi-token step
  grow<attnref::bfloat16>(12, 4, 7, 4);
}

// The loop: a prompt compressed, then 2·d + 1 decode steps (one token appended to every
// sequence, its compressed caches updated, nsa_decode_step); each step's output and top-k equal
// those of an independent step on caches compressed afresh from the whole raw sequence.
TEST(NsaUpdateCompressedCache, DecodeLoopEqualsIndependentStepsOnFreshCaches) {
  const Index l = 16, d = 8;
  const std::vector<long> prompt = {40, 67};
  const long steps = 2 * d + 1;
  Loop<half> s(l, d, 16, prompt, {40 + steps, 67 + steps}, 9);
  s.update({prompt.begin(), prompt.end()});
  std::mt19937 rng(10);
  std::normal_distribution<float> nd;
  const Index N = s.p.num_heads, kk = s.p.select_block_count;
  for (long step = 0; step < steps; ++step) {
    for (Index b = 0; b < s.B(); ++b) s.append(b, 1);
    s.update({});
    std::vector<half> q(z(s.B() * N * s.Dqk));
    for (half& x : q) x = half(nd(rng));
    std::vector<float> gates(z(s.B() * N * 3));
    for (float& g : gates) g = 1.0f / (1.0f + std::exp(-nd(rng)));
    auto run = [&](const std::vector<half>& ck, const std::vector<half>& cv, std::vector<half>& o,
                   std::vector<i32>& topk) {
      attnref::NsaDecodeInputs<half> in;
      const auto u = s.update_inputs({});
      in.query = StridedView<const half>(q.data(), {s.B(), N, s.Dqk});
      in.key = u.key;
      in.value = u.value;
      in.block_table = u.block_table;
      in.cmp_key = StridedView<const half>(ck.data(), {s.cnb, s.cpbs, s.KVN * s.Dqk});
      in.cmp_value = StridedView<const half>(cv.data(), {s.cnb, s.cpbs, s.KVN * s.Dv});
      in.cmp_block_table = u.cmp_block_table;
      in.gates = StridedView<const float>(gates.data(), {s.B(), N, 3});
      in.actual_sel_kv_seq_len = u.actual_sel_kv_seq_len;
      o.assign(z(s.B() * N * s.Dv), half(0.0f));
      topk.assign(z(s.B() * s.KVN * kk), -2);
      attnref::NsaDecodeOutputs<half> out;
      out.output = StridedView<half>(o.data(), {s.B(), N, s.Dv});
      out.topk = StridedView<i32>(topk.data(), {s.B(), s.KVN, kk});
      attnref::nsa_decode_step(s.p, in, out);
    };
    std::vector<half> o_loop, o_fresh;
    std::vector<i32> t_loop, t_fresh;
    run(s.ck, s.cv, o_loop, t_loop);
    Loop<half> fresh = s;  // the same raw caches, compressed caches compressed anew
    std::fill(fresh.ck.begin(), fresh.ck.end(), half(kSentinel));
    std::fill(fresh.cv.begin(), fresh.cv.end(), half(kSentinel));
    fresh.update({fresh.len.begin(), fresh.len.end()});
    run(fresh.ck, fresh.cv, o_fresh, t_fresh);
    ASSERT_EQ(t_loop, t_fresh) << "step " << step;
    ASSERT_EQ(std::memcmp(o_loop.data(), o_fresh.data(), o_loop.size() * sizeof(half)), 0)
        << "step " << step;
    ASSERT_TRUE(
        std::all_of(o_loop.begin(), o_loop.end(), [](half x) { return std::isfinite(dbl(x)); }));
  }
  expect_current(s);
}

TEST(NsaUpdateCompressedCache, RejectsBadInputWithTheCachesUntouched) {
  using L = Loop<half>;
  const L base(32, 16, 64, {100, 47}, {140, 90}, 5);
  using In = attnref::NsaCacheUpdateInputs<half>;
  using Out = attnref::NsaCacheUpdateOutputs<half>;
  struct Edit {
    std::function<void(L&, attnref::NsaDecodeParams&, In&, Out&)> f;
    const char* what;
    bool oor;
  };
  const std::vector<Edit> edits = {
      {[](L& s, auto&, In&, Out&) { s.ctable[0] = static_cast<i32>(s.cnb); },
       "cmp_block_table[0][0]", true},
      {[](L& s, auto&, In&, Out&) { s.ctable[z(s.cmb)] = -1; }, "cmp_block_table[1][0]", true},
      {[](L& s, auto&, In&, Out&) { s.full.table[0] = -3; }, "block_table[0][0]", true},
      {[](L& s, auto&, In&, Out&) { s.ctable[z(s.cmb)] = s.ctable[0]; }, "cmp_block_table maps two",
       false},
      {[](L&, auto&, In& in, Out&) {
         in.actual_new_kv_len = {101, 1};
       },
       "actual_new_kv_len[0]", false},
      {[](L&, auto&, In& in, Out&) { in.actual_new_kv_len = {1}; }, "actual_new_kv_len", false},
      {[](L&, auto&, In& in, Out&) { in.actual_sel_kv_seq_len[1] = 10000; },
       "actual_sel_kv_seq_len[1] out of range", false},
      {[](L& s, auto&, In& in, Out&) {
         in.cmp_block_table = StridedView<const i32>(s.ctable.data(), {2, 1});
       },
       "needs more compressed tokens", false},
      {[](L& s, auto&, In& in, Out&) {
         in.key_weight = StridedView<const half>(s.wk.data(), {31, s.KVN});
       },
       "key_weight.shape", false},
      {[](L& s, auto&, In&, Out& out) {
         out.cmp_value = StridedView<half>(s.cv.data(), {s.cnb, s.cpbs, s.KVN * s.Dv - 1});
       },
       "cmp_value.shape", false},
      {[](L& s, auto&, In&, Out& out) {
         out.cmp_key = StridedView<half>(s.k.data(), {s.cnb, s.cpbs, s.KVN * s.Dqk});
       },
       "overlaps", false},
      {[](L&, attnref::NsaDecodeParams& p, In&, Out&) { p.compress_block_stride = 40; },
       "compress_block_stride", false},
      {[](L&, attnref::NsaDecodeParams& p, In&, Out&) {
         p.strict = true;
         p.compress_block_stride = 8;
       },
       "vendor rule", false},
  };
  for (const Edit& e : edits) {
    L s = base;
    attnref::NsaDecodeParams p = s.p;
    In in = s.update_inputs({100, 47});
    Out out = s.cmp_outputs();
    e.f(s, p, in, out);
    SCOPED_TRACE(e.what);
    support::expect_validate_agrees([&] { attnref::validate(p, in, out); },
                                    [&] { attnref::nsa_update_compressed_cache(p, in, out); });
    support::expect_throw([&] { attnref::nsa_update_compressed_cache(p, in, out); }, e.what, e.oor);
    EXPECT_TRUE(s.untouched());
  }
  L s = base;
  s.update({100, 47});
  EXPECT_FALSE(s.untouched());
  expect_current(s);
}

}  // namespace decode_loop_test
