// The mask-encoding table of SelfAttention (docs/masks.md "Encodings"): one test per row, each
// with a mask built the vendor's way, against the independent reference; values outside a row's
// accepted set rejected before anything is written; inactive sequences of a dynamic batch (kv
// length 0) in the encoder and decoder kernels, with ALiBi and clamp; ALIBI_COMPRESS_SQRT in the
// [heads, seqLen, 128] form; DECODER + CAUSAL_MASK.
//
// The expected encodings below are written from the vendor's kernel and runner sources as
// docs/masks.md cites them, not from attnref: DECODER runs the decoder kernel whatever kernelType
// says (fp32 scores; fp16 masks added, bf16 binary x -3e38); a dynamic-batch encoder runs the
// fp16 kernel whatever kernelType says; PREFIX_ENCODER adds fp16 masks and multiplies bf16 ones.

#include <gtest/gtest.h>

#include <attnref/atb/self_attention.hpp>
#include <attnref/mask/builders.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "reference/atb_self_attention.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"
#include "support/random.hpp"

namespace mask_encoding_test {

using attnref::Index;
using attnref::StridedView;
using P = attnref::SelfAttentionParams;
using half = attnref::half;
using bf16 = attnref::bfloat16;

constexpr int kHeads = 4, kKv = 2, kD = 16, kDv = 12, kMaxSeq = 40;
constexpr float kSentinel = 7.0f;

// One SelfAttention call over kv-bypass caches [1, batch, kMaxSeq, hidden] (DECODER / ENCODER)
// or, with `write`, caches the call writes (ENCODER with KCacheVCache).
struct Case {
  P p;
  std::vector<Index> len, off;
  std::vector<std::int32_t> status;  // empty: batchRunStatus off
  bool write = false;
  // Mask values in the vendor's encoding: NORM [batch, rows, kMaxSeq] (rows: 1 for DECODER),
  // ALIBI [batch, heads, rows, kMaxSeq]. nullptr: none.
  std::function<float(int b, int i, int j)> mask;
  std::function<float(int b, int h, int i, int j)> alibi;
  // What the reference does with them (from the vendor's kernels).
  double factor = 1.0;
  bool fp16_scores = false;
};

struct Outcome {
  std::vector<double> got, want;
  std::vector<float> out;  // raw output values
  std::string error;       // "" when the call ran
  std::string validated;   // validate()'s outcome
  bool caches_untouched = true;
};

template <class T>
Outcome run(const Case& c, unsigned seed) {
  const Index batch = static_cast<Index>(c.len.size());
  const bool dec = c.p.calc_type == P::CalcType::Decoder;
  const int rows = dec ? 1 : kMaxSeq;
  Index tokens = 0;
  for (Index l : c.len) tokens += l;
  std::mt19937 rng(seed);
  const auto q = support::randn<T>(static_cast<size_t>(tokens * kHeads * kD), rng);
  const auto knew = support::randn<T>(static_cast<size_t>(tokens * kKv * kD), rng);
  const auto vnew = support::randn<T>(static_cast<size_t>(tokens * kKv * kDv), rng);
  auto kc = support::randn<T>(static_cast<size_t>(batch * kMaxSeq * kKv * kD), rng);
  auto vc = support::randn<T>(static_cast<size_t>(batch * kMaxSeq * kKv * kDv), rng);
  const auto kc0 = kc, vc0 = vc;
  std::vector<T> mask, alibi;
  for (int b = 0; c.mask && b < batch; ++b)
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < kMaxSeq; ++j) mask.push_back(T(c.mask(b, i, j)));
  for (int b = 0; c.alibi && b < batch; ++b)
    for (int h = 0; h < kHeads; ++h)
      for (int i = 0; i < rows; ++i)
        for (int j = 0; j < kMaxSeq; ++j) alibi.push_back(T(c.alibi(b, h, i, j)));

