// FusedInferAttentionScore's GQA antiquant over NZ caches (V4): a bf16 query, int8 key / value
// caches [blockNum, KV_N, D / 32, blockSize, 32] read through a shuffled block table, the
// separate scales per channel or per token. Against the independent reference
// (tests/reference/cann_flash_attention.hpp) on K / V this test dequantizes from its own ND
// copy: one query row (IncreFlashAttention's semantics) and MTP rows under sparse_mode 3
// (bottom-right causal over each batch's kv length, rows without a key 0), in BSH, BSND and BNSD,
// a batch without keys, unused blocks full of other values; one and two threads give the same
// bits; every rule's rejection leaves the output untouched.

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/cann/fused_infer_attention_score.hpp>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cann/fia_support.hpp"
#include "cann/flash_attention_support.hpp"
#include "reference/cann_flash_attention.hpp"
#include "support/cast.hpp"
#include "support/errors.hpp"

namespace fia_gqa_nz_test {

using namespace flash_attention_support;
using attnref::FusedInferAttentionScoreInputs;
using attnref::FusedInferAttentionScoreOutputs;
using attnref::FusedInferAttentionScoreParams;
using bf = attnref::bfloat16;

constexpr int kD = 128;

struct Case {
  std::string layout = "BSND";
  int N = 10, kvn = 1, qs = 1, bs = 128;
  std::vector<int> L{300, 0, 129};
  int mode = 0;  // 0 per channel, 1 per token
  unsigned seed = 1;
  int B() const { return static_cast<int>(L.size()); }
};

struct Built {
  Case c;
  int nb = 0, maxb = 0;
  std::vector<bf> q;
  std::vector<i8> kc, vc;           // the NZ caches
  std::vector<std::int32_t> table;  // [B, maxb], -1 past each sequence's blocks
  std::vector<float> ks, vs;        // the scales
  Shape sshape;
  std::vector<u8> mask;
  Seqs rq, rk, rv;  // the reference's rows (K / V dequantized)

