// The engine's two-pass mode (a variant with the round_p hook, attention/variant.hpp): with an
// identity hook it is the ordinary attention (fp32 rounding apart), masks included (causal,
// sliding window, a boolean mask with fully masked rows), with NaN in every masked K / V row
// never reaching the output; the probs it writes are the ordinary ones; a rounding hook changes
// P·V exactly as rounding the normalised P does (checked against a naive loop); the result does
// not depend on the thread count; paged == contiguous; the item_probs hook hands over each row's
// probabilities once, with the probs output's bits.

#include <gtest/gtest.h>

#include <attnref/attention/attention.hpp>
#include <attnref/core/layout.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "support/cast.hpp"
#include "support/compare.hpp"
#include "support/simd_levels.hpp"

namespace round_p_test {

using attnref::Coord;
using attnref::Index;
using support::z;

// The default hooks (causal, window, masks) plus round_p: identity or rounding to a grid of
// 1/64 (coarse, so that its effect is far above fp32 noise).
struct TwoPass : attnref::DefaultVariant {
  bool coarse = false;
  template <class Acc>
  void round_p(const Coord&, Acc* row, Index cols) const {
    if (coarse)
      for (Index j = 0; j < cols; ++j) row[j] = std::nearbyint(row[j] * Acc(64)) / Acc(64);
  }
};

struct Problem {
  Index B = 2, Sq = 5, Skv = 70, N = 4, Nkv = 2, D = 16;
  std::vector<float> q, k, v;
  std::vector<std::uint8_t> mask;
  explicit Problem(unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd;
    q.resize(z(B * Sq * N * D));
    k.resize(z(B * Skv * Nkv * D));
    v.resize(k.size());
    for (float& x : q) x = nd(rng);
    for (float& x : k) x = nd(rng);
    for (float& x : v) x = nd(rng);
    mask.assign(z(B * Sq * Skv), 0);
    std::bernoulli_distribution hole(0.3);
    for (Index b = 0; b < B; ++b)
      for (Index i = 0; i < Sq; ++i)
        for (Index j = 0; j < Skv; ++j)
          mask[z((b * Sq + i) * Skv + j)] = hole(rng) || (b == 1 && i == 2);
  }
  attnref::AttentionInputs<float, float> in(bool use_mask) const {
    attnref::AttentionInputs<float, float> x{
        attnref::bsnd_view<const float>(q.data(), B, Sq, N, D),
        attnref::bsnd_view<const float>(k.data(), B, Skv, Nkv, D),
        attnref::bsnd_view<const float>(v.data(), B, Skv, Nkv, D)};
    if (use_mask)
      x.mask_bool = attnref::StridedView<const std::uint8_t, 4>(mask.data(), {B, 1, Sq, Skv},
                                                                {Sq * Skv, 0, Skv, 1});
    return x;
  }
};

template <class Variant>
std::vector<float> run(const Variant& var, const attnref::AttentionInputs<float, float>& in,
                       const attnref::AttentionParams& p, const Problem& pr,
                       std::vector<float>* probs = nullptr, int threads = 0) {
  std::vector<float> o(z(pr.B * pr.Sq * pr.N * pr.D), 7.0f);
  attnref::AttentionOutputs<float> out{
      attnref::bsnd_view<float>(o.data(), pr.B, pr.Sq, pr.N, pr.D)};
  if (probs) {
    probs->assign(z(pr.B * pr.N * pr.Sq * pr.Skv), -1.0f);
    out.probs = attnref::StridedView<float, 4>(probs->data(), {pr.B, pr.N, pr.Sq, pr.Skv});
  }
  attnref::AttentionParams q = p;  // the variants carry the causal mode and the window
  q.causal = attnref::CausalMode::None;
  q.window = 0;
  attnref::ExecConfig x;
  x.threads = threads;
  x.kv_tile = 16;  // several tiles, partial ones included
  attnref::attention_with(var, in, q, out, x);
  return o;
}

TEST(EngineRoundP, IdentityHookIsOrdinaryAttentionUnderEveryMask) {
  for (int m = 0; m < 4; ++m) {  // none, causal, causal + window 9, boolean mask
    Problem pr(40 + static_cast<unsigned>(m));
    attnref::AttentionParams p;
    p.scale = 0.3;
    if (m == 1 || m == 2) p.causal = attnref::CausalMode::BottomRight;
    if (m == 2) p.window = 9;
    const auto in = pr.in(false);
    TwoPass two;
    two.causal = {p.causal, p.window};
    if (m == 3) two.mask_bool = pr.in(true).mask_bool;
    attnref::DefaultVariant one;
    one.causal = two.causal;
    one.mask_bool = two.mask_bool;
    std::vector<float> p1, p2;
    const auto a = run(one, in, p, pr, &p1), b = run(two, in, p, pr, &p2);
    EXPECT_TRUE(support::all_close(std::vector<double>(a.begin(), a.end()),
                                   std::vector<double>(b.begin(), b.end()), {1e-6, 1e-5}))
        << "mask " << m;
    EXPECT_TRUE(support::all_close(std::vector<double>(p1.begin(), p1.end()),
                                   std::vector<double>(p2.begin(), p2.end()), {1e-7, 1e-6}))
        << "mask " << m;
  }
}

TEST(EngineRoundP, MaskedRowsOfKAndVAreNeverRead) {
  Problem pr(7);
  attnref::AttentionParams p;
  p.scale = 0.3;
  // Keys 10, 33 and 69 hidden from every query by the boolean mask, NaN in their K and V rows.
  for (Index b = 0; b < pr.B; ++b)
    for (Index i = 0; i < pr.Sq; ++i)
      for (Index j = 0; j < pr.Skv; ++j)
        pr.mask[z((b * pr.Sq + i) * pr.Skv + j)] = j == 10 || j == 33 || j == 69;
  for (Index b = 0; b < pr.B; ++b)
    for (Index j : {10, 33, 69})
      for (Index e = 0; e < pr.Nkv * pr.D; ++e) {
        pr.k[z((b * pr.Skv + j) * pr.Nkv * pr.D + e)] = NAN;
        pr.v[z((b * pr.Skv + j) * pr.Nkv * pr.D + e)] = NAN;
      }
  TwoPass two;
  two.mask_bool = pr.in(true).mask_bool;
  const auto o = run(two, pr.in(false), p, pr);
  for (float x : o) ASSERT_TRUE(std::isfinite(x));
}

TEST(EngineRoundP, RoundingHookMatchesANaiveLoopAndThreadsAndPagingDoNotChangeBits) {
  Problem pr(9);
  attnref::AttentionParams p;
  p.scale = 0.3;
  p.causal = attnref::CausalMode::BottomRight;
  TwoPass two;
  two.causal = {p.causal, 0};
  two.coarse = true;
  const auto in = pr.in(false);
  const auto o1 = run(two, in, p, pr, nullptr, 1);
  const auto o2 = run(two, in, p, pr, nullptr, 2);
  EXPECT_EQ(std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(float)), 0);
  // Naive: P = softmax (double), rounded to 1/64, times V; no renormalisation.
  const Index G = pr.N / pr.Nkv;
  std::vector<double> want, got(o1.begin(), o1.end());
  for (Index b = 0; b < pr.B; ++b)
    for (Index i = 0; i < pr.Sq; ++i)
      for (Index h = 0; h < pr.N; ++h) {
        const Index last = i + pr.Skv - pr.Sq, hk = h / G;
        std::vector<double> s(z(last + 1));
        double mx = -INFINITY, sum = 0.0;
        for (Index j = 0; j <= last; ++j) {
          double dot = 0.0;
          for (Index e = 0; e < pr.D; ++e)
            dot += double(pr.q[z(((b * pr.Sq + i) * pr.N + h) * pr.D + e)]) *
                   pr.k[z(((b * pr.Skv + j) * pr.Nkv + hk) * pr.D + e)];
          s[z(j)] = 0.3 * dot;
          mx = std::max(mx, s[z(j)]);
        }
        for (double& x : s) sum += (x = std::exp(x - mx));
        for (Index e = 0; e < pr.D; ++e) {
          double o = 0.0;
          for (Index j = 0; j <= last; ++j)
            o += std::nearbyint(s[z(j)] / sum * 64.0) / 64.0 *
                 pr.v[z(((b * pr.Skv + j) * pr.Nkv + hk) * pr.D + e)];
          want.push_back(o);
        }
      }
  // A P within 1e-6 of a rounding boundary may land on either side: allow one grid step there.
  EXPECT_TRUE(support::all_close(want, got, {2e-5, 2e-5}));
  // Paged: the same keys in blocks of 16, shuffled.
  const Index bs = 16, per = (pr.Skv + bs - 1) / bs, nb = pr.B * per;
  std::vector<float> kp(z(nb * bs * pr.Nkv * pr.D), NAN), vp(kp.size(), NAN);
  std::vector<std::int32_t> table(z(nb));
  for (Index i = 0; i < nb; ++i) table[z(i)] = static_cast<std::int32_t>((i * 7) % nb);
  for (Index b = 0; b < pr.B; ++b)
    for (Index t = 0; t < pr.Skv; ++t)
      for (Index e = 0; e < pr.Nkv * pr.D; ++e) {
        const Index blk = table[z(b * per + t / bs)];
        kp[z((blk * bs + t % bs) * pr.Nkv * pr.D + e)] =
            pr.k[z((b * pr.Skv + t) * pr.Nkv * pr.D + e)];
        vp[z((blk * bs + t % bs) * pr.Nkv * pr.D + e)] =
            pr.v[z((b * pr.Skv + t) * pr.Nkv * pr.D + e)];
      }
  auto pin = in;
  pin.k = attnref::StridedView<const float, 4>(kp.data(), {nb, bs, pr.Nkv, pr.D});
  pin.v = attnref::StridedView<const float, 4>(vp.data(), {nb, bs, pr.Nkv, pr.D});
  pin.block_table = attnref::StridedView<const std::int32_t, 2>(table.data(), {pr.B, per});
  pin.seq.kv.assign(z(pr.B), pr.Skv);
  const auto op = run(two, pin, p, pr);
  EXPECT_EQ(std::memcmp(o1.data(), op.data(), o1.size() * sizeof(float)), 0);
}

