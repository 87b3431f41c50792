// ATB SelfAttention with qkv full quantization (quantType QKV_OFFLINE / QKV_ONLINE): against
// the independent int64 / double reference of docs/semantics.md §2.8 over modes, output types,
// masks, block sizes and odd lengths around the 128-key block; offline == online where the
// definition says so; thread invariance; the quantized result against float attention on the
// dequantized data; the quantize_qkv builder; bad input.

#include <gtest/gtest.h>

#include <attnref/atb/qkv_quant.hpp>
#include <attnref/atb/self_attention.hpp>
#include <attnref/detail/simd.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "reference/atb_qkv_quant.hpp"
#include "reference/atb_self_attention.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"
#include "support/outcome.hpp"
#include "support/random.hpp"
#include "support/simd_levels.hpp"

namespace qkv_quant_test {

using attnref::bfloat16;
using attnref::half;
using attnref::Index;
using attnref::StridedView;
using P = attnref::SelfAttentionParams;
using I8 = std::int8_t;
using support::rand_i8;

enum class Mask { None, Causal, Norm, NormCompress, AlibiCompress };

const char* name(Mask m) {
  switch (m) {
    case Mask::None:
      return "none";
    case Mask::Causal:
      return "causal";
    case Mask::Norm:
      return "norm";
    case Mask::NormCompress:
      return "norm_compress";
    case Mask::AlibiCompress:
      return "alibi_compress";
  }
  return "?";
}

struct Case {
  bool online = true;
  bool bf16 = false;
  Mask mask = Mask::Causal;
  std::vector<int> seq{5, 127, 128, 129, 260};
  int nh = 4, nkv = 2, d = 64, dv = 32;
  int block = 128;
  bool high_precision = false;
  bool clamp = false;
  int mla_dv = 0;  // > 0: MLA merged kv cache, V = the first mla_dv dims of K
  int threads = 0;
  std::uint32_t seed = 1;

