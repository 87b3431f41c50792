// ATB PagedAttention (decode) against the independent reference, with K/V gathered through
// shuffled block tables (-1 padding, block size 1, block size larger than the context, empty
// contexts taking no query row, shared prefix blocks), over dtypes, GQA, masks and logN;
// metamorphic: paged == contiguous attention bit for bit, shuffled == ordered table; MLA;
// batchRunStatus; threads; bad input.

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/atb/paged_attention.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "reference/atb_paged_attention.hpp"
#include "support/cast.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"

namespace paged_attention_test {

using attnref::bfloat16;
using attnref::half;
using attnref::Index;
using attnref::StridedView;
using P = attnref::PagedAttentionParams;

enum class Mask { None, Norm, NormBroadcast, Alibi, AlibiBroadcast };

struct Case {
  int nh = 8, nkv = 2, d = 64, dv = 48, bs = 16;
  std::vector<Index> ctx{0, 1, 17, 300};
  Mask mask = Mask::None;
  bool log_n = false;
  bool shuffle = true;
  bool share_prefix = false;  // sequences 2 and 3 share their first block
  int mla_dv = 0;
  std::vector<std::int32_t> status;  // batchRunStatus (empty: disabled)
  float q_scale = 0.0f;
  int threads = 0;
  unsigned seed = 1;
};

template <class T>
struct Built {
  std::vector<T> q, kc, vc, mask, alibi, out;
  std::vector<float> log_n;
  std::vector<std::int32_t> table;
  Index blocks = 0, max_blocks = 0, tokens = 0;  // tokens: the sequences with keys
  std::vector<double> want;
};

template <class T>
Built<T> build(const Case& c) {
  std::mt19937 rng(c.seed);
  std::normal_distribution<float> nd;
  Built<T> r;
  const Index batch = static_cast<Index>(c.ctx.size());
  const int dv = c.mla_dv ? c.mla_dv : c.dv;
  for (Index l : c.ctx) r.max_blocks = std::max(r.max_blocks, (l + c.bs - 1) / c.bs);
  r.max_blocks += 1;                    // one -1 padded entry at least
  r.blocks = batch * r.max_blocks + 3;  // spare (poisoned) blocks
  auto fill = [&](std::vector<T>& x, size_t n) {
    x.resize(n);
    for (T& e : x) e = T(nd(rng));
  };
  fill(r.q, static_cast<size_t>(batch * c.nh * c.d));
  fill(r.kc, static_cast<size_t>(r.blocks * c.bs * c.nkv * c.d));
  fill(r.vc, static_cast<size_t>(r.blocks * c.bs * c.nkv * c.dv));
  // Block ids: a permutation (or the identity), -1 past each sequence's blocks.
  std::vector<std::int32_t> ids(static_cast<size_t>(r.blocks));
  for (Index i = 0; i < r.blocks; ++i) ids[static_cast<size_t>(i)] = static_cast<std::int32_t>(i);
  if (c.shuffle) std::shuffle(ids.begin(), ids.end(), rng);
  r.table.assign(static_cast<size_t>(batch * r.max_blocks), -1);
  Index next = 0;
  for (Index b = 0; b < batch; ++b)
    for (Index j = 0; j < (c.ctx[static_cast<size_t>(b)] + c.bs - 1) / c.bs; ++j)
      r.table[static_cast<size_t>(b * r.max_blocks + j)] = ids[static_cast<size_t>(next++)];
  if (c.share_prefix && batch >= 4)
    r.table[static_cast<size_t>(3 * r.max_blocks)] = r.table[static_cast<size_t>(2 * r.max_blocks)];
  // Poison the blocks no sequence uses.
  std::vector<bool> used(static_cast<size_t>(r.blocks), false);
  for (Index b = 0; b < batch; ++b)
    for (Index j = 0; j < (c.ctx[static_cast<size_t>(b)] + c.bs - 1) / c.bs; ++j)
      used[static_cast<size_t>(r.table[static_cast<size_t>(b * r.max_blocks + j)])] = true;
  const size_t krow = static_cast<size_t>(c.bs * c.nkv * c.d),
               vrow = static_cast<size_t>(c.bs * c.nkv * c.dv);
  for (Index i = 0; i < r.blocks; ++i)
    if (!used[static_cast<size_t>(i)]) {
      std::fill_n(&r.kc[static_cast<size_t>(i) * krow], krow, T(NAN));
      std::fill_n(&r.vc[static_cast<size_t>(i) * vrow], vrow, T(NAN));
    }

  Index max_ctx = 1;
  for (Index l : c.ctx) max_ctx = std::max(max_ctx, l);
  ref::AtbPaged pr;
  pr.num_heads = c.nh;
  pr.num_kv_heads = c.nkv;
  pr.head_size = c.d;
  pr.v_head_size = dv;
  pr.qk_scale = 0.125;
  const bool per_batch = c.mask == Mask::Norm || c.mask == Mask::Alibi;
  const Index mb = per_batch ? batch : 1;
  if (c.mask == Mask::Norm || c.mask == Mask::NormBroadcast) {
    std::bernoulli_distribution hole(0.2);
    for (Index i = 0; i < mb * max_ctx; ++i) r.mask.push_back(T(hole(rng) ? -10000.0f : 0.0f));
    pr.mask = [&r, per_batch, max_ctx](int b, int t) {
      return static_cast<double>(
          static_cast<float>(r.mask[static_cast<size_t>((per_batch ? b : 0) * max_ctx + t)]));
    };
  }
  if (c.mask == Mask::Alibi || c.mask == Mask::AlibiBroadcast) {
    for (Index b = 0; b < mb; ++b)
      for (int h = 0; h < c.nh; ++h)
        for (Index t = 0; t < max_ctx; ++t) {
          const Index len = per_batch ? c.ctx[static_cast<size_t>(b)] : max_ctx;
          const float slope = std::pow(2.0f, -8.0f * (h + 1) / c.nh);
          r.alibi.push_back(T(slope * static_cast<float>(t - len + 1)));
        }
    const int nh = c.nh;
    pr.alibi = [&r, per_batch, max_ctx, nh](int b, int h, int t) {
      return static_cast<double>(static_cast<float>(
          r.alibi[static_cast<size_t>(((per_batch ? b : 0) * nh + h) * max_ctx + t)]));
    };
  }
  if (c.log_n) {
    for (Index b = 0; b < batch; ++b) r.log_n.push_back(1.0f + 0.1f * static_cast<float>(b));
    pr.log_n = r.log_n;
  }
  // Reference inputs gathered through the table.
  std::vector<std::vector<double>> rq;
  std::vector<std::vector<std::vector<double>>> rk, rv;
  for (Index b = 0; b < batch; ++b) {
    std::vector<double> qb;
    for (int x = 0; x < c.nh * c.d; ++x) {
      float qv = static_cast<float>(r.q[static_cast<size_t>(b * c.nh * c.d + x)]);
      if (c.q_scale != 0.0f && c.q_scale != 1.0f) qv = static_cast<float>(T(qv * c.q_scale));
      qb.push_back(qv);
    }
    rq.push_back(qb);
    std::vector<std::vector<double>> kb, vb;
    const bool active = c.status.empty() || c.status[static_cast<size_t>(b)] == 1;
    for (Index t = 0; active && t < c.ctx[static_cast<size_t>(b)]; ++t) {
      const Index blk = r.table[static_cast<size_t>(b * r.max_blocks + t / c.bs)], off = t % c.bs;
      std::vector<double> kt, vt;
      for (int h = 0; h < c.nkv; ++h) {
        for (int e = 0; e < c.d; ++e)
          kt.push_back(static_cast<float>(
              r.kc[static_cast<size_t>(((blk * c.bs + off) * c.nkv + h) * c.d + e)]));
        for (int e = 0; e < dv; ++e)
          vt.push_back(static_cast<float>(
              c.mla_dv ? r.kc[static_cast<size_t>(((blk * c.bs + off) * c.nkv + h) * c.d + e)]
                       : r.vc[static_cast<size_t>(((blk * c.bs + off) * c.nkv + h) * c.dv + e)]));
      }
      kb.push_back(kt);
      vb.push_back(vt);
    }
    rk.push_back(kb);
    rv.push_back(vb);
  }
  const std::vector<double> want = ref::atb_paged_attention(pr, rq, rk, rv);
  // Packed rows: a sequence with context length 0 takes no query row and no output row.
  std::vector<T> packed;
  for (Index b = 0; b < batch; ++b) {
    if (c.ctx[static_cast<size_t>(b)] == 0) continue;
    const size_t qr = static_cast<size_t>(c.nh * c.d), orow = static_cast<size_t>(c.nh * dv);
    packed.insert(packed.end(), r.q.begin() + static_cast<long>(b * qr),
                  r.q.begin() + static_cast<long>((b + 1) * qr));
    for (size_t i = static_cast<size_t>(b) * orow; i < static_cast<size_t>(b + 1) * orow; ++i)
      r.want.push_back(static_cast<float>(T(static_cast<float>(want[i]))));
    ++r.tokens;
  }
  r.q = packed;
  r.out.assign(static_cast<size_t>(r.tokens * c.nh * dv), T(7.0f));
  return r;
}

template <class T>
void run(const Case& c, Built<T>& r) {
  const Index batch = static_cast<Index>(c.ctx.size());
  const int dv = c.mla_dv ? c.mla_dv : c.dv;
  Index max_ctx = 1;
  for (Index l : c.ctx) max_ctx = std::max(max_ctx, l);
  P p;
  p.num_heads = c.nh;
  p.num_kv_heads = c.nkv;
  p.qk_scale = 0.125f;
  p.q_scale = c.q_scale;
  p.mla_v_head_size = static_cast<std::uint32_t>(c.mla_dv);
  attnref::PagedAttentionInputs<T> in;
  in.query = StridedView<const T, 3>(r.q.data(), {r.tokens, c.nh, c.d});
  in.key_cache = StridedView<const T, 4>(r.kc.data(), {r.blocks, c.bs, c.nkv, c.d});
  if (!c.mla_dv)
    in.value_cache = StridedView<const T, 4>(r.vc.data(), {r.blocks, c.bs, c.nkv, c.dv});
  in.block_tables = StridedView<const std::int32_t, 2>(r.table.data(), {batch, r.max_blocks});
  in.context_lens = c.ctx;
  const bool per_batch = c.mask == Mask::Norm || c.mask == Mask::Alibi;
  if (!r.mask.empty()) {
    p.mask_type = P::MaskType::Norm;
    in.mask = StridedView<const T, 3>(r.mask.data(), {per_batch ? batch : 1, 1, max_ctx});
  }
  if (!r.alibi.empty()) {
    p.mask_type = P::MaskType::Alibi;
    in.alibi_mask =
        StridedView<const T, 4>(r.alibi.data(), {per_batch ? batch : 1, c.nh, 1, max_ctx});
  }
  if (c.log_n) {
    p.scale_type = P::ScaleType::LogN;
    in.log_n = StridedView<const float, 1>(r.log_n.data(), {static_cast<Index>(r.log_n.size())});
  }
  if (!c.status.empty()) {
    p.batch_run_status_enable = true;
    in.batch_run_status = c.status;
  }
  attnref::paged_attention(
      p, in,
      attnref::PagedAttentionOutputs<T>{StridedView<T, 3>(r.out.data(), {r.tokens, c.nh, dv})},
      {c.threads});
}

template <class T>
void check(const Case& c, const std::string& what) {
  Built<T> r = build<T>(c);
  ASSERT_NO_THROW(run(c, r)) << what;
  EXPECT_TRUE(support::all_close(r.want, support::as_doubles(r.out),
                                 support::tolerance(support::kind_of<T>())))
      << what;
}

TEST(PagedAttention, MatchesReference) {
  int n = 0;
  for (Mask m : {Mask::None, Mask::Norm, Mask::NormBroadcast, Mask::Alibi, Mask::AlibiBroadcast})
    for (int bs : {1, 16, 512})
      for (bool log_n : {false, true}) {
        Case c;
        c.mask = m;
        c.bs = bs;
        c.log_n = log_n;
        c.seed = static_cast<unsigned>(10 + n++);
        const std::string what = "mask " + std::to_string(static_cast<int>(m)) + " bs " +
                                 std::to_string(bs) + (log_n ? " logN" : "");
        check<half>(c, what);
        check<bfloat16>(c, what);
        check<float>(c, what);
      }
}

TEST(PagedAttention, GqaMhaMlaQScaleSharedPrefixAndBatchRunStatus) {
  Case mha;
  mha.nkv = 8;
  check<half>(mha, "MHA");
  Case mqa;
  mqa.nkv = 1;
  check<bfloat16>(mqa, "MQA");
  Case mla;
  mla.nkv = 1;
  mla.d = 96;
  mla.mla_dv = 64;
  check<half>(mla, "MLA");
  Case qs;
  qs.q_scale = 0.5f;
  check<half>(qs, "qScale");
  Case share;
  share.ctx = {40, 40, 40, 40};
  share.share_prefix = true;
  check<float>(share, "shared prefix block");
  Case status;  // status 0 with context 0 (the NPU reads only the lengths); status 1 with 0 too
  status.ctx = {0, 1, 0, 300};
  status.status = {1, 1, 0, 1};
  Built<half> r = build<half>(status);
  ASSERT_EQ(r.tokens, 2);  // the two sequences with keys, packed
  ASSERT_NO_THROW(run(status, r));
  EXPECT_TRUE(support::all_close(r.want, support::as_doubles(r.out),
                                 support::tolerance(support::Kind::F16)));
}

TEST(PagedAttention, ShuffledEqualsOrderedEqualsContiguousBitForBit) {
  for (int threads : {1, 2}) {
    Case c;
    c.ctx = {5, 130, 64, 1};
    c.threads = threads;
    Built<half> shuffled = build<half>(c);
    run(c, shuffled);
    Case o = c;
    o.shuffle = false;
    Built<half> ordered = build<half>(o);
    // Same K/V rows in other blocks: copy each sequence's tokens to the ordered layout.
    for (Index b = 0; b < static_cast<Index>(c.ctx.size()); ++b)
      for (Index t = 0; t < c.ctx[static_cast<size_t>(b)]; ++t) {
        const Index sb = shuffled.table[static_cast<size_t>(b * shuffled.max_blocks + t / c.bs)];
        const Index ob = ordered.table[static_cast<size_t>(b * ordered.max_blocks + t / c.bs)];
        const size_t kr = static_cast<size_t>(c.nkv * c.d), vr = static_cast<size_t>(c.nkv * c.dv);
        std::copy_n(&shuffled.kc[static_cast<size_t>(sb * c.bs + t % c.bs) * kr], kr,
                    &ordered.kc[static_cast<size_t>(ob * c.bs + t % c.bs) * kr]);
        std::copy_n(&shuffled.vc[static_cast<size_t>(sb * c.bs + t % c.bs) * vr], vr,
                    &ordered.vc[static_cast<size_t>(ob * c.bs + t % c.bs) * vr]);
      }
    ordered.q = shuffled.q;
    run(o, ordered);
    EXPECT_EQ(
        std::memcmp(ordered.out.data(), shuffled.out.data(), shuffled.out.size() * sizeof(half)),
        0);
    // Contiguous: the engine on each sequence's keys stored densely, same scale.
    const Index batch = static_cast<Index>(c.ctx.size()), S = 130;
    std::vector<half> k(static_cast<size_t>(batch * S * c.nkv * c.d), half(0.0f)),
        v(static_cast<size_t>(batch * S * c.nkv * c.dv), half(0.0f));
    for (Index b = 0; b < batch; ++b)
      for (Index t = 0; t < c.ctx[static_cast<size_t>(b)]; ++t) {
        const Index sb = shuffled.table[static_cast<size_t>(b * shuffled.max_blocks + t / c.bs)];
        const size_t kr = static_cast<size_t>(c.nkv * c.d), vr = static_cast<size_t>(c.nkv * c.dv);
        std::copy_n(&shuffled.kc[static_cast<size_t>(sb * c.bs + t % c.bs) * kr], kr,
                    &k[static_cast<size_t>(b * S + t) * kr]);
        std::copy_n(&shuffled.vc[static_cast<size_t>(sb * c.bs + t % c.bs) * vr], vr,
                    &v[static_cast<size_t>(b * S + t) * vr]);
      }
    std::vector<half> o2(shuffled.out.size());
    attnref::AttentionInputs<half> in{
        StridedView<const half, 4>(shuffled.q.data(), {batch, 1, c.nh, c.d}),
        StridedView<const half, 4>(k.data(), {batch, S, c.nkv, c.d}),
        StridedView<const half, 4>(v.data(), {batch, S, c.nkv, c.dv})};
    in.seq.kv = c.ctx;
    attnref::AttentionParams ep;
    ep.scale = 0.125f;
    attnref::attention(
        in, ep,
        attnref::AttentionOutputs<half>{StridedView<half, 4>(o2.data(), {batch, 1, c.nh, c.dv})},
        {threads});
    EXPECT_EQ(std::memcmp(o2.data(), shuffled.out.data(), o2.size() * sizeof(half)), 0)
        << "threads " << threads;
  }
}

TEST(PagedAttention, BadInputThrowsBeforeWriting) {
  auto expect = [](auto edit, const std::string& what, bool range) {
    Case c;
    Built<half> r = build<half>(c);
    edit(c, r);
    support::expect_throw([&] { run(c, r); }, what, range);
    for (const half& x : r.out) ASSERT_EQ(static_cast<float>(x), 7.0f) << what;
  };
  expect(
      [](Case&, Built<half>& r) {
        r.table[static_cast<size_t>(3 * r.max_blocks + 1)] = static_cast<std::int32_t>(r.blocks);
      },
      "attnref::paged_attention: block_tables[3][1] out of range", true);
  expect([](Case& c, Built<half>&) { c.ctx[2] = 10000; },
         "context_lens[2] exceeds block_tables.shape[1] * blockSize", false);
  expect([](Case& c, Built<half>&) { c.nkv = 3; },
         "params.num_heads not a multiple of num_kv_heads", false);
  expect([](Case& c, Built<half>&) { c.status = {1, 1}; }, "batch_run_status size mismatch", false);
  expect(
      [](Case& c, Built<half>&) {
        c.status = {1, 1, 0, 1};
      },
      "batch_run_status[2] is 0 for a sequence with keys (the NPU kernel ignores "
      "batchRunStatus and would compute that sequence; set its context length to 0): "
      "expected context_lens[2] = 0, got context_lens[2] = 17",
      false);
  expect(
      [](Case& c, Built<half>&) {
        c.status = {1, 2, 1, 1};
      },
      "batch_run_status[1] not 0 or 1", false);
  expect([](Case& c, Built<half>&) { c.ctx[0] = 5; },  // one more row than the query holds
         "query.shape[0] mismatch with the number of sequences with context_lens > 0 (one query "
         "row each, packed; a sequence with context length 0 takes none): expected 4, got 3",
         false);
  expect(
      [](Case& c, Built<half>& r) {
        c.log_n = true;
        r.log_n = {1.0f};
      },
      "log_n missing or shorter than the batch for LogN", false);
}

TEST(PagedAttention, UnsupportedFeaturesAreRejected) {
  Case c;
  Built<half> r = build<half>(c);
  P p;
  p.num_heads = c.nh;
  p.num_kv_heads = c.nkv;
  attnref::PagedAttentionInputs<half> in;
  in.query = StridedView<const half, 3>(r.q.data(), {r.tokens, c.nh, c.d});
  in.key_cache = StridedView<const half, 4>(r.kc.data(), {r.blocks, c.bs, c.nkv, c.d});
  in.value_cache = StridedView<const half, 4>(r.vc.data(), {r.blocks, c.bs, c.nkv, c.dv});
  in.block_tables = StridedView<const std::int32_t, 2>(r.table.data(), {4, r.max_blocks});
  in.context_lens = c.ctx;
  const attnref::PagedAttentionOutputs<half> out{
      StridedView<half, 3>(r.out.data(), {r.tokens, c.nh, c.dv})};
  const std::vector<std::pair<std::function<void(P&)>, std::string>> cases{
      {[](P& q) { q.calc_type = P::CalcType::Spec; },
       "params.mask_type calc_type Spec needs a Norm or Spec mask"},
      {[](P& q) { q.mask_type = P::MaskType::Spec; }, "spec_mask.shape mismatch for Spec"},
      {[](P& q) { q.mask_type = P::MaskType::MaskFree; }, "Atlas 300I Duo (310P) only"},
      {[](P& q) { q.mask_type = P::MaskType::NormCompress; }, "Atlas 300I Duo (310P) only"},
      {[](P& q) { q.quant_type = P::QuantType::DequantFusion; },
       "params.quant_type does not match floating-point caches"}};
  for (const auto& [edit, what] : cases) {
    P q = p;
    edit(q);
    support::expect_throw([&] { attnref::paged_attention(q, in, out); }, what, false);
  }
}

}  // namespace paged_attention_test
