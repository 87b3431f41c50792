// NSA compressed branch (CANN aclnnNsaCompressAttentionInfer) against the independent reference
// tests/reference/nsa.hpp: the importance-score geometry (paper block overlap == the kernel's
// index formula, hand-worked cases, forced blocks, ties, nSel <= 2, k > n), the whole operator
// over TND / BSND (padded rows), fp16 / bf16, GQA 1..8, Dqk 32..192, batches of 0..100
// compressed keys in shuffled paged caches (-1 padding, NaN in every unread row), with and
// without the multi-token mask. Metamorphic: block order, group == Σ head scores, k = nSel is a
// permutation, threads 1 == 2, TND == BSND. Every rejection names its argument and leaves the
// outputs untouched; relaxed mode accepts the vendor-only rules and still matches the reference
// (compress_attention_rejects_test.cpp; the harness: compress_attention_support.hpp).

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/nsa/compress_attention.hpp>
#include <attnref/nsa/importance.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "nsa/compress_attention_support.hpp"
#include "reference/nsa.hpp"
#include "support/cast.hpp"
#include "support/compare.hpp"

namespace compress_attention_test {

using namespace compress_attention_support;

constexpr double kInf = std::numeric_limits<double>::infinity();

// ---------------------------------------------------------------------------------------------
// Importance-score geometry
// ---------------------------------------------------------------------------------------------

std::vector<float> lib_head_scores(const std::vector<double>& P, long l, long d, long ls) {
  std::vector<float> pf(P.begin(), P.end());
  const Index ns = attnref::nsa_select_block_count(static_cast<Index>(P.size()), l, d, ls);
  std::vector<float> s(z(std::max<Index>(ns, 1)), -1.0f);
  attnref::nsa_head_scores(pf.data(), static_cast<Index>(P.size()), l, d, ls, s.data());
  s.resize(z(ns));
  return s;
}

TEST(NsaImportance, SelectBlockCount) {
  // ceil(((cmp - 1)·d + l) / l'), 0 without keys.
  EXPECT_EQ(attnref::nsa_select_block_count(0, 32, 16, 64), 0);
  EXPECT_EQ(attnref::nsa_select_block_count(1, 32, 16, 64), 1);   // 32 / 64
  EXPECT_EQ(attnref::nsa_select_block_count(3, 32, 16, 64), 1);   // 64 / 64
  EXPECT_EQ(attnref::nsa_select_block_count(4, 32, 16, 64), 2);   // 80 / 64
  EXPECT_EQ(attnref::nsa_select_block_count(8, 32, 16, 64), 3);   // 144 / 64
  EXPECT_EQ(attnref::nsa_select_block_count(16, 32, 16, 64), 5);  // 272 / 64
  EXPECT_EQ(attnref::nsa_select_block_count(5, 16, 16, 16), 5);
  for (long cmp = 0; cmp < 300; cmp += 7)
    EXPECT_EQ(attnref::nsa_select_block_count(cmp, 48, 16, 96),
              ref::nsa::select_blocks(cmp, {48, 16, 96}));
}

TEST(NsaImportance, OverlapDefinitionEqualsTheIndexFormula) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  int checked = 0;
  for (long d : {8L, 16L, 32L, 48L, 64L})
    for (long c = 1; c <= 8; ++c)
      for (long a = c; a <= 8; ++a) {  // l = c·d <= l' = a·d
        const ref::nsa::Blocks g{c * d, d, a * d};
        for (long cmp : {1L, 2L, 3L, 5L, 9L, 17L, 40L, 301L}) {  // 301: the vector loop
          std::vector<double> P(z(cmp));
          for (double& x : P) x = u(rng);
          const auto ov = ref::nsa::overlap_scores(P, g, 1);
          const auto ix = ref::nsa::index_scores(P, g, 1);
          ASSERT_EQ(ov.size(), z(ref::nsa::select_blocks(cmp, g)));
          ASSERT_EQ(ov.size(), ix.size());
          for (size_t p = 0; p < ov.size(); ++p)
            ASSERT_NEAR(ov[p], ix[p], 1e-12)
                << "l " << g.l << " d " << d << " l' " << g.ls << " cmp " << cmp << " p " << p;
          // The physical 0-based geometry is the same formula one compressed block earlier.
          const auto ov0 = ref::nsa::overlap_scores(P, g, 0);
          const auto ix0 = ref::nsa::index_scores(P, g, 0);
          for (size_t p = 0; p < ov0.size(); ++p) ASSERT_NEAR(ov0[p], ix0[p], 1e-12);
          // The library's multiplicity loop (fp32) is the same formula.
          const auto lib = lib_head_scores(P, g.l, g.d, g.ls);
          ASSERT_EQ(lib.size(), ix.size());
          for (size_t p = 0; p < ix.size(); ++p)
            ASSERT_NEAR(lib[p], ix[p], 1e-5 * std::max(1.0, ix[p]))
                << "l " << g.l << " d " << d << " l' " << g.ls << " cmp " << cmp << " p " << p;
          ++checked;
        }
      }
  EXPECT_GT(checked, 900);
}

