// ATB SelfAttention: PREFIX_ENCODER over paged caches (CAUSAL_MASK and NORM_COMPRESS), the MLA
// merged kv cache, the kv tensorlist and the BNSD layout, against the independent reference and
// as metamorphic relations (tensorlist == concatenated cache, BNSD == BSND, prefix without a
// prefix == PA_ENCODER).

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/atb/self_attention.hpp>
#include <attnref/mask/builders.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "reference/atb_self_attention.hpp"
#include "support/bits.hpp"
#include "support/cast.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"
#include "support/outcome.hpp"

namespace self_attention_layout_test {

using attnref::Index;
using attnref::StridedView;
using P = attnref::SelfAttentionParams;
using support::dbl;
using support::same_bits;

template <class T>
std::vector<T> random_tensor(size_t n, unsigned seed, double scale = 1.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd;
  std::vector<T> x(n);
  for (auto& e : x) e = T(static_cast<float>(scale * nd(rng)));
  return x;
}

// ---------------------------------------------------------------------------------------------
// PREFIX_ENCODER

struct PrefixCase {
  std::vector<int> q_len, kv_len;
  int block_size = 16;
  int nkv = 2, group = 2, d = 32, dv = 16;
  bool compress = false;     // NORM_COMPRESS tile instead of CAUSAL_MASK
  bool random_tile = false;  // a non-triangular tile: checks the block expansion rule itself
  bool alibi = false;        // ALIBI_COMPRESS: the [256, 256] distance tile + negated slopes
};

template <class T>
struct PrefixRun {
  std::vector<double> got, want;
  std::vector<std::vector<double>> q, k, v;  // per sequence, as the reference saw them
  float qk_scale = 1.0f;
};

template <class T>
PrefixRun<T> run_prefix(const PrefixCase& c, unsigned seed) {
  const int nb = static_cast<int>(c.q_len.size()), nh = c.nkv * c.group, bs = c.block_size;
  int tokens = 0, blocks = 3, max_blocks = 0;
  for (int b = 0; b < nb; ++b) {
    tokens += c.q_len[static_cast<size_t>(b)];
    const int n = (c.kv_len[static_cast<size_t>(b)] + bs - 1) / bs;
    blocks += n;
    max_blocks = std::max(max_blocks, n + 1);
  }
  // Pools with NaN everywhere but the used rows; blocks handed out shuffled; -1 padding.
  const T nan = T(std::numeric_limits<float>::quiet_NaN());
  std::vector<T> kpool(static_cast<size_t>(blocks * bs * c.nkv * c.d), nan);
  std::vector<T> vpool(static_cast<size_t>(blocks * bs * c.nkv * c.dv), nan);
  std::vector<std::int32_t> ids(static_cast<size_t>(blocks));
  for (int i = 0; i < blocks; ++i) ids[static_cast<size_t>(i)] = i;
  std::mt19937 rng(seed);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<std::int32_t> table(static_cast<size_t>(nb * max_blocks), -1);
  const auto kdata = random_tensor<T>(kpool.size(), seed + 1);
  const auto vdata = random_tensor<T>(vpool.size(), seed + 2);
  std::vector<std::vector<double>> rk(nb), rv(nb), rq(nb);
  size_t next = 0;
  for (int b = 0; b < nb; ++b) {
    const int kl = c.kv_len[static_cast<size_t>(b)];
    for (int j = 0; j < (kl + bs - 1) / bs; ++j)
      table[static_cast<size_t>(b * max_blocks + j)] = ids[next++];
    for (int t = 0; t < kl; ++t) {
      const int blk = table[static_cast<size_t>(b * max_blocks + t / bs)];
      const size_t krow = static_cast<size_t>((blk * bs + t % bs) * c.nkv * c.d);
      const size_t vrow = static_cast<size_t>((blk * bs + t % bs) * c.nkv * c.dv);
      for (int e = 0; e < c.nkv * c.d; ++e) {
        kpool[krow + static_cast<size_t>(e)] = kdata[krow + static_cast<size_t>(e)];
        rk[b].push_back(dbl(kpool[krow + static_cast<size_t>(e)]));
      }
      for (int e = 0; e < c.nkv * c.dv; ++e) {
        vpool[vrow + static_cast<size_t>(e)] = vdata[vrow + static_cast<size_t>(e)];
        rv[b].push_back(dbl(vpool[vrow + static_cast<size_t>(e)]));
      }
    }
  }
  const auto q = random_tensor<T>(static_cast<size_t>(tokens * nh * c.d), seed + 3);
  int t0 = 0;
  for (int b = 0; b < nb; ++b) {
    for (int e = 0; e < c.q_len[static_cast<size_t>(b)] * nh * c.d; ++e)
      rq[b].push_back(dbl(q[static_cast<size_t>(t0 * nh * c.d + e)]));
    t0 += c.q_len[static_cast<size_t>(b)];
  }
  // The 128 x 128 tile, upper triangle or random with a clear diagonal, as the PREFIX_ENCODER
  // kernel takes it: fp16 additive (-10000 hidden, the vendor's prefix cases), bf16 binary.
  constexpr bool kFp16 = std::is_same_v<T, attnref::half>;
  const float hidden = kFp16 ? -10000.0f : 1.0f;
  const double factor = kFp16 ? 1.0 : -3e38;
  std::vector<T> tile(128 * 128);
  std::uniform_real_distribution<double> ud(0, 1);
  for (int i = 0; i < 128; ++i)
    for (int j = 0; j < 128; ++j)
      tile[static_cast<size_t>(i * 128 + j)] =
          T(c.random_tile ? (j != i && ud(rng) < 0.3 ? hidden : 0.0f) : (j > i ? hidden : 0.0f));

  P p;
  p.num_heads = nh;
  p.num_kv_heads = c.nkv;
  p.calc_type = P::CalcType::PrefixEncoder;
  p.kernel_type = P::KernelType::HighPrecision;
  p.is_triu_mask = 1;
  p.mask_type = c.alibi      ? P::MaskType::AlibiCompress
                : c.compress ? P::MaskType::NormCompress
                             : P::MaskType::CausalMask;
  p.qk_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.d)));
  attnref::SelfAttentionInputs<T> in;
  in.query = StridedView<const T, 3>(q.data(), {tokens, nh, c.d});
  in.key = StridedView<const T, 3>(kpool.data(), {blocks, bs, c.nkv * c.d});
  in.value = StridedView<const T, 3>(vpool.data(), {blocks, bs, c.nkv * c.dv});
  in.seq_len.assign(c.q_len.begin(), c.q_len.end());
  in.kv_seq_len.assign(c.kv_len.begin(), c.kv_len.end());
  in.block_tables = StridedView<const std::int32_t, 2>(table.data(), {nb, max_blocks});
  if (c.compress) in.mask = StridedView<const T, 3>(tile.data(), {1, 128, 128});
  const std::vector<float> slopes = attnref::alibi_slopes(nh);
  const std::vector<float> neg = attnref::alibi_compress_slopes(slopes);
  const std::vector<T> alibi_tile = attnref::alibi_compress_mask<T>();
  if (c.alibi) {
    in.mask = StridedView<const T, 3>(alibi_tile.data(), {1, 256, 256});
    in.slopes = StridedView<const float, 1>(neg.data(), {nh});
  }
  std::vector<T> o(static_cast<size_t>(tokens * nh * c.dv), T(7.0f));
  attnref::self_attention(
      p, in, attnref::SelfAttentionOutputs<T>{StridedView<T, 3>(o.data(), {tokens, nh, c.dv})});

  ref::AtbSelfAttention r;
  r.num_heads = nh;
  r.num_kv_heads = c.nkv;
  r.head_size = c.d;
  r.v_head_size = c.dv;
  r.seq_len = c.q_len;
  r.kv_len = c.kv_len;
  r.qk_scale = static_cast<double>(p.qk_scale);
  const std::vector<int> ql = c.q_len, kl = c.kv_len;
  // Query i of sequence b sits at absolute position i + kv - q (bottom-right alignment).
  if (c.alibi) {
    // Bias slope_h * (j - pos), keys after pos hidden.
    r.mask = [ql, kl](int b, int i, int j) {
      return j > i + kl[static_cast<size_t>(b)] - ql[static_cast<size_t>(b)] ? -3e38 : 0.0;
    };
    r.head_bias = [&slopes, ql, kl](int b, int h, int i, int j) {
      const int pos = i + kl[static_cast<size_t>(b)] - ql[static_cast<size_t>(b)];
      return j > pos ? 0.0 : static_cast<double>(slopes[static_cast<size_t>(h)]) * (j - pos);
    };
  } else if (c.compress) {
    r.mask = [&tile, ql, kl, factor](int b, int i, int j) {
      const int pos = i + kl[static_cast<size_t>(b)] - ql[static_cast<size_t>(b)];
      if (j / 128 > pos / 128) return -3e38;  // block above the diagonal: skipped
      if (j / 128 < pos / 128) return 0.0;    // block below: unmasked
      return dbl(tile[static_cast<size_t>((pos % 128) * 128 + j % 128)]) * factor;
    };
  } else {
    r.mask = [ql, kl](int b, int i, int j) {
      return j > i + kl[static_cast<size_t>(b)] - ql[static_cast<size_t>(b)] ? -3e38 : 0.0;
    };
  }
  PrefixRun<T> res;
  for (const auto& w : ref::atb_self_attention(r, rq, rk, rv))
    res.want.insert(res.want.end(), w.begin(), w.end());
  for (const T& x : o) res.got.push_back(dbl(x));
  res.q = rq;
  res.k = rk;
  res.v = rv;
  res.qk_scale = p.qk_scale;
  return res;
}

