// quant_lightning_indexer (CANN QuantLightningIndexer: int8 index query / key, fp16 scales)
// against the independent reference ref::dsa::quant_indexer_topk (double, with the vendor
// golden's fp16 roundings spelled out): exact on small integers and power-of-two scales (every
// fp32 step exact) in BSND / TND queries over BSND / TND / PA_BSND keys and both sparse modes;
// the fp16 rounding of ReLU(dot / 1024) makes two different dots tie (then the lower key wins);
// the ReLU acts on the raw dot, before a negative scale; full-range int8 data selects the
// reference's set up to near-ties; threads give the same bits; every rule rejects by name.

#include <gtest/gtest.h>

#include <attnref/dsa/quant_lightning_indexer.hpp>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "nsa/dsa_support.hpp"
#include "support/errors.hpp"

namespace dsa_quant_indexer_test {

using namespace dsa_support;
using attnref::half;
using i8 = std::int8_t;

struct Quant {
  Data<half> d;
  std::vector<i8> q, k;
  std::vector<half> qs, ks;
  std::vector<double> qsd;               // [rows of all batches][N1], batch-major
  std::vector<std::vector<double>> ksd;  // per batch [kv][N2]
  attnref::QuantLightningIndexerParams p;
  attnref::QuantLightningIndexerInputs in;
  std::vector<i32> idx;
  std::vector<long> oshape;

