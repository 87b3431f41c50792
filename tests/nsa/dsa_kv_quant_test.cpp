// kv_quant_sparse_flash_attention (CANN KvQuantSparseFlashAttention: an int8 latent cache whose
// 656-byte rows pack the int8 latent, the rope values and four fp32 scales) against the
// independent reference ref::dsa::sparse_attention over the dequantized rows (T(int8 · scale_t)
// spelled out here from the documented layout): BSND / TND queries over BSND / TND / PA_BSND
// caches, sparse_block_size 1 / 4 / 16, sparse_mode 0 / 3, repeated entries; rows no query may
// read (unused cache rows, one never-selected block per batch) are all 0xFF bytes (NaN scales).
// The same attention as sparse_flash_attention on the dequantized cache, bit for bit; threads;
// value and the reserved scales are never read; every rule rejects by name and writes nothing.

#include <gtest/gtest.h>

#include <attnref/dsa/kv_quant_sparse_flash_attention.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "nsa/dsa_support.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"

namespace dsa_kv_quant_test {

using namespace dsa_support;
using attnref::bfloat16;
using attnref::half;
using i8 = std::int8_t;

template <class T>
struct Kvq {
  Data<T> d;
  std::vector<T> q;   // [rows, N1, 576]
  std::vector<i8> k;  // [tokens, 1, 656]
  std::vector<T> kd;  // the dequantized cache [tokens, 1, 512] (NaN where 0xFF)
  attnref::KvQuantSparseFlashAttentionParams p;
  attnref::KvQuantSparseFlashAttentionInputs<T> in;
  std::vector<T> out;
  std::vector<long> oshape;

