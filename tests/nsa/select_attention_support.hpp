#pragma once
// The harness of the NSA selected-branch tests (select_attention_test.cpp,
// select_attention_rejects_test.cpp): a Case, the Built problem (the reference's batches and
// top-k lists, the operator's buffers, shuffled paged caches with NaN in every row no query may
// read) and the check against tests/reference/nsa_select.hpp.

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/nsa/select_attention.hpp>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "reference/nsa_select.hpp"
#include "support/cast.hpp"
#include "support/compare.hpp"

namespace select_attention_support {

using attnref::bfloat16;
using attnref::half;
using attnref::Index;
using attnref::NsaSelectedAttentionInferInputs;
using attnref::NsaSelectedAttentionInferOutputs;
using attnref::NsaSelectedAttentionInferParams;
using attnref::StridedView;
using support::dbl;
using support::kind_of;
using support::rnd;
using support::z;
using i32 = std::int32_t;
using Shape = std::vector<Index>;

// ---------------------------------------------------------------------------------------------
// The harness
// ---------------------------------------------------------------------------------------------

struct Case {
  std::string layout = "TND";  // TND, BSND or BSH
  int N = 4, KVN = 2, Dqk = 32, Dv = 32;
  long ls = 64, k = 3;
  int pbs = 64;
  double scale = 0.2;
  bool strict = false;
  bool cache4d = false;
  int S = 0;              // BSND / BSH q_S (0: the longest q_len)
  std::vector<int> qlen;  // per batch
  std::vector<long> sel;  // per batch raw lengths
  bool pass_qlen = true;  // actual_q_seq_len given (else 1 each / S)
  unsigned seed = 1, perm_seed = 11, topk_seed = 5;
  int spare_blocks = 2;       // unused (NaN) blocks in the pool
  bool shuffle = true;        // false: block b·maxBlocks + j is the batch's j-th page (no spare)
  bool all_blocks = false;    // top-k = every select block of the batch, shuffled, -1 after
  bool poison_heads = false;  // NaN per (token, kv head) instead of per cache row
  double empty_list = 0.1;    // probability of an all -1 list
};

template <class T>
struct Built {
  Case c;
  ref::nsa_select::Problem pr;
  std::vector<ref::nsa_select::Batch> bat;
  int B = 0, S = 0, rows = 0, total = 0, max_blocks = 1, nb = 0;
  std::vector<int> cu;
  std::vector<T> q, k, v, out;
  std::vector<i32> bt, tk;

