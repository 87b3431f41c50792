// ATB PagedAttentionParam: the vendor's enum values and defaults, and the parameter checks.

#include <gtest/gtest.h>

#include <attnref/atb/paged_attention_params.hpp>
#include <functional>
#include <stdexcept>
#include <string>

#include "support/errors.hpp"

namespace paged_attention_params_test {

using P = attnref::PagedAttentionParams;

TEST(PagedAttentionParams, EnumValuesAndDefaultsAreAtbs) {
  EXPECT_EQ(static_cast<int>(P::MaskType::Norm), 1);
  EXPECT_EQ(static_cast<int>(P::MaskType::Alibi), 2);
  EXPECT_EQ(static_cast<int>(P::MaskType::Spec), 3);
  EXPECT_EQ(static_cast<int>(P::MaskType::MaskFree), 4);
  EXPECT_EQ(static_cast<int>(P::MaskType::NormCompress), 5);
  EXPECT_EQ(static_cast<int>(P::QuantType::DequantFusion), 1);
  EXPECT_EQ(static_cast<int>(P::QuantType::QkvOffline), 2);
  EXPECT_EQ(static_cast<int>(P::QuantType::QkvOnline), 3);
  EXPECT_EQ(static_cast<int>(P::CompressType::KvHead), 1);
  EXPECT_EQ(static_cast<int>(P::CompressType::KvHeadRope), 2);
  EXPECT_EQ(static_cast<int>(P::CalcType::Spec), 1);
  EXPECT_EQ(static_cast<int>(P::ScaleType::LogN), 1);
  EXPECT_EQ(static_cast<int>(P::OutDataType::BFloat16), 27);
  const P p;
  EXPECT_EQ(p.qk_scale, 1.0f);
  EXPECT_EQ(p.q_scale, 0.0f);
  EXPECT_EQ(p.num_kv_heads, 0);
  EXPECT_EQ(p.mla_v_head_size, 0u);
  EXPECT_EQ(p.out_data_type, P::OutDataType::Undefined);
}

void expect_rejected(const std::function<void(P&)>& edit, const std::string& what) {
  P p;
  p.num_heads = 8;
  p.num_kv_heads = 2;
  attnref::validate(p);  // the baseline is valid
  edit(p);
  support::expect_rejected([&] { attnref::validate(p); }, what);
}

TEST(PagedAttentionParams, ChecksNameTheField) {
  expect_rejected([](P& p) { p.num_heads = 0; }, "params.num_heads not positive");
  expect_rejected(
      [](P& p) { p.num_kv_heads = 3; },
      "params.num_heads not a multiple of num_kv_heads: expected a multiple of 3, got 8");
  expect_rejected([](P& p) { p.mask_type = static_cast<P::MaskType>(6); },
                  "params.mask_type out of range: expected [0, 5], got 6");
  expect_rejected([](P& p) { p.compress_type = static_cast<P::CompressType>(3); },
                  "params.compress_type out of range");
  expect_rejected([](P& p) { p.out_data_type = static_cast<P::OutDataType>(0); },
                  "params.out_data_type not supported");
  expect_rejected([](P& p) { p.qk_scale = INFINITY; }, "params.qk_scale not finite");
  expect_rejected([](P& p) { p.mla_v_head_size = 577; },
                  "params.mla_v_head_size out of range: expected [0, 576], got 577");
  expect_rejected(
      [](P& p) {
        p.scale_type = P::ScaleType::LogN;
        p.quant_type = P::QuantType::QkvOnline;
      },
      "params.scale_type LogN not supported with qkv quantization");
  P ok;
  ok.num_heads = 4;
  ok.scale_type = P::ScaleType::LogN;
  ok.quant_type = P::QuantType::DequantFusion;
  EXPECT_NO_THROW(attnref::validate(ok));
}

}  // namespace paged_attention_params_test