  // q / k from d's values (NaN rows: 127, never read); scales 2^e, e in [-2, 2] (signed when
  // `negative`).
  explicit Quant(const Case& c, bool negative = false) : d(c) {
    auto to8 = [](const half& x) {
      const float f = static_cast<float>(x);
      return static_cast<i8>(std::isnan(f) ? 127 : f);
    };
    for (const half& x : d.q) q.push_back(to8(x));
    for (const half& x : d.k) k.push_back(to8(x));
    std::mt19937 rng(c.seed + 3);
    std::uniform_int_distribution<int> ue(-2, 2), us(0, 3);
    auto scale = [&] { return std::ldexp(negative && us(rng) == 0 ? -1.0 : 1.0, ue(rng)); };
    qs.assign(d.w.size(), half(0.0f));
    for (int b = 0; b < d.B; ++b)
      for (long e = 0; e < long{c.qlen[z(b)]} * c.N1; ++e) {
        const double v = scale();
        qs[z(long{d.row0[z(b)]} * c.N1 + e)] = half(static_cast<float>(v));
      }
    ks.assign(d.k.size() / z(c.D), half(1.0f));
    ksd.resize(z(d.B));
    for (int b = 0; b < d.B; ++b)
      for (long t = 0; t < d.bat[z(b)].kv_len * c.N2; ++t) {
        const double v = scale();
        ksd[z(b)].push_back(v);
        ks[z(d.place(b, t / c.N2) * c.N2 + t % c.N2)] = half(static_cast<float>(v));
      }
    p.layout_query = c.lq, p.layout_key = c.lkv, p.sparse_count = c.K;
    p.sparse_mode = c.causal ? 3 : 0, p.strict = c.strict;
    in.query = {q.data(), d.qshape(c.D)};
    in.key = {k.data(), d.kshape(c.D)};
    std::vector<long> ws = d.qshape(c.D);
    ws.pop_back();
    in.weights = {d.w.data(), ws};
    in.query_dequant_scale = {qs.data(), ws};
    std::vector<long> kss = d.kshape(c.D);
    kss.pop_back();
    in.key_dequant_scale = {ks.data(), kss};
    if (c.lkv == "PA_BSND") in.block_table = {d.bt.data(), {d.B, d.maxb}};
    if (c.pass_qlen || c.lq == "TND") in.actual_seq_lengths_query = d.aq;
    if (c.pass_kvlen || c.lkv != "BSND") in.actual_seq_lengths_key = d.akv;
    oshape = d.qshape(static_cast<int>(c.K));
    oshape[oshape.size() - 2] = c.N2;
    idx.assign(z(long{d.rows} * c.N2 * c.K), 5555);
  }
  void run(int threads = 0) {
    attnref::ExecConfig x;
    x.threads = threads;
    attnref::quant_lightning_indexer(p, in, {{idx.data(), oshape}}, x);
  }
  std::vector<i32> expected() const {
    std::vector<i32> want(idx.size(), -1);
    for (int b = 0; b < d.B; ++b) {
      std::vector<double> qsb;
      for (long e = 0; e < long{d.c.qlen[z(b)]} * d.c.N1; ++e)
        qsb.push_back(
            static_cast<double>(static_cast<float>(qs[z(long{d.row0[z(b)]} * d.c.N1 + e)])));
      const auto t = ref::dsa::quant_indexer_topk(d.sh, d.bat[z(b)], qsb, ksd[z(b)], d.c.K);
      std::copy(t.begin(), t.end(), want.begin() + long{d.row0[z(b)]} * d.c.N2 * d.c.K);
    }
    return want;
  }
};

Case shape(const std::string& lq, const std::string& lkv, bool causal, long count) {
  Case c;
  c.lq = lq, c.lkv = lkv, c.causal = causal, c.K = count, c.N1 = 64, c.D = 128, c.Dr = 0;
  c.qlen = {3, 0, 4, 1}, c.kvlen = {40, 9, 300, 0}, c.bs = 32, c.ints = 3;
  if (lq == "BSND") c.S1 = 5;
  c.seed = static_cast<unsigned>(count + causal * 5 + lq.size() + lkv.size() * 11);
  return c;
}

TEST(DsaQuantIndexer, ExactOnSmallIntegersInEveryLayoutPair) {
  for (const char* lq : {"BSND", "TND"})
    for (const char* lkv : {"SAME", "PA_BSND"})
      for (bool causal : {true, false}) {
        const std::string kv = std::string(lkv) == "SAME" ? lq : lkv;
        Quant x(shape(lq, kv, causal, causal ? 16 : 2048));
        x.run();
        SCOPED_TRACE(std::string(lq) + " / " + kv);
        EXPECT_EQ(x.idx, x.expected());
      }
}

TEST(DsaQuantIndexer, Fp16RoundingTiesTwoDotsAndTheReluPrecedesANegativeScale) {
  // One row, one head, three keys: dots 2048, 2049 (both fp16(dot / 1024) = 2) and 1024.
  Case c = shape("BSND", "BSND", false, 3);
  c.N1 = 1, c.D = 128, c.qlen = {1}, c.kvlen = {3}, c.S1 = 1, c.strict = false;
  Quant x(c);
  std::fill(x.q.begin(), x.q.end(), i8(0));
  std::fill(x.k.begin(), x.k.end(), i8(0));
  x.q[0] = 64, x.q[1] = 1;
  x.k[0 * 128] = 32, x.k[1 * 128] = 32, x.k[1 * 128 + 1] = 1, x.k[2 * 128] = 16;
  x.d.w[0] = half(1.0f), x.qs[0] = half(1.0f);
  for (auto& s : x.ks) s = half(1.0f);
  x.run();
  EXPECT_EQ(x.idx, (std::vector<i32>{0, 1, 2}));  // 2049 rounds onto 2048: the lower key first
  // A negative key scale turns the largest into the smallest (the ReLU came before it), and a
  // negative dot gives 0 whatever the scale.
  x.ks[0] = half(-1.0f);
  x.k[2 * 128] = -16;  // dot -1024: ReLU 0
  x.idx.assign(3, 5555);
  x.run();
  EXPECT_EQ(x.idx, (std::vector<i32>{1, 2, 0}));
}

TEST(DsaQuantIndexer, FullRangeDataSelectsTheReferenceSetAndThreadsAgree) {
  Case c = shape("TND", "PA_BSND", true, 48);
  c.ints = 100, c.seed = 12;
  Quant x(c);
  x.run(1);
  const std::vector<i32> want = x.expected();
  // Exact here too unless two scores fall within an fp32 rounding: count the rows that differ.
  long differ = 0, rows = 0;
  for (size_t r = 0; r < want.size(); r += z(c.K), ++rows) {
    std::vector<i32> a(want.begin() + static_cast<long>(r),
                       want.begin() + static_cast<long>(r) + c.K);
    std::vector<i32> b(x.idx.begin() + static_cast<long>(r),
                       x.idx.begin() + static_cast<long>(r) + c.K);
    std::sort(a.begin(), a.end()), std::sort(b.begin(), b.end());
    differ += a != b;
  }
  EXPECT_LE(differ, rows / 10) << differ << " of " << rows << " rows select another set";
  std::vector<i32> one = x.idx;
  x.idx.assign(x.idx.size(), 5555);
  x.run(2);
  EXPECT_EQ(one, x.idx);
}

TEST(DsaQuantIndexer, EveryRuleRejectsByNameAndWritesNothing) {
  auto expect = [](auto edit, const std::string& frag, bool oor = false) {
    Quant x(shape("TND", "PA_BSND", true, 16));
    edit(x);
    SCOPED_TRACE(frag);
    support::expect_throw([&] { x.run(); }, frag, oor);
    for (i32 v : x.idx) ASSERT_EQ(v, 5555);
  };
  expect([](Quant& x) { x.p.query_quant_mode = 1; }, "query_quant_mode");
  expect([](Quant& x) { x.p.sparse_count = 3072; }, "params.sparse_count");
  expect([](Quant& x) { x.p.sparse_mode = 1; }, "params.sparse_mode");
  expect(
      [](Quant& x) {
        x.in.query_dequant_scale = {x.qs.data(), {x.d.rows, 32}};
      },
      "query_dequant_scale.shape");
  expect(
      [](Quant& x) {
        x.in.key_dequant_scale = {x.ks.data(), {x.d.nb, 32}};
      },
      "key_dequant_scale.shape");
  expect([](Quant& x) { x.in.key_dequant_scale = {}; }, "key_dequant_scale");
  expect([](Quant& x) { x.d.bt[0] = 99; }, "block_table[0][0]", true);
  expect([](Quant& x) { x.in.actual_seq_lengths_query = {}; }, "actual_seq_lengths_query");
  Case n = shape("TND", "TND", true, 16);
  n.N1 = 65;
  Quant y(n);
  support::expect_throw([&] { y.run(); }, "query.shape (N1)", false);
}

}  // namespace dsa_quant_indexer_test
