// FusedInferAttentionScore's separate K / V antiquant with Q_S > 1 (the prompt branch): int8
// key / value with a bf16 query, per channel or per token, with offsets, against the
// independent reference on K / V dequantized here (tests/reference/cann_flash_attention.hpp), in
// BSH, BSND, BNSD and BNSD_BSND, sparse modes 0, 3 and 4, GQA, padded query rows, a batch
// without keys and rows without a visible key (0 with a value offset too); softmax_lse; thread
// counts give the same bits; every rule's rejection leaves the output untouched.

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/cann/fused_infer_attention_score.hpp>
#include <cmath>
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

namespace fia_prompt_aq_test {

using namespace flash_attention_support;
using attnref::FusedInferAttentionScoreInputs;
using attnref::FusedInferAttentionScoreOutputs;
using attnref::FusedInferAttentionScoreParams;
using bf = attnref::bfloat16;

struct Case {
  std::string layout = "BSND";
  std::vector<int> L{37, 0, 2};  // kv lengths; S2 = 40
  std::vector<int> Q{5, 3, 5};   // query rows; S1 = 5
  int mode = 0;                  // 0 per channel, 1 per token
  int sparse = 0;                // 0 (no mask), 3, 4 (pre 10, next 2)
  int shape = 0;                 // mode 0: (KV_N, D), (KV_N, 1, D), (KV_N·D)
  int N = 4, kvn = 2, D = 64, S1 = 5, S2 = 40;
  bool half_maps = false;  // scales and offsets exact in fp16 (the combined scales' type)
  unsigned seed = 1;
  int B() const { return static_cast<int>(L.size()); }
};

struct Built {
  Case c;
  Seqs q, k, v;  // the reference's rows (K / V dequantized)
  std::vector<bf> qb;
  std::vector<i8> kb, vb;
  std::vector<float> sc[2], off[2];
  Shape sshape;
  std::vector<u8> mask;
};

bool bnsd(const Case& c) { return c.layout == "BNSD" || c.layout == "BNSD_BSND"; }

// The map of side (0 key, 1 value) for batch b, key j, channel ch = kv head · D + d.
size_t map_at(const Case& c, int b, int j, int ch) { return c.mode == 0 ? z(ch) : z(b * c.S2 + j); }

Built build(const Case& c) {
  Built r;
  r.c = c;
  const int B = c.B(), N = c.N, KVN = c.kvn, D = c.D;
  std::mt19937 rng(c.seed);
  std::normal_distribution<double> nd;
  std::uniform_int_distribution<int> ui(-100, 100);
  const int nmap = c.mode == 0 ? KVN * D : B * c.S2;
  for (int side = 0; side < 2; ++side)
    for (int i = 0; i < nmap; ++i) {
      const float x = static_cast<float>(0.004 + 0.02 * hv(c.seed + 3 + side, i, 0, 1));
      r.sc[side].push_back(c.half_maps ? static_cast<float>(half(x)) : x);
      r.off[side].push_back(std::round(static_cast<float>(8 * hv(c.seed + 5 + side, i, 0, 1)) - 4));
    }
  r.sshape = c.mode == 1    ? shp(B, c.S2)
             : c.shape == 0 ? shp(KVN, D)
             : c.shape == 1 ? shp(KVN, 1, D)
                            : shp(KVN * D);
  r.qb.resize(z(B * c.S1 * N * D), bf(0.0f));
  r.kb.resize(z(B * c.S2 * KVN * D));
  r.vb.resize(r.kb.size());
  r.q.resize(z(B));
  r.k.resize(z(B));
  r.v.resize(z(B));
  for (int b = 0; b < B; ++b) {
    for (int i = 0; i < c.S1; ++i)
      for (int h = 0; h < N; ++h)
        for (int d = 0; d < D; ++d) {
          const bf x = bf(static_cast<float>(nd(rng)));
          const size_t at =
              bnsd(c) ? z(((b * N + h) * c.S1 + i) * D + d) : z(((b * c.S1 + i) * N + h) * D + d);
          r.qb[at] = x;
          if (i < c.Q[z(b)]) r.q[z(b)].push_back(dbl(x));
        }
    for (int j = 0; j < c.S2; ++j)
      for (int h = 0; h < KVN; ++h)
        for (int d = 0; d < D; ++d) {
          const size_t at = bnsd(c) ? z(((b * KVN + h) * c.S2 + j) * D + d)
                                    : z(((b * c.S2 + j) * KVN + h) * D + d);
          r.kb[at] = i8(ui(rng));
          r.vb[at] = i8(ui(rng));
          if (j >= c.L[z(b)]) continue;
          const size_t m = map_at(c, b, j, h * D + d);
          r.k[z(b)].push_back((r.kb[at] + double(r.off[0][m])) * r.sc[0][m]);
          r.v[z(b)].push_back((r.vb[at] + double(r.off[1][m])) * r.sc[1][m]);
        }
  }
  if (c.sparse != 0) {
    r.mask.assign(2048 * 2048, 0);
    for (int i = 0; i < 2048; ++i)
      for (int j = i + 1; j < 2048; ++j) r.mask[z(i * 2048 + j)] = 1;
  }
  return r;
}

struct Call {
  FusedInferAttentionScoreParams p;
  FusedInferAttentionScoreInputs<bf, i8> in;
  Shape oshape;
};

Call call_of(const Built& r) {
  const Case& c = r.c;
  Call x;
  const int B = c.B(), N = c.N, KVN = c.kvn, D = c.D;
  x.p.num_heads = N;
  x.p.num_key_value_heads = KVN;
  x.p.scale_value = 0.125;
  x.p.input_layout = c.layout;
  x.p.sparse_mode = c.sparse;
  x.p.pre_tokens = 10;
  x.p.next_tokens = 2;
  x.p.key_antiquant_mode = x.p.value_antiquant_mode = c.mode;
  const Shape qs = c.layout == "BSH"    ? shp(B, c.S1, N * D)
                   : c.layout == "BSND" ? shp(B, c.S1, N, D)
                                        : shp(B, N, c.S1, D);
  const Shape ks = c.layout == "BSH"    ? shp(B, c.S2, KVN * D)
                   : c.layout == "BSND" ? shp(B, c.S2, KVN, D)
                                        : shp(B, KVN, c.S2, D);
  x.oshape = c.layout == "BNSD_BSND" ? shp(B, c.S1, N, D) : qs;
  x.in.query = {r.qb.data(), qs};
  x.in.key = {{r.kb.data(), ks}};
  x.in.value = {{r.vb.data(), ks}};
  for (int q : c.Q) x.in.actual_seq_lengths.push_back(q);
  for (int l : c.L) x.in.actual_seq_lengths_kv.push_back(l);
  x.in.key_antiquant_scale = {r.sc[0].data(), r.sshape};
  x.in.key_antiquant_offset = {r.off[0].data(), r.sshape};
  x.in.value_antiquant_scale = {r.sc[1].data(), r.sshape};
  x.in.value_antiquant_offset = {r.off[1].data(), r.sshape};
  if (!r.mask.empty()) x.in.atten_mask = {r.mask.data(), shp(2048, 2048)};
  return x;
}

std::vector<bf> run(const Call& x, std::vector<float>* lse = nullptr, int threads = 0) {
  Index n = 1;
  for (Index e : x.oshape) n *= e;
  std::vector<bf> out(z(n), bf(7.0f));
  FusedInferAttentionScoreOutputs<bf> o{{out.data(), x.oshape}};
  FusedInferAttentionScoreParams p = x.p;
  if (lse != nullptr) {
    p.softmax_lse_flag = true;
    lse->assign(z(x.oshape[0] * p.num_heads * 5), 7.0f);
    o.softmax_lse = {lse->data(), shp(x.oshape[0], p.num_heads, 5, 1)};
  }
  attnref::fused_infer_attention_score(p, x.in, o, {threads});
  return out;
}

// Output rows in (b, i, h) order (the output's layout: BSND-like except BNSD).
double out_at(const Case& c, const std::vector<bf>& o, int b, int i, int h, int d) {
  const bool head_major = c.layout == "BNSD";
  const size_t at = head_major ? z(((b * c.N + h) * c.S1 + i) * c.D + d)
                               : z(((b * c.S1 + i) * c.N + h) * c.D + d);
  return dbl(o[at]);
}

void check_case(const Case& c) {
  SCOPED_TRACE(c.layout + " mode " + std::to_string(c.mode) + " sparse " +
               std::to_string(c.sparse) + " shape " + std::to_string(c.shape));
  const Built r = build(c);
  const Call x = call_of(r);
  std::vector<float> lse;
  const auto out = run(x, c.layout == "BSND" ? &lse : nullptr);
  ref::cann::Pfa pr;
  pr.num_heads = c.N;
  pr.num_kv_heads = c.kvn;
  pr.head_size = pr.v_head_size = c.D;
  pr.q_len = c.Q;
  pr.kv_len = c.L;
  pr.scale = 0.125;
  pr.sparse_mode = c.sparse;
  pr.pre = 10;
  pr.next = 2;
  Seqs ref_lse;
  const Seqs want = ref::cann::pfa(pr, r.q, r.k, r.v, &ref_lse);
  std::vector<double> w, g;
  bool pads_zero = true;
  for (int b = 0; b < c.B(); ++b)
    for (int i = 0; i < c.S1; ++i)
      for (int h = 0; h < c.N; ++h)
        for (int d = 0; d < c.D; ++d) {
          const double o = out_at(c, out, b, i, h, d);
          if (i >= c.Q[z(b)]) {
            pads_zero = pads_zero && o == 0.0;
            continue;
          }
          w.push_back(want[z(b)][z((i * c.N + h) * c.D + d)]);
          g.push_back(o);
        }
  EXPECT_TRUE(pads_zero) << "padded query rows are not 0";
  std::vector<bf> gb;
  for (double v : g) gb.push_back(bf(static_cast<float>(v)));
  EXPECT_TRUE(matches(w, gb));
  if (!lse.empty())
    for (int b = 0; b < c.B(); ++b)
      for (int h = 0; h < c.N; ++h)
        for (int i = 0; i < c.Q[z(b)]; ++i) {
          const double wl = ref_lse[z(b)][z(h * c.Q[z(b)] + i)];
          const float gl = lse[z((b * c.N + h) * c.S1 + i)];
          EXPECT_TRUE(std::isinf(wl) ? gl == INFINITY
                                     : std::abs(gl - wl) <= 1e-4 + 2e-5 * std::abs(wl))
              << "lse (" << b << ", " << h << ", " << i << ") = " << gl << ", want " << wl;
        }
  const auto o1 = run(x, nullptr, 1), o2 = run(x, nullptr, 2);
  EXPECT_EQ(std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(bf)), 0)
      << "thread count changed the bits";
}

