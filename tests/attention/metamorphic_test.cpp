// Metamorphic properties: relations between runs that must hold whatever the reference says.

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/attnref.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

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

// Decode steps of a large query group (16 query heads per kv head: the panel path, rows in the
// vector lanes) put a sequence's kv heads in one work item when there are at least four
// sequences per worker, and one head per item otherwise: 8 sequences on 1 or 2 workers share,
// on 3 or 5 they do not. Which heads share an item never changes a bit, with and without
// split-KV and with a head size that has a vector tail.
TEST(Metamorphic, HeadsSharingAnItemNeverChangeBits) {
  Spec s = base_spec();
  s.nq = 32, s.nkv = 2, s.d = 40, s.dv = 24;
  s.q_len = {1, 1, 1, 1, 1, 1, 1, 1};
  s.kv_len = {300, 45, 250, 17, 64, 129, 1, 200};
  s.causal = ref::Causal::kNone;
  for (Index split : {Index(-1), Index(32)}) {
    s.kv_split = split;
    s.threads = 1;
    const auto one = run_o<float>(s);
    const auto one16 = run_o<attnref::half>(s);
    for (int t : {2, 3, 5}) {
      s.threads = t;
      EXPECT_TRUE(support::bitwise_equal(one, run_o<float>(s))) << t << " threads";
      EXPECT_TRUE(support::bitwise_equal(one16, run_o<attnref::half>(s))) << t << " threads f16";
    }
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

namespace metamorphic_test {

// Left-padded views (seq.q_start / seq.kv_start): the same sequences placed at other positions of
// their rows give the same bits (o, lse) as at position 0, and nothing outside them is read or
// written; starts that leave the view, or come with packed or paged views, are rejected.
TEST(Metamorphic, LeftPaddedViewsGiveTheUnpaddedBits) {
  using attnref::StridedView;
  const Index B = 3, S = 40, N = 4, KVN = 2, D = 16;
  const std::vector<Index> ql{7, 40, 0}, kl{33, 12, 40}, qs{30, 0, 17}, ks{5, 28, 0};
  std::normal_distribution<float> nd;
  auto run = [&](bool padded, std::vector<float>& o, std::vector<float>& lse) {
    std::vector<float> q(B * S * N * D, NAN), k(B * S * KVN * D, NAN), v(k.size(), NAN);
    std::mt19937 r2(9);
    for (Index b = 0; b < B; ++b) {
      const Index q0 = padded ? qs[b] : 0, k0 = padded ? ks[b] : 0;
      for (Index i = 0; i < ql[b] * N * D; ++i) q[(b * S + q0) * N * D + i] = nd(r2);
      for (Index j = 0; j < kl[b] * KVN * D; ++j) {
        k[(b * S + k0) * KVN * D + j] = nd(r2);
        v[(b * S + k0) * KVN * D + j] = nd(r2);
      }
    }
    o.assign(q.size(), 7.0f);
    lse.assign(B * N * S, 7.0f);
    attnref::AttentionInputs<float> in;
    in.q = StridedView<const float, 4>(q.data(), {B, S, N, D});
    in.k = StridedView<const float, 4>(k.data(), {B, S, KVN, D});
    in.v = StridedView<const float, 4>(v.data(), {B, S, KVN, D});
    in.seq.q = ql;
    in.seq.kv = kl;
    if (padded) in.seq.q_start = qs, in.seq.kv_start = ks;
    attnref::AttentionParams p;
    p.scale = 0.25;
    p.causal = attnref::CausalMode::BottomRight;
    attnref::AttentionOutputs<float> out{StridedView<float, 4>(o.data(), {B, S, N, D}),
                                         StridedView<float, 3>(lse.data(), {B, N, S})};
    attnref::ExecConfig ex;
    ex.q_tile = 8;
    ex.kv_tile = 16;
    attnref::attention(in, p, out, ex);
    return in;
  };
  std::vector<float> o0, l0, o1, l1;
  run(false, o0, l0);
  run(true, o1, l1);
  bool same = true, rest = true;
  for (Index b = 0; b < B; ++b)
    for (Index i = 0; i < S; ++i) {
      const bool in = i >= qs[b] && i < qs[b] + ql[b];
      for (Index x = 0; x < N * D; ++x) {
        const float g = o1[(b * S + i) * N * D + x];
        if (!in) {
          rest = rest && g == 7.0f;
          continue;
        }
        const float w = o0[(b * S + i - qs[b]) * N * D + x];
        same = same && std::memcmp(&g, &w, sizeof g) == 0;
      }
      for (Index h = 0; h < N && in; ++h)
        same = same && l1[(b * N + h) * S + i] == l0[(b * N + h) * S + i - qs[b]];
    }
  EXPECT_TRUE(same) << "a left-padded view changed the bits";
  EXPECT_TRUE(rest) << "a row outside its sequence was written";

  // Rejections: a start past S - len, a negative start, a size mismatch, a packed view.
  std::vector<float> q(B * S * N * D, 0.5f), k(B * S * KVN * D, 0.5f), o(q.size());
  attnref::AttentionInputs<float> in;
  in.q = StridedView<const float, 4>(q.data(), {B, S, N, D});
  in.k = in.v = StridedView<const float, 4>(k.data(), {B, S, KVN, D});
  in.seq.q = ql;
  in.seq.kv = kl;
  const attnref::AttentionOutputs<float> out{StridedView<float, 4>(o.data(), {B, S, N, D})};
  auto rejected = [&](attnref::AttentionInputs<float> bad, const std::string& frag) {
    try {
      attnref::attention(bad, attnref::AttentionParams{}, out);
      ADD_FAILURE() << "no exception: " << frag;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(frag), std::string::npos) << e.what();
    }
  };
  auto bad = in;
  bad.seq.q_start = {34, 0, 0};
  rejected(bad, "seq.q_start[0]");
  bad = in;
  bad.seq.kv_start = {0, 0, -1};
  rejected(bad, "seq.kv_start[2]");
  bad = in;
  bad.seq.kv_start = {0, 0};
  rejected(bad, "seq.kv_start");
  bad = in;
  bad.q = StridedView<const float, 4>(q.data(), {1, 47, N, D});
  bad.seq.q.clear();
  bad.seq.q_cu = {0, 7, 47, 47};
  bad.seq.q_start = {0, 0, 0};
  rejected(bad, "given with a packed (cu) or paged view");
}

}  // namespace metamorphic_test
