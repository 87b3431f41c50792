// NSA's dense limit, end to end: with identity compression (l = d = 1 and a weight of ones, so
// nsa_compress copies the raw keys and values), a top-k that keeps every select block and a
// window covering the whole sequence, each of the three branches of nsa_decode_step is plain
// causal attention over the raw K/V, and so is any gated sum whose gates add up to 1. Checked
// against the naive double reference (tests/reference/naive_attention.hpp), for fp16 and fp32,
// one and two query tokens (with two, the compressed branch's multi-token rule masks exactly the
// newest key for the first token, which is causal at l = d = 1).

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/nsa/compress.hpp>
#include <attnref/nsa/decode_step.hpp>
#include <cstdint>
#include <numeric>
#include <random>
#include <type_traits>
#include <vector>

#include "reference/naive_attention.hpp"
#include "support/cast.hpp"
#include "support/compare.hpp"

namespace dense_limit_test {

using attnref::half;
using attnref::Index;
using attnref::StridedView;
using support::dbl;
using support::z;
using i32 = std::int32_t;

template <class T>
void dense_limit(const std::vector<Index>& sel, const std::vector<Index>& qlen, unsigned seed) {
  constexpr Index N = 4, KVN = 2, Dqk = 16, Dv = 8, ls = 8, pbs = 16, cpbs = 8;
  const Index B = static_cast<Index>(sel.size());
  Index total = 0, rows = 0, max_sel = 0;
  std::vector<std::int64_t> cu;
  for (Index b = 0; b < B; ++b) {
    cu.push_back(total += sel[z(b)]);
    rows += qlen[z(b)];
    max_sel = std::max(max_sel, sel[z(b)]);
  }
  const Index k = (max_sel + ls - 1) / ls;  // every select block of the longest sequence
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  auto fill = [&](Index n) {
    std::vector<T> x(z(n));
    for (T& e : x) e = T(nd(rng));
    return x;
  };
  const auto raw_k = fill(total * KVN * Dqk), raw_v = fill(total * KVN * Dv);
  const auto q = fill(rows * N * Dqk);
  // Identity compression: l = d = 1, weight 1.
  attnref::NsaCompressParams cp;
  cp.compress_block_size = 1, cp.compress_stride = 1, cp.strict = false;
  const std::vector<T> ones(z(KVN), T(1.0f));
  std::vector<T> ck(raw_k.size()), cv(raw_v.size());
  attnref::nsa_compress<T>(cp, {raw_k.data(), {total, KVN, Dqk}}, {ones.data(), {1, KVN}}, cu,
                           {ck.data(), {total, KVN, Dqk}});
  attnref::nsa_compress<T>(cp, {raw_v.data(), {total, KVN, Dv}}, {ones.data(), {1, KVN}}, cu,
                           {cv.data(), {total, KVN, Dv}});
  ASSERT_TRUE(
      std::equal(ck.begin(), ck.end(), raw_k.begin(), [](T a, T b) { return dbl(a) == dbl(b); }));
  // Both caches paged, in shuffled pools of their own page sizes.
  auto page = [&](const std::vector<T>& x, Index width, Index ps, std::vector<T>& pool,
                  std::vector<i32>& table, Index& per) {
    per = (max_sel + ps - 1) / ps;
    table.resize(z(B * per));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    pool.assign(z(B * per * ps * width), T(NAN));
    for (Index b = 0, t0 = 0; b < B; t0 += sel[z(b)], ++b)
      for (Index t = 0; t < sel[z(b)]; ++t)
        std::copy_n(x.begin() + (t0 + t) * width, width,
                    pool.begin() + (table[z(b * per + t / ps)] * ps + t % ps) * width);
  };
  std::vector<T> kp, vp, ckp, cvp;
  std::vector<i32> bt, cbt, bt_v, cbt_v;
  Index per = 0, cper = 0, per_v = 0, cper_v = 0;
  std::mt19937 keep = rng;  // the same shuffles for K and V
  page(raw_k, KVN * Dqk, pbs, kp, bt, per);
  rng = keep;
  page(raw_v, KVN * Dv, pbs, vp, bt_v, per_v);
  keep = rng;
  page(ck, KVN * Dqk, cpbs, ckp, cbt, cper);
  rng = keep;
  page(cv, KVN * Dv, cpbs, cvp, cbt_v, cper_v);
  ASSERT_EQ(bt, bt_v);
  ASSERT_EQ(cbt, cbt_v);
  // Gates adding up to 1 (exactly: g2 = 1 - g0 - g1 in float with small dyadic g0, g1).
  std::vector<float> gates(z(rows * N * 3));
  std::uniform_int_distribution<int> eighth(0, 4);
  for (Index r = 0; r < rows * N; ++r) {
    gates[z(3 * r)] = 0.125f * static_cast<float>(eighth(rng));
    gates[z(3 * r + 1)] = 0.125f * static_cast<float>(eighth(rng));
    gates[z(3 * r + 2)] = 1.0f - gates[z(3 * r)] - gates[z(3 * r + 1)];
  }
  attnref::NsaDecodeParams p;
  p.num_heads = N, p.num_key_value_heads = KVN;
  p.compress_block_size = 1, p.compress_block_stride = 1;
  p.select_block_size = ls, p.select_block_count = k;
  p.window_size = max_sel;
  p.page_block_size = pbs, p.cmp_page_block_size = cpbs;
  p.scale_value = 0.3;
  p.strict = false;
  attnref::NsaDecodeInputs<T> in;
  in.query = {q.data(), {rows, N, Dqk}};
  in.key = {kp.data(), {B * per, pbs, KVN * Dqk}};
  in.value = {vp.data(), {B * per, pbs, KVN * Dv}};
  in.block_table = {bt.data(), {B, per}};
  in.cmp_key = {ckp.data(), {B * cper, cpbs, KVN * Dqk}};
  in.cmp_value = {cvp.data(), {B * cper, cpbs, KVN * Dv}};
  in.cmp_block_table = {cbt.data(), {B, cper}};
  in.gates = {gates.data(), {rows, N, 3}};
  in.actual_q_seq_len.assign(qlen.begin(), qlen.end());
  in.actual_sel_kv_seq_len.assign(sel.begin(), sel.end());
  const std::vector<Index> shape{rows, N, Dv};
  std::vector<T> o(z(rows * N * Dv)), oc(o.size()), os(o.size()), ow(o.size());
  std::vector<i32> topk(z(rows * KVN * k));
  attnref::NsaDecodeOutputs<T> out;
  out.output = {o.data(), shape};
  out.topk = {topk.data(), {rows, KVN, k}};
  out.cmp_out = {oc.data(), shape};
  out.sel_out = {os.data(), shape};
  out.win_out = {ow.data(), shape};
  attnref::nsa_decode_step(p, in, out);

  // Dense causal attention over the raw K/V.
  ref::Problem pr;
  pr.num_heads = N, pr.num_kv_heads = KVN, pr.head_size = Dqk, pr.v_head_size = Dv;
  pr.scale = 0.3;
  pr.causal = ref::Causal::kBottomRight;
  ref::Seqs rq(z(B)), rk(z(B)), rv(z(B));
  for (Index b = 0, t0 = 0, r0 = 0; b < B; t0 += sel[z(b)], r0 += qlen[z(b)], ++b) {
    pr.q_len.push_back(static_cast<int>(qlen[z(b)]));
    pr.kv_len.push_back(static_cast<int>(sel[z(b)]));
    for (Index i = r0 * N * Dqk; i < (r0 + qlen[z(b)]) * N * Dqk; ++i)
      rq[z(b)].push_back(dbl(q[z(i)]));
    for (Index i = t0 * KVN * Dqk; i < (t0 + sel[z(b)]) * KVN * Dqk; ++i)
      rk[z(b)].push_back(dbl(raw_k[z(i)]));
    for (Index i = t0 * KVN * Dv; i < (t0 + sel[z(b)]) * KVN * Dv; ++i)
      rv[z(b)].push_back(dbl(raw_v[z(i)]));
  }
  const ref::Result want = ref::attention(pr, rq, rk, rv);
  std::vector<double> dense;
  for (const auto& ob : want.o) dense.insert(dense.end(), ob.begin(), ob.end());
  using support::as_doubles;
  const auto tol = support::tolerance(support::kind_of<T>());
  EXPECT_TRUE(support::all_close(dense, as_doubles(oc), tol)) << "compressed branch";
  EXPECT_TRUE(support::all_close(dense, as_doubles(os), tol)) << "selected branch";
  EXPECT_TRUE(support::all_close(dense, as_doubles(ow), tol)) << "window branch";
  // The gated sum rounds three branch outputs and itself: two tolerances.
  EXPECT_TRUE(support::all_close(dense, as_doubles(o), {2 * tol.atol, 2 * tol.rtol})) << "output";
  // The top-k of a batch is a permutation of all its select blocks, then -1.
  for (Index b = 0, r0 = 0; b < B; r0 += qlen[z(b)], ++b) {
    const Index n_sel = (sel[z(b)] + ls - 1) / ls;
    for (Index r = r0; r < r0 + qlen[z(b)]; ++r)
      for (Index g = 0; g < KVN; ++g) {
        std::vector<i32> got(topk.begin() + (r * KVN + g) * k,
                             topk.begin() + (r * KVN + g + 1) * k);
        std::vector<i32> want_set(z(k), -1);
        std::iota(want_set.begin(), want_set.begin() + n_sel, 0);
        std::sort(got.begin(), got.begin() + n_sel);
        EXPECT_EQ(got, want_set) << "row " << r << " kv head " << g;
      }
  }
}

TEST(NsaDenseLimit, EveryBranchIsDenseCausalAttention) {
  dense_limit<half>({37, 64}, {1, 1}, 1);
  dense_limit<half>({37, 64, 9}, {2, 1, 2}, 2);
  dense_limit<float>({37, 64}, {1, 2}, 3);
  dense_limit<float>({1, 8, 17}, {1, 1, 1}, 4);
}

}  // namespace dense_limit_test