  std::string str() const {
    std::string s = std::string(online ? "online" : "offline") + (bf16 ? "/bf16" : "/f16") + "/" +
                    name(mask) + "/block:" + std::to_string(block) + "/d:" + std::to_string(d);
    if (high_precision) s += "/hp";
    if (clamp) s += "/clamp";
    if (mla_dv) s += "/mla:" + std::to_string(mla_dv);
    return s;
  }
};

struct Data {
  std::vector<I8> q, k, v;
  std::vector<float> qk_descale, vpv_descale, p_scale;
  std::vector<float> slopes;
  std::vector<double> mask_vals;  // the mask tensor's values (as stored), row-major
  int tokens = 0, max_seq = 0;
};

struct QRun {
  std::vector<double> out, want;
  std::vector<char> tie;  // per output row
  int dv = 0;
};

// Builds the data of a case, runs the operator and the reference.
template <class TO>
QRun run_case(const Case& c, Data* keep = nullptr) {
  std::mt19937 rng(c.seed);
  Data dt;
  for (int l : c.seq) dt.tokens += l, dt.max_seq = std::max(dt.max_seq, l);
  const int dv = c.mla_dv ? c.mla_dv : c.dv;
  dt.q = rand_i8(static_cast<size_t>(dt.tokens * c.nh * c.d), rng);
  dt.k = rand_i8(static_cast<size_t>(dt.tokens * c.nkv * c.d), rng);
  if (!c.mla_dv) dt.v = rand_i8(static_cast<size_t>(dt.tokens * c.nkv * dv), rng);
  // qkDescale makes the scores of order one (|q·k| ~ 127² sqrt(D) / 3).
  std::uniform_real_distribution<float> ud(0.5f, 1.5f);
  const float base = 3.0f / (127.0f * 127.0f * std::sqrt(static_cast<float>(c.d)));
  for (int h = 0; h < c.nh; ++h) {
    dt.qk_descale.push_back(base * ud(rng) * 4.0f);
    dt.vpv_descale.push_back(ud(rng) / 127.0f);
    dt.p_scale.push_back(ud(rng) * 1.5f / 127.0f);  // [0.75, 2.25] / 127: P8 fits int8
  }

  P p;
  p.num_heads = c.nh;
  p.num_kv_heads = c.nkv;
  p.qk_scale = 0.75f;
  p.calc_type = P::CalcType::PaEncoder;
  p.quant_type = c.online ? P::QuantType::QkvOnline : P::QuantType::QkvOffline;
  p.out_data_type = c.bf16 ? P::OutDataType::BFloat16 : P::OutDataType::Float16;
  p.kernel_type = c.high_precision ? P::KernelType::HighPrecision : P::KernelType::Default;
  p.quant_block_size = c.block;
  p.mla_v_head_size = c.mla_dv;
  if (c.clamp) {
    p.clamp_type = P::ClampType::MinMax;
    p.clamp_min = -1.5f;
    p.clamp_max = 2.0f;
  }
  ref::AtbQkvQuant r;
  r.num_heads = c.nh;
  r.num_kv_heads = c.nkv;
  r.head_size = c.d;
  r.v_head_size = dv;
  r.seq_len = c.seq;
  r.qk_scale = p.qk_scale;
  r.clamp = c.clamp;
  r.clamp_min = p.clamp_min;
  r.clamp_max = p.clamp_max;
  r.qk_descale = dt.qk_descale;
  r.vpv_descale = dt.vpv_descale;
  if (!c.online) r.p_scale = dt.p_scale;
  r.block = c.block;

  // Masks. fp16 DEFAULT: additive fp16 values (-10000 hidden); otherwise binary x -3e38.
  const bool additive = !c.bf16 && !c.high_precision;
  const double coeff = additive ? 1.0 : -3e38;
  const float hidden = additive ? -10000.0f : 1.0f;
  std::vector<TO> mask, head_mask;
  StridedView<const TO, 3> mview;
  std::bernoulli_distribution hole(0.15);
  if (c.mask == Mask::Causal) {
    p.mask_type = P::MaskType::CausalMask;
    r.mask = [](int, int i, int j) { return j > i ? -INFINITY : 0.0; };
  } else if (c.mask == Mask::Norm) {
    p.mask_type = P::MaskType::Norm;
    const int ms = dt.max_seq, nb = static_cast<int>(c.seq.size());
    for (int b = 0; b < nb; ++b)
      for (int i = 0; i < ms; ++i)
        for (int j = 0; j < ms; ++j) {
          const float x = j > i || (j != 0 && hole(rng)) ? hidden : 0.0f;
          mask.push_back(TO(x));
          dt.mask_vals.push_back(x);
        }
    mview = StridedView<const TO, 3>(mask.data(), {nb, ms, ms});
    const auto vals = dt.mask_vals;
    r.mask = [vals, ms, coeff](int b, int i, int j) {
      return vals[static_cast<size_t>((b * ms + i) * ms + j)] * coeff;
    };
  } else if (c.mask == Mask::NormCompress) {
    p.mask_type = P::MaskType::NormCompress;
    p.is_triu_mask = 1;
    for (int i = 0; i < 128; ++i)
      for (int j = 0; j < 128; ++j) mask.push_back(TO(j > i ? hidden : 0.0f));
    mview = StridedView<const TO, 3>(mask.data(), {1, 128, 128});
    // The documented triangular tile expands to the causal mask (hidden blocks: probability 0).
    r.mask = [coeff, hidden](int, int i, int j) {
      if (j / 128 > i / 128) return -static_cast<double>(INFINITY);
      return j / 128 == i / 128 && j > i ? static_cast<double>(hidden) * coeff : 0.0;
    };
  } else if (c.mask == Mask::AlibiCompress) {
    p.mask_type = P::MaskType::AlibiCompress;
    p.is_triu_mask = 1;
    // The [256, 256] tile of distances (i - j), +60000 above the diagonal, with negated slopes:
    // written from the spec, the reference uses the expanded bias slope · (j - i), causal.
    for (int i = 0; i < 256; ++i)
      for (int j = 0; j < 256; ++j)
        mask.push_back(TO(static_cast<float>(i - j) + (j > i ? 60000.0f : 0.0f)));
    mview = StridedView<const TO, 3>(mask.data(), {1, 256, 256});
    for (int h = 0; h < c.nh; ++h) dt.slopes.push_back(-std::pow(2.0f, -8.0f * (h + 1) / c.nh));
    const auto sl = dt.slopes;
    r.mask = [](int, int i, int j) { return j > i ? -INFINITY : 0.0; };
    r.head_bias = [sl](int, int h, int i, int j) {
      return j > i ? 0.0
                   : static_cast<double>(static_cast<float>(i - j) * sl[static_cast<size_t>(h)]);
    };
  }

  attnref::SelfAttentionQuantInputs<TO> in;
  in.query = StridedView<const I8, 3>(dt.q.data(), {dt.tokens, c.nh, c.d});
  in.key = StridedView<const I8, 3>(dt.k.data(), {dt.tokens, c.nkv, c.d});
  if (!c.mla_dv) in.value = StridedView<const I8, 3>(dt.v.data(), {dt.tokens, c.nkv, dv});
  in.seq_len.assign(c.seq.begin(), c.seq.end());
  in.mask = mview;
  if (!dt.slopes.empty()) in.slopes = StridedView<const float, 1>(dt.slopes.data(), {c.nh});
  in.qk_descale = StridedView<const float, 1>(dt.qk_descale.data(), {c.nh});
  in.vpv_descale = StridedView<const float, 1>(dt.vpv_descale.data(), {c.nh});
  if (!c.online) in.p_scale = StridedView<const float, 1>(dt.p_scale.data(), {c.nh});
  std::vector<TO> out(static_cast<size_t>(dt.tokens * c.nh * dv), TO(7.0f));
  attnref::self_attention(
      p, in,
      attnref::SelfAttentionOutputs<TO>{StridedView<TO, 3>(out.data(), {dt.tokens, c.nh, dv})},
      {c.threads});

  // Reference, per sequence.
  std::vector<std::vector<I8>> rq, rk, rv;
  for (size_t b = 0, t0 = 0; b < c.seq.size(); t0 += static_cast<size_t>(c.seq[b]), ++b) {
    const size_t l = static_cast<size_t>(c.seq[b]);
    const size_t rowq = static_cast<size_t>(c.nh * c.d), rowk = static_cast<size_t>(c.nkv * c.d);
    rq.emplace_back(dt.q.begin() + t0 * rowq, dt.q.begin() + (t0 + l) * rowq);
    rk.emplace_back(dt.k.begin() + t0 * rowk, dt.k.begin() + (t0 + l) * rowk);
    std::vector<I8> vb;
    for (size_t t = t0; t < t0 + l; ++t)
      for (int h = 0; h < c.nkv; ++h)
        for (int e = 0; e < dv; ++e)
          vb.push_back(c.mla_dv ? dt.k[(t * c.nkv + h) * c.d + e] : dt.v[(t * c.nkv + h) * dv + e]);
    rv.push_back(std::move(vb));
  }
  const ref::QuantResult want = ref::atb_qkv_quant(r, rq, rk, rv);
  QRun run;
  run.dv = dv;
  for (const TO& x : out) run.out.push_back(static_cast<float>(x));
  for (size_t b = 0; b < want.out.size(); ++b) {
    // The output is rounded to TO: so is the reference.
    for (double x : want.out[b]) run.want.push_back(static_cast<float>(TO(static_cast<float>(x))));
    run.tie.insert(run.tie.end(), want.tie[b].begin(), want.tie[b].end());
  }
  if (keep) *keep = std::move(dt);
  return run;
}

// Rows whose P̂ rounding sat on a tie may differ by one P8 step (compared loosely; they must be
// rare); every other row within the output type's rounding.
::testing::AssertionResult matches(const QRun& r, bool bf16) {
  const support::Tolerance tight =
      support::tolerance(bf16 ? support::Kind::BF16 : support::Kind::F16);
  std::vector<double> a, b, la, lb;
  size_t ties = 0;
  for (size_t row = 0; row < r.tie.size(); ++row) {
    auto& x = r.tie[row] ? la : a;
    auto& y = r.tie[row] ? lb : b;
    ties += r.tie[row] ? 1 : 0;
    for (int e = 0; e < r.dv; ++e) {
      x.push_back(r.want[row * static_cast<size_t>(r.dv) + static_cast<size_t>(e)]);
      y.push_back(r.out[row * static_cast<size_t>(r.dv) + static_cast<size_t>(e)]);
    }
  }
  if (ties * 20 > r.tie.size())
    return ::testing::AssertionFailure() << ties << " of " << r.tie.size() << " rows near a tie";
  auto res = support::all_close(a, b, tight);
  if (!res) return res;
  // One P8 step moves a row by at most vpvDescale · |V| / 127 / l (< 0.02 here).
  return support::all_close(la, lb, {0.02, 0.0});
}

TEST(QkvQuant, MatchesReferenceAcrossModesTypesAndMasks) {
  int n = 0;
  for (bool online : {true, false})
    for (bool bf16 : {false, true})
      for (Mask m : {Mask::None, Mask::Causal, Mask::Norm, Mask::NormCompress}) {
        Case c;
        c.online = online;
        c.bf16 = bf16;
        c.mask = m;
        c.seed = static_cast<std::uint32_t>(100 + n++);
        const QRun r = bf16 ? run_case<bfloat16>(c) : run_case<half>(c);
        EXPECT_TRUE(matches(r, bf16)) << c.str();
      }
}

TEST(QkvQuant, BlockSizesHeadSizesAndOddLengths) {
  struct V {
    int block, d, dv;
    std::vector<int> seq;
  };
  const std::vector<V> vs = {{128, 32, 32, {1, 2, 127, 128, 129, 255, 257}},
                             {64, 128, 64, {63, 64, 65, 200}},
                             {100, 96, 32, {99, 100, 101, 333}},
                             {256, 256, 256, {255, 256, 300}},
                             {1, 32, 32, {1, 3, 17}}};
  int n = 0;
  for (const V& v : vs)
    for (bool online : {true, false}) {
      Case c;
      c.online = online;
      c.block = v.block;
      c.d = v.d;
      c.dv = v.dv;
      c.seq = v.seq;
      c.nh = 2;
      c.nkv = 1;
      c.seed = static_cast<std::uint32_t>(200 + n++);
      EXPECT_TRUE(matches(run_case<half>(c), false)) << c.str();
    }
}

TEST(QkvQuant, CoexistingFeatures) {
  // The Y pairs of qkv quantization's row: high precision, clamp, compressed masks, MLA.
  int n = 0;
  for (bool online : {true, false}) {
    Case hp;
    hp.online = online;
    hp.high_precision = true;
    hp.mask = Mask::Norm;
    Case clamp;
    clamp.online = online;
    clamp.clamp = true;
    Case alibi;
    alibi.online = online;
    alibi.high_precision = true;
    alibi.mask = Mask::AlibiCompress;
    alibi.seq = {7, 130, 300};
    Case mla;
    mla.online = online;
    mla.mla_dv = 64;
    mla.d = 96;
    mla.mask = Mask::Norm;
    Case mla576;
    mla576.online = online;
    mla576.mla_dv = 512;
    mla576.d = 576;
    mla576.nh = 2;
    mla576.nkv = 1;
    mla576.seq = {3, 130};
    mla576.mask = Mask::Norm;
    for (Case* c : {&hp, &clamp, &alibi, &mla, &mla576}) {
      c->seed = static_cast<std::uint32_t>(300 + n++);
      EXPECT_TRUE(matches(run_case<half>(*c), false)) << c->str();
      c->bf16 = true;
      EXPECT_TRUE(matches(run_case<bfloat16>(*c), true)) << c->str();
    }
  }
}

TEST(QkvQuant, OfflineWithPScaleOneOver127EqualsOnline) {
  // Every row's running amax is 1 (the block holding the row maximum has P̂ = exp(0) = 1), so
  // the online scale is 1/127: offline with pScale = 1/127 is the same computation, bit for bit.
  Case c;
  c.seq = {1, 128, 129, 300};
  Data d;
  const QRun online = run_case<half>(c, &d);
  int tokens = 0;
  for (int l : c.seq) tokens += l;
  P p;
  p.num_heads = c.nh;
  p.num_kv_heads = c.nkv;
  p.qk_scale = 0.75f;
  p.calc_type = P::CalcType::PaEncoder;
  p.quant_type = P::QuantType::QkvOffline;
  p.out_data_type = P::OutDataType::Float16;
  p.mask_type = P::MaskType::CausalMask;
  const std::vector<float> p_scale(static_cast<size_t>(c.nh), 1.0f / 127.0f);
  attnref::SelfAttentionQuantInputs<half> in;
  in.query = StridedView<const I8, 3>(d.q.data(), {tokens, c.nh, c.d});
  in.key = StridedView<const I8, 3>(d.k.data(), {tokens, c.nkv, c.d});
  in.value = StridedView<const I8, 3>(d.v.data(), {tokens, c.nkv, c.dv});
  in.seq_len.assign(c.seq.begin(), c.seq.end());
  in.qk_descale = StridedView<const float, 1>(d.qk_descale.data(), {c.nh});
  in.vpv_descale = StridedView<const float, 1>(d.vpv_descale.data(), {c.nh});
  in.p_scale = StridedView<const float, 1>(p_scale.data(), {c.nh});
  std::vector<half> out(static_cast<size_t>(tokens * c.nh * c.dv));
  attnref::self_attention(
      p, in,
      attnref::SelfAttentionOutputs<half>{StridedView<half, 3>(out.data(), {tokens, c.nh, c.dv})});
  ASSERT_EQ(out.size(), online.out.size());
  for (size_t i = 0; i < out.size(); ++i)
    ASSERT_EQ(static_cast<double>(static_cast<float>(out[i])), online.out[i]) << "element " << i;
}

TEST(QkvQuant, ResultsDoNotDependOnThreads) {
  for (bool online : {true, false}) {
    Case c;
    c.online = online;
    c.threads = 1;
    const QRun one = run_case<half>(c);
    c.threads = 2;
    const QRun two = run_case<half>(c);
    ASSERT_EQ(one.out.size(), two.out.size());
    EXPECT_EQ(std::memcmp(one.out.data(), two.out.data(), one.out.size() * sizeof(double)), 0)
        << c.str();
  }
}

// The int8 kernels (AVX-512 VNNI) and the float GEMM compute the same exact integers, and every
// other step has level-independent bits: the same output at every SIMD level.
TEST(QkvQuant, SameBitsAtEverySimdLevel) {
  namespace simd = attnref::detail::simd;
  for (bool online : {true, false}) {
    Case c;
    c.online = online;
    c.mask = Mask::Norm;
    c.seq = {3, 129, 200};
    std::vector<std::vector<double>> outs;
    for (simd::Level l : support::simd_levels()) {
      const simd::Level previous = simd::set_level(l);
      const QRun r = run_case<half>(c);
      simd::set_level(previous);
      EXPECT_TRUE(matches(r, false)) << c.str() << " level " << static_cast<int>(l);
      outs.push_back(r.out);
    }
    for (size_t i = 1; i < outs.size(); ++i)
      EXPECT_EQ(outs[i], outs[0]) << c.str() << " level #" << i;
  }
}

// quantize_qkv on float data, the quantized operator, and float attention on the dequantized
// data: within quantization noise (normalised MSE <= 1e-3, cosine >= 0.999).
TEST(QkvQuant, CloseToFloatAttentionOnTheDequantizedData) {
  for (bool online : {true, false})
    for (bool causal : {false, true}) {
      const int nh = 4, nkv = 2, d = 64, dv = 64;
      const std::vector<int> seq{37, 128, 200};
      int tokens = 0;
      for (int l : seq) tokens += l;
      std::mt19937 rng(online ? 11u : 12u);
      std::normal_distribution<float> nd;
      std::vector<float> q(static_cast<size_t>(tokens * nh * d)),
          k(static_cast<size_t>(tokens * nkv * d)), v(static_cast<size_t>(tokens * nkv * dv));
      for (auto* x : {&q, &k, &v})
        for (float& e : *x) e = nd(rng);
      const attnref::QkvQuantized qz =
          attnref::quantize_qkv(StridedView<const float, 3>(q.data(), {tokens, nh, d}),
                                StridedView<const float, 3>(k.data(), {tokens, nkv, d}),
                                StridedView<const float, 3>(v.data(), {tokens, nkv, dv}));
      P p;
      p.num_heads = nh;
      p.num_kv_heads = nkv;
      p.qk_scale = 1.0f / std::sqrt(static_cast<float>(d));
      p.calc_type = P::CalcType::PaEncoder;
      p.quant_type = online ? P::QuantType::QkvOnline : P::QuantType::QkvOffline;
      p.out_data_type = P::OutDataType::Float16;
      if (causal) p.mask_type = P::MaskType::CausalMask;
      attnref::SelfAttentionQuantInputs<half> in;
      in.query = StridedView<const I8, 3>(qz.query.data(), {tokens, nh, d});
      in.key = StridedView<const I8, 3>(qz.key.data(), {tokens, nkv, d});
      in.value = StridedView<const I8, 3>(qz.value.data(), {tokens, nkv, dv});
      in.seq_len.assign(seq.begin(), seq.end());
      in.qk_descale = StridedView<const float, 1>(qz.qk_descale.data(), {nh});
      in.vpv_descale = StridedView<const float, 1>(qz.vpv_descale.data(), {nh});
      if (!online) in.p_scale = StridedView<const float, 1>(qz.p_scale.data(), {nh});
      std::vector<half> out(static_cast<size_t>(tokens * nh * dv));
      attnref::self_attention(
          p, in,
          attnref::SelfAttentionOutputs<half>{StridedView<half, 3>(out.data(), {tokens, nh, dv})});

      // Float attention (double reference, fp32 scores) on the dequantized q, k, v.
      ref::AtbSelfAttention r;
      r.num_heads = nh;
      r.num_kv_heads = nkv;
      r.head_size = d;
      r.v_head_size = dv;
      r.seq_len = seq;
      r.qk_scale = p.qk_scale;
      if (causal) r.mask = [](int, int i, int j) { return j > i ? -3e38 : 0.0; };
      std::vector<std::vector<double>> rq, rk, rv;
      for (size_t b = 0, t0 = 0; b < seq.size(); t0 += static_cast<size_t>(seq[b]), ++b) {
        std::vector<double> xq, xk, xv;
        for (size_t t = t0; t < t0 + static_cast<size_t>(seq[b]); ++t) {
          for (int h = 0; h < nh; ++h)
            for (int e = 0; e < d; ++e)
              xq.push_back(qz.query[(t * nh + h) * d + e] * static_cast<double>(qz.q_scale[h]));
          for (int h = 0; h < nkv; ++h) {
            for (int e = 0; e < d; ++e)
              xk.push_back(qz.key[(t * nkv + h) * d + e] * static_cast<double>(qz.k_scale[h]));
            for (int e = 0; e < dv; ++e)
              xv.push_back(qz.value[(t * nkv + h) * dv + e] * static_cast<double>(qz.v_scale[h]));
          }
        }
        rq.push_back(xq);
        rk.push_back(xk);
        rv.push_back(xv);
      }
      double err = 0, ref2 = 0, dot = 0, out2 = 0;
      size_t i = 0;
      for (const auto& o : ref::atb_self_attention(r, rq, rk, rv))
        for (double w : o) {
          const double a = static_cast<float>(out[i++]);
          err += (a - w) * (a - w);
          ref2 += w * w;
          dot += a * w;
          out2 += a * a;
        }
      ASSERT_EQ(i, out.size());
      const double nmse = err / ref2, cosine = dot / std::sqrt(ref2 * out2);
      EXPECT_LE(nmse, 1e-3) << (online ? "online" : "offline") << (causal ? " causal" : "");
      EXPECT_GE(cosine, 0.999) << (online ? "online" : "offline") << (causal ? " causal" : "");
    }
}

TEST(QkvQuant, QuantizeQkvRoundTripsWithinHalfAStep) {
  const int tokens = 9, nh = 4, nkv = 2, d = 8;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> q(tokens * nh * d), k(tokens * nkv * d);
  for (float& e : q) e = nd(rng);
  for (float& e : k) e = nd(rng);
  for (int e = 0; e < tokens * d; ++e)
    k[static_cast<size_t>((e / d) * nkv * d + d + e % d)] = 0;  // head 1 all zero
  const auto qz = attnref::quantize_qkv(StridedView<const float, 3>(q.data(), {tokens, nh, d}),
                                        StridedView<const float, 3>(k.data(), {tokens, nkv, d}));
  ASSERT_EQ(qz.q_scale.size(), 4u);
  ASSERT_EQ(qz.k_scale.size(), 2u);
  EXPECT_TRUE(qz.value.empty());
  EXPECT_EQ(qz.k_scale[1], 1.0f);  // an all-zero head
  for (int h = 0; h < nh; ++h) {
    float amax = 0;
    for (int t = 0; t < tokens; ++t)
      for (int e = 0; e < d; ++e)
        amax = std::max(amax, std::fabs(q[static_cast<size_t>((t * nh + h) * d + e)]));
    EXPECT_FLOAT_EQ(qz.q_scale[static_cast<size_t>(h)], amax / 127.0f);
    EXPECT_FLOAT_EQ(qz.qk_descale[static_cast<size_t>(h)],
                    qz.q_scale[static_cast<size_t>(h)] * qz.k_scale[static_cast<size_t>(h / 2)]);
    EXPECT_EQ(qz.vpv_descale[static_cast<size_t>(h)],
              qz.k_scale[static_cast<size_t>(h / 2)]);  // MLA: V in K
    for (int t = 0; t < tokens; ++t)
      for (int e = 0; e < d; ++e) {
        const size_t i = static_cast<size_t>((t * nh + h) * d + e);
        EXPECT_LE(std::fabs(qz.query[i] * qz.q_scale[static_cast<size_t>(h)] - q[i]),
                  0.5f * qz.q_scale[static_cast<size_t>(h)] * 1.0001f);
      }
  }
}

// ---------------------------------------------------------------------------------------------
// Bad input: a clear exception naming the argument, nothing written.

struct Bad {
  P p;
  attnref::SelfAttentionQuantInputs<half> in;
  std::vector<I8> q, k, v;
  std::vector<float> s1, s2, s3;
  std::vector<half> out;
  int tokens = 6, nh = 2, d = 32;