TEST(NsaImportance, HandWorkedCmp8And16) {
  // l = 32, d = 16, l' = 64: a = 4, c = 2; w_i = #{m < 4, n < 2 : m + n = i} = 1, 2, 2, 2, 1.
  // score[p] = P[4p+4] + 2 P[4p+3] + 2 P[4p+2] + 2 P[4p+1] + P[4p].
  // Overlap view (paper, 1-based): select block 1 = raw [64, 128); compressed key t = raw
  // [(t-1)·16, (t-1)·16 + 32): t = 4 -> [48, 80) overlaps 16 (w 1), t = 5, 6, 7 -> 32 (w 2),
  // t = 8 -> [112, 144) overlaps 16 (w 1): P8 + 2 P7 + 2 P6 + 2 P5 + P4, as above.
  //
  // cmp 8, P_t = (t+1)/36 (Σ = 1): nSel = ceil((7·16 + 32)/64) = ceil(144/64) = 3.
  //   score[0] = (5 + 2·4 + 2·3 + 2·2 + 1)/36 = 24/36
  //   score[1] = (P8 dropped) + (2·8 + 2·7 + 2·6 + 5)/36 = 47/36
  //   score[2] = indices 12..8 all dropped = 0
  //   all three forced (0, nSel-2 = 1, nSel-1 = 2): top-3 = 0, 1, 2.
  std::vector<double> P8(8);
  for (int t = 0; t < 8; ++t) P8[z(t)] = (t + 1) / 36.0;
  auto s8 = lib_head_scores(P8, 32, 16, 64);
  ASSERT_EQ(s8.size(), 3u);
  EXPECT_NEAR(s8[0], 24.0 / 36, 1e-6);
  EXPECT_NEAR(s8[1], 47.0 / 36, 1e-6);
  EXPECT_EQ(s8[2], 0.0f);
  attnref::nsa_force_blocks(s8.data(), 3);
  std::vector<i32> t8(3);
  attnref::nsa_topk(s8.data(), 3, 3, t8.data());
  EXPECT_EQ(t8, (std::vector<i32>{0, 1, 2}));
  // cmp 16, P_t = (t+1)/136: nSel = ceil(272/64) = 5; forced 0, 3, 4; free 1 and 2:
  //   score[1] = (9 + 2·8 + 2·7 + 2·6 + 5)/136 = 56/136, score[2] = (13 + 24 + 22 + 20 + 9)/136
  //   = 88/136, score[3] = (2·16 + 2·15 + 2·14 + 13)/136 = 103/136 (P16 dropped), score[4] = 0.
  //   top-5 = 0, 3, 4, 2, 1. Reversed P_t = (16 - t)/136: score[1] = (8 + 18 + 20 + 22 + 12)/136
  //   = 80/136 > score[2] = (4 + 10 + 12 + 14 + 8)/136 = 48/136: top-4 = 0, 3, 4, 1.
  std::vector<double> P16(16), R16(16);
  for (int t = 0; t < 16; ++t) P16[z(t)] = (t + 1) / 136.0, R16[z(t)] = (16 - t) / 136.0;
  auto s16 = lib_head_scores(P16, 32, 16, 64);
  ASSERT_EQ(s16.size(), 5u);
  const double want16[] = {24.0 / 136, 56.0 / 136, 88.0 / 136, 103.0 / 136, 0.0};
  for (int p = 0; p < 5; ++p) EXPECT_NEAR(s16[z(p)], want16[p], 1e-6) << p;
  const auto ov16 = ref::nsa::overlap_scores(P16, {32, 16, 64});
  for (int p = 0; p < 5; ++p) EXPECT_NEAR(ov16[z(p)], want16[p], 1e-12) << p;
  attnref::nsa_force_blocks(s16.data(), 5);
  EXPECT_TRUE(std::isinf(s16[0]) && std::isinf(s16[3]) && std::isinf(s16[4]));
  EXPECT_NEAR(s16[1], 56.0 / 136, 1e-6);
  std::vector<i32> t16(5);
  attnref::nsa_topk(s16.data(), 5, 5, t16.data());
  EXPECT_EQ(t16, (std::vector<i32>{0, 3, 4, 2, 1}));
  auto r16 = lib_head_scores(R16, 32, 16, 64);
  EXPECT_NEAR(r16[1], 80.0 / 136, 1e-6);
  EXPECT_NEAR(r16[2], 48.0 / 136, 1e-6);
  attnref::nsa_force_blocks(r16.data(), 5);
  std::vector<i32> tr(4);
  attnref::nsa_topk(r16.data(), 5, 4, tr.data());
  EXPECT_EQ(tr, (std::vector<i32>{0, 3, 4, 1}));
}