TEST(FiaPromptAntiquant, MatchesReference) {
  unsigned seed = 1;
  for (const std::string lay : {"BSH", "BSND", "BNSD", "BNSD_BSND"})
    for (int mode : {0, 1})
      for (int sparse : {0, 3, 4}) {
        Case c;
        c.layout = lay;
        c.mode = mode;
        c.sparse = sparse;
        c.shape = static_cast<int>(seed % 3);
        c.seed = seed++;
        check_case(c);
      }
}

// The combined antiquant_scale with Q_S > 1 (fp16 query): per channel in the layout's shape or
// per tensor (2), with offsets, Q_S 20 (no limit), causal, against the reference.
TEST(FiaPromptAntiquant, CombinedScalesMatchReference) {
  unsigned seed = 90;
  for (const std::string lay : {"BSH", "BSND", "BNSD", "BNSD_BSND"})
    for (bool per_tensor : {false, true}) {
      Case c;
      c.layout = lay;
      c.half_maps = true;
      c.S1 = 20;
      c.Q = {20, 7, 20};
      c.sparse = 3;
      c.seed = seed++;
      SCOPED_TRACE(lay + (per_tensor ? " per tensor" : " per channel"));
      Built r = build(c);
      const int B = c.B(), KVN = c.kvn, D = c.D;
      if (per_tensor) {  // one value per side: the maps and the reference's K / V again
        for (int side = 0; side < 2; ++side) {
          std::fill(r.sc[side].begin(), r.sc[side].end(), r.sc[side][0]);
          std::fill(r.off[side].begin(), r.off[side].end(), r.off[side][0]);
        }
        for (int b = 0; b < B; ++b) {
          r.k[z(b)].clear(), r.v[z(b)].clear();
          for (int j = 0; j < c.L[z(b)]; ++j)
            for (int h = 0; h < KVN; ++h)
              for (int d = 0; d < D; ++d) {
                const size_t at = bnsd(c) ? z(((b * KVN + h) * c.S2 + j) * D + d)
                                          : z(((b * c.S2 + j) * KVN + h) * D + d);
                r.k[z(b)].push_back((r.kb[at] + double(r.off[0][0])) * r.sc[0][0]);
                r.v[z(b)].push_back((r.vb[at] + double(r.off[1][0])) * r.sc[1][0]);
              }
        }
      }
      const Call x = call_of(r);
      std::vector<half> qh, sc, off;
      for (const bf& v : r.qb) qh.push_back(half(static_cast<float>(v)));
      for (int side = 0; side < 2; ++side)
        for (int i = 0; i < (per_tensor ? 1 : KVN * D); ++i) {
          sc.push_back(half(r.sc[side][z(i)]));
          off.push_back(half(r.off[side][z(i)]));
        }
      const Shape ss = per_tensor      ? shp(2)
                       : lay == "BSH"  ? shp(2, KVN * D)
                       : lay == "BSND" ? shp(2, KVN, D)
                                       : shp(2, KVN, 1, D);
      FusedInferAttentionScoreInputs<half, i8> in;
      in.query = {qh.data(), x.in.query.shape()};
      in.key = x.in.key;
      in.value = x.in.value;
      in.atten_mask = x.in.atten_mask;
      in.actual_seq_lengths = x.in.actual_seq_lengths;
      in.actual_seq_lengths_kv = x.in.actual_seq_lengths_kv;
      in.antiquant_scale = {sc.data(), ss};
      in.antiquant_offset = {off.data(), ss};
      FusedInferAttentionScoreParams p = x.p;
      p.key_antiquant_mode = p.value_antiquant_mode = 0;
      std::vector<half> out(qh.size(), half(7.0f));
      attnref::fused_infer_attention_score(
          p, in, FusedInferAttentionScoreOutputs<half>{{out.data(), x.oshape}});
      ref::cann::Pfa pr;
      pr.num_heads = c.N;
      pr.num_kv_heads = KVN;
      pr.head_size = pr.v_head_size = D;
      pr.q_len = c.Q;
      pr.kv_len = c.L;
      pr.scale = 0.125;
      pr.sparse_mode = 3;
      Seqs q(z(B));  // the fp16 query as the call holds it
      for (int b = 0; b < B; ++b)
        for (const double v : r.q[z(b)]) q[z(b)].push_back(dbl(half(static_cast<float>(v))));
      const Seqs want = ref::cann::pfa(pr, q, r.k, r.v);
      std::vector<double> w;
      std::vector<half> g;
      for (int b = 0; b < B; ++b)
        for (int i = 0; i < c.Q[z(b)]; ++i)
          for (int h = 0; h < c.N; ++h)
            for (int d = 0; d < D; ++d) {
              w.push_back(want[z(b)][z((i * c.N + h) * D + d)]);
              const size_t at = lay == "BNSD" ? z(((b * c.N + h) * c.S1 + i) * D + d)
                                              : z(((b * c.S1 + i) * c.N + h) * D + d);
              g.push_back(out[at]);
            }
      EXPECT_TRUE(matches(w, g));
    }
}

