// CANN FusedInferAttentionScore with int4 key / value (eight signed 4-bit values per int32
// word, the first in the low nibble): against the independent reference on K / V dequantized
// here from values this test packs itself, in every separate antiquant mode int4 takes, every
// layout, one tensor or a tensor list, batches without keys; metamorphic: int4 == int8 K / V
// holding the same values, bit for bit; thread counts; every int4 rule rejected with both
// outputs untouched.

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

#include "cann/flash_attention_support.hpp"
#include "reference/cann_flash_attention.hpp"
#include "support/cast.hpp"
#include "support/errors.hpp"

namespace fia_int4_test {

using namespace flash_attention_support;
using attnref::FusedInferAttentionScoreInputs;
using attnref::FusedInferAttentionScoreOutputs;
using attnref::FusedInferAttentionScoreParams;
using i32 = std::int32_t;

constexpr float kSentinel = 7.0f;

// Eight values in [-8, 7] per word, value k in bits 4k..4k+3 (the documented order).
std::vector<i32> pack4(const std::vector<i8>& x) {
  std::vector<i32> w(x.size() / 8, 0);
  for (size_t i = 0; i < x.size(); ++i) {
    const auto nib = static_cast<std::uint32_t>(x[i]) & 0xFu;
    w[i / 8] = static_cast<i32>(static_cast<std::uint32_t>(w[i / 8]) | nib << (4 * (i % 8)));
  }
  return w;
}

enum class Mode { Channel, Token, TokenHead, KeyChannelValueToken };

struct Case {
  std::string layout = "BSND";
  std::vector<int> L{37, 0, 20, 5};
  bool list = false;
  Mode mode = Mode::Channel;
  int N = 4, kvn = 2, D = 64;
  unsigned seed = 1;
  int B() const { return static_cast<int>(L.size()); }
  int S() const { return *std::max_element(L.begin(), L.end()) + 1; }
};

// One call's data: int8 values per (b, t, kv head, d) in the layout, packed and not; the
// scales (side 0 key, 1 value) and the reference's dequantized K / V.
struct Built {
  Case c;
  Seqs q, k, v;
  std::vector<half> qb;
  std::vector<std::vector<i8>> k8, v8;
  std::vector<std::vector<i32>> k4, v4;
  Shape one, qshape;
  std::vector<float> sc[2], off[2];
  Shape scale_shape[2];
};

// (side, b, kv head, t, channel) -> scale / offset of the case's mode.
double scale_of(const Case& c, int side, int b, int h, int t, int ch) {
  const bool token = c.mode == Mode::Token || c.mode == Mode::TokenHead ||
                     (side == 1 && c.mode == Mode::KeyChannelValueToken);
  const int hh = c.mode == Mode::TokenHead ? h : 0;
  return token ? 0.004 + 0.02 * hv(c.seed + 5 + side, b * 7 + hh, t, 1)
               : 0.004 + 0.02 * hv(c.seed + 5 + side, 0, ch, 2);
}
double offset_of(const Case& c, int side, int b, int h, int t, int ch) {
  return std::round(6 * scale_of(c, side, b, h, t, ch) / 0.024 - 3);  // integers in [-3, 3]
}

Built build(const Case& c) {
  Built r;
  r.c = c;
  const int B = c.B(), S = c.S(), KVN = c.kvn, D = c.D;
  std::mt19937 rng(c.seed);
  r.q = draw<half>(rng, std::vector<int>(z(B), 1), c.N, D);
  r.qb = concat<half>(r.q);
  r.qshape = c.layout == "BSH"    ? shp(B, 1, c.N * D)
             : c.layout == "BSND" ? shp(B, 1, c.N, D)
                                  : shp(B, c.N, 1, D);
  r.one = c.layout == "BSH"    ? shp(1, S, KVN * D)
          : c.layout == "BSND" ? shp(1, S, KVN, D)
                               : shp(1, KVN, S, D);
  std::uniform_int_distribution<int> ui(-8, 7);
  r.k.resize(z(B));
  r.v.resize(z(B));
  std::vector<i8> kall, vall;
  for (int b = 0; b < B; ++b) {
    std::vector<i8> kb(z(S * KVN * D)), vb(kb.size());
    for (int t = 0; t < S; ++t)
      for (int h = 0; h < KVN; ++h)
        for (int d = 0; d < D; ++d) {
          const size_t at = c.layout == "BNSD" ? z((h * S + t) * D + d) : z((t * KVN + h) * D + d);
          kb[at] = i8(ui(rng));
          vb[at] = i8(ui(rng));
          if (t >= c.L[z(b)]) continue;
          const int ch = h * D + d;
          r.k[z(b)].push_back((kb[at] + offset_of(c, 0, b, h, t, ch)) *
                              scale_of(c, 0, b, h, t, ch));
          r.v[z(b)].push_back((vb[at] + offset_of(c, 1, b, h, t, ch)) *
                              scale_of(c, 1, b, h, t, ch));
        }
    if (c.list) {
      r.k8.push_back(kb);
      r.v8.push_back(vb);
    } else {
      kall.insert(kall.end(), kb.begin(), kb.end());
      vall.insert(vall.end(), vb.begin(), vb.end());
    }
  }
  if (!c.list) {
    r.k8 = {kall};
    r.v8 = {vall};
  }
  for (size_t i = 0; i < r.k8.size(); ++i) {
    r.k4.push_back(pack4(r.k8[i]));
    r.v4.push_back(pack4(r.v8[i]));
  }
  // The scale tables in the mode's vendor shape.
  for (int side = 0; side < 2; ++side) {
    const bool token = c.mode == Mode::Token || (side == 1 && c.mode == Mode::KeyChannelValueToken);
    if (c.mode == Mode::TokenHead) {
      r.scale_shape[side] = shp(B, KVN, S);
      for (int b = 0; b < B; ++b)
        for (int h = 0; h < KVN; ++h)
          for (int t = 0; t < S; ++t) {
            r.sc[side].push_back(static_cast<float>(scale_of(c, side, b, h, t, 0)));
            r.off[side].push_back(static_cast<float>(offset_of(c, side, b, h, t, 0)));
          }
    } else if (token) {
      r.scale_shape[side] = shp(1, B, S);
      for (int b = 0; b < B; ++b)
        for (int t = 0; t < S; ++t) {
          r.sc[side].push_back(static_cast<float>(scale_of(c, side, b, 0, t, 0)));
          r.off[side].push_back(static_cast<float>(offset_of(c, side, b, 0, t, 0)));
        }
    } else {
      r.scale_shape[side] = shp(1, KVN, 1, D);
      for (int ch = 0; ch < KVN * D; ++ch) {
        r.sc[side].push_back(static_cast<float>(scale_of(c, side, 0, 0, 0, ch)));
        r.off[side].push_back(static_cast<float>(offset_of(c, side, 0, 0, 0, ch)));
      }
    }
  }
  return r;
}

template <class TKV>
struct Call {
  FusedInferAttentionScoreParams p;
  FusedInferAttentionScoreInputs<half, TKV> in;
};

// The call with packed (int32) or unpacked (int8) K / V.
template <class TKV>
Call<TKV> call_of(const Built& r) {
  constexpr bool packed = std::is_same_v<TKV, i32>;
  const Case& c = r.c;
  Call<TKV> x;
  x.p.num_heads = c.N;
  x.p.num_key_value_heads = c.kvn;
  x.p.scale_value = 0.125;
  x.p.input_layout = c.layout;
  x.p.softmax_lse_flag = true;
  x.p.key_antiquant_mode = c.mode == Mode::Token ? 1 : c.mode == Mode::TokenHead ? 3 : 0;
  x.p.value_antiquant_mode = c.mode == Mode::Channel ? 0 : c.mode == Mode::TokenHead ? 3 : 1;
  x.in.query = {r.qb.data(), r.qshape};
  Shape sh = r.one;
  if (!c.list) sh[0] = c.B();
  if (packed) sh.back() /= 8;
  for (size_t i = 0; i < r.k8.size(); ++i) {
    if constexpr (packed) {
      x.in.key.push_back({r.k4[i].data(), sh});
      x.in.value.push_back({r.v4[i].data(), sh});
    } else {
      x.in.key.push_back({r.k8[i].data(), sh});
      x.in.value.push_back({r.v8[i].data(), sh});
    }
  }
  for (int l : c.L) x.in.actual_seq_lengths_kv.push_back(l);
  x.in.key_antiquant_scale = {r.sc[0].data(), r.scale_shape[0]};
  x.in.key_antiquant_offset = {r.off[0].data(), r.scale_shape[0]};
  x.in.value_antiquant_scale = {r.sc[1].data(), r.scale_shape[1]};
  x.in.value_antiquant_offset = {r.off[1].data(), r.scale_shape[1]};
  return x;
}

template <class TKV>
void run(const Call<TKV>& x, std::vector<half>& out, std::vector<float>& lse, int threads = 0) {
  const Index B = x.in.query.size(0);
  out.assign(z(x.in.query.numel()), half(kSentinel));
  lse.assign(z(B * x.p.num_heads), kSentinel);
  attnref::fused_infer_attention_score(
      x.p, x.in,
      FusedInferAttentionScoreOutputs<half>{
          StridedView<half>(out.data(), x.in.query.shape()),
          StridedView<float>(lse.data(), shp(B, x.p.num_heads, 1, 1))},
      {threads});
}

bool same_bits(const void* a, const void* b, size_t n) { return std::memcmp(a, b, n) == 0; }

void check_case(const Case& c) {
  SCOPED_TRACE(c.layout + (c.list ? " list" : " tensor") + " mode " +
               std::to_string(static_cast<int>(c.mode)));
  const Built r = build(c);
  const auto x4 = call_of<i32>(r);
  std::vector<half> out, out8, o1, o2;
  std::vector<float> lse, lse8, l1, l2;
  run(x4, out, lse);
  // The reference on the values dequantized here.
  ref::cann::Ifa pr{c.N, c.kvn, c.D, c.L, 0.125};
  Seqs ref_lse;
  std::vector<double> want, wl;
  for (const auto& row : ref::cann::ifa(pr, r.q, r.k, r.v, &ref_lse))
    want.insert(want.end(), row.begin(), row.end());
  EXPECT_TRUE(matches(want, out));
  for (const auto& row : ref_lse)
    for (double l : row) wl.push_back(l == -HUGE_VAL ? double(-3.40e38f) : l);
  ASSERT_EQ(wl.size(), lse.size());
  for (size_t i = 0; i < wl.size(); ++i)
    EXPECT_TRUE(wl[i] == double(-3.40e38f)
                    ? lse[i] == -3.40e38f
                    : std::abs(lse[i] - wl[i]) <= 1e-4 + 2e-5 * std::abs(wl[i]))
        << "lse[" << i << "] = " << lse[i] << ", want " << wl[i];
  // int4 == int8 holding the same values, bit for bit; threads change nothing.
  run(call_of<i8>(r), out8, lse8);
  EXPECT_TRUE(same_bits(out.data(), out8.data(), out.size() * sizeof(half)) &&
              same_bits(lse.data(), lse8.data(), lse.size() * sizeof(float)))
      << "int4 differs from int8 with the same values";
  run(x4, o1, l1, 1);
  run(x4, o2, l2, 2);
  EXPECT_TRUE(same_bits(o1.data(), o2.data(), o1.size() * sizeof(half)) &&
              same_bits(l1.data(), l2.data(), l1.size() * sizeof(float)))
      << "thread count changed the bits";
}

TEST(FiaInt4, MatchesReferenceAndInt8WithTheSameValues) {
  unsigned seed = 1;
  for (const std::string lay : {"BSH", "BSND", "BNSD"})
    for (bool list : {false, true})
      for (Mode m : {Mode::Channel, Mode::Token, Mode::TokenHead, Mode::KeyChannelValueToken}) {
        Case c;
        c.layout = lay;
        c.list = list;
        c.mode = m;
        c.seed = seed++;
        if (lay == "BSH") c.D = 128, c.kvn = 1, c.N = 3;  // H = 128 (16 words), MQA
        check_case(c);
      }
}

TEST(FiaInt4, EveryNibbleValueAtEveryPositionOfAWord) {
  // One kv head of D 64, two keys; key 0 holds -8..7 then 7..-8 repeated, so every value sits
  // at every nibble position of some word.
  Case c;
  c.L = {2};
  c.N = 1, c.kvn = 1;
  Built r = build(c);
  for (int i = 0; i < 2 * c.D; ++i) {
    const int val = (i / 16) % 2 == 0 ? i % 16 - 8 : 7 - i % 16;
    r.k8[0][z(i)] = r.v8[0][z(i)] = i8(val);
  }
  r.k4[0] = pack4(r.k8[0]);
  r.v4[0] = pack4(r.v8[0]);
  r.k[0].clear();
  r.v[0].clear();
  for (int t = 0; t < 2; ++t)
    for (int d = 0; d < c.D; ++d) {
      const i8 x = r.k8[0][z(t * c.D + d)];
      r.k[0].push_back((x + offset_of(c, 0, 0, 0, t, d)) * scale_of(c, 0, 0, 0, t, d));
      r.v[0].push_back((x + offset_of(c, 1, 0, 0, t, d)) * scale_of(c, 1, 0, 0, t, d));
    }
  std::vector<half> out;
  std::vector<float> lse;
  run(call_of<i32>(r), out, lse);
  ref::cann::Ifa pr{1, 1, c.D, c.L, 0.125};
  std::vector<double> want;
  for (const auto& row : ref::cann::ifa(pr, r.q, r.k, r.v))
    want.insert(want.end(), row.begin(), row.end());
  EXPECT_TRUE(matches(want, out));
}

TEST(FiaInt4, Rejections) {
  Case c;
  c.mode = Mode::Token;
  const Built r = build(c);
  std::vector<half> out;
  std::vector<float> lse;
  const auto rejected = [&](const std::function<void(Call<i32>&)>& edit, const std::string& frag) {
    auto x = call_of<i32>(r);
    edit(x);
    SCOPED_TRACE(frag);
    support::expect_rejected([&] { run(x, out, lse); }, frag);
    EXPECT_TRUE(untouched(out));
    EXPECT_TRUE(std::all_of(lse.begin(), lse.end(), [](float v) { return v == kSentinel; }));
  };
  std::vector<half> q2(r.qb.size() * 2, half(0.5f));
  rejected(
      [&](Call<i32>& x) {
        x.in.query = {q2.data(), shp(c.B(), 2, c.N, c.D)};
      },
      "take Q_S == 1");
  rejected([](Call<i32>& x) { x.p.key_antiquant_mode = x.p.value_antiquant_mode = 2; },
           "not a mode int4");
  rejected([](Call<i32>& x) { x.p.value_antiquant_mode = 0; }, "not a mode int4");
  rejected([](Call<i32>& x) { x.in.key_antiquant_scale = {}; }, "missing (int4");
  std::vector<half> legacy(2 * c.kvn * c.D, half(0.01f));
  rejected(
      [&](Call<i32>& x) {
        x.in.antiquant_scale = {legacy.data(), shp(2, c.kvn * c.D)};
      },
      "separate scales");
  std::vector<float> one{0.5f};
  rejected(
      [&](Call<i32>& x) {
        x.p.key_antiquant_mode = x.p.value_antiquant_mode = 0;
        x.in.key_antiquant_scale = x.in.value_antiquant_scale = {one.data(), shp(1)};
        x.in.key_antiquant_offset = x.in.value_antiquant_offset = {};
      },
      "per-tensor scales are int8 only");
  rejected([&](Call<i32>& x) { x.in.quant_scale2 = {one.data(), shp(1)}; }, "no post-quant");
  std::vector<std::int64_t> pad{1};
  rejected([&](Call<i32>& x) { x.in.kv_padding_size = {pad.data(), shp(1)}; }, "left padding");
  std::vector<i32> table(z(c.B()), 0);
  rejected(
      [&](Call<i32>& x) {
        x.in.block_table = {table.data(), shp(c.B(), 1)};
      },
      "no paged cache");
  rejected(
      [&](Call<i32>& x) {
        attnref::Dims sh = x.in.key[0].shape();
        sh[sh.size() - 1] /= 2;  // a word count of D / 16
        x.in.key[0] = {x.in.key[0].data(), sh};
      },
      "last dimension mismatch");
  // Head size 32: not a multiple of 64.
  Case c32 = c;
  c32.D = 32;
  const Built r32 = build(c32);
  auto x = call_of<i32>(r32);
  support::expect_rejected([&] { run(x, out, lse); }, "multiple of 64");
  EXPECT_TRUE(untouched(out));
  // TND (the prompt branch): no int4.
  auto t = call_of<i32>(r);
  t.p.input_layout = "TND";
  t.in.query = {r.qb.data(), shp(c.B(), c.N, c.D)};
  support::expect_rejected([&] { run(t, out, lse); }, "take Q_S == 1");
}

}  // namespace fia_int4_test
