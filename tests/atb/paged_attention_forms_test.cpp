// ATB PagedAttention's other forms against the independent reference
// tests/reference/atb_paged_attention.hpp: inputLayout BNSD (== BSND on the same keys and values,
// bit for bit, over GQA, odd block sizes, NORM / ALIBI masks, batchRunStatus and thread counts),
// compressType KVHEAD / KVHEAD_ROPE (razor attention: every (token, kv head) pair a sequence of
// its own, with NORM / ALIBI masks, DEQUANT_FUSION, the razor offset added before qkScale, and
// ATB's packing hazard when a pair has no keys), and the packing of the query rows over the
// sequences with context > 0 (decode and SPEC). Every rejection leaves the output untouched and
// validate() ends as the call does.

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

#include "reference/atb_paged_attention.hpp"
#include "support/bits.hpp"
#include "support/cast.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"

namespace paged_attention_forms_test {

using attnref::bfloat16;
using attnref::half;
using attnref::Index;
using attnref::StridedView;
using P = attnref::PagedAttentionParams;
using i8 = std::int8_t;

enum class Form { Bsnd, Bnsd, KvHead, Rope };
enum class Mask { None, Norm, NormBroadcast, Alibi, AlibiBroadcast, Spec };

inline size_t z(Index i) { return static_cast<size_t>(i); }

struct Case {
  Form form = Form::Bsnd;
  int nh = 8, nkv = 2, d = 32, dv = 32, bs = 16;
  Index tokens = 3;                       // compressType: query tokens (ctx: tokens · nkv pairs)
  std::vector<Index> ctx{0, 1, 17, 130};  // per sequence, or per (token, kv head) pair
  std::vector<Index> qlen;                // calcType SPEC: query tokens per sequence
  Mask mask = Mask::None;
  bool dequant = false, offset = false;  // DEQUANT_FUSION (int8 caches)
  std::vector<std::int32_t> status;      // batchRunStatus (empty: disabled)
  int threads = 0;
  unsigned seed = 1;
  bool compress() const { return form == Form::KvHead || form == Form::Rope; }
  Index seqs() const { return static_cast<Index>(ctx.size()); }
  int ch() const { return compress() ? 1 : nkv; }           // the caches' kv heads
  int heads() const { return compress() ? nh / nkv : nh; }  // query heads per sequence
  Index rows(Index b) const {  // query rows of sequence b (packed: none without keys)
    return ctx[z(b)] == 0 ? 0 : qlen.empty() ? 1 : qlen[z(b)];
  }
};

template <class T, class TKV>
struct Built {
  using In = attnref::PagedAttentionInputs<T, TKV, T>;
  std::vector<T> q, mask, alibi, out;
  std::vector<TKV> kc, vc;  // in the case's layout (BNSD: [numBlocks, kvHeads, blockSize, D])
  std::vector<float> razor, kd, vd;
  std::vector<std::int32_t> ko, vo, table;
  Index blocks = 0, max_blocks = 0, S = 0, tokens = 0, mrows = 0;
  std::vector<double> want;  // the reference rounded to T, packed like out (rows left: 7)
};

template <class T>
T draw(std::mt19937& rng) {
  if constexpr (std::is_same_v<T, i8>)
    return static_cast<i8>(std::uniform_int_distribution<int>(-127, 127)(rng));
  else
    return T(std::normal_distribution<float>()(rng));
}

// Where element e of kv head h of cache row `row` (block · bs + offset) lives.
inline Index at(const Case& c, Index row, Index h, Index e, Index w) {
  if (c.form != Form::Bnsd) return (row * c.ch() + h) * w + e;
  return (((row / c.bs) * c.ch() + h) * c.bs + row % c.bs) * w + e;
}

// The reference: sequence b reads query row x (the next packed one) and writes out row x; masks,
// ALiBi, the razor offset and the dequant scales follow b (compressType: token b / nkv, kv head
// b % nkv), as the kernel indexes them.
template <class T, class TKV>
void expect_reference(const Case& c, Built<T, TKV>& r) {
  const int H = c.heads(), KH = c.ch(), G = c.nh / c.nkv, dv = c.dv;
  ref::AtbPaged pr;
  pr.num_heads = H, pr.num_kv_heads = KH, pr.head_size = c.d, pr.v_head_size = dv;
  pr.qk_scale = 0.125;
  const bool norm = c.mask == Mask::Norm || c.mask == Mask::NormBroadcast;
  const bool alibi = c.mask == Mask::Alibi || c.mask == Mask::AlibiBroadcast;
  auto mrow = [&](int b) { return r.mrows == 1 ? 0 : c.compress() ? b / c.nkv : b; };
  if (norm) pr.mask = [&](int b, int t) { return support::dbl(r.mask[z(mrow(b) * r.S + t)]); };
  if (alibi)
    pr.alibi = [&](int b, int h, int t) {
      const int head = c.compress() ? (b % c.nkv) * G + h : h;
      return support::dbl(r.alibi[z((mrow(b) * c.nh + head) * r.S + t)]);
    };
  auto slot = [&](Index b, Index t) {
    return r.table[z(b * r.max_blocks + t / c.bs)] * c.bs + t % c.bs;
  };
  if (c.form == Form::Rope)
    pr.key_bias = [&](int b, int t) { return static_cast<double>(r.razor[z(slot(b, t))]); };
  auto value = [&](const std::vector<TKV>& x, const std::vector<float>& s,
                   const std::vector<std::int32_t>& o, Index i, Index ch) {
    if constexpr (std::is_same_v<TKV, i8>)
      return (static_cast<double>(x[z(i)]) + (o.empty() ? 0.0 : o[z(ch)])) * s[z(ch)];
    else
      return support::dbl(x[z(i)]);
  };
  std::vector<std::vector<double>> q;
  std::vector<std::vector<std::vector<double>>> k, v;
  Index x = 0;
  for (Index b = 0; b < c.seqs(); ++b) {
    const Index g = c.compress() ? b % c.nkv : 0;  // the pair's kv head (dequant channels)
    std::vector<double> qb(z(H * c.d), 0.0);
    if (c.rows(b) > 0)
      for (Index i = 0; i < H * c.d; ++i) qb[z(i)] = support::dbl(r.q[z(x * H * c.d + i)]);
    x += c.rows(b);
    q.push_back(qb);
    k.emplace_back(), v.emplace_back();
    for (Index t = 0; t < c.ctx[z(b)]; ++t) {
      std::vector<double> kt, vt;
      for (Index h = 0; h < KH; ++h) {
        for (Index e = 0; e < c.d; ++e)
          kt.push_back(value(r.kc, r.kd, r.ko, at(c, slot(b, t), h, e, c.d), (g + h) * c.d + e));
        for (Index e = 0; e < dv; ++e)
          vt.push_back(value(r.vc, r.vd, r.vo, at(c, slot(b, t), h, e, dv), (g + h) * dv + e));
      }
      k.back().push_back(kt), v.back().push_back(vt);
    }
  }
  const std::vector<double> o = ref::atb_paged_attention(pr, q, k, v);
  r.want.assign(r.out.size(), 7.0);
  x = 0;
  for (Index b = 0; b < c.seqs(); ++b) {
    if (c.rows(b) == 0) continue;
    for (Index i = 0; i < H * dv; ++i)
      r.want[z(x * H * dv + i)] = support::dbl(T(static_cast<float>(o[z(b * H * dv + i)])));
    ++x;
  }
}

template <class T, class TKV>
Built<T, TKV> build(const Case& c) {
  std::mt19937 rng(c.seed), trng(c.seed + 1000);
  Built<T, TKV> r;
  for (Index b = 0; b < c.seqs(); ++b) {
    r.tokens += c.rows(b);
    r.max_blocks = std::max(r.max_blocks, (c.ctx[z(b)] + c.bs - 1) / c.bs);
    r.S = std::max(r.S, c.ctx[z(b)] + 2);
  }
  if (c.compress()) r.tokens = c.tokens;  // the shapes keep every pair (ATB)
  r.max_blocks += 1;
  r.blocks = c.seqs() * r.max_blocks + 3;
  for (Index i = 0; i < r.tokens * c.nh * c.d; ++i) r.q.push_back(draw<T>(rng));
  std::vector<std::int32_t> ids(z(r.blocks));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(i);
  std::shuffle(ids.begin(), ids.end(), trng);
  r.table.assign(z(c.seqs() * r.max_blocks), -1);
  for (Index b = 0, next = 0; b < c.seqs(); ++b)
    for (Index j = 0; j * c.bs < c.ctx[z(b)]; ++j)
      r.table[z(b * r.max_blocks + j)] = ids[z(next++)];
  // Keys and values drawn in the logical order (block, offset, head, element): BSND and BNSD
  // builds of one case hold the same values.
  r.kc.resize(z(r.blocks * c.bs * c.ch() * c.d));
  r.vc.resize(z(r.blocks * c.bs * c.ch() * c.dv));
  for (Index row = 0; row < r.blocks * c.bs; ++row)
    for (Index h = 0; h < c.ch(); ++h) {
      for (Index e = 0; e < c.d; ++e) r.kc[z(at(c, row, h, e, c.d))] = draw<TKV>(rng);
      for (Index e = 0; e < c.dv; ++e) r.vc[z(at(c, row, h, e, c.dv))] = draw<TKV>(rng);
    }
  r.mrows = c.mask == Mask::NormBroadcast || c.mask == Mask::AlibiBroadcast ? 1
            : c.compress()                                                  ? c.tokens
                                                                            : c.seqs();
  std::bernoulli_distribution hole(0.2);
  if (c.mask == Mask::Norm || c.mask == Mask::NormBroadcast)
    for (Index i = 0; i < r.mrows * r.S; ++i) r.mask.push_back(T(hole(rng) ? -10000.0f : 0.0f));
  if (c.mask == Mask::Spec)
    for (Index i = 0; i < r.tokens * r.S; ++i) r.mask.push_back(T(hole(rng) ? -10000.0f : 0.0f));
  if (c.mask == Mask::Alibi || c.mask == Mask::AlibiBroadcast)
    for (Index b = 0; b < r.mrows; ++b)
      for (int h = 0; h < c.nh; ++h)
        for (Index t = 0; t < r.S; ++t)
          r.alibi.push_back(T(std::pow(2.0f, -8.0f * static_cast<float>(h + 1) / c.nh) *
                              static_cast<float>(t - r.S + 3)));
  if (c.form == Form::Rope) {  // the golden's: mostly 0, a value in [0, 20) in 80 % of the rows
    r.razor.assign(z(r.blocks * c.bs), 0.0f);
    std::uniform_real_distribution<float> u(0.0f, 20.0f);
    for (Index blk = 0; blk < r.blocks; ++blk)
      if (hole(rng) == false) r.razor[z(blk * c.bs + (blk * 7) % c.bs)] = u(rng);
  }
  if (c.dequant) {
    std::uniform_real_distribution<float> u(0.005f, 0.02f);
    for (int i = 0; i < c.nkv * c.d; ++i) r.kd.push_back(u(rng));
    for (int i = 0; i < c.nkv * c.dv; ++i) r.vd.push_back(u(rng));
    for (int i = 0; c.offset && i < c.nkv * c.d; ++i) r.ko.push_back(static_cast<int>(i % 9) - 4);
    for (int i = 0; c.offset && i < c.nkv * c.dv; ++i) r.vo.push_back(static_cast<int>(i % 7) - 3);
  }
  r.out.assign(z(r.tokens * c.nh * c.dv), T(7.0f));  // sentinel
  if (c.qlen.empty()) expect_reference(c, r);
  return r;
}

template <class T, class TKV>
void run(const Case& c, Built<T, TKV>& r,
         const std::function<void(P&, typename Built<T, TKV>::In&)>& edit = {},
         bool validate_only = false) {
  const Index B = c.seqs();
  P p;
  p.num_heads = c.nh;
  p.num_kv_heads = c.nkv;
  p.qk_scale = 0.125f;
  p.input_layout = c.form == Form::Bnsd ? P::InputLayout::BNSD : P::InputLayout::BSND;
  p.compress_type = c.form == Form::KvHead ? P::CompressType::KvHead
                    : c.form == Form::Rope ? P::CompressType::KvHeadRope
                                           : P::CompressType::Undefined;
  typename Built<T, TKV>::In in;
  in.query = StridedView<const T, 3>(r.q.data(), {r.tokens, c.nh, c.d});
  const bool bnsd = c.form == Form::Bnsd;
  const Index h1 = bnsd ? c.ch() : c.bs, h2 = bnsd ? c.bs : c.ch();
  in.key_cache = StridedView<const TKV, 4>(r.kc.data(), {r.blocks, h1, h2, c.d});
  in.value_cache = StridedView<const TKV, 4>(r.vc.data(), {r.blocks, h1, h2, c.dv});
  in.block_tables = StridedView<const std::int32_t, 2>(r.table.data(), {B, r.max_blocks});
  in.context_lens = c.ctx;
  if (!c.qlen.empty()) {
    p.calc_type = P::CalcType::Spec;
    in.q_seq_lens = c.qlen;
  }
  if (c.mask == Mask::Norm || c.mask == Mask::NormBroadcast) {
    p.mask_type = P::MaskType::Norm;
    in.mask = StridedView<const T, 3>(r.mask.data(), {r.mrows, 1, r.S});
  }
  if (c.mask == Mask::Spec) {
    p.mask_type = P::MaskType::Spec;
    in.spec_mask = StridedView<const T, 2>(r.mask.data(), {r.tokens, r.S});
  }
  if (c.mask == Mask::Alibi || c.mask == Mask::AlibiBroadcast) {
    p.mask_type = P::MaskType::Alibi;
    in.alibi_mask = StridedView<const T, 4>(r.alibi.data(), {r.mrows, c.nh, 1, r.S});
  }
  if (c.form == Form::Rope)
    in.razor_offset = StridedView<const float, 2>(r.razor.data(), {r.blocks, c.bs});
  if (!c.status.empty()) {
    p.batch_run_status_enable = true;
    in.batch_run_status = c.status;
  }
  if (c.dequant) {
    p.quant_type = P::QuantType::DequantFusion;
    p.has_quant_offset = c.offset;
    in.k_descale = StridedView<const float, 1>(r.kd.data(), {static_cast<Index>(r.kd.size())});
    in.v_descale = StridedView<const float, 1>(r.vd.data(), {static_cast<Index>(r.vd.size())});
    if (c.offset) {
      in.k_offset =
          StridedView<const std::int32_t, 1>(r.ko.data(), {static_cast<Index>(r.ko.size())});
      in.v_offset =
          StridedView<const std::int32_t, 1>(r.vo.data(), {static_cast<Index>(r.vo.size())});
    }
  }
  if (edit) edit(p, in);
  const attnref::PagedAttentionOutputs<T> out{
      StridedView<T, 3>(r.out.data(), {r.tokens, c.nh, c.dv})};
  if (validate_only)
    attnref::validate(p, in, out, {c.threads});
  else
    attnref::paged_attention(p, in, out, {c.threads});
}

template <class T, class TKV = T>
Built<T, TKV> check(const Case& c, const std::string& what) {
  Built<T, TKV> r = build<T, TKV>(c);
  EXPECT_NO_THROW(run(c, r)) << what;
  EXPECT_TRUE(support::all_close(r.want, support::as_doubles(r.out),
                                 support::tolerance(support::kind_of<T>())))
      << what;
  return r;
}

template <class T, class TKV>
using Edits =
    std::vector<std::pair<std::function<void(P&, typename Built<T, TKV>::In&)>, std::string>>;

// Each edit must throw std::invalid_argument with `what` in the message, before anything is
// written; validate() alone throws the same.
template <class T, class TKV = T>
void expect_rejected(const Case& c, const Edits<T, TKV>& edits) {
  const Built<T, TKV> built = build<T, TKV>(c);
  for (const auto& [edit, what] : edits) {
    auto r = built;
    support::expect_validate_agrees([&] { run(c, r, edit, true); }, [&] { run(c, r, edit); });
    support::expect_throw([&] { run(c, r, edit); }, what, false);
    for (const T& x : r.out) ASSERT_EQ(support::dbl(x), 7.0) << what;
  }
}

// -------------------------------------------------------------------------------------- BNSD

TEST(PagedAttentionForms, BnsdEqualsBsndOnTheSameCachesBitForBit) {
  struct Shape {
    int nh, nkv, d, bs;
  };
  int n = 0;
  for (Shape s : {Shape{8, 2, 32, 16}, Shape{12, 3, 24, 5}, Shape{4, 4, 17, 1}, Shape{6, 1, 40, 7}})
    for (Mask m : {Mask::None, Mask::Norm, Mask::NormBroadcast, Mask::Alibi, Mask::AlibiBroadcast})
      for (int threads : {1, 3}) {
        Case c;
        c.nh = s.nh, c.nkv = s.nkv, c.d = c.dv = s.d, c.bs = s.bs;
        c.ctx = {0, 1, 17, 130, 0, 40};
        c.status =
            n % 2 ? std::vector<std::int32_t>{0, 1, 1, 1, 1, 1} : std::vector<std::int32_t>{};
        c.mask = m;
        c.threads = threads;
        c.seed = static_cast<unsigned>(100 + n++);
        const std::string what = "shape " + std::to_string(s.nh) + "/" + std::to_string(s.nkv) +
                                 "/" + std::to_string(s.d) + "/" + std::to_string(s.bs) + " mask " +
                                 std::to_string(static_cast<int>(m)) + " threads " +
                                 std::to_string(threads);
        Case b = c;
        b.form = Form::Bnsd;
        const auto sd = check<half>(c, what);
        const auto nd = check<half>(b, what + " BNSD");
        if (s.nkv > 1 && s.bs > 1) {
          EXPECT_NE(sd.kc, nd.kc) << what;  // the layouts differ, not the values
        }
        EXPECT_TRUE(support::same_bits(sd.out, nd.out)) << what;
        if (threads == 1 && m == Mask::Alibi) {
          const auto f = check<float>(c, what), fb = check<float>(b, what + " BNSD");
          EXPECT_TRUE(support::same_bits(f.out, fb.out)) << what;
        }
      }
}

TEST(PagedAttentionForms, BnsdRejections) {
  using E = Edits<half, half>;
  Case c;
  c.form = Form::Bnsd;
  c.ctx = {3, 17, 40};
  static const float log_n[3] = {1, 1, 1};
  expect_rejected<half>(
      c, E{{[](P& p, auto& in) {
              p.calc_type = P::CalcType::Spec;
              in.q_seq_lens = {1, 1, 1};
            },
            "params.calc_type Spec not supported with input_layout BNSD"},
           {[](P& p, auto&) { p.mask_type = P::MaskType::Spec; },
            "params.mask_type Spec not supported with input_layout BNSD"},
           {[](P& p, auto&) { p.compress_type = P::CompressType::KvHead; },
            "params.input_layout BNSD not supported with compress_type KvHead"},
           {[](P& p, auto&) { p.quant_type = P::QuantType::DequantFusion; },
            "params.quant_type quantization (int8 caches or quant_type != Unquant) not supported "
            "with input_layout BNSD"},
           {[](P& p, auto& in) {
              p.scale_type = P::ScaleType::LogN;
              in.log_n = StridedView<const float, 1>(log_n, {3});
            },
            "params.scale_type LogN not supported with input_layout BNSD"},
           {[](P& p, auto& in) {
              p.mla_v_head_size = 16;
              in.value_cache = {};
            },
            "params.mla_v_head_size MLA not supported with input_layout BNSD"},
           {[](P&, auto& in) {  // V's head size must be K's
              in.value_cache = StridedView<const half, 4>(in.value_cache.data(),
                                                          {in.value_cache.size(0), 2, 16, 16});
            },
            "value_cache.shape[3] (headSizeV) must equal headSize with input_layout BNSD"},
           {[](P&, auto& in) {  // the BSND shape given with BNSD
              in.key_cache = StridedView<const half, 4>(in.key_cache.data(),
                                                        {in.key_cache.size(0), 16, 2, 32});
            },
            "key_cache.shape mismatch: expected [numBlocks, 2, blockSize, 32]"}});
  Case dq = c;  // int8 caches (DEQUANT_FUSION)
  dq.dequant = true;
  expect_rejected<half, i8>(dq, Edits<half, i8>{{nullptr, "not supported with input_layout BNSD"}});
}

// The qkv-quantized family (int8 query) with BNSD or compressType: rejected from the params.
TEST(PagedAttentionForms, QkvQuantizationRejectedWithBnsdAndCompress) {
  P p;
  p.num_heads = 4;
  p.num_kv_heads = 2;
  p.quant_type = P::QuantType::QkvOnline;
  p.out_data_type = P::OutDataType::Float16;
  const attnref::PagedAttentionInputs<i8> in;
  std::vector<half> o(8);
  const attnref::PagedAttentionOutputs<half> out{StridedView<half, 3>(o.data(), {1, 4, 2})};
  P b = p;
  b.input_layout = P::InputLayout::BNSD;
  support::expect_throw([&] { attnref::paged_attention(b, in, out); },
                        "params.quant_type quantization (int8 caches or quant_type != Unquant) "
                        "not supported with input_layout BNSD",
                        false);
  for (auto ct : {P::CompressType::KvHead, P::CompressType::KvHeadRope}) {
    P q = p;
    q.compress_type = ct;
    support::expect_throw([&] { attnref::paged_attention(q, in, out); },
                          "params.quant_type qkv quantization (int8 query) not supported with "
                          "compress_type",
                          false);
  }
}

// ------------------------------------------------------------------------- compressType

Case compress_case(Form f) {
  Case c;
  c.form = f;
  c.tokens = 3;  // 8 heads, 2 kv heads: 6 pairs of 4 query heads
  c.ctx = {5, 40, 17, 1, 33, 130};
  return c;
}

TEST(PagedAttentionForms, CompressedHeadsMatchReference) {
  int n = 0;
  for (Mask m : {Mask::None, Mask::Norm, Mask::NormBroadcast, Mask::Alibi, Mask::AlibiBroadcast}) {
    Case c = compress_case(Form::KvHead);
    c.mask = m;
    c.seed = static_cast<unsigned>(200 + n++);
    const std::string what = "KvHead mask " + std::to_string(static_cast<int>(m));
    check<half>(c, what);
    check<bfloat16>(c, what);
    check<float>(c, what);
  }
  Case rope = compress_case(Form::Rope);
  check<half>(rope, "KvHeadRope");
  check<bfloat16>(rope, "KvHeadRope");
  const auto f = check<float>(rope, "KvHeadRope");
  Case plain = rope;  // the offset matters
  plain.form = Form::KvHead;
  EXPECT_FALSE(support::same_bits(f.out, check<float>(plain, "KvHead").out));
  Case odd;  // 6 heads, 3 kv heads (pairs of 2), blocks of 5; one kv head (pairs of all heads)
  odd.form = Form::Rope;
  odd.nh = 6, odd.nkv = 3, odd.bs = 5, odd.d = 24, odd.dv = 40, odd.tokens = 2;
  odd.ctx = {3, 9, 130, 2, 1, 77};
  check<half>(odd, "6 heads / 3 kv heads");
  odd.form = Form::KvHead;
  odd.mask = Mask::Alibi;
  check<float>(odd, "6 heads / 3 kv heads, ALIBI");
  Case one = compress_case(Form::KvHead);
  one.nh = 4, one.nkv = 1, one.tokens = 4, one.ctx = {7, 1, 64, 20};
  one.mask = Mask::Norm;
  check<half>(one, "one kv head");
  for (Form f2 : {Form::KvHead, Form::Rope}) {  // any thread count, the same bits
    Case t1 = compress_case(f2), t3 = t1;
    t1.threads = 1, t3.threads = 3;
    EXPECT_TRUE(
        support::same_bits(check<half>(t1, "threads 1").out, check<half>(t3, "threads 3").out));
  }
}

TEST(PagedAttentionForms, CompressedHeadsWithDequantFusion) {
  for (Form f : {Form::KvHead, Form::Rope})
    for (bool offset : {false, true}) {
      Case c = compress_case(f);
      c.dequant = true;
      c.offset = offset;
      c.mask = f == Form::KvHead ? Mask::Norm : Mask::None;
      const std::string what =
          std::string(f == Form::KvHead ? "KvHead" : "KvHeadRope") + (offset ? " offsets" : "");
      check<half, i8>(c, what);
      check<bfloat16, i8>(c, what);
    }
}

// ATB's hazard: a pair without keys drops its rows from the packing; every later pair reads and
// writes the rows one pair earlier, and the last rows of out are left as they were.
TEST(PagedAttentionForms, CompressedHeadZeroLengthPairDropsItsRows) {
  for (bool status : {false, true}) {
    Case c = compress_case(Form::KvHead);
    c.ctx = {5, 0, 17, 9, 0, 4};
    if (status) c.status = {1, 0, 1, 1, 0, 1};
    const auto r = check<half>(c, status ? "with batchRunStatus" : "zero pairs");
    const size_t kept = 4 * 4 * z(c.dv);  // 4 pairs with keys, 4 heads each
    for (size_t i = kept; i < r.out.size(); ++i) ASSERT_EQ(support::dbl(r.out[i]), 7.0) << i;
  }
}

TEST(PagedAttentionForms, CompressedHeadQueryAndOutputViews) {
  // One token (or one kv head): any token stride reshapes; the result equals the packed one.
  for (int nkv : {2, 1}) {
    Case c = compress_case(Form::KvHead);
    c.tokens = nkv == 2 ? 1 : 3;
    c.nkv = nkv;
    c.ctx = nkv == 2 ? std::vector<Index>{40, 17} : std::vector<Index>{40, 17, 3};
    auto r = check<half>(c, "packed");
    const Index row = c.nh * c.d + 5;
    std::vector<half> q(z(c.tokens * row));
    for (Index t = 0; t < c.tokens; ++t)
      std::copy_n(&r.q[z(t * c.nh * c.d)], c.nh * c.d, &q[z(t * row)]);
    auto s = r;
    std::fill(s.out.begin(), s.out.end(), half(7.0f));
    run(c, s, [&](P&, auto& in) {
      in.query = StridedView<const half, 3>(q.data(), {c.tokens, c.nh, c.d}, {row, c.d, 1});
    });
    EXPECT_TRUE(support::same_bits(s.out, r.out)) << nkv;
  }
  Case c = compress_case(Form::KvHead);  // 3 tokens, 2 kv heads: a padded stride cannot merge
  std::vector<half> pad(z(3 * (c.nh * c.d + 1)));
  std::vector<half> opad(z(3 * (c.nh * c.dv + 1)));
  expect_rejected<half>(
      c, Edits<half, half>{
             {[&](P&, auto& in) {
                in.query = StridedView<const half, 3>(pad.data(), {3, c.nh, c.d},
                                                      {c.nh * c.d + 1, c.d, 1});
              },
              "query.stride(0) compress_type reads the view as [numTokens * kvHeadNum, headNum / "
              "kvHeadNum, ·] and the merged axes need one stride: expected kvHeadNum * (headNum / "
              "kvHeadNum) * stride(1) = 256, got 257"}});
  auto r = build<half, half>(c);
  support::expect_throw(
      [&] {
        P p;
        p.num_heads = c.nh, p.num_kv_heads = c.nkv, p.compress_type = P::CompressType::KvHead;
        attnref::PagedAttentionInputs<half> in;
        in.query = StridedView<const half, 3>(r.q.data(), {3, c.nh, c.d});
        in.key_cache = StridedView<const half, 4>(r.kc.data(), {r.blocks, c.bs, 1, c.d});
        in.value_cache = StridedView<const half, 4>(r.vc.data(), {r.blocks, c.bs, 1, c.dv});
        in.block_tables = StridedView<const std::int32_t, 2>(r.table.data(), {6, r.max_blocks});
        in.context_lens = c.ctx;
        attnref::paged_attention(p, in,
                                 attnref::PagedAttentionOutputs<half>{StridedView<half, 3>(
                                     opad.data(), {3, c.nh, c.dv}, {c.nh * c.dv + 1, c.dv, 1})});
      },
      "out.stride(0) compress_type reads the view as", false);
}

TEST(PagedAttentionForms, CompressedHeadRejections) {
  using E = Edits<half, half>;
  static const float log_n[6] = {1, 1, 1, 1, 1, 1};
  static std::vector<half> norm(z(6 * 132), half(0.0f)), square(z(132 * 132), half(0.0f));
  static std::vector<float> razor(4096, 0.0f);
  const Case kv = compress_case(Form::KvHead);
  expect_rejected<half>(
      kv,
      E{{[](P& p, auto&) { p.num_kv_heads = 0; },
         "params.num_kv_heads must be set with compress_type KvHead"},
        {[](P& p, auto& in) {
           p.calc_type = P::CalcType::Spec;
           in.q_seq_lens.assign(6, 1);
         },
         "params.calc_type Spec not supported with compress_type KvHead"},
        {[](P& p, auto& in) {
           p.scale_type = P::ScaleType::LogN;
           in.log_n = StridedView<const float, 1>(log_n, {6});
         },
         "params.scale_type LogN not supported with compress_type KvHead"},
        {[](P& p, auto&) { p.input_layout = P::InputLayout::BNSD; },
         "params.input_layout BNSD not supported with compress_type KvHead"},
        {[](P& p, auto&) { p.mla_v_head_size = 16; },
         "params.mla_v_head_size MLA not supported with compress_type KvHead"},
        {[](P& p, auto& in) {
           p.mask_type = P::MaskType::Spec;
           in.spec_mask = StridedView<const half, 2>(norm.data(), {3, 132});
         },
         "params.mask_type Spec not supported with compress_type KvHead"},
        {[](P& p, auto& in) {  // one row per pair instead of per token
           p.mask_type = P::MaskType::Norm;
           in.mask = StridedView<const half, 3>(norm.data(), {6, 1, 132});
         },
         "mask.shape mismatch for Norm: expected [1 or 3, 1, >= 130] (compress_type: one row per "
         "query token)"},
        {[](P& p, auto& in) {
           p.mask_type = P::MaskType::Norm;
           in.mask = StridedView<const half, 3>(square.data(), {1, 132, 132});
         },
         "mask.shape mismatch for Norm"},
        {[](P&, auto& in) {
           in.razor_offset = StridedView<const float, 2>(razor.data(), {in.key_cache.size(0), 16});
         },
         "razor_offset given without compress_type KvHeadRope"},
        {[](P&, auto& in) { in.context_lens.pop_back(); },
         "context_lens size mismatch: compress_type needs one length per (query token, kv head) "
         "pair: expected numTokens * kvHeadNum = 6, got 5"},
        {[](P&, auto& in) {  // the caches of the real kv heads
           in.key_cache = StridedView<const half, 4>(in.key_cache.data(),
                                                     {in.key_cache.size(0) / 2, 16, 2, 32});
         },
         "key_cache.shape mismatch (compress_type: one kv head): expected [numBlocks, blockSize, "
         "1, 32]"}});
  const Case rope = compress_case(Form::Rope);
  expect_rejected<half>(
      rope, E{{[](P& p, auto& in) {
                 p.mask_type = P::MaskType::Norm;
                 in.mask = StridedView<const half, 3>(norm.data(), {3, 1, 132});
               },
               "params.mask_type a mask is not supported with compress_type KvHeadRope"},
              {[](P& p, auto& in) {
                 p.batch_run_status_enable = true;
                 in.batch_run_status.assign(6, 1);
               },
               "params.batch_run_status_enable not supported with compress_type KvHeadRope"},
              {[](P&, auto& in) { in.razor_offset = {}; },
               "razor_offset.shape mismatch for compress_type KvHeadRope (one value per cache "
               "slot)"},
              {[](P&, auto& in) {
                 in.razor_offset = StridedView<const float, 2>(in.razor_offset.data(),
                                                               {in.razor_offset.size(0), 15});
               },
               "razor_offset.shape mismatch"}});
}

// --------------------------------------------------------------- inactive sequences (packing)

// The sequences with context 0 take no query row: a batch with them gives the bits of the batch
// without them (same rows, same keys), decode and SPEC, any thread count.
TEST(PagedAttentionForms, SequencesWithoutKeysTakeNoRows) {
  for (bool spec : {false, true})
    for (int threads : {1, 2}) {
      Case c;
      c.ctx = {0, 7, 0, 0, 12, 130};
      c.status = spec ? std::vector<std::int32_t>{} : std::vector<std::int32_t>{0, 1, 1, 0, 1, 1};
      if (spec) {
        c.qlen = {3, 2, 5, 0, 4, 1};  // entries of the zero-context sequences are ignored
        c.mask = Mask::Spec;
      }
      c.threads = threads;
      auto r = spec ? build<half, half>(c) : check<half>(c, "decode");
      if (spec) {
        ASSERT_NO_THROW(run(c, r));
      }
      ASSERT_EQ(r.tokens, spec ? 7 : 3);
      auto d = r;
      std::fill(d.out.begin(), d.out.end(), half(7.0f));
      std::vector<std::int32_t> table;  // the rows of sequences 1, 4, 5
      for (Index b : {1, 4, 5})
        table.insert(table.end(), &r.table[z(b * r.max_blocks)],
                     &r.table[z((b + 1) * r.max_blocks)]);
      run(c, d, [&](P& p, auto& in) {
        in.block_tables = StridedView<const std::int32_t, 2>(table.data(), {3, r.max_blocks});
        in.context_lens = {7, 12, 130};
        if (spec) in.q_seq_lens = {2, 4, 1};
        p.batch_run_status_enable = false;
        in.batch_run_status.clear();
      });
      EXPECT_TRUE(support::same_bits(r.out, d.out)) << (spec ? "spec" : "decode") << threads;
    }
}

TEST(PagedAttentionForms, PackingRejections) {
  using E = Edits<half, half>;
  Case c;
  c.ctx = {0, 7, 0, 12};
  expect_rejected<half>(
      c, E{{[](P&, auto& in) { in.context_lens[0] = 3; },
            "query.shape[0] mismatch with the number of sequences with context_lens > 0 (one "
            "query row each, packed; a sequence with context length 0 takes none): expected 3, "
            "got 2"},
           {[](P& p, auto& in) {
              p.batch_run_status_enable = true;
              in.batch_run_status = {0, 0, 0, 1};
            },
            "batch_run_status[1] is 0 for a sequence with keys"}});
  Case s = c;
  s.qlen = {4, 2, 9, 3};
  s.mask = Mask::Spec;
  expect_rejected<half>(
      s, E{{[](P&, auto& in) { in.q_seq_lens[1] = 3; },
            "query.shape[0] mismatch with the sum of q_seq_lens over the sequences with "
            "context_lens > 0"},
           {[](P&, auto& in) { in.q_seq_lens[0] = -1; }, "q_seq_lens[0] out of range"},
           {[](P&, auto& in) { in.q_seq_lens[3] = 13; },
            "q_seq_lens[3] out of range: expected [0, context_lens[3] = 12], got 13"}});
}

}  // namespace paged_attention_forms_test