  explicit Built(const Case& cs) : c(cs) {
    std::mt19937 rng(c.seed);
    std::normal_distribution<double> nd;
    std::uniform_int_distribution<int> ui(-127, 127);
    for (int l : c.L) maxb = std::max(maxb, (l + c.bs - 1) / c.bs), nb += (l + c.bs - 1) / c.bs;
    maxb += 1;
    nb += 2;  // blocks no sequence uses
    std::vector<std::int32_t> ids(z(nb));
    for (int i = 0; i < nb; ++i) ids[z(i)] = i;
    std::shuffle(ids.begin(), ids.end(), rng);
    table.assign(z(c.B() * maxb), -1);
    size_t next = 0;
    for (int b = 0; b < c.B(); ++b)
      for (int j = 0; j * c.bs < c.L[z(b)]; ++j) table[z(b * maxb + j)] = ids[next++];
    kc.resize(z(nb * c.kvn * kD * c.bs));
    vc.resize(kc.size());
    for (auto& x : kc) x = i8(ui(rng));
    for (auto& x : vc) x = i8(ui(rng));
    const int cols = maxb * c.bs;
    const int nmap = c.mode == 0 ? c.kvn * kD : c.B() * cols;
    for (int i = 0; i < nmap; ++i) {
      ks.push_back(static_cast<float>(0.002 + 0.01 * hv(c.seed + 3, i, 0, 0)));
      vs.push_back(static_cast<float>(0.002 + 0.01 * hv(c.seed + 4, i, 0, 0)));
    }
    sshape = c.mode == 1          ? shp(c.B(), cols)
             : c.layout == "BSH"  ? shp(c.kvn * kD)
             : c.layout == "BSND" ? shp(c.kvn, kD)
                                  : shp(c.kvn, 1, kD);
    const int rows = c.B() * c.qs * c.N * kD;
    for (int i = 0; i < rows; ++i) q.push_back(bf(static_cast<float>(nd(rng))));
    if (c.qs > 1) {
      mask.assign(2048 * 2048, 0);
      for (int i = 0; i < 2048; ++i)
        for (int j = i + 1; j < 2048; ++j) mask[z(i * 2048 + j)] = 1;
    }
    // The reference's rows: query (b, i, h) from the layout, K / V from the NZ order.
    rq.resize(z(c.B())), rk.resize(z(c.B())), rv.resize(z(c.B()));
    for (int b = 0; b < c.B(); ++b) {
      for (int i = 0; i < c.qs; ++i)
        for (int h = 0; h < c.N; ++h)
          for (int d = 0; d < kD; ++d) rq[z(b)].push_back(dbl(q[qat(b, i, h, d)]));
      for (int t = 0; t < c.L[z(b)]; ++t) {
        const int blk = table[z(b * maxb + t / c.bs)];
        for (int h = 0; h < c.kvn; ++h)
          for (int d = 0; d < kD; ++d) {
            const size_t at =
                z((((blk * c.kvn + h) * (kD / 32) + d / 32) * c.bs + t % c.bs) * 32 + d % 32);
            const size_t m = c.mode == 0 ? z(h * kD + d) : z(b * cols + t);
            rk[z(b)].push_back(kc[at] * double(ks[m]));
            rv[z(b)].push_back(vc[at] * double(vs[m]));
          }
      }
    }
  }
  size_t qat(int b, int i, int h, int d) const {
    if (c.layout == "BNSD") return z(((b * c.N + h) * c.qs + i) * kD + d);
    return z(((b * c.qs + i) * c.N + h) * kD + d);
  }
  Shape qshape() const {
    if (c.layout == "BSH") return shp(c.B(), c.qs, c.N * kD);
    if (c.layout == "BSND") return shp(c.B(), c.qs, c.N, kD);
    return shp(c.B(), c.N, c.qs, kD);
  }
};

struct Call {
  FusedInferAttentionScoreParams p;
  FusedInferAttentionScoreInputs<bf, i8> in;
};

Call call_of(const Built& r) {
  const Case& c = r.c;
  Call x;
  x.p.num_heads = c.N;
  x.p.num_key_value_heads = c.kvn;
  x.p.scale_value = 0.0884;
  x.p.input_layout = c.layout;
  x.p.sparse_mode = c.qs > 1 ? 3 : 0;
  x.p.block_size = c.bs;
  x.p.key_antiquant_mode = x.p.value_antiquant_mode = c.mode;
  x.in.query = {r.q.data(), r.qshape()};
  const Shape cs = shp(r.nb, c.kvn, kD / 32, c.bs, 32);
  x.in.key = {{r.kc.data(), cs}};
  x.in.value = {{r.vc.data(), cs}};
  x.in.block_table = {r.table.data(), shp(c.B(), r.maxb)};
  for (int l : c.L) x.in.actual_seq_lengths_kv.push_back(l);
  x.in.key_antiquant_scale = {r.ks.data(), r.sshape};
  x.in.value_antiquant_scale = {r.vs.data(), r.sshape};
  if (!r.mask.empty()) x.in.atten_mask = {r.mask.data(), shp(2048, 2048)};
  return x;
}

std::vector<bf> run(const Built& r, const Call& x, int threads = 0) {
  std::vector<bf> out(r.q.size(), bf(7.0f));
  attnref::fused_infer_attention_score(
      x.p, x.in, FusedInferAttentionScoreOutputs<bf>{{out.data(), r.qshape()}}, {threads});
  return out;
}

void check(const Case& c) {
  SCOPED_TRACE(c.layout + " N " + std::to_string(c.N) + " Q_S " + std::to_string(c.qs) + " mode " +
               std::to_string(c.mode));
  const Built r(c);
  const Call x = call_of(r);
  const auto out = run(r, x);
  Seqs want;
  if (c.qs == 1) {
    ref::cann::Ifa pr;
    pr.num_heads = c.N;
    pr.num_kv_heads = c.kvn;
    pr.head_size = kD;
    pr.kv_len = c.L;
    pr.scale = 0.0884;
    want = ref::cann::ifa(pr, r.rq, r.rk, r.rv);
  } else {
    ref::cann::Pfa pr;
    pr.num_heads = c.N;
    pr.num_kv_heads = c.kvn;
    pr.head_size = pr.v_head_size = kD;
    pr.q_len.assign(z(c.B()), c.qs);
    pr.kv_len = c.L;
    pr.scale = 0.0884;
    pr.sparse_mode = 3;
    want = ref::cann::pfa(pr, r.rq, r.rk, r.rv);
  }
  std::vector<double> w;
  std::vector<bf> g;
  for (int b = 0; b < c.B(); ++b)
    for (int i = 0; i < c.qs; ++i)
      for (int h = 0; h < c.N; ++h)
        for (int d = 0; d < kD; ++d) {
          w.push_back(want[z(b)][z((i * c.N + h) * kD + d)]);
          g.push_back(out[r.qat(b, i, h, d)]);
        }
  EXPECT_TRUE(matches(w, g));
  const auto o1 = run(r, x, 1), o2 = run(r, x, 2);
  EXPECT_EQ(std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(bf)), 0)
      << "thread count changed the bits";
}

