// NSA selected branch (CANN aclnnNsaSelectedAttentionInfer) against the independent reference
// tests/reference/nsa_select.hpp: TND / BSND (padded rows) / BSH, 3-d and 4-d paged caches with
// shuffled block tables (-1 padding) and NaN in every cache row no query may read, fp16 / bf16 /
// float, GQA 1..16, top-k lists with -1 anywhere, partial last blocks, the multi-token rule
// cutting into the last and the penultimate block, empty selections, page sizes above, below and
// coprime-ish to the select block (gcd pages), odd head sizes (relaxed), the vendor shape
// (strict). Hand-worked: position-encoded values with q = 0 give the mean of the visible
// positions. Metamorphic: all blocks == dense causal attention, top-k order, paged ==
// contiguous, threads, TND == BSND == BSH, 3-d == 4-d caches, page size. Every rejection names
// its argument and leaves the output untouched; relaxed mode accepts the vendor-only rules and
// still matches the reference (select_attention_rejects_test.cpp; the harness:
// select_attention_support.hpp).

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/attention/attention.hpp>
#include <attnref/nsa/select_attention.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "nsa/select_attention_support.hpp"
#include "reference/nsa_select.hpp"
#include "support/cast.hpp"
#include "support/compare.hpp"

namespace select_attention_test {

using namespace select_attention_support;
using support::as_floats;

// The grid: each case covers some of layout, cache rank, G, page size vs l', multi-token,
// lengths (0, below one block, partial last blocks, exact multiples).
std::vector<Case> grid() {
  std::vector<Case> v;
  {  // TND, G = 1, pbs 128 / l' 64, single tokens, sel 0 .. 300.
    Case c;
    c.N = 3, c.KVN = 3, c.Dqk = 32, c.Dv = 16, c.ls = 64, c.k = 3, c.pbs = 128;
    c.sel = {0, 1, 63, 64, 65, 129, 300}, c.qlen = {1, 1, 1, 1, 1, 1, 1};
    v.push_back(c);
  }
  {  // TND, G = 2, pbs 64 / l' 128 (a select block spans two pages), multi-token 2..4.
    Case c;
    c.N = 4, c.KVN = 2, c.Dqk = 48, c.Dv = 32, c.ls = 128, c.k = 2, c.pbs = 64;
    c.sel = {4, 129, 130, 256, 258, 387}, c.qlen = {4, 4, 2, 3, 4, 3};
    v.push_back(c);
  }
  {  // BSND padded (S 4), G = 4, 4-d caches, l' 32 / pbs 64, multi-token cutting into the
     // penultimate block (sel % l' < q_len - 1).
    Case c;
    c.layout = "BSND", c.S = 4, c.cache4d = true;
    c.N = 8, c.KVN = 2, c.Dqk = 64, c.Dv = 64, c.ls = 32, c.k = 4, c.pbs = 64;
    c.sel = {33, 34, 65, 96, 97, 7}, c.qlen = {4, 3, 4, 2, 1, 3};
    v.push_back(c);
  }
  {  // BSH, G = 16, KV_N 1, l' 16 / pbs 64, S 3 with padded rows.
    Case c;
    c.layout = "BSH", c.S = 3;
    c.N = 16, c.KVN = 1, c.Dqk = 32, c.Dv = 16, c.ls = 16, c.k = 5, c.pbs = 64;
    c.sel = {17, 50, 160, 3}, c.qlen = {3, 2, 3, 1};
    v.push_back(c);
  }
  {  // Relaxed: pbs 48 / l' 32 (gcd pages of 16), odd Dqk / Dv, G = 4, TND multi-token.
    Case c;
    c.N = 4, c.KVN = 1, c.Dqk = 37, c.Dv = 19, c.ls = 32, c.k = 4, c.pbs = 48;
    c.sel = {31, 32, 33, 95, 97, 200}, c.qlen = {2, 4, 3, 4, 2, 4};
    v.push_back(c);
  }
  {  // Relaxed: l' 24 / pbs 40 (gcd 8), 4-d caches, BSND without actual_q_seq_len (S each).
    Case c;
    c.layout = "BSND", c.S = 2, c.cache4d = true, c.pass_qlen = false;
    c.N = 6, c.KVN = 3, c.Dqk = 16, c.Dv = 24, c.ls = 24, c.k = 3, c.pbs = 40;
    c.sel = {2, 25, 49, 121}, c.qlen = {2, 2, 2, 2};
    v.push_back(c);
  }
  {  // TND without actual_q_seq_len (1 each), G = 2, l' = pbs = 64, 3-d caches, k 6.
    Case c;
    c.pass_qlen = false;
    c.N = 4, c.KVN = 2, c.Dqk = 40, c.Dv = 40, c.ls = 64, c.k = 6, c.pbs = 64, c.empty_list = 0.0;
    c.sel = {64, 128, 200, 383}, c.qlen = {1, 1, 1, 1};
    v.push_back(c);
  }
  return v;
}

TEST(NsaSelectedAttention, MatchesReferenceFp16) {
  int i = 0;
  for (const Case& c : grid()) {
    SCOPED_TRACE("case " + std::to_string(i++));
    check_against_reference<half>(c);
  }
}

TEST(NsaSelectedAttention, MatchesReferenceBf16) {
  int i = 0;
  for (Case c : grid()) {
    SCOPED_TRACE("case " + std::to_string(i++));
    c.seed += 100, c.topk_seed += 7, c.perm_seed += 3;
    check_against_reference<bfloat16>(c);
  }
}

TEST(NsaSelectedAttention, MatchesReferenceFloat) {
  int i = 0;
  for (Case c : grid()) {
    SCOPED_TRACE("case " + std::to_string(i++));
    c.seed += 200, c.topk_seed += 17;
    check_against_reference<float>(c);
  }
}

// The vendor's shape in strict mode: Dqk 192, Dv 128, pbs 64 / 128, l' 64, G 16 and 2.
TEST(NsaSelectedAttention, VendorShapeStrict) {
  Case c;
  c.strict = true, c.layout = "BSND", c.S = 2, c.cache4d = true;
  c.N = 16, c.KVN = 1, c.Dqk = 192, c.Dv = 128, c.ls = 64, c.k = 2, c.pbs = 64;
  c.scale = 1.0 / std::sqrt(192.0);
  c.sel = {130, 300}, c.qlen = {2, 1};
  check_against_reference<half>(c);
  c.pbs = 128, c.layout = "TND", c.cache4d = false, c.N = 4, c.KVN = 2, c.seed = 9;
  c.qlen = {3, 4};
  check_against_reference<bfloat16>(c);
}

// ---------------------------------------------------------------------------------------------
// Hand-worked: q = 0 makes every score 0, so the output is the plain mean of the visible values;
// v[t][g][:] = t + 1000·g makes that mean the mean of the visible positions (+ 1000·g).
// ---------------------------------------------------------------------------------------------

struct Hand {
  long sel;
  int q_len;
  std::vector<std::vector<i32>> topk;  // per token (one kv head of two, both the same list)
  std::vector<double> mean;            // per token; NAN: no key (output 0)
};

void hand_case(const Hand& h, long ls, int pbs) {
  Case c;
  c.N = 4, c.KVN = 2, c.Dqk = 16, c.Dv = 8, c.ls = ls, c.pbs = pbs, c.k = 1;
  for (const auto& l : h.topk) c.k = std::max(c.k, static_cast<long>(l.size()));
  c.sel = {h.sel}, c.qlen = {h.q_len};
  Built<float> bl(c);
  for (int i = 0; i < h.q_len; ++i)
    for (int g = 0; g < 2; ++g)
      for (long e = 0; e < c.k; ++e) {
        const auto& l = h.topk[z(i)];
        const i32 j = e < static_cast<long>(l.size()) ? l[z(e)] : -1;  // padded with -1
        bl.tk[z((i * 2 + g) * c.k + e)] = j;
        bl.bat[0].topk[z((i * 2 + g) * c.k + e)] = j;
      }
  std::fill(bl.q.begin(), bl.q.end(), 0.0f);
  for (double& x : bl.bat[0].q) x = 0.0;
  for (long t = 0; t < h.sel; ++t)
    for (int g = 0; g < 2; ++g)
      for (int e = 0; e < 8; ++e) bl.bat[0].v[z((t * 2 + g) * 8 + e)] = t + 1000.0 * g;
  bl.build_cache();  // re-poisons for the new lists
  bl.run();
  for (int i = 0; i < h.q_len; ++i)
    for (int hd = 0; hd < 4; ++hd)
      for (int e = 0; e < 8; ++e) {
        const double got = bl.out[z((i * 4 + hd) * 8 + e)];
        const double want = std::isnan(h.mean[z(i)]) ? 0.0 : h.mean[z(i)] + 1000.0 * (hd / 2);
        EXPECT_NEAR(got, want, 1e-4 * std::max(1.0, std::fabs(want)))
            << "sel " << h.sel << " token " << i << " head " << hd;
      }
}

TEST(NsaSelectedAttention, HandWorkedMeansOfTheVisiblePositions) {
  const double none = NAN;
  // sel 130, l' 64: blocks [0,64) [64,128) [128,130). q_len 4: L = 127, 128, 129, 130.
  //   {2}:     token 0, 1 see nothing (L <= 128); token 2 sees 128; token 3 sees 128, 129.
  //   {-1, 1}: [64, min(128, L)): 64..126 -> 95; 64..127 -> 95.5 (tokens 1, 2, 3).
  //   {0, 2}:  0..63 (+ 128, 129 as L allows): 31.5, 31.5, (2016 + 128)/65, (2016 + 257)/66.
  hand_case({130, 4, {{2}, {2}, {2}, {2}}, {none, none, 128.0, 128.5}}, 64, 128);
  hand_case({130, 4, {{-1, 1}, {-1, 1}, {1, -1}, {-1, 1}}, {95.0, 95.5, 95.5, 95.5}}, 64, 128);
  hand_case({130, 4, {{0, 2}, {2, 0}, {0, 2}, {2, 0}}, {31.5, 31.5, 2144.0 / 65, 2273.0 / 66}}, 64,
            64);
  // sel 129: the last block holds one token; q_len 4: L = 126..129. {1, 2} cuts the
  // penultimate block for tokens 0, 1: 64..125 -> 94.5, 64..126 -> 95, 64..127 -> 95.5, 64..128
  // -> 96.
  hand_case({129, 4, {{1, 2}, {2, 1}, {1, 2}, {-1, 2, 1}}, {94.5, 95.0, 95.5, 96.0}}, 64, 128);
  // Single token (L = sel), partial last block and -1 in front: 100..108 / l' 32 block 3 = 96..;
  // sel 109: {-1, -1, 3} -> 96..108 -> 102.
  hand_case({109, 1, {{-1, -1, 3}}, {102.0}}, 32, 48);
  // Blocks 0 and 3 of l' 16 (pbs 64) with q_len 2, sel 49: L = 48, 49: 0..15 (+48) -> 7.5,
  // (120 + 48)/17.
  hand_case({49, 2, {{3, 0}, {0, 3}}, {7.5, 168.0 / 17}}, 16, 64);
}

// A token whose only key is one position returns that value bit for bit.
TEST(NsaSelectedAttention, OneVisibleKeyReturnsItsValueExactly) {
  Case c;
  c.layout = "BSND", c.S = 4, c.N = 2, c.KVN = 1, c.Dqk = 32, c.Dv = 32, c.ls = 32, c.k = 2;
  c.pbs = 64, c.sel = {97}, c.qlen = {4};  // L = 94..97; block 3 = [96, 97)
  Built<half> bl(c);
  for (int i = 0; i < 4; ++i) bl.tk[z(i * 2)] = 3, bl.tk[z(i * 2 + 1)] = -1;
  bl.bat[0].topk = bl.tk;  // B = 1, S = q_len: the same layout
  bl.build_cache();
  bl.run();
  const long r = bl.bt[z(96 / 64)] * 64 + 96 % 64;
  for (int i = 0; i < 4; ++i)
    for (int h = 0; h < 2; ++h)
      for (int e = 0; e < 32; ++e) {
        const half got = bl.out[z((i * 2 + h) * 32 + e)];
        if (i < 3)
          EXPECT_EQ(dbl(got), 0.0) << "token " << i;
        else
          EXPECT_EQ(dbl(got), dbl(bl.v[z(r * 32 + e)])) << "head " << h << " e " << e;
      }
}

// sel 0 (no select block: only -1 allowed), all-empty lists, padded rows: output exactly 0.
TEST(NsaSelectedAttention, NothingSelectedGivesZero) {
  Case c;
  c.layout = "BSND", c.S = 3, c.N = 4, c.KVN = 2, c.Dqk = 16, c.Dv = 16, c.ls = 16, c.k = 2;
  c.pbs = 64, c.sel = {0, 40, 0}, c.qlen = {3, 2, 1}, c.empty_list = 1.0;
  Built<bfloat16> bl(c);
  bl.run();
  for (const bfloat16& x : bl.out) ASSERT_EQ(dbl(x), 0.0);
  check_against_reference<bfloat16>(c);
}

// Padded BSND rows are never read: their top-k entries may hold anything.
TEST(NsaSelectedAttention, PaddedRowsTopkIsNotRead) {
  Case c;
  c.layout = "BSND", c.S = 4, c.N = 4, c.KVN = 2, c.Dqk = 16, c.Dv = 16, c.ls = 16, c.k = 3;
  c.pbs = 64, c.sel = {50, 20}, c.qlen = {2, 4};
  Built<half> a(c), b(c);
  for (int i = 2; i < 4; ++i)
    for (int e = 0; e < 2 * 3; ++e) b.tk[z(b.row(0, i) * 6 + e)] = e % 2 ? 99999 : -7;
  a.run(), b.run();
  EXPECT_TRUE(support::bitwise_equal(as_floats(a.out), as_floats(b.out)));
}

// Output of kv head g depends on kv head g's columns only: NaN in every (token, kv head) slice
// that kv head does not select.
TEST(NsaSelectedAttention, ReadsOnlyItsOwnKvHeadColumns) {
  Case c = grid()[2];
  c.poison_heads = true;
  check_against_reference<half>(c);
  c = grid()[1];
  c.poison_heads = true;
  check_against_reference<float>(c);
}

// ---------------------------------------------------------------------------------------------
// Metamorphic
// ---------------------------------------------------------------------------------------------

Case meta_case() {
  Case c;
  c.N = 8, c.KVN = 2, c.Dqk = 32, c.Dv = 24, c.ls = 32, c.k = 4, c.pbs = 64;
  c.sel = {0, 31, 65, 97, 250}, c.qlen = {1, 4, 2, 3, 4};
  return c;
}

// top-k = every block == dense causal attention (BottomRight: token i sees [0, L_i)), computed
// by the engine on a contiguous copy of the raw K / V and by the reference.
template <class T>
void all_blocks_case(Case c) {
  c.all_blocks = true;
  long ns = 0;
  for (long s : c.sel) ns = std::max(ns, (s + c.ls - 1) / c.ls);
  c.k = ns;
  Built<T> bl(c);
  bl.run();
  // Dense causal in the engine: BSND-packed contiguous q / k / v.
  const int B = bl.B, mq = bl.S;
  long mk = 1;
  for (long s : c.sel) mk = std::max(mk, s);
  std::vector<T> q(z(B * mq * c.N * c.Dqk), T(0.0f)), k(z(B * mk * c.KVN * c.Dqk), T(0.0f)),
      v(z(B * mk * c.KVN * c.Dv), T(0.0f)), o(z(B * mq * c.N * c.Dv), T(0.0f));
  for (int b = 0; b < B; ++b) {
    const auto& x = bl.bat[z(b)];
    for (size_t e = 0; e < x.q.size(); ++e)
      q[z(b * mq * c.N * c.Dqk) + e] = T(static_cast<float>(x.q[e]));
    for (size_t e = 0; e < x.k.size(); ++e)
      k[z(b * mk * c.KVN * c.Dqk) + e] = T(static_cast<float>(x.k[e]));
    for (size_t e = 0; e < x.v.size(); ++e)
      v[z(b * mk * c.KVN * c.Dv) + e] = T(static_cast<float>(x.v[e]));
  }
  attnref::AttentionInputs<T> in;
  in.q = attnref::StridedView<const T, 4>(q.data(), {B, mq, c.N, c.Dqk});
  in.k = attnref::StridedView<const T, 4>(k.data(), {B, mk, c.KVN, c.Dqk});
  in.v = attnref::StridedView<const T, 4>(v.data(), {B, mk, c.KVN, c.Dv});
  for (auto& x : bl.bat) in.seq.q.push_back(x.q_len), in.seq.kv.push_back(x.sel);
  attnref::AttentionParams p;
  p.scale = c.scale, p.causal = attnref::CausalMode::BottomRight;
  attnref::AttentionOutputs<T> out;
  out.o = attnref::StridedView<T, 4>(o.data(), {B, mq, c.N, c.Dv});
  attnref::attention(in, p, out);
  std::vector<double> dense, want;
  for (int b = 0; b < B; ++b) {
    const auto& x = bl.bat[z(b)];
    for (int i = 0; i < x.q_len; ++i)
      for (int e = 0; e < c.N * c.Dv; ++e)
        dense.push_back(dbl(x.sel > 0 ? o[z((b * mq + i) * c.N * c.Dv + e)] : T(0.0f)));
    const auto w = ref::nsa_select::window(bl.pr, x, x.sel + 1);  // plain causal
    want.insert(want.end(), w.begin(), w.end());
  }
  // Two fp32 computations of the same attention, each rounded once to T: within tolerance.
  EXPECT_TRUE(support::all_close(dense, bl.live_d(), support::tolerance(kind_of<T>())))
      << "engine dense causal";
  EXPECT_TRUE(support::all_close(want, bl.live_d(), support::tolerance(kind_of<T>())))
      << "reference dense causal";
}

TEST(NsaSelectedAttention, AllBlocksEqualsDenseCausal) {
  all_blocks_case<half>(meta_case());
  Case c = meta_case();
  c.pbs = 48, c.ls = 16, c.seed = 4;  // gcd pages of 16
  all_blocks_case<bfloat16>(c);
  c.seed = 5;
  all_blocks_case<float>(c);
}

TEST(NsaSelectedAttention, TopkOrderDoesNotMatter) {
  Case c = meta_case();
  Built<half> a(c), b(c);
  std::mt19937 rng(3);
  for (Index e = 0; e < static_cast<Index>(b.tk.size()); e += c.k)
    std::shuffle(b.tk.begin() + e, b.tk.begin() + e + c.k, rng);
  ASSERT_NE(a.tk, b.tk);
  a.run(), b.run();
  // The key set is the same; the visiting order may change the rounding (not promised bitwise).
  EXPECT_TRUE(support::all_close(a.live_d(), b.live_d(), support::tolerance(support::Kind::F16)));
}

TEST(NsaSelectedAttention, PagedEqualsContiguousBitForBit) {
  Case c = meta_case();
  c.shuffle = false;  // identity table: batch b's pages are blocks b·maxBlocks + j
  Built<bfloat16> a(c);
  c.shuffle = true, c.spare_blocks = 5;
  Built<bfloat16> b(c);
  ASSERT_NE(a.bt, b.bt);
  a.run(), b.run();
  EXPECT_TRUE(support::bitwise_equal(a.live(), b.live()));
}

TEST(NsaSelectedAttention, ThreadsOneEqualsTwoBitForBit) {
  Case c = meta_case();
  c.N = 16, c.KVN = 1;
  Built<half> a(c), b(c);
  a.run(1), b.run(2);
  EXPECT_TRUE(support::bitwise_equal(a.live(), b.live()));
}

TEST(NsaSelectedAttention, TndEqualsBsndEqualsBshBitForBit) {
  Case c = meta_case();
  Built<half> a(c);
  c.layout = "BSND", c.S = 4;
  Built<half> b(c);
  c.layout = "BSH";
  Built<half> h(c);
  a.run(), b.run(), h.run();
  EXPECT_TRUE(support::bitwise_equal(a.live(), b.live())) << "TND vs BSND";
  EXPECT_TRUE(support::bitwise_equal(as_floats(b.out), as_floats(h.out))) << "BSND vs BSH";
}

TEST(NsaSelectedAttention, Cache3dEquals4dBitForBit) {
  Case c = meta_case();
  Built<bfloat16> a(c);
  c.cache4d = true;
  Built<bfloat16> b(c);
  a.run(), b.run();
  EXPECT_TRUE(support::bitwise_equal(a.live(), b.live()));
}

// The page size only changes where tokens live (and the engine's page runs, gcd(l', pbs)).
TEST(NsaSelectedAttention, PageSizeDoesNotChangeTheResult) {
  Case c = meta_case();
  Built<half> a(c);
  for (int pbs : {16, 32, 96, 128}) {
    c.pbs = pbs;
    Built<half> b(c);
    a.run(), b.run();
    EXPECT_TRUE(support::all_close(a.live_d(), b.live_d(), support::tolerance(support::Kind::F16)))
        << "pbs " << pbs;
  }
}

}  // namespace select_attention_test