TEST(NsaImportance, ForcedBlocks) {
  const float inf = std::numeric_limits<float>::infinity();
  for (Index n = 0; n <= 6; ++n) {
    std::vector<float> s(8, 0.5f);
    attnref::nsa_force_blocks(s.data(), n);
    for (Index i = 0; i < 8; ++i) {
      const bool forced = i < n && (i == 0 || i == n - 1 || i == n - 2);
      EXPECT_EQ(s[z(i)], forced ? inf : 0.5f) << "n " << n << " i " << i;
    }
  }
}

TEST(NsaImportance, TopkTiesNanAndKAboveN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  auto top = [](std::vector<float> s, Index k) {
    std::vector<i32> o(z(k), 99);
    attnref::nsa_topk(s.data(), static_cast<Index>(s.size()), k, o.data());
    return o;
  };
  EXPECT_EQ(top({1, 3, 3, 2, 3}, 3), (std::vector<i32>{1, 2, 4}));
  EXPECT_EQ(top({2, 2, 2, 2}, 4), (std::vector<i32>{0, 1, 2, 3}));
  EXPECT_EQ(top({inf, 5, 5, inf, inf}, 5), (std::vector<i32>{0, 3, 4, 1, 2}));
  EXPECT_EQ(top({nan, 1, 0}, 3), (std::vector<i32>{1, 2, 0}));
  EXPECT_EQ(top({0.5f, 0.25f}, 4), (std::vector<i32>{0, 1, -1, -1}));
  EXPECT_EQ(top({}, 2), (std::vector<i32>{-1, -1}));
  // The reference agrees on ties and k > n.
  EXPECT_EQ(ref::nsa::topk({1, 3, 3, 2, 3}, 3), (std::vector<i32>{1, 2, 4}));
  EXPECT_EQ(ref::nsa::topk({kInf, 5, 5, kInf, kInf}, 6), (std::vector<i32>{0, 3, 4, 1, 2, -1}));
}

// nsa_topk (partition, then sort) against the reference's stable sort: scores from 9 levels
// (many ties), a NaN (ranked as -inf) and +inf, ascending runs, k from 1 to past n.
TEST(NsaImportance, TopkMatchesTheReferenceSort) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> level(0, 8);
  for (Index n : {1, 17, 300, 1025})
    for (int pattern = 0; pattern < 2; ++pattern) {
      std::vector<float> s(z(n));
      for (Index i = 0; i < n; ++i)
        s[z(i)] = pattern == 1 ? static_cast<float>(i / 3) : static_cast<float>(level(rng));
      if (n > 10) s[3] = std::numeric_limits<float>::quiet_NaN(), s[7] = kInf, s[9] = kInf;
      for (Index k : {Index{1}, Index{3}, Index{16}, Index{64}, Index{200}, n, n + 3}) {
        std::vector<i32> got(z(k), 99);
        attnref::nsa_topk(s.data(), n, k, got.data());
        std::vector<double> as_ref(s.begin(), s.end());  // (NaN ranks as -inf, ties by index)
        for (double& x : as_ref) x = std::isnan(x) ? -kInf : x;
        EXPECT_EQ(got, ref::nsa::topk(as_ref, k))
            << "n " << n << ", pattern " << pattern << ", k " << k;
      }
    }
}

