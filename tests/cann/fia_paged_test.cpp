// FusedInferAttentionScore's paged K/V with Q_S > 1 (the prompt branch with block_table):
// metamorphic, the same keys and values stored contiguously give the same bits (output and
// softmax_lse) in every layout, with 3-D and 4-D caches, blocks of 128 and 256 handed out
// shuffled (the unused rows NaN), masks, pse, causal and band modes, GQA, a batch without keys,
// and TND with its per-batch kv lengths; and the paged rules' rejections, each leaving the
// outputs untouched.

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/cann/fused_infer_attention_score.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/errors.hpp"
#include "support/random.hpp"

namespace fia_paged_test {

using attnref::half;
using attnref::Index;
using attnref::StridedView;
using Shape = std::vector<Index>;

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

struct Case {
  std::string layout = "BSND";
  std::vector<Index> ql{5, 3, 7}, kvl{300, 0, 129};  // TND: per-batch query lengths
  Index N = 4, KVN = 2, D = 32, bs = 128;
  bool four = false;  // [blockNum, KV_N, blockSize, D] caches
  int sparse = 0;
  bool mask = false, pse = false, lse = true;
  std::int64_t pre = 2147483647, next = 2147483647;
  unsigned seed = 1;
  Index B() const { return static_cast<Index>(ql.size()); }
  bool tnd() const { return layout == "TND"; }
  Index S1() const { return *std::max_element(ql.begin(), ql.end()); }
  Index S2() const { return *std::max_element(kvl.begin(), kvl.end()); }
};

// One problem, called with contiguous K/V and with a paged cache.
struct Problem {
  Case c;
  std::vector<Index> qcu{0}, kcu{0};
  std::vector<half> q, k, v, kc, vc, pse;
  std::vector<std::uint8_t> mask;
  std::vector<std::int32_t> table;
  Index nb = 0, maxb = 0, mcols = 0;