template <class T>
void expect_prefix(const PrefixCase& c, unsigned seed) {
  const auto r = run_prefix<T>(c, seed);
  EXPECT_TRUE(support::all_close(r.want, r.got, support::tolerance(support::kind_of<T>())));
}

TEST(SelfAttentionPrefixEncoder, CausalMaskMatchesReference) {
  PrefixCase c;
  c.q_len = {5, 1, 40, 0, 17};
  c.kv_len = {37, 1, 40, 9, 300};  // prefix lengths 32, 0, 0, 9, 283
  expect_prefix<attnref::half>(c, 1);
  expect_prefix<attnref::bfloat16>(c, 2);
  c.block_size = 1;
  c.group = 4;
  expect_prefix<attnref::bfloat16>(c, 3);
  c.block_size = 128;  // larger than most sequences: one partial block
  c.group = 1;
  c.d = 128;
  c.dv = 128;
  expect_prefix<attnref::half>(c, 4);
}

TEST(SelfAttentionPrefixEncoder, AlibiCompressIsAlignedBottomRight) {
  PrefixCase c;
  c.q_len = {150, 3, 260};
  c.kv_len = {200, 131, 260};
  c.alibi = true;
  expect_prefix<attnref::bfloat16>(c, 8);
  expect_prefix<attnref::half>(c, 9);
}

