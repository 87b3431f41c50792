// NSA decode step (nsa/decode_step.hpp): the window branch (nsa_sliding_window_attention), the
// gated sum (nsa_gated_sum) and the whole step (nsa_decode_step) against the independent
// references tests/reference/nsa_select.hpp (selected / window / gated sum) and
// tests/reference/nsa.hpp (compressed branch, top-k). Window: w = 1, 5 and >= sel over TND and
// BSND (padded rows 0), multi-token, NaN in every raw row below the windows; w >= sel == the
// selected branch over every block. Gated sum: hand-worked exact values, one-hot gates pick a
// branch bit for bit, random values within one rounding. Decode step: every intermediate against
// the operator called directly (bit for bit) and against the references, the compressed cache
// random or made by nsa_compress from the raw one, batches shorter than one compress block,
// the vendor shape in strict mode; optional outputs absent == present, threads, TND == BSND,
// padded rows 0 whatever their gates. Every rejection names its argument and writes nothing
// (decode_step_rejects_test.cpp; the harness: decode_step_support.hpp).

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/nsa/compress_attention.hpp>
#include <attnref/nsa/decode_step.hpp>
#include <attnref/nsa/select_attention.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "nsa/decode_step_support.hpp"
#include "nsa/nsa_support.hpp"
#include "reference/nsa.hpp"
#include "reference/nsa_select.hpp"
#include "support/cast.hpp"
#include "support/compare.hpp"
#include "support/views.hpp"

