// Bad input of the NSA compressed branch (CANN aclnnNsaCompressAttentionInfer): every rejection
// names its argument and leaves the outputs untouched; the vendor-only rules are rejected in
// strict mode, and relaxed mode accepts them and still matches the reference
// tests/reference/nsa.hpp (the harness: compress_attention_support.hpp).

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/nsa/compress_attention.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "nsa/compress_attention_support.hpp"
#include "support/cast.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"
#include "support/views.hpp"

namespace compress_attention_rejects_test {

using namespace compress_attention_support;

// ---------------------------------------------------------------------------------------------
// Bad input
// ---------------------------------------------------------------------------------------------

using P = NsaCompressAttentionInferParams;
using In = NsaCompressAttentionInferInputs<half>;
using Out = NsaCompressAttentionInferOutputs<half>;
using Edit = std::function<void(Built<half>&, P&, In&, Out&)>;

Case base_case() {
  Case c;
  c.N = 4, c.KVN = 2, c.Dqk = 32, c.Dv = 32, c.k = 2, c.mask = true;
  c.cmp = {9, 20}, c.qlen = {2, 1}, c.tail = {3, 0};
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
  const auto topk0 = bl.topk;
  const auto probs0 = bl.probs;
  support::expect_validate_agrees([&] { attnref::validate(p, in, o); },
                                  [&] { attnref::nsa_compress_attention_infer(p, in, o); });
  support::expect_throw([&] { attnref::nsa_compress_attention_infer(p, in, o); }, what, oor);
  EXPECT_EQ(0, std::memcmp(out0.data(), bl.out.data(), out0.size() * sizeof(half)));
  EXPECT_EQ(topk0, bl.topk);
  EXPECT_TRUE(support::bitwise_equal(probs0, bl.probs));
}
const Edit none = [](Built<half>&, P&, In&, Out&) {};

// A vendor-only rule: strict rejects naming `what`; relaxed runs and matches the reference.
void vendor_rule(Case c, const std::string& what) {
  c.strict = true;
  reject(c, none, what);
  c.strict = false;
  SCOPED_TRACE("relaxed: " + what);
  check_against_reference<half>(c);
}

TEST(NsaCompressAttention, VendorRulesStrictRejectsRelaxedAccepts) {
  Case c = base_case();
  {
    Case x = c;  // l > 128
    x.l = 144, x.ls = 144, x.cmp = {9, 20};
    vendor_rule(x, "params.compress_block_size");
  }
  {
    Case x = c;  // l not a multiple of 16 (d = 8 too)
    x.l = 24, x.d = 8, x.ls = 48;
    vendor_rule(x, "params.compress_block_size");
  }
  {
    Case x = c;  // l' > 128
    x.ls = 160;
    x.k = 1;
    x.cmp = {9, 20};
    vendor_rule(x, "params.select_block_size");
  }
  {
    Case x = c;  // d = 8
    x.d = 8, x.tail = {3, 0};
    vendor_rule(x, "params.compress_block_stride");
  }
  {
    Case x = c;  // d = 80 (> 64)
    x.l = 80, x.d = 80, x.ls = 80, x.tail = {3, 79};
    vendor_rule(x, "params.compress_block_stride");
  }
  {
    Case x = c;  // G = 3 does not divide 128
    x.N = 6, x.KVN = 2;
    vendor_rule(x, "params.num_heads / num_key_value_heads");
  }
  {
    Case x = c;  // Dqk > 192
    x.Dqk = 208, x.Dv = 32;
    vendor_rule(x, "query / value head sizes");
  }
  {
    Case x = c;  // Dv > 128
    x.Dqk = 192, x.Dv = 144;
    vendor_rule(x, "query / value head sizes");
  }
  {
    Case x = c;  // Dv > Dqk
    x.Dqk = 32, x.Dv = 48;
    vendor_rule(x, "query / value head sizes");
  }
  {
    Case x = c;  // page block 8
    x.pbs = 8;
    vendor_rule(x, "params.page_block_size");
  }
  {
    Case x = c;  // page block 144 (> 128)
    x.pbs = 144;
    vendor_rule(x, "params.page_block_size");
  }
  {
    Case x = c;  // k = 3 > floor((8·16 + 32)/64) = 2 for cmp 9
    x.k = 3;
    vendor_rule(x, "params.select_block_count");
  }
  {
    Case x = c;  // cmp 8193 > 8192
    x.N = 2, x.KVN = 1, x.Dqk = 16, x.Dv = 16, x.pbs = 128, x.k = 1, x.mask = false;
    x.cmp = {8193}, x.qlen = {1}, x.tail = {};
    vendor_rule(x, "compressed length limit");
  }
  {
    Case x = c;  // (cmp - 1)·d + l over 4096 select blocks: l = d = l' = 16, cmp 4097
    x.N = 2, x.KVN = 1, x.Dqk = 16, x.Dv = 16, x.pbs = 128, x.k = 1, x.mask = false;
    x.l = 16, x.d = 16, x.ls = 16, x.cmp = {4097}, x.qlen = {1}, x.tail = {};
    vendor_rule(x, "too many select blocks");
  }
}

TEST(NsaCompressAttention, BatchAbove10000) {
  Case c;
  c.N = 1, c.KVN = 1, c.Dqk = 16, c.Dv = 16, c.k = 1, c.spare_blocks = 1;
  c.cmp.assign(10001, 0);
  c.qlen.assign(10001, 1);
  reject(c, none, "block_table.shape[0]");
  c.strict = false;
  Built<half> bl(c);
  ASSERT_NO_THROW(bl.run());
  EXPECT_TRUE(std::all_of(bl.topk.begin(), bl.topk.end(), [](i32 t) { return t == -1; }));
  EXPECT_TRUE(std::all_of(bl.out.begin(), bl.out.end(), [](half h) { return dbl(h) == 0.0; }));
}

TEST(NsaCompressAttention, DefinitionRulesRejectedInBothModes) {
  for (bool strict : {true, false}) {
    Case c = base_case();
    c.strict = strict;
    auto blocks = [&](long l, long d, long ls) {
      return [=](Built<half>&, P& p, In&, Out&) {
        p.compress_block_size = l, p.compress_block_stride = d, p.select_block_size = ls;
      };
    };
    reject(c, blocks(48, 32, 64), "params.compress_block_stride");  // d does not divide l
    reject(c, blocks(32, 32, 48), "params.compress_block_stride");  // d does not divide l'
    reject(c, blocks(16, 32, 64), "params.compress_block_size");    // l < d
    reject(c, blocks(64, 16, 32), "params.select_block_size");      // l' < l
    reject(c, blocks(0, 16, 64), "params block sizes");
    reject(
        c, [](Built<half>&, P& p, In&, Out&) { p.select_block_count = 0; }, "select_block_count");
    reject(
        c, [](Built<half>&, P& p, In&, Out&) { p.layout = "BNSD"; }, "params.layout");
    reject(
        c, [](Built<half>&, P& p, In&, Out&) { p.sparse_mode = 1; }, "params.sparse_mode");
    reject(
        c, [](Built<half>&, P& p, In&, Out&) { p.num_key_value_heads = 3; }, "params.num_heads");
    reject(
        c, [](Built<half>&, P& p, In&, Out&) { p.num_heads = 8; }, "query.shape");
    reject(
        c, [](Built<half>&, P& p, In&, Out&) { p.scale_value = NAN; }, "params.scale_value");
  }
}

TEST(NsaCompressAttention, ShapeAndLengthRejections) {
  const Case c = base_case();  // TND, T = 3, N 4, KV_N 2, D 32, cmp {9, 20}, q {2, 1}, pbs 16
  auto shape = [](auto member, Shape s) {
    return [=](Built<half>&, P&, In& in, Out& o) {
      auto& v = member(in, o);
      v = support::reshaped(v, s);
    };
  };
  reject(c, shape([](In & in, Out&) -> auto& { return in.query; }, {3, 2, 32}), "query.shape");
  reject(c, shape([](In & in, Out&) -> auto& { return in.query; }, {3, 4, 32, 1}), "query.shape");
  reject(c, shape([](In & in, Out&) -> auto& { return in.key; }, {6, 16, 32}), "key.shape");
  reject(c, shape([](In & in, Out&) -> auto& { return in.key; }, {6, 32, 64}), "key.shape");
  reject(c, shape([](In & in, Out&) -> auto& { return in.value; }, {5, 16, 64}), "value.shape");
  reject(c, shape([](In & in, Out&) -> auto& { return in.value; }, {6, 16, 63}), "value.shape");
  reject(c, shape([](In&, Out & o) -> auto& { return o.output; }, {3, 4, 16}), "output.shape");
  // The doc table's [T, N, k] is not the kernel's [T, KV_N, k].
  reject(c, shape([](In&, Out & o) -> auto& { return o.topk; }, {3, 4, 2}), "topk.shape");
  reject(c, shape([](In&, Out & o) -> auto& { return o.topk; }, {3, 2, 3}), "topk.shape");
  reject(c, shape([](In&, Out & o) -> auto& { return o.probs; }, {3, 4, 19}), "probs.shape");
  reject(c, shape([](In&, Out & o) -> auto& { return o.group_scores; }, {3, 4, 7}),
         "group_scores.shape");
  reject(
      c, [](Built<half>&, P&, In& in, Out&) { in.block_table = {}; }, "block_table.shape");
  reject(
      c, [](Built<half>&, P&, In& in, Out&) { in.actual_cmp_kv_seq_len = {9}; },
      "actual_cmp_kv_seq_len");
  reject(
      c,
      [](Built<half>&, P&, In& in, Out&) {
        in.actual_cmp_kv_seq_len = {9, -1};
      },
      "actual_cmp_kv_seq_len[1]");
  // Longer than the table holds (maxBlocks 3 · 16 = 48).
  reject(
      c,
      [](Built<half>&, P&, In& in, Out&) {
        in.actual_cmp_kv_seq_len = {49, 20};
      },
      "actual_cmp_kv_seq_len[0]");
  reject(
      c,
      [](Built<half>&, P&, In& in, Out&) {
        in.actual_q_seq_len = {0, 3};
      },
      "actual_q_seq_len[0]");
  reject(
      c,
      [](Built<half>&, P&, In& in, Out&) {
        in.actual_q_seq_len = {5, 1};
      },
      "actual_q_seq_len[0]");
  reject(
      c,
      [](Built<half>&, P&, In& in, Out&) {
        in.actual_q_seq_len = {1, 1};
      },
      "query.shape[0]");
  reject(
      c, [](Built<half>&, P&, In& in, Out&) { in.actual_q_seq_len = {3}; }, "actual_q_seq_len");
  // Block table entries read: out of range, or -1 inside the length.
  reject(
      c, [](Built<half>& b, P&, In&, Out&) { b.bt[z(b.max_blocks + 1)] = b.nb; },
      "block_table[1][1]", true);
  reject(
      c, [](Built<half>& b, P&, In&, Out&) { b.bt[0] = -1; }, "block_table[0][0]", true);
  // The mask: sel inconsistent with cmp (tail must be in [0, d)), missing, or below q_len.
  reject(
      c, [](Built<half>&, P&, In& in, Out&) { in.actual_sel_kv_seq_len[0] += 13; },
      "actual_sel_kv_seq_len[0]");
  reject(
      c, [](Built<half>&, P&, In& in, Out&) { in.actual_sel_kv_seq_len[1] -= 1; },
      "actual_sel_kv_seq_len[1]");
  reject(
      c, [](Built<half>&, P&, In& in, Out&) { in.actual_sel_kv_seq_len.clear(); },
      "actual_sel_kv_seq_len");
  {
    Case x = c;
    x.cmp = {0, 20};  // sel 1 < q_len 2
    reject(
        x, [](Built<half>&, P&, In& in, Out&) { in.actual_sel_kv_seq_len[0] = 1; },
        "actual_q_seq_len[0]");
  }
  // BSND: q_S 5, batch mismatch, q_len above S.
  Case b = c;
  b.layout = "BSND", b.S = 2;
  reject(b, shape([](In & in, Out&) -> auto& { return in.query; }, {2, 5, 4, 32}),
         "query.shape[1]");
  reject(b, shape([](In & in, Out&) -> auto& { return in.query; }, {3, 2, 4, 32}),
         "query.shape[0]");
  reject(
      b,
      [](Built<half>&, P&, In& in, Out&) {
        in.actual_q_seq_len = {3, 1};
      },
      "actual_q_seq_len[0]");
}

}  // namespace compress_attention_rejects_test