  attnref::SelfAttentionInputs<T> in;
  in.query = StridedView<const T, 3>(q.data(), {tokens, kHeads, kD});
  if (c.write) {
    in.key = StridedView<const T, 3>(knew.data(), {tokens, kKv, kD});
    in.value = StridedView<const T, 3>(vnew.data(), {tokens, kKv, kDv});
  }
  in.seq_len = c.len;
  in.token_offset = c.off;
  in.batch_run_status = c.status;
  if (c.mask) in.mask = StridedView<const T, 3>(mask.data(), {batch, rows, kMaxSeq});
  if (c.alibi) in.head_mask = StridedView<const T, 4>(alibi.data(), {batch, kHeads, rows, kMaxSeq});
  std::vector<T> o(static_cast<size_t>(tokens * kHeads * kDv), T(kSentinel));
  attnref::SelfAttentionOutputs<T> out{
      StridedView<T, 3>(o.data(), {tokens, kHeads, kDv}),
      StridedView<T, 4>(kc.data(), {1, batch, kMaxSeq, kKv * kD}),
      StridedView<T, 4>(vc.data(), {1, batch, kMaxSeq, kKv * kDv})};
  Outcome r;
  r.validated = support::outcome([&] { attnref::validate(c.p, in, out); });
  r.error = support::outcome([&] { attnref::self_attention(c.p, in, out); });
  for (const T& x : o) r.out.push_back(static_cast<float>(x));
  for (const T& x : o) r.got.push_back(static_cast<float>(x));
  if (!r.error.empty()) {
    r.caches_untouched = kc == kc0 && vc == vc0;
    return r;
  }

  // The reference: each active sequence over cache rows [0, off), the last len of them the new
  // tokens when the call writes them.
  ref::AtbSelfAttention rp;
  rp.num_heads = kHeads, rp.num_kv_heads = kKv, rp.head_size = kD, rp.v_head_size = kDv;
  rp.qk_scale = c.p.qk_scale;
  rp.fp16_scores = c.fp16_scores;
  rp.clamp = c.p.clamp_type == P::ClampType::MinMax;
  rp.clamp_min = c.p.clamp_min, rp.clamp_max = c.p.clamp_max;
  std::vector<std::vector<double>> rq(static_cast<size_t>(batch)), rk = rq, rv = rq;
  for (Index b = 0, t0 = 0; b < batch; t0 += c.len[static_cast<size_t>(b)], ++b) {
    const bool active = c.status.empty() || c.status[static_cast<size_t>(b)] == 1;
    const Index l = c.len[static_cast<size_t>(b)], kv = active ? c.off[static_cast<size_t>(b)] : 0;
    rp.seq_len.push_back(static_cast<int>(l));
    rp.kv_len.push_back(static_cast<int>(kv));
    for (Index e = t0 * kHeads * kD; e < (t0 + l) * kHeads * kD; ++e)
      rq[static_cast<size_t>(b)].push_back(static_cast<float>(q[static_cast<size_t>(e)]));
    for (Index pos = 0; pos < kv; ++pos) {
      const bool fresh = c.write && pos >= kv - l;
      const Index row = b * kMaxSeq + pos, t = t0 + pos - (kv - l);
      for (Index e = 0; e < kKv * kD; ++e)
        rk[static_cast<size_t>(b)].push_back(
            static_cast<float>(fresh ? knew[static_cast<size_t>(t * kKv * kD + e)]
                                     : kc0[static_cast<size_t>(row * kKv * kD + e)]));
      for (Index e = 0; e < kKv * kDv; ++e)
        rv[static_cast<size_t>(b)].push_back(
            static_cast<float>(fresh ? vnew[static_cast<size_t>(t * kKv * kDv + e)]
                                     : vc0[static_cast<size_t>(row * kKv * kDv + e)]));
    }
  }
  const double factor = c.factor;
  if (c.mask)
    rp.mask = [&](int b, int i, int j) {
      return static_cast<double>(static_cast<float>(T(c.mask(b, i, j)))) * factor;
    };
  if (c.alibi)
    rp.head_bias = [&](int b, int h, int i, int j) {
      return static_cast<double>(static_cast<float>(T(c.alibi(b, h, i, j))));
    };
  for (const auto& x : ref::atb_self_attention(rp, rq, rk, rv))
    r.want.insert(r.want.end(), x.begin(), x.end());
  return r;
}

