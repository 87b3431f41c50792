// ATB PagedAttention's calcType SPEC (parallel decoding), quantType DEQUANT_FUSION (int8 KV
// caches, per-channel descale and offset) and QKV_OFFLINE / QKV_ONLINE (int8 q, K, V; P quantized
// per block of keys) against the independent reference tests/reference/atb_paged_modes.hpp, with
// shuffled block tables, NaN-poisoned spare blocks and mask columns past each context.
// Metamorphic: SPEC with one token per sequence == decode, shuffled == ordered table (bitwise);
// dequant fusion == float caches holding the dequantized values; the quantization block size
// changes the result. A crafted case pins P's fp16 rounding and rint's ties to even. Every
// rejection leaves the output untouched.

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/atb/paged_attention.hpp>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "reference/atb_paged_modes.hpp"
#include "support/bits.hpp"
#include "support/cast.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"
#include "support/outcome.hpp"

namespace paged_attention_modes_test {

using attnref::bfloat16;
using attnref::half;
using attnref::Index;
using attnref::StridedView;
using P = attnref::PagedAttentionParams;
using i8 = std::int8_t;

using support::dbl;
using support::same_bits;
using support::z;

enum class Mask { None, Rows, Square, Spec, Alibi };  // Rows: NORM [batch, 1, maxSeq]
enum class Mode { Float, Dequant, Offline, Online };

struct Case {
  int nh = 8, nkv = 2, d = 64, dv = 32, bs = 16;
  std::vector<Index> ctx{37, 1, 130, 300};
  std::vector<Index> qlen;  // SPEC: query tokens per sequence; empty: decode
  Mask mask = Mask::None;
  bool causal = true;   // masks hide the keys after the token's own position (-10000)
  bool holes = false;   // and random -10000 holes (never the token's own key)
  bool binary = false;  // masks hold 1 where hidden, multiplied by -3e38 (MLA SPEC, bf16 / float)
  bool log_n = false, shuffle = true;
  int mla_dv = 0;
  Mode mode = Mode::Float;
  bool offset = false;  // hasQuantOffset
  int qblock = 128;     // quant_block_size
  P::OutDataType odt = P::OutDataType::Undefined;
  unsigned seed = 1;
  int vdim() const { return mla_dv ? mla_dv : dv; }
};

template <class TQ, class TKV, class TM, class TO>
struct Built {
  using Edit = std::function<void(P&, attnref::PagedAttentionInputs<TQ, TKV, TM>&)>;
  std::vector<TQ> q;
  std::vector<TKV> kc, vc;
  std::vector<TM> mask, alibi;
  std::vector<TO> out;
  std::vector<float> log_n, kd, vd, ps;
  std::vector<std::int32_t> ko, vo, table;
  Index blocks = 0, max_blocks = 0, tokens = 0, S = 0;  // S: mask width (maxSeq)
  std::vector<int> seq;                                 // sequence of each query token
  std::vector<Index> pos;                               // its position in its context
};

template <class T>
T draw(std::mt19937& rng, int lim) {
  if constexpr (std::is_same_v<T, i8>)
    return static_cast<i8>(std::uniform_int_distribution<int>(-lim, lim)(rng));
  else
    return T(std::normal_distribution<float>()(rng));
}

template <class T>
T poison() {
  if constexpr (std::is_same_v<T, i8>)
    return -128;  // never read: int8 has no NaN
  else
    return T(NAN);
}

template <class TQ, class TKV, class TM, class TO>
Built<TQ, TKV, TM, TO> build(const Case& c) {
  // Data, table order, masks and scales from separate streams (the same data in any table).
  std::mt19937 rng(c.seed), trng(c.seed + 2000), mrng(c.seed + 1000);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  Built<TQ, TKV, TM, TO> r;
  const Index B = static_cast<Index>(c.ctx.size());
  Index max_ctx = 1;
  for (Index b = 0; b < B; ++b) {
    const Index len = c.ctx[z(b)], nq = c.qlen.empty() ? 1 : c.qlen[z(b)];
    for (Index i = 0; i < nq; ++i) {
      r.seq.push_back(static_cast<int>(b));
      r.pos.push_back(len - nq + i);
    }
    max_ctx = std::max(max_ctx, len);
    r.max_blocks = std::max(r.max_blocks, (len + c.bs - 1) / c.bs);
  }
  r.tokens = static_cast<Index>(r.seq.size());
  r.S = max_ctx + 3;
  r.max_blocks += 1;
  r.blocks = B * r.max_blocks + 3;
  for (Index i = 0; i < r.tokens * c.nh * c.d; ++i) r.q.push_back(draw<TQ>(rng, 20));
  std::vector<std::int32_t> ids(z(r.blocks));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(i);
  if (c.shuffle) std::shuffle(ids.begin(), ids.end(), trng);
  r.table.assign(z(B * r.max_blocks), -1);
  size_t next = 0;
  for (Index b = 0; b < B; ++b)
    for (Index j = 0; j < (c.ctx[z(b)] + c.bs - 1) / c.bs; ++j)
      r.table[z(b * r.max_blocks + j)] = ids[next++];
  // Keys and values drawn in sequence order (the same data under any table); other rows poisoned.
  const size_t nkd = z(c.nkv * c.d), ndv = z(c.nkv * c.dv);
  r.kc.assign(z(r.blocks * c.bs) * nkd, poison<TKV>());
  if (!c.mla_dv) r.vc.assign(z(r.blocks * c.bs) * ndv, poison<TKV>());
  for (Index b = 0; b < B; ++b)
    for (Index t = 0; t < c.ctx[z(b)]; ++t) {
      const size_t row = z(r.table[z(b * r.max_blocks + t / c.bs)] * c.bs + t % c.bs);
      for (size_t e = 0; e < nkd; ++e) r.kc[row * nkd + e] = draw<TKV>(rng, 127);
      for (size_t e = 0; !c.mla_dv && e < ndv; ++e) r.vc[row * ndv + e] = draw<TKV>(rng, 127);
    }
  std::bernoulli_distribution hole(0.25);
  auto val = [&](Index p, Index t) {
    const float hidden = c.binary ? 1.0f : -10000.0f;
    return TM((c.causal && t > p) || (c.holes && t != p && hole(mrng)) ? hidden : 0.0f);
  };
  for (Index b = 0; c.mask == Mask::Rows && b < B; ++b)
    for (Index t = 0; t < r.S; ++t)
      r.mask.push_back(t < c.ctx[z(b)] ? val(c.ctx[z(b)] - 1, t) : TM(NAN));
  for (Index i = 0; c.mask == Mask::Square && i < r.S * r.S; ++i)
    r.mask.push_back(val(i / r.S, i % r.S));
  for (Index x = 0; c.mask == Mask::Spec && x < r.tokens; ++x)
    for (Index t = 0; t < r.S; ++t)
      r.mask.push_back(t < c.ctx[z(r.seq[z(x)])] ? val(r.pos[z(x)], t) : TM(NAN));
  for (Index b = 0; c.mask == Mask::Alibi && b < B; ++b)
    for (int h = 0; h < c.nh; ++h)
      for (Index t = 0; t < r.S; ++t) {
        const float slope = std::pow(2.0f, -8.0f * static_cast<float>(h + 1) / c.nh);
        const Index len = c.ctx[z(b)];
        r.alibi.push_back(t < len ? TM(slope * static_cast<float>(t - len + 1)) : TM(NAN));
      }
  for (Index b = 0; c.log_n && b < B; ++b) r.log_n.push_back(1.0f + 0.1f * static_cast<float>(b));
  if (c.mode == Mode::Dequant) {  // per channel, magnitudes 0.05 / 0.005 / 0.0005
    auto scales = [&](std::vector<float>& s, std::vector<std::int32_t>& o, int n) {
      for (int i = 0; i < n; ++i) {
        s.push_back((0.5f + u(mrng)) * 0.05f * std::pow(0.1f, static_cast<float>(i % 3)));
        if (c.offset) o.push_back(std::uniform_int_distribution<int>(-20, 20)(mrng));
      }
    };
    scales(r.kd, r.ko, c.nkv * c.d);
    scales(r.vd, r.vo, c.nkv * c.vdim());
  }
  for (int h = 0; (c.mode == Mode::Offline || c.mode == Mode::Online) && h < c.nh; ++h) {
    r.kd.push_back((h % 3 == 1 ? -1.0f : 1.0f) * (1e-3f + 2e-3f * u(mrng)));
    r.vd.push_back(2e-3f + 2e-2f * u(mrng));
    if (c.mode == Mode::Offline) r.ps.push_back(h == 0 ? 200.0f : 20.0f + 107.0f * u(mrng));
  }
  r.out.assign(z(r.tokens * c.nh * c.vdim()), TO(7.0f));  // sentinel
  return r;
}

template <class TQ, class TKV, class TM, class TO>
void run(const Case& c, Built<TQ, TKV, TM, TO>& r,
         const typename Built<TQ, TKV, TM, TO>::Edit& edit = {}, int threads = 0,
         bool validate_only = false) {
  const Index B = static_cast<Index>(c.ctx.size());
  P p;
  p.num_heads = c.nh;
  p.num_kv_heads = c.nkv;
  p.qk_scale = 0.125f;
  p.mla_v_head_size = static_cast<std::uint32_t>(c.mla_dv);
  p.calc_type = c.qlen.empty() ? P::CalcType::Undefined : P::CalcType::Spec;
  p.quant_type = c.mode == Mode::Dequant   ? P::QuantType::DequantFusion
                 : c.mode == Mode::Offline ? P::QuantType::QkvOffline
                 : c.mode == Mode::Online  ? P::QuantType::QkvOnline
                                           : P::QuantType::Unquant;
  p.has_quant_offset = c.offset;
  p.quant_block_size = c.qblock;
  p.out_data_type = c.odt;
  attnref::PagedAttentionInputs<TQ, TKV, TM> in;
  in.query = StridedView<const TQ, 3>(r.q.data(), {r.tokens, c.nh, c.d});
  in.key_cache = StridedView<const TKV, 4>(r.kc.data(), {r.blocks, c.bs, c.nkv, c.d});
  if (!c.mla_dv)
    in.value_cache = StridedView<const TKV, 4>(r.vc.data(), {r.blocks, c.bs, c.nkv, c.dv});
  in.block_tables = StridedView<const std::int32_t, 2>(r.table.data(), {B, r.max_blocks});
  in.context_lens = c.ctx;
  in.q_seq_lens = c.qlen;
  const TM* m = r.mask.data();
  if (c.mask == Mask::Rows) in.mask = StridedView<const TM, 3>(m, {B, 1, r.S});
  if (c.mask == Mask::Square) in.mask = StridedView<const TM, 3>(m, {1, r.S, r.S});
  if (c.mask == Mask::Rows || c.mask == Mask::Square) p.mask_type = P::MaskType::Norm;
  if (c.mask == Mask::Spec) {
    p.mask_type = P::MaskType::Spec;
    in.spec_mask = StridedView<const TM, 2>(m, {r.tokens, r.S});
  }
  if (c.mask == Mask::Alibi) {
    p.mask_type = P::MaskType::Alibi;
    in.alibi_mask = StridedView<const TM, 4>(r.alibi.data(), {B, c.nh, 1, r.S});
  }
  if (c.log_n) {
    p.scale_type = P::ScaleType::LogN;
    in.log_n = StridedView<const float, 1>(r.log_n.data(), {B});
  }
  auto vec = [](const auto& x) {
    using E = std::remove_reference_t<decltype(x[0])>;
    return StridedView<const E, 1>(x.empty() ? nullptr : x.data(), {static_cast<Index>(x.size())});
  };
  in.k_descale = vec(r.kd);
  in.v_descale = vec(r.vd);
  in.k_offset = vec(r.ko);
  in.v_offset = vec(r.vo);
  in.p_scale = vec(r.ps);
  if (edit) edit(p, in);
  const StridedView<TO, 3> o(r.out.data(), {r.tokens, c.nh, c.vdim()});
  const attnref::PagedAttentionOutputs<TO> out{o};
  if (validate_only)
    attnref::validate(p, in, out, {threads});
  else
    attnref::paged_attention(p, in, out, {threads});
}

// The reference on the rows gathered through the table (`slack`, `mag`: qkv path only).
template <class TQ, class TKV, class TM, class TO>
ref::QkvResult expected(const Case& c, const Built<TQ, TKV, TM, TO>& r) {
  const size_t B = c.ctx.size(), S = z(r.S), nkd = z(c.nkv * c.d), dv = z(c.vdim());
  auto at = [&](size_t b, Index t) {  // first element / d of key t's row
    return z((r.table[b * z(r.max_blocks) + z(t / c.bs)] * c.bs + t % c.bs) * c.nkv);
  };
  auto mask_of = [&](int x, int h, int t) {  // the stored mask + alibi term
    const size_t b = z(r.seq[z(x)]);
    const size_t row = c.mask == Mask::Rows     ? b
                       : c.mask == Mask::Square ? z(r.pos[z(x)])
                       : c.mask == Mask::Spec   ? z(x)
                                                : b * z(c.nh) + z(h);
    return c.mask == Mask::None ? 0.0
                                : dbl((c.mask == Mask::Alibi ? r.alibi : r.mask)[row * S + z(t)]) *
                                      (c.binary ? -3e38 : 1.0);
  };
  ref::QkvResult res;
  if constexpr (std::is_same_v<TQ, i8>) {
    ref::PagedQkv pr{c.nh, c.nkv, c.d, c.vdim(), 0.125f, r.kd, r.vd, r.ps, c.qblock, {}, 6e-6};
    if (c.mask != Mask::None)
      pr.mask = [&](int x, int t) { return static_cast<float>(mask_of(x, 0, t)); };
    ref::Rows8 q;
    std::vector<ref::Rows8> k(B), v(B);
    for (Index x = 0; x < r.tokens; ++x)
      q.emplace_back(r.q.begin() + x * c.nh * c.d, r.q.begin() + (x + 1) * c.nh * c.d);
    for (size_t b = 0; b < B; ++b)
      for (Index t = 0; t < c.ctx[b]; ++t) {
        const i8 *kp = r.kc.data() + at(b, t) * z(c.d), *vp = r.vc.data() + at(b, t) * dv;
        k[b].emplace_back(kp, kp + nkd);
        v[b].emplace_back(vp, vp + z(c.nkv) * dv);
      }
    res = ref::paged_qkv(pr, q, r.seq, k, v);
  } else {
    const TKV* cache_v = c.mla_dv ? r.kc.data() : r.vc.data();
    const size_t vstride = z(c.mla_dv ? c.d : c.dv);  // MLA: V = the first dims of each K head
    ref::PagedModes pr{c.nh, c.nkv, c.d, c.vdim(), 0.125, {r.log_n.begin(), r.log_n.end()}, {}};
    if (c.mask != Mask::None) pr.bias = mask_of;
    ref::Rows q(z(r.tokens));
    for (size_t x = 0; x < q.size(); ++x)
      for (size_t e = 0; e < z(c.nh * c.d); ++e) q[x].push_back(dbl(r.q[x * z(c.nh * c.d) + e]));
    std::vector<ref::Rows> k(B), v(B);
    for (size_t b = 0; b < B; ++b)
      for (Index t = 0; t < c.ctx[b]; ++t) {
        std::vector<double> kt, vt;
        if constexpr (std::is_same_v<TKV, i8>) {
          kt = ref::dequant(&r.kc[at(b, t) * z(c.d)], r.kd, r.ko);
          vt = ref::dequant(&cache_v[at(b, t) * vstride], r.vd, r.vo);
        } else {
          for (size_t e = 0; e < nkd; ++e) kt.push_back(dbl(r.kc[at(b, t) * z(c.d) + e]));
          for (size_t h = 0; h < z(c.nkv); ++h)
            for (size_t e = 0; e < dv; ++e)
              vt.push_back(dbl(cache_v[(at(b, t) + h) * vstride + e]));
        }
        k[b].push_back(kt);
        v[b].push_back(vt);
      }
    res.out = ref::paged_rows(pr, q, r.seq, k, v);
  }
  return res;
}

// Floating modes: the suite's tolerance policy against the reference rounded to TO. Qkv: a few
// ulps of TO, plus the fp32 accumulation bound and the row's near-tie slack.
template <class TQ, class TKV, class TM, class TO>
::testing::AssertionResult matches(const Case& c, const Built<TQ, TKV, TM, TO>& r,
                                   const ref::QkvResult& w) {
  std::vector<double> got, want;
  for (const TO& x : r.out) got.push_back(dbl(x));
  if (!std::is_same_v<TQ, i8>) {
    for (double x : w.out) want.push_back(dbl(TO(static_cast<float>(x))));
    const bool h = std::is_same_v<TO, half>, f = std::is_same_v<TO, float>;
    return support::all_close(want, got,
                              support::tolerance(h   ? support::Kind::F16
                                                 : f ? support::Kind::F32
                                                     : support::Kind::BF16));
  }
  if (w.near_ties * 100 > w.quantized)
    return ::testing::AssertionFailure() << "too many near ties: " << w.near_ties;
  const double rtol = std::is_same_v<TO, half> ? 0x1p-9 : 0x1p-6;
  for (size_t i = 0; i < got.size(); ++i) {  // accepted within the allowance; all_close reports
    const double allowed = rtol * std::fabs(w.out[i]) + 1e-5 * w.mag[i] + w.slack[i / z(c.vdim())];
    want.push_back(std::fabs(got[i] - w.out[i]) <= allowed ? got[i] : w.out[i]);
  }
  return support::all_close(want, got, {0.0, 0.0});
}

template <class TQ, class TKV, class TM, class TO>
void check(const Case& c, const std::string& what) {
  Built<TQ, TKV, TM, TO> r = build<TQ, TKV, TM, TO>(c);
  ASSERT_NO_THROW(run(c, r)) << what;
  EXPECT_TRUE(matches(c, r, expected(c, r))) << what;
}

template <class In>
using Edits = std::vector<std::pair<std::function<void(P&, In&)>, std::string>>;

// Each edit must throw std::invalid_argument naming `what`, before the output is written; the
// validation alone (attnref::validate) throws the same exception with the same message.
template <class TQ, class TKV, class TM, class TO>
void expect_rejected(const Case& c, const Built<TQ, TKV, TM, TO>& built,
                     const Edits<attnref::PagedAttentionInputs<TQ, TKV, TM>>& edits) {
  for (const auto& [edit, what] : edits) {
    auto r = built;
    support::expect_throw([&] { run(c, r, edit); }, what, false);
    for (const TO& x : r.out) ASSERT_EQ(dbl(x), 7.0) << what;
    const std::string op = support::outcome([&] { run(c, r, edit); });
    EXPECT_EQ(support::outcome([&] { run(c, r, edit, 0, true); }), op) << what;
  }
}

// ------------------------------------------------------------------------------------ SPEC

Case spec_case() {
  Case c;
  c.qlen = {37, 1, 16, 3};  // the first sequence is all new tokens
  c.mask = Mask::Spec;
  return c;
}

TEST(PagedAttentionModes, SpecMatchesReference) {
  int n = 0;
  for (Mask m : {Mask::Spec, Mask::Square})
    for (int kind : {0, 1, 2})  // causal; causal + holes; holes only (SPEC has no causality)
      for (int bs : {16, 128}) {
        Case c = spec_case();
        c.mask = m;
        c.causal = kind < 2;
        c.holes = kind > 0;
        c.bs = bs;
        c.seed = static_cast<unsigned>(20 + n++);
        const std::string what = std::string(m == Mask::Spec ? "spec" : "square") + " kind " +
                                 std::to_string(kind) + " bs " + std::to_string(bs);
        check<half, half, half, half>(c, what);
        check<bfloat16, bfloat16, bfloat16, bfloat16>(c, what);
        check<float, float, float, float>(c, what);
      }
  Case gqa = spec_case();
  for (int nkv : {1, 8}) {
    gqa.nkv = nkv;
    check<half, half, half, half>(gqa, "kv heads " + std::to_string(nkv));
  }
  Case ln = spec_case();
  ln.log_n = true;
  check<bfloat16, bfloat16, bfloat16, bfloat16>(ln, "SPEC logN");
  Case dec;  // decode reading row context_len - 1 of the square NORM mask
  dec.mask = Mask::Square;
  dec.holes = true;
  check<half, half, half, half>(dec, "decode, square mask");
}

TEST(PagedAttentionModes, SpecMla) {
  for (Mask m : {Mask::Spec, Mask::None}) {
    Case c = spec_case();
    c.nkv = 1;
    c.mla_dv = 32;
    c.mask = m;
    c.holes = true;
    // The MLA multi-token kernel: fp16 SPEC masks additive, bf16 / float ones 0 / 1 x -3e38.
    check<half, half, half, half>(c, m == Mask::Spec ? "MLA spec mask" : "MLA no mask");
    c.binary = m == Mask::Spec;
    check<bfloat16, bfloat16, bfloat16, bfloat16>(c, "MLA bf16");
    check<float, float, float, float>(c, "MLA float");
  }
}

TEST(PagedAttentionModes, SpecOneTokenEachEqualsDecodeAndShuffledEqualsOrderedBitForBit) {
  for (int threads : {1, 3}) {
    Case c;
    c.qlen = {1, 1, 1, 1};
    c.mask = Mask::Spec;
    c.holes = true;
    auto spec = build<half, half, half, half>(c);
    auto dec = spec;  // the [batch, maxSeq] SPEC rows are the [batch, 1, maxSeq] NORM rows
    run(c, spec, nullptr, threads);
    Case d = c;
    d.qlen.clear();
    d.mask = Mask::Rows;
    run(d, dec, nullptr, threads);
    EXPECT_TRUE(same_bits(spec.out, dec.out)) << "threads " << threads;
    EXPECT_TRUE(matches(c, spec, expected(c, spec)));
  }
  Case c = spec_case();  // the same keys and values behind a shuffled or an ordered table
  c.holes = true;
  Case o = c;
  o.shuffle = false;
  auto sh = build<bfloat16, bfloat16, bfloat16, bfloat16>(c);
  auto ord = build<bfloat16, bfloat16, bfloat16, bfloat16>(o);
  ASSERT_NE(sh.table, ord.table);
  run(c, sh);
  run(o, ord);
  EXPECT_TRUE(same_bits(sh.out, ord.out));
  EXPECT_TRUE(matches(c, sh, expected(c, sh)));
}

TEST(PagedAttentionModes, SpecRejections) {
  using In = attnref::PagedAttentionInputs<half, half, half>;
  const Case c = spec_case();
  expect_rejected(
      c, build<half, half, half, half>(c),
      Edits<In>{{[](P&, In& in) { in.q_seq_lens.clear(); }, "q_seq_lens"},
                {[](P&, In& in) { in.q_seq_lens[0] -= 1; }, "q_seq_lens"},  // sum != numTokens
                {[](P&, In& in) {
                   in.q_seq_lens = {36, 2, 16, 3};
                 },
                 "q_seq_lens[1]"},  // > context
                {[](P& p, In& in) {
                   p.batch_run_status_enable = true;
                   in.batch_run_status = {1, 1, 1, 1};
                 },
                 "params.batch_run_status_enable"},
                {[](P& p, In& in) {
                   p.mask_type = P::MaskType::Undefined;
                   in.spec_mask = {};
                 },
                 "params.mask_type"},
                {[](P& p, In&) { p.mask_type = P::MaskType::Alibi; }, "params.mask_type"}});
  Case rows = c;  // NORM with several tokens per sequence needs the square [1, maxSeq, maxSeq]
  rows.mask = Mask::Rows;
  expect_rejected(rows, build<half, half, half, half>(rows), Edits<In>{{nullptr, "mask.shape"}});
  Case dq = c;
  dq.mode = Mode::Dequant;
  expect_rejected(
      dq, build<half, i8, half, half>(dq),
      Edits<attnref::PagedAttentionInputs<half, i8, half>>{{nullptr, "params.calc_type"}});
  // Mask values outside the kernel's encoding: the additive -10000 in a bf16 MLA SPEC mask
  // (binary x -3e38: +inf, a NaN row on the NPU), a 1 in an additive mask (hides nothing).
  Case mla = c;
  mla.nkv = 1;
  mla.mla_dv = 32;
  using InB = attnref::PagedAttentionInputs<bfloat16, bfloat16, bfloat16>;
  expect_rejected(mla, build<bfloat16, bfloat16, bfloat16, bfloat16>(mla),
                  Edits<InB>{{nullptr, "spec_mask[0][1] not a value of this mask's encoding"}});
  mla.binary = true;
  expect_rejected(mla, build<half, half, half, half>(mla),
                  Edits<In>{{nullptr, "expected 0 (keep) or a negative value (hide)"}});
}

// --------------------------------------------------------------------------- DEQUANT_FUSION

TEST(PagedAttentionModes, DequantFusionMatchesReference) {
  int n = 0;
  for (Mask m : {Mask::None, Mask::Rows, Mask::Alibi})
    for (bool offset : {false, true}) {
      Case c;
      c.mode = Mode::Dequant;
      c.mask = m;
      c.holes = true;
      c.offset = offset;
      c.log_n = n % 2 == 1;
      c.seed = static_cast<unsigned>(40 + n++);
      const std::string what = "mask " + std::to_string(static_cast<int>(m)) +
                               (offset ? " offset" : "") + (c.log_n ? " logN" : "");
      check<half, i8, half, half>(c, what);
      check<bfloat16, i8, bfloat16, bfloat16>(c, what);
    }
  for (int nkv : {1, 8}) {
    Case c;
    c.mode = Mode::Dequant;
    c.offset = true;
    c.nkv = nkv;
    c.bs = 128;
    check<half, i8, half, half>(c, "kv heads " + std::to_string(nkv));
  }
}

TEST(PagedAttentionModes, DequantFusionEqualsFloatCachesHoldingDequantizedValues) {
  Case c;
  c.mode = Mode::Dequant;
  c.offset = c.holes = c.log_n = true;
  c.mask = Mask::Rows;
  auto q8 = build<half, i8, half, half>(c);
  run(c, q8);
  Case fc = c;
  fc.mode = Mode::Float;
  fc.offset = false;
  auto f = build<float, float, float, float>(fc);  // same shapes, table and masks
  ASSERT_EQ(f.table, q8.table);
  for (size_t i = 0; i < f.q.size(); ++i) f.q[i] = static_cast<float>(q8.q[i]);
  const size_t kh = z(c.nkv * c.d), vh = z(c.nkv * c.dv);
  for (size_t i = 0; i < f.kc.size(); ++i)
    f.kc[i] = static_cast<float>(q8.kc[i] + q8.ko[i % kh]) * q8.kd[i % kh];
  for (size_t i = 0; i < f.vc.size(); ++i)
    f.vc[i] = static_cast<float>(q8.vc[i] + q8.vo[i % vh]) * q8.vd[i % vh];
  run(fc, f);
  std::vector<double> a, b;
  for (size_t i = 0; i < f.out.size(); ++i) {
    a.push_back(dbl(half(f.out[i])));
    b.push_back(dbl(q8.out[i]));
  }
  EXPECT_TRUE(support::all_close(a, b, {1e-5, 0x1p-10}));  // one fp16 step at most
}

TEST(PagedAttentionModes, DequantFusionRejections) {
  using In = attnref::PagedAttentionInputs<half, i8, half>;
  Case c;
  c.mode = Mode::Dequant;
  c.offset = true;
  expect_rejected(
      c, build<half, i8, half, half>(c),
      Edits<In>{{[](P&, In& in) { in.k_descale = {}; }, "k_descale"},
                {[](P&, In& in) { in.v_descale = {}; }, "v_descale"},
                {[](P&, In& in) {
                   in.k_descale = StridedView<const float, 1>(in.k_descale.data(), {127});
                 },
                 "k_descale"},
                {[](P& p, In&) { p.has_quant_offset = false; }, "k_offset"},  // still given
                {[](P&, In& in) { in.v_offset = {}; }, "v_offset"}});
  Case mla = c;
  mla.offset = false;
  mla.mla_dv = 32;
  expect_rejected(mla, build<half, i8, half, half>(mla),
                  Edits<In>{{nullptr, "params.mla_v_head_size"}});
}

// ------------------------------------------------------------------------ QKV quantization

Case qkv_case(Mode mode) {
  Case c;
  c.mode = mode;
  c.ctx = {1, 17, 130, 300};
  c.odt = P::OutDataType::Float16;
  return c;
}

TEST(PagedAttentionModes, QkvMatchesReference) {
  int n = 0;
  for (Mode mode : {Mode::Online, Mode::Offline})
    for (Mask m : {Mask::None, Mask::Rows})
      for (int bs : {16, 128}) {
        Case c = qkv_case(mode);
        c.mask = m;
        c.holes = true;
        c.bs = bs;
        c.seed = static_cast<unsigned>(60 + n++);
        const std::string what = std::string(mode == Mode::Online ? "online" : "offline") +
                                 (m == Mask::Rows ? " norm mask" : "") + " bs " +
                                 std::to_string(bs);
        check<i8, i8, half, half>(c, what);
        c.odt = P::OutDataType::BFloat16;
        check<i8, i8, bfloat16, bfloat16>(c, what + " bf16");
      }
  for (int nkv : {1, 8}) {
    Case c = qkv_case(Mode::Online);
    c.nkv = nkv;
    check<i8, i8, half, half>(c, "kv heads " + std::to_string(nkv));
  }
}

TEST(PagedAttentionModes, QkvQuantBlockSizeChangesTheResult) {
  for (Mode mode : {Mode::Online, Mode::Offline}) {
    Case c = qkv_case(mode);
    c.ctx = {300, 257};
    c.mask = Mask::Rows;
    c.holes = true;
    Case c16 = c;
    c16.qblock = 16;
    auto a = build<i8, i8, half, half>(c);
    auto b = build<i8, i8, half, half>(c16);
    run(c, a);
    run(c16, b);
    EXPECT_TRUE(matches(c, a, expected(c, a))) << "block 128";
    EXPECT_TRUE(matches(c16, b, expected(c16, b))) << "block 16";
    EXPECT_FALSE(same_bits(a.out, b.out));
    auto t3 = build<i8, i8, half, half>(c16);  // no split of the key blocks across threads
    run(c16, t3, nullptr, 3);
    EXPECT_TRUE(same_bits(b.out, t3.out));
  }
}

TEST(PagedAttentionModes, QkvBlockWithEveryPUnderflowedContributesNothing) {
  for (Mode mode : {Mode::Online, Mode::Offline}) {
    Case c = qkv_case(mode);
    c.ctx = {64, 48};
    c.qblock = 16;
    c.mask = Mask::Rows;
    auto r = build<i8, i8, half, half>(c);
    auto hide = [&](size_t b, size_t t0) {
      std::fill_n(&r.mask[b * z(r.S) + t0], 16, half(-10000.0f));
    };
    hide(0, 0);   // a hidden first block: its state is rescaled away by exp(-10000)
    hide(0, 32);  // a hidden block after the maximum: every P̂ is 0 (online: bmax = 0)
    hide(1, 16);
    run(c, r);
    for (const half& x : r.out) ASSERT_TRUE(std::isfinite(dbl(x)));
    EXPECT_TRUE(matches(c, r, expected(c, r)));
  }
}

TEST(PagedAttentionModes, QkvPRoundsThroughFp16ThenHalfToEven) {
  // One query against keys with s_0 = 0 and s_1 = -100 · kDescale[h] · qkScale, kDescale set so
  // that x = P̂_1 · 127 lands just below 3.5 (head 0: fp16 makes it 3.5, rint to even 4, where a
  // plain rint gives 3) or just above 2.5 (head 1: fp16 2.5, rint 2, where rint or rounding
  // half away give 3). V_0 = 0, V_1 = 100: out = factor · P8_1 · 100 / (1 + P̂_1).
  for (Mode mode : {Mode::Online, Mode::Offline}) {
    Case c = qkv_case(mode);
    c.nh = c.nkv = 2;
    c.d = c.dv = 32;
    c.ctx = {2};
    auto r = build<i8, i8, half, half>(c);
    std::fill(r.q.begin(), r.q.end(), i8(0));
    r.q[0] = r.q[32] = 1;
    const size_t row = z(r.table[0] * c.bs * 64);  // key 0 (64 values); key 1 follows
    std::fill_n(&r.kc[row], 128, i8(0));
    std::fill_n(&r.vc[row], 64, i8(0));
    std::fill_n(&r.vc[row + 64], 64, i8(100));
    const double target[2] = {3.4995, 2.5005}, lo[2] = {3.4991, 2.5001}, p8[2] = {4, 2};
    float p1[2];
    for (size_t h = 0; h < 2; ++h) {
      r.kc[row + 64 + h * 32] = -100;
      r.kd[h] = static_cast<float>(std::log(127.0 / target[h]) / 12.5);
      r.vd[h] = 0.127f;
      if (mode == Mode::Offline) r.ps[h] = 127.0f;
      const float s1 = ref::f32_mul(ref::f32_mul(-100.0f, r.kd[h]), 0.125f);
      p1[h] = static_cast<float>(std::exp(static_cast<double>(s1)));
      const float x = mode == Mode::Online ? ref::f32_div(p1[h], ref::f32_div(1.0f, 127.0f))
                                           : ref::f32_mul(p1[h], 127.0f);
      ASSERT_TRUE(x > lo[h] && x < lo[h] + 0.0006) << x;
    }
    run(c, r);
    EXPECT_TRUE(matches(c, r, expected(c, r)));
    for (size_t h = 0; h < 2; ++h) {  // P8_1 recovered from the output
      const double f = mode == Mode::Online ? 0.127 / 127 : 0.127;
      EXPECT_NEAR(dbl(r.out[h * 32]) * (1.0 + p1[h]) / (f * 100), p8[h], 0.02)
          << (mode == Mode::Online ? "online" : "offline") << " head " << h;
    }
  }
}

TEST(PagedAttentionModes, QkvRejections) {
  using In = attnref::PagedAttentionInputs<i8, i8, half>;
  const Case c = qkv_case(Mode::Offline);
  static const float log_n[4] = {1, 1, 1, 1};
  expect_rejected(
      c, build<i8, i8, half, half>(c),
      Edits<In>{
          {[](P& p, In&) { p.out_data_type = P::OutDataType::BFloat16; }, "params.out_data_type"},
          {[](P& p, In&) { p.out_data_type = P::OutDataType::Undefined; }, "params.out_data_type"},
          {[](P& p, In&) { p.has_quant_offset = true; }, "params.has_quant_offset"},
          {[](P&, In& in) { in.p_scale = {}; }, "p_scale"},
          {[](P&, In& in) { in.k_descale = StridedView<const float, 1>(in.k_descale.data(), {7}); },
           "k_descale"},
          {[](P& p, In&) { p.q_scale = 0.5f; }, "params.q_scale"},
          {[](P& p, In& in) {
             p.scale_type = P::ScaleType::LogN;
             in.log_n = StridedView<const float, 1>(log_n, {4});
           },
           "params.scale_type"}});
}

// attnref::validate is the operator's validation alone: a valid call of every type family passes
// and writes nothing (the sentinel stays), then runs; a negative thread count fails both alike.
template <class TQ, class TKV, class TM, class TO>
void validate_writes_nothing(const Case& c) {
  auto r = build<TQ, TKV, TM, TO>(c);
  ASSERT_EQ(support::outcome([&] { run(c, r, {}, 0, true); }), "");
  for (const TO& x : r.out) ASSERT_EQ(dbl(x), 7.0);
  run(c, r);
  EXPECT_NE(dbl(r.out[0]), 7.0);
  const std::string op = support::outcome([&] { run(c, r, {}, -1); });
  EXPECT_NE(op.find("exec.threads negative"), std::string::npos) << op;
  EXPECT_EQ(support::outcome([&] { run(c, r, {}, -1, true); }), op);
}

TEST(PagedAttentionModes, ValidateAloneAcceptsValidCallsAndWritesNothing) {
  Case f;
  f.mask = Mask::Rows;
  validate_writes_nothing<half, half, half, half>(f);
  validate_writes_nothing<half, half, half, half>(spec_case());
  Case d = f;
  d.mode = Mode::Dequant;
  d.offset = true;
  validate_writes_nothing<half, i8, half, half>(d);
  validate_writes_nothing<i8, i8, half, half>(qkv_case(Mode::Offline));
  Case o = qkv_case(Mode::Online);
  o.odt = P::OutDataType::BFloat16;
  validate_writes_nothing<i8, i8, bfloat16, bfloat16>(o);
}

}  // namespace paged_attention_modes_test