  Bad()
      : q(6 * 2 * 32, 1),
        k(6 * 2 * 32, 1),
        v(6 * 2 * 32, 1),
        s1(2, 0.01f),
        s2(2, 0.01f),
        s3(2, 0.01f),
        out(6 * 2 * 32, half(7.0f)) {
    p.num_heads = nh;
    p.calc_type = P::CalcType::PaEncoder;
    p.quant_type = P::QuantType::QkvOffline;
    p.out_data_type = P::OutDataType::Float16;
    in.query = StridedView<const I8, 3>(q.data(), {tokens, nh, d});
    in.key = StridedView<const I8, 3>(k.data(), {tokens, nh, d});
    in.value = StridedView<const I8, 3>(v.data(), {tokens, nh, d});
    in.seq_len = {2, 4};
    in.qk_descale = StridedView<const float, 1>(s1.data(), {nh});
    in.vpv_descale = StridedView<const float, 1>(s2.data(), {nh});
    in.p_scale = StridedView<const float, 1>(s3.data(), {nh});
  }
  void run(bool validate_only = false) {
    const attnref::SelfAttentionOutputs<half> o{StridedView<half, 3>(out.data(), {tokens, nh, d})};
    if (validate_only)
      attnref::validate(p, in, o);
    else
      attnref::self_attention(p, in, o);
  }
  bool untouched() const {
    for (const half& x : out)
      if (static_cast<float>(x) != 7.0f) return false;
    return true;
  }
};

void expect_error(const std::function<void(Bad&)>& edit, const std::string& what) {
  Bad b;
  edit(b);
  // validate() runs the same checks alone: the same outcome, nothing written.
  const std::string validated = support::outcome([&] { b.run(true); });
  EXPECT_TRUE(b.untouched()) << what;
  support::expect_rejected([&] { b.run(); }, what);
  EXPECT_TRUE(b.untouched()) << what;
  EXPECT_EQ(validated, support::outcome([&] { b.run(); })) << what;
}

TEST(QkvQuantErrors, ClearMessagesAndNothingWritten) {
  {
    Bad ok;
    ok.run(true);  // validate() accepts it and writes nothing
    EXPECT_TRUE(ok.untouched());
    ok.run();
    EXPECT_FALSE(ok.untouched());
  }  // the baseline runs
  expect_error([](Bad& b) { b.in.qk_descale = {}; },
               "qk_descale missing for qkv full quantization");
  expect_error([](Bad& b) { b.in.vpv_descale = StridedView<const float, 1>(b.s2.data(), {1}); },
               "vpv_descale.shape[0] mismatch with the number of heads: expected 2, got 1");
  expect_error([](Bad& b) { b.in.p_scale = {}; }, "p_scale missing");
  expect_error([](Bad& b) { b.s3[1] = 0.0f; }, "p_scale[1] not a positive finite scale");
  expect_error([](Bad& b) { b.s1[0] = NAN; }, "qk_descale[0] not finite");
  expect_error([](Bad& b) { b.p.quant_type = P::QuantType::QkvOnline; },
               "p_scale given with QkvOnline");
  expect_error([](Bad& b) { b.p.quant_type = P::QuantType::Unquant; },
               "params.quant_type not a qkv quantization with int8 inputs");
  expect_error([](Bad& b) { b.p.calc_type = P::CalcType::Undefined; },
               "params.calc_type not supported with qkv full quantization: expected PaEncoder");
  expect_error([](Bad& b) { b.p.out_data_type = P::OutDataType::BFloat16; },
               "params.out_data_type mismatch with the output type");
  expect_error([](Bad& b) { b.p.out_data_type = P::OutDataType::Undefined; },
               "params.out_data_type required by qkv full quantization");
  expect_error([](Bad& b) { b.p.quant_block_size = 0; }, "params.quant_block_size out of range");
  expect_error([](Bad& b) { b.p.q_scale = 0.5f; },
               "params.q_scale not supported with qkv full quantization");
  expect_error([](Bad& b) { b.p.scale_type = P::ScaleType::LogN; }, "not supported together");
  expect_error(
      [](Bad& b) {
        b.d = 48;
        b.in.query = StridedView<const I8, 3>(b.q.data(), {b.tokens, b.nh, 48});
      },
      "head size not supported by qkv full quantization: expected a multiple of 32, <= 256, got "
      "48");
  expect_error(
      [](Bad& b) {
        b.in.value = StridedView<const I8, 3>(b.v.data(), {6, 2, 16});
      },
      "value.shape mismatch");
  expect_error([](Bad& b) { b.in.seq_len = {2, 3}; }, "seq_len sum mismatch with query.shape[0]");

  // Floating-point q / k / v with a quant type.
  std::vector<half> q(6 * 2 * 32, half(0.0f)), out(6 * 2 * 32, half(7.0f));
  P p;
  p.num_heads = 2;
  p.calc_type = P::CalcType::PaEncoder;
  p.quant_type = P::QuantType::QkvOnline;
  p.out_data_type = P::OutDataType::Float16;
  attnref::SelfAttentionInputs<half> in;
  in.query = StridedView<const half, 3>(q.data(), {6, 2, 32});
  in.key = in.query;
  in.value = in.query;
  in.seq_len = {6};
  support::expect_rejected(
      [&] {
        attnref::self_attention(
            p, in,
            attnref::SelfAttentionOutputs<half>{StridedView<half, 3>(out.data(), {6, 2, 32})});
      },
      "query/key/value not int8 with qkv full quantization");
  for (const half& x : out) ASSERT_EQ(static_cast<float>(x), 7.0f);
}

}  // namespace qkv_quant_test