template <class T>
void expect_matches(const Case& c, unsigned seed, const char* row) {
  const Outcome r = run<T>(c, seed);
  ASSERT_EQ(r.error, "") << row;
  EXPECT_EQ(r.validated, "") << row;
  EXPECT_TRUE(support::all_close(r.want, r.got, support::tolerance(support::kind_of<T>()))) << row;
}

template <class T>
void expect_rejected(const Case& c, const std::string& fragment, const char* row) {
  const Outcome r = run<T>(c, 11);
  EXPECT_NE(r.error.find(fragment), std::string::npos) << row << ": " << r.error;
  EXPECT_EQ(r.validated, r.error) << row;
  EXPECT_TRUE(r.caches_untouched) << row;
  for (float x : r.out) ASSERT_EQ(x, kSentinel) << row << ": output written";
}

P params(P::CalcType calc, P::KernelType kernel, P::MaskType mask) {
  P p;
  p.num_heads = kHeads;
  p.num_kv_heads = kKv;
  p.calc_type = calc;
  p.kernel_type = kernel;
  p.mask_type = mask;
  p.kvcache_cfg = P::KvCacheCfg::KBypassVBypass;
  p.qk_scale = 0.25f;
  return p;
}

// A causal triangle with random holes (never the diagonal), `hidden` where hidden.
std::function<float(int, int, int)> holes(float hidden, bool decoder) {
  return [hidden, decoder](int b, int i, int j) {
    const unsigned h = static_cast<unsigned>(b * 7919 + i * 131 + j * 31) % 5u;
    return (!decoder && j > i) || (j != i && h == 0) ? hidden : 0.0f;
  };
}

Case encoder(P::KernelType kernel, float hidden) {
  Case c;
  c.p = params(P::CalcType::Encoder, kernel, P::MaskType::Norm);
  c.len = {5, 9, 3};
  c.off = {5, 9, 3};
  c.mask = holes(hidden, false);
  return c;
}

Case decoder(P::KernelType kernel, float hidden) {
  Case c;
  c.p = params(P::CalcType::Decoder, kernel, P::MaskType::Norm);
  c.len = {1, 1, 1};
  c.off = {6, 33, 2};
  c.mask = holes(hidden, true);
  return c;
}

TEST(MaskEncoding, SelfAttentionEncoderRows) {
  // fp16 DEFAULT: the fp16 kernel, -10000 added in fp16.
  Case c = encoder(P::KernelType::Default, -10000.0f);
  c.fp16_scores = true;
  expect_matches<half>(c, 1, "ENCODER fp16 DEFAULT");
  // fp16 HIGH_PRECISION and bf16: binary x -3e38, fp32 scores.
  c = encoder(P::KernelType::HighPrecision, 1.0f);
  c.factor = -3e38;
  expect_matches<half>(c, 2, "ENCODER fp16 HIGH_PRECISION");
  c.p.kernel_type = P::KernelType::Default;
  expect_matches<bf16>(c, 3, "ENCODER bf16 DEFAULT");
  // batchRunStatus: the dynamic-batch encoder is the fp16 kernel, HIGH_PRECISION or not.
  c = encoder(P::KernelType::HighPrecision, -10000.0f);
  c.p.batch_run_status_enable = true;
  c.status = {1, 1, 1};
  c.fp16_scores = true;
  expect_matches<half>(c, 4, "ENCODER fp16 HIGH_PRECISION with batchRunStatus");
}

TEST(MaskEncoding, SelfAttentionDecoderRows) {
  // The decoder kernel: fp32 scores; fp16 masks added whatever kernelType says.
  Case c = decoder(P::KernelType::Default, -10000.0f);
  expect_matches<half>(c, 5, "DECODER fp16 DEFAULT");
  c.p.kernel_type = P::KernelType::HighPrecision;
  expect_matches<half>(c, 6, "DECODER fp16 HIGH_PRECISION");
  c = decoder(P::KernelType::Default, 1.0f);
  c.factor = -3e38;
  expect_matches<bf16>(c, 7, "DECODER bf16");
}

