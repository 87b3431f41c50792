#pragma once
// The harness of the NSA compressed-branch tests (compress_attention_test.cpp,
// compress_attention_rejects_test.cpp): a Case, the Built problem (the reference's batches, the
// operator's buffers with NaN in every unread row, shuffled paged K / V) and the check of every
// output against tests/reference/nsa.hpp.

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/nsa/compress_attention.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "nsa/nsa_support.hpp"
#include "reference/nsa.hpp"
#include "support/cast.hpp"
#include "support/compare.hpp"
#include "support/nsa_paged.hpp"

namespace compress_attention_support {

using attnref::bfloat16;
using attnref::half;
using attnref::Index;
using attnref::NsaCompressAttentionInferInputs;
using attnref::NsaCompressAttentionInferOutputs;
using attnref::NsaCompressAttentionInferParams;
using attnref::StridedView;
using nsa_support::dt_of;
using nsa_support::topk_ok;
using support::dbl;
using support::kind_of;
using support::rnd;
using support::z;
using i32 = std::int32_t;
using Shape = std::vector<Index>;

struct Case {
  std::string layout = "TND";
  int N = 4, KVN = 2, Dqk = 32, Dv = 32;
  long l = 32, d = 16, ls = 64, k = 1;
  int pbs = 16;
  double scale = 0.25;
  bool mask = false, strict = true, pass_qlen = true;
  int S = 0;               // BSND q_S (0: max q_len)
  std::vector<int> qlen;   // per batch
  std::vector<long> cmp;   // per batch
  std::vector<long> tail;  // per batch raw tokens past the covered span (empty: 0)
  unsigned seed = 1, perm_seed = 11;
  int spare_blocks = 3;
  int wide = 1;  // extra columns of the debug outputs
};

template <class T>
struct Built {
  Case c;
  ref::nsa::Problem pr;
  std::vector<ref::nsa::Batch> bat;
  int B = 0, S = 0, rows = 0, total = 0, max_blocks = 1, nb = 0;
  long max_cmp = 0, max_ns = 0;
  std::vector<int> cu;
  std::vector<T> q, k, v;
  std::vector<i32> bt;
  std::vector<std::uint8_t> mask_buf{1};
  std::vector<T> out;
  std::vector<i32> topk;
  std::vector<float> probs, hs, gs;

  explicit Built(const Case& cs) : c(cs) {
    B = static_cast<int>(c.cmp.size());
    pr.N = c.N, pr.KVN = c.KVN, pr.Dqk = c.Dqk, pr.Dv = c.Dv, pr.scale = c.scale;
    pr.g = {c.l, c.d, c.ls};
    pr.k = c.k, pr.mask = c.mask, pr.dt = dt_of<T>();
    std::mt19937 rng(c.seed);
    std::normal_distribution<double> nd;
    bat.resize(z(B));
    for (int b = 0; b < B; ++b) {
      auto& x = bat[z(b)];
      x.q_len = c.qlen.empty() ? 1 : c.qlen[z(b)];
      x.cmp = c.cmp[z(b)];
      const long t = c.tail.empty() ? 0 : c.tail[z(b)];
      x.sel = x.cmp > 0 ? (x.cmp - 1) * c.d + c.l + t : std::max<long>(x.q_len, t);
      for (long e = 0; e < x.q_len * c.N * c.Dqk; ++e) x.q.push_back(rnd<T>(nd(rng)));
      for (long e = 0; e < x.cmp * c.KVN * c.Dqk; ++e) x.k.push_back(rnd<T>(nd(rng)));
      for (long e = 0; e < x.cmp * c.KVN * c.Dv; ++e) x.v.push_back(rnd<T>(nd(rng)));
      max_cmp = std::max(max_cmp, x.cmp);
      max_ns = std::max(max_ns, ref::nsa::select_blocks(x.cmp, pr.g));
    }
    // Queries.
    cu = {0};
    for (auto& x : bat) cu.push_back(cu.back() + x.q_len);
    total = cu.back();
    S = c.S;
    if (S == 0)
      for (auto& x : bat) S = std::max(S, x.q_len);
    rows = c.layout == "TND" ? total : B * S;
    q.assign(z(rows * c.N * c.Dqk), T(NAN));
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < bat[z(b)].q_len; ++i)
        for (int e = 0; e < c.N * c.Dqk; ++e)
          q[z(row(b, i) * c.N * c.Dqk + e)] =
              T(static_cast<float>(bat[z(b)].q[z(i * c.N * c.Dqk + e)]));
    // Paged K / V: blocks from a shuffled pool, -1 padding, NaN everywhere not read.
    std::vector<long> lens;
    for (auto& x : bat) lens.push_back(x.cmp);
    auto pool = support::page_tokens<T>(
        lens, c.pbs, c.KVN * c.Dqk, c.KVN * c.Dv,
        [this](size_t b) -> const std::vector<double>& { return bat[b].k; },
        [this](size_t b) -> const std::vector<double>& { return bat[b].v; }, c.spare_blocks,
        c.perm_seed);
    k = std::move(pool.k), v = std::move(pool.v), bt = std::move(pool.table);
    max_blocks = pool.max_blocks, nb = pool.blocks;
    out.assign(z(rows * c.N * c.Dv), T(-777.0f));
    topk.assign(z(rows * c.KVN * c.k), 12345);
    probs.assign(z(rows * c.N * (max_cmp + c.wide)), -5.0f);
    hs.assign(z(rows * c.N * (max_ns + c.wide)), -5.0f);
    gs.assign(z(rows * c.KVN * (max_ns + c.wide)), -5.0f);
  }