TEST(SelfAttentionPrefixEncoder, NormCompressTileExpandsBlockByBlock) {
  PrefixCase c;
  // Query positions crossing several 128-blocks, offsets that are not multiples of 128.
  c.q_len = {150, 3, 260};
  c.kv_len = {200, 131, 260};
  c.compress = true;
  expect_prefix<attnref::half>(c, 5);
  c.random_tile = true;
  expect_prefix<attnref::bfloat16>(c, 6);
  expect_prefix<attnref::half>(c, 7);
}

TEST(SelfAttentionPrefixEncoder, TriangularTileEqualsCausalMask) {
  PrefixCase c;
  c.q_len = {150, 3, 20};
  c.kv_len = {200, 131, 20};
  const auto causal = run_prefix<attnref::bfloat16>(c, 8);
  c.compress = true;
  const auto tile = run_prefix<attnref::bfloat16>(c, 8);
  EXPECT_TRUE(support::all_close(causal.got, tile.got, support::tolerance(support::Kind::BF16)));
}

TEST(SelfAttentionPrefixEncoder, WithoutPrefixEqualsPaEncoder) {
  // kv_seq_len == seq_len: the paged PREFIX_ENCODER and the packed PA_ENCODER give the same bits.
  using T = attnref::half;
  PrefixCase c;
  c.q_len = {33, 7, 64};
  c.kv_len = c.q_len;
  const auto prefix = run_prefix<T>(c, 9);
  const int nh = c.nkv * c.group;
  std::vector<T> q, k, v;
  for (size_t b = 0; b < c.q_len.size(); ++b) {
    for (double x : prefix.q[b]) q.push_back(T(static_cast<float>(x)));
    for (double x : prefix.k[b]) k.push_back(T(static_cast<float>(x)));
    for (double x : prefix.v[b]) v.push_back(T(static_cast<float>(x)));
  }
  const Index tokens = 104;
  P p;
  p.num_heads = nh;
  p.num_kv_heads = c.nkv;
  p.calc_type = P::CalcType::PaEncoder;
  p.kernel_type = P::KernelType::HighPrecision;
  p.mask_type = P::MaskType::CausalMask;
  p.qk_scale = prefix.qk_scale;
  std::vector<T> o(static_cast<size_t>(tokens * nh * c.dv));
  attnref::SelfAttentionInputs<T> in{StridedView<const T, 3>(q.data(), {tokens, nh, c.d}),
                                     StridedView<const T, 3>(k.data(), {tokens, c.nkv, c.d}),
                                     StridedView<const T, 3>(v.data(), {tokens, c.nkv, c.dv}),
                                     std::vector<Index>(c.q_len.begin(), c.q_len.end())};
  attnref::self_attention(
      p, in, attnref::SelfAttentionOutputs<T>{StridedView<T, 3>(o.data(), {tokens, nh, c.dv})});
  ASSERT_EQ(o.size(), prefix.got.size());
  for (size_t i = 0; i < o.size(); ++i) ASSERT_EQ(dbl(o[i]), prefix.got[i]) << i;
}

// ---------------------------------------------------------------------------------------------
// MLA merged kv cache