namespace decode_step_test {

using namespace decode_step_support;
using nsa_support::dt_of;
using nsa_support::topk_ok;
using support::as_floats;
using support::kind_of;

// ---------------------------------------------------------------------------------------------
// Window branch
// ---------------------------------------------------------------------------------------------

template <class T>
void check_window(const DCase& c) {
  Step<T> st(c);
  ASSERT_NO_THROW(st.run_window());
  EXPECT_TRUE(
      support::all_close(st.ref_window(), st.live(st.win_out), support::tolerance(kind_of<T>())));
  EXPECT_TRUE(st.padded_zero(st.win_out));
}

std::vector<DCase> window_grid() {
  std::vector<DCase> v;
  for (long w : {1L, 5L, 1000L}) {
    DCase c;  // TND, G 2, multi-token, lengths from q_len up
    c.N = 4, c.KVN = 2, c.Dqk = 32, c.Dv = 16, c.w = w, c.pbs = 16, c.poison_window = true;
    c.sel = {1, 4, 5, 17, 100}, c.qlen = {1, 4, 2, 3, 4};
    v.push_back(c);
    c.layout = "BSND", c.S = 4, c.N = 8, c.KVN = 1, c.Dqk = 24, c.Dv = 40, c.pbs = 32;
    c.sel = {3, 9, 64, 33}, c.qlen = {2, 4, 1, 3};  // padded rows
    v.push_back(c);
  }
  return v;
}

TEST(NsaSlidingWindow, MatchesReference) {
  int i = 0;
  for (DCase c : window_grid()) {
    SCOPED_TRACE("case " + std::to_string(i++) + " w " + std::to_string(c.w));
    check_window<half>(c);
    c.seed += 10;
    check_window<bfloat16>(c);
    c.seed += 10;
    check_window<float>(c);
  }
}

// w = 1: each token sees only its own position: the output is that value, bit for bit.
TEST(NsaSlidingWindow, WindowOfOneIsTheOwnValue) {
  DCase c;
  c.layout = "BSND", c.S = 3, c.N = 4, c.KVN = 2, c.Dqk = 16, c.Dv = 16, c.w = 1, c.pbs = 16;
  c.sel = {3, 40, 17}, c.qlen = {3, 2, 1}, c.poison_window = true;
  Step<bfloat16> st(c);
  st.run_window();
  for (int b = 0; b < st.B; ++b)
    for (int i = 0; i < c.qlen[z(b)]; ++i) {
      const long t = c.sel[z(b)] - c.qlen[z(b)] + i;
      const long r = st.bt[z(b * st.mb + t / 16)] * 16 + t % 16;
      for (int h = 0; h < 4; ++h)
        for (int e = 0; e < 16; ++e)
          EXPECT_EQ(dbl(st.win_out[z((st.row(b, i) * 4 + h) * 16 + e)]),
                    dbl(st.v[z((r * 2 + h / 2) * 16 + e)]))
              << "b " << b << " i " << i << " h " << h;
    }
}

// w >= sel is plain causal attention: the selected branch with every block selected.
TEST(NsaSlidingWindow, FullWindowEqualsSelectedOverEveryBlock) {
  DCase c;
  c.N = 8, c.KVN = 2, c.Dqk = 32, c.Dv = 32, c.w = 500, c.pbs = 64, c.ls = 32;
  c.sel = {4, 31, 64, 130, 257}, c.qlen = {4, 1, 3, 2, 4};
  Step<half> st(c);
  st.run_window();
  const long ns = (257 + 31) / 32;  // 9: k = the longest batch's select blocks
  std::vector<i32> tk;              // every block of the batch, descending, then -1
  for (int b = 0; b < st.B; ++b) {
    const long nb_sel = (c.sel[z(b)] + 31) / 32;
    for (int i = 0; i < c.qlen[z(b)]; ++i)
      for (int g = 0; g < c.KVN; ++g)
        for (long j = 0; j < ns; ++j)
          tk.push_back(j < nb_sel ? static_cast<i32>(nb_sel - 1 - j) : -1);
  }
  attnref::NsaSelectedAttentionInferParams sp;
  sp.num_heads = 8, sp.num_key_value_heads = 2, sp.select_block_size = 32;
  sp.select_block_count = ns, sp.page_block_size = 64, sp.scale_value = c.scale;
  sp.layout = "TND", sp.strict = false;
  attnref::NsaSelectedAttentionInferInputs<half> si;
  const auto in = st.inputs();
  si.query = in.query, si.key = in.key, si.value = in.value, si.block_table = in.block_table;
  si.topk_indices = StridedView<const i32>(tk.data(), {st.total, 2, ns});
  si.actual_q_seq_len = in.actual_q_seq_len, si.actual_sel_kv_seq_len = in.actual_sel_kv_seq_len;
  std::vector<half> o(st.out.size(), half(-1.0f));
  attnref::nsa_selected_attention_infer<half>(sp, si, {StridedView<half>(o.data(), st.lay(8, 32))});
  EXPECT_TRUE(
      support::all_close(st.live(o), st.live(st.win_out), support::tolerance(support::Kind::F16)));
}

TEST(NsaSlidingWindow, ThreadsOneEqualsTwoBitForBit) {
  DCase c = window_grid()[1];
  Step<half> a(c), b(c);
  a.run_window(1), b.run_window(2);
  EXPECT_TRUE(support::bitwise_equal(as_floats(a.win_out), as_floats(b.win_out)));
}

// ---------------------------------------------------------------------------------------------
// Gated sum
// ---------------------------------------------------------------------------------------------

// Values and gates with few significant bits: every fp32 step is exact, so is the result.
TEST(NsaGatedSum, HandWorkedExact) {
  // rows 2, N 2, Dv 2. Gates per (row, head): (0.5, 0.25, 0.125), (1, 0, 2), (0, 0, 0),
  // (0.75, -0.5, 0.25).
  const std::vector<float> g = {0.5f, 0.25f, 0.125f, 1, 0, 2, 0, 0, 0, 0.75f, -0.5f, 0.25f};
  const std::vector<half> a = {half(8.0f), half(-4.0f), half(1.0f), half(3.0f),
                               half(5.0f), half(6.0f),  half(4.0f), half(-8.0f)};
  const std::vector<half> b = {half(16.0f), half(2.0f), half(7.0f), half(7.0f),
                               half(9.0f),  half(9.0f), half(2.0f), half(6.0f)};
  const std::vector<half> c = {half(64.0f), half(-8.0f), half(0.5f), half(-1.0f),
                               half(1.0f),  half(2.0f),  half(8.0f), half(4.0f)};
  // 0.5·8 + 0.25·16 + 0.125·64 = 16; 0.5·-4 + 0.25·2 + 0.125·-8 = -2.5;
  // 1 + 0 + 1 = 2; 3 + 0 - 2 = 1; 0; 0; 3 - 1 + 2 = 4; -6 - 3 + 1 = -8.
  const std::vector<float> want = {16, -2.5f, 2, 1, 0, 0, 4, -8};
  std::vector<half> o(8, half(-1.0f));
  gated(g, a, b, c, o, {2, 2, 2}, {2, 2, 3});
  EXPECT_EQ(as_floats(o), want);
  // The same in BSND [B 1, S 2, N 2, Dv 2] with gates [rows 2, N 2, 3], and in bf16.
  std::fill(o.begin(), o.end(), half(-1.0f));
  gated(g, a, b, c, o, {1, 2, 2, 2}, {2, 2, 3});
  EXPECT_EQ(as_floats(o), want);
  std::vector<bfloat16> ab, bb, cb, ob(8, bfloat16(-1.0f));
  for (int i = 0; i < 8; ++i)
    ab.push_back(bfloat16(static_cast<float>(a[z(i)]))),
        bb.push_back(bfloat16(static_cast<float>(b[z(i)]))),
        cb.push_back(bfloat16(static_cast<float>(c[z(i)])));
  gated(g, ab, bb, cb, ob, {2, 2, 2}, {2, 2, 3});
  EXPECT_EQ(as_floats(ob), want);
}

TEST(NsaGatedSum, OneHotGatesPickABranchExactly) {
  const int rows = 5, N = 3, Dv = 7;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<half> a, b, c, o(z(rows * N * Dv), half(-1.0f));
  for (int e = 0; e < rows * N * Dv; ++e)
    a.push_back(half(nd(rng))), b.push_back(half(nd(rng))), c.push_back(half(nd(rng)));
  std::vector<float> g(z(rows * N * 3), 0.0f);
  for (int r = 0; r < rows * N; ++r) g[z(r * 3 + r % 3)] = 1.0f;
  gated(g, a, b, c, o, {rows, N, Dv}, {rows, N, 3});
  for (int e = 0; e < rows * N * Dv; ++e) {
    const int pick = e / Dv % 3;
    const half want = pick == 0 ? a[z(e)] : pick == 1 ? b[z(e)] : c[z(e)];
    ASSERT_EQ(0, std::memcmp(&o[z(e)], &want, sizeof(half))) << e;
  }
}

// Random: fp32 sum of three products (a few fp32 ulps) then one rounding to T.
template <class T>
void gated_random(unsigned seed) {
  const int B = 2, S = 3, N = 4, Dv = 9;
  const int n = B * S * N * Dv;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> u;
  std::vector<T> a, b, c, o(z(n), T(-1.0f));
  for (int e = 0; e < n; ++e)
    a.push_back(T(nd(rng))), b.push_back(T(nd(rng))), c.push_back(T(nd(rng)));
  std::vector<float> g(z(B * S * N * 3));
  for (float& x : g) x = u(rng);
  gated(g, a, b, c, o, {B, S, N, Dv}, {B * S, N, 3});
  std::vector<double> want, gg(g.begin(), g.end()), ad, bd, cd;
  for (int e = 0; e < n; ++e)
    ad.push_back(dbl(a[z(e)])), bd.push_back(dbl(b[z(e)])), cd.push_back(dbl(c[z(e)]));
  want = ref::nsa_select::gated_sum(gg, ad, bd, cd, Dv);
  std::vector<double> got;
  for (const T& x : o) got.push_back(dbl(x));
  EXPECT_TRUE(support::all_close(want, got, support::tolerance(kind_of<T>())));
}

TEST(NsaGatedSum, MatchesDoubleWithinOneRounding) {
  gated_random<half>(1);
  gated_random<bfloat16>(2);
  gated_random<float>(3);
}

// ---------------------------------------------------------------------------------------------
// Decode step
// ---------------------------------------------------------------------------------------------

// out vs the gated sum of the reference branches: each branch output carries one rounding to T
// (plus fp32 noise), weighted by its gate, and the sum is rounded once more, so the bound is the
// branch tolerances weighted by |gate| plus one more output tolerance.
::testing::AssertionResult gated_close(const std::vector<double>& gates,
                                       const std::vector<double> (&br)[3],
                                       const std::vector<double>& got, long Dv,
                                       support::Tolerance t) {
  std::size_t bad = 0, worst = 0;
  double worst_excess = -1;
  std::vector<double> want(got.size());
  for (std::size_t e = 0; e < got.size(); ++e) {
    const double* g = gates.data() + e / static_cast<std::size_t>(Dv) * 3;
    double allowed = 0.0, w = 0.0;
    for (int j = 0; j < 3; ++j) {
      w += g[j] * br[j][e];
      allowed += std::fabs(g[j]) * (t.atol + t.rtol * std::fabs(br[j][e]));
    }
    allowed += t.atol + t.rtol * std::fabs(w);
    want[e] = w;
    const double excess = std::fabs(got[e] - w) - allowed;
    if (!(excess <= 0)) ++bad;
    if (!(excess <= worst_excess)) worst_excess = excess, worst = e;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " outside; worst [" << worst << "] expected "
         << want[worst] << ", got " << got[worst];
}

template <class T>
std::vector<i32> topk_direct(Step<T>& st, std::vector<T>& o) {
  const auto& c = st.c;
  attnref::NsaCompressAttentionInferParams cp;
  cp.num_heads = c.N, cp.num_key_value_heads = c.KVN;
  cp.select_block_size = c.ls, cp.select_block_count = c.k;
  cp.compress_block_size = c.l, cp.compress_block_stride = c.d;
  cp.scale_value = c.scale, cp.layout = c.layout, cp.page_block_size = c.cpbs;
  cp.strict = c.strict;
  const auto in = st.inputs();
  attnref::NsaCompressAttentionInferInputs<T> ci;
  const std::uint8_t flag = 1;
  ci.query = in.query, ci.key = in.cmp_key, ci.value = in.cmp_value;
  ci.atten_mask = StridedView<const std::uint8_t>(&flag, {1});
  ci.block_table = in.cmp_block_table, ci.actual_q_seq_len = in.actual_q_seq_len;
  ci.actual_sel_kv_seq_len = in.actual_sel_kv_seq_len;
  for (long x : st.cmp) ci.actual_cmp_kv_seq_len.push_back(x);
  std::vector<i32> tk(st.topk.size(), -9);
  o.assign(st.out.size(), T(-3.0f));
  attnref::NsaCompressAttentionInferOutputs<T> co{StridedView<T>(o.data(), st.lay(c.N, c.Dv)),
                                                  StridedView<i32>(tk.data(), st.lay(c.KVN, c.k))};
  attnref::nsa_compress_attention_infer(cp, ci, co);
  return tk;
}

template <class T>
void check_step(const DCase& c) {
  Step<T> st(c);
  ASSERT_NO_THROW(st.run());
  const auto tol = support::tolerance(kind_of<T>());
  // 1. Each intermediate is the operator called directly on the same inputs, bit for bit.
  std::vector<T> o_direct;
  EXPECT_EQ(topk_direct(st, o_direct), st.topk) << "topk vs nsa_compress_attention_infer";
  EXPECT_TRUE(support::bitwise_equal(as_floats(o_direct), as_floats(st.cmp_out))) << "cmp_out";
  {
    attnref::NsaSelectedAttentionInferParams sp;
    sp.num_heads = c.N, sp.num_key_value_heads = c.KVN, sp.select_block_size = c.ls;
    sp.select_block_count = c.k, sp.page_block_size = c.pbs, sp.scale_value = c.scale;
    sp.layout = c.layout, sp.strict = c.strict;
    const auto in = st.inputs();
    attnref::NsaSelectedAttentionInferInputs<T> si;
    si.query = in.query, si.key = in.key, si.value = in.value, si.block_table = in.block_table;
    if (c.layout == "BSND") {  // the selected operator takes 4-d caches with BSND (strict)
      si.key = support::reshaped(si.key, {in.key.size(0), in.key.size(1), c.KVN, c.Dqk});
      si.value = support::reshaped(si.value, {in.value.size(0), in.value.size(1), c.KVN, c.Dv});
    }
    si.topk_indices = StridedView<const i32>(st.topk.data(), st.lay(c.KVN, c.k));
    si.actual_q_seq_len = in.actual_q_seq_len;
    si.actual_sel_kv_seq_len = in.actual_sel_kv_seq_len;
    std::vector<T> o(st.out.size(), T(-3.0f));
    attnref::nsa_selected_attention_infer<T>(sp, si, {StridedView<T>(o.data(), st.lay(c.N, c.Dv))});
    EXPECT_TRUE(support::bitwise_equal(as_floats(o), as_floats(st.sel_out))) << "sel_out";
    std::vector<T> w(st.out.size(), T(-3.0f));
    attnref::nsa_sliding_window_attention<T>(st.params(), in,
                                             {StridedView<T>(w.data(), st.lay(c.N, c.Dv))});
    EXPECT_TRUE(support::bitwise_equal(as_floats(w), as_floats(st.win_out))) << "win_out";
    std::vector<T> g(st.out.size(), T(-3.0f));
    gated(st.gates, st.cmp_out, st.sel_out, st.win_out, g, st.lay(c.N, c.Dv), {st.rows, c.N, 3});
    EXPECT_TRUE(support::bitwise_equal(as_floats(g), as_floats(st.out))) << "output";
  }
  // 2. Against the references.
  ref::nsa::Problem cpr;
  cpr.N = c.N, cpr.KVN = c.KVN, cpr.Dqk = c.Dqk, cpr.Dv = c.Dv, cpr.scale = c.scale;
  cpr.g = {c.l, c.d, c.ls}, cpr.k = c.k, cpr.mask = true, cpr.dt = dt_of<T>();
  std::vector<double> rc, rs, rw, gl;
  for (int b = 0; b < st.B; ++b) {
    ref::nsa::Batch x;
    x.q_len = c.qlen[z(b)], x.cmp = st.cmp[z(b)], x.sel = c.sel[z(b)];
    x.q = st.rq[z(b)], x.k = st.ck[z(b)], x.v = st.cv[z(b)];
    const auto r = ref::nsa::run(cpr, x);
    rc.insert(rc.end(), r.out.begin(), r.out.end());
    for (int i = 0; i < x.q_len; ++i)
      for (int kh = 0; kh < c.KVN; ++kh) {
        const auto at = r.group_scores.begin() + (i * c.KVN + kh) * r.n_sel;
        EXPECT_TRUE(topk_ok(std::vector<double>(at, at + r.n_sel),
                            st.topk.data() + (st.row(b, i) * c.KVN + kh) * c.k, c.k))
            << "batch " << b << " token " << i << " kv head " << kh;
      }
    // The selected reference takes the step's own top-k (an input of that branch).
    const auto so = ref::nsa_select::selected(st.sel_problem(), st.sel_batch(b, st.topk));
    rs.insert(rs.end(), so.begin(), so.end());
    const auto wo = ref::nsa_select::window(st.sel_problem(), st.sel_batch(b, st.topk), c.w);
    rw.insert(rw.end(), wo.begin(), wo.end());
    for (int i = 0; i < x.q_len; ++i)
      for (int e = 0; e < c.N * 3; ++e) gl.push_back(st.gates[z(st.row(b, i) * c.N * 3 + e)]);
  }
  EXPECT_TRUE(support::all_close(rc, st.live(st.cmp_out), tol)) << "cmp_out vs reference";
  EXPECT_TRUE(support::all_close(rs, st.live(st.sel_out), tol)) << "sel_out vs reference";
  EXPECT_TRUE(support::all_close(rw, st.live(st.win_out), tol)) << "win_out vs reference";
  const std::vector<double> br[3] = {rc, rs, rw};
  EXPECT_TRUE(gated_close(gl, br, st.live(st.out), c.Dv, tol)) << "output vs reference";
  // 3. Padded BSND rows: 0 everywhere, top-k -1.
  for (const auto* x : {&st.out, &st.cmp_out, &st.sel_out, &st.win_out})
    EXPECT_TRUE(st.padded_zero(*x));
  if (c.layout != "BSND") return;
  for (int b = 0; b < st.B; ++b)
    for (int i = c.qlen[z(b)]; i < st.S; ++i)
      for (long e = 0; e < c.KVN * c.k; ++e) {
        EXPECT_EQ(st.topk[z(st.row(b, i) * c.KVN * c.k + e)], -1);
      }
}

std::vector<DCase> step_grid() {
  std::vector<DCase> v;
  {  // TND, G 2, l 32 / d 16 / l' 64, k 2, w 8: sel below l (no compressed token) up to 300.
    DCase c;
    c.N = 4, c.KVN = 2, c.Dqk = 32, c.Dv = 32, c.k = 2, c.w = 8, c.pbs = 64, c.cpbs = 16;
    c.sel = {20, 32, 47, 100, 300}, c.qlen = {1, 2, 4, 3, 4};
    v.push_back(c);
  }
  {  // BSND padded, G 4, l = d = 16, l' 32, k 3, w 5, pbs 32 / cpbs 32.
    DCase c;
    c.layout = "BSND", c.S = 4;
    c.N = 8, c.KVN = 2, c.Dqk = 48, c.Dv = 32, c.l = 16, c.d = 16, c.ls = 32, c.k = 3, c.w = 5;
    c.pbs = 32, c.cpbs = 32, c.scale = 0.15;
    c.sel = {16, 33, 70, 129}, c.qlen = {4, 1, 3, 2};
    v.push_back(c);
  }
  {  // TND, G 1, l 48 / d 16 / l' 96, k 4, w 40, pbs 48 (relaxed), cpbs 16, single tokens.
    DCase c;
    c.N = 2, c.KVN = 2, c.Dqk = 24, c.Dv = 40, c.l = 48, c.d = 16, c.ls = 96, c.k = 4, c.w = 40;
    c.pbs = 48, c.cpbs = 16;
    c.sel = {48, 95, 200, 401}, c.qlen = {1, 1, 1, 1};
    v.push_back(c);
  }
  return v;
}

TEST(NsaDecodeStep, IntermediatesMatchFp16) {
  int i = 0;
  for (const DCase& c : step_grid()) {
    SCOPED_TRACE("case " + std::to_string(i++));
    check_step<half>(c);
  }
}

TEST(NsaDecodeStep, IntermediatesMatchBf16) {
  int i = 0;
  for (DCase c : step_grid()) {
    SCOPED_TRACE("case " + std::to_string(i++));
    c.seed += 50;
    check_step<bfloat16>(c);
  }
}

TEST(NsaDecodeStep, IntermediatesMatchFloat) {
  DCase c = step_grid()[1];
  c.seed += 70;
  check_step<float>(c);
}

TEST(NsaDecodeStep, CompressedCacheFromNsaCompress) {
  DCase c = step_grid()[0];
  c.from_compress = true;
  check_step<half>(c);
  c = step_grid()[1];
  c.from_compress = true, c.seed = 17;
  check_step<bfloat16>(c);
}

// The vendor operators' constraints (strict): Dqk 192, Dv 128, G 16, pbs 64, l 32 / d 16 /
// l' 64, k 2 (<= the select blocks of every batch with compressed tokens).
TEST(NsaDecodeStep, VendorShapeStrict) {
  DCase c;
  c.strict = true, c.layout = "BSND", c.S = 2;
  c.N = 16, c.KVN = 1, c.Dqk = 192, c.Dv = 128, c.k = 2, c.w = 64, c.pbs = 64, c.cpbs = 64;
  c.scale = 1.0 / std::sqrt(192.0);
  c.sel = {200, 129}, c.qlen = {2, 1};
  check_step<half>(c);
  c.layout = "TND", c.pbs = 128, c.N = 4, c.KVN = 2, c.qlen = {1, 2}, c.seed = 8;
  check_step<bfloat16>(c);
}

TEST(NsaDecodeStep, OptionalOutputsAbsentEqualsPresentBitForBit) {
  for (const DCase& c : step_grid()) {
    Step<half> a(c), b(c);
    a.run(0, true), b.run(0, false);
    EXPECT_TRUE(support::bitwise_equal(as_floats(a.out), as_floats(b.out)));
    // Absent views are not written.
    EXPECT_TRUE(std::all_of(b.topk.begin(), b.topk.end(), [](i32 t) { return t == 12345; }));
    EXPECT_TRUE(
        std::all_of(b.sel_out.begin(), b.sel_out.end(), [](half h) { return dbl(h) == -555.0; }));
  }
}

TEST(NsaDecodeStep, ThreadsOneEqualsTwoBitForBit) {
  DCase c = step_grid()[1];
  Step<bfloat16> a(c), b(c);
  a.run(1), b.run(2);
  EXPECT_TRUE(support::bitwise_equal(as_floats(a.out), as_floats(b.out)));
  EXPECT_EQ(a.topk, b.topk);
}

TEST(NsaDecodeStep, TndEqualsBsndBitForBit) {
  DCase c = step_grid()[0];
  Step<half> a(c);
  c.layout = "BSND", c.S = 4;
  Step<half> b(c);
  for (int bb = 0; bb < a.B; ++bb)  // the same gates per live row
    for (int i = 0; i < c.qlen[z(bb)]; ++i)
      std::copy_n(a.gates.begin() + a.row(bb, i) * c.N * 3, c.N * 3,
                  b.gates.begin() + b.row(bb, i) * c.N * 3);
  a.run(), b.run();
  for (int bb = 0; bb < a.B; ++bb)
    for (int i = 0; i < c.qlen[z(bb)]; ++i) {
      const int ra = a.row(bb, i), rb = b.row(bb, i);
      EXPECT_EQ(0, std::memcmp(&a.out[z(ra * c.N * c.Dv)], &b.out[z(rb * c.N * c.Dv)],
                               z(c.N * c.Dv) * sizeof(half)));
      EXPECT_EQ(0, std::memcmp(&a.topk[z(ra * c.KVN * c.k)], &b.topk[z(rb * c.KVN * c.k)],
                               z(c.KVN * c.k) * sizeof(i32)));
    }
}

TEST(NsaDecodeStep, PaddedRowsAreZeroWhateverTheirGates) {
  Tiny t;
  constexpr Index D = Tiny::D;
  DP p = t.p;
  p.layout = "BSND";
  DIn in = t.in;
  in.query = StridedView<const half>(t.q.data(), {1, 2, 1, D});
  in.gates = StridedView<const float>(t.gates.data(), {2, 1, 3});  // row 1 (padding): NaN gates
  in.actual_q_seq_len = {1};
  std::vector<half> out(2 * D, half(-7.0f));
  DOut o;
  o.output = StridedView<half>(out.data(), {1, 2, 1, D});
  attnref::nsa_decode_step(p, in, o);
  for (Index i = 0; i < D; ++i) {
    EXPECT_TRUE(std::isfinite(dbl(out[z(i)])));
    EXPECT_EQ(dbl(out[z(D + i)]), 0.0) << i;
  }
}

}  // namespace decode_step_test