TEST(MaskEncoding, AlibiMasksWithAHeadAxisAreAddedByEveryKernel) {
  const std::vector<float> slopes = attnref::alibi_slopes(kHeads);
  Case c = decoder(P::KernelType::Default, 0.0f);
  c.p.mask_type = P::MaskType::Alibi;
  c.mask = nullptr;
  c.alibi = [&](int b, int h, int, int j) {
    return slopes[static_cast<size_t>(h)] * static_cast<float>(j - 40 + b);
  };
  expect_matches<half>(c, 8, "DECODER fp16 ALIBI");
  expect_matches<bf16>(c, 9, "DECODER bf16 ALIBI");
  Case e = encoder(P::KernelType::Default, 0.0f);
  e.p.mask_type = P::MaskType::Alibi;
  e.mask = nullptr;
  e.alibi = [&](int, int h, int i, int j) {  // the bf16 golden's form: -inf above the diagonal
    return j > i ? -INFINITY : slopes[static_cast<size_t>(h)] * static_cast<float>(j - i);
  };
  expect_matches<bf16>(e, 10, "ENCODER bf16 ALIBI");
  e.alibi = [&](int, int h, int i, int j) {
    return slopes[static_cast<size_t>(h)] * static_cast<float>(j - i) + (j > i ? -10000.0f : 0.0f);
  };
  e.fp16_scores = true;
  expect_matches<half>(e, 11, "ENCODER fp16 DEFAULT ALIBI");
}