template <class T>
void check_mla(bool norm_mask, bool high_precision, unsigned seed) {
  const int nkv = 1, nh = 4, d = 72, dv = 40;
  const std::vector<int> lens{9, 1, 33};
  int tokens = 0, max_seq = 0;
  for (int l : lens) {
    tokens += l;
    max_seq = std::max(max_seq, l);
  }
  const auto q = random_tensor<T>(static_cast<size_t>(tokens * nh * d), seed, 0.5);
  const auto k = random_tensor<T>(static_cast<size_t>(tokens * nkv * d), seed + 1, 0.5);
  std::vector<T> mask(static_cast<size_t>(max_seq * max_seq));
  const bool binary = high_precision || std::is_same_v<T, attnref::bfloat16>;
  for (int i = 0; i < max_seq; ++i)
    for (int j = 0; j < max_seq; ++j)
      mask[static_cast<size_t>(i * max_seq + j)] = T(j > i ? (binary ? 1.0f : -10000.0f) : 0.0f);
  P p;
  p.num_heads = nh;
  p.num_kv_heads = nkv;
  p.calc_type = P::CalcType::PaEncoder;
  p.kernel_type = high_precision ? P::KernelType::HighPrecision : P::KernelType::Default;
  p.mla_v_head_size = dv;
  p.qk_scale = 0.125f;
  if (norm_mask) p.mask_type = P::MaskType::Norm;
  attnref::SelfAttentionInputs<T> in;
  in.query = StridedView<const T, 3>(q.data(), {tokens, nh, d});
  in.key = StridedView<const T, 3>(k.data(), {tokens, nkv, d});
  in.seq_len.assign(lens.begin(), lens.end());
  if (norm_mask) in.mask = StridedView<const T, 3>(mask.data(), {1, max_seq, max_seq});
  std::vector<T> o(static_cast<size_t>(tokens * nh * dv));
  attnref::self_attention(
      p, in, attnref::SelfAttentionOutputs<T>{StridedView<T, 3>(o.data(), {tokens, nh, dv})});

  ref::AtbSelfAttention r;
  r.num_heads = nh;
  r.num_kv_heads = nkv;
  r.head_size = d;
  r.v_head_size = dv;
  r.seq_len = lens;
  r.qk_scale = 0.125;
  r.fp16_scores = std::is_same_v<T, attnref::half> && !high_precision;
  if (norm_mask)
    r.mask = [&mask, max_seq, binary](int, int i, int j) {
      const double m = dbl(mask[static_cast<size_t>(i * max_seq + j)]);
      return binary ? m * -3e38 : m;
    };
  std::vector<std::vector<double>> rq(lens.size()), rk(lens.size()), rv(lens.size());
  int t0 = 0;
  for (size_t b = 0; b < lens.size(); ++b) {
    for (int t = t0; t < t0 + lens[b]; ++t) {
      for (int e = 0; e < nh * d; ++e) rq[b].push_back(dbl(q[static_cast<size_t>(t * nh * d + e)]));
      for (int h = 0; h < nkv; ++h)
        for (int e = 0; e < d; ++e) {
          rk[b].push_back(dbl(k[static_cast<size_t>((t * nkv + h) * d + e)]));
          if (e < dv) rv[b].push_back(dbl(k[static_cast<size_t>((t * nkv + h) * d + e)]));
        }
    }
    t0 += lens[b];
  }
  std::vector<double> want, got;
  for (const auto& w : ref::atb_self_attention(r, rq, rk, rv))
    want.insert(want.end(), w.begin(), w.end());
  for (const T& x : o) got.push_back(dbl(x));
  EXPECT_TRUE(support::all_close(want, got, support::tolerance(support::kind_of<T>())))
      << "mask " << norm_mask << " hp " << high_precision;
}

TEST(SelfAttentionMla, ValueIsTheFirstDimsOfTheKey) {
  for (bool mask : {false, true}) {
    check_mla<attnref::half>(mask, false, 11);
    check_mla<attnref::half>(mask, true, 12);
    check_mla<attnref::bfloat16>(mask, true, 13);
  }
}

// ---------------------------------------------------------------------------------------------
// kv tensorlist and BNSD: the same data in the other forms gives the same bits.

using T16 = attnref::bfloat16;
constexpr int kB = 3, kMax = 40, kKv = 2, kH = 4, kD = 16, kDv = 16;

struct DecodeData {
  std::vector<T16> kc, vc, q;  // caches [1, B, maxSeq, kvH * D]; q [B, H, D]
  std::vector<Index> offsets{17, 40, 1};
  DecodeData()
      : kc(random_tensor<T16>(static_cast<size_t>(kB * kMax * kKv * kD), 21)),
        vc(random_tensor<T16>(static_cast<size_t>(kB * kMax * kKv * kDv), 22)),
        q(random_tensor<T16>(static_cast<size_t>(kB * kH * kD), 23)) {}
};