// The item_probs hook: records each row it is handed, in the probs output's layout.
struct Taken : TwoPass {
  Index B = 0, N = 0, Sq = 0, Skv = 0;
  std::vector<float>* got = nullptr;  // [B, N, Sq, Skv], -1 where never handed over
  std::vector<int>* times = nullptr;  // [B, N, Sq]: how often each row was handed over
  bool hole = false;                  // keys 16-47 of batch 1 hidden: two whole tiles skipped
  bool in_hole(Index batch, Index kv) const { return hole && batch == 1 && kv >= 16 && kv < 48; }
  attnref::TileMask classify(const attnref::SeqInfo& s, Index qb, Index qe, Index kb,
                             Index ke) const {
    if (in_hole(s.batch, kb) && in_hole(s.batch, ke - 1)) return attnref::TileMask::All;
    return TwoPass::classify(s, qb, qe, kb, ke);
  }
  bool masked(const attnref::SeqInfo& s, const Coord& c) const {
    return in_hole(s.batch, c.kv) || TwoPass::masked(s, c);
  }
  template <class Acc>
  void item_probs(const attnref::SeqInfo& s, const attnref::ItemProbs<Acc>& p) const {
    for (Index h = p.head_begin; h < p.head_end; ++h)
      for (Index gi = 0; gi < p.group; ++gi)
        for (Index q = p.q_begin; q < p.q_end; ++q) {
          const Index row = (s.batch * N + h * p.group + gi) * Sq + q;
          ++(*times)[z(row)];
          for (Index j = p.kv_begin; j < p.kv_end; ++j)
            (*got)[z(row * Skv + j)] = static_cast<float>(p.at(h, gi, q)[j - p.kv_begin]);
        }
  }
};