TEST(FiaGqaNz, MatchesReference) {
  unsigned seed = 1;
  for (const std::string lay : {"BSH", "BSND", "BNSD"})
    for (int qs : {1, 3})
      for (int mode : {0, 1}) {
        Case c;
        c.layout = lay;
        c.qs = qs;
        c.mode = mode;
        c.L = qs == 1 ? std::vector<int>{300, 0, 129} : std::vector<int>{300, 2, 129};
        c.seed = seed++;
        check(c);
      }
  Case g;  // 64 query heads on 8 kv heads, 512-token blocks, MTP 16
  g.N = 64;
  g.kvn = 8;
  g.bs = 512;
  g.qs = 16;
  g.L = {600, 9};
  g.seed = 40;
  check(g);
}

TEST(FiaGqaNz, Rejections) {
  Case c;
  c.qs = 3;
  c.L = {300, 2, 129};
  const Built r(c);
  const auto rejected = [&](const std::function<void(Call&)>& edit, const std::string& frag,
                            bool index = false) {
    Call x = call_of(r);
    edit(x);
    if (index)
      fia_support::expect_rejected<bf, std::out_of_range>(x, r.qshape(), frag);
    else
      fia_support::expect_rejected<bf>(x, r.qshape(), frag);
  };
  rejected([](Call& x) { x.p.num_heads = 20; }, "not a head pair supported");
  rejected([](Call& x) { x.p.input_layout = "BNSD_BSND"; }, "params.input_layout");
  rejected([](Call& x) { x.p.sparse_mode = 0; }, "params.sparse_mode not supported");
  rejected([](Call& x) { x.in.atten_mask = {}; }, "atten_mask required");
  rejected([](Call& x) { x.p.inner_precise = 0; }, "params.inner_precise");
  rejected(
      [&](Call& x) {
        x.in.atten_mask = {r.mask.data(), shp(1, 2048, 2048)};
      },
      "atten_mask.shape");
  rejected([](Call& x) { x.in.block_table = {}; }, "block_table missing");
  rejected([](Call& x) { x.p.block_size = 256; }, "not the NZ cache's block size");
  rejected([](Call& x) { x.p.value_antiquant_mode = 1; }, "params.key_antiquant_mode");
  rejected([](Call& x) { x.in.value_antiquant_scale = {}; }, "missing");
  rejected([](Call& x) { x.in.key_antiquant_offset = x.in.key_antiquant_scale; },
           "key_antiquant_offset / value_antiquant_offset");
  rejected([](Call& x) { x.p.softmax_lse_flag = true; }, "params.softmax_lse_flag");
  rejected([](Call& x) { x.in.actual_seq_lengths_kv.clear(); }, "actual_seq_lengths_kv");
  rejected([](Call& x) { x.in.actual_seq_lengths_kv = {300, 2, 600}; }, "actual_seq_lengths_kv");
  std::vector<float> wide(z(2 * c.kvn * kD), 0.01f);
  rejected(
      [&](Call& x) {
        x.in.key_antiquant_scale = {wide.data(), shp(1, c.kvn, kD)};
      },
      "not the NZ cache's scale shape");
  rejected(
      [&](Call& x) {
        x.in.key[0] = {r.kc.data(), shp(r.nb, c.kvn, kD / 32, 64, 64)};
      },
      "key[0].shape");
  std::vector<std::int32_t> bad = r.table;
  bad[1] = r.nb;  // batch 0's second block
  rejected(
      [&](Call& x) {
        x.in.block_table = {bad.data(), shp(c.B(), r.maxb)};
      },
      "block_table[0][1]", true);
  // A bf16 query is the only one: fp16 is rejected by name.
  std::vector<half> qh(r.q.size(), half(0.5f));
  FusedInferAttentionScoreInputs<half, i8> hin;
  const Call x = call_of(r);
  hin.query = {qh.data(), r.qshape()};
  hin.key = x.in.key;
  hin.value = x.in.value;
  hin.block_table = x.in.block_table;
  hin.actual_seq_lengths_kv = x.in.actual_seq_lengths_kv;
  hin.key_antiquant_scale = x.in.key_antiquant_scale;
  hin.value_antiquant_scale = x.in.value_antiquant_scale;
  hin.atten_mask = x.in.atten_mask;
  std::vector<half> ho(qh.size(), half(7.0f));
  support::expect_rejected_by(
      [&] {
        attnref::fused_infer_attention_score(
            x.p, hin, FusedInferAttentionScoreOutputs<half>{{ho.data(), r.qshape()}});
      },
      "fused_infer_attention_score", {"query not bf16"});
}

}  // namespace fia_gqa_nz_test
