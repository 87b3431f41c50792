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
// still matches the reference.

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/attention/attention.hpp>
#include <attnref/nsa/select_attention.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "reference/nsa_select.hpp"
#include "support/cast.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"
#include "support/views.hpp"

namespace select_attention_test {

using attnref::bfloat16;
using attnref::half;
using attnref::Index;
using attnref::NsaSelectedAttentionInferInputs;
using attnref::NsaSelectedAttentionInferOutputs;
using attnref::NsaSelectedAttentionInferParams;
using attnref::StridedView;
using support::dbl;
using support::z;
using i32 = std::int32_t;
using Shape = std::vector<Index>;

template <class T>
support::Kind kind_of() {
  if constexpr (std::is_same_v<T, half>)
    return support::Kind::F16;
  else if constexpr (std::is_same_v<T, bfloat16>)
    return support::Kind::BF16;
  else
    return support::Kind::F32;
}
template <class T>
double rnd(double x) {
  return dbl(T(static_cast<float>(x)));
}
template <class T>
std::vector<float> fl(const std::vector<T>& x) {
  std::vector<float> r;
  for (const T& e : x) r.push_back(static_cast<float>(e));
  return r;
}

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
    attnref::nsa_selected_attention_infer(params(), inputs(), outputs(), threads);
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
  EXPECT_TRUE(support::bitwise_equal(fl(a.out), fl(b.out)));
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
  EXPECT_TRUE(support::bitwise_equal(fl(b.out), fl(h.out))) << "BSND vs BSH";
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

// ---------------------------------------------------------------------------------------------
// Bad input
// ---------------------------------------------------------------------------------------------

using P = NsaSelectedAttentionInferParams;
using In = NsaSelectedAttentionInferInputs<half>;
using Out = NsaSelectedAttentionInferOutputs<half>;
using Edit = std::function<void(Built<half>&, P&, In&, Out&)>;

// TND, T = 3 (q_len 2, 1), N 4, KV_N 2, D 32, l' 32, k 2, pbs 32, sel {40, 70}: n_sel 2, 3.
Case base_case() {
  Case c;
  c.N = 4, c.KVN = 2, c.Dqk = 32, c.Dv = 32, c.ls = 32, c.k = 2, c.pbs = 32;
  c.sel = {40, 70}, c.qlen = {2, 1}, c.empty_list = 0.0;
  return c;
}

void reject(const Case& c, const Edit& edit, const std::string& what, bool oor = false) {
  SCOPED_TRACE(what);
  Built<half> bl(c);
  P p = bl.params();
  In in = bl.inputs();
  Out o = bl.outputs();
  edit(bl, p, in, o);
  const auto out0 = bl.out;
  support::expect_throw([&] { attnref::nsa_selected_attention_infer(p, in, o); }, what, oor);
  EXPECT_EQ(0, std::memcmp(out0.data(), bl.out.data(), out0.size() * sizeof(half)))
      << "output written";
}
const Edit none = [](Built<half>&, P&, In&, Out&) {};

TEST(NsaSelectedAttention, IndexDataRejections) {
  const Case c = base_case();
  // Top-k entries: n_sel (2 for batch 0, 3 for batch 1), below -1, any position, any row.
  reject(
      c, [](Built<half>& b, P&, In&, Out&) { b.tk[0] = 2; }, "topk_indices[0][0][0]", true);
  reject(
      c, [](Built<half>& b, P&, In&, Out&) { b.tk[3] = -2; }, "topk_indices[0][1][1]", true);
  reject(
      c, [](Built<half>& b, P&, In&, Out&) { b.tk[z(2 * 4 + 3)] = 3; }, "topk_indices[2][1][1]",
      true);
  reject(
      c, [](Built<half>& b, P&, In&, Out&) { b.tk[z(1 * 4 + 0)] = 1 << 30; },
      "topk_indices[1][0][0]", true);
  {  // sel 0: no select block at all.
    Case x = c;
    x.sel = {0, 70};
    reject(
        x, [](Built<half>& b, P&, In&, Out&) { b.tk[1] = 0; }, "topk_indices[0][0][1]", true);
  }
  // A block twice in one (row, kv head) list.
  reject(
      c, [](Built<half>& b, P&, In&, Out&) { b.tk[z(2 * 4 + 2)] = 1, b.tk[z(2 * 4 + 3)] = 1; },
      "topk_indices[2][1] repeats a block");
  reject(
      c, [](Built<half>& b, P&, In&, Out&) { b.tk[0] = 0, b.tk[1] = 0; },
      "topk_indices[0][0] repeats");
  // -1 twice is fine; the same block in two kv heads' lists is fine.
  {
    Built<half> b(c);
    b.tk[0] = -1, b.tk[1] = -1, b.tk[2] = 1, b.tk[3] = -1, b.tk[4] = 1, b.tk[5] = 0;
    b.tk[6] = 0, b.tk[7] = 1;
    EXPECT_NO_THROW(b.run());
  }
  // Block table entries covering [0, sel): out of range, -1 inside the length.
  reject(
      c, [](Built<half>& b, P&, In&, Out&) { b.bt[z(b.max_blocks + 2)] = b.nb; },
      "block_table[1][2]", true);
  reject(
      c, [](Built<half>& b, P&, In&, Out&) { b.bt[1] = -1; }, "block_table[0][1]", true);
  // Entries past the length are never read: anything goes.
  {
    Built<half> b(c);
    b.bt[z(2)] = 12345;  // batch 0 uses 2 pages of 32
    EXPECT_NO_THROW(b.run());
  }
}

TEST(NsaSelectedAttention, ShapeAndLengthRejections) {
  const Case c = base_case();
  auto shape = [](auto member, Shape s) {
    return [=](Built<half>&, P&, In& in, Out& o) {
      auto& v = member(in, o);
      v = support::reshaped(v, s);
    };
  };
  auto Q = [](In & in, Out&) -> auto& { return in.query; };
  auto K = [](In & in, Out&) -> auto& { return in.key; };
  auto V = [](In & in, Out&) -> auto& { return in.value; };
  auto TK = [](In & in, Out&) -> auto& { return in.topk_indices; };
  auto O = [](In&, Out & o) -> auto& { return o.output; };
  const Index nb = Built<half>(c).nb;
  reject(c, shape(Q, {3, 4, 32, 1}), "query.shape");
  reject(c, shape(Q, {3, 2, 32}), "query.shape");  // heads != num_heads
  reject(c, shape(Q, {4, 4, 32}), "query.shape[0]");
  reject(c, shape(K, {nb, 16, 64}), "key.shape");  // page size != pbs
  reject(c, shape(K, {nb, 32, 48}), "key.shape");
  reject(c, shape(K, {nb, 32, 2, 16}), "key.shape");
  reject(c, shape(K, {nb, 32}), "key.shape");
  reject(c, shape(V, {nb - 1, 32, 64}), "value.shape");
  reject(c, shape(V, {nb, 32, 63}), "value.shape");
  reject(c, shape(V, {nb, 32, 4, 16}), "value.shape");
  // The doc-style [T, N, k] is not [T, KV_N, k]; k must match select_block_count.
  reject(c, shape(TK, {3, 4, 2}), "topk_indices.shape");
  reject(c, shape(TK, {3, 2, 3}), "topk_indices.shape");
  reject(c, shape(O, {3, 4, 16}), "output.shape");
  reject(c, shape(O, {3, 2, 64}), "output.shape");
  reject(
      c, [](Built<half>&, P&, In& in, Out&) { in.topk_indices = {}; }, "topk_indices.shape");
  reject(
      c, [](Built<half>&, P&, In& in, Out&) { in.block_table = {}; }, "block_table.shape");
  reject(
      c, [](Built<half>&, P&, In&, Out& o) { o.output = {}; }, "output.shape");
  // Output overlapping an input.
  reject(
      c,
      [](Built<half>& b, P&, In&, Out& o) {
        o.output = StridedView<half>(b.k.data() + 64, {3, 4, 32});
      },
      "output overlaps an input");
  // Lengths.
  reject(
      c, [](Built<half>&, P&, In& in, Out&) { in.actual_sel_kv_seq_len = {40}; },
      "actual_sel_kv_seq_len");
  reject(
      c, [](Built<half>&, P&, In& in, Out&) { in.actual_sel_kv_seq_len.clear(); },
      "actual_sel_kv_seq_len");
  reject(
      c, [](Built<half>&, P&, In& in, Out&) { in.actual_sel_kv_seq_len[1] = -1; },
      "actual_sel_kv_seq_len[1]");
  reject(
      c,
      [](Built<half>& b, P&, In& in, Out&) { in.actual_sel_kv_seq_len[0] = b.max_blocks * 32 + 1; },
      "actual_sel_kv_seq_len[0]");
  reject(
      c, [](Built<half>&, P&, In& in, Out&) { in.actual_q_seq_len = {2}; }, "actual_q_seq_len");
  reject(
      c,
      [](Built<half>&, P&, In& in, Out&) {
        in.actual_q_seq_len = {0, 3};
      },
      "actual_q_seq_len[0]");
  reject(
      c,
      [](Built<half>&, P&, In& in, Out&) {
        in.actual_q_seq_len = {2, 5};
      },
      "actual_q_seq_len[1]");
  reject(
      c,
      [](Built<half>&, P&, In& in, Out&) {
        in.actual_q_seq_len = {1, 1};
      },
      "query.shape[0]");
  {  // q_len above sel (sel 1, q_len 2).
    Case x = c;
    x.sel = {1, 70}, x.qlen = {1, 2};
    reject(
        x, [](Built<half>&, P&, In& in, Out&) { in.actual_sel_kv_seq_len[1] = 1; },
        "actual_q_seq_len[1] above actual_sel_kv_seq_len");
  }
  // BSND / BSH: q_S in [1, 4], q_len <= S, batch.
  Case b = c;
  b.layout = "BSND", b.S = 2;
  reject(b, shape(Q, {2, 5, 4, 32}), "query.shape[1]");
  reject(b, shape(Q, {3, 2, 4, 32}), "query.shape[0]");
  reject(
      b,
      [](Built<half>&, P&, In& in, Out&) {
        in.actual_q_seq_len = {3, 1};
      },
      "actual_q_seq_len[0]");
  reject(b, shape(TK, {2, 2, 4, 2}), "topk_indices.shape");
  reject(b, shape(O, {2, 2, 128}), "output.shape");  // BSH-shaped output with BSND
  Case h = c;
  h.layout = "BSH", h.S = 2;
  reject(h, shape(Q, {2, 2, 130}), "query.shape[2]");  // not a multiple of N
  reject(h, shape(Q, {2, 2, 4, 32}), "query.shape");
  reject(h, shape(O, {2, 2, 4, 32}), "output.shape");
  reject(h, shape(K, {nb, 32, 96}), "key.shape");  // 96 / KV_N = 48 != Dqk 32
}

TEST(NsaSelectedAttention, ParameterRejections) {
  for (bool strict : {false, true}) {
    Case c = base_case();
    if (strict) {  // a strict-valid base: Dqk 192, Dv 128, pbs 64, l' 32, k 2 (64 <= 70)
      c.Dqk = 192, c.Dv = 128, c.pbs = 64;
    }
    c.strict = strict;
    SCOPED_TRACE(strict ? "strict" : "relaxed");
    if (strict) {
      Built<half> ok(c);
      ASSERT_NO_THROW(ok.run());
    }
    reject(
        c, [](Built<half>&, P& p, In&, Out&) { p.select_block_size = 0; }, "select_block_size");
    reject(
        c, [](Built<half>&, P& p, In&, Out&) { p.select_block_count = 0; }, "select_block_count");
    reject(
        c, [](Built<half>&, P& p, In&, Out&) { p.layout = "BNSD"; }, "params.layout");
    reject(
        c, [](Built<half>&, P& p, In&, Out&) { p.sparse_mode = 1; }, "params.sparse_mode");
    reject(
        c, [](Built<half>&, P& p, In&, Out&) { p.scale_value = INFINITY; }, "params.scale_value");
    reject(
        c, [](Built<half>&, P& p, In&, Out&) { p.num_key_value_heads = 3; }, "params.num_heads");
    reject(
        c, [](Built<half>&, P& p, In&, Out&) { p.num_heads = 0; }, "params.num_heads");
    reject(
        c, [](Built<half>&, P& p, In&, Out&) { p.num_heads = 8; }, "query.shape");
    reject(
        c, [](Built<half>&, P& p, In&, Out&) { p.page_block_size = 0; }, "params.page_block_size");
  }
}

// A vendor-only rule: strict rejects naming `what`; relaxed runs and matches the reference.
void vendor_rule(Case c, const std::string& what) {
  c.strict = true;
  reject(c, none, what);
  c.strict = false;
  SCOPED_TRACE("relaxed: " + what);
  check_against_reference<half>(c);
}

TEST(NsaSelectedAttention, VendorRulesStrictRejectsRelaxedAccepts) {
  // A strict-valid base: Dqk 192, Dv 128, pbs 64, l' 32, k 2, G 2, sel 70 (2·32 <= 70).
  Case c = base_case();
  c.Dqk = 192, c.Dv = 128, c.pbs = 64, c.qlen = {2, 3}, c.strict = true;
  {
    Built<half> ok(c);
    ASSERT_NO_THROW(ok.run());
  }
  {
    Case x = c;
    x.Dqk = 128;
    vendor_rule(x, "query / value head sizes");
  }
  {
    Case x = c;
    x.Dv = 64;
    vendor_rule(x, "query / value head sizes");
  }
  {
    Case x = c;  // pbs 32
    x.pbs = 32;
    vendor_rule(x, "params.page_block_size");
  }
  {
    Case x = c;  // pbs 48
    x.pbs = 48;
    vendor_rule(x, "params.page_block_size");
  }
  {
    Case x = c;  // G = 32
    x.N = 32, x.KVN = 1, x.Dqk = 192, x.Dv = 128;
    vendor_rule(x, "params.num_heads / num_key_value_heads");
  }
  {
    Case x = c;  // l' 24: not a multiple of 16
    x.ls = 24;
    vendor_rule(x, "params.select_block_size");
  }
  {
    Case x = c;  // l' 144 > 128
    x.ls = 144, x.k = 1, x.sel = {150, 300};
    vendor_rule(x, "params.select_block_size");
  }
  {  // k·l' = 3·32 = 96 > max sel 70: only the docs state that bound (their own example
     // breaks it) and the host checks do not: accepted
    Case x = c;
    x.k = 3;
    Built<half> ok(x);
    EXPECT_NO_THROW(ok.run());
  }
  {
    Case x = c;  // TND (and BSH) take 3-d caches
    x.cache4d = true;
    vendor_rule(x, "key / value rank");
  }
  {
    Case x = c;  // BSND takes 4-d caches
    x.layout = "BSND";
    vendor_rule(x, "key / value rank");
    x.cache4d = true, x.strict = true;
    Built<half> ok(x);
    EXPECT_NO_THROW(ok.run());
  }
  {
    Case x = c;  // KV_N 257
    x.N = 257, x.KVN = 257, x.Dqk = 16, x.Dv = 16, x.sel = {70}, x.qlen = {1}, x.spare_blocks = 0;
    vendor_rule(x, "params.num_key_value_heads");
  }
}

TEST(NsaSelectedAttention, BatchAbove3072) {
  Case c;
  c.strict = true, c.N = 1, c.KVN = 1, c.Dqk = 192, c.Dv = 128, c.ls = 64, c.k = 1, c.pbs = 64;
  c.sel.assign(3073, 0);
  c.sel[0] = 64;
  c.qlen.assign(3073, 1);
  c.spare_blocks = 0, c.empty_list = 1.0;
  reject(c, none, "block_table.shape[0]");
  c.strict = false;
  Built<half> bl(c);
  ASSERT_NO_THROW(bl.run());
  EXPECT_TRUE(std::all_of(bl.out.begin(), bl.out.end(), [](half h) { return dbl(h) == 0.0; }));
  c.sel.assign(3072, 0), c.sel[0] = 64, c.qlen.assign(3072, 1), c.strict = true;
  Built<half> ok(c);
  EXPECT_NO_THROW(ok.run());
}

}  // namespace select_attention_test
