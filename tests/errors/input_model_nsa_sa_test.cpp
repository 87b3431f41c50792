// Bad input at the edge of the NSA operators and of ATB SelfAttention's modes, found by their
// fuzz entries (issue #18): rejections named after the operator called (not an inner one),
// outputs and written caches that must not alias inputs, index data out of range, table widths
// and select block sizes whose products overflow. Each rejection leaves the outputs untouched.

#include <gtest/gtest.h>

#include <attnref/attnref.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "errors/input_model_support.hpp"
#include "support/errors.hpp"
#include "support/views.hpp"

namespace input_model_nsa_sa_test {

using namespace input_model_support;
using attnref::StridedView;

// ---- found by the fuzz entries of NSA and of ATB SelfAttention's modes ----------------------

// A one-batch TND decode step: N = KV_N = 1, D 16, sel 64 raw tokens (one page of 64), l 32 /
// d 16 / l' 64 (3 compressed tokens, one page of 16), k 1, window 4.
struct NsaStep {
  static constexpr Index D = 16;
  std::vector<float> q = std::vector<float>(D, 0.5f), k = std::vector<float>(64 * D, 0.1f),
                     v = std::vector<float>(64 * D, 1.0f), kc = std::vector<float>(16 * D, 0.1f),
                     vc = std::vector<float>(16 * D, 2.0f), gates{0.25f, 0.25f, 0.5f},
                     out = std::vector<float>(D, 7.0f);
  std::vector<std::int32_t> bt{0}, cbt{0};
  attnref::NsaDecodeParams p;
  attnref::NsaDecodeInputs<float> in;
  NsaStep() {
    p.compress_block_size = 32, p.compress_block_stride = 16, p.select_block_size = 64;
    p.select_block_count = 1, p.window_size = 4, p.page_block_size = 64;
    p.cmp_page_block_size = 16, p.strict = false;
    in.query = StridedView<const float>(q.data(), {1, 1, D});
    in.key = StridedView<const float>(k.data(), {1, 64, D});
    in.value = StridedView<const float>(v.data(), {1, 64, D});
    in.block_table = StridedView<const std::int32_t>(bt.data(), {1, 1});
    in.cmp_key = StridedView<const float>(kc.data(), {1, 16, D});
    in.cmp_value = StridedView<const float>(vc.data(), {1, 16, D});
    in.cmp_block_table = StridedView<const std::int32_t>(cbt.data(), {1, 1});
    in.gates = StridedView<const float>(gates.data(), {1, 1, 3});
    in.actual_sel_kv_seq_len = {64};
  }
  void run(const attnref::NsaDecodeParams& pp, const attnref::NsaDecodeInputs<float>& ii) {
    attnref::nsa_decode_step<float>(pp, ii, {StridedView<float>(out.data(), {1, 1, D})});
  }
};

TEST(InputModel, NsaDecodeStepRejectionsNameTheStep) {
  // The branch operators' rejections came out under their own names; now under the step's,
  // with the branch after the argument.
  NsaStep s;
  EXPECT_NO_THROW(s.run(s.p, s.in));
  std::fill(s.out.begin(), s.out.end(), 7.0f);
  s.bt[0] = 5;
  support::expect_rejected_by<std::out_of_range>(
      [&] { s.run(s.p, s.in); }, "nsa_decode_step",
      {"block_table[0][0] out of range (in nsa_selected_attention_infer): expected [0, 1)"});
  s.bt[0] = 0;
  auto p = s.p;
  p.compress_block_size = 24;  // d 16 divides neither l nor l'
  support::expect_rejected_by<std::invalid_argument>(
      [&] { s.run(p, s.in); }, "nsa_decode_step",
      {"params.compress_block_stride", "nsa_compress_attention"});
  // The compressed table's width times its page size past 64 bits: was signed overflow.
  // (The table is really 128 entries wide: a view claiming more memory than it has would
  // overlap the output, a rejection of its own.)
  auto in = s.in;
  p = s.p;
  p.cmp_page_block_size = Index(1) << 56;
  const std::vector<std::int32_t> wide_table(128, 0);
  in.cmp_key = support::reshaped(in.cmp_key, {0, Index(1) << 56, 16});
  in.cmp_value = support::reshaped(in.cmp_value, {0, Index(1) << 56, 16});
  in.cmp_block_table = StridedView<const std::int32_t>(wide_table.data(), {1, 128});
  support::expect_rejected_by<std::invalid_argument>(
      [&] { s.run(p, in); }, "nsa_decode_step", {"cmp_block_table.shape[1] * cmp_page_block_size"});
  // BSND with a raw key that is not [numBlocks, pbs, KV_N * D]: its shape was read past its end.
  p = s.p;
  p.layout = "BSND";
  in = s.in;
  in.query = support::reshaped(in.query, {1, 1, 1, 16});
  in.key = support::reshaped(in.key, {64 * 16});
  const attnref::NsaDecodeOutputs<float> o{StridedView<float>(s.out.data(), {1, 1, 1, 16})};
  support::expect_rejected_by<std::invalid_argument>(
      [&] { attnref::nsa_decode_step<float>(p, in, o); }, "nsa_decode_step", {"key.shape"});
  in.key = {};
  support::expect_rejected_by<std::invalid_argument>(
      [&] { attnref::nsa_decode_step<float>(p, in, o); }, "nsa_decode_step", {"key.shape"});
  EXPECT_TRUE(all_equal(s.out, 7.0f));
  // The window branch on its own named the engine ("attention") for a bad block table entry.
  s.bt[0] = -1;
  support::expect_rejected_by<std::out_of_range>(
      [&] {
        attnref::nsa_sliding_window_attention<float>(
            s.p, s.in, {StridedView<float>(s.out.data(), {1, 1, 16})});
      },
      "nsa_sliding_window_attention", {"block_table[0][0]"});
  EXPECT_TRUE(all_equal(s.out, 7.0f));
}

TEST(InputModel, NsaCompressAttentionAndGatedSumOutputsMustNotAliasInputs) {
  // Both wrote over their inputs without a word; now rejected before any write.
  constexpr Index D = 16;
  std::vector<float> q(D, 0.5f), kc(16 * D, 0.1f), vc(16 * D, 2.0f), out(D, 7.0f);
  std::vector<std::int32_t> topk(1, 9), bt{0};
  attnref::NsaCompressAttentionInferParams p;
  p.select_block_count = 1, p.page_block_size = 16, p.strict = false;
  attnref::NsaCompressAttentionInferInputs<float> in;
  in.query = StridedView<const float>(q.data(), {1, 1, D});
  in.key = StridedView<const float>(kc.data(), {1, 16, D});
  in.value = StridedView<const float>(vc.data(), {1, 16, D});
  in.block_table = StridedView<const std::int32_t>(bt.data(), {1, 1});
  in.actual_cmp_kv_seq_len = {3};
  const attnref::NsaCompressAttentionInferOutputs<float> ok{
      StridedView<float>(out.data(), {1, 1, D}), StridedView<std::int32_t>(topk.data(), {1, 1, 1})};
  EXPECT_NO_THROW(attnref::nsa_compress_attention_infer(p, in, ok));
  std::fill(out.begin(), out.end(), 7.0f);
  topk[0] = 9;
  const std::vector<float> kc0 = kc, vc0 = vc;
  // output over the values the branch reads, probs over the query.
  attnref::NsaCompressAttentionInferOutputs<float> bad = ok;
  bad.output = StridedView<float>(vc.data() + D, {1, 1, D});
  support::expect_rejected_by<std::invalid_argument>(
      [&] { attnref::nsa_compress_attention_infer(p, in, bad); }, "nsa_compress_attention_infer",
      {"output overlaps an input"});
  bad = ok;
  bad.probs = StridedView<float>(q.data(), {1, 1, 3});
  support::expect_rejected_by<std::invalid_argument>(
      [&] { attnref::nsa_compress_attention_infer(p, in, bad); }, "nsa_compress_attention_infer",
      {"probs overlaps an input"});
  bad = ok;
  bad.head_scores = StridedView<float>(out.data(), {1, 1, 1});
  support::expect_rejected_by<std::invalid_argument>(
      [&] { attnref::nsa_compress_attention_infer(p, in, bad); }, "nsa_compress_attention_infer",
      {"output overlaps head_scores"});
  EXPECT_TRUE(all_equal(out, 7.0f));
  EXPECT_EQ(kc, kc0);
  EXPECT_EQ(vc, vc0);
  EXPECT_EQ(topk[0], 9);
  // The gated sum: out shifted by one element over a branch output.
  std::vector<float> gates{0.25f, 0.25f, 0.5f}, a(D + 1, 1.0f), b(D, 2.0f), c(D, 3.0f);
  const std::vector<float> a0 = a;
  auto gated = [&](float* o) {
    attnref::nsa_gated_sum<float>(StridedView<const float>(gates.data(), {1, 1, 3}),
                                  StridedView<const float>(a.data(), {1, 1, D}),
                                  StridedView<const float>(b.data(), {1, 1, D}),
                                  StridedView<const float>(c.data(), {1, 1, D}),
                                  StridedView<float>(o, {1, 1, D}));
  };
  support::expect_rejected_by<std::invalid_argument>(
      [&] { gated(a.data() + 1); }, "nsa_gated_sum",
      {"out overlaps an input", "the memory of o_cmp"});
  EXPECT_EQ(a, a0);
  std::vector<float> o(D, 7.0f);
  EXPECT_NO_THROW(gated(o.data()));
  EXPECT_FLOAT_EQ(o[0], 0.25f * 1 + 0.25f * 2 + 0.5f * 3);
}

TEST(InputModel, NsaSelectedEmptyCacheHugeSelectBlockAndTableWidth) {
  attnref::NsaSelectedAttentionInferParams p;
  p.strict = false, p.layout = "TND", p.select_block_size = 4, p.select_block_count = 1;
  p.page_block_size = 4;
  std::vector<float> q(2, 0.5f), o(2, 7.0f), k(4 * 2), v(4 * 2);
  for (size_t i = 0; i < k.size(); ++i) k[i] = 0.1f * static_cast<float>(i), v[i] = k[i] - 1.0f;
  std::vector<std::int32_t> bt{-1}, topk{-1};
  attnref::NsaSelectedAttentionInferInputs<float> in;
  in.query = StridedView<const float>(q.data(), {1, 1, 2});
  in.key = StridedView<const float>(nullptr, {0, 4, 2});  // an empty pool: null data is fine
  in.value = StridedView<const float>(nullptr, {0, 4, 2});
  in.block_table = StridedView<const std::int32_t>(bt.data(), {1, 1});
  in.topk_indices = StridedView<const std::int32_t>(topk.data(), {1, 1, 1});
  in.actual_sel_kv_seq_len = {0};
  const attnref::NsaSelectedAttentionInferOutputs<float> out{
      StridedView<float>(o.data(), {1, 1, 2})};
  // Nothing to select from an empty cache: output 0 (was rejected by the engine, as
  // "attnref::attention_with: k data is null").
  EXPECT_NO_THROW(attnref::nsa_selected_attention_infer<float>(p, in, out));
  EXPECT_TRUE(all_equal(o, 0.0f));
  // block_table.size(1) * page_block_size past 64 bits: was signed overflow, then accepted.
  std::fill(o.begin(), o.end(), 7.0f);
  // (2^58 · 32 = 2^63 with a table really 32 entries wide.)
  auto wide = in;
  auto pw = p;
  pw.page_block_size = Index(1) << 58;
  const std::vector<std::int32_t> wide_table(32, -1);
  wide.key = support::reshaped(wide.key, {0, Index(1) << 58, 2});
  wide.value = support::reshaped(wide.value, {0, Index(1) << 58, 2});
  wide.block_table = StridedView<const std::int32_t>(wide_table.data(), {1, 32});
  support::expect_rejected_by<std::invalid_argument>(
      [&] { attnref::nsa_selected_attention_infer<float>(pw, wide, out); },
      "nsa_selected_attention_infer", {"block_table.shape[1] * page_block_size", "size overflows"});
  EXPECT_TRUE(all_equal(o, 7.0f));
  // A select block longer than every length: one block holds them all (its count was
  // (sel + l' - 1) / l', signed overflow at l' = 2^63 - 1).
  bt[0] = 0, topk[0] = 0;
  in.key = StridedView<const float>(k.data(), {1, 4, 2});
  in.value = StridedView<const float>(v.data(), {1, 4, 2});
  in.actual_sel_kv_seq_len = {3};
  attnref::nsa_selected_attention_infer<float>(p, in, out);
  const std::vector<float> want = o;
  p.select_block_size = std::numeric_limits<Index>::max();
  std::fill(o.begin(), o.end(), 7.0f);
  attnref::nsa_selected_attention_infer<float>(p, in, out);
  for (size_t i = 0; i < o.size(); ++i) EXPECT_NEAR(o[i], want[i], 1e-6) << i;
  // The compressed branch had the same overflow in block_table.size(1) * page_block_size.
  attnref::NsaCompressAttentionInferParams cp;
  cp.strict = false, cp.select_block_size = 4, cp.select_block_count = 1;
  cp.compress_block_size = 4, cp.compress_block_stride = 4, cp.page_block_size = Index(1) << 58;
  attnref::NsaCompressAttentionInferInputs<float> ci;
  ci.query = in.query;
  ci.key = ci.value = StridedView<const float>(nullptr, {0, Index(1) << 58, 2});
  ci.block_table = wide.block_table;
  ci.actual_cmp_kv_seq_len = {0};
  std::vector<std::int32_t> tk{9};
  std::fill(o.begin(), o.end(), 7.0f);
  support::expect_rejected_by<std::invalid_argument>(
      [&] {
        attnref::nsa_compress_attention_infer<float>(
            cp, ci,
            {StridedView<float>(o.data(), {1, 1, 2}),
             StridedView<std::int32_t>(tk.data(), {1, 1, 1})});
      },
      "nsa_compress_attention_infer", {"block_table.shape[1] * page_block_size", "size overflows"});
  EXPECT_TRUE(all_equal(o, 7.0f));
  EXPECT_EQ(tk[0], 9);
}

TEST(InputModel, SelfAttentionWrittenCachesMustNotAliasInputs) {
  // DECODER writes the new token into the caches before attending: a cache over the query or
  // the value, or the two caches over each other, were accepted (and the inputs overwritten).
  using P = attnref::SelfAttentionParams;
  P p;
  p.num_heads = 1, p.calc_type = P::CalcType::Decoder, p.kernel_type = P::KernelType::HighPrecision;
  std::vector<float> q(4, 0.5f), k(4, 1.0f), v(4, 2.0f), kc(16, 0.25f), vc(16, 0.75f), o(4, 7.0f);
  attnref::SelfAttentionInputs<float> in;
  in.query = StridedView<const float, 3>(q.data(), {1, 1, 4});
  in.key = StridedView<const float, 3>(k.data(), {1, 1, 4});
  in.value = StridedView<const float, 3>(v.data(), {1, 1, 4});
  in.seq_len = {1}, in.token_offset = {2};
  attnref::SelfAttentionOutputs<float> out{StridedView<float, 3>(o.data(), {1, 1, 4}),
                                           StridedView<float, 4>(kc.data(), {1, 1, 4, 4}),
                                           StridedView<float, 4>(vc.data(), {1, 1, 4, 4})};
  const std::vector<float> kc0 = kc, vc0 = vc;
  {
    auto bad = in;
    bad.query = StridedView<const float, 3>(kc.data() + 4, {1, 1, 4});  // row 1: written
    support::expect_rejected_by<std::invalid_argument>(
        [&] { attnref::self_attention(p, bad, out); }, "self_attention",
        {"key_cache overlaps an input", "query"});
  }
  {
    auto bad = in;
    bad.value = StridedView<const float, 3>(vc.data(), {1, 1, 4});
    support::expect_rejected_by<std::invalid_argument>(
        [&] { attnref::self_attention(p, bad, out); }, "self_attention",
        {"value_cache overlaps an input", "value"});
  }
  {
    auto bad = out;
    bad.value_cache = StridedView<float, 4>(kc.data(), {1, 1, 4, 4});
    support::expect_rejected_by<std::invalid_argument>([&] { attnref::self_attention(p, in, bad); },
                                                       "self_attention",
                                                       {"value_cache overlaps key_cache"});
  }
  EXPECT_TRUE(all_equal(o, 7.0f));
  EXPECT_EQ(kc, kc0);
  EXPECT_EQ(vc, vc0);
  // With kv-bypass nothing is written: a query inside the (read-only) key cache is fine.
  p.kvcache_cfg = P::KvCacheCfg::KBypassVBypass;
  auto ro = in;
  ro.query = StridedView<const float, 3>(kc.data() + 4, {1, 1, 4});
  ro.key = {}, ro.value = {};
  EXPECT_NO_THROW(attnref::self_attention(p, ro, out));
  EXPECT_NEAR(o[0], 0.75f, 1e-6);
}

TEST(InputModel, SelfAttentionPrefixPagedCacheNamesItsArguments) {
  // PREFIX_ENCODER left its block tables and kv_seq_len to the engine, whose messages named
  // attnref::attention and its own arguments (block_table, seq.kv).
  using P = attnref::SelfAttentionParams;
  P p;
  p.num_heads = 1, p.calc_type = P::CalcType::PrefixEncoder, p.mask_type = P::MaskType::CausalMask;
  p.is_triu_mask = 1, p.kernel_type = P::KernelType::HighPrecision;
  std::vector<float> q(16, 0.5f), kc(2 * 2 * 16, 0.25f), vc(kc.size(), 1.0f), o(16, 7.0f);
  std::vector<std::int32_t> table{1, 0};
  attnref::SelfAttentionInputs<float> in;
  in.query = StridedView<const float, 3>(q.data(), {1, 1, 16});
  in.key = StridedView<const float, 3>(kc.data(), {2, 2, 16});
  in.value = StridedView<const float, 3>(vc.data(), {2, 2, 16});
  in.block_tables = StridedView<const std::int32_t, 2>(table.data(), {1, 2});
  in.seq_len = {1}, in.kv_seq_len = {3};
  const attnref::SelfAttentionOutputs<float> out{StridedView<float, 3>(o.data(), {1, 1, 16})};
  EXPECT_NO_THROW(attnref::self_attention(p, in, out));
  std::fill(o.begin(), o.end(), 7.0f);
  table[1] = 2;
  support::expect_rejected_by<std::out_of_range>(
      [&] { attnref::self_attention(p, in, out); }, "self_attention",
      {"block_tables[0][1] out of range: expected [0, 2), got 2"});
  table[1] = 0;
  auto bad = in;
  bad.kv_seq_len = {5};
  support::expect_rejected_by<std::invalid_argument>([&] { attnref::self_attention(p, bad, out); },
                                                     "self_attention",
                                                     {"kv_seq_len[0] exceeds", "<= 4"});
  bad = in;
  bad.block_tables = StridedView<const std::int32_t, 2>(table.data(), {2, 1});
  support::expect_rejected_by<std::invalid_argument>([&] { attnref::self_attention(p, bad, out); },
                                                     "self_attention", {"block_tables.shape[0]"});
  bad = in;
  bad.key = StridedView<const float, 3>(kc.data(), {2, 0, 16});
  bad.value = StridedView<const float, 3>(vc.data(), {2, 0, 16});
  support::expect_rejected_by<std::invalid_argument>([&] { attnref::self_attention(p, bad, out); },
                                                     "self_attention",
                                                     {"blockSize", "not positive"});
  EXPECT_TRUE(all_equal(o, 7.0f));
}

}  // namespace input_model_nsa_sa_test
