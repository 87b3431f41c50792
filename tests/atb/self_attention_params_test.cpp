// ATB SelfAttention parameters: enum values, feature detection, the co-existence table and the
// per-feature constraints.

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/atb/self_attention.hpp>
#include <attnref/atb/self_attention_params.hpp>
#include <cmath>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "reference/atb_qkv_quant.hpp"
#include "reference/atb_self_attention.hpp"
#include "support/cast.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"
#include "support/random.hpp"

namespace self_attention_params_test {

using attnref::SelfAttentionFeature;
using attnref::SelfAttentionParams;
using F = SelfAttentionFeature;
using P = SelfAttentionParams;

constexpr int kN = attnref::kNumSelfAttentionFeatures;

// The vendor table of docs/semantics.md §2.11, transcribed here a second time (row-major, upper and
// lower triangle as printed there): 'Y' combine, 'N' conflict, '-' diagonal.
const char* const kSpecTable[kN] = {
    "-YYYYYYNYYNN",  // batchRun
    "Y-YYYYYNYYNY",  // enc/dec
    "YY-YYYYYYYYN",  // highPrec
    "YYY-YYYYYYYN",  // clamp
    "YYYY-YYYYYNY",  // cmpMask
    "YYYYY-YNYYNY",  // kvBypass
    "YYYYYY-NNNNN",  // logN
    "NNYYYNN-NNYN",  // qkvQuant
    "YYYYYYNN-NNN",  // BNSD
    "YYYYYYNNN-NN",  // kvList
    "NNYYNNNYNN-N",  // MLA
    "NYNNYYNNNNN-",  // SWA
};

bool spec_combine(int a, int b) { return a == b || kSpecTable[a][b] == 'Y'; }

TEST(SelfAttentionParams, EnumValuesAreAtbs) {
  EXPECT_EQ(static_cast<int>(P::CalcType::PaEncoder), 3);
  EXPECT_EQ(static_cast<int>(P::CalcType::PrefixEncoder), 4);
  EXPECT_EQ(static_cast<int>(P::KernelType::HighPrecision), 1);
  EXPECT_EQ(static_cast<int>(P::MaskType::NormCompress), 3);
  EXPECT_EQ(static_cast<int>(P::MaskType::AlibiCompressLeftAlign), 6);
  EXPECT_EQ(static_cast<int>(P::MaskType::SlidingWindowCompress), 8);
  EXPECT_EQ(static_cast<int>(P::MaskType::CausalMask), 9);
  EXPECT_EQ(static_cast<int>(P::KvCacheCfg::KBypassVBypass), 1);
  EXPECT_EQ(static_cast<int>(P::ScaleType::LogN), 1);
  EXPECT_EQ(static_cast<int>(P::QuantType::QkvOffline), 2);
  EXPECT_EQ(static_cast<int>(P::QuantType::QkvOnline), 3);
  EXPECT_EQ(static_cast<int>(P::InputLayout::BNSD), 1);
  EXPECT_EQ(static_cast<int>(P::CacheType::Swa), 1);
  EXPECT_EQ(static_cast<int>(P::OutDataType::BFloat16), 27);  // ACL_BF16
}

TEST(SelfAttentionParams, TableMatchesTheSpecAndIsSymmetric) {
  for (int a = 0; a < kN; ++a)
    for (int b = 0; b < kN; ++b) {
      if (a == b) continue;
      EXPECT_EQ(kSpecTable[a][b], kSpecTable[b][a]) << "spec transcription " << a << "," << b;
      EXPECT_EQ(attnref::self_attention_features_combine(static_cast<F>(a), static_cast<F>(b)),
                spec_combine(a, b))
          << attnref::to_string(static_cast<F>(a)) << " + "
          << attnref::to_string(static_cast<F>(b));
    }
}

bool all_combine(const std::set<int>& features) {
  for (int a : features)
    for (int c : features)
      if (!spec_combine(a, c)) return false;
  return true;
}

// Parameters enabling the features of `want` plus the companions their constraints require
// (BNSD and kv tensorlist need kv-bypass, kv tensorlist and logN the decoder, ...).
struct Built {
  P p;
  bool kv_list = false;
  std::set<int> features;
};

Built build(const std::set<int>& want) {
  Built b;
  P& p = b.p;
  p.num_heads = 8;
  p.num_kv_heads = 2;
  auto has = [&](F f) { return want.count(static_cast<int>(f)) != 0; };
  std::set<int> f = want;
  auto add = [&](F x) { f.insert(static_cast<int>(x)); };
  if (has(F::QkvQuant) || has(F::Mla)) p.calc_type = P::CalcType::PaEncoder;
  if (has(F::EncDec)) p.calc_type = P::CalcType::Encoder;
  if (has(F::LogN) || has(F::KvTensorList)) {
    p.calc_type = P::CalcType::Decoder;
    add(F::EncDec);
  }
  if (has(F::BatchRun)) p.batch_run_status_enable = true;
  if (has(F::HighPrecision)) p.kernel_type = P::KernelType::HighPrecision;
  if (has(F::Clamp)) {
    p.clamp_type = P::ClampType::MinMax;
    p.clamp_min = -1.0f;
    p.clamp_max = 1.0f;
  }
  if (has(F::CompressMask)) {
    p.is_triu_mask = 1;
    p.mask_type = P::MaskType::NormCompress;
  }
  if (has(F::KvBypass) || has(F::BNSD) || has(F::KvTensorList)) {
    p.kvcache_cfg = P::KvCacheCfg::KBypassVBypass;
    add(F::KvBypass);
  }
  if (has(F::LogN)) p.scale_type = P::ScaleType::LogN;
  if (has(F::QkvQuant)) {
    p.quant_type = P::QuantType::QkvOffline;
    p.out_data_type = P::OutDataType::Float16;
  }
  if (has(F::BNSD)) {
    p.input_layout = P::InputLayout::BNSD;
    if (p.mask_type == P::MaskType::Undefined) p.mask_type = P::MaskType::Norm;
  }
  b.kv_list = has(F::KvTensorList);
  if (has(F::Mla)) p.mla_v_head_size = 64;
  if (has(F::Swa)) {
    p.window_size = 16;
    p.mask_type =
        has(F::CompressMask) ? P::MaskType::SlidingWindowCompress : P::MaskType::SlidingWindowNorm;
  }
  b.features = f;
  return b;
}

std::set<int> detected(const Built& b) {
  std::set<int> s;
  for (F f : attnref::self_attention_features(b.p, b.kv_list)) s.insert(static_cast<int>(f));
  return s;
}

TEST(SelfAttentionParams, EveryFeatureAloneIsAccepted) {
  for (int a = 0; a < kN; ++a) {
    const Built b = build({a});
    EXPECT_EQ(detected(b), b.features) << attnref::to_string(static_cast<F>(a));
    EXPECT_NO_THROW(attnref::validate(b.p, b.kv_list)) << attnref::to_string(static_cast<F>(a));
  }
}

// Walks the whole table: every pair (with the companions it needs) is accepted exactly when
// all the features involved combine, and a rejection names a conflicting pair.
TEST(SelfAttentionParams, EveryPairFollowsTheTable) {
  int rejected = 0, accepted = 0;
  for (int a = 0; a < kN; ++a)
    for (int c = a + 1; c < kN; ++c) {
      const Built b = build({a, c});
      const std::string pair = std::string(attnref::to_string(static_cast<F>(a))) + " + " +
                               attnref::to_string(static_cast<F>(c));
      ASSERT_EQ(detected(b), b.features) << pair;
      std::vector<int> fs(b.features.begin(), b.features.end());
      bool ok = true;
      for (size_t i = 0; i < fs.size(); ++i)
        for (size_t j = i + 1; j < fs.size(); ++j) ok = ok && spec_combine(fs[i], fs[j]);
      if (ok) {
        ++accepted;
        EXPECT_NO_THROW(attnref::validate(b.p, b.kv_list)) << pair;
        continue;
      }
      ++rejected;
      try {
        attnref::validate(b.p, b.kv_list);
        ADD_FAILURE() << pair << ": no exception";
      } catch (const std::invalid_argument& e) {
        const std::string msg = e.what();
        bool names_conflict = false;
        for (size_t i = 0; i < fs.size(); ++i)
          for (size_t j = i + 1; j < fs.size(); ++j)
            if (!spec_combine(fs[i], fs[j]) &&
                msg.find(attnref::to_string(static_cast<F>(fs[i]))) != std::string::npos &&
                msg.find(attnref::to_string(static_cast<F>(fs[j]))) != std::string::npos)
              names_conflict = true;
        EXPECT_TRUE(names_conflict) << pair << ": " << msg;
        EXPECT_NE(msg.find("not supported together"), std::string::npos) << msg;
      }
    }
  // Both outcomes occur (the table has 24 N pairs out of 66).
  EXPECT_GT(accepted, 20);
  EXPECT_GT(rejected, 20);
}

template <class Mutate>
void expect_rejected(Mutate&& m, const std::string& fragment, bool kv_list = false) {
  P p;
  p.num_heads = 8;
  m(p);
  support::expect_rejected_by([&] { attnref::validate(p, kv_list); }, "self_attention", {fragment});
}

TEST(SelfAttentionParams, PerFeatureConstraints) {
  expect_rejected([](P& p) { p.num_heads = 0; }, "params.num_heads not positive");
  expect_rejected([](P& p) { p.num_kv_heads = 3; }, "not a multiple of num_kv_heads");
  expect_rejected([](P& p) { p.qk_scale = std::nanf(""); }, "params.qk_scale not finite");
  expect_rejected(
      [](P& p) {
        p.clamp_type = P::ClampType::MinMax;
        p.clamp_min = 2;
        p.clamp_max = 1;
      },
      "params.clamp_min/clamp_max not an interval");
  expect_rejected([](P& p) { p.quant_type = P::QuantType::DequantFusion; }, "reserved by ATB");
  expect_rejected([](P& p) { p.mask_type = static_cast<P::MaskType>(10); },
                  "params.mask_type out of range: expected [0, 9], got 10");
  expect_rejected(
      [](P& p) {
        p.batch_run_status_enable = true;
        p.calc_type = P::CalcType::PaEncoder;
      },
      "not supported with batchRunStatus");
  expect_rejected(
      [](P& p) {
        p.kvcache_cfg = P::KvCacheCfg::KBypassVBypass;
        p.calc_type = P::CalcType::PaEncoder;
      },
      "not supported with kv-bypass");
  expect_rejected([](P& p) { p.mask_type = P::MaskType::AlibiCompress; },
                  "not supported with a compressed ALiBi mask");
  expect_rejected([](P& p) { p.scale_type = P::ScaleType::LogN; },
                  "not supported with logN scaling: expected Decoder or PaEncoder");
  expect_rejected(
      [](P& p) {
        p.scale_type = P::ScaleType::LogN;
        p.calc_type = P::CalcType::PaEncoder;
      },
      "must be HighPrecision for logN scaling with PaEncoder");
  expect_rejected([](P& p) { p.quant_type = P::QuantType::QkvOnline; },
                  "not supported with qkv full quantization: expected PaEncoder");
  expect_rejected(
      [](P& p) {
        p.quant_type = P::QuantType::QkvOnline;
        p.calc_type = P::CalcType::PaEncoder;
      },
      "params.out_data_type required by qkv full quantization");
  expect_rejected([](P& p) { p.input_layout = P::InputLayout::BNSD; },
                  "must be KBypassVBypass for BNSD input");
  expect_rejected(
      [](P& p) {
        p.input_layout = P::InputLayout::BNSD;
        p.kvcache_cfg = P::KvCacheCfg::KBypassVBypass;
      },
      "must be set for BNSD input");
  expect_rejected([](P& p) { p.kvcache_cfg = P::KvCacheCfg::KBypassVBypass; },
                  "must be Decoder for kv tensorlist input", /*kv_list=*/true);
  expect_rejected([](P& p) { p.mla_v_head_size = 577; },
                  "params.mla_v_head_size out of range: expected [0, 576], got 577");
  expect_rejected([](P& p) { p.mla_v_head_size = 64; },
                  "not supported with the MLA merged kv cache");
  expect_rejected(
      [](P& p) {
        p.mla_v_head_size = 64;
        p.calc_type = P::CalcType::PaEncoder;
        p.mask_type = P::MaskType::Alibi;
      },
      "ALiBi not supported with the MLA merged kv cache");
  expect_rejected([](P& p) { p.window_size = 8; }, "must be a sliding-window mask");
  expect_rejected([](P& p) { p.mask_type = P::MaskType::SlidingWindowNorm; },
                  "must be positive with a sliding-window mask");
  expect_rejected([](P& p) { p.cache_type = P::CacheType::Swa; },
                  "Swa needs sliding-window attention");
  expect_rejected(
      [](P& p) {
        p.window_size = 8;
        p.mask_type = P::MaskType::SlidingWindowCompress;
        p.calc_type = P::CalcType::Decoder;
      },
      "SlidingWindowCompress not supported by the decoder");
  expect_rejected([](P& p) { p.is_triu_mask = 1; }, "params.is_triu_mask set without a mask type");
  // PREFIX_ENCODER: ATB's own parameter checks, one violation at a time.
  auto prefix = [](P& p) {
    p.calc_type = P::CalcType::PrefixEncoder;
    p.mask_type = P::MaskType::CausalMask;
    p.is_triu_mask = 1;
    p.kernel_type = P::KernelType::HighPrecision;
  };
  {
    P ok;
    ok.num_heads = 8;
    prefix(ok);
    EXPECT_NO_THROW(attnref::validate(ok));
  }
  expect_rejected(
      [&](P& p) {
        prefix(p);
        p.mask_type = P::MaskType::Norm;
      },
      "params.mask_type not supported by PrefixEncoder");
  expect_rejected(
      [&](P& p) {
        prefix(p);
        p.is_triu_mask = 0;
      },
      "params.is_triu_mask must be 1 for PrefixEncoder");
  expect_rejected(
      [&](P& p) {
        prefix(p);
        p.kernel_type = P::KernelType::Default;
      },
      "params.kernel_type must be HighPrecision for PrefixEncoder");
  expect_rejected(
      [&](P& p) {
        prefix(p);
        p.q_scale = 0.5f;
      },
      "params.q_scale must be 1 for PrefixEncoder");
  expect_rejected(
      [&](P& p) {
        prefix(p);
        p.clamp_type = P::ClampType::MinMax;
      },
      "params.clamp_type not supported by PrefixEncoder");
  expect_rejected(
      [&](P& p) {
        prefix(p);
        p.kvcache_cfg = P::KvCacheCfg::KBypassVBypass;
      },
      "params.kvcache_cfg not supported by PrefixEncoder");
  expect_rejected(
      [&](P& p) {
        prefix(p);
        p.scale_type = P::ScaleType::LogN;
      },
      "params.calc_type not supported with logN scaling");
  expect_rejected(
      [&](P& p) {
        prefix(p);
        p.batch_run_status_enable = true;
      },
      "params.batch_run_status_enable not supported by PrefixEncoder");
  expect_rejected(
      [&](P& p) {
        prefix(p);
        p.input_layout = P::InputLayout::BNSD;
      },
      "params.calc_type not supported with BNSD input");
  // BNSD with PA_ENCODER: no mask, default kernel (ATB's operation checks).
  expect_rejected(
      [](P& p) {
        p.calc_type = P::CalcType::PaEncoder;
        p.input_layout = P::InputLayout::BNSD;
        p.mask_type = P::MaskType::Norm;
      },
      "params.mask_type must be Undefined for BNSD input with PaEncoder");
  expect_rejected(
      [](P& p) {
        p.calc_type = P::CalcType::PaEncoder;
        p.input_layout = P::InputLayout::BNSD;
        p.kernel_type = P::KernelType::HighPrecision;
      },
      "params.kernel_type must be Default for BNSD input with PaEncoder");
  expect_rejected(
      [](P& p) {
        p.calc_type = P::CalcType::PaEncoder;
        p.mla_v_head_size = 64;
        p.mask_type = P::MaskType::CausalMask;
      },
      "params.mask_type not supported with the MLA merged kv cache");
  expect_rejected(
      [](P& p) {
        p.scale_type = P::ScaleType::LogN;
        p.calc_type = P::CalcType::Decoder;
        p.input_layout = P::InputLayout::BNSD;
        p.kvcache_cfg = P::KvCacheCfg::KBypassVBypass;
        p.mask_type = P::MaskType::Norm;
      },
      "params logN scaling + BNSD input not supported together");
}

// ---------------------------------------------------------------------------------------------
// The walk again, through the operator: every Y pair (with its companions) runs on fp16 data and
// is checked against the independent reference, caches included; every N pair is rejected
// naming both features. Pairs with qkv quantization run on int8 data against the quantized
// reference.

using H = attnref::half;
using attnref::Index;
using attnref::StridedView;

constexpr int kBatch = 3, kLayers = 2, kLayer = 1, kMaxSeq = 24, kD = 16, kDv = 12;

struct PairRun {
  std::vector<double> out, out_want;      // packed [tokens, heads, dv]
  std::vector<double> cache, cache_want;  // K then V caches after the call
};

PairRun run_pair(const Built& built, std::mt19937& rng) {
  const P& p = built.p;
  const int nh = p.num_heads, nkv = p.num_kv_heads;
  const bool pa = p.calc_type == P::CalcType::PaEncoder;
  const bool dec = p.calc_type == P::CalcType::Decoder;
  const bool bypass = p.kvcache_cfg == P::KvCacheCfg::KBypassVBypass;
  const bool bnsd = p.input_layout == P::InputLayout::BNSD;
  const bool mla = p.mla_v_head_size > 0;
  // fp16 data. The kernel ATB selects (its runner and kernel sources, docs/masks.md): DECODER
  // runs the decoder kernel (fp32 scores, fp16 masks added) whatever kernelType says; the
  // dynamic-batch encoder (batchRunStatus) runs the fp16 kernel whatever kernelType says; else
  // HIGH_PRECISION takes binary masks x -3e38 with fp32 scores, DEFAULT additive fp16 ones.
  const bool fp16_kernel =
      !dec && (p.kernel_type == P::KernelType::Default || p.batch_run_status_enable);
  const bool binary = !dec && !fp16_kernel;
  const int dv = mla ? p.mla_v_head_size : kDv;
  const std::vector<int> len = dec ? std::vector<int>{1, 1, 1} : std::vector<int>{5, 9, 3};
  std::vector<int> off = pa ? len : dec ? std::vector<int>{6, 11, 2} : std::vector<int>{7, 9, 4};
  const std::vector<int> active =
      p.batch_run_status_enable ? std::vector<int>{1, 0, 1} : std::vector<int>{1, 1, 1};
  // A dynamic batch gives its inactive sequence a kv length (token offset) of 0, below its
  // seq_len: accepted, and the sequence is skipped.
  if (p.batch_run_status_enable) off[1] = 0;
  int tokens = 0, max_len = 0;
  for (int l : len) tokens += l, max_len = std::max(max_len, l);
  const size_t row_k = static_cast<size_t>(nkv * kD), row_v = static_cast<size_t>(nkv * kDv);
  const std::vector<H> q = support::randn<H>(static_cast<size_t>(tokens * nh * kD), rng);
  const std::vector<H> knew = support::randn<H>(static_cast<size_t>(tokens) * row_k, rng);
  const std::vector<H> vnew = support::randn<H>(static_cast<size_t>(tokens) * row_v, rng);
  std::vector<H> kc =
      support::randn<H>(static_cast<size_t>(kLayers * kBatch * kMaxSeq) * row_k, rng);
  std::vector<H> vc =
      support::randn<H>(static_cast<size_t>(kLayers * kBatch * kMaxSeq) * row_v, rng);
  auto cache_row = [&](int b, int pos) {
    return static_cast<size_t>((kLayer * kBatch + b) * kMaxSeq + pos);
  };

  // What the caches must hold afterwards, and the keys / values each sequence attends over.
  std::vector<H> kc_want = kc, vc_want = vc;
  std::vector<std::vector<double>> rq(kBatch), rk(kBatch), rv(kBatch);
  ref::AtbSelfAttention r;
  r.num_heads = nh;
  r.num_kv_heads = nkv;
  r.head_size = kD;
  r.v_head_size = dv;
  r.qk_scale = p.qk_scale;
  r.q_scale = p.q_scale;
  r.fp16_scores = fp16_kernel;
  r.to_dtype = [](double x) { return ref::round_fp16(x); };
  r.clamp = p.clamp_type == P::ClampType::MinMax;
  r.clamp_min = p.clamp_min;
  r.clamp_max = p.clamp_max;
  for (int b = 0, t0 = 0; b < kBatch; t0 += len[static_cast<size_t>(b)], ++b) {
    const int l = len[static_cast<size_t>(b)], o = off[static_cast<size_t>(b)];
    r.seq_len.push_back(l);
    r.kv_len.push_back(active[static_cast<size_t>(b)] ? o : 0);
    for (int t = t0; t < t0 + l; ++t)
      for (int e = 0; e < nh * kD; ++e)
        rq[static_cast<size_t>(b)].push_back(
            static_cast<float>(q[static_cast<size_t>(t * nh * kD + e)]));
    for (int pos = 0; pos < o; ++pos) {
      const bool fresh = pos >= o - l;
      const size_t t = static_cast<size_t>(t0 + pos - (o - l));
      const H* kr = pa || (fresh && !bypass) ? &knew[t * row_k] : &kc[cache_row(b, pos) * row_k];
      const H* vr = pa || (fresh && !bypass) ? &vnew[t * row_v] : &vc[cache_row(b, pos) * row_v];
      if (fresh && !pa && !bypass && active[static_cast<size_t>(b)]) {
        std::copy(kr, kr + row_k, &kc_want[cache_row(b, pos) * row_k]);
        std::copy(vr, vr + row_v, &vc_want[cache_row(b, pos) * row_v]);
      }
      for (size_t e = 0; e < row_k; ++e)
        rk[static_cast<size_t>(b)].push_back(static_cast<float>(kr[e]));
      for (int h = 0; h < nkv; ++h)
        for (int e = 0; e < dv; ++e)  // MLA: V = the first dv elements of each K head
          rv[static_cast<size_t>(b)].push_back(
              static_cast<float>(mla ? kr[h * kD + e] : vr[h * kDv + e]));
    }
  }

  // Masks: NORM [batch, maxSeq, maxSeq] (decoder [batch, 1, maxSeq]) or the NORM_COMPRESS tile,
  // binary on the high-precision kernel, additive otherwise; random holes on top of the triangle.
  const double coeff = binary ? -3e38 : 1.0;
  const float hidden = binary ? 1.0f : -10000.0f;
  std::uniform_real_distribution<double> ud(0, 1);
  std::vector<H> mask;
  StridedView<const H, 3> mview;
  const int mrows = dec ? 1 : kMaxSeq;
  const int w = p.window_size;  // SWA: key j visible to query i iff i - w < j <= i (top-left)
  const bool swa_norm = p.mask_type == P::MaskType::SlidingWindowNorm;
  if (p.mask_type == P::MaskType::Norm || swa_norm) {
    for (int b = 0; b < kBatch; ++b)
      for (int i = 0; i < mrows; ++i)
        for (int j = 0; j < kMaxSeq; ++j) {
          const bool hole = swa_norm ? j != i && ud(rng) < 0.2 : ud(rng) < 0.2;
          const bool outside = swa_norm ? j > i || j <= i - w : !dec && j > i;
          mask.push_back(H(outside || hole ? hidden : 0.0f));
        }
    mview = StridedView<const H, 3>(mask.data(), {kBatch, mrows, kMaxSeq});
    r.mask = [&](int b, int i, int j) {
      return static_cast<float>(mask[static_cast<size_t>((b * mrows + i) * kMaxSeq + j)]) * coeff;
    };
  } else if (p.mask_type == P::MaskType::NormCompress) {
    for (int i = 0; i < 128; ++i)
      for (int j = 0; j < 128; ++j) mask.push_back(H(j > i || ud(rng) < 0.2 ? hidden : 0.0f));
    mview = StridedView<const H, 3>(mask.data(), {1, 128, 128});
    // Sequences here are shorter than one 128 tile: the tile itself, sliced top-left.
    r.mask = [&](int, int i, int j) {
      return static_cast<float>(mask[static_cast<size_t>(i * 128 + j)]) * coeff;
    };
  } else if (p.mask_type == P::MaskType::SlidingWindowCompress) {
    // The documented [512, 512] pattern, written here from its definition (the window is far
    // below 3 blocks, so its true size is the window); the reference reads the plain window.
    for (int i = 0; i < 512; ++i)
      for (int j = 0; j < 512; ++j) mask.push_back(H(j > i || j <= i - w ? hidden : 0.0f));
    mview = StridedView<const H, 3>(mask.data(), {1, 512, 512});
    r.mask = [=](int, int i, int j) {
      return j > i || j <= i - w ? static_cast<double>(hidden) * coeff : 0.0;
    };
  }
  const std::vector<float> log_n = {1.0f, 1.25f, 0.75f};
  if (p.scale_type == P::ScaleType::LogN) {
    r.log_n = log_n;
    r.log_n_per_batch = dec;
  }
  PairRun res;
  for (const auto& o : ref::atb_self_attention(r, rq, rk, rv))
    res.out_want.insert(res.out_want.end(), o.begin(), o.end());
  res.cache_want = support::as_doubles(kc_want);
  const auto vw = support::as_doubles(vc_want);
  res.cache_want.insert(res.cache_want.end(), vw.begin(), vw.end());

  const std::vector<Index> seq(len.begin(), len.end()), offsets(off.begin(), off.end());
  const std::vector<std::int32_t> status(active.begin(), active.end());
  std::vector<H> out(static_cast<size_t>(tokens * nh * dv), H(7.0f));
  if (bnsd && built.kv_list) {
    // The BNSD inputs have no cache list: this pair cannot even be formed; the operator's
    // check is the parameter check.
    attnref::validate(p, true);
  } else if (bnsd) {
    // [layers, batch, kvHeads, maxSeq, d] copies of the caches; q and out [batch, heads, S, d].
    std::vector<H> kb(kc.size()), vb(vc.size()),
        qb(static_cast<size_t>(kBatch * nh * max_len * kD));
    for (int l = 0; l < kLayers; ++l)
      for (int b = 0; b < kBatch; ++b)
        for (int s = 0; s < kMaxSeq; ++s)
          for (int h = 0; h < nkv; ++h) {
            const size_t src = static_cast<size_t>((l * kBatch + b) * kMaxSeq + s);
            const size_t dst = static_cast<size_t>(((l * kBatch + b) * nkv + h) * kMaxSeq + s);
            std::copy_n(&kc[src * row_k + static_cast<size_t>(h * kD)], kD, &kb[dst * kD]);
            std::copy_n(&vc[src * row_v + static_cast<size_t>(h * kDv)], kDv, &vb[dst * kDv]);
          }
    for (int b = 0, t0 = 0; b < kBatch; t0 += len[static_cast<size_t>(b)], ++b)
      for (int s = 0; s < len[static_cast<size_t>(b)]; ++s)
        for (int h = 0; h < nh; ++h)
          std::copy_n(&q[static_cast<size_t>(((t0 + s) * nh + h) * kD)], kD,
                      &qb[static_cast<size_t>(((b * nh + h) * max_len + s) * kD)]);
    attnref::SelfAttentionBnsdInputs<H> in;
    in.query = StridedView<const H, 4>(qb.data(), {kBatch, nh, max_len, kD});
    in.seq_len = seq;
    in.mask = mview;
    in.token_offset = offsets;
    in.layer_id = kLayer;
    if (p.batch_run_status_enable) in.batch_run_status = status;
    std::vector<H> ob(static_cast<size_t>(kBatch * nh * max_len * dv), H(7.0f));
    attnref::self_attention(
        p, in,
        attnref::SelfAttentionBnsdOutputs<H>{
            StridedView<H, 4>(ob.data(), {kBatch, nh, max_len, dv}),
            StridedView<const H, 5>(kb.data(), {kLayers, kBatch, nkv, kMaxSeq, kD}),
            StridedView<const H, 5>(vb.data(), {kLayers, kBatch, nkv, kMaxSeq, kDv})});
    for (int b = 0, t0 = 0; b < kBatch; t0 += len[static_cast<size_t>(b)], ++b)
      for (int s = 0; s < max_len; ++s)
        for (int h = 0; h < nh; ++h)
          for (int e = 0; e < dv; ++e) {
            const H x = ob[static_cast<size_t>(((b * nh + h) * max_len + s) * dv + e)];
            if (s < len[static_cast<size_t>(b)])
              out[static_cast<size_t>(((t0 + s) * nh + h) * dv + e)] = x;
            else
              EXPECT_EQ(static_cast<float>(x), 0.0f) << "BNSD padding row";
          }
  } else {
    attnref::SelfAttentionInputs<H> in;
    in.query = StridedView<const H, 3>(q.data(), {tokens, nh, kD});
    if (pa || !bypass) {
      in.key = StridedView<const H, 3>(knew.data(), {tokens, nkv, kD});
      if (!mla) in.value = StridedView<const H, 3>(vnew.data(), {tokens, nkv, kDv});
    }
    in.seq_len = seq;
    in.mask = mview;
    if (p.scale_type == P::ScaleType::LogN)
      in.log_n = StridedView<const float, 1>(log_n.data(), {kBatch});
    if (!pa) in.token_offset = offsets;
    in.layer_id = kLayer;
    if (p.batch_run_status_enable) in.batch_run_status = status;
    attnref::SelfAttentionOutputs<H> o{StridedView<H, 3>(out.data(), {tokens, nh, dv})};
    if (built.kv_list) {
      for (int b = 0; b < kBatch; ++b) {
        in.key_cache_list.emplace_back(&kc[cache_row(b, 0) * row_k],
                                       std::array<Index, 2>{kMaxSeq, nkv * kD});
        in.value_cache_list.emplace_back(&vc[cache_row(b, 0) * row_v],
                                         std::array<Index, 2>{kMaxSeq, nkv * kDv});
      }
    } else if (!pa) {
      o.key_cache = StridedView<H, 4>(kc.data(), {kLayers, kBatch, kMaxSeq, nkv * kD});
      o.value_cache = StridedView<H, 4>(vc.data(), {kLayers, kBatch, kMaxSeq, nkv * kDv});
    }
    attnref::self_attention(p, in, o);
  }
  res.out = support::as_doubles(out);
  res.cache = support::as_doubles(kc);
  const auto vg = support::as_doubles(vc);
  res.cache.insert(res.cache.end(), vg.begin(), vg.end());
  return res;
}

// qkv quantization pairs: int8 q / k / v (head sizes multiples of 32) against the quantized
// reference. Rows whose P̂ rounding sits on a tie (see the reference) are left out and counted.
PairRun run_quant_pair(const Built& built, std::mt19937& rng, int& ties) {
  P p = built.p;
  if (p.mla_v_head_size > 0) p.mla_v_head_size = 32;
  const int nh = p.num_heads, nkv = p.num_kv_heads, d = 64;
  const bool mla = p.mla_v_head_size > 0;
  const int dv = mla ? 32 : 64;
  const bool binary = p.kernel_type == P::KernelType::HighPrecision;  // fp16 output
  const std::vector<int> len{5, 9, 3};
  const int tokens = 17;
  const auto q = support::rand_i8(static_cast<size_t>(tokens * nh * d), rng);
  const auto k = support::rand_i8(static_cast<size_t>(tokens * nkv * d), rng);
  const auto v = support::rand_i8(static_cast<size_t>(tokens * nkv * dv), rng);
  std::vector<float> qk_descale, vpv_descale, p_scale;
  for (int h = 0; h < nh; ++h) {
    qk_descale.push_back((1.0f + 0.1f * static_cast<float>(h)) / (127.0f * 127.0f * 4.0f));
    vpv_descale.push_back(0.01f * static_cast<float>(h + 1));
    p_scale.push_back((1.0f + 0.25f * static_cast<float>(h)) / 127.0f);
  }
  ref::AtbQkvQuant r;
  r.num_heads = nh;
  r.num_kv_heads = nkv;
  r.head_size = d;
  r.v_head_size = dv;
  r.seq_len = len;
  r.qk_scale = p.qk_scale;
  r.clamp = p.clamp_type == P::ClampType::MinMax;
  r.clamp_min = p.clamp_min;
  r.clamp_max = p.clamp_max;
  r.qk_descale = qk_descale;
  r.vpv_descale = vpv_descale;
  r.p_scale = p_scale;
  std::vector<H> mask;
  StridedView<const H, 3> mview;
  if (p.mask_type == P::MaskType::NormCompress) {
    const float hidden = binary ? 1.0f : -10000.0f;
    const double coeff = binary ? -3e38 : 1.0;
    for (int i = 0; i < 128; ++i)
      for (int j = 0; j < 128; ++j) mask.push_back(H(j > i ? hidden : 0.0f));
    mview = StridedView<const H, 3>(mask.data(), {1, 128, 128});
    r.mask = [=](int, int i, int j) { return j > i ? static_cast<double>(hidden) * coeff : 0.0; };
  }
  std::vector<std::vector<std::int8_t>> rq, rk, rv;
  for (size_t b = 0, t0 = 0; b < len.size(); t0 += static_cast<size_t>(len[b]), ++b) {
    const size_t l = static_cast<size_t>(len[b]);
    rq.emplace_back(q.begin() + static_cast<long>(t0 * nh * d),
                    q.begin() + static_cast<long>((t0 + l) * nh * d));
    rk.emplace_back(k.begin() + static_cast<long>(t0 * nkv * d),
                    k.begin() + static_cast<long>((t0 + l) * nkv * d));
    std::vector<std::int8_t> vb;
    for (size_t t = t0; t < t0 + l; ++t)
      for (int h = 0; h < nkv; ++h)
        for (int e = 0; e < dv; ++e)
          vb.push_back(mla ? k[(t * nkv + h) * d + e] : v[(t * nkv + h) * dv + e]);
    rv.push_back(std::move(vb));
  }
  const ref::QuantResult want = ref::atb_qkv_quant(r, rq, rk, rv);

  attnref::SelfAttentionQuantInputs<H> in;
  in.query = StridedView<const std::int8_t, 3>(q.data(), {tokens, nh, d});
  in.key = StridedView<const std::int8_t, 3>(k.data(), {tokens, nkv, d});
  if (!mla) in.value = StridedView<const std::int8_t, 3>(v.data(), {tokens, nkv, dv});
  in.seq_len = {5, 9, 3};
  in.mask = mview;
  in.qk_descale = StridedView<const float, 1>(qk_descale.data(), {nh});
  in.vpv_descale = StridedView<const float, 1>(vpv_descale.data(), {nh});
  in.p_scale = StridedView<const float, 1>(p_scale.data(), {nh});
  std::vector<H> out(static_cast<size_t>(tokens * nh * dv), H(7.0f));
  attnref::self_attention(
      p, in, attnref::SelfAttentionOutputs<H>{StridedView<H, 3>(out.data(), {tokens, nh, dv})});
  PairRun res;
  size_t row = 0;
  for (size_t b = 0; b < want.out.size(); ++b)
    for (size_t rr = 0; rr < want.tie[b].size(); ++rr, ++row) {
      if (want.tie[b][rr]) {
        ++ties;
        continue;
      }
      for (int e = 0; e < dv; ++e) {
        res.out_want.push_back(static_cast<float>(
            H(static_cast<float>(want.out[b][rr * dv + static_cast<size_t>(e)]))));
        res.out.push_back(static_cast<float>(out[row * dv + static_cast<size_t>(e)]));
      }
    }
  return res;
}

TEST(SelfAttentionCoexistence, EveryYPairRunsAndEveryNPairThrows) {
  std::mt19937 rng(77);
  int ran = 0, conflicts = 0, later = 0, quant = 0, ties = 0;
  for (int a = 0; a < kN; ++a)
    for (int c = a; c < kN; ++c) {  // c == a: the feature alone
      Built b = build({a, c});
      const std::string pair = std::string(attnref::to_string(static_cast<F>(a))) + " + " +
                               attnref::to_string(static_cast<F>(c));
      b.p.qk_scale = 0.25f;
      if (b.p.mla_v_head_size > 0) b.p.mla_v_head_size = kDv;
      if (b.p.window_size > 0) b.p.window_size = 3;  // shorter than the sequences
      std::string expect_error;
      if (!all_combine(b.features)) {
        expect_error = "not supported together";
        ++conflicts;
      }
      const bool quantized = b.features.count(static_cast<int>(F::QkvQuant)) != 0;
      if (expect_error.empty()) {
        ++ran;
        quant += quantized ? 1 : 0;
        PairRun r;
        ASSERT_NO_THROW(r = quantized ? run_quant_pair(b, rng, ties) : run_pair(b, rng)) << pair;
        EXPECT_TRUE(support::all_close(r.out_want, r.out, support::tolerance(support::Kind::F16)))
            << pair;
        EXPECT_TRUE(support::all_close(r.cache_want, r.cache, {0.0, 0.0})) << pair << " (caches)";
        continue;
      }
      try {
        if (quantized)
          run_quant_pair(b, rng, ties);
        else
          run_pair(b, rng);
        ADD_FAILURE() << pair << ": no exception";
      } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find(expect_error), std::string::npos)
            << pair << ": " << e.what();
      }
    }
  int n_pairs = 0;
  for (int a = 0; a < kN; ++a)
    for (int c = a + 1; c < kN; ++c) n_pairs += kSpecTable[a][c] == 'N';
  EXPECT_EQ(conflicts, n_pairs);  // companions never add a conflict of their own
  EXPECT_EQ(ran + conflicts + later, kN + kN * (kN - 1) / 2);
  // qkv quant alone and with highPrec, clamp, cmpMask, MLA (the Y entries of its row).
  EXPECT_EQ(quant, 5);
  EXPECT_EQ(later, 0);
  EXPECT_LE(ties, 3);
  std::printf("coexistence walk: %d ran (%d with qkv quantization), %d N pairs rejected\n", ran,
              quant, conflicts);
}

}  // namespace self_attention_params_test
