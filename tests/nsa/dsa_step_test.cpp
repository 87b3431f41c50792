// dsa_step (DeepSeek-V3.2's attention: lightning_indexer, then sparse_flash_attention over its
// lists): == the two operators called directly, bit for bit, with the indices read back (TND
// prefill and BSND decode over a paged cache, BSND / TND caches); with sparse_count >= every
// visible length == causal MLA attention over the whole cache (the naive reference
// tests/reference/naive_attention.hpp on [q | q_rope]·[k | k_rope], V = k); every check of both
// operators runs before any output is written.

#include <gtest/gtest.h>

#include <attnref/dsa/step.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "nsa/dsa_support.hpp"
#include "reference/naive_attention.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"

namespace dsa_step_test {

using namespace dsa_support;
using attnref::bfloat16;

struct Step {
  Data<bfloat16> lat, ind;  // the latent side (512 + 64) and the indexer side (128)
  attnref::DsaStepParams p;
  attnref::DsaStepInputs<bfloat16> in;
  std::vector<bfloat16> out;
  std::vector<i32> idx;
  std::vector<long> oshape, ishape;
  i32* idx_ptr = nullptr;  // the indices' output (null: idx)

  static Case indexer_case(Case c) {
    c.N1 = 4, c.D = 128, c.Dr = 0;  // the same seed: the same block pool and table
    return c;
  }
  explicit Step(const Case& c) : lat(c), ind(indexer_case(c)) {
    p.layout_query = c.lq, p.layout_kv = c.lkv, p.sparse_count = c.K;
    p.sparse_mode = c.causal ? 3 : 0, p.scale_value = c.scale, p.strict = c.strict;
    in.index_query = {ind.q.data(), ind.qshape(128)};
    std::vector<long> ws = ind.qshape(128);
    ws.pop_back();
    in.weights = {ind.w.data(), ws};
    in.index_key = {ind.k.data(), ind.kshape(128)};
    in.query = {lat.q.data(), lat.qshape(512)};
    in.query_rope = {lat.qr.data(), lat.qshape(64)};
    in.key = {lat.k.data(), lat.kshape(512)};
    in.key_rope = {lat.kr.data(), lat.kshape(64)};
    if (c.lkv == "PA_BSND") in.block_table = {lat.bt.data(), {lat.B, lat.maxb}};
    in.actual_seq_lengths_query = lat.aq, in.actual_seq_lengths_kv = lat.akv;
    oshape = lat.qshape(512);
    ishape = lat.qshape(static_cast<int>(c.K));
    ishape[ishape.size() - 2] = 1;
    out.assign(z(long{lat.rows} * c.N1 * 512), bfloat16(-7.0f));
    idx.assign(z(long{lat.rows} * c.K), 4444);
  }
  void run() {
    EXPECT_EQ(lat.bt, ind.bt);  // one table pages both caches
    attnref::dsa_step(p, in, {{out.data(), oshape}, {idx_ptr ? idx_ptr : idx.data(), ishape}});
  }
};

Case base(const std::string& lq, const std::string& lkv, long count) {
  Case c;
  c.lq = lq, c.lkv = lkv, c.K = count, c.N1 = 8, c.bs = 64, c.causal = true;
  c.qlen = {5, 1, 12}, c.kvlen = {90, 30, 200};
  if (lq == "BSND") c.qlen = {1, 1, 1}, c.S1 = 1;  // decode
  c.seed = 31;
  return c;
}

TEST(DsaStep, EqualsTheIndexerThenSparseAttentionBitForBit) {
  for (const char* lq : {"TND", "BSND"})
    for (const char* lkv : {"PA_BSND", "SAME"}) {
      const std::string kv = std::string(lkv) == "SAME" ? lq : lkv;
      Step s(base(lq, kv, 16));
      s.run();
      // The indexer alone.
      attnref::LightningIndexerParams lp;
      lp.layout_query = lq, lp.layout_key = kv, lp.sparse_count = 16, lp.sparse_mode = 3;
      attnref::LightningIndexerInputs<bfloat16> li;
      li.query = s.in.index_query, li.key = s.in.index_key, li.weights = s.in.weights;
      li.block_table = s.in.block_table;
      li.actual_seq_lengths_query = s.in.actual_seq_lengths_query;
      li.actual_seq_lengths_key = s.in.actual_seq_lengths_kv;
      std::vector<i32> idx(s.idx.size(), 0);
      attnref::lightning_indexer(lp, li, {{idx.data(), s.ishape}, {}});
      EXPECT_EQ(idx, s.idx) << lq << " / " << kv;
      // Sparse attention alone over those lists.
      attnref::SparseFlashAttentionParams sp;
      sp.layout_query = lq, sp.layout_kv = kv, sp.scale_value = s.p.scale_value;
      attnref::SparseFlashAttentionInputs<bfloat16> si;
      si.query = s.in.query, si.query_rope = s.in.query_rope, si.key = s.in.key;
      si.key_rope = s.in.key_rope, si.block_table = s.in.block_table;
      si.sparse_indices = {idx.data(), s.ishape};
      si.actual_seq_lengths_query = s.in.actual_seq_lengths_query;
      si.actual_seq_lengths_kv = s.in.actual_seq_lengths_kv;
      std::vector<bfloat16> out(s.out.size(), bfloat16(0.0f));
      attnref::sparse_flash_attention(sp, si, {{out.data(), s.oshape}});
      EXPECT_TRUE(support::bitwise_equal(support::as_floats(out), support::as_floats(s.out)));
      // The indexer selected something (not every entry is -1).
      EXPECT_TRUE(std::count(s.idx.begin(), s.idx.end(), -1) < static_cast<long>(s.idx.size()));
    }
}

TEST(DsaStep, KeepingEveryVisibleKeyIsCausalMlaAttention) {
  Step s(base("TND", "PA_BSND", 256));  // 256 >= every kv length
  s.run();
  ref::Problem pr;
  pr.num_heads = 8, pr.num_kv_heads = 1, pr.head_size = 576, pr.v_head_size = 512;
  pr.scale = s.p.scale_value, pr.causal = ref::Causal::kBottomRight;
  ref::Seqs q, k, v;
  for (const auto& b : s.lat.bat) {
    pr.q_len.push_back(b.q_len), pr.kv_len.push_back(static_cast<int>(b.kv_len));
    std::vector<double> qq, kk;
    for (int i = 0; i < b.q_len * 8; ++i) {
      qq.insert(qq.end(), b.q.begin() + i * 512, b.q.begin() + (i + 1) * 512);
      qq.insert(qq.end(), b.qr.begin() + i * 64, b.qr.begin() + (i + 1) * 64);
    }
    for (long t = 0; t < b.kv_len; ++t) {
      kk.insert(kk.end(), b.k.begin() + t * 512, b.k.begin() + (t + 1) * 512);
      kk.insert(kk.end(), b.kr.begin() + t * 64, b.kr.begin() + (t + 1) * 64);
    }
    q.push_back(qq), k.push_back(kk), v.push_back(b.k);
  }
  const ref::Result r = ref::attention(pr, q, k, v);
  std::vector<double> want;
  for (const auto& o : r.o) want.insert(want.end(), o.begin(), o.end());
  EXPECT_TRUE(support::all_close(want, support::as_doubles(s.out),
                                 support::tolerance(support::Kind::BF16)));
}

TEST(DsaStep, EveryCheckOfBothOperatorsRunsBeforeAnyWrite) {
  auto expect = [](auto edit, const std::string& frag, bool oor = false) {
    Step s(base("TND", "PA_BSND", 16));
    edit(s);
    SCOPED_TRACE(frag);
    support::expect_throw([&] { s.run(); }, frag, oor);
    for (const bfloat16& v : s.out) ASSERT_EQ(support::dbl(v), -7.0);
    for (i32 v : s.idx) ASSERT_EQ(v, 4444);
  };
  expect(
      [](Step& s) {
        s.in.index_key = {s.ind.k.data(), {s.ind.nb, 64, 2, 64}};
      },
      "lightning_indexer");
  expect(
      [](Step& s) {
        s.in.key_rope = {s.lat.kr.data(), {s.lat.nb, 64, 1, 32}};
      },
      "sparse_flash_attention");
  expect(
      [](Step& s) {
        s.p.sparse_count = 3000, s.ishape.back() = 3000;
        s.idx.assign(z(s.lat.rows * 3000), 4444);
      },
      "params.sparse_count");
  expect([](Step& s) { s.ishape.back() = 8; }, "outputs.sparse_indices.shape");
  expect([](Step& s) { s.lat.bt[1] = s.ind.bt[1] = -3; }, "block_table", true);
  expect(
      [](Step& s) {  // the indices' output over the block table
        s.p.sparse_count = 1, s.ishape.back() = 1;
        s.idx_ptr = s.lat.bt.data();
      },
      "outputs.sparse_indices");
}

}  // namespace dsa_step_test