// The combined scales with a shared prefix (int8, read with the same maps) == the prefix rows
// stored in front of every sequence's keys, bit for bit (output and lse), per channel in BSND
// and BNSD, causal; a batch with no keys of its own attends to the prefix alone.
TEST(FiaPromptAntiquant, CombinedScalesWithPrefixEqualConcatenation) {
  for (const std::string lay : {"BSND", "BNSD"}) {
    SCOPED_TRACE(lay);
    Case c;
    c.layout = lay;
    c.half_maps = true;
    c.sparse = 3;
    c.seed = 70;
    const Built r = build(c);
    const int B = c.B(), KVN = c.kvn, D = c.D, P = 11, Ps = 13;
    std::mt19937 rng(71);
    std::uniform_int_distribution<int> ui(-100, 100);
    std::vector<i8> pk(z(Ps * KVN * D)), pv(pk.size());  // [1, Ps, KV_N, D] or [1, KV_N, Ps, D]
    for (auto& x : pk) x = i8(ui(rng));
    for (auto& x : pv) x = i8(ui(rng));
    const bool hm = bnsd(c);
    auto pat = [&](int t, int h, int d) {
      return hm ? z((h * Ps + t) * D + d) : z((t * KVN + h) * D + d);
    };
    // The concatenation: [B, P + S2, ...] with the prefix rows first.
    const int S = P + c.S2;
    std::vector<i8> ck(z(B * S * KVN * D)), cv(ck.size());
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < S; ++t)
        for (int h = 0; h < KVN; ++h)
          for (int d = 0; d < D; ++d) {
            const size_t to =
                hm ? z(((b * KVN + h) * S + t) * D + d) : z(((b * S + t) * KVN + h) * D + d);
            const size_t from = hm ? z(((b * KVN + h) * c.S2 + t - P) * D + d)
                                   : z(((b * c.S2 + t - P) * KVN + h) * D + d);
            ck[to] = t < P ? pk[pat(t, h, d)] : r.kb[from];
            cv[to] = t < P ? pv[pat(t, h, d)] : r.vb[from];
          }
    const Call x = call_of(r);
    std::vector<half> qh, sc, off;
    for (const bf& v : r.qb) qh.push_back(half(static_cast<float>(v)));
    for (int side = 0; side < 2; ++side)
      for (int i = 0; i < KVN * D; ++i) {
        sc.push_back(half(r.sc[side][z(i)]));
        off.push_back(half(r.off[side][z(i)]));
      }
    const Shape ss = lay == "BSND" ? shp(2, KVN, D) : shp(2, KVN, 1, D);
    FusedInferAttentionScoreInputs<half, i8> in;
    in.query = {qh.data(), x.in.query.shape()};
    in.atten_mask = x.in.atten_mask;
    in.actual_seq_lengths = x.in.actual_seq_lengths;
    in.antiquant_scale = {sc.data(), ss};
    in.antiquant_offset = {off.data(), ss};
    FusedInferAttentionScoreParams p = x.p;
    p.key_antiquant_mode = p.value_antiquant_mode = 0;
    p.softmax_lse_flag = true;
    auto run_one = [&](const FusedInferAttentionScoreInputs<half, i8>& call, std::vector<half>& o,
                       std::vector<float>& lse) {
      o.assign(qh.size(), half(7.0f));
      lse.assign(z(B * c.N * c.S1), 7.0f);
      attnref::fused_infer_attention_score(
          p, call,
          FusedInferAttentionScoreOutputs<half>{{o.data(), x.oshape},
                                                {lse.data(), shp(B, c.N, c.S1, 1)}});
    };
    auto with = in;
    with.key = x.in.key;
    with.value = x.in.value;
    with.actual_seq_lengths_kv = x.in.actual_seq_lengths_kv;
    const Shape ps = hm ? shp(1, KVN, Ps, D) : shp(1, Ps, KVN, D);
    with.key_shared_prefix = {pk.data(), ps};
    with.value_shared_prefix = {pv.data(), ps};
    with.actual_shared_prefix_len = {P};
    auto cat = in;
    const Shape cs = hm ? shp(B, KVN, S, D) : shp(B, S, KVN, D);
    cat.key = {{ck.data(), cs}};
    cat.value = {{cv.data(), cs}};
    for (int l : c.L) cat.actual_seq_lengths_kv.push_back(l + P);
    std::vector<half> o1, o2;
    std::vector<float> l1, l2;
    run_one(with, o1, l1);
    run_one(cat, o2, l2);
    EXPECT_EQ(std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(half)), 0)
        << "the prefix differs from its concatenation";
    EXPECT_EQ(std::memcmp(l1.data(), l2.data(), l1.size() * sizeof(float)), 0) << "lse differs";
    EXPECT_FALSE(std::all_of(o1.begin(), o1.end(), [](half v) { return dbl(v) == 0.0; }));
  }
}