// Every row of every item is handed over once, with the bits the probs output gets; the keys
// outside the item's range have P 0, and so do the skipped tiles inside it (batch 1's kept rows
// there are zeroed: the workspace holds batch 0's scores at those places).
TEST(EngineItemProbs, EachRowOnceWithTheProbsOutputsBits) {
  for (int m = 0; m < 3; ++m)  // causal + window 9; a boolean mask and two skipped tiles; none
    for (int threads : {1, 2, 3}) {
      Problem pr(60 + static_cast<unsigned>(m));
      attnref::AttentionParams p;
      p.scale = 0.3;
      std::vector<float> got(z(pr.B * pr.N * pr.Sq * pr.Skv), -1.0f), probs;
      std::vector<int> times(z(pr.B * pr.N * pr.Sq), 0);
      Taken t;
      t.B = pr.B, t.N = pr.N, t.Sq = pr.Sq, t.Skv = pr.Skv, t.got = &got, t.times = &times;
      t.coarse = true;
      if (m == 0) t.causal = {attnref::CausalMode::BottomRight, 9};
      if (m == 1) t.mask_bool = pr.in(true).mask_bool, t.hole = true;
      run(t, pr.in(false), p, pr, &probs, threads);
      for (int n : times) ASSERT_EQ(n, 1) << "mask " << m << ", threads " << threads;
      Index outside = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        if (got[i] == -1.0f) {
          ++outside;
          ASSERT_EQ(probs[i], 0.0f) << "entry " << i << ", mask " << m;
        } else {
          ASSERT_EQ(std::memcmp(&got[i], &probs[i], sizeof(float)), 0)
              << "entry " << i << ", mask " << m << ", threads " << threads;
        }
      }
      if (m == 0) {
        EXPECT_GT(outside, 0);  // (the window leaves keys outside the range)
      }
    }
}