// ---------------------------------------------------------------------------------------------
// The operator against the reference
// ---------------------------------------------------------------------------------------------

// The grid: every case in both fp16 and bf16.
std::vector<Case> grid() {
  std::vector<Case> v;
  {  // G = 1, relaxed (small cmp with k > floor), lengths 0..40, single tokens.
    Case c;
    c.N = 4, c.KVN = 4, c.Dqk = 32, c.Dv = 32, c.k = 4, c.strict = false;
    c.cmp = {0, 1, 2, 3, 17, 40}, c.qlen = {1, 1, 1, 1, 1, 1};
    v.push_back(c);
  }
  {  // G = 2, l = d = l' = 16 (a = c = 1: score[p] = P[p + 1]), mask, tails 0..15.
    Case c;
    c.N = 8, c.KVN = 4, c.Dqk = 64, c.Dv = 48, c.l = 16, c.d = 16, c.ls = 16, c.k = 1;
    c.pbs = 32, c.mask = true, c.scale = 0.15;
    c.cmp = {1, 2, 3, 33, 70}, c.qlen = {2, 2, 3, 4, 2}, c.tail = {0, 1, 2, 3, 15};
    v.push_back(c);
  }
  {  // BSND padded, G = 4 with KV_N = 2, Dqk = Dv = 128, mask.
    Case c;
    c.layout = "BSND", c.S = 4;
    c.N = 8, c.KVN = 2, c.Dqk = 128, c.Dv = 128, c.l = 64, c.d = 32, c.ls = 64, c.k = 3;
    c.mask = true, c.scale = 0.1;
    c.cmp = {0, 5, 9, 31, 48}, c.qlen = {1, 4, 2, 3, 4}, c.tail = {0, 0, 1, 2, 31};
    v.push_back(c);
  }
  {  // BSND, G = 8, Dqk 192, Dv 128, a = 6, c = 3, mask.
    Case c;
    c.layout = "BSND", c.S = 3;
    c.N = 8, c.KVN = 1, c.Dqk = 192, c.Dv = 128, c.l = 48, c.d = 16, c.ls = 96, c.k = 2;
    c.mask = true, c.scale = 0.08;
    c.cmp = {10, 21, 64}, c.qlen = {3, 1, 2}, c.tail = {2, 1, 0};
    v.push_back(c);
  }
  {  // TND, G = 8, KV_N = 2, a = 7, c = 5, relaxed k, lengths 0..100, mask.
    Case c;
    c.N = 16, c.KVN = 2, c.Dqk = 96, c.Dv = 64, c.l = 80, c.d = 16, c.ls = 112, c.k = 5;
    c.strict = false, c.mask = true, c.scale = 0.12, c.pbs = 32;
    c.cmp = {0, 1, 2, 3, 50, 100}, c.qlen = {2, 1, 4, 3, 4, 2}, c.tail = {0, 0, 5, 2, 1, 0};
    v.push_back(c);
  }
  {  // Several tokens without the mask; a = c = 2 with d = 64.
    Case c;
    c.layout = "BSND", c.S = 4;
    c.N = 2, c.KVN = 1, c.Dqk = 32, c.Dv = 16, c.l = 128, c.d = 64, c.ls = 128, c.k = 2;
    c.strict = false, c.scale = 0.3;
    c.cmp = {3, 7, 12}, c.qlen = {4, 4, 1};
    v.push_back(c);
  }
  {  // The mask flag with single tokens is inert; no actual_q_seq_len (1 each); G = 4.
    Case c;
    c.N = 4, c.KVN = 1, c.Dqk = 48, c.Dv = 32, c.l = 32, c.d = 32, c.ls = 96, c.k = 2;
    c.mask = true, c.pass_qlen = false, c.pbs = 48;
    c.cmp = {9, 40, 97}, c.qlen = {1, 1, 1}, c.tail = {5, 0, 31};
    v.push_back(c);
  }
  return v;
}