P decoder_params() {
  P p;
  p.num_heads = kH;
  p.num_kv_heads = kKv;
  p.calc_type = P::CalcType::Decoder;
  p.kvcache_cfg = P::KvCacheCfg::KBypassVBypass;
  p.qk_scale = 0.25f;
  return p;
}

std::vector<T16> decode_concatenated(DecodeData& d, const P& p) {
  std::vector<T16> o(static_cast<size_t>(kB * kH * kDv));
  attnref::SelfAttentionInputs<T16> in;
  in.query = StridedView<const T16, 3>(d.q.data(), {kB, kH, kD});
  in.seq_len = {1, 1, 1};
  in.token_offset = d.offsets;
  attnref::self_attention(p, in,
                          attnref::SelfAttentionOutputs<T16>{
                              StridedView<T16, 3>(o.data(), {kB, kH, kDv}),
                              StridedView<T16, 4>(d.kc.data(), {1, kB, kMax, kKv * kD}),
                              StridedView<T16, 4>(d.vc.data(), {1, kB, kMax, kKv * kDv})});
  return o;
}

TEST(SelfAttentionKvTensorList, EqualsTheConcatenatedCache) {
  DecodeData d;
  const P p = decoder_params();
  const auto want = decode_concatenated(d, p);
  // One separately allocated tensor per sequence, in reverse allocation order.
  std::vector<std::vector<T16>> kl(kB), vl(kB);
  attnref::SelfAttentionInputs<T16> in;
  for (int b = kB - 1; b >= 0; --b) {
    kl[static_cast<size_t>(b)].assign(d.kc.begin() + b * kMax * kKv * kD,
                                      d.kc.begin() + (b + 1) * kMax * kKv * kD);
    vl[static_cast<size_t>(b)].assign(d.vc.begin() + b * kMax * kKv * kDv,
                                      d.vc.begin() + (b + 1) * kMax * kKv * kDv);
  }
  for (int b = 0; b < kB; ++b) {
    in.key_cache_list.emplace_back(kl[static_cast<size_t>(b)].data(),
                                   std::array<Index, 2>{kMax, kKv * kD});
    in.value_cache_list.emplace_back(vl[static_cast<size_t>(b)].data(),
                                     std::array<Index, 2>{kMax, kKv * kDv});
  }
  in.query = StridedView<const T16, 3>(d.q.data(), {kB, kH, kD});
  in.seq_len = {1, 1, 1};
  in.token_offset = d.offsets;
  in.layer_id = 0;
  std::vector<T16> o(want.size());
  attnref::self_attention(
      p, in, attnref::SelfAttentionOutputs<T16>{StridedView<T16, 3>(o.data(), {kB, kH, kDv})});
  EXPECT_TRUE(same_bits(want, o));

  // The list is rejected outside DECODER + kv-bypass, and must have one tensor per sequence.
  P enc = p;
  enc.calc_type = P::CalcType::Encoder;
  EXPECT_THROW(attnref::self_attention(enc, in,
                                       attnref::SelfAttentionOutputs<T16>{
                                           StridedView<T16, 3>(o.data(), {kB, kH, kDv})}),
               std::invalid_argument);
  in.key_cache_list.pop_back();
  support::expect_rejected(
      [&] {
        attnref::self_attention(
            p, in,
            attnref::SelfAttentionOutputs<T16>{StridedView<T16, 3>(o.data(), {kB, kH, kDv})});
      },
      "key_cache_list/value_cache_list size mismatch");
}

