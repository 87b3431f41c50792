// sparse_flash_attention (CANN SparseFlashAttention, DeepSeek-V3.2's sparse MLA attention)
// against the independent reference tests/reference/dsa.hpp: BSND / TND queries over BSND / TND
// / PA_BSND keys (shuffled block pool, NaN in every key row no query may read and in one
// never-selected block per batch), sparse_block_size 1 / 4 / 16 with the tail block clipped,
// sparse_mode 0 and 3, -1 tails, entries past the causal limit and the vendor's slot rule,
// repeated entries, empty rows and padded BSND rows (NaN queries, garbage lists). Metamorphic:
// the layouts give the same bits, as do thread counts and permuted lists; a block of b tokens ==
// its b single tokens. Hand-worked: one visible token gives its value row; with q = 0 a repeated
// entry weighs twice. Every rule's rejection names its argument and writes nothing.

#include <gtest/gtest.h>

#include <attnref/dsa/sparse_flash_attention.hpp>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "nsa/dsa_support.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"

namespace dsa_sparse_attention_test {

using namespace dsa_support;
using attnref::bfloat16;
using attnref::half;

template <class T>
struct Call {
  attnref::SparseFlashAttentionParams p;
  attnref::SparseFlashAttentionInputs<T> in;
  std::vector<T> out;
  std::vector<long> oshape;

