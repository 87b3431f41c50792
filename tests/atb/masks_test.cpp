// Mask builders (against the vendor's printed examples and the formulas), the SWA_COMPRESS
// expansion, and sliding-window attention through ATB SelfAttention: compressed == expanded,
// decoder windows, the rolling SWA cache.

#include <gtest/gtest.h>

#include <attnref/atb/self_attention.hpp>
#include <attnref/mask/builders.hpp>
#include <attnref/mask/sliding_window.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "reference/atb_self_attention.hpp"
#include "support/cast.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"
#include "support/random.hpp"

namespace masks_test {

using attnref::Index;
using attnref::MaskForm;
using attnref::StridedView;
using P = attnref::SelfAttentionParams;
using support::as_doubles;
using support::randn;

// ---------------------------------------------------------------------------------------------
// Builders

TEST(MaskBuilders, SwaMaskIsTheSeedExample) {
  // The seed's example (maxSeq 5, window 3), built the way its C++ sample does: row i keeps the
  // keys from max(0, i - W + 1) to i.
  const int max_seq = 5, w = 3;
  for (MaskForm form : {MaskForm::Additive, MaskForm::Binary}) {
    const float hidden = form == MaskForm::Additive ? -65536.0f : 1.0f;
    const auto m = attnref::swa_mask<float>(max_seq, w, form, -65536.0f);
    ASSERT_EQ(m.size(), 25u);
    for (int i = 0; i < max_seq; ++i) {
      const int first = i >= w ? i - w + 1 : 0;
      for (int j = 0; j < max_seq; ++j)
        EXPECT_EQ(m[static_cast<size_t>(i * max_seq + j)], j >= first && j <= i ? 0.0f : hidden)
            << i << "," << j;
    }
  }
  // Row 4 of the example: keys 2, 3, 4 only ("The" no longer sees "the" at distance 3).
  const auto b = attnref::swa_mask<float>(5, 3, MaskForm::Binary);
  EXPECT_EQ(std::vector<float>(b.begin() + 20, b.end()), (std::vector<float>{1, 1, 0, 0, 0}));
  // A window covering the sequence is the plain causal mask.
  EXPECT_EQ(attnref::swa_mask<float>(7, 7, MaskForm::Binary),
            attnref::norm_mask<float>(7, MaskForm::Binary));
}

TEST(MaskBuilders, NormMasksInBothForms) {
  const auto a = attnref::norm_compress_mask<attnref::half>(MaskForm::Additive);
  const auto b = attnref::norm_compress_mask<attnref::bfloat16>(MaskForm::Binary);
  ASSERT_EQ(a.size(), 128u * 128u);
  for (int i = 0; i < 128; ++i)
    for (int j = 0; j < 128; ++j) {
      EXPECT_EQ(static_cast<float>(a[static_cast<size_t>(i * 128 + j)]), j > i ? -10000.0f : 0.0f);
      EXPECT_EQ(static_cast<float>(b[static_cast<size_t>(i * 128 + j)]), j > i ? 1.0f : 0.0f);
    }
}

TEST(MaskBuilders, SwaCompressTrueSize) {
  // (window, head size) -> true size, from the golden's rule (block 128 for head sizes <= 128,
  // 64 above).
  struct Row {
    Index w, hs, want;
  };
  for (const Row& r :
       {Row{1, 128, 1}, Row{100, 128, 100}, Row{384, 128, 384}, Row{385, 128, 257},
        Row{512, 128, 384}, Row{640, 128, 384}, Row{700, 128, 316}, Row{192, 192, 192},
        Row{200, 192, 136}, Row{256, 192, 192}, Row{1000, 256, 168}})
    EXPECT_EQ(attnref::swa_compress_true_size(r.w, attnref::swa_compress_block(r.hs)), r.want)
        << r.w << " " << r.hs;
  EXPECT_EQ(attnref::swa_compress_block(192, 128), 128);  // q/k and v head sizes differ
  const auto m = attnref::swa_compress_mask<float>(700, 128, MaskForm::Binary);
  EXPECT_EQ(m, attnref::swa_mask<float>(512, 316, MaskForm::Binary));
}

TEST(MaskBuilders, AlibiSlopesAreThePapersSet) {
  // Powers of two: 2^(-8k/n).
  const auto s8 = attnref::alibi_slopes(8);
  for (int k = 1; k <= 8; ++k) EXPECT_EQ(s8[static_cast<size_t>(k - 1)], std::ldexp(1.0f, -k));
  const auto s16 = attnref::alibi_slopes(16);
  for (int k = 1; k <= 16; ++k)
    EXPECT_FLOAT_EQ(s16[static_cast<size_t>(k - 1)], static_cast<float>(std::pow(2.0, -0.5 * k)));
  // 12 heads: the 8-head set, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5 (odd slopes of 16 heads).
  const auto s12 = attnref::alibi_slopes(12);
  ASSERT_EQ(s12.size(), 12u);
  for (int k = 0; k < 8; ++k) EXPECT_EQ(s12[static_cast<size_t>(k)], s8[static_cast<size_t>(k)]);
  for (int k = 0; k < 4; ++k)
    EXPECT_FLOAT_EQ(s12[static_cast<size_t>(8 + k)], s16[static_cast<size_t>(2 * k)]);
  // 40 heads: the 32-head set, then every other slope of 64 heads (2^(-k/8), k = 1, 3, ..., 15).
  const auto s40 = attnref::alibi_slopes(40);
  ASSERT_EQ(s40.size(), 40u);
  EXPECT_FLOAT_EQ(s40[0], static_cast<float>(std::pow(2.0, -0.25)));
  EXPECT_FLOAT_EQ(s40[31], static_cast<float>(std::pow(2.0, -8.0)));
  for (int k = 0; k < 8; ++k)
    EXPECT_FLOAT_EQ(s40[static_cast<size_t>(32 + k)],
                    static_cast<float>(std::pow(2.0, -(2.0 * k + 1) / 8.0)));
}

TEST(MaskBuilders, AlibiMasks) {
  const std::vector<float> slopes = {0.5f, 0.25f};
  const auto full = attnref::alibi_mask<float>(slopes, 6);
  ASSERT_EQ(full.size(), 2u * 36u);
  EXPECT_FLOAT_EQ(full[(1 * 6 + 5) * 6 + 2], 0.25f * (2 - 5));      // head 1, i 5, j 2
  EXPECT_FLOAT_EQ(full[(0 * 6 + 1) * 6 + 4], 0.5f * 3 - 10000.0f);  // above the diagonal
  const auto sq = attnref::alibi_mask<float>(slopes, 6, /*sqrt_variant=*/true);
  EXPECT_FLOAT_EQ(sq[(0 * 6 + 5) * 6 + 1], -0.5f * 2.0f);  // -slope * sqrt(4)
  const auto head = attnref::alibi_head_mask<float>(slopes, 3);
  ASSERT_EQ(head.size(), 2u * 3u * 128u);
  EXPECT_FLOAT_EQ(head[(1 * 3 + 2) * 128 + 0], 0.25f * -2);
  const auto cmp = attnref::alibi_compress_mask<float>();
  EXPECT_EQ(cmp[200 * 256 + 3], 197.0f);
  EXPECT_EQ(cmp[3 * 256 + 200], 60000.0f - 197.0f);
  const auto cmp_sqrt = attnref::alibi_compress_mask<float>(true);
  EXPECT_FLOAT_EQ(cmp_sqrt[20 * 256 + 4], 4.0f);
  EXPECT_EQ(attnref::alibi_compress_slopes(slopes), (std::vector<float>{-0.5f, -0.25f}));
  const auto left = attnref::alibi_left_align_mask<float>();
  EXPECT_EQ(left[200 * 256 + 3], 3.0f);
  EXPECT_EQ(left[3 * 256 + 200], -std::numeric_limits<float>::infinity());
  EXPECT_DOUBLE_EQ(attnref::alibi_decode_bias(0.5, 9, 10), 0.0);
  EXPECT_DOUBLE_EQ(attnref::alibi_decode_bias(0.5, 0, 10), -4.5);
}

TEST(MaskBuilders, BadArguments) {
  EXPECT_THROW(attnref::swa_mask<float>(4, 0, MaskForm::Binary), std::invalid_argument);
  EXPECT_THROW(attnref::norm_mask<float>(0, MaskForm::Binary), std::invalid_argument);
  EXPECT_THROW(attnref::alibi_slopes(0), std::invalid_argument);
  support::expect_rejected([] { attnref::alibi_mask<float>({}, 4); },
                           "attnref::alibi_mask: slopes.size() not positive");
}

// ---------------------------------------------------------------------------------------------
// SWA_COMPRESS expansion: with the documented pattern it is the window, for every window size
// around the block edges, both block sizes, and its range / tile answers agree with it.

TEST(SwaCompressHook, DocumentedPatternExpandsToTheWindow) {
  for (Index hs : {64, 192}) {
    for (Index w : {1,   2,   63,  64,  65,  100, 127, 128, 129, 192, 255,
                    256, 257, 383, 384, 385, 511, 512, 513, 640, 700, 1000}) {
      const auto hook = attnref::SwaCompressHook::make(w, hs);
      const Index bs = hook.block;
      const auto pat = attnref::swa_compress_mask<float>(w, hs, MaskForm::Binary);
      const attnref::SeqInfo si{0, 1100, 1100};
      for (Index i = 0; i < si.q_len; ++i)
        for (Index j = 0; j < si.kv_len; ++j) {
          const bool want_hidden = j > i || j <= i - w;
          const Index r = hook.pattern_row(i, j);
          const bool hidden =
              r == attnref::SwaCompressHook::kSkipped ||
              (r >= 0 && pat[static_cast<size_t>(r * 512 + hook.pattern_col(j))] != 0);
          ASSERT_EQ(hidden, want_hidden)
              << "w " << w << " block " << bs << " i " << i << " j " << j;
          if (r >= 0) {
            ASSERT_LT(r, 4 * bs);
          }
        }
      for (Index q0 = 0; q0 < si.q_len; q0 += 96) {
        const Index q1 = std::min(si.q_len, q0 + 96);
        const attnref::KvRange kr = hook.kv_range(si, q0, q1);
        for (Index k0 = 0; k0 < si.kv_len; k0 += 160) {
          const Index k1 = std::min(si.kv_len, k0 + 160);
          const auto tm = hook.classify(si, q0, q1, k0, k1);
          for (Index i = q0; i < q1; ++i)
            for (Index j = k0; j < k1; ++j) {
              const Index r = hook.pattern_row(i, j);
              if (r != attnref::SwaCompressHook::kSkipped) {
                ASSERT_TRUE(j >= kr.begin && j < kr.end);
              }
              if (tm == attnref::TileMask::All) {
                ASSERT_EQ(r, attnref::SwaCompressHook::kSkipped);
              } else if (tm == attnref::TileMask::None) {
                ASSERT_EQ(r, attnref::SwaCompressHook::kFree);
              }
            }
        }
      }
    }
  }
}

TEST(SwaCache, RollingWriteKeepsTheLastWindowTokens) {
  const Index w = 4, hidden = 3;
  std::vector<float> cache(static_cast<size_t>(w * hidden), -1.0f);
  StridedView<float, 2> cv(cache.data(), {w, hidden});
  Index next = 0;
  for (Index n : {6, 1, 1, 3}) {  // a prompt longer than the window, then appends
    std::vector<float> tok;
    for (Index r = 0; r < n; ++r)
      for (Index x = 0; x < hidden; ++x) tok.push_back(static_cast<float>((next + r) * 10 + x));
    attnref::swa_cache_write(cv, StridedView<const float, 2>(tok.data(), {n, hidden}), next, w);
    next += n;
    for (Index t = std::max<Index>(0, next - w); t < next; ++t)
      for (Index x = 0; x < hidden; ++x)
        ASSERT_EQ(cache[static_cast<size_t>((t % w) * hidden + x)], static_cast<float>(t * 10 + x));
  }
  std::vector<float> tok(static_cast<size_t>(hidden));
  // Token 4 of a window of 6 needs 5 slots; the cache has 4.
  EXPECT_THROW(
      attnref::swa_cache_write(cv, StridedView<const float, 2>(tok.data(), {1, hidden}), 4, 6),
      std::invalid_argument);
  EXPECT_NO_THROW(
      attnref::swa_cache_write(cv, StridedView<const float, 2>(tok.data(), {1, hidden}), 3, 5));
}

// ---------------------------------------------------------------------------------------------
// Through the operator (PA_ENCODER and the cache calcTypes), against the reference.

// PA_ENCODER with a sliding window given as SLIDING_WINDOW_NORM (full mask) or _COMPRESS.
template <class T>
std::vector<T> pa_swa(P::MaskType mt, Index w, Index d, const std::vector<Index>& len,
                      std::vector<double>* want = nullptr) {
  const Index nkv = 2, nh = 4;
  Index tokens = 0, max_len = 0;
  for (Index l : len) tokens += l, max_len = std::max(max_len, l);
  const auto q = randn<T>(static_cast<size_t>(tokens * nh * d), 1);
  const auto k = randn<T>(static_cast<size_t>(tokens * nkv * d), 2);
  const auto v = randn<T>(static_cast<size_t>(tokens * nkv * d), 3);
  const bool binary = !std::is_same_v<T, attnref::half>;
  const MaskForm form = binary ? MaskForm::Binary : MaskForm::Additive;
  const std::vector<T> mask =
      mt == P::MaskType::SlidingWindowCompress ? attnref::swa_compress_mask<T>(w, d, form)
      : mt == P::MaskType::SlidingWindowNorm   ? attnref::swa_mask<T>(max_len, w, form)
                                               : std::vector<T>{};
  const Index ms = mt == P::MaskType::SlidingWindowCompress ? 512 : max_len;
  P p;
  p.num_heads = nh;
  p.num_kv_heads = nkv;
  p.qk_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  p.calc_type = P::CalcType::PaEncoder;
  p.mask_type = mt;
  p.window_size = static_cast<int>(w);
  attnref::SelfAttentionInputs<T> in;
  in.query = StridedView<const T, 3>(q.data(), {tokens, nh, d});
  in.key = StridedView<const T, 3>(k.data(), {tokens, nkv, d});
  in.value = StridedView<const T, 3>(v.data(), {tokens, nkv, d});
  in.seq_len = len;
  if (!mask.empty()) in.mask = StridedView<const T, 3>(mask.data(), {1, ms, ms});
  std::vector<T> o(static_cast<size_t>(tokens * nh * d));
  attnref::self_attention(
      p, in, attnref::SelfAttentionOutputs<T>{StridedView<T, 3>(o.data(), {tokens, nh, d})});
  if (want) {
    ref::AtbSelfAttention r;
    r.num_heads = static_cast<int>(nh);
    r.num_kv_heads = static_cast<int>(nkv);
    r.head_size = r.v_head_size = static_cast<int>(d);
    r.qk_scale = p.qk_scale;
    r.fp16_scores = !binary;
    r.mask = [w, binary](int, int i, int j) {
      return j > i || j <= i - w ? (binary ? -3e38 : -10000.0) : 0.0;
    };
    std::vector<std::vector<double>> rq, rk, rv;
    Index t0 = 0;
    for (Index l : len) {
      r.seq_len.push_back(static_cast<int>(l));
      rq.emplace_back(
          as_doubles(std::vector<T>(q.begin() + t0 * nh * d, q.begin() + (t0 + l) * nh * d)));
      rk.emplace_back(
          as_doubles(std::vector<T>(k.begin() + t0 * nkv * d, k.begin() + (t0 + l) * nkv * d)));
      rv.emplace_back(
          as_doubles(std::vector<T>(v.begin() + t0 * nkv * d, v.begin() + (t0 + l) * nkv * d)));
      t0 += l;
    }
    want->clear();
    for (const auto& x : ref::atb_self_attention(r, rq, rk, rv))
      want->insert(want->end(), x.begin(), x.end());
  }
  return o;
}

TEST(SelfAttentionSwa, CompressedPatternEqualsTheFullMaskAndTheReference) {
  const std::vector<Index> len = {520, 5};
  struct Config {
    Index d, w;
  };
  // Blocks of 128 (head size 16) and of 64 (head size 144); windows inside one block, across
  // block edges, and beyond 3 blocks (where the pattern holds a shorter "true size").
  for (const Config& c :
       {Config{16, 1}, Config{16, 129}, Config{16, 385}, Config{144, 65}, Config{144, 200}}) {
    const Index d = c.d, w = c.w;
    {
      std::vector<double> want;
      const auto full = pa_swa<attnref::bfloat16>(P::MaskType::SlidingWindowNorm, w, d, len, &want);
      const auto cmp = pa_swa<attnref::bfloat16>(P::MaskType::SlidingWindowCompress, w, d, len);
      const auto tol = support::tolerance(support::Kind::BF16);
      EXPECT_TRUE(support::all_close(want, as_doubles(full), tol)) << "full, w " << w << " d " << d;
      EXPECT_TRUE(support::all_close(want, as_doubles(cmp), tol)) << "compressed, w " << w;
    }
  }
  // fp16 DEFAULT (additive masks, fp16 scores).
  std::vector<double> want;
  const auto cmp = pa_swa<attnref::half>(P::MaskType::SlidingWindowCompress, 200, 16, len, &want);
  EXPECT_TRUE(support::all_close(want, as_doubles(cmp), support::tolerance(support::Kind::F16)));
}

TEST(SelfAttentionSwa, WindowCoveringTheSequencesIsCausal) {
  const std::vector<Index> len = {40, 7};
  const auto causal = pa_swa<attnref::bfloat16>(P::MaskType::CausalMask, 0, 16, len);
  for (Index w : {40, 41, 1000}) {
    const auto swa = pa_swa<attnref::bfloat16>(P::MaskType::SlidingWindowNorm, w, 16, len);
    EXPECT_TRUE(support::all_close(as_doubles(causal), as_doubles(swa),
                                   support::tolerance(support::Kind::BF16)))
        << w;
  }
}

// Decoder steps over a cache: cacheType NORM keeps every token and attends the last W; cacheType
// SWA keeps only W slots. Both must give the attention over the last W tokens.
struct DecodeRun {
  std::vector<double> out, want;
};

DecodeRun decode_steps(P::CacheType cache_type, Index w, unsigned seed) {
  using T = attnref::bfloat16;
  const Index nkv = 2, nh = 4, d = 16, prompt = 9, steps = 7, batch = 2;
  const Index max_seq = cache_type == P::CacheType::Swa ? w : prompt + steps;
  std::vector<T> kc(static_cast<size_t>(batch * max_seq * nkv * d), T(std::nanf("")));
  std::vector<T> vc(kc.size(), T(std::nanf("")));
  StridedView<T, 4> kv(kc.data(), {1, batch, max_seq, nkv * d}),
      vv(vc.data(), {1, batch, max_seq, nkv * d});
  // All tokens of both sequences, [batch][t][heads * d].
  const Index total = prompt + steps;
  const auto q = randn<T>(static_cast<size_t>(batch * total * nh * d), seed);
  const auto k = randn<T>(static_cast<size_t>(batch * total * nkv * d), seed + 1);
  const auto v = randn<T>(static_cast<size_t>(batch * total * nkv * d), seed + 2);
  auto rows = [&](const std::vector<T>& x, Index width, Index t0, Index n) {
    std::vector<T> r;
    for (Index b = 0; b < batch; ++b)
      r.insert(r.end(), x.begin() + (b * total + t0) * width,
               x.begin() + (b * total + t0 + n) * width);
    return r;
  };
  P p;
  p.num_heads = nh;
  p.num_kv_heads = nkv;
  p.qk_scale = 0.25f;
  p.window_size = static_cast<int>(w);
  p.cache_type = cache_type;
  p.mask_type = P::MaskType::SlidingWindowNorm;
  // Prompt: ENCODER with the full SWA mask (bf16: binary).
  const auto mask = attnref::swa_mask<T>(prompt, w, MaskForm::Binary);
  {
    p.calc_type = P::CalcType::Encoder;
    const auto qs = rows(q, nh * d, 0, prompt), ks = rows(k, nkv * d, 0, prompt),
               vs = rows(v, nkv * d, 0, prompt);
    std::vector<T> o(qs.size());
    attnref::SelfAttentionInputs<T> in;
    in.query = StridedView<const T, 3>(qs.data(), {batch * prompt, nh, d});
    in.key = StridedView<const T, 3>(ks.data(), {batch * prompt, nkv, d});
    in.value = StridedView<const T, 3>(vs.data(), {batch * prompt, nkv, d});
    in.seq_len = {prompt, prompt};
    in.token_offset = {prompt, prompt};
    in.mask = StridedView<const T, 3>(mask.data(), {1, prompt, prompt});
    attnref::self_attention(p, in,
                            attnref::SelfAttentionOutputs<T>{
                                StridedView<T, 3>(o.data(), {batch * prompt, nh, d}), kv, vv});
  }
  DecodeRun res;
  p.calc_type = P::CalcType::Decoder;
  for (Index s = 0; s < steps; ++s) {
    const Index t = prompt + s;
    const auto qs = rows(q, nh * d, t, 1), ks = rows(k, nkv * d, t, 1), vs = rows(v, nkv * d, t, 1);
    std::vector<T> o(qs.size());
    attnref::SelfAttentionInputs<T> in;
    in.query = StridedView<const T, 3>(qs.data(), {batch, nh, d});
    in.key = StridedView<const T, 3>(ks.data(), {batch, nkv, d});
    in.value = StridedView<const T, 3>(vs.data(), {batch, nkv, d});
    in.seq_len = {1, 1};
    in.token_offset = {t + 1, t + 1};
    attnref::self_attention(
        p, in,
        attnref::SelfAttentionOutputs<T>{StridedView<T, 3>(o.data(), {batch, nh, d}), kv, vv});
    const auto od = as_doubles(o);
    res.out.insert(res.out.end(), od.begin(), od.end());
    // Reference: the last W tokens [t + 1 - W, t].
    ref::AtbSelfAttention r;
    r.num_heads = static_cast<int>(nh);
    r.num_kv_heads = static_cast<int>(nkv);
    r.head_size = r.v_head_size = static_cast<int>(d);
    r.qk_scale = 0.25;
    const Index first = std::max<Index>(0, t + 1 - w);
    std::vector<std::vector<double>> rq, rk, rv;
    for (Index b = 0; b < batch; ++b) {
      r.seq_len.push_back(1);
      rq.push_back(as_doubles(std::vector<T>(q.begin() + (b * total + t) * nh * d,
                                             q.begin() + (b * total + t + 1) * nh * d)));
      rk.push_back(as_doubles(std::vector<T>(k.begin() + (b * total + first) * nkv * d,
                                             k.begin() + (b * total + t + 1) * nkv * d)));
      rv.push_back(as_doubles(std::vector<T>(v.begin() + (b * total + first) * nkv * d,
                                             v.begin() + (b * total + t + 1) * nkv * d)));
      r.kv_len.push_back(static_cast<int>(t + 1 - first));
    }
    for (const auto& x : ref::atb_self_attention(r, rq, rk, rv))
      res.want.insert(res.want.end(), x.begin(), x.end());
  }
  // The rolling cache holds token t in slot t % W.
  if (cache_type == P::CacheType::Swa) {
    for (Index b = 0; b < batch; ++b)
      for (Index t = total - w; t < total; ++t)
        for (Index x = 0; x < nkv * d; ++x)
          EXPECT_EQ(static_cast<float>(kv(0, b, t % w, x)),
                    static_cast<float>(k[static_cast<size_t>((b * total + t) * nkv * d + x)]));
  }
  return res;
}

TEST(SelfAttentionSwa, DecoderAttendsTheLastWindowWithEitherCacheType) {
  for (Index w : {1, 3, 8}) {
    const auto norm = decode_steps(P::CacheType::Norm, w, 10);
    EXPECT_TRUE(support::all_close(norm.want, norm.out, support::tolerance(support::Kind::BF16)))
        << "cacheType NORM, w " << w;
    const auto swa = decode_steps(P::CacheType::Swa, w, 10);
    EXPECT_TRUE(support::all_close(swa.want, swa.out, support::tolerance(support::Kind::BF16)))
        << "cacheType SWA, w " << w;
  }
}

// `p` on `in` must be rejected naming `fragment`, the output o [tokens, nh, d] (all 7) untouched.
template <class T>
void expect_rejected(const P& p, const attnref::SelfAttentionInputs<T>& in, std::vector<T>& o,
                     Index tokens, Index nh, Index d, const std::string& fragment) {
  support::expect_rejected(
      [&] {
        attnref::self_attention(
            p, in, attnref::SelfAttentionOutputs<T>{StridedView<T, 3>(o.data(), {tokens, nh, d})});
      },
      fragment);
  for (const T& x : o) ASSERT_EQ(static_cast<float>(x), 7.0f);
}

TEST(SelfAttentionSwa, BadInput) {
  using T = attnref::half;
  const Index tokens = 4, nh = 2, d = 16;
  std::vector<T> q(static_cast<size_t>(tokens * nh * d), T(0.5f)), o(q.size(), T(7.0f));
  std::vector<T> mask(512 * 512, T(0.0f));
  auto expect = [&](const P& p, const attnref::SelfAttentionInputs<T>& in,
                    const std::string& fragment) {
    expect_rejected(p, in, o, tokens, nh, d, fragment);
  };
  P p;
  p.num_heads = nh;
  p.calc_type = P::CalcType::PaEncoder;
  p.mask_type = P::MaskType::SlidingWindowCompress;
  p.window_size = 2;
  attnref::SelfAttentionInputs<T> in;
  in.query = StridedView<const T, 3>(q.data(), {tokens, nh, d});
  in.key = StridedView<const T, 3>(q.data(), {tokens, nh, d});
  in.value = StridedView<const T, 3>(q.data(), {tokens, nh, d});
  in.seq_len = {tokens};
  expect(p, in, "mask missing for SLIDING_WINDOW_COMPRESS");
  in.mask = StridedView<const T, 3>(mask.data(), {1, 256, 256});
  expect(p, in, "mask.shape mismatch for SLIDING_WINDOW_COMPRESS: expected [1, 512, 512]");
  p.mask_type = P::MaskType::SlidingWindowNorm;
  in.mask = StridedView<const T, 3>{};
  expect(p, in, "mask missing for SLIDING_WINDOW_NORM");
  p.window_size = 0;
  expect(p, in, "params.window_size must be positive with a sliding-window mask");

  // DECODER generates its window: a mask is an error.
  std::vector<T> kc(static_cast<size_t>(tokens * 8 * nh * d), T(0.0f)), vc(kc);
  P dec;
  dec.num_heads = nh;
  dec.calc_type = P::CalcType::Decoder;
  dec.mask_type = P::MaskType::SlidingWindowNorm;
  dec.window_size = 3;
  attnref::SelfAttentionInputs<T> din;
  din.query = StridedView<const T, 3>(q.data(), {tokens, nh, d});
  din.key = StridedView<const T, 3>(q.data(), {tokens, nh, d});
  din.value = StridedView<const T, 3>(q.data(), {tokens, nh, d});
  din.seq_len = {1, 1, 1, 1};
  din.token_offset = {2, 3, 4, 5};
  din.mask = StridedView<const T, 3>(mask.data(), {4, 1, 8});
  support::expect_rejected(
      [&] {
        attnref::self_attention(
            dec, din,
            attnref::SelfAttentionOutputs<T>{StridedView<T, 3>(o.data(), {tokens, nh, d}),
                                             StridedView<T, 4>(kc.data(), {1, tokens, 8, nh * d}),
                                             StridedView<T, 4>(vc.data(), {1, tokens, 8, nh * d})});
      },
      "mask given with SLIDING_WINDOW_NORM and DECODER (the window is generated)");
  for (const T& x : kc) ASSERT_EQ(static_cast<float>(x), 0.0f);
}

// ---------------------------------------------------------------------------------------------
// ALiBi through the operator (PA_ENCODER), against the reference's own bias formulas.

struct AlibiRun {
  std::vector<double> got, want;
};

template <class T>
AlibiRun pa_alibi(P::MaskType mt, bool head_mask_form, const std::vector<Index>& len,
                  bool high_precision = true) {
  const Index nkv = 2, nh = 4, d = 32;
  Index tokens = 0, max_len = 0;
  for (Index l : len) tokens += l, max_len = std::max(max_len, l);
  const auto q = randn<T>(static_cast<size_t>(tokens * nh * d), 21);
  const auto k = randn<T>(static_cast<size_t>(tokens * nkv * d), 22);
  const auto v = randn<T>(static_cast<size_t>(tokens * nkv * d), 23);
  const std::vector<float> slopes = attnref::alibi_slopes(nh);
  const bool fp16_scores = std::is_same_v<T, attnref::half> && !high_precision;
  const float masked = fp16_scores ? -10000.0f : -std::numeric_limits<float>::infinity();
  P p;
  p.num_heads = nh;
  p.num_kv_heads = nkv;
  p.qk_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  p.calc_type = P::CalcType::PaEncoder;
  p.kernel_type = high_precision ? P::KernelType::HighPrecision : P::KernelType::Default;
  p.mask_type = mt;
  attnref::SelfAttentionInputs<T> in;
  in.query = StridedView<const T, 3>(q.data(), {tokens, nh, d});
  in.key = StridedView<const T, 3>(k.data(), {tokens, nkv, d});
  in.value = StridedView<const T, 3>(v.data(), {tokens, nkv, d});
  in.seq_len = len;
  std::vector<T> tile, hm;
  std::vector<float> in_slopes;
  const double inf = std::numeric_limits<double>::infinity();
  std::function<double(int, int, int, int)> bias;  // the reference's term, from the formulas
  if (mt == P::MaskType::Alibi) {
    hm = attnref::alibi_mask<T>(slopes, max_len, false, masked);
    in.head_mask = StridedView<const T, 4>(hm.data(), {1, nh, max_len, max_len});
    bias = [&hm, max_len](int, int h, int i, int j) {  // the tensor itself: it is the input
      return static_cast<double>(
          static_cast<float>(hm[static_cast<size_t>((h * max_len + i) * max_len + j)]));
    };
  } else if (head_mask_form) {
    hm = attnref::alibi_head_mask<T>(slopes, max_len, masked);
    in.head_mask = StridedView<const T, 4>(hm.data(), {1, nh, max_len, 128});
    bias = [&slopes, inf](int, int h, int i, int j) {
      return j > i ? -inf : static_cast<double>(slopes[static_cast<size_t>(h)]) * (j - i);
    };
  } else {
    const bool left = mt == P::MaskType::AlibiCompressLeftAlign;
    const bool sq = mt == P::MaskType::AlibiCompressSqrt;
    tile = left ? attnref::alibi_left_align_mask<T>() : attnref::alibi_compress_mask<T>(sq);
    in_slopes = left ? slopes : attnref::alibi_compress_slopes(slopes);
    in.mask = StridedView<const T, 3>(tile.data(), {1, 256, 256});
    in.slopes = StridedView<const float, 1>(in_slopes.data(), {nh});
    bias = [&slopes, inf, left, sq](int, int h, int i, int j) {
      const double s = slopes[static_cast<size_t>(h)];
      if (j > i) return -inf;
      if (left) return s * j;
      return sq ? -s * std::sqrt(static_cast<double>(i - j)) : s * (j - i);
    };
  }
  std::vector<T> o(static_cast<size_t>(tokens * nh * d));
  attnref::self_attention(
      p, in, attnref::SelfAttentionOutputs<T>{StridedView<T, 3>(o.data(), {tokens, nh, d})});
  ref::AtbSelfAttention r;
  r.num_heads = static_cast<int>(nh);
  r.num_kv_heads = static_cast<int>(nkv);
  r.head_size = r.v_head_size = static_cast<int>(d);
  r.qk_scale = p.qk_scale;
  r.fp16_scores = fp16_scores;
  r.head_bias = bias;
  std::vector<std::vector<double>> rq, rk, rv;
  Index t0 = 0;
  for (Index l : len) {
    r.seq_len.push_back(static_cast<int>(l));
    rq.emplace_back(
        as_doubles(std::vector<T>(q.begin() + t0 * nh * d, q.begin() + (t0 + l) * nh * d)));
    rk.emplace_back(
        as_doubles(std::vector<T>(k.begin() + t0 * nkv * d, k.begin() + (t0 + l) * nkv * d)));
    rv.emplace_back(
        as_doubles(std::vector<T>(v.begin() + t0 * nkv * d, v.begin() + (t0 + l) * nkv * d)));
    t0 += l;
  }
  AlibiRun res;
  for (const auto& x : ref::atb_self_attention(r, rq, rk, rv))
    res.want.insert(res.want.end(), x.begin(), x.end());
  res.got = as_doubles(o);
  return res;
}

TEST(SelfAttentionAlibi, FullMaskInEveryEncoding) {
  const std::vector<Index> len = {37, 130, 1};
  const auto bf = pa_alibi<attnref::bfloat16>(P::MaskType::Alibi, false, len);
  EXPECT_TRUE(support::all_close(bf.want, bf.got, support::tolerance(support::Kind::BF16)));
  const auto hp = pa_alibi<attnref::half>(P::MaskType::Alibi, false, len, true);
  EXPECT_TRUE(support::all_close(hp.want, hp.got, support::tolerance(support::Kind::F16)));
  const auto def = pa_alibi<attnref::half>(P::MaskType::Alibi, false, len, false);
  EXPECT_TRUE(support::all_close(def.want, def.got, support::tolerance(support::Kind::F16)));
}

TEST(SelfAttentionAlibi, CompressedTilesExpandToTheBias) {
  // Lengths around the 128-blocks the tile is expanded over.
  const std::vector<Index> len = {300, 129, 128, 5};
  const auto tol = support::tolerance(support::Kind::BF16);
  const auto dist = pa_alibi<attnref::bfloat16>(P::MaskType::AlibiCompress, false, len);
  EXPECT_TRUE(support::all_close(dist.want, dist.got, tol)) << "ALIBI_COMPRESS";
  const auto left = pa_alibi<attnref::bfloat16>(P::MaskType::AlibiCompressLeftAlign, false, len);
  EXPECT_TRUE(support::all_close(left.want, left.got, tol)) << "LEFT_ALIGN";
  const auto head = pa_alibi<attnref::bfloat16>(P::MaskType::AlibiCompress, true, len);
  EXPECT_TRUE(support::all_close(head.want, head.got, tol)) << "[headNum, seqLen, 128]";
  // The sqrt tile holds irrational values: float data keeps them exact enough to compare.
  const auto sq = pa_alibi<float>(P::MaskType::AlibiCompressSqrt, false, len);
  EXPECT_TRUE(support::all_close(sq.want, sq.got, support::tolerance(support::Kind::F32)))
      << "SQRT";
  const auto hp16 = pa_alibi<attnref::half>(P::MaskType::AlibiCompress, false, len, true);
  EXPECT_TRUE(support::all_close(hp16.want, hp16.got, support::tolerance(support::Kind::F16)));
}

TEST(SelfAttentionAlibi, BadInput) {
  using T = attnref::bfloat16;
  const Index tokens = 6, nh = 2, d = 16;
  std::vector<T> q(static_cast<size_t>(tokens * nh * d), T(0.5f)), o(q.size(), T(7.0f));
  const auto tile = attnref::alibi_compress_mask<T>();
  const std::vector<float> slopes = {-0.5f, -0.25f, -0.125f};
  auto expect = [&](const P& p, const attnref::SelfAttentionInputs<T>& in,
                    const std::string& fragment) {
    expect_rejected(p, in, o, tokens, nh, d, fragment);
  };
  P p;
  p.num_heads = nh;
  p.calc_type = P::CalcType::PaEncoder;
  p.mask_type = P::MaskType::AlibiCompress;
  attnref::SelfAttentionInputs<T> in;
  in.query = StridedView<const T, 3>(q.data(), {tokens, nh, d});
  in.key = StridedView<const T, 3>(q.data(), {tokens, nh, d});
  in.value = StridedView<const T, 3>(q.data(), {tokens, nh, d});
  in.seq_len = {tokens};
  expect(p, in, "mask missing for a compressed ALiBi mask");
  in.mask = StridedView<const T, 3>(tile.data(), {1, 256, 256});
  expect(p, in, "slopes missing for a compressed ALiBi mask");
  in.slopes = StridedView<const float, 1>(slopes.data(), {3});
  expect(p, in, "slopes.shape[0] mismatch with the number of heads: expected 2, got 3");
  in.slopes = StridedView<const float, 1>(slopes.data(), {2});
  in.mask = StridedView<const T, 3>(tile.data(), {1, 128, 128});
  expect(p, in, "mask.shape mismatch for a compressed ALiBi mask: expected [1, 256, 256]");
  p.mask_type = P::MaskType::Alibi;
  expect(p, in, "head_mask missing for ALIBI");
  P enc = p;
  enc.mask_type = P::MaskType::AlibiCompressSqrt;
  enc.calc_type = P::CalcType::Encoder;
  expect(enc, in, "params.calc_type not supported with a compressed ALiBi mask");
  // fp16 needs HIGH_PRECISION with a compressed ALiBi mask.
  using H = attnref::half;
  std::vector<H> qh(q.size(), H(0.5f)), oh(q.size(), H(7.0f));
  const auto tile16 = attnref::alibi_compress_mask<H>();
  attnref::SelfAttentionInputs<H> ih;
  ih.query = StridedView<const H, 3>(qh.data(), {tokens, nh, d});
  ih.key = ih.query;
  ih.value = ih.query;
  ih.seq_len = {tokens};
  ih.mask = StridedView<const H, 3>(tile16.data(), {1, 256, 256});
  ih.slopes = StridedView<const float, 1>(slopes.data(), {2});
  P ph = p;
  ph.mask_type = P::MaskType::AlibiCompress;
  EXPECT_THROW(
      attnref::self_attention(
          ph, ih, attnref::SelfAttentionOutputs<H>{StridedView<H, 3>(oh.data(), {tokens, nh, d})}),
      std::invalid_argument);
  ph.kernel_type = P::KernelType::HighPrecision;
  EXPECT_NO_THROW(attnref::self_attention(
      ph, ih, attnref::SelfAttentionOutputs<H>{StridedView<H, 3>(oh.data(), {tokens, nh, d})}));
}

}  // namespace masks_test