TEST(NsaCompressAttention, MatchesReferenceFp16) {
  int i = 0;
  for (const Case& c : grid()) {
    SCOPED_TRACE("case " + std::to_string(i++));
    check_against_reference<half>(c);
  }
}

TEST(NsaCompressAttention, MatchesReferenceBf16) {
  int i = 0;
  for (Case c : grid()) {
    SCOPED_TRACE("case " + std::to_string(i++));
    c.seed += 100;
    check_against_reference<bfloat16>(c);
  }
}

// The ">" of the mask: q_len 4, tail 1 -> tokens 0, 1 (3 > 1, 2 > 1) lose the last key, token 2
// (1 > 1 false) and token 3 keep it. cmp 1 with the key masked: softmax of one key is 1.
TEST(NsaCompressAttention, MaskBoundary) {
  Case c;
  c.N = 2, c.KVN = 1, c.Dqk = 32, c.Dv = 32, c.l = 16, c.d = 16, c.ls = 16, c.k = 1;
  c.mask = true, c.scale = 0.2;
  c.cmp = {3, 1}, c.qlen = {4, 2}, c.tail = {1, 0};
  Built<half> bl(c);
  bl.run();
  const long wp = bl.max_cmp + c.wide;
  for (int i = 0; i < 4; ++i)
    for (int h = 0; h < 2; ++h) {
      const float last = bl.probs[z((bl.row(0, i) * 2 + h) * wp + 2)];
      if (i < 2)
        EXPECT_EQ(last, 0.0f) << "token " << i;
      else
        EXPECT_GT(last, 1e-4f) << "token " << i;
    }
  for (int i = 0; i < 2; ++i)
    EXPECT_EQ(bl.probs[z((bl.row(1, i) * 2) * wp)], 1.0f) << "cmp 1, token " << i;
  check_against_reference<half>(c);
}

// P is rounded to the output type before P·V: two keys, V = ±64, P0 close to 1/2: the rounding
// of P moves the output by far more than the tolerance.
template <class T>
void rounding_case() {
  Case c;
  c.N = 1, c.KVN = 1, c.Dqk = 16, c.Dv = 16, c.l = 16, c.d = 16, c.ls = 16, c.k = 1;
  c.scale = 1.0, c.cmp = {2}, c.qlen = {1};
  double best = 0;
  float best_q = 0;
  for (float qv = 0.011f; qv < 0.2f; qv += 0.0037f) {
    Built<T> bl(c);
    auto& x = bl.bat[0];
    std::fill(x.q.begin(), x.q.end(), 0.0), std::fill(x.k.begin(), x.k.end(), 0.0);
    x.q[0] = rnd<T>(qv), x.k[0] = 1.0;
    for (int e = 0; e < 16; ++e) x.v[z(e)] = 64.0, x.v[z(16 + e)] = -64.0;
    const auto r1 = ref::nsa::run(bl.pr, x);
    bl.pr.round_p = false;
    const auto r0 = ref::nsa::run(bl.pr, x);
    const double diff = std::fabs(r1.out[0] - r0.out[0]) /
                        (support::tolerance(kind_of<T>()).atol +
                         support::tolerance(kind_of<T>()).rtol * std::fabs(r1.out[0]));
    if (diff > best) best = diff, best_q = qv;
  }
  ASSERT_GT(best, 3.0) << "the case does not distinguish rounded from unrounded P";
  Built<T> bl(c);
  std::fill(bl.q.begin(), bl.q.end(), T(0.0f)), std::fill(bl.k.begin(), bl.k.end(), T(0.0f));
  auto& x = bl.bat[0];
  std::fill(x.q.begin(), x.q.end(), 0.0), std::fill(x.k.begin(), x.k.end(), 0.0);
  x.q[0] = rnd<T>(best_q), x.k[0] = 1.0;
  bl.q[0] = T(best_q);
  const long r0 = bl.bt[0];
  bl.k[z(r0 * c.pbs * 16)] = T(1.0f);
  for (int e = 0; e < 16; ++e) {
    x.v[z(e)] = 64.0, x.v[z(16 + e)] = -64.0;
    bl.v[z(r0 * c.pbs * 16 + e)] = T(64.0f), bl.v[z((r0 * c.pbs + 1) * 16 + e)] = T(-64.0f);
  }
  bl.run();
  const auto r = ref::nsa::run(bl.pr, x);
  std::vector<double> want(r.out), got;
  for (const T& y : bl.out) got.push_back(dbl(y));
  EXPECT_TRUE(support::all_close(want, got, support::tolerance(kind_of<T>())));
}