  int row(int b, int i) const { return c.layout == "TND" ? cu[z(b)] + i : b * S + i; }
  Shape lay(Index heads, Index last) const {
    return c.layout == "TND" ? Shape{total, heads, last} : Shape{B, S, heads, last};
  }

  NsaCompressAttentionInferParams params() const {
    NsaCompressAttentionInferParams p;
    p.num_heads = c.N, p.num_key_value_heads = c.KVN;
    p.select_block_size = c.ls, p.select_block_count = c.k;
    p.compress_block_size = c.l, p.compress_block_stride = c.d;
    p.scale_value = c.scale, p.layout = c.layout, p.page_block_size = c.pbs;
    p.strict = c.strict;
    return p;
  }
  NsaCompressAttentionInferInputs<T> inputs() const {
    NsaCompressAttentionInferInputs<T> in{
        StridedView<const T>(q.data(), lay(c.N, c.Dqk)),
        StridedView<const T>(k.data(), {nb, c.pbs, c.KVN * c.Dqk}),
        StridedView<const T>(v.data(), {nb, c.pbs, c.KVN * c.Dv})};
    if (c.mask) in.atten_mask = StridedView<const std::uint8_t>(mask_buf.data(), {1});
    in.block_table = StridedView<const i32>(bt.data(), {B, max_blocks});
    for (auto& x : bat) {
      if (c.pass_qlen) in.actual_q_seq_len.push_back(x.q_len);
      in.actual_cmp_kv_seq_len.push_back(x.cmp);
      if (c.mask) in.actual_sel_kv_seq_len.push_back(x.sel);
    }
    return in;
  }
  NsaCompressAttentionInferOutputs<T> outputs() {
    NsaCompressAttentionInferOutputs<T> o{StridedView<T>(out.data(), lay(c.N, c.Dv)),
                                          StridedView<i32>(topk.data(), lay(c.KVN, c.k))};
    o.probs = StridedView<float>(probs.data(), lay(c.N, max_cmp + c.wide));
    o.head_scores = StridedView<float>(hs.data(), lay(c.N, max_ns + c.wide));
    o.group_scores = StridedView<float>(gs.data(), lay(c.KVN, max_ns + c.wide));
    return o;
  }
  void run(int threads = 0) {
    attnref::nsa_compress_attention_infer(params(), inputs(), outputs(), {threads});
  }
};

template <class T>
void check_against_reference(const Case& cs, bool round_p = true) {
  Built<T> bl(cs);
  bl.pr.round_p = round_p;
  ASSERT_NO_THROW(bl.run());
  const auto& c = bl.c;
  std::vector<double> eo(bl.out.size(), 0.0), go, ep(bl.probs.size(), 0.0), gp,
      eh(bl.hs.size(), 0.0), gh, eg(bl.gs.size(), 0.0), gg;
  std::vector<char> live(z(bl.rows), 0);
  const long wp = bl.max_cmp + c.wide, ws = bl.max_ns + c.wide;
  for (int b = 0; b < bl.B; ++b) {
    const auto r = ref::nsa::run(bl.pr, bl.bat[z(b)]);
    const long cmp = bl.bat[z(b)].cmp, ns = r.n_sel;
    for (int i = 0; i < bl.bat[z(b)].q_len; ++i) {
      const int row = bl.row(b, i);
      live[z(row)] = 1;
      for (int h = 0; h < c.N; ++h) {
        const size_t rh = z(i * c.N + h), oh = z(row * c.N + h);
        for (int x = 0; x < c.Dv; ++x) eo[oh * z(c.Dv) + z(x)] = r.out[rh * z(c.Dv) + z(x)];
        for (long t = 0; t < cmp; ++t) ep[oh * z(wp) + z(t)] = r.probs[rh * z(cmp) + z(t)];
        for (long p = 0; p < ns; ++p) eh[oh * z(ws) + z(p)] = r.head_scores[rh * z(ns) + z(p)];
      }
      for (int kh = 0; kh < c.KVN; ++kh) {
        const size_t rk = z(i * c.KVN + kh), ok = z(row * c.KVN + kh);
        std::vector<double> g(r.group_scores.begin() + static_cast<long>(rk * z(ns)),
                              r.group_scores.begin() + static_cast<long>((rk + 1) * z(ns)));
        for (long p = 0; p < ns; ++p) eg[ok * z(ws) + z(p)] = g[z(p)];
        EXPECT_TRUE(topk_ok(g, bl.topk.data() + ok * z(c.k), c.k))
            << "batch " << b << " token " << i << " kv head " << kh;
      }
    }
  }
  // Padded BSND rows: output exactly 0, top-k -1, debug rows 0.
  for (int row = 0; row < bl.rows; ++row)
    if (!live[z(row)]) {
      for (int e = 0; e < c.N * c.Dv; ++e) EXPECT_EQ(dbl(bl.out[z(row * c.N * c.Dv + e)]), 0.0);
      for (int e = 0; e < c.KVN * c.k; ++e) EXPECT_EQ(bl.topk[z(row * c.KVN * c.k + e)], -1);
    }
  for (const T& x : bl.out) go.push_back(dbl(x));
  for (float x : bl.probs) gp.push_back(x);
  for (float x : bl.hs) gh.push_back(x);
  for (float x : bl.gs) gg.push_back(x);
  EXPECT_TRUE(support::all_close(eo, go, support::tolerance(kind_of<T>()))) << "output";
  EXPECT_TRUE(support::all_close(ep, gp, {1e-7, 1e-5})) << "probs";
  EXPECT_TRUE(support::all_close(eh, gh, {1e-7, 1e-5})) << "head scores";
  EXPECT_TRUE(support::all_close(eg, gg, {1e-7, 1e-5})) << "group scores";
}

}  // namespace compress_attention_support