  explicit Problem(const Case& cs) : c(cs) {
    std::mt19937 rng(c.seed);
    for (Index b = 0; b < c.B(); ++b) {
      qcu.push_back(qcu.back() + c.ql[static_cast<size_t>(b)]);
      kcu.push_back(kcu.back() + c.kvl[static_cast<size_t>(b)]);
      maxb = std::max(maxb, (c.kvl[static_cast<size_t>(b)] + c.bs - 1) / c.bs);
      nb += (c.kvl[static_cast<size_t>(b)] + c.bs - 1) / c.bs;
    }
    maxb += 1;
    nb += 1;
    const Index qrows = c.tnd() ? qcu.back() : c.B() * c.S1();
    const Index krows = c.tnd() ? kcu.back() : c.B() * c.S2();
    q = support::randn<half>(static_cast<size_t>(qrows * c.N * c.D), rng);
    k = support::randn<half>(static_cast<size_t>(krows * c.KVN * c.D), rng);
    v = support::randn<half>(k.size(), rng);
    // The paged copies: shuffled blocks, NaN wherever no key lives.
    std::vector<std::int32_t> ids(static_cast<size_t>(nb));
    for (Index i = 0; i < nb; ++i) ids[static_cast<size_t>(i)] = static_cast<std::int32_t>(i);
    std::shuffle(ids.begin(), ids.end(), rng);
    table.assign(static_cast<size_t>(c.B() * maxb), -1);
    kc.assign(static_cast<size_t>(nb * c.bs * c.KVN * c.D), half(NAN));
    vc.assign(kc.size(), half(NAN));
    size_t next_id = 0;
    for (Index b = 0; b < c.B(); ++b)
      for (Index t = 0; t < c.kvl[static_cast<size_t>(b)]; ++t) {
        if (t % c.bs == 0) table[static_cast<size_t>(b * maxb + t / c.bs)] = ids[next_id++];
        const Index id = table[static_cast<size_t>(b * maxb + t / c.bs)];
        for (Index h = 0; h < c.KVN; ++h)
          for (Index e = 0; e < c.D; ++e) {
            const size_t src = static_cast<size_t>(kv_at(b, t, h) + e);
            const size_t dst =
                static_cast<size_t>(c.four ? ((id * c.KVN + h) * c.bs + t % c.bs) * c.D + e
                                           : ((id * c.bs + t % c.bs) * c.KVN + h) * c.D + e);
            kc[dst] = k[src];
            vc[dst] = v[src];
          }
      }
    mcols = std::max(c.S2(), maxb * c.bs);  // wide enough for both calls
    if (c.sparse >= 2) {
      mask.assign(2048 * 2048, 0);
    } else if (c.mask) {
      std::uniform_real_distribution<double> u(0, 1);
      mask.resize(static_cast<size_t>(c.B() * c.S1() * mcols));
      for (auto& m : mask) m = u(rng) < 0.3 ? 1 : 0;
    }
    if (c.pse) pse = support::randn<half>(static_cast<size_t>(c.B() * c.N * c.S1() * mcols), rng);
  }
  // Element offset of key t, head h of sequence b in the contiguous k / v.
  Index kv_at(Index b, Index t, Index h) const {
    if (c.tnd()) return ((kcu[static_cast<size_t>(b)] + t) * c.KVN + h) * c.D;
    if (c.layout == "BNSD" || c.layout == "BNSD_BSND") return ((b * c.KVN + h) * c.S2() + t) * c.D;
    return ((b * c.S2() + t) * c.KVN + h) * c.D;
  }
  Shape qshape() const {
    if (c.tnd()) return {qcu.back(), c.N, c.D};
    if (c.layout == "BSH") return {c.B(), c.S1(), c.N * c.D};
    if (c.layout == "BNSD" || c.layout == "BNSD_BSND") return {c.B(), c.N, c.S1(), c.D};
    return {c.B(), c.S1(), c.N, c.D};
  }
  Shape oshape() const {
    if (c.layout == "BNSD_BSND") return {c.B(), c.S1(), c.N, c.D};
    return qshape();
  }
  Shape kshape() const {
    if (c.tnd()) return {kcu.back(), c.KVN, c.D};
    if (c.layout == "BSH") return {c.B(), c.S2(), c.KVN * c.D};
    if (c.layout == "BNSD" || c.layout == "BNSD_BSND") return {c.B(), c.KVN, c.S2(), c.D};
    return {c.B(), c.S2(), c.KVN, c.D};
  }
  Shape cshape() const {
    return c.four ? Shape{nb, c.KVN, c.bs, c.D} : Shape{nb, c.bs, c.KVN * c.D};
  }
  attnref::FusedInferAttentionScoreParams params(bool paged) const {
    attnref::FusedInferAttentionScoreParams p;
    p.num_heads = c.N;
    p.num_key_value_heads = c.KVN;
    p.input_layout = c.layout;
    p.scale_value = 0.17;
    p.sparse_mode = c.sparse;
    p.pre_tokens = c.pre;
    p.next_tokens = c.next;
    p.softmax_lse_flag = c.lse;
    p.block_size = paged ? c.bs : 0;
    return p;
  }
  attnref::FusedInferAttentionScoreInputs<half> inputs(bool paged) const {
    attnref::FusedInferAttentionScoreInputs<half> in;
    in.query = StridedView<const half>(q.data(), qshape());
    if (paged) {
      in.key = {StridedView<const half>(kc.data(), cshape())};
      in.value = {StridedView<const half>(vc.data(), cshape())};
      in.block_table = StridedView<const std::int32_t>(table.data(), {c.B(), maxb});
    } else {
      in.key = {StridedView<const half>(k.data(), kshape())};
      in.value = {StridedView<const half>(v.data(), kshape())};
    }
    if (c.tnd()) {
      in.actual_seq_lengths.assign(qcu.begin() + 1, qcu.end());
      if (paged)
        in.actual_seq_lengths_kv.assign(c.kvl.begin(), c.kvl.end());  // per batch when paged
      else
        in.actual_seq_lengths_kv.assign(kcu.begin() + 1, kcu.end());
    } else {
      in.actual_seq_lengths.assign(c.ql.begin(), c.ql.end());
      in.actual_seq_lengths_kv.assign(c.kvl.begin(), c.kvl.end());
    }
    if (c.sparse >= 2)
      in.atten_mask = StridedView<const std::uint8_t>(mask.data(), {2048, 2048});
    else if (c.mask)
      in.atten_mask = StridedView<const std::uint8_t>(mask.data(), {c.B(), c.S1(), mcols});
    if (c.pse) in.pse_shift = StridedView<const half>(pse.data(), {c.B(), c.N, c.S1(), mcols});
    return in;
  }
  Shape lse_shape() const {
    return c.tnd() ? Shape{qcu.back(), c.N, 1} : Shape{c.B(), c.N, c.S1(), 1};
  }
  void run(bool paged, std::vector<half>& o, std::vector<float>& lse, int threads = 1) const {
    const Shape os = oshape(), ls = lse_shape();
    o.assign(static_cast<size_t>(q.size()), half(-3.0f));
    lse.assign(static_cast<size_t>(ls[0] * ls[1] * (ls.size() == 4 ? ls[2] : 1)), -3.0f);
    attnref::fused_infer_attention_score(
        params(paged), inputs(paged),
        attnref::FusedInferAttentionScoreOutputs<half>{StridedView<half>(o.data(), os),
                                                       StridedView<float>(lse.data(), ls)},
        {threads});
  }
};

std::vector<Case> cases() {
  std::vector<Case> v;
  for (const char* lay : {"BSH", "BSND", "BNSD", "BNSD_BSND"}) {
    Case c;
    c.layout = lay;
    c.mask = true;
    c.seed = static_cast<unsigned>(v.size() + 1);
    v.push_back(c);
    Case d = c;  // causal, pse, 256-token blocks, 4-D caches where the layout takes them
    d.mask = false;
    d.sparse = 3;
    d.pse = true;
    d.bs = 256;
    d.four = std::string(lay) == "BNSD" || std::string(lay) == "BNSD_BSND";
    d.seed += 10;
    v.push_back(d);
  }
  Case band;  // band (sparse 4) with a short window
  band.sparse = 4;
  band.pre = 40;
  band.next = 2;
  band.kvl = {260, 5, 129};
  band.seed = 21;
  v.push_back(band);
  for (bool four : {false, true}) {
    Case t;  // TND: per-batch kv lengths, causal, GQA 4 / 1
    t.layout = "TND";
    t.ql = {4, 0, 9, 2};
    t.kvl = {130, 3, 9, 256};
    t.KVN = 1;
    t.sparse = 3;
    t.four = four;
    t.seed = four ? 31 : 32;
    v.push_back(t);
  }
  Case t4;  // TND band (sparse 4; value head size 64)
  t4.layout = "TND";
  t4.ql = {4, 0, 9, 2};
  t4.kvl = {130, 3, 9, 256};
  t4.D = 64;
  t4.sparse = 4;
  t4.pre = 5;
  t4.next = -1;
  t4.seed = 35;
  v.push_back(t4);
  Case t0;  // TND, sparse 0, no mask
  t0.layout = "TND";
  t0.ql = {3, 5};
  t0.kvl = {7, 200};
  t0.seed = 41;
  v.push_back(t0);
  return v;
}

TEST(FiaPaged, PromptBranchEqualsContiguousKeysBitForBit) {
  for (const Case& c : cases()) {
    const Problem pr(c);
    std::vector<half> o_c, o_p, o_p2;
    std::vector<float> l_c, l_p, l_p2;
    pr.run(false, o_c, l_c);
    pr.run(true, o_p, l_p);
    pr.run(true, o_p2, l_p2, 2);
    EXPECT_TRUE(same_bits(o_c, o_p)) << c.layout << " sparse " << c.sparse;
    EXPECT_TRUE(same_bits(l_c, l_p)) << c.layout << " sparse " << c.sparse;
    EXPECT_TRUE(same_bits(o_p, o_p2)) << c.layout << " threads";
    EXPECT_TRUE(same_bits(l_p, l_p2)) << c.layout << " threads";
    EXPECT_TRUE(std::none_of(o_p.begin(), o_p.end(), [](half x) { return std::isnan(float(x)); }))
        << c.layout;
  }
}

// ---------------------------------------------------------------------------------------------

using Params = attnref::FusedInferAttentionScoreParams;
using Inputs = attnref::FusedInferAttentionScoreInputs<half>;

template <class F>
void expect_rejected(const Case& c, F&& edit, const std::string& fragment,
                     bool out_of_range = false) {
  Problem pr(c);
  Params p = pr.params(true);
  Inputs in = pr.inputs(true);
  std::vector<half> o(pr.q.size(), half(-3.0f));
  std::vector<float> lse(4096, -3.0f);
  const Shape ls = pr.lse_shape();
  const attnref::FusedInferAttentionScoreOutputs<half> out{StridedView<half>(o.data(), pr.oshape()),
                                                           StridedView<float>(lse.data(), ls)};
  edit(p, in, pr);
  const auto call = [&] { attnref::fused_infer_attention_score(p, in, out); };
  if (out_of_range)
    support::expect_rejected<std::out_of_range>(call, fragment);
  else
    support::expect_rejected(call, fragment);
  support::expect_validate_agrees([&] { attnref::validate(p, in, out); }, call);
  EXPECT_TRUE(std::all_of(o.begin(), o.end(), [](half x) { return float(x) == -3.0f; }))
      << fragment;
  EXPECT_TRUE(std::all_of(lse.begin(), lse.end(), [](float x) { return x == -3.0f; })) << fragment;
}

TEST(FiaPaged, Rejections) {
  const Case c;  // BSND
  Case tnd = cases()[9];
  expect_rejected(
      c, [](Params& p, Inputs&, Problem&) { p.block_size = 256; },
      "params.block_size differs from the cache's block size");
  Case b64 = c;
  b64.bs = 64;
  expect_rejected(
      b64, [](Params&, Inputs&, Problem&) {}, "params.block_size not supported with Q_S > 1");
  expect_rejected(
      c,
      [](Params&, Inputs& in, Problem& pr) {
        in.key = {StridedView<const half>(pr.kc.data(), {pr.nb, pr.c.KVN, pr.c.bs, pr.c.D})};
        in.value = in.key;
      },
      "key[0].shape not a paged cache for the layout");
  expect_rejected(
      c,
      [](Params&, Inputs& in, Problem& pr) {
        in.value = {StridedView<const half>(pr.vc.data(), {pr.nb - 1, pr.c.bs, pr.c.KVN * pr.c.D})};
      },
      "value[0].shape blocks differ from the key's");
  expect_rejected(
      c,
      [](Params&, Inputs& in, Problem& pr) {
        in.key = {StridedView<const half>(pr.kc.data(), {pr.nb, pr.c.bs, pr.c.KVN * 16})};
        in.value = in.key;
      },
      "key[0].shape head size differs from the query's");
  expect_rejected(
      c, [](Params&, Inputs& in, Problem&) { in.actual_seq_lengths_kv.clear(); },
      "actual_seq_lengths_kv required with a paged cache");
  expect_rejected(
      c,
      [](Params&, Inputs& in, Problem& pr) { in.actual_seq_lengths_kv[2] = pr.maxb * pr.c.bs + 1; },
      "actual_seq_lengths_kv[2] out of range");
  expect_rejected(
      c,
      [](Params&, Inputs& in, Problem& pr) {
        in.block_table = StridedView<const std::int32_t>(pr.table.data(), {2, pr.maxb});
      },
      "block_table.shape mismatch");
  expect_rejected(
      c, [](Params&, Inputs&, Problem& pr) { pr.table[0] = -1; }, "block_table[0][0]",
      /*out_of_range=*/true);
  expect_rejected(
      c,
      [](Params&, Inputs& in, Problem&) {
        static const std::int64_t pad[1] = {0};
        in.kv_padding_size = StridedView<const std::int64_t>(pad, {1});
      },
      "kv_padding_size");
  expect_rejected(
      tnd,
      [](Params&, Inputs& in, Problem& pr) {
        in.actual_seq_lengths_kv = {pr.c.kvl[0], pr.c.kvl[1]};
      },
      "actual_seq_lengths_kv one length per batch with TND and a paged cache");
  expect_rejected(
      tnd,
      [](Params& p, Inputs& in, Problem&) {
        p.sparse_mode = 1;
        in.atten_mask = {};
      },
      "params.sparse_mode not supported with TND and a paged cache");
  expect_rejected(
      tnd, [](Params& p, Inputs&, Problem&) { p.sparse_mode = 4; },
      "head size not supported with TND and sparse_mode 4");
  Case t0 = cases().back();
  std::vector<std::uint8_t> m(2048 * 2048, 0);
  expect_rejected(
      t0,
      [&](Params&, Inputs& in, Problem&) {
        in.atten_mask = StridedView<const std::uint8_t>(m.data(), {2048, 2048});
      },
      "atten_mask given with sparse_mode 0, TND and a paged cache");
  Case masked = c;  // a mask narrower than the longest sequence's blocks
  masked.mask = true;
  expect_rejected(
      masked,
      [](Params&, Inputs& in, Problem& pr) {
        in.atten_mask =
            StridedView<const std::uint8_t>(pr.mask.data(), {pr.c.B(), pr.c.S1(), 2 * pr.c.bs});
      },
      "atten_mask");
}

}  // namespace fia_paged_test