  explicit Built(const Case& cs) : c(cs) {
    B = static_cast<int>(c.sel.size());
    pr.N = c.N, pr.KVN = c.KVN, pr.Dqk = c.Dqk, pr.Dv = c.Dv, pr.scale = c.scale;
    pr.ls = c.ls, pr.k = c.k;
    std::mt19937 rng(c.seed);
    std::normal_distribution<double> nd;
    bat.resize(z(B));
    for (int b = 0; b < B; ++b) {
      auto& x = bat[z(b)];
      x.q_len = c.qlen.empty() ? 1 : c.qlen[z(b)];
      x.sel = c.sel[z(b)];
      for (long e = 0; e < x.q_len * c.N * c.Dqk; ++e) x.q.push_back(rnd<T>(nd(rng)));
      for (long e = 0; e < x.sel * c.KVN * c.Dqk; ++e) x.k.push_back(rnd<T>(nd(rng)));
      for (long e = 0; e < x.sel * c.KVN * c.Dv; ++e) x.v.push_back(rnd<T>(nd(rng)));
    }
    cu = {0};
    for (auto& x : bat) cu.push_back(cu.back() + x.q_len);
    total = cu.back();
    S = c.S;
    if (S == 0)
      for (auto& x : bat) S = std::max(S, x.q_len);
    rows = c.layout == "TND" ? total : B * S;
    // Top-k lists: random subsets (the last and penultimate blocks often in), -1 anywhere.
    std::mt19937 trng(c.topk_seed);
    std::uniform_real_distribution<double> u;
    tk.assign(z(rows * c.KVN * c.k), -1);
    for (int b = 0; b < B; ++b) {
      auto& x = bat[z(b)];
      const long ns = (x.sel + c.ls - 1) / c.ls;
      x.topk.assign(z(x.q_len * c.KVN * c.k), -1);
      for (int i = 0; i < x.q_len; ++i)
        for (int g = 0; g < c.KVN; ++g) {
          std::vector<i32> pick;
          if (c.all_blocks) {
            for (long j = 0; j < ns; ++j) pick.push_back(static_cast<i32>(j));
          } else if (ns > 0 && u(trng) >= c.empty_list) {
            const long m = 1 + static_cast<long>(u(trng) * static_cast<double>(std::min(c.k, ns)));
            std::vector<i32> perm(z(ns));
            std::iota(perm.begin(), perm.end(), 0);
            std::shuffle(perm.begin(), perm.end(), trng);
            if (u(trng) < 0.7) pick.push_back(static_cast<i32>(ns - 1));
            if (ns > 1 && u(trng) < 0.7) pick.push_back(static_cast<i32>(ns - 2));
            for (i32 j : perm)
              if (static_cast<long>(pick.size()) < m &&
                  std::find(pick.begin(), pick.end(), j) == pick.end())
                pick.push_back(j);
            pick.resize(z(std::min<long>(m, static_cast<long>(pick.size()))));
          }
          pick.resize(z(c.k), -1);
          std::shuffle(pick.begin(), pick.end(), trng);
          std::copy(pick.begin(), pick.end(), x.topk.begin() + (i * c.KVN + g) * c.k);
          std::copy(pick.begin(), pick.end(), tk.begin() + (row(b, i) * c.KVN + g) * c.k);
        }
    }
    // Queries (padded rows NaN).
    q.assign(z(rows * c.N * c.Dqk), T(NAN));
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < bat[z(b)].q_len; ++i)
        for (int e = 0; e < c.N * c.Dqk; ++e)
          q[z(row(b, i) * c.N * c.Dqk + e)] =
              T(static_cast<float>(bat[z(b)].q[z(i * c.N * c.Dqk + e)]));
    build_cache();
    out.assign(z(rows * c.N * c.Dv), T(-777.0f));
  }

  // The paged caches: pool blocks (shuffled), NaN in every row (or (row, kv head)) nobody reads.
  void build_cache() {
    int used = 0, longest = 0;
    for (auto& x : bat) {
      const int n = static_cast<int>((x.sel + c.pbs - 1) / c.pbs);
      used += n;
      longest = std::max(longest, n);
    }
    max_blocks = c.shuffle ? longest + 1 : std::max(1, longest);
    nb = c.shuffle ? used + c.spare_blocks : B * max_blocks;
    std::vector<i32> pool(z(nb));
    std::iota(pool.begin(), pool.end(), 0);
    std::mt19937 prng(c.perm_seed);
    if (c.shuffle) std::shuffle(pool.begin(), pool.end(), prng);
    bt.assign(z(B * max_blocks), -1);
    k.assign(z(nb * c.pbs * c.KVN * c.Dqk), T(NAN));
    v.assign(z(nb * c.pbs * c.KVN * c.Dv), T(NAN));
    size_t next = 0;
    for (int b = 0; b < B; ++b) {
      const auto& x = bat[z(b)];
      for (long j = 0; j * c.pbs < x.sel; ++j)
        bt[z(b * max_blocks + j)] = c.shuffle ? pool[next++] : b * max_blocks + static_cast<int>(j);
      // Who reads what.
      std::vector<char> read(z(x.sel * c.KVN), 0);
      for (int i = 0; i < x.q_len; ++i)
        for (int g = 0; g < c.KVN; ++g) {
          const auto vis = ref::nsa_select::selected_keys(pr, x, i, g);
          for (long t = 0; t < x.sel; ++t)
            if (vis[z(t)]) read[z(t * c.KVN + g)] = 1;
        }
      for (long t = 0; t < x.sel; ++t) {
        bool any = false;
        for (int g = 0; g < c.KVN; ++g) any = any || read[z(t * c.KVN + g)];
        const long r = bt[z(b * max_blocks + t / c.pbs)] * c.pbs + t % c.pbs;
        for (int g = 0; g < c.KVN; ++g) {
          if (c.poison_heads ? !read[z(t * c.KVN + g)] : !any) continue;
          for (int e = 0; e < c.Dqk; ++e)
            k[z((r * c.KVN + g) * c.Dqk + e)] =
                T(static_cast<float>(x.k[z((t * c.KVN + g) * c.Dqk + e)]));
          for (int e = 0; e < c.Dv; ++e)
            v[z((r * c.KVN + g) * c.Dv + e)] =
                T(static_cast<float>(x.v[z((t * c.KVN + g) * c.Dv + e)]));
        }
      }
    }
  }

