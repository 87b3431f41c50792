// Bad input of the NSA decode step (nsa/decode_step.hpp): the window branch
// (nsa_sliding_window_attention), the gated sum (nsa_gated_sum) and the whole step
// (nsa_decode_step) name the argument of every rejection and write nothing; the step checks its
// branches' rules before the compressed branch writes, rejects overlapping outputs before any
// write and a compressed table too short for the raw length (the harness:
// decode_step_support.hpp).

#include <gtest/gtest.h>

#include <attnref/nsa/decode_step.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "nsa/decode_step_support.hpp"
#include "support/cast.hpp"
#include "support/errors.hpp"
#include "support/views.hpp"

namespace decode_step_rejects_test {

using namespace decode_step_support;

using WP = NsaDecodeParams;
using WIn = NsaDecodeInputs<half>;
using WEdit = std::function<void(Step<half>&, WP&, WIn&, StridedView<half>&)>;

void reject_window(const DCase& c, const WEdit& edit, const std::string& what, bool oor = false) {
  SCOPED_TRACE(what);
  Step<half> st(c);
  WP p = st.params();
  WIn in = st.inputs();
  StridedView<half> o(st.win_out.data(), st.lay(c.N, c.Dv));
  edit(st, p, in, o);
  const auto w0 = st.win_out;
  const attnref::NsaSlidingWindowAttentionOutputs<half> out{o};
  support::expect_validate_agrees([&] { attnref::validate(p, in, out); },
                                  [&] { attnref::nsa_sliding_window_attention(p, in, out); });
  support::expect_throw([&] { attnref::nsa_sliding_window_attention(p, in, out); }, what, oor);
  EXPECT_EQ(0, std::memcmp(w0.data(), st.win_out.data(), w0.size() * sizeof(half)));
}

TEST(NsaSlidingWindow, Rejections) {
  DCase c;
  c.N = 4, c.KVN = 2, c.Dqk = 16, c.Dv = 16, c.w = 4, c.pbs = 16;
  c.sel = {10, 40}, c.qlen = {2, 1};
  reject_window(
      c, [](Step<half>&, WP& p, WIn&, StridedView<half>&) { p.window_size = 0; },
      "params.window_size");
  reject_window(
      c, [](Step<half>&, WP& p, WIn&, StridedView<half>&) { p.layout = "BSH"; }, "params.layout");
  reject_window(
      c, [](Step<half>&, WP& p, WIn&, StridedView<half>&) { p.num_key_value_heads = 3; },
      "params.num_heads");
  reject_window(
      c, [](Step<half>&, WP& p, WIn&, StridedView<half>&) { p.page_block_size = 32; }, "key.shape");
  reject_window(
      c,
      [](Step<half>&, WP&, WIn& in, StridedView<half>&) {
        in.key = support::reshaped(in.key, {in.key.size(0), 16, 2, 16});
      },
      "key.shape");
  reject_window(
      c,
      [](Step<half>&, WP&, WIn& in, StridedView<half>&) {
        in.value = support::resized(in.value, 0, in.value.size(0) - (1));
      },
      "value.shape");
  reject_window(
      c,
      [](Step<half>&, WP&, WIn& in, StridedView<half>&) {
        in.value = support::reshaped(in.value, {in.value.size(0), 16, 2, 16});
      },
      "value.shape");
  reject_window(
      c,
      [](Step<half>&, WP&, WIn&, StridedView<half>& o) {
        o = support::reshaped(o, {3, 4, 8});
      },
      "output.shape");
  reject_window(
      c, [](Step<half>&, WP&, WIn& in, StridedView<half>&) { in.actual_sel_kv_seq_len[0] = 1; },
      "actual_sel_kv_seq_len[0]");
  reject_window(
      c, [](Step<half>&, WP&, WIn& in, StridedView<half>&) { in.actual_sel_kv_seq_len.pop_back(); },
      "actual_sel_kv_seq_len");
  reject_window(
      c,
      [](Step<half>&, WP&, WIn& in, StridedView<half>&) {
        in.actual_q_seq_len = {2, 5};
      },
      "actual_q_seq_len[1]");
  reject_window(
      c,
      [](Step<half>&, WP&, WIn& in, StridedView<half>&) {
        in.query = support::reshaped(in.query, {4, 4, 16});
      },
      "query.shape[0]");
  reject_window(
      c, [](Step<half>& s, WP&, WIn&, StridedView<half>&) { s.bt[z(s.mb + 2)] = s.nb; },
      "block_table[1][2]", true);
}

TEST(NsaGatedSum, Rejections) {
  const int rows = 3, N = 2, Dv = 4;
  std::vector<half> a(z(rows * N * Dv), half(1.0f)), o(a.size(), half(-9.0f));
  std::vector<float> g(z(rows * N * 3), 0.5f);
  const Shape s{rows, N, Dv}, gs{rows, N, 3};
  auto call = [&](Shape os, Shape as, Shape gsh, bool null_gates = false, bool null_b = false) {
    return [&, os, as, gsh, null_gates, null_b] {
      attnref::nsa_gated_sum<half>(StridedView<const float>(null_gates ? nullptr : g.data(), gsh),
                                   StridedView<const half>(a.data(), s),
                                   StridedView<const half>(null_b ? nullptr : a.data(), as),
                                   StridedView<const half>(a.data(), s),
                                   StridedView<half>(o.data(), os));
    };
  };
  auto check = [&](const std::function<void()>& f, const std::string& what) {
    SCOPED_TRACE(what);
    support::expect_throw(f, what, false);
    for (const half& x : o) ASSERT_EQ(dbl(x), -9.0);
  };
  check(call({rows * N * Dv}, s, gs), "out.shape");
  check(call({rows * N, Dv}, s, gs), "out.shape");
  check(call(s, {rows, N, Dv + 1}, gs), "branch output shape");
  check(call(s, {rows, Dv, N}, gs), "branch output shape");
  check(call(s, s, s, false, true), "o_sel data is null");
  check(call(s, s, {rows, N, 2}), "gates.shape");
  check(call(s, s, {rows - 1, N, 3}), "gates.shape");
  check(call(s, s, {rows, 3, N}), "gates.shape");
  check(call(s, s, gs, true), "gates data is null");
}

using DEdit = std::function<void(Step<half>&, DP&, DIn&, DOut&)>;

// TND rows 3 (q_len 2, 1), N 4, KV_N 2, D 32, sel {40, 100} (cmp 1, 5), k 2, pbs 32, cpbs 16.
DCase reject_case() {
  DCase c;
  c.N = 4, c.KVN = 2, c.Dqk = 32, c.Dv = 32, c.k = 2, c.w = 8, c.pbs = 32, c.cpbs = 16;
  c.sel = {40, 100}, c.qlen = {2, 1};
  return c;
}

void reject_step(const DCase& c, const DEdit& edit, const std::string& what, bool oor = false) {
  SCOPED_TRACE(what);
  Step<half> st(c);
  DP p = st.params();
  DIn in = st.inputs();
  DOut o = st.outputs();
  edit(st, p, in, o);
  const auto out0 = st.out, cmp0 = st.cmp_out, sel0 = st.sel_out, win0 = st.win_out;
  const auto tk0 = st.topk;
  support::expect_validate_agrees([&] { attnref::validate(p, in, o); },
                                  [&] { attnref::nsa_decode_step(p, in, o); });
  support::expect_throw([&] { attnref::nsa_decode_step(p, in, o); }, what, oor);
  const size_t n = out0.size() * sizeof(half);
  EXPECT_EQ(0, std::memcmp(out0.data(), st.out.data(), n)) << "output written";
  EXPECT_EQ(0, std::memcmp(cmp0.data(), st.cmp_out.data(), n)) << "cmp_out written";
  EXPECT_EQ(0, std::memcmp(sel0.data(), st.sel_out.data(), n)) << "sel_out written";
  EXPECT_EQ(0, std::memcmp(win0.data(), st.win_out.data(), n)) << "win_out written";
  EXPECT_EQ(tk0, st.topk) << "topk written";
}

TEST(NsaDecodeStep, RejectionsWriteNothing) {
  const DCase c = reject_case();
  {
    Step<half> ok(c);
    ASSERT_NO_THROW(ok.run());
  }
  // The step's own arguments.
  reject_step(
      c,
      [](Step<half>&, DP&, DIn& in, DOut&) {
        in.gates = support::reshaped(in.gates, {3, 4, 2});
      },
      "gates.shape");
  reject_step(
      c,
      [](Step<half>&, DP&, DIn& in, DOut&) {
        in.gates = support::reshaped(in.gates, {12, 3});
      },
      "gates.shape");
  reject_step(
      c, [](Step<half>&, DP&, DIn& in, DOut&) { in.gates = {}; }, "gates.shape");
  reject_step(
      c,
      [](Step<half>&, DP&, DIn&, DOut& o) {
        o.output = support::reshaped(o.output, {3, 4, 16});
      },
      "output.shape");
  reject_step(
      c, [](Step<half>&, DP&, DIn&, DOut& o) { o.output = {}; }, "output.shape");
  reject_step(
      c,
      [](Step<half>&, DP&, DIn&, DOut& o) {
        o.topk = support::reshaped(o.topk, {3, 4, 2});
      },
      "topk.shape");
  reject_step(
      c,
      [](Step<half>&, DP&, DIn&, DOut& o) {
        o.cmp_out = support::reshaped(o.cmp_out, {3, 4, 31});
      },
      "cmp_out / sel_out / win_out shape");
  reject_step(
      c,
      [](Step<half>&, DP&, DIn&, DOut& o) {
        o.win_out = support::reshaped(o.win_out, {1, 3, 4, 32});
      },
      "cmp_out / sel_out / win_out shape");
  reject_step(
      c, [](Step<half>&, DP& p, DIn&, DOut&) { p.window_size = 0; }, "params.window_size");
  reject_step(
      c, [](Step<half>&, DP& p, DIn&, DOut&) { p.layout = "BSH"; }, "params.layout");
  reject_step(
      c, [](Step<half>&, DP& p, DIn&, DOut&) { p.num_heads = 5; }, "params.num_heads");
  reject_step(
      c, [](Step<half>&, DP&, DIn& in, DOut&) { in.actual_sel_kv_seq_len[0] = 1; },
      "actual_sel_kv_seq_len[0]");
  reject_step(
      c, [](Step<half>&, DP&, DIn& in, DOut&) { in.actual_q_seq_len[1] = 5; },
      "actual_q_seq_len[1]");
  reject_step(
      c,
      [](Step<half>&, DP&, DIn& in, DOut&) {
        in.query = support::reshaped(in.query, {3, 4, 16});
      },
      "key.shape");
  // The selected / window branches' rules, checked before the compressed branch writes.
  reject_step(
      c, [](Step<half>& s, DP&, DIn&, DOut&) { s.bt[z(s.mb + 3)] = s.nb; },
      "nsa_decode_step: block_table[1][3] out of range (in nsa_selected_attention_infer)", true);
  reject_step(
      c, [](Step<half>&, DP&, DIn& in, DOut&) { in.key = support::resized(in.key, 1, 16); },
      "key.shape");
  reject_step(
      c, [](Step<half>&, DP& p, DIn&, DOut&) { p.select_block_size = 0; }, "select_block_size");
  {
    DCase x = c;  // strict: Dqk 32 is not the selected operator's 192
    x.strict = true;
    reject_step(
        x, [](Step<half>&, DP&, DIn&, DOut&) {}, "query / value head sizes");
  }
  // The compressed branch's inputs, named as the step's arguments.
  reject_step(
      c, [](Step<half>& s, DP&, DIn&, DOut&) { s.cbt[z(s.cmb + 0)] = s.cnb; },
      "nsa_decode_step: cmp_block_table[1][0]", true);
  reject_step(
      c, [](Step<half>&, DP&, DIn& in, DOut&) { in.cmp_key = support::resized(in.cmp_key, 2, 32); },
      "nsa_decode_step: cmp_key.shape");
  reject_step(
      c,
      [](Step<half>&, DP&, DIn& in, DOut&) {
        in.cmp_value = support::resized(in.cmp_value, 0, in.cmp_value.size(0) + (1));
      },
      "nsa_decode_step: cmp_value.shape");
  reject_step(
      c,
      [](Step<half>&, DP&, DIn& in, DOut&) {
        in.cmp_block_table =
            support::resized(in.cmp_block_table, 0, in.cmp_block_table.size(0) + (1));
      },
      "nsa_decode_step: cmp_block_table.shape");
  reject_step(
      c, [](Step<half>&, DP& p, DIn&, DOut&) { p.compress_block_size = 24; },
      "nsa_decode_step: params.compress_block_stride");
}

TEST(NsaDecodeStep, ValidateAcceptsAValidStepAndWritesNothing) {
  Step<half> st(reject_case());
  const auto out0 = st.out, cmp0 = st.cmp_out, sel0 = st.sel_out, win0 = st.win_out;
  const auto tk0 = st.topk;
  EXPECT_NO_THROW(attnref::validate(st.params(), st.inputs(), st.outputs()));
  EXPECT_NO_THROW(attnref::validate(st.params(), st.inputs(),
                                    attnref::NsaSlidingWindowAttentionOutputs<half>{
                                        StridedView<half>(st.win_out.data(), st.lay(4, 32))}));
  EXPECT_TRUE(support::bitwise_equal(support::as_floats(out0), support::as_floats(st.out)));
  EXPECT_TRUE(support::bitwise_equal(support::as_floats(cmp0), support::as_floats(st.cmp_out)));
  EXPECT_TRUE(support::bitwise_equal(support::as_floats(sel0), support::as_floats(st.sel_out)));
  EXPECT_TRUE(support::bitwise_equal(support::as_floats(win0), support::as_floats(st.win_out)));
  EXPECT_EQ(tk0, st.topk);
  st.run();  // the step itself writes every output (so the checks above can fail)
  EXPECT_NE(tk0, st.topk);
  EXPECT_FALSE(support::bitwise_equal(support::as_floats(out0), support::as_floats(st.out)));
}

TEST(NsaDecodeStep, OverlappingOutputsAreRejectedBeforeAnyWrite) {
  Tiny t;
  constexpr Index D = Tiny::D;
  std::vector<half> out(D, half(-7.0f)), cmp(D, half(-7.0f)), other(D, half(-7.0f));
  std::vector<i32> topk(1, 12345);
  DOut o;
  o.output = StridedView<half>(out.data(), {1, 1, D});
  o.topk = StridedView<i32>(topk.data(), {1, 1, 1});
  o.cmp_out = StridedView<half>(cmp.data(), {1, 1, D});
  auto untouched = [&] {
    EXPECT_EQ(topk[0], 12345);
    for (Index i = 0; i < D; ++i) {
      EXPECT_EQ(dbl(out[z(i)]), -7.0);
      EXPECT_EQ(dbl(cmp[z(i)]), -7.0);
    }
  };
  {  // the selected output on the value cache
    DOut x = o;
    x.sel_out = StridedView<half>(t.v.data(), {1, 1, D});
    support::expect_validate_agrees([&] { attnref::validate(t.p, t.in, x); },
                                    [&] { attnref::nsa_decode_step(t.p, t.in, x); });
    support::expect_throw([&] { attnref::nsa_decode_step(t.p, t.in, x); },
                          "nsa_decode_step: sel_out overlaps an input", false);
    untouched();
  }
  {  // two branch outputs sharing one buffer
    DOut x = o;
    x.sel_out = StridedView<half>(cmp.data(), {1, 1, D});
    support::expect_validate_agrees([&] { attnref::validate(t.p, t.in, x); },
                                    [&] { attnref::nsa_decode_step(t.p, t.in, x); });
    support::expect_throw([&] { attnref::nsa_decode_step(t.p, t.in, x); },
                          "nsa_decode_step: cmp_out overlaps sel_out", false);
    untouched();
  }
  {  // the output on the gates, a branch output on topk
    DOut x = o;
    std::vector<float> g(D, 0.0f);  // gates in a buffer as large as the output
    DIn in = t.in;
    in.gates = StridedView<const float>(g.data(), {1, 1, 3});
    x.output = StridedView<half>(reinterpret_cast<half*>(g.data()), {1, 1, D});
    support::expect_validate_agrees([&] { attnref::validate(t.p, in, x); },
                                    [&] { attnref::nsa_decode_step(t.p, in, x); });
    support::expect_throw([&] { attnref::nsa_decode_step(t.p, in, x); },
                          "nsa_decode_step: output overlaps an input", false);
    DOut y = o;
    y.win_out = StridedView<half>(reinterpret_cast<half*>(topk.data()), {1, 1, D});
    support::expect_validate_agrees([&] { attnref::validate(t.p, t.in, y); },
                                    [&] { attnref::nsa_decode_step(t.p, t.in, y); });
    support::expect_throw([&] { attnref::nsa_decode_step(t.p, t.in, y); },
                          "nsa_decode_step: win_out overlaps topk", false);
    untouched();
  }
}

TEST(NsaDecodeStep, CompressedTableTooShortForTheRawLength) {
  Tiny t;  // sel 64 -> 3 compressed tokens; pages of 2 with a one-page table hold 2
  constexpr Index D = Tiny::D;
  DP p = t.p;
  p.cmp_page_block_size = 2;
  DIn in = t.in;
  in.cmp_key = StridedView<const half>(t.kc.data(), {8, 2, D});
  in.cmp_value = StridedView<const half>(t.vc.data(), {8, 2, D});
  std::vector<half> out(D, half(-7.0f));
  DOut o;
  o.output = StridedView<half>(out.data(), {1, 1, D});
  support::expect_throw([&] { attnref::nsa_decode_step(p, in, o); },
                        "nsa_decode_step: actual_sel_kv_seq_len[0] needs more compressed tokens",
                        false);
  for (Index i = 0; i < D; ++i) EXPECT_EQ(dbl(out[z(i)]), -7.0);
}

}  // namespace decode_step_rejects_test