TEST(MaskEncoding, ValuesOutsideARowsSetAreRejectedBeforeAnyWrite) {
  const std::string bad = "not a value of this mask's encoding";
  // The NaN: -10000 in a mask the kernel multiplies by -3e38 (+inf, then a NaN row).
  expect_rejected<bf16>(encoder(P::KernelType::Default, -10000.0f), bad, "bf16 binary, -10000");
  expect_rejected<half>(encoder(P::KernelType::HighPrecision, -10000.0f), bad,
                        "fp16 HIGH_PRECISION binary, -10000");
  expect_rejected<bf16>(decoder(P::KernelType::Default, -INFINITY), bad, "bf16 DECODER, -inf");
  // A binary mask given to an additive kernel would hide nothing.
  expect_rejected<half>(encoder(P::KernelType::Default, 1.0f), bad, "fp16 DEFAULT, 1");
  expect_rejected<half>(decoder(P::KernelType::HighPrecision, 1.0f), bad, "fp16 DECODER, 1");
  Case c = encoder(P::KernelType::Default, -10000.0f);
  c.mask = [](int, int i, int j) { return j > i ? std::numeric_limits<float>::quiet_NaN() : 0.0f; };
  expect_rejected<half>(c, bad, "fp16 DEFAULT, NaN");
  // ALiBi biases: NaN and +inf rejected, -inf accepted (above).
  c.p.mask_type = P::MaskType::Alibi;
  c.mask = nullptr;
  c.alibi = [](int, int, int i, int j) { return j > i ? INFINITY : 0.0f; };
  expect_rejected<bf16>(c, bad, "bf16 ALIBI, +inf");
  // The message names the element.
  const Outcome r = run<bf16>(encoder(P::KernelType::Default, -10000.0f), 12);
  EXPECT_NE(r.error.find("mask[0][0][1]"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("expected 0 (keep) or 1 (hide)"), std::string::npos) << r.error;
}

TEST(MaskEncoding, InactiveSequencesWithKvLengthZeroRun) {
  // A dynamic batch: sequence 1 inactive with token offset 0 (below its seq_len). The encoder
  // writes its caches for the active ones only and leaves the inactive rows at 0; clamp on.
  Case c = encoder(P::KernelType::Default, -10000.0f);
  c.p.kvcache_cfg = P::KvCacheCfg::KCacheVCache;
  c.write = true;
  c.p.batch_run_status_enable = true;
  c.status = {1, 0, 1};
  c.off = {7, 0, 4};
  c.p.clamp_type = P::ClampType::MinMax;
  c.p.clamp_min = -0.5f, c.p.clamp_max = 0.75f;
  c.fp16_scores = true;
  expect_matches<half>(c, 13, "ENCODER fp16, inactive sequence, clamp");
  const Outcome r = run<half>(c, 13);
  for (Index t = 5; t < 14; ++t)
    for (Index e = 0; e < kHeads * kDv; ++e)
      ASSERT_EQ(r.out[static_cast<size_t>(t * kHeads * kDv + e)], 0.0f);
  // The decoder with ALiBi, inactive sequences first and last.
  const std::vector<float> slopes = attnref::alibi_slopes(kHeads);
  Case d = decoder(P::KernelType::HighPrecision, 0.0f);
  d.p.mask_type = P::MaskType::Alibi;
  d.mask = nullptr;
  d.alibi = [&](int, int h, int, int j) { return slopes[static_cast<size_t>(h)] * (j - 33.0f); };
  d.p.batch_run_status_enable = true;
  d.status = {0, 1, 0};
  d.off = {0, 33, 0};
  d.p.clamp_type = P::ClampType::MinMax;
  d.p.clamp_min = -1.0f, d.p.clamp_max = 1.0f;
  expect_matches<bf16>(d, 14, "DECODER bf16 ALIBI, inactive sequences");
  // The check that needs the cache still runs on an active sequence.
  d.off = {0, 41, 0};
  expect_rejected<bf16>(d, "token_offset[1] exceeds maxSeqLen", "active, past maxSeqLen");
  c.off = {4, 0, 4};
  expect_rejected<half>(c, "token_offset[0] smaller than seq_len", "active, below seq_len");
}

TEST(MaskEncoding, DecoderCausalMaskSeesEveryKey) {
  // The decoder's query is the last token: the generated causal mask hides nothing (the same
  // bits as no mask), where a top-left triangle would leave it key 0 only.
  Case c = decoder(P::KernelType::Default, 0.0f);
  c.mask = nullptr;
  c.p.mask_type = P::MaskType::CausalMask;
  const Outcome causal = run<half>(c, 15);
  c.p.mask_type = P::MaskType::Undefined;
  const Outcome none = run<half>(c, 15);
  ASSERT_EQ(causal.error, "");
  EXPECT_EQ(causal.out, none.out);
  EXPECT_TRUE(support::all_close(none.want, causal.got, support::tolerance(support::Kind::F16)));
}

// PA_ENCODER with a compressed ALiBi mask: the SQRT head form against the full sqrt mask.
template <class T>
std::vector<float> pa_encoder_alibi(P::MaskType type, bool head_form, const std::vector<Index>& len,
                                    unsigned seed) {
  Index tokens = 0, max_len = 0;
  for (Index l : len) tokens += l, max_len = std::max(max_len, l);
  const auto q = support::randn<T>(static_cast<size_t>(tokens * kHeads * kD), seed);
  const auto k = support::randn<T>(static_cast<size_t>(tokens * kKv * kD), seed + 1);
  const auto v = support::randn<T>(static_cast<size_t>(tokens * kKv * kDv), seed + 2);
  P p = params(P::CalcType::PaEncoder, P::KernelType::HighPrecision, type);
  p.kvcache_cfg = P::KvCacheCfg::KCacheVCache;
  if (head_form) p.is_triu_mask = 1;
  const std::vector<float> slopes = attnref::alibi_slopes(kHeads);
  const std::vector<T> full = attnref::alibi_mask<T>(slopes, max_len, true, -INFINITY);
  const std::vector<T> heads = attnref::alibi_head_mask<T>(slopes, max_len, -INFINITY, true);
  attnref::SelfAttentionInputs<T> in;
  in.query = StridedView<const T, 3>(q.data(), {tokens, kHeads, kD});
  in.key = StridedView<const T, 3>(k.data(), {tokens, kKv, kD});
  in.value = StridedView<const T, 3>(v.data(), {tokens, kKv, kDv});
  in.seq_len = len;
  if (head_form)
    in.head_mask = StridedView<const T, 4>(heads.data(), {1, kHeads, max_len, 128});
  else
    in.head_mask = StridedView<const T, 4>(full.data(), {1, kHeads, max_len, max_len});
  std::vector<T> o(static_cast<size_t>(tokens * kHeads * kDv));
  attnref::self_attention(
      p, in, attnref::SelfAttentionOutputs<T>{StridedView<T, 3>(o.data(), {tokens, kHeads, kDv})});
  std::vector<float> r;
  for (const T& x : o) r.push_back(static_cast<float>(x));
  return r;
}

TEST(MaskEncoding, AlibiCompressSqrtHeadFormEqualsTheExpandedMask) {
  const std::vector<Index> len{300, 7, 129};  // blocks shifted by 128 and 256 rows
  const auto head = pa_encoder_alibi<bf16>(P::MaskType::AlibiCompressSqrt, true, len, 16);
  const auto full = pa_encoder_alibi<bf16>(P::MaskType::Alibi, false, len, 16);
  std::vector<double> a(head.begin(), head.end()), b(full.begin(), full.end());
  EXPECT_TRUE(support::all_close(b, a, support::tolerance(support::Kind::BF16)));
  // And the plain form read alike (no square root of its own): the SQRT head mask through
  // ALIBI_COMPRESS gives the same bits.
  EXPECT_EQ(head, pa_encoder_alibi<bf16>(P::MaskType::AlibiCompress, true, len, 16));
}

TEST(MaskEncoding, CompressedAlibiTileInfinitiesFollowTheSlopes) {
  // The tile's +inf above the diagonal times a negated slope is -inf (the vendor's prefix
  // cases); -inf there would become +inf (a NaN row): rejected.
  const std::vector<Index> len{150, 3};
  const Index tokens = 153;
  const auto q = support::randn<bf16>(static_cast<size_t>(tokens * kHeads * kD), 17u);
  const auto k = support::randn<bf16>(static_cast<size_t>(tokens * kKv * kD), 18u);
  const auto v = support::randn<bf16>(static_cast<size_t>(tokens * kKv * kDv), 19u);
  P p = params(P::CalcType::PaEncoder, P::KernelType::HighPrecision, P::MaskType::AlibiCompress);
  p.kvcache_cfg = P::KvCacheCfg::KCacheVCache;
  p.is_triu_mask = 1;
  const std::vector<float> neg = attnref::alibi_compress_slopes(attnref::alibi_slopes(kHeads));
  std::vector<bf16> tile = attnref::alibi_compress_mask<bf16>();
  const std::vector<bf16> finite = tile;
  for (int i = 0; i < 256; ++i)
    for (int j = i + 1; j < 256; ++j) tile[static_cast<size_t>(i * 256 + j)] = bf16(INFINITY);
  attnref::SelfAttentionInputs<bf16> in;
  in.query = StridedView<const bf16, 3>(q.data(), {tokens, kHeads, kD});
  in.key = StridedView<const bf16, 3>(k.data(), {tokens, kKv, kD});
  in.value = StridedView<const bf16, 3>(v.data(), {tokens, kKv, kDv});
  in.seq_len = len;
  in.slopes = StridedView<const float, 1>(neg.data(), {kHeads});
  std::vector<bf16> o(static_cast<size_t>(tokens * kHeads * kDv), bf16(kSentinel)), o2 = o;
  const attnref::SelfAttentionOutputs<bf16> out{
      StridedView<bf16, 3>(o.data(), {tokens, kHeads, kDv})};
  const attnref::SelfAttentionOutputs<bf16> out2{
      StridedView<bf16, 3>(o2.data(), {tokens, kHeads, kDv})};
  in.mask = StridedView<const bf16, 3>(finite.data(), {1, 256, 256});
  attnref::self_attention(p, in, out2);
  in.mask = StridedView<const bf16, 3>(tile.data(), {1, 256, 256});
  attnref::self_attention(p, in, out);
  EXPECT_EQ(std::vector<float>(o.begin(), o.end()), std::vector<float>(o2.begin(), o2.end()))
      << "+inf and +60000 above the diagonal hide the same keys";
  for (int i = 0; i < 256; ++i)
    for (int j = i + 1; j < 256; ++j) tile[static_cast<size_t>(i * 256 + j)] = bf16(-INFINITY);
  std::fill(o.begin(), o.end(), bf16(kSentinel));
  support::expect_validate_agrees([&] { attnref::validate(p, in, out); },
                                  [&] { attnref::self_attention(p, in, out); });
  support::expect_rejected([&] { attnref::self_attention(p, in, out); },
                           "-inf only with every slope positive");
  for (const bf16& x : o) ASSERT_EQ(static_cast<float>(x), kSentinel);
}

}  // namespace mask_encoding_test