TEST(NsaCompressAttention, PIsRoundedToTheOutputTypeBeforePV) {
  rounding_case<half>();
  rounding_case<bfloat16>();
}

// Identical keys: every P is exactly 1/cmp, the inner blocks tie exactly, and the top-k takes
// them by lower index after the forced blocks (exact check, no tolerance on the order).
TEST(NsaCompressAttention, ExactTiesGoToTheLowerIndex) {
  Case c;
  c.N = 4, c.KVN = 2, c.Dqk = 32, c.Dv = 16, c.k = 7;  // l 32, d 16, l' 64
  c.cmp = {40}, c.qlen = {1};
  Built<half> bl(c);
  for (int t = 0; t < 40; ++t) {
    const long r = bl.bt[z(t / 16)] * 16 + t % 16;
    for (int e = 0; e < 2 * 32; ++e) bl.k[z(r * 64 + e)] = half(0.5f);
  }
  bl.run();
  // nSel = ceil((39·16 + 32)/64) = 11; forced 0, 9, 10; blocks 1..8 tie.
  for (int kh = 0; kh < 2; ++kh) {
    const std::vector<i32> got(bl.topk.begin() + kh * 7, bl.topk.begin() + kh * 7 + 7);
    EXPECT_EQ(got, (std::vector<i32>{0, 9, 10, 1, 2, 3, 4})) << kh;
  }
}

// nSel <= 2: everything is forced; relaxed k past nSel gives -1.
TEST(NsaCompressAttention, AtMostTwoSelectBlocks) {
  Case c;
  c.N = 2, c.KVN = 1, c.Dqk = 32, c.Dv = 32, c.l = 64, c.d = 16, c.ls = 64, c.k = 3;
  c.strict = false, c.cmp = {1, 2, 5}, c.qlen = {1, 1, 1};  // nSel 1, 2, 2
  Built<half> bl(c);
  bl.run();
  EXPECT_EQ(std::vector<i32>(bl.topk.begin(), bl.topk.begin() + 3), (std::vector<i32>{0, -1, -1}));
  EXPECT_EQ(std::vector<i32>(bl.topk.begin() + 3, bl.topk.begin() + 6),
            (std::vector<i32>{0, 1, -1}));
  EXPECT_EQ(std::vector<i32>(bl.topk.begin() + 6, bl.topk.begin() + 9),
            (std::vector<i32>{0, 1, -1}));
  check_against_reference<half>(c);
}

// ---------------------------------------------------------------------------------------------
// Metamorphic
// ---------------------------------------------------------------------------------------------

Case meta_case() {
  Case c;
  c.N = 8, c.KVN = 2, c.Dqk = 64, c.Dv = 32, c.k = 3, c.mask = true, c.scale = 0.2;
  c.cmp = {0, 11, 23, 50}, c.qlen = {2, 4, 1, 3}, c.tail = {0, 2, 9, 1};
  return c;
}

template <class T>
void expect_same(const Built<T>& a, const Built<T>& b) {
  std::vector<float> oa, ob;
  for (const T& x : a.out) oa.push_back(static_cast<float>(x));
  for (const T& x : b.out) ob.push_back(static_cast<float>(x));
  EXPECT_TRUE(support::bitwise_equal(oa, ob)) << "output";
  EXPECT_EQ(a.topk, b.topk);
  EXPECT_TRUE(support::bitwise_equal(a.probs, b.probs)) << "probs";
  EXPECT_TRUE(support::bitwise_equal(a.gs, b.gs)) << "group scores";
}