TEST(SelfAttentionBnsd, DecoderAndEncoderEqualBsnd) {
  DecodeData d;
  // BNSD caches [1, B, kvH, maxSeq, D] with the same contents.
  std::vector<T16> kb(d.kc.size()), vb(d.vc.size());
  for (int b = 0; b < kB; ++b)
    for (int s = 0; s < kMax; ++s)
      for (int h = 0; h < kKv; ++h)
        for (int e = 0; e < kD; ++e) {
          kb[static_cast<size_t>(((b * kKv + h) * kMax + s) * kD + e)] =
              d.kc[static_cast<size_t>(((b * kMax + s) * kKv + h) * kD + e)];
          vb[static_cast<size_t>(((b * kKv + h) * kMax + s) * kDv + e)] =
              d.vc[static_cast<size_t>(((b * kMax + s) * kKv + h) * kDv + e)];
        }
  const StridedView<const T16, 5> kview(kb.data(), {1, kB, kKv, kMax, kD});
  const StridedView<const T16, 5> vview(vb.data(), {1, kB, kKv, kMax, kDv});

  // DECODER: q [B, H, 1, D] is the BSND [B, H, D] memory.
  P p = decoder_params();
  p.mask_type = P::MaskType::Norm;
  std::vector<T16> mask(static_cast<size_t>(kB * kMax), T16(0.0f));
  for (int j = 0; j < kMax; j += 3) mask[static_cast<size_t>(j)] = T16(1.0f);  // batch 0 only
  auto run_bsnd = [&](const P& pp, const std::vector<Index>& seq, const std::vector<T16>& q,
                      Index tokens) {
    std::vector<T16> o(static_cast<size_t>(tokens * kH * kDv));
    attnref::SelfAttentionInputs<T16> in;
    in.query = StridedView<const T16, 3>(q.data(), {tokens, kH, kD});
    in.seq_len = seq;
    in.token_offset = d.offsets;
    in.mask = StridedView<const T16, 3>(mask.data(), {kB, 1, kMax});
    attnref::self_attention(pp, in,
                            attnref::SelfAttentionOutputs<T16>{
                                StridedView<T16, 3>(o.data(), {tokens, kH, kDv}),
                                StridedView<T16, 4>(d.kc.data(), {1, kB, kMax, kKv * kD}),
                                StridedView<T16, 4>(d.vc.data(), {1, kB, kMax, kKv * kDv})});
    return o;
  };
  const auto want = run_bsnd(p, {1, 1, 1}, d.q, kB);
  P pb = p;
  pb.input_layout = P::InputLayout::BNSD;
  std::vector<T16> o(want.size());
  attnref::SelfAttentionBnsdInputs<T16> in;
  in.query = StridedView<const T16, 4>(d.q.data(), {kB, kH, 1, kD});
  in.seq_len = {1, 1, 1};
  in.token_offset = d.offsets;
  in.mask = StridedView<const T16, 3>(mask.data(), {kB, 1, kMax});
  attnref::self_attention(pb, in,
                          attnref::SelfAttentionBnsdOutputs<T16>{
                              StridedView<T16, 4>(o.data(), {kB, kH, 1, kDv}), kview, vview});
  EXPECT_TRUE(same_bits(want, o));

  // ENCODER (bypass, prefix in the cache): q [B, H, S, D] padded to S = 6, rows past seq_len 0.
  P pe = p;
  pe.calc_type = P::CalcType::Encoder;
  const std::vector<Index> seq{6, 2, 1};
  const Index S = 6, tokens = 9;
  const auto qb = random_tensor<T16>(static_cast<size_t>(kB * kH * S * kD), 24);
  std::vector<T16> qs(static_cast<size_t>(tokens * kH * kD));  // the same queries packed BSND
  Index t = 0;
  for (int b = 0; b < kB; ++b)
    for (Index i = 0; i < seq[static_cast<size_t>(b)]; ++i, ++t)
      for (int h = 0; h < kH; ++h)
        for (int e = 0; e < kD; ++e)
          qs[static_cast<size_t>((t * kH + h) * kD + e)] =
              qb[static_cast<size_t>(((b * kH + h) * S + i) * kD + e)];
  std::vector<T16> mask2(static_cast<size_t>(kMax * kMax), T16(0.0f));
  for (int i = 0; i < kMax; ++i)
    for (int j = i + 20; j < kMax; ++j) mask2[static_cast<size_t>(i * kMax + j)] = T16(1.0f);
  mask = std::vector<T16>(mask2);
  auto run_bsnd2 = [&]() {
    std::vector<T16> ob(static_cast<size_t>(tokens * kH * kDv));
    attnref::SelfAttentionInputs<T16> bi;
    bi.query = StridedView<const T16, 3>(qs.data(), {tokens, kH, kD});
    bi.seq_len = seq;
    bi.token_offset = d.offsets;
    bi.mask = StridedView<const T16, 3>(mask.data(), {1, kMax, kMax});
    attnref::self_attention(pe, bi,
                            attnref::SelfAttentionOutputs<T16>{
                                StridedView<T16, 3>(ob.data(), {tokens, kH, kDv}),
                                StridedView<T16, 4>(d.kc.data(), {1, kB, kMax, kKv * kD}),
                                StridedView<T16, 4>(d.vc.data(), {1, kB, kMax, kKv * kDv})});
    return ob;
  };
  const auto want2 = run_bsnd2();
  P peb = pe;
  peb.input_layout = P::InputLayout::BNSD;
  std::vector<T16> o2(static_cast<size_t>(kB * kH * S * kDv), T16(7.0f));
  attnref::SelfAttentionBnsdInputs<T16> in2;
  in2.query = StridedView<const T16, 4>(qb.data(), {kB, kH, S, kD});
  in2.seq_len = seq;
  in2.token_offset = d.offsets;
  in2.mask = StridedView<const T16, 3>(mask.data(), {1, kMax, kMax});
  attnref::self_attention(peb, in2,
                          attnref::SelfAttentionBnsdOutputs<T16>{
                              StridedView<T16, 4>(o2.data(), {kB, kH, S, kDv}), kview, vview});
  t = 0;
  for (int b = 0; b < kB; ++b) {
    for (Index i = 0; i < S; ++i) {
      const bool valid = i < seq[static_cast<size_t>(b)];
      for (int h = 0; h < kH; ++h)
        for (int e = 0; e < kDv; ++e) {
          const T16 got = o2[static_cast<size_t>(((b * kH + h) * S + i) * kDv + e)];
          const T16 exp =
              valid ? want2[static_cast<size_t>(((t + i) * kH + h) * kDv + e)] : T16(0.0f);
          ASSERT_EQ(Eigen::numext::bit_cast<std::uint16_t>(got),
                    Eigen::numext::bit_cast<std::uint16_t>(exp))
              << "b=" << b << " i=" << i << " h=" << h << " e=" << e;
        }
    }
    t += seq[static_cast<size_t>(b)];
  }
}