  int row(int b, int i) const { return c.layout == "TND" ? cu[z(b)] + i : b * S + i; }
  Shape qshape(Index d) const {
    if (c.layout == "TND") return {total, c.N, d};
    if (c.layout == "BSH") return {B, S, c.N * d};
    return {B, S, c.N, d};
  }
  Shape cshape(Index d) const {
    return c.cache4d ? Shape{nb, c.pbs, c.KVN, d} : Shape{nb, c.pbs, c.KVN * d};
  }
  Shape tshape() const {
    return c.layout == "TND" ? Shape{total, c.KVN, c.k} : Shape{B, S, c.KVN, c.k};
  }

  NsaSelectedAttentionInferParams params() const {
    NsaSelectedAttentionInferParams p;
    p.num_heads = c.N, p.num_key_value_heads = c.KVN;
    p.select_block_size = c.ls, p.select_block_count = c.k;
    p.page_block_size = c.pbs, p.scale_value = c.scale, p.layout = c.layout;
    p.strict = c.strict;
    return p;
  }
  NsaSelectedAttentionInferInputs<T> inputs() const {
    NsaSelectedAttentionInferInputs<T> in;
    in.query = StridedView<const T>(q.data(), qshape(c.Dqk));
    in.key = StridedView<const T>(k.data(), cshape(c.Dqk));
    in.value = StridedView<const T>(v.data(), cshape(c.Dv));
    in.topk_indices = StridedView<const i32>(tk.data(), tshape());
    in.block_table = StridedView<const i32>(bt.data(), {B, max_blocks});
    for (auto& x : bat) {
      if (c.pass_qlen) in.actual_q_seq_len.push_back(x.q_len);
      in.actual_sel_kv_seq_len.push_back(x.sel);
    }
    return in;
  }
  NsaSelectedAttentionInferOutputs<T> outputs() {
    NsaSelectedAttentionInferOutputs<T> o;
    o.output = StridedView<T>(out.data(), qshape(c.Dv));
    return o;
  }
  void run(int threads = 0) {
    attnref::nsa_selected_attention_infer(params(), inputs(), outputs(), {threads});
  }
  // The live rows' outputs in batch / token order, as float.
  std::vector<float> live() const {
    std::vector<float> r;
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < bat[z(b)].q_len; ++i)
        for (int e = 0; e < c.N * c.Dv; ++e)
          r.push_back(static_cast<float>(out[z(row(b, i) * c.N * c.Dv + e)]));
    return r;
  }
  std::vector<double> live_d() const {
    const auto f = live();
    return std::vector<double>(f.begin(), f.end());
  }
  // The reference outputs of the live rows in the same order.
  std::vector<double> expected() const {
    std::vector<double> r;
    for (const auto& x : bat) {
      const auto o = ref::nsa_select::selected(pr, x);
      r.insert(r.end(), o.begin(), o.end());
    }
    return r;
  }
};

template <class T>
void check_against_reference(const Case& cs, int threads = 0) {
  Built<T> bl(cs);
  ASSERT_NO_THROW(bl.run(threads));
  EXPECT_TRUE(support::all_close(bl.expected(), bl.live_d(), support::tolerance(kind_of<T>())));
  // Padded BSND / BSH rows: exactly 0.
  if (cs.layout == "TND") return;
  for (int b = 0; b < bl.B; ++b)
    for (int i = bl.bat[z(b)].q_len; i < bl.S; ++i)
      for (int e = 0; e < cs.N * cs.Dv; ++e) {
        ASSERT_EQ(dbl(bl.out[z(bl.row(b, i) * cs.N * cs.Dv + e)]), 0.0)
            << "padded row b " << b << " i " << i;
      }
}

}  // namespace select_attention_support