  explicit Kvq(const Case& c, double dup = 0.0) : d(c) {
    d.sfa_lists(dup);  // poison blocks: NaN in d.k
    const long tokens = static_cast<long>(d.k.size()) / 512;
    k.assign(z(tokens * 656), i8(-1));  // 0xFF everywhere: NaN scales
    kd.assign(z(tokens * 512), T(NAN));
    std::mt19937 rng(c.seed + 5);
    std::uniform_int_distribution<int> ui(-127, 127);
    std::uniform_real_distribution<float> us(0.002f, 0.02f);
    for (int b = 0; b < d.B; ++b)
      for (long t = 0; t < d.bat[z(b)].kv_len; ++t) {
        const long r = d.place(b, t);
        auto& bk = d.bat[z(b)].k;
        if (std::isnan(static_cast<float>(d.k[z(r * 512)]))) continue;  // poison: stays 0xFF
        i8* row = k.data() + r * 656;
        float scale[4];
        for (float& s : scale) s = us(rng);
        for (int x = 0; x < 512; ++x) {
          row[x] = static_cast<i8>(ui(rng));
          const T v = T(static_cast<float>(row[x]) * scale[x / 128]);
          kd[z(r * 512 + x)] = v;
          bk[z(t * 512 + x)] = support::dbl(v);
        }
        std::memcpy(row + 512, d.kr.data() + r * 64, 64 * sizeof(T));
        std::memcpy(row + 640, scale, sizeof(scale));
      }
    for (auto& x : d.bat) x.v = x.k;
    q.assign(z(long{d.rows} * c.N1 * 576), T(NAN));
    for (long e = 0; e < long{d.rows} * c.N1; ++e) {
      std::copy(d.q.begin() + e * 512, d.q.begin() + (e + 1) * 512, q.begin() + e * 576);
      std::copy(d.qr.begin() + e * 64, d.qr.begin() + (e + 1) * 64, q.begin() + e * 576 + 512);
    }
    p.scale_value = c.scale, p.sparse_block_size = c.sbs, p.layout_query = c.lq;
    p.layout_kv = c.lkv, p.sparse_mode = c.causal ? 3 : 0, p.strict = c.strict;
    in.query = {q.data(), d.qshape(576)};
    in.key = {k.data(), d.kshape(656)};
    std::vector<long> is = d.qshape(static_cast<int>(c.K));
    is[is.size() - 2] = 1;
    in.sparse_indices = {d.idx.data(), is};
    if (c.lkv == "PA_BSND") in.block_table = {d.bt.data(), {d.B, d.maxb}};
    in.actual_seq_lengths_query = d.aq, in.actual_seq_lengths_kv = d.akv;
    oshape = d.qshape(512);
    out.assign(z(long{d.rows} * c.N1 * 512), T(-7.0f));
  }
  void run(int threads = 0) {
    attnref::ExecConfig x;
    x.threads = threads;
    attnref::kv_quant_sparse_flash_attention(p, in, {{out.data(), oshape}}, x);
  }
};

Case base(const std::string& lq, const std::string& lkv, long sbs, bool causal) {
  Case c;
  c.lq = lq, c.lkv = lkv, c.sbs = sbs, c.causal = causal, c.N1 = 4, c.K = 6, c.bs = 32;
  c.qlen = {3, 1, 4}, c.kvlen = {45, 7, 70};
  if (lq == "BSND") c.S1 = 5;
  if (lkv == "BSND") c.S2 = 72;
  c.seed = static_cast<unsigned>(sbs * 3 + causal + lq.size() * 5 + lkv.size());
  return c;
}

TEST(DsaKvQuant, MatchesTheReferenceOverTheDequantizedCache) {
  for (const char* lq : {"BSND", "TND"})
    for (const char* lkv : {"SAME", "PA_BSND"})
      for (long sbs : {1L, 4L, 16L}) {
        const std::string kv = std::string(lkv) == "SAME" ? lq : lkv;
        Case c = base(lq, kv, sbs, sbs != 4);
        if (sbs == 16) c.K = 4;
        Kvq<bfloat16> x(c, 0.2);
        x.run();
        SCOPED_TRACE(std::string(lq) + " / " + kv + " sbs " + std::to_string(sbs));
        EXPECT_TRUE(support::all_close(x.d.sfa_expected(), support::as_doubles(x.out),
                                       support::tolerance(support::Kind::BF16)));
      }
  Kvq<half> h(base("TND", "PA_BSND", 2, true));
  h.run();
  EXPECT_TRUE(support::all_close(h.d.sfa_expected(), support::as_doubles(h.out),
                                 support::tolerance(support::Kind::F16)));
}

TEST(DsaKvQuant, IsSparseAttentionOverTheDequantizedCacheBitForBitAndThreadsAgree) {
  Kvq<bfloat16> x(base("TND", "PA_BSND", 4, true), 0.2);
  x.run(1);
  attnref::SparseFlashAttentionParams sp;
  sp.scale_value = x.p.scale_value, sp.sparse_block_size = 4, sp.layout_query = "TND";
  sp.layout_kv = "PA_BSND";
  attnref::SparseFlashAttentionInputs<bfloat16> si;
  si.query = {x.d.q.data(), x.d.qshape(512)};
  si.query_rope = {x.d.qr.data(), x.d.qshape(64)};
  si.key = {x.kd.data(), x.d.kshape(512)};
  si.key_rope = {x.d.kr.data(), x.d.kshape(64)};
  si.sparse_indices = x.in.sparse_indices, si.block_table = x.in.block_table;
  si.actual_seq_lengths_query = x.d.aq, si.actual_seq_lengths_kv = x.d.akv;
  std::vector<bfloat16> o(x.out.size(), bfloat16(0.0f));
  attnref::sparse_flash_attention(sp, si, {{o.data(), x.oshape}});
  EXPECT_TRUE(support::bitwise_equal(support::as_floats(o), support::as_floats(x.out)));
  std::vector<bfloat16> one = x.out;
  x.run(2);
  EXPECT_TRUE(support::bitwise_equal(support::as_floats(one), support::as_floats(x.out)));
  // value and the reserved scales are never read: any contents, the same bits.
  std::vector<i8> junk(x.k.size(), i8(3));
  std::vector<float> sc(16, NAN);
  x.in.value = {junk.data(), x.in.key.shape()};
  x.in.key_dequant_scale = {sc.data(), {16}};
  x.in.value_dequant_scale = {sc.data(), {16}};
  x.run(1);
  EXPECT_TRUE(support::bitwise_equal(support::as_floats(one), support::as_floats(x.out)));
}

TEST(DsaKvQuant, EveryRuleRejectsByNameAndWritesNothing) {
  auto expect = [](auto edit, const std::string& frag, bool oor = false) {
    Kvq<bfloat16> x(base("TND", "PA_BSND", 4, true));
    edit(x);
    SCOPED_TRACE(frag);
    support::expect_throw([&] { x.run(); }, frag, oor);
    for (const bfloat16& v : x.out) ASSERT_EQ(support::dbl(v), -7.0);
  };
  using X = Kvq<bfloat16>;
  expect([](X& x) { x.p.key_quant_mode = 1; }, "key_quant_mode");
  expect([](X& x) { x.p.sparse_block_size = 32; }, "params.sparse_block_size");
  expect([](X& x) { x.p.attention_mode = 0; }, "params.attention_mode");
  expect([](X& x) { x.p.tile_size = 64; }, "row width");  // 8 scales: 672 bytes
  expect([](X& x) { x.in.key = {x.k.data(), {x.d.nb, 32, 1, 640}}; }, "key.shape");
  expect([](X& x) { x.oshape.back() = 576; }, "attention_out.shape");
  expect(
      [](X& x) {
        x.in.sparse_indices = {x.d.idx.data(), {x.d.rows, 2, 3}};
      },
      "sparse_indices.shape");
  expect([](X& x) { x.d.idx[0] = 999; }, "sparse_indices[0][0][0]", true);
  expect([](X& x) { x.d.bt[0] = -1; }, "block_table[0][0]", true);
  expect([](X& x) { x.in.value = {nullptr, {4, 4}}; }, "value");
}

}  // namespace dsa_kv_quant_test