// fp16 / bf16 values: the two-pass mode reads whole tiles' value rows straight from the cache
// and converts them in registers (a partial tile still converts into the workspace). With the
// identity hook it is the one-pass attention over float copies of the same values, at every
// level, with and without the causal mask (10 rows per item: the panel kernels at the vector
// levels).
template <class T>
void check_narrow_values() {
  Problem pr(11);
  std::vector<T> k(pr.k.size()), v(pr.v.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = T(pr.k[i]);
    v[i] = T(pr.v[i]);
    pr.k[i] = static_cast<float>(k[i]);
    pr.v[i] = static_cast<float>(v[i]);
  }
  attnref::AttentionInputs<float, T> narrow{
      attnref::bsnd_view<const float>(pr.q.data(), pr.B, pr.Sq, pr.N, pr.D),
      attnref::bsnd_view<const T>(k.data(), pr.B, pr.Skv, pr.Nkv, pr.D),
      attnref::bsnd_view<const T>(v.data(), pr.B, pr.Skv, pr.Nkv, pr.D)};
  for (const auto causal : {attnref::CausalMode::None, attnref::CausalMode::BottomRight}) {
    TwoPass two;
    two.causal = {causal, 0};
    attnref::DefaultVariant one;
    one.causal = two.causal;
    attnref::AttentionParams p;
    p.scale = 0.3;
    const auto want = run(one, pr.in(false), p, pr);
    std::vector<float> got(want.size(), 7.0f);
    attnref::AttentionOutputs<float> out{
        attnref::bsnd_view<float>(got.data(), pr.B, pr.Sq, pr.N, pr.D)};
    attnref::ExecConfig x;
    x.kv_tile = 16;
    attnref::attention_with(two, narrow, p, out, x);
    EXPECT_TRUE(support::all_close(std::vector<double>(want.begin(), want.end()),
                                   std::vector<double>(got.begin(), got.end()), {1e-6, 1e-5}))
        << (causal == attnref::CausalMode::None ? "no mask" : "causal");
  }
}

TEST(EngineRoundP, NarrowValuesReadFromTheCacheAtEveryLevel) {
  support::at_every_level([] {
    check_narrow_values<attnref::half>();
    check_narrow_values<attnref::bfloat16>();
  });
}

}  // namespace round_p_test
