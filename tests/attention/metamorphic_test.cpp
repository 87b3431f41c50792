// Metamorphic properties: relations between runs that must hold whatever the reference says.

#include <gtest/gtest.h>

#include <attnref/attnref.hpp>

#include "support/case.hpp"

namespace {

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

}  // namespace
