// ATB SelfAttention with KV caches: ENCODER / DECODER cache writes, kv-bypass, batchRunStatus,
// layerId, against the independent reference.

#include <gtest/gtest.h>

#include <attnref/atb/self_attention.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "reference/atb_self_attention.hpp"
#include "support/cast.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"
#include "support/outcome.hpp"
#include "support/random.hpp"

namespace self_attention_cache_test {

using attnref::Index;
using P = attnref::SelfAttentionParams;
using T = attnref::bfloat16;

constexpr int kLayers = 2, kBatch = 3, kMaxSeq = 48, kKv = 2, kHeads = 4, kD = 16, kDv = 12;

struct Caches {
  std::vector<T> k, v;
  Caches() {
    const T nan = T(std::numeric_limits<float>::quiet_NaN());  // never read unless written
    k.assign(static_cast<size_t>(kLayers * kBatch * kMaxSeq * kKv * kD), nan);
    v.assign(static_cast<size_t>(kLayers * kBatch * kMaxSeq * kKv * kDv), nan);
  }
  attnref::StridedView<T, 4> kview() {
    return attnref::StridedView<T, 4>(k.data(), {kLayers, kBatch, kMaxSeq, kKv * kD});
  }
  attnref::StridedView<T, 4> vview() {
    return attnref::StridedView<T, 4>(v.data(), {kLayers, kBatch, kMaxSeq, kKv * kDv});
  }
  // Row `pos` of sequence b, layer l, as doubles [kv heads][dim].
  std::vector<double> krow(int l, int b, int pos) const { return row(k, l, b, pos, kD); }
  std::vector<double> vrow(int l, int b, int pos) const { return row(v, l, b, pos, kDv); }
  static std::vector<double> row(const std::vector<T>& c, int l, int b, int pos, int dim) {
    std::vector<double> r;
    const size_t base = static_cast<size_t>(((l * kBatch + b) * kMaxSeq + pos) * kKv * dim);
    for (int e = 0; e < kKv * dim; ++e)
      r.push_back(static_cast<float>(c[base + static_cast<size_t>(e)]));
    return r;
  }
};

struct Step {
  std::vector<Index> seq_len, token_offset;
  std::vector<T> q, k, v, out;
  int tokens = 0;
};

Step make_step(const std::vector<Index>& seq_len, const std::vector<Index>& token_offset,
               unsigned seed) {
  Step s;
  s.seq_len = seq_len;
  s.token_offset = token_offset;
  for (Index l : seq_len) s.tokens += static_cast<int>(l);
  s.q = support::randn<T>(static_cast<size_t>(s.tokens * kHeads * kD), seed);
  s.k = support::randn<T>(static_cast<size_t>(s.tokens * kKv * kD), seed + 1);
  s.v = support::randn<T>(static_cast<size_t>(s.tokens * kKv * kDv), seed + 2);
  s.out.assign(static_cast<size_t>(s.tokens * kHeads * kDv), T(7.0f));
  return s;
}

bool g_validate_only = false;  // run() calls validate() instead (expect_rejected below)

void run(const P& p, Step& s, Caches& c, int layer, bool with_kv,
         std::vector<std::int32_t> status = {}, const std::vector<float>* log_n = nullptr) {
  attnref::SelfAttentionInputs<T> in;
  in.query = attnref::StridedView<const T, 3>(s.q.data(), {s.tokens, kHeads, kD});
  if (with_kv) {
    in.key = attnref::StridedView<const T, 3>(s.k.data(), {s.tokens, kKv, kD});
    in.value = attnref::StridedView<const T, 3>(s.v.data(), {s.tokens, kKv, kDv});
  }
  in.seq_len = s.seq_len;
  in.token_offset = s.token_offset;
  in.layer_id = layer;
  in.batch_run_status = std::move(status);
  if (log_n)
    in.log_n =
        attnref::StridedView<const float, 1>(log_n->data(), {static_cast<Index>(log_n->size())});
  attnref::SelfAttentionOutputs<T> out{
      attnref::StridedView<T, 3>(s.out.data(), {s.tokens, kHeads, kDv}), c.kview(), c.vview()};
  if (g_validate_only)
    attnref::validate(p, in, out);
  else
    attnref::self_attention(p, in, out);
}

// Reference output of a step over the cache rows [0, token_offset) as they are now.
std::vector<double> reference(const P& p, const Step& s, const Caches& c, int layer, bool causal,
                              const std::vector<float>* log_n = nullptr,
                              const std::vector<int>& active = {1, 1, 1}) {
  ref::AtbSelfAttention r;
  r.num_heads = kHeads;
  r.num_kv_heads = kKv;
  r.head_size = kD;
  r.v_head_size = kDv;
  r.qk_scale = p.qk_scale;
  if (log_n) {
    r.log_n = *log_n;
    r.log_n_per_batch = p.calc_type == P::CalcType::Decoder;
  }
  std::vector<std::vector<double>> q(kBatch), k(kBatch), v(kBatch);
  int t0 = 0;
  for (int b = 0; b < kBatch; ++b) {
    const int l = static_cast<int>(s.seq_len[static_cast<size_t>(b)]);
    r.seq_len.push_back(l);
    r.kv_len.push_back(active[static_cast<size_t>(b)]
                           ? static_cast<int>(s.token_offset[static_cast<size_t>(b)])
                           : 0);
    for (int t = t0; t < t0 + l; ++t)
      for (int e = 0; e < kHeads * kD; ++e)
        q[b].push_back(static_cast<float>(s.q[static_cast<size_t>(t * kHeads * kD + e)]));
    for (int pos = 0; pos < r.kv_len.back(); ++pos) {
      const auto kr = c.krow(layer, b, pos), vr = c.vrow(layer, b, pos);
      k[b].insert(k[b].end(), kr.begin(), kr.end());
      v[b].insert(v[b].end(), vr.begin(), vr.end());
    }
    t0 += l;
  }
  // Top-left causal over the cache positions (the NORM triangle / CAUSAL_MASK of the tests).
  if (causal) r.mask = [](int, int i, int j) { return j > i ? -3e38 : 0.0; };
  const auto o = ref::atb_self_attention(r, q, k, v);
  std::vector<double> flat;
  for (const auto& x : o) flat.insert(flat.end(), x.begin(), x.end());
  return flat;
}

P base_params(P::CalcType calc) {
  P p;
  p.num_heads = kHeads;
  p.num_kv_heads = kKv;
  p.qk_scale = 0.25f;
  p.calc_type = calc;
  return p;
}

TEST(SelfAttentionCache, EncoderWritesTheCacheThenDecoderAttendsOverIt) {
  Caches c;
  const int layer = 1;
  // Prefill: tokens written to rows [0, len) of layer 1; causal over them.
  P enc = base_params(P::CalcType::Encoder);
  enc.mask_type = P::MaskType::CausalMask;
  Step pre = make_step({5, 11, 1}, {5, 11, 1}, 10);
  run(enc, pre, c, layer, true);
  int t = 0;
  for (int b = 0; b < kBatch; ++b)
    for (int j = 0; j < pre.seq_len[static_cast<size_t>(b)]; ++j, ++t) {
      const auto kr = c.krow(layer, b, j);
      for (int e = 0; e < kKv * kD; ++e)
        ASSERT_EQ(kr[static_cast<size_t>(e)],
                  static_cast<float>(pre.k[static_cast<size_t>(t * kKv * kD + e)]));
      const auto vr = c.vrow(layer, b, j);
      for (int e = 0; e < kKv * kDv; ++e)
        ASSERT_EQ(vr[static_cast<size_t>(e)],
                  static_cast<float>(pre.v[static_cast<size_t>(t * kKv * kDv + e)]));
    }
  for (int e = 0; e < kKv * kD; ++e)
    ASSERT_TRUE(std::isnan(c.krow(layer, 0, 5)[static_cast<size_t>(e)]));
  for (int e = 0; e < kKv * kD; ++e)
    ASSERT_TRUE(std::isnan(c.krow(0, 0, 0)[static_cast<size_t>(e)]));  // other layer
  EXPECT_TRUE(support::all_close(reference(enc, pre, c, layer, true), support::as_doubles(pre.out),
                                 support::tolerance(support::Kind::BF16)));

  // Decode: one token each at row len, attention over [0, len + 1), logN per sequence.
  P dec = base_params(P::CalcType::Decoder);
  dec.scale_type = P::ScaleType::LogN;
  const std::vector<float> log_n = {1.0f, 1.25f, 0.75f};
  Step d = make_step({1, 1, 1}, {6, 12, 2}, 20);
  run(dec, d, c, layer, true, {}, &log_n);
  EXPECT_TRUE(support::all_close(reference(dec, d, c, layer, false, &log_n),
                                 support::as_doubles(d.out),
                                 support::tolerance(support::Kind::BF16)));

  // Metamorphic: the decoder's row equals the last row of PA_ENCODER over prompt + token.
  P pa = base_params(P::CalcType::PaEncoder);
  pa.mask_type = P::MaskType::CausalMask;
  std::vector<T> q, k, v;
  std::vector<Index> lens;
  t = 0;
  for (int b = 0; b < kBatch; ++b) {
    const int len = static_cast<int>(pre.seq_len[static_cast<size_t>(b)]);
    for (int j = 0; j <= len; ++j) {
      const std::vector<T>& src_q = j < len ? pre.q : d.q;
      const int row = j < len ? t + j : b;
      q.insert(q.end(), src_q.begin() + row * kHeads * kD, src_q.begin() + (row + 1) * kHeads * kD);
      k.insert(k.end(), (j < len ? pre.k : d.k).begin() + row * kKv * kD,
               (j < len ? pre.k : d.k).begin() + (row + 1) * kKv * kD);
      v.insert(v.end(), (j < len ? pre.v : d.v).begin() + row * kKv * kDv,
               (j < len ? pre.v : d.v).begin() + (row + 1) * kKv * kDv);
    }
    t += len;
    lens.push_back(len + 1);
  }
  const Index tokens = static_cast<Index>(q.size()) / (kHeads * kD);
  std::vector<T> o(static_cast<size_t>(tokens * kHeads * kDv));
  attnref::SelfAttentionInputs<T> pin{
      attnref::StridedView<const T, 3>(q.data(), {tokens, kHeads, kD}),
      attnref::StridedView<const T, 3>(k.data(), {tokens, kKv, kD}),
      attnref::StridedView<const T, 3>(v.data(), {tokens, kKv, kDv}), lens};
  P pa_plain = pa;  // same scaling as the decoder run without logN
  dec.scale_type = P::ScaleType::Tor;
  Step d2 = d;
  run(dec, d2, c, layer, true);
  attnref::self_attention(pa_plain, pin,
                          attnref::SelfAttentionOutputs<T>{
                              attnref::StridedView<T, 3>(o.data(), {tokens, kHeads, kDv})});
  Index last = -1;
  for (int b = 0; b < kBatch; ++b) {
    last += lens[static_cast<size_t>(b)];
    for (int e = 0; e < kHeads * kDv; ++e)
      EXPECT_NEAR(static_cast<float>(o[static_cast<size_t>(last * kHeads * kDv + e)]),
                  static_cast<float>(d2.out[static_cast<size_t>(b * kHeads * kDv + e)]), 1.6e-2)
          << "b=" << b << " e=" << e;
  }
}

TEST(SelfAttentionCache, KvBypassReadsTheCachesAsGivenAndWritesNothing) {
  Caches c;
  const auto kfill = support::randn<T>(c.k.size(), 30), vfill = support::randn<T>(c.v.size(), 31);
  c.k = kfill;
  c.v = vfill;
  P p = base_params(P::CalcType::Decoder);
  p.kvcache_cfg = P::KvCacheCfg::KBypassVBypass;
  p.kernel_type = P::KernelType::HighPrecision;
  Step s = make_step({1, 1, 1}, {7, 20, 3}, 40);
  run(p, s, c, 0, /*with_kv=*/false);
  EXPECT_EQ(std::memcmp(c.k.data(), kfill.data(), c.k.size() * sizeof(T)), 0);
  EXPECT_EQ(std::memcmp(c.v.data(), vfill.data(), c.v.size() * sizeof(T)), 0);
  EXPECT_TRUE(support::all_close(reference(p, s, c, 0, false), support::as_doubles(s.out),
                                 support::tolerance(support::Kind::BF16)));
}

TEST(SelfAttentionCache, BatchRunStatusZeroSkipsTheSequenceAndAllOnesChangesNothing) {
  P p = base_params(P::CalcType::Encoder);
  p.batch_run_status_enable = true;
  p.mask_type = P::MaskType::CausalMask;
  Caches c1;
  Step s1 = make_step({4, 6, 3}, {4, 6, 3}, 50);
  run(p, s1, c1, 0, true, {1, 0, 1});
  for (int t = 4; t < 10; ++t)
    for (int e = 0; e < kHeads * kDv; ++e)
      ASSERT_EQ(static_cast<float>(s1.out[static_cast<size_t>(t * kHeads * kDv + e)]), 0.0f);
  for (int j = 0; j < 6; ++j)
    for (double x : c1.krow(0, 1, j)) ASSERT_TRUE(std::isnan(x)) << "inactive sequence written";
  EXPECT_TRUE(support::all_close(reference(p, s1, c1, 0, true, nullptr, {1, 0, 1}),
                                 support::as_doubles(s1.out),
                                 support::tolerance(support::Kind::BF16)));
  // All ones == the feature disabled, bit for bit.
  Caches c2, c3;
  Step s2 = make_step({4, 6, 3}, {4, 6, 3}, 50), s3 = s2;
  run(p, s2, c2, 0, true, {1, 1, 1});
  P off = p;
  off.batch_run_status_enable = false;
  run(off, s3, c3, 0, true);
  EXPECT_EQ(std::memcmp(s2.out.data(), s3.out.data(), s2.out.size() * sizeof(T)), 0);
}

template <class E, class Call>
void expect_rejected(Call&& call, const std::string& fragment) {
  Caches c;
  Step s = make_step({2, 3, 1}, {2, 3, 1}, 60);
  // validate() first: the same outcome as the call, nothing written (caches included).
  g_validate_only = true;
  const std::string validated = support::outcome([&] { call(s, c); });
  g_validate_only = false;
  for (const T& x : c.k) ASSERT_TRUE(std::isnan(static_cast<float>(x)));
  for (const T& x : s.out) ASSERT_EQ(static_cast<float>(x), 7.0f);
  s = make_step({2, 3, 1}, {2, 3, 1}, 60);
  support::expect_rejected<E>([&] { call(s, c); }, fragment);
  for (const T& x : c.k) ASSERT_TRUE(std::isnan(static_cast<float>(x)));
  for (const T& x : s.out) ASSERT_EQ(static_cast<float>(x), 7.0f);
  s = make_step({2, 3, 1}, {2, 3, 1}, 60);
  EXPECT_EQ(validated, support::outcome([&] { call(s, c); })) << fragment;
}

TEST(SelfAttentionCache, BadInputIsRejectedBeforeAnyWrite) {
  const P enc = base_params(P::CalcType::Encoder);
  expect_rejected<std::out_of_range>([&](Step& s, Caches& c) { run(enc, s, c, 2, true); },
                                     "layer_id out of range: expected [0, 2), got 2");
  expect_rejected<std::invalid_argument>(
      [&](Step& s, Caches& c) {
        s.token_offset = {1, 3, 1};
        run(enc, s, c, 0, true);
      },
      "token_offset[0] smaller than seq_len: expected >= 2, got 1");
  expect_rejected<std::invalid_argument>(
      [&](Step& s, Caches& c) {
        s.token_offset = {2, 49, 1};
        run(enc, s, c, 0, true);
      },
      "token_offset[1] exceeds maxSeqLen: expected <= 48, got 49");
  const P dec = base_params(P::CalcType::Decoder);
  expect_rejected<std::invalid_argument>([&](Step& s, Caches& c) { run(dec, s, c, 0, true); },
                                         "seq_len[0] not 1 for Decoder");
  expect_rejected<std::invalid_argument>([&](Step& s, Caches& c) { run(enc, s, c, 0, false); },
                                         "key.shape mismatch");
  P brs = enc;
  brs.batch_run_status_enable = true;
  expect_rejected<std::invalid_argument>(
      [&](Step& s, Caches& c) {
        run(brs, s, c, 0, true, {1, 2, 1});
      },
      "batch_run_status[1] not 0 or 1");
  expect_rejected<std::invalid_argument>([&](Step& s, Caches& c) { run(brs, s, c, 0, true); },
                                         "batch_run_status size mismatch");
  expect_rejected<std::invalid_argument>(
      [&](Step& s, Caches&) {
        attnref::SelfAttentionInputs<T> in;
        in.query = attnref::StridedView<const T, 3>(s.q.data(), {s.tokens, kHeads, kD});
        in.key = attnref::StridedView<const T, 3>(s.k.data(), {s.tokens, kKv, kD});
        in.value = attnref::StridedView<const T, 3>(s.v.data(), {s.tokens, kKv, kDv});
        in.seq_len = s.seq_len;
        in.token_offset = s.token_offset;
        attnref::self_attention(enc, in,
                                attnref::SelfAttentionOutputs<T>{attnref::StridedView<T, 3>(
                                    s.out.data(), {s.tokens, kHeads, kDv})});
      },
      "key_cache/value_cache missing");
  P norm = enc;
  norm.mask_type = P::MaskType::Norm;
  expect_rejected<std::invalid_argument>([&](Step& s, Caches& c) { run(norm, s, c, 0, true); },
                                         "mask missing for NORM");
  P logn = base_params(P::CalcType::Decoder);
  logn.scale_type = P::ScaleType::LogN;
  const std::vector<float> short_log_n = {1.0f, 1.0f};
  expect_rejected<std::invalid_argument>(
      [&](Step& s, Caches& c) {
        s = make_step({1, 1, 1}, {2, 3, 1}, 61);
        run(logn, s, c, 0, true);
      },
      "log_n missing for LOGN");
  expect_rejected<std::invalid_argument>(
      [&](Step& s, Caches& c) {
        s = make_step({1, 1, 1}, {2, 3, 1}, 61);
        run(logn, s, c, 0, true, {}, &short_log_n);
      },
      "log_n.shape[0]");
}

}  // namespace self_attention_cache_test