// The paged form (the vendor's PA per-channel antiquant: fp16 query, Q_S > 16, BSH / BSND, the
// separate scales (1, KV_N·D) / (1, KV_N, D) with offsets, sparse 3) == the same maps as the
// combined scales over contiguous K / V, bit for bit; the blocks shuffled, -1 past each sequence.
TEST(FiaPromptAntiquant, PagedSeparateScalesEqualContiguousCombined) {
  for (const std::string lay : {"BSH", "BSND"}) {
    SCOPED_TRACE(lay);
    Case c;
    c.layout = lay;
    c.half_maps = true;
    c.sparse = 3;
    c.S1 = 20;
    c.Q = {20, 7, 20};
    c.S2 = 300;
    c.L = {300, 0, 129};
    c.seed = 80;
    const Built r = build(c);
    const int B = c.B(), KVN = c.kvn, D = c.D, W = KVN * D, bs = 128;
    const Call x = call_of(r);
    std::vector<half> qh, sc, off;
    for (const bf& v : r.qb) qh.push_back(half(static_cast<float>(v)));
    for (int side = 0; side < 2; ++side)
      for (int i = 0; i < W; ++i) {
        sc.push_back(half(r.sc[side][z(i)]));
        off.push_back(half(r.off[side][z(i)]));
      }
    FusedInferAttentionScoreParams p = x.p;
    p.key_antiquant_mode = p.value_antiquant_mode = 0;
    p.softmax_lse_flag = true;
    FusedInferAttentionScoreInputs<half, i8> in;
    in.query = {qh.data(), x.in.query.shape()};
    in.atten_mask = x.in.atten_mask;
    in.actual_seq_lengths = x.in.actual_seq_lengths;
    in.actual_seq_lengths_kv = x.in.actual_seq_lengths_kv;
    auto run_one = [&](const FusedInferAttentionScoreParams& pp,
                       const FusedInferAttentionScoreInputs<half, i8>& call, std::vector<half>& o,
                       std::vector<float>& lse, int threads) {
      o.assign(qh.size(), half(7.0f));
      lse.assign(z(B * c.N * c.S1), 7.0f);
      attnref::fused_infer_attention_score(
          pp, call,
          FusedInferAttentionScoreOutputs<half>{{o.data(), x.oshape},
                                                {lse.data(), shp(B, c.N, c.S1, 1)}},
          {threads});
    };
    // Contiguous, the combined scales per channel.
    auto flat = in;
    flat.key = x.in.key;
    flat.value = x.in.value;
    const Shape cs = lay == "BSH" ? shp(2, W) : shp(2, KVN, D);
    flat.antiquant_scale = {sc.data(), cs};
    flat.antiquant_offset = {off.data(), cs};
    // Paged: blocks of 128 tokens, shuffled.
    std::mt19937 rng(81);
    int nb = 0, maxb = 0;
    for (int l : c.L) nb += (l + bs - 1) / bs, maxb = std::max(maxb, (l + bs - 1) / bs);
    maxb += 1;
    nb += 1;
    std::vector<std::int32_t> ids(z(nb)), table(z(B * maxb), -1);
    for (int i = 0; i < nb; ++i) ids[z(i)] = i;
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<i8> kc(z(nb * bs * W), i8(-128)), vc(kc.size(), i8(-128));
    size_t next = 0;
    for (int b = 0; b < B; ++b)
      for (int j = 0; j * bs < c.L[z(b)]; ++j) {
        const int blk = ids[next++];
        table[z(b * maxb + j)] = blk;
        for (int t = j * bs; t < std::min(c.L[z(b)], (j + 1) * bs); ++t)
          for (int e = 0; e < W; ++e) {
            kc[z((blk * bs + t % bs) * W + e)] = r.kb[z((b * c.S2 + t) * W + e)];
            vc[z((blk * bs + t % bs) * W + e)] = r.vb[z((b * c.S2 + t) * W + e)];
          }
      }
    auto paged = in;
    paged.key = {{kc.data(), shp(nb, bs, W)}};
    paged.value = {{vc.data(), shp(nb, bs, W)}};
    paged.block_table = {table.data(), shp(B, maxb)};
    const Shape ss = lay == "BSH" ? shp(1, W) : shp(1, KVN, D);
    std::vector<float> vsc(sc.begin() + W, sc.end()), voff(off.begin() + W, off.end());
    std::vector<float> ksc(sc.begin(), sc.begin() + W), koff(off.begin(), off.begin() + W);
    paged.key_antiquant_scale = {ksc.data(), ss};
    paged.key_antiquant_offset = {koff.data(), ss};
    paged.value_antiquant_scale = {vsc.data(), ss};
    paged.value_antiquant_offset = {voff.data(), ss};
    FusedInferAttentionScoreParams pp = p;
    pp.block_size = bs;
    std::vector<half> o1, o2, o3;
    std::vector<float> l1, l2, l3;
    run_one(p, flat, o1, l1, 0);
    run_one(pp, paged, o2, l2, 1);
    run_one(pp, paged, o3, l3, 2);
    EXPECT_EQ(std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(half)), 0)
        << "paged separate scales differ from the contiguous combined ones";
    EXPECT_EQ(std::memcmp(l1.data(), l2.data(), l1.size() * sizeof(float)), 0) << "lse differs";
    EXPECT_EQ(std::memcmp(o2.data(), o3.data(), o2.size() * sizeof(half)), 0) << "threads";
    // The rules of the paged form, each rejected with the output untouched.
    struct X {
      FusedInferAttentionScoreParams p;
      FusedInferAttentionScoreInputs<half, i8> in;
    };
    const auto rejected = [&](const std::function<void(X&)>& edit, const std::string& frag) {
      X y{pp, paged};
      y.p.softmax_lse_flag = false;
      edit(y);
      fia_support::expect_rejected<half>(y, x.oshape, frag);
    };
    rejected([](X& y) { y.p.sparse_mode = 0, y.in.atten_mask = {}; }, "params.sparse_mode");
    rejected([](X& y) { y.p.inner_precise = 0; }, "params.inner_precise");
    rejected([&](X& y) { y.in.antiquant_scale = {sc.data(), cs}; }, "the separate scales alone");
    rejected(
        [&](X& y) {
          y.in.value_antiquant_scale = {vsc.data(), shp(KVN, D)};
        },
        "not the layout's shape with a paged cache");
    rejected([](X& y) { y.p.key_antiquant_mode = y.p.value_antiquant_mode = 1; },
             "params.key_antiquant_mode");
    if (lay == "BSND")  // Q_S <= 16
      rejected(
          [&](X& y) {
            y.in.query = {qh.data(), shp(B, 16, c.N, D)};
            y.in.actual_seq_lengths = {16, 7, 16};
          },
          "Q_S out of range");
  }
}

