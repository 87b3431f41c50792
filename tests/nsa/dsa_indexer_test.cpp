// lightning_indexer (CANN LightningIndexer, DeepSeek-V3.2's token selector) against the
// independent reference tests/reference/dsa.hpp (the score in double, an explicit stable sort):
// on integer data every fp32 step is exact, so indices (tie order included: lower key first) and
// values match exactly in BSND / TND queries over BSND / TND / PA_BSND keys, sparse_mode 0 and 3,
// sparse_count below and above the visible length, empty batches and padded BSND rows; on
// normal data the selection is the reference's up to near-ties. The head sum follows the vendor
// kernel's order (a spelled-out expectation; a sequential sum differs). Layouts and thread
// counts give the same bits. Every rule's rejection names its argument and writes nothing.

#include <gtest/gtest.h>

#include <attnref/dsa/lightning_indexer.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "nsa/dsa_support.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"

namespace dsa_indexer_test {

using namespace dsa_support;
using attnref::bfloat16;
using attnref::half;

template <class T, class TW = T>
struct Call {
  attnref::LightningIndexerParams p;
  attnref::LightningIndexerInputs<T, TW> in;
  std::vector<TW> w;
  std::vector<i32> idx;
  std::vector<T> val;
  std::vector<long> oshape;

  explicit Call(const Data<T>& d) {
    const Case& c = d.c;
    p.layout_query = c.lq, p.layout_key = c.lkv, p.sparse_count = c.K;
    p.sparse_mode = c.causal ? 3 : 0, p.strict = c.strict;
    p.return_value = c.lkv != "PA_BSND";
    for (const T& x : d.w) w.push_back(TW(static_cast<float>(x)));
    in.query = {d.q.data(), d.qshape(c.D)};
    in.key = {d.k.data(), d.kshape(c.D)};
    std::vector<long> ws = d.qshape(c.D);
    ws.pop_back();
    in.weights = {w.data(), ws};
    if (c.lkv == "PA_BSND") in.block_table = {d.bt.data(), {d.B, d.maxb}};
    if (c.pass_qlen || c.lq == "TND") in.actual_seq_lengths_query = d.aq;
    if (c.pass_kvlen || c.lkv != "BSND") in.actual_seq_lengths_key = d.akv;
    oshape = d.qshape(static_cast<int>(c.K));
    oshape[oshape.size() - 2] = c.N2;
    idx.assign(z(long{d.rows} * c.N2 * c.K), 5555);
    val.assign(idx.size(), T(-7.0f));
  }
  attnref::LightningIndexerOutputs<T> outs() {
    attnref::LightningIndexerOutputs<T> o;
    o.sparse_indices = {idx.data(), oshape};
    if (p.return_value) o.sparse_values = {val.data(), oshape};
    return o;
  }
  void run(int threads = 0) {
    attnref::ExecConfig x;
    x.threads = threads;
    attnref::lightning_indexer(p, in, outs(), x);
  }
};

Case shape(const std::string& lq, const std::string& lkv, bool causal, long count) {
  Case c;
  c.lq = lq, c.lkv = lkv, c.causal = causal, c.K = count, c.N1 = 8, c.D = 128, c.Dr = 0;
  c.qlen = {3, 0, 5, 1}, c.kvlen = {40, 9, 600, 0}, c.bs = 64;
  if (lq == "BSND") c.S1 = 6;
  c.ints = 3, c.seed = static_cast<unsigned>(count + causal * 5 + lq.size() + lkv.size() * 11);
  return c;
}

// Exact: integer data, every product and sum exact in fp32.
template <class T>
void expect_exact(const Case& c) {
  Data<T> d(c);
  Call<T> call(d);
  call.run();
  SCOPED_TRACE(c.lq + " / " + c.lkv + (c.causal ? " causal" : " mode 0") + " count " +
               std::to_string(c.K));
  std::vector<i32> want(call.idx.size(), -1);
  std::vector<double> wval(call.idx.size(), -INFINITY);
  for (int b = 0; b < d.B; ++b) {
    const auto t = ref::dsa::indexer_topk(d.sh, d.bat[z(b)], c.K);
    const auto s = ref::dsa::indexer_scores(d.sh, d.bat[z(b)]);
    for (size_t e = 0; e < t.size(); ++e) {
      const size_t o = z(long{d.row0[z(b)]} * c.N2 * c.K) + e;
      want[o] = t[e];
      if (t[e] >= 0) {
        const size_t row = e / z(c.K);  // (i, g)
        wval[o] = support::rnd<T>(s[row * z(d.bat[z(b)].kv_len) + z(t[e])]);
      }
    }
  }
  EXPECT_EQ(call.idx, want);
  if (call.p.return_value) {
    EXPECT_TRUE(support::all_close(wval, support::as_doubles(call.val), {0.0, 0.0}));
  }
}

TEST(DsaIndexer, ExactOnIntegerDataInEveryLayoutPairWithTiesToTheLowerKey) {
  for (const char* lq : {"BSND", "TND"})
    for (const char* lkv : {"SAME", "PA_BSND"})
      for (bool causal : {true, false})
        for (long count : {16L, 2048L}) {
          const std::string kv = std::string(lkv) == "SAME" ? lq : lkv;
          expect_exact<bfloat16>(shape(lq, kv, causal, count));
        }
  Case h = shape("TND", "PA_BSND", true, 100);
  h.N1 = 20;  // more than 16 heads: the lane sums
  expect_exact<half>(h);
}

TEST(DsaIndexer, NormalDataSelectsTheReferenceTopKUpToNearTies) {
  Case c = shape("TND", "PA_BSND", true, 64);
  c.ints = 0, c.N1 = 16, c.seed = 77;
  Data<bfloat16> d(c);
  Call<bfloat16> call(d);
  call.run();
  for (int b = 0; b < d.B; ++b) {
    const auto s = ref::dsa::indexer_scores(d.sh, d.bat[z(b)]);
    const long kv = d.bat[z(b)].kv_len;
    for (int i = 0; i < c.qlen[z(b)]; ++i) {
      const long lim = ref::dsa::visible(d.sh, d.bat[z(b)], i);
      const i32* got = call.idx.data() + long{d.row0[z(b)] + i} * c.K;
      const double* row = s.data() + long{i} * kv;
      std::vector<char> chosen(z(kv), 0);
      const long n = std::min(c.K, lim);
      double low = INFINITY;
      for (long e = 0; e < c.K; ++e) {
        if (e >= n) {
          EXPECT_EQ(got[e], -1);
          continue;
        }
        ASSERT_TRUE(got[e] >= 0 && got[e] < lim) << got[e];
        EXPECT_FALSE(chosen[z(got[e])]) << "repeated " << got[e];
        chosen[z(got[e])] = 1;
        if (e > 0) {
          EXPECT_GE(row[got[e - 1]], row[got[e]] - 1e-3 * (1 + std::fabs(row[got[e]])));
        }
        low = std::min(low, row[got[e]]);
      }
      for (long t = 0; t < lim; ++t)
        if (!chosen[z(t)]) {
          EXPECT_LE(row[t], low + 1e-3 * (1 + std::fabs(low))) << t;
        }
    }
  }
}

TEST(DsaIndexer, HeadSumFollowsTheKernelOrder) {
  // Lane l sums heads l, l + 16, ...; lanes [p, r) fold onto [0, r - p); then a halving tree.
  auto spelled = [](const std::vector<float>& x) {
    const int G = static_cast<int>(x.size()), r = std::min(16, G);
    std::vector<float> lane(x.begin(), x.begin() + r);
    for (int h = 16; h < G; ++h) lane[z(h % 16)] += x[z(h)];
    int p = 1;
    while (p * 2 <= r) p *= 2;
    for (int l = 0; l + p < r; ++l) lane[z(l)] += lane[z(l + p)];
    for (int w = p / 2; w >= 1; w /= 2)
      for (int l = 0; l < w; ++l) lane[z(l)] += lane[z(l + w)];
    return lane[0];
  };
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  bool differs = false;
  for (int G : {1, 2, 3, 5, 16, 17, 20, 33, 64}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> x(z(G));
      for (float& v : x) v = u(rng) * std::pow(10.0f, static_cast<float>(trial % 7));
      std::vector<float> buf = x;
      float got = 0.0f;
      attnref::detail::indexer_head_sum(buf.data(), G, 1, 1, &got);
      EXPECT_EQ(got, spelled(x)) << "G " << G;
      float seq = 0.0f;
      for (float v : x) seq += v;
      differs = differs || seq != got;
    }
  }
  EXPECT_TRUE(differs) << "the kernel order never differed from a sequential sum";
}