TEST(SelfAttentionBnsd, PaEncoderEqualsBsnd) {
  using T = attnref::half;
  const int nkv = 2, nh = 4, d = 32, S = 20;
  const std::vector<Index> seq{20, 7};
  const auto q = random_tensor<T>(static_cast<size_t>(2 * nh * S * d), 31);
  const auto k = random_tensor<T>(static_cast<size_t>(2 * nkv * S * d), 32);
  const auto v = random_tensor<T>(static_cast<size_t>(2 * nkv * S * d), 33);
  auto to_bsnd = [&](const std::vector<T>& x, int heads) {
    std::vector<T> y;
    for (int b = 0; b < 2; ++b)
      for (Index i = 0; i < seq[static_cast<size_t>(b)]; ++i)
        for (int h = 0; h < heads; ++h)
          for (int e = 0; e < d; ++e)
            y.push_back(x[static_cast<size_t>(((b * heads + h) * S + i) * d + e)]);
    return y;
  };
  const auto qs = to_bsnd(q, nh), ks = to_bsnd(k, nkv), vs = to_bsnd(v, nkv);
  const Index tokens = 27;
  P p;
  p.num_heads = nh;
  p.num_kv_heads = nkv;
  p.calc_type = P::CalcType::PaEncoder;
  p.qk_scale = 0.2f;
  std::vector<T> want(static_cast<size_t>(tokens * nh * d));
  attnref::SelfAttentionInputs<T> in{StridedView<const T, 3>(qs.data(), {tokens, nh, d}),
                                     StridedView<const T, 3>(ks.data(), {tokens, nkv, d}),
                                     StridedView<const T, 3>(vs.data(), {tokens, nkv, d}), seq};
  attnref::self_attention(
      p, in, attnref::SelfAttentionOutputs<T>{StridedView<T, 3>(want.data(), {tokens, nh, d})});
  p.input_layout = P::InputLayout::BNSD;
  std::vector<T> o(static_cast<size_t>(2 * nh * S * d), T(7.0f));
  attnref::SelfAttentionBnsdInputs<T> bi;
  bi.query = StridedView<const T, 4>(q.data(), {2, nh, S, d});
  bi.key = StridedView<const T, 4>(k.data(), {2, nkv, S, d});
  bi.value = StridedView<const T, 4>(v.data(), {2, nkv, S, d});
  bi.seq_len = seq;
  attnref::self_attention(
      p, bi, attnref::SelfAttentionBnsdOutputs<T>{StridedView<T, 4>(o.data(), {2, nh, S, d})});
  const auto got = to_bsnd(o, nh);
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(Eigen::numext::bit_cast<std::uint16_t>(got[i]),
              Eigen::numext::bit_cast<std::uint16_t>(want[i]))
        << i;
  for (Index i = 7; i < S; ++i)
    EXPECT_EQ(static_cast<float>(o[static_cast<size_t>(((1 * nh + 3) * S + i) * d)]), 0.0f);
}

// ---------------------------------------------------------------------------------------------
// Bad input of the new forms.