TEST(FiaPromptAntiquant, Rejections) {
  Case c;
  const Built r = build(c);
  const auto rejected = [&](const std::function<void(Call&)>& edit, const std::string& frag) {
    Call x = call_of(r);
    edit(x);
    fia_support::expect_rejected<bf>(x, x.oshape, frag);
  };
  std::vector<bf> q17(z(3 * 17 * c.N * c.D), bf(0.5f));
  rejected(
      [&](Call& x) {
        x.in.query = {q17.data(), shp(3, 17, c.N, c.D)};
        x.oshape = Shape(x.in.query.shape().begin(), x.in.query.shape().end());
      },
      "Q_S out of range");
  rejected([](Call& x) { x.p.key_antiquant_mode = x.p.value_antiquant_mode = 2; }, "not supported");
  rejected([](Call& x) { x.p.value_antiquant_mode = 1; }, "not supported");
  std::vector<float> one{0.5f};
  rejected(
      [&](Call& x) {
        x.in.key_antiquant_scale = {one.data(), shp(1)};
      },
      "not an accepted shape with Q_S > 1");
  rejected(
      [&](Call& x) {
        x.in.key_antiquant_scale = {r.sc[0].data(), shp(1, c.kvn, c.D)};
      },
      "not an accepted shape with Q_S > 1");
  rejected([](Call& x) { x.in.key_antiquant_scale = x.in.value_antiquant_scale = {}; }, "missing");
  rejected([](Call& x) { x.in.value_antiquant_offset = {}; },
           "key_antiquant_offset / value_antiquant_offset");
  std::vector<bf> legacy(z(2 * c.kvn * c.D), bf(0.01f));
  rejected(
      [&](Call& x) {
        x.in.antiquant_scale = {legacy.data(), shp(2, c.kvn * c.D)};
      },
      "given beside the separate scales");
  rejected(
      [&](Call& x) {
        x.in.key_antiquant_scale = x.in.value_antiquant_scale = {};
        x.in.key_antiquant_offset = x.in.value_antiquant_offset = {};
        x.p.key_antiquant_mode = x.p.value_antiquant_mode = 0;
        x.in.antiquant_scale = {legacy.data(), shp(2, c.kvn, c.D)};
      },
      "not fp16 with the combined antiquant_scale");
  std::vector<std::int32_t> table(3, 0);
  rejected([&](Call& x) { x.in.block_table = {table.data(), shp(3, 1)}; }, "in a paged cache");
  rejected(
      [&](Call& x) {
        x.p.input_layout = "TND";
        x.in.query = {r.qb.data(), shp(13, c.N, c.D)};
        x.oshape = Shape(x.in.query.shape().begin(), x.in.query.shape().end());
        x.in.key = {{r.kb.data(), shp(39, c.kvn, c.D)}};
        x.in.value = {{r.vb.data(), shp(39, c.kvn, c.D)}};
        x.in.actual_seq_lengths = {5, 8, 13};
        x.in.actual_seq_lengths_kv = {37, 37, 39};
      },
      "input_layout");
  // A half query: the documents list bf16 only.
  Call x = call_of(r);
  FusedInferAttentionScoreInputs<half, i8> h;
  std::vector<half> qh(r.qb.size(), half(0.5f)), oh(qh.size(), half(7.0f));
  h.query = {qh.data(), x.in.query.shape()};
  h.key = x.in.key;
  h.value = x.in.value;
  h.actual_seq_lengths_kv = x.in.actual_seq_lengths_kv;
  h.key_antiquant_scale = x.in.key_antiquant_scale;
  h.value_antiquant_scale = x.in.value_antiquant_scale;
  support::expect_rejected(
      [&] {
        attnref::fused_infer_attention_score(
            x.p, h, FusedInferAttentionScoreOutputs<half>{{oh.data(), x.oshape}});
      },
      "not bf16");
}

}  // namespace fia_prompt_aq_test
