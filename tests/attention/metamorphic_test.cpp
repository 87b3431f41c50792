// Metamorphic properties: relations between runs that must hold whatever the reference says.

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/attnref.hpp>
#include <cmath>
#include <random>

#include "support/case.hpp"

namespace metamorphic_test {

using attnref::Index;
using support::Lay;
using support::Spec;

Spec base_spec() {
  Spec s;
  s.nq = 8;
  s.nkv = 2;
  s.d = 32;
  s.dv = 32;
  s.q_len = {37, 5, 64};
  s.kv_len = {61, 5, 130};
  s.causal = ref::Causal::kBottomRight;
  s.q_tile = 8;
  s.kv_tile = 16;
  return s;
}

template <class T>
std::vector<double> run_o(const Spec& s, unsigned seed = 3) {
  Spec t = s;
  t.seed = seed;
  support::Data d = support::make_data<T>(t);
  support::bind_masks(d, t);
  return support::flat(support::run_lib<T>(t, d).o);
}

TEST(Metamorphic, LayoutsGiveIdenticalBits) {
  for (auto causal : {ref::Causal::kNone, ref::Causal::kBottomRight}) {
    Spec s = base_spec();
    s.causal = causal;
    const auto bsnd = run_o<float>(s);
    for (Lay l : {Lay::BNSD, Lay::TND, Lay::Padded}) {
      s.layout = l;
      EXPECT_TRUE(support::bitwise_equal(bsnd, run_o<float>(s))) << support::name(l);
    }
    s.layout = Lay::BSND;
    const auto bsnd16 = run_o<attnref::half>(s);
    s.layout = Lay::BNSD;
    EXPECT_TRUE(support::bitwise_equal(bsnd16, run_o<attnref::half>(s))) << "f16 BNSD";
  }
}

TEST(Metamorphic, PagedKvGivesTheContiguousBits) {
  // Shuffled block tables, blocks of one token, blocks longer than every sequence, tiles that
  // cross block boundaries; the small-row (decode) kernels and the GEMM path.
  for (bool decode : {false, true}) {
    Spec s = base_spec();
    if (decode) {
      s.q_len = {1, 1, 2};
      s.kv_len = {61, 5, 700};
      s.kv_split = 64;
    }
    const auto flat32 = run_o<float>(s);
    const auto flat16 = run_o<attnref::half>(s);
    s.layout = Lay::Paged;
    for (int bs : {1, 3, 16, 64, 1000}) {
      s.block_size = bs;
      EXPECT_TRUE(support::bitwise_equal(flat32, run_o<float>(s))) << "f32 block " << bs;
      EXPECT_TRUE(support::bitwise_equal(flat16, run_o<attnref::half>(s))) << "f16 block " << bs;
    }
  }
}

TEST(Metamorphic, SequencesSharingPrefixBlocks) {
  // Two sequences whose tables point at the same first blocks (prefix caching) give the same
  // output as two separate copies of the prefix.
  const int bs = 4, nkv = 2, nq = 4, d = 16, len0 = 11, len1 = 9;  // 2 shared blocks
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  const int blocks = 8;
  std::vector<float> kp(static_cast<size_t>(blocks * bs * nkv * d)), vp(kp.size());
  for (auto& x : kp) x = nd(rng);
  for (auto& x : vp) x = nd(rng);
  std::vector<float> q(static_cast<size_t>(2 * nq * d)), o1(q.size()), o2(q.size());
  for (auto& x : q) x = nd(rng);
  // Tables [2, 3]: sequence 0 = {5, 2, 7}; sequence 1 shares blocks 5 and 2, or reads private
  // copies of them (blocks 6 and 4).
  std::vector<std::int32_t> shared = {5, 2, 7, 5, 2, 0}, copied = {5, 2, 7, 6, 4, 0};
  const size_t blk = static_cast<size_t>(bs * nkv * d);
  for (auto* pool : {&kp, &vp}) {
    std::copy_n(pool->begin() + 5 * blk, blk, pool->begin() + 6 * blk);
    std::copy_n(pool->begin() + 2 * blk, blk, pool->begin() + 4 * blk);
  }
  auto run = [&](const std::vector<std::int32_t>& table, std::vector<float>& o) {
    attnref::AttentionInputs<float> in{
        attnref::StridedView<const float, 4>(q.data(), {2, 1, nq, d}),
        attnref::StridedView<const float, 4>(kp.data(), {blocks, bs, nkv, d}),
        attnref::StridedView<const float, 4>(vp.data(), {blocks, bs, nkv, d})};
    in.seq.kv = {len0, len1};
    in.block_table = attnref::StridedView<const std::int32_t, 2>(table.data(), {2, 3});
    attnref::attention(
        in, attnref::AttentionParams{},
        attnref::AttentionOutputs<float>{attnref::StridedView<float, 4>(o.data(), {2, 1, nq, d})});
  };
  run(shared, o1);
  run(copied, o2);
  EXPECT_EQ(o1, o2);
  for (float x : o1) EXPECT_TRUE(std::isfinite(x));
}

TEST(Metamorphic, ThreadCountNeverChangesBits) {
  Spec s = base_spec();
  s.q_len = {1, 200, 1, 3};
  s.kv_len = {300, 200, 45, 250};
  s.kv_split = 32;  // decode rows are split along kv
  for (auto mask : {support::MaskKind::None, support::MaskKind::Additive}) {
    s.mask = mask;
    s.threads = 1;
    const auto one = run_o<float>(s);
    for (int t : {2, 3, 5}) {
      s.threads = t;
      EXPECT_TRUE(support::bitwise_equal(one, run_o<float>(s))) << t << " threads";
    }
    s.threads = 1;
    const auto one16 = run_o<attnref::bfloat16>(s);
    s.threads = 2;
    EXPECT_TRUE(support::bitwise_equal(one16, run_o<attnref::bfloat16>(s))) << "bf16";
  }
}

TEST(Metamorphic, SplitKvMergeEqualsWholeSequence) {
  Spec s = base_spec();
  s.q_len = {1, 2, 1};
  s.kv_len = {333, 100, 64};
  s.kv_split = -1;  // no split
  const auto whole = run_o<float>(s);
  for (Index split : {Index(4), Index(16), Index(40), Index(64), Index(1000)}) {  // 4: capped
    s.kv_split = split;
    EXPECT_TRUE(support::all_close(whole, run_o<float>(s), {1e-6, 1e-5})) << "split " << split;
  }
}

TEST(Metamorphic, DecodeEqualsLastRowOfPrefill) {
  // Prefill over kv_len tokens with bottom-right causal; then decode the last query alone.
  Spec pre = base_spec();
  pre.q_len = {50};
  pre.kv_len = {50};
  pre.seed = 11;
  support::Data d = support::make_data<float>(pre);
  const auto full = support::run_lib<float>(pre, d);
  Spec dec = pre;
  dec.q_len = {1};
  support::Data dd = d;
  // Keep only the last query row.
  const size_t row = static_cast<size_t>(pre.nq * pre.d);
  dd.q[0].assign(d.q[0].end() - static_cast<long>(row), d.q[0].end());
  dd.pr.q_len = {1};
  const auto one = support::run_lib<float>(dec, dd);
  const size_t orow = static_cast<size_t>(pre.nq * pre.dv);
  std::vector<double> last(full.o[0].end() - static_cast<long>(orow), full.o[0].end());
  EXPECT_TRUE(support::all_close(last, one.o[0], {1e-6, 1e-5}));
}

TEST(Metamorphic, GqaWithRepeatedKvHeadsEqualsMha) {
  Spec g = base_spec();  // 8 q heads on 2 kv heads
  g.seed = 5;
  support::Data dg = support::make_data<float>(g);
  const auto gqa = support::flat(support::run_lib<float>(g, dg).o);
  Spec m = g;
  m.nkv = m.nq;
  support::Data dm = dg;
  dm.pr.num_kv_heads = m.nq;
  const int group = g.nq / g.nkv;
  for (int b = 0; b < g.batch(); ++b) {
    for (ref::Seqs* x : {&dm.k, &dm.v}) {
      const ref::Seqs& src = x == &dm.k ? dg.k : dg.v;
      const int dim = x == &dm.k ? g.d : g.dv;
      (*x)[b].assign(static_cast<size_t>(g.kv_len[b]) * m.nq * dim, 0.0);
      for (int j = 0; j < g.kv_len[b]; ++j)
        for (int h = 0; h < m.nq; ++h)
          for (int e = 0; e < dim; ++e)
            (*x)[b][(static_cast<size_t>(j) * m.nq + h) * dim + e] =
                src[b][(static_cast<size_t>(j) * g.nkv + h / group) * dim + e];
    }
  }
  const auto mha = support::flat(support::run_lib<float>(m, dm).o);
  EXPECT_TRUE(support::all_close(gqa, mha, {1e-6, 1e-5}));
}

TEST(Metamorphic, TilingChangesRoundingOnly) {
  Spec s = base_spec();
  const auto a = run_o<double>(s);
  s.q_tile = 1;
  s.kv_tile = 1;
  EXPECT_TRUE(support::all_close(a, run_o<double>(s), {1e-12, 1e-12}));
  s.q_tile = 1000;
  s.kv_tile = 1000;
  EXPECT_TRUE(support::all_close(a, run_o<double>(s), {1e-12, 1e-12}));
}

TEST(Metamorphic, NoMaskEqualsAllZeroBooleanMask) {
  Spec s = base_spec();
  s.causal = ref::Causal::kNone;
  support::Data d = support::make_data<float>(s);
  const auto plain = support::flat(support::run_lib<float>(s, d).o);
  s.mask = support::MaskKind::Bool;
  d.mbool.assign(static_cast<size_t>(s.batch()) * s.max_q() * s.max_kv(), 0);
  d.mask_heads = 1;
  EXPECT_TRUE(
      support::all_close(plain, support::flat(support::run_lib<float>(s, d).o), {1e-6, 1e-6}));
}

}  // namespace metamorphic_test