TEST(NsaCompressAttention, BlockOrderDoesNotMatterBitForBit) {
  Case c = meta_case();
  Built<bfloat16> a(c);
  c.perm_seed = 99, c.spare_blocks = 7;
  Built<bfloat16> b(c);
  ASSERT_NE(a.bt, b.bt);
  a.run(), b.run();
  expect_same(a, b);
}

TEST(NsaCompressAttention, ThreadsOneEqualsTwoBitForBit) {
  Built<half> a(meta_case()), b(meta_case());
  a.run(1), b.run(2);
  expect_same(a, b);
}

TEST(NsaCompressAttention, GroupScoreIsTheSumOfTheHeadScores) {
  Built<half> bl(meta_case());
  bl.run();
  const auto& c = bl.c;
  const long ws = bl.max_ns + c.wide;
  const int G = c.N / c.KVN;
  for (int b = 0; b < bl.B; ++b) {
    const long ns = ref::nsa::select_blocks(c.cmp[z(b)], bl.pr.g);
    for (int i = 0; i < bl.bat[z(b)].q_len; ++i)
      for (int kh = 0; kh < c.KVN; ++kh)
        for (long p = 0; p < ns; ++p) {
          float s = 0.0f;
          for (int g = 0; g < G; ++g) s += bl.hs[z((bl.row(b, i) * c.N + kh * G + g) * ws + p)];
          const float got = bl.gs[z((bl.row(b, i) * c.KVN + kh) * ws + p)];
          if (p == 0 || p >= ns - 2)
            EXPECT_TRUE(std::isinf(got) && got > 0);
          else
            EXPECT_EQ(got, s) << "batch " << b << " token " << i << " kv " << kh << " p " << p;
        }
  }
}

TEST(NsaCompressAttention, TopkOverAllBlocksIsAPermutation) {
  Case c = meta_case();
  c.strict = false;
  c.k = ref::nsa::select_blocks(50, {c.l, c.d, c.ls});  // 13
  Built<half> bl(c);
  bl.run();
  for (int b = 0; b < bl.B; ++b) {
    const long ns = ref::nsa::select_blocks(c.cmp[z(b)], bl.pr.g);
    for (int i = 0; i < bl.bat[z(b)].q_len; ++i)
      for (int kh = 0; kh < c.KVN; ++kh) {
        const i32* t = bl.topk.data() + (bl.row(b, i) * c.KVN + kh) * c.k;
        std::vector<i32> head(t, t + ns), want(z(ns));
        std::sort(head.begin(), head.end());
        std::iota(want.begin(), want.end(), 0);
        EXPECT_EQ(head, want) << "batch " << b;
        for (long j = ns; j < c.k; ++j) EXPECT_EQ(t[j], -1);
      }
  }
}

TEST(NsaCompressAttention, TndEqualsBsndBitForBit) {
  Case c = meta_case();
  Built<half> a(c);
  c.layout = "BSND", c.S = 4;
  Built<half> b(c);
  a.run(), b.run();
  const long wp = a.max_cmp + c.wide;
  for (int bb = 0; bb < a.B; ++bb)
    for (int i = 0; i < a.bat[z(bb)].q_len; ++i) {
      const int ra = a.row(bb, i), rb = b.row(bb, i);
      EXPECT_EQ(0, std::memcmp(&a.out[z(ra * c.N * c.Dv)], &b.out[z(rb * c.N * c.Dv)],
                               z(c.N * c.Dv) * sizeof(half)));
      EXPECT_EQ(0, std::memcmp(&a.topk[z(ra * c.KVN * c.k)], &b.topk[z(rb * c.KVN * c.k)],
                               z(c.KVN * c.k) * sizeof(i32)));
      EXPECT_EQ(0, std::memcmp(&a.probs[z(ra * c.N * wp)], &b.probs[z(rb * c.N * wp)],
                               z(c.N * wp) * sizeof(float)));
    }
}

}  // namespace compress_attention_test