  explicit Call(const Data<T>& d) {
    const Case& c = d.c;
    p.scale_value = c.scale, p.sparse_block_size = c.sbs, p.layout_query = c.lq;
    p.layout_kv = c.lkv, p.sparse_mode = c.causal ? 3 : 0, p.strict = c.strict;
    in.query = {d.q.data(), d.qshape(c.D)};
    in.query_rope = {d.qr.data(), d.qshape(c.Dr)};
    in.key = {d.k.data(), d.kshape(c.D)};
    in.key_rope = {d.kr.data(), d.kshape(c.Dr)};
    std::vector<long> is = d.qshape(static_cast<int>(c.K));
    is[is.size() - 2] = c.N2;
    in.sparse_indices = {d.idx.data(), is};
    if (c.lkv == "PA_BSND") in.block_table = {d.bt.data(), {d.B, d.maxb}};
    if (c.pass_qlen || c.lq == "TND") in.actual_seq_lengths_query = d.aq;
    if (c.pass_kvlen || c.lkv != "BSND") in.actual_seq_lengths_kv = d.akv;
    oshape = d.qshape(c.D);
    out.assign(z(long{d.rows} * c.N1 * c.D), T(-7.0f));
  }
  void run(int threads = 0) {
    attnref::ExecConfig x;
    x.threads = threads;
    attnref::sparse_flash_attention(
        p, in, attnref::SparseFlashAttentionOutputs<T>{{out.data(), oshape}}, x);
  }
};

Case vendor(const std::string& lq, const std::string& lkv, long sbs, bool causal) {
  Case c;
  c.lq = lq, c.lkv = lkv, c.sbs = sbs, c.causal = causal, c.N1 = 4, c.K = 6, c.bs = 32;
  c.qlen = {3, 1, 4}, c.kvlen = {45, 7, 70};
  if (lq == "BSND") c.S1 = 5, c.qlen = {3, 1, 4};
  if (lkv == "BSND") c.S2 = 72;
  c.seed = static_cast<unsigned>(sbs * 7 + causal + lq.size() * 3 + lkv.size());
  return c;
}

template <class T>
void expect_matches(const Case& c, double dup = 0.0) {
  Data<T> d(c);
  d.sfa_lists(dup);
  Call<T> call(d);
  call.run();
  SCOPED_TRACE(c.lq + " / " + c.lkv + " sbs " + std::to_string(c.sbs) +
               (c.causal ? " causal" : " mode 0"));
  EXPECT_TRUE(support::all_close(d.sfa_expected(), support::as_doubles(call.out),
                                 support::tolerance(support::kind_of<T>())));
}

TEST(DsaSparseAttention, MatchesReferenceInEveryLayoutPairAndBlockSize) {
  for (const char* lq : {"BSND", "TND"})
    for (const char* lkv : {"BSND", "PA_BSND"})
      for (long sbs : {1L, 4L, 16L})
        for (bool causal : {true, false}) {
          Case c = vendor(lq, std::string(lkv) == "BSND" ? lq : lkv, sbs, causal);
          if (sbs == 16) c.K = 4;
          expect_matches<bfloat16>(c);
        }
}

TEST(DsaSparseAttention, Fp16RepeatedEntriesGqaAndRelaxedShapes) {
  Case c = vendor("TND", "PA_BSND", 4, true);
  expect_matches<half>(c, 0.3);  // repeated entries count twice
  Case r = vendor("BSND", "BSND", 8, true);
  r.strict = false, r.N1 = 6, r.N2 = 2, r.D = 40, r.Dr = 8, r.K = 9, r.seed = 5;
  expect_matches<float>(r, 0.2);
  r.lkv = "PA_BSND", r.bs = 12, r.sbs = 8;  // relaxed: pages of gcd(8, 12) = 4 tokens
  expect_matches<float>(r, 0.2);
  Case t = vendor("TND", "TND", 2, false);
  t.strict = false, t.D = 24, t.Dr = 4;
  expect_matches<float>(t);
}

TEST(DsaSparseAttention, MoreThan64HeadsRunInGroupsWithTheSameResultOnAnyThreadCount) {
  for (int n1 : {128, 96}) {  // 2 groups of 64 / of 48 (relaxed)
    Case c = vendor("BSND", "PA_BSND", 1, true);
    c.N1 = n1, c.strict = n1 == 128, c.qlen = {1, 1}, c.kvlen = {50, 130}, c.S1 = 1, c.K = 40;
    Data<bfloat16> d(c);
    d.sfa_lists();
    Call<bfloat16> one(d), two(d);
    one.run(1), two.run(2);
    EXPECT_TRUE(support::all_close(d.sfa_expected(), support::as_doubles(one.out),
                                   support::tolerance(support::Kind::BF16)));
    EXPECT_TRUE(support::bitwise_equal(support::as_floats(one.out), support::as_floats(two.out)));
  }
}

TEST(DsaSparseAttention, LayoutsThreadsAndListOrderGiveTheSameBits) {
  std::vector<bfloat16> first;
  for (const char* lkv : {"BSND", "PA_BSND"})
    for (const char* lq : {"TND", "BSND"}) {
      Case c = vendor("TND", lkv, 4, true);
      c.lq = lq, c.lkv = std::string(lkv) == "BSND" ? lq : lkv;
      c.S1 = 4, c.S2 = 70, c.seed = 9;
      Data<bfloat16> d(c);
      d.sfa_lists(0.2);
      Call<bfloat16> one(d);
      one.run(1);
      std::vector<bfloat16> live;  // the live rows, batch-major
      for (int b = 0; b < d.B; ++b)
        for (long e = 0; e < long{c.qlen[z(b)]} * c.N1 * c.D; ++e)
          live.push_back(one.out[z(long{d.row0[z(b)]} * c.N1 * c.D + e)]);
      if (first.empty()) first = live;
      EXPECT_TRUE(support::bitwise_equal(support::as_floats(first), support::as_floats(live)))
          << lq << " / " << c.lkv;
      Call<bfloat16> two(d);
      two.run(2);
      EXPECT_TRUE(support::bitwise_equal(support::as_floats(one.out), support::as_floats(two.out)));
      // Valid entries permuted (within the slots the vendor reads: none past the limit here
      // matters for the set, so permute only the valid prefix of rows whose every entry is
      // visible).
      Data<bfloat16> e = d;
      std::mt19937 rng(3);
      for (int b = 0; b < e.B; ++b)
        for (int i = 0; i < c.qlen[z(b)]; ++i) {
          i32* l = e.idx.data() + (long{e.row0[z(b)] + i} * c.N2) * c.K;
          const long lim = ref::dsa::visible(e.sh, e.bat[z(b)], i);
          const long n = std::find(l, l + c.K, -1) - l;
          bool visible = n <= (lim + c.sbs - 1) / c.sbs;
          for (long s = 0; s < n; ++s) visible = visible && long{l[s]} * c.sbs < lim;
          if (visible) std::shuffle(l, l + n, rng);
        }
      Call<bfloat16> perm(e);
      perm.run(1);
      EXPECT_TRUE(
          support::bitwise_equal(support::as_floats(one.out), support::as_floats(perm.out)));
    }
}

TEST(DsaSparseAttention, ABlockOfBTokensEqualsItsSingleTokens) {
  Case c = vendor("TND", "PA_BSND", 4, false);
  c.bs = 16, c.K = 5, c.seed = 21;
  Data<bfloat16> blocks(c);
  blocks.sfa_lists();
  Case t = c;
  t.sbs = 1, t.K = c.K * c.sbs;
  Data<bfloat16> tokens(t);  // same seed: same data and block pool
  tokens.idx.assign(z(long{tokens.rows} * t.N2 * t.K), -1);
  for (int b = 0; b < blocks.B; ++b)
    for (int i = 0; i < c.qlen[z(b)]; ++i) {
      const i32* l = blocks.idx.data() + long{blocks.row0[z(b)] + i} * c.K;
      i32* o = tokens.idx.data() + long{tokens.row0[z(b)] + i} * t.K;
      for (long e = 0; e < c.K && l[e] != -1; ++e)
        for (long x = 0; x < c.sbs && long{l[e]} * c.sbs + x < c.kvlen[z(b)]; ++x)
          *o++ = static_cast<i32>(l[e] * c.sbs + x);
    }
  tokens.k = blocks.k, tokens.kr = blocks.kr;  // the poison block too
  Call<bfloat16> a(blocks), b(tokens);
  a.run(1), b.run(1);
  EXPECT_TRUE(support::bitwise_equal(support::as_floats(a.out), support::as_floats(b.out)));
}

TEST(DsaSparseAttention, HandWorkedSlotRuleRepeatsEmptyAndPaddedRows) {
  // One batch, 2 query rows, 12 keys, sbs 1, causal: row 0 sees keys [0, 11), row 1 [0, 12).
  Case c;
  c.lq = "BSND", c.lkv = "BSND", c.N1 = 2, c.K = 12, c.S1 = 3, c.qlen = {2}, c.kvlen = {12};
  Data<bfloat16> d(c);
  std::fill(d.q.begin(), d.q.end(), bfloat16(0.0f));  // q = 0: uniform weights
  std::fill(d.qr.begin(), d.qr.end(), bfloat16(0.0f));
  for (long e = 0; e < long{d.rows} * c.N1 * c.D; ++e)
    if (e >= 2L * c.N1 * c.D) d.q[z(e)] = bfloat16(NAN);  // the padded row
  d.idx.assign(z(3 * c.K), 777);                          // padded row 2: garbage, never read
  // Row 0: 11 slots read (ceil(11 / 1)); entries 11 (past the limit) skipped, 3 twice, 5.
  const std::vector<i32> r0 = {11, 3, 3, 5, -1, -1, -1, -1, -1, -1, -1, -1};
  // Row 1: all -1.
  std::copy(r0.begin(), r0.end(), d.idx.begin());
  std::fill(d.idx.begin() + c.K, d.idx.begin() + 2 * c.K, -1);
  Call<bfloat16> call(d);
  call.run();
  const auto& k = d.bat[0].k;
  for (int h = 0; h < c.N1; ++h)
    for (int x = 0; x < c.D; x += 37) {
      const double want = (2.0 * k[z(3 * c.D + x)] + k[z(5 * c.D + x)]) / 3.0;
      EXPECT_NEAR(support::dbl(call.out[z(h * c.D + x)]), want, 8e-3 * (1 + std::fabs(want)));
      EXPECT_EQ(support::dbl(call.out[z((c.N1 + h) * c.D + x)]), 0.0);      // empty list
      EXPECT_EQ(support::dbl(call.out[z((2 * c.N1 + h) * c.D + x)]), 0.0);  // padded row
    }
  // The slot rule: row 0 of 4 keys and 2 rows sees 3 keys, so only its first 3 slots are
  // read: [1, 3, 0 | 1, 2] gives keys {1, 0} (3 is past the limit), row 1 reads all 4 slots.
  Case s = c;
  s.kvlen = {4}, s.qlen = {2}, s.S1 = 2, s.K = 5;
  Data<bfloat16> e(s);
  e.idx = {1, 3, 0, 1, 2, 3, 0, 1, 2, -1};
  e.bat[0].idx = e.idx;
  Call<bfloat16> slots(e);
  slots.run();
  EXPECT_TRUE(support::all_close(e.sfa_expected(), support::as_doubles(slots.out),
                                 support::tolerance(support::Kind::BF16)));
  Data<bfloat16> f = e;  // [1, 0, 1 | 2]: keys {1, 0, 1}, another result
  f.idx = {1, 0, 1, 2, -1, 3, 0, 1, 2, -1};
  Call<bfloat16> other(f);
  other.run();
  EXPECT_FALSE(
      support::bitwise_equal(support::as_floats(slots.out), support::as_floats(other.out)));
}

TEST(DsaSparseAttention, EveryRuleRejectsByNameAndWritesNothing) {
  Case c = vendor("TND", "PA_BSND", 4, true);
  Data<bfloat16> d(c);
  d.sfa_lists();
  auto expect = [&](auto edit, const std::string& frag, bool oor = false) {
    Data<bfloat16> e = d;
    Call<bfloat16> call(e);
    edit(e, call);
    SCOPED_TRACE(frag);
    support::expect_throw([&] { call.run(); }, frag, oor);
    for (const bfloat16& v : call.out) ASSERT_EQ(support::dbl(v), -7.0);
  };
  using D = Data<bfloat16>;
  using C = Call<bfloat16>;
  expect([](D&, C& x) { x.p.sparse_mode = 1; }, "params.sparse_mode");
  expect([](D&, C& x) { x.p.sparse_block_size = 3; }, "params.sparse_block_size");
  expect([](D&, C& x) { x.p.sparse_block_size = 64; }, "does not divide blockSize");
  expect([](D&, C& x) { x.p.scale_value = NAN; }, "params.scale_value");
  expect([](D&, C& x) { x.p.pre_tokens = 5; }, "pre_tokens");
  expect([](D&, C& x) { x.p.attention_mode = 0; }, "params.attention_mode");
  expect([](D&, C& x) { x.p.return_softmax_lse = true; }, "not implemented");
  expect([](D&, C& x) { x.p.layout_kv = "BSH"; }, "layout_kv");
  expect(
      [](D& e, C& x) {
        x.p.layout_kv = "BSND", x.in.block_table = {};
        x.in.key = {e.k.data(), {3, 72, 1, 512}};
        x.in.key_rope = {e.kr.data(), {3, 72, 1, 64}};
      },
      "not paired with layout_query");
  expect([](D&, C& x) { x.in.block_table = {}; }, "block_table");
  expect([](D&, C& x) { x.in.actual_seq_lengths_kv.pop_back(); }, "actual_seq_lengths_kv");
  expect([](D&, C& x) { x.in.actual_seq_lengths_query.back() -= 1; }, "actual_seq_lengths_query");
  expect([](D&, C& x) { x.in.actual_seq_lengths_query[0] = 5; }, "actual_seq_lengths_query");
  expect([](D& e, C& x) { x.in.query_rope = {e.qr.data(), {e.rows, 2, 128}}; }, "query_rope");
  expect([](D& e, C& x) { x.in.key_rope = {e.kr.data(), {e.nb, 32, 1, 32}}; }, "key_rope");
  std::vector<bfloat16> copy = d.k;  // the key's values in other memory
  expect([&](D& e, C& x) { x.in.value = {copy.data(), {e.nb, 32, 1, 512}}; }, "value");
  expect([](D& e, C& x) { x.in.query = {e.q.data(), {1, e.rows, 4, 512}}; }, "query.shape");
  expect(
      [](D& e, C& x) {
        x.in.sparse_indices = {e.idx.data(), {e.rows, 2, 3}};
      },
      "sparse_indices.shape");
  expect([](D& e, C&) { e.bt[0] = static_cast<i32>(e.nb); }, "block_table[0][0]", true);
  expect([](D& e, C&) { e.idx[0] = 100; }, "sparse_indices[0][0][0]", true);
  expect([](D& e, C&) { e.idx[1] = -2; }, "sparse_indices[0][0][1]", true);
  expect([](D& e, C&) { e.idx[0] = -1, e.idx[1] = 0; }, "a valid entry after -1");
  expect([](D& e, C& x) { x.in.query = {nullptr, {e.rows, 4, 512}}; }, "query");
  Case n = c;
  n.N1 = 3;
  Data<bfloat16> dn(n);
  dn.sfa_lists();
  Call<bfloat16> cn(dn);
  support::expect_throw([&] { cn.run(); }, "query.shape (N1)", false);
  cn.p.strict = false;  // relaxed: N1 3 runs
  cn.run();
}

}  // namespace dsa_sparse_attention_test