TEST(SelfAttentionLayouts, BadInputIsRejectedBeforeWriting) {
  using T = attnref::bfloat16;
  const int bs = 16, nkv = 1, nh = 2, d = 16;
  std::vector<T> kpool(static_cast<size_t>(4 * bs * nkv * d), T(0.5f)), vpool(kpool);
  std::vector<T> q(static_cast<size_t>(5 * nh * d), T(0.25f)),
      o(static_cast<size_t>(5 * nh * d), T(7.0f));
  std::vector<std::int32_t> table = {0, 1, 2, 3};
  P p;
  p.num_heads = nh;
  p.num_kv_heads = nkv;
  p.calc_type = P::CalcType::PrefixEncoder;
  p.kernel_type = P::KernelType::HighPrecision;
  p.is_triu_mask = 1;
  p.mask_type = P::MaskType::CausalMask;
  attnref::SelfAttentionInputs<T> in;
  in.query = StridedView<const T, 3>(q.data(), {5, nh, d});
  in.key = StridedView<const T, 3>(kpool.data(), {4, bs, nkv * d});
  in.value = StridedView<const T, 3>(vpool.data(), {4, bs, nkv * d});
  in.seq_len = {2, 3};
  in.kv_seq_len = {20, 3};
  in.block_tables = StridedView<const std::int32_t, 2>(table.data(), {2, 2});
  attnref::SelfAttentionOutputs<T> out{StridedView<T, 3>(o.data(), {5, nh, d})};
  EXPECT_NO_THROW(attnref::self_attention(p, in, out));
  std::fill(o.begin(), o.end(), T(7.0f));
  auto expect = [&](auto exception, const std::string& fragment) {
    using E = decltype(exception);
    // validate() runs the same checks alone: the same outcome, nothing written.
    const std::string validated = support::outcome([&] { attnref::validate(p, in, out); });
    for (const T& x : o) ASSERT_EQ(static_cast<float>(x), 7.0f);
    support::expect_rejected<E>([&] { attnref::self_attention(p, in, out); }, fragment);
    for (const T& x : o) ASSERT_EQ(static_cast<float>(x), 7.0f);
    EXPECT_EQ(validated, support::outcome([&] { attnref::self_attention(p, in, out); }));
  };
  table[1] = 4;
  expect(std::out_of_range(""),
         "self_attention: block_tables[0][1] out of range: expected [0, 4), got 4");
  table[1] = 1;
  in.kv_seq_len = {1, 3};
  expect(std::invalid_argument(""), "kv_seq_len[0] smaller than seq_len");
  in.kv_seq_len = {20};
  expect(std::invalid_argument(""), "kv_seq_len size mismatch");
  in.kv_seq_len = {33, 3};
  expect(std::invalid_argument(""), "kv_seq_len[0] exceeds block_tables.shape[1] * blockSize");
  in.kv_seq_len = {20, 3};
  in.block_tables = {};
  expect(std::invalid_argument(""), "block_tables missing for PrefixEncoder");
  in.block_tables = StridedView<const std::int32_t, 2>(table.data(), {2, 2});
  p.mask_type = P::MaskType::NormCompress;
  expect(std::invalid_argument(""), "mask missing for NORM_COMPRESS");
  std::vector<T> small(64 * 64);
  in.mask = StridedView<const T, 3>(small.data(), {1, 64, 64});
  expect(std::invalid_argument(""),
         "mask.shape mismatch for NORM_COMPRESS: expected [1, 128, 128]");
  p.mask_type = P::MaskType::CausalMask;
  p.kernel_type = P::KernelType::Default;
  expect(std::invalid_argument(""), "must be HighPrecision for PrefixEncoder");
  p.kernel_type = P::KernelType::HighPrecision;
  p.is_triu_mask = 0;
  expect(std::invalid_argument(""), "params.is_triu_mask must be 1 for PrefixEncoder");
  p.is_triu_mask = 1;
  p.mask_type = P::MaskType::Norm;
  expect(std::invalid_argument(""), "params.mask_type not supported by PrefixEncoder");
  p.mask_type = P::MaskType::CausalMask;
  p.q_scale = 0.5f;
  expect(std::invalid_argument(""), "params.q_scale must be 1 for PrefixEncoder");
  p.q_scale = 1.0f;
  in.key = StridedView<const T, 3>(kpool.data(), {2, 2 * bs, nkv * d});  // 32 x 16: fine
  in.value = StridedView<const T, 3>(vpool.data(), {2, 2 * bs, nkv * d});
  table = {0, 1, 1, 0};
  EXPECT_NO_THROW(attnref::self_attention(p, in, out));
  std::fill(o.begin(), o.end(), T(7.0f));
  // The BNSD overload needs BNSD params and the BSND one BSND params.
  p.input_layout = P::InputLayout::BNSD;
  expect(std::invalid_argument(""), "params.calc_type not supported with BNSD input");
  P pa;
  pa.num_heads = nh;
  pa.calc_type = P::CalcType::PaEncoder;
  pa.input_layout = P::InputLayout::BNSD;
  p = pa;
  in = {};
  in.query = StridedView<const T, 3>(q.data(), {5, nh, d});
  in.key = in.query;
  in.value = in.query;
  in.seq_len = {5};
  expect(std::invalid_argument(""), "params.input_layout BNSD with the BSND inputs");
  // MLA: no value input, output head size = mlaVHeadSize <= head size.
  p.input_layout = P::InputLayout::BSND;
  p.mla_v_head_size = 8;
  expect(std::invalid_argument(""), "out.shape[2] mismatch with params.mla_v_head_size");
}

}  // namespace self_attention_layout_test
