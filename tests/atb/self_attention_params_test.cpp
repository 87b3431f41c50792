// ATB SelfAttention parameters: enum values, feature detection, the co-existence table and the
// per-feature constraints.

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/atb/self_attention_params.hpp>
#include <set>
#include <string>

namespace {

using attnref::SelfAttentionFeature;
using attnref::SelfAttentionParams;
using F = SelfAttentionFeature;
using P = SelfAttentionParams;

constexpr int kN = attnref::kNumSelfAttentionFeatures;

// The table of shared/spec/coexistence.md, transcribed here a second time (row-major, upper and
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
  // Both outcomes occur (the table has 32 N pairs out of 66).
  EXPECT_GT(accepted, 20);
  EXPECT_GT(rejected, 20);
}

template <class Mutate>
void expect_rejected(Mutate&& m, const std::string& fragment, bool kv_list = false) {
  P p;
  p.num_heads = 8;
  m(p);
  try {
    attnref::validate(p, kv_list);
    ADD_FAILURE() << "no exception; expected \"" << fragment << "\"";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("attnref::self_attention: ", 0), 0u) << msg;
    EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
  }
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

}  // namespace