TEST(DsaIndexer, LayoutsAndThreadsGiveTheSameBits) {
  std::vector<i32> first;
  for (const char* lkv : {"TND", "PA_BSND"}) {
    Case c = shape("TND", lkv, true, 32);
    c.ints = 0, c.seed = 8, c.qlen = {17, 20}, c.kvlen = {700, 30};
    Data<bfloat16> d(c);
    Call<bfloat16> one(d), two(d);
    one.p.return_value = two.p.return_value = false;
    one.run(1), two.run(2);
    EXPECT_EQ(one.idx, two.idx);
    if (first.empty()) first = one.idx;
    EXPECT_EQ(first, one.idx) << lkv;
  }
  // One row (decode): with two workers its 9000 keys are scored in chunks on both.
  Case d = shape("BSND", "PA_BSND", false, 300);
  d.ints = 0, d.qlen = {1}, d.kvlen = {9000}, d.S1 = 1, d.seed = 4;
  Data<bfloat16> dd(d);
  Call<bfloat16> one(dd), two(dd);
  one.run(1), two.run(2);
  EXPECT_EQ(one.idx, two.idx);
  EXPECT_EQ(std::count(one.idx.begin(), one.idx.end(), -1), 0);
}

TEST(DsaIndexer, FloatWeightsAndEveryRuleRejectsByName) {
  Case c = shape("TND", "TND", true, 16);
  Data<bfloat16> d(c);
  Call<bfloat16, float> fw(d);  // fp32 weights (the vendor's A2 / A3 kernel takes them)
  fw.run();
  Call<bfloat16> bw(d);
  bw.run();
  EXPECT_EQ(fw.idx, bw.idx);  // integer weights: the same scores
  auto expect = [&](auto edit, const std::string& frag, bool oor = false) {
    Data<bfloat16> e = d;
    Call<bfloat16> call(e);
    edit(e, call);
    SCOPED_TRACE(frag);
    support::expect_throw([&] { call.run(); }, frag, oor);
    for (i32 v : call.idx) ASSERT_EQ(v, 5555);
  };
  using D = Data<bfloat16>;
  using C = Call<bfloat16>;
  expect([](D&, C& x) { x.p.sparse_count = 0; }, "params.sparse_count");
  expect([](D&, C& x) { x.p.sparse_count = 2500; }, "params.sparse_count");
  expect([](D&, C& x) { x.p.sparse_mode = 2; }, "params.sparse_mode");
  expect([](D&, C& x) { x.p.next_tokens = 0; }, "next_tokens");
  expect([](D&, C& x) { x.p.layout_key = "BSND"; }, "key.shape");
  expect([](D&, C& x) { x.p.layout_query = "BSH"; }, "layout_query");
  expect([](D&, C& x) { x.in.actual_seq_lengths_key = {}; }, "actual_seq_lengths_key");
  expect([](D&, C& x) { x.in.actual_seq_lengths_key[1] = 3; }, "actual_seq_lengths_key[1]");
  expect([](D& e, C& x) { x.in.weights = {x.w.data(), {e.rows, 4}}; }, "weights.shape");
  expect([](D& e, C& x) { x.in.query = {e.q.data(), {e.rows, 2, 512}}; }, "key.shape");
  expect([](D& e, C& x) { x.in.query = {nullptr, {e.rows, 8, 128}}; }, "query");
  Case p = shape("BSND", "PA_BSND", true, 16);
  Data<bfloat16> dp(p);
  Call<bfloat16> cp(dp);
  cp.p.return_value = true;
  support::expect_throw([&] { cp.run(); }, "params.return_value", false);
  cp.p.return_value = false;
  dp.bt[0] = static_cast<i32>(dp.nb);
  support::expect_throw([&] { cp.run(); }, "block_table[0][0]", true);
  for (i32 v : cp.idx) ASSERT_EQ(v, 5555);
  Case r = shape("BSND", "BSND", false, 8);  // D 64: a vendor rule; relaxed, exact as above
  r.D = 64;
  Data<bfloat16> dr(r);
  Call<bfloat16> cr(dr);
  support::expect_throw([&] { cr.run(); }, "query.shape (D)", false);
  r.strict = false;
  expect_exact<bfloat16>(r);
}

}  // namespace dsa_indexer_test
