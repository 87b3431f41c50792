// CANN FusedInferAttentionScore (FIA): routing, softmax_lse and the contract's rejections.
// Metamorphic: FIA with Q_S > 1 == PromptFlashAttention and FIA with Q_S == 1 ==
// IncreFlashAttention on the shared parameter set, bit for bit (contiguous, listed and paged
// caches, int8 antiquant per channel and per token, masks, pse, GQA, padded and TND rows);
// parameters the documents call invalid in a branch change nothing; results do not depend on
// the thread count. softmax_lse against the independent reference's log-sum-exp
// (tests/reference/cann_flash_attention.hpp), with the invalid-row values of each branch
// (+inf prompt, -3.40e38 incremental) and the fill values of masked rows. Every rejection
// leaves both outputs untouched.

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/cann/fused_infer_attention_score.hpp>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cann/flash_attention_support.hpp"
#include "reference/cann_flash_attention.hpp"
#include "support/cast.hpp"
#include "support/errors.hpp"

namespace fia_test {

using namespace flash_attention_support;
using attnref::FusedInferAttentionScoreInputs;
using attnref::FusedInferAttentionScoreOutputs;
using attnref::FusedInferAttentionScoreParams;

constexpr float kInfF = std::numeric_limits<float>::infinity();
constexpr float kSentinel = 7.0f;

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// softmax_lse against the reference: infinities (and the IFA invalid value) exactly, finite
// values within 2e-5 relative plus 1e-4 absolute (fp32 scores of rounded inputs).
::testing::AssertionResult lse_close(const std::vector<double>& want,
                                     const std::vector<float>& got) {
  if (want.size() != got.size()) return ::testing::AssertionFailure() << "size mismatch";
  for (size_t i = 0; i < want.size(); ++i) {
    const double w = want[i], g = got[i];
    const bool ok = std::isinf(w) || w == double(-3.40e38f)
                        ? g == w
                        : std::abs(g - w) <= 1e-4 + 2e-5 * std::abs(w);
    if (!ok) return ::testing::AssertionFailure() << "lse[" << i << "] = " << g << ", want " << w;
  }
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------------------------
// Q_S > 1: the prompt branch.

struct PCase {
  std::string layout = "BSND";
  std::vector<int> ql, kvl;
  int mode = 0, inner = 1;
  bool mask = false;  // modes 0 / 1: random holes, every row i % 4 == 3 fully masked
  std::int64_t pre = kInf, next = kInf;
  bool pse = false;
  bool sink = false;  // learnable_sink: -inf, 3, -2.5, 0.75, ... per head
  unsigned seed = 1;
  int N = 4, kvn = 2, D = 16, Dv = 16;
  double scale = 0.3;
  bool nopad = false;  // extents = the longest lengths (Q_S 1: the incremental branch)
  int B() const { return static_cast<int>(ql.size()); }
  int pad() const { return layout == "TND" || nopad ? 0 : 2; }
  int S1() const { return *std::max_element(ql.begin(), ql.end()) + pad(); }
  int S2() const { return *std::max_element(kvl.begin(), kvl.end()) + pad(); }
  bool hole(int b, int i, int j) const { return i % 4 == 3 || hv(seed, b, i, j) < 0.3; }
};

template <class T>
struct PBuilt {
  PCase c;
  Dims qd, kd, vd, od;
  Seqs q, k, v;
  std::vector<T> qb, kb, vb, pse;
  std::vector<bfloat16> sink;
  Array<u8> mask;
  Shape mshape;
  std::vector<std::int64_t> qlist, kvlist;
};

double sink_of(int h) {
  const double v[4] = {-HUGE_VAL, 3.0, -2.5, 0.75};
  return v[h % 4];
}

template <class T>
PBuilt<T> build_prompt(const PCase& c) {
  PBuilt<T> r;
  r.c = c;
  const int B = c.B();
  std::vector<int> qcu{0}, kcu{0};
  for (int b = 0; b < B; ++b) {
    qcu.push_back(qcu.back() + c.ql[z(b)]);
    kcu.push_back(kcu.back() + c.kvl[z(b)]);
  }
  r.qd = {c.layout, B, c.S1(), c.N, c.D, qcu};
  r.kd = {c.layout, B, c.S2(), c.kvn, c.D, kcu};
  r.vd = {c.layout, B, c.S2(), c.kvn, c.Dv, kcu};
  r.od = {c.layout == "BNSD_BSND" ? "BSND" : c.layout, B, c.S1(), c.N, c.Dv, qcu};
  std::mt19937 rng(c.seed);
  r.q = draw<T>(rng, c.ql, c.N, c.D);
  r.k = draw<T>(rng, c.kvl, c.kvn, c.D);
  r.v = draw<T>(rng, c.kvl, c.kvn, c.Dv);
  r.qb = pack<T>(r.qd, r.q, c.ql);
  r.kb = pack<T>(r.kd, r.k, c.kvl);
  r.vb = pack<T>(r.vd, r.v, c.kvl);
  if (c.layout == "TND") {
    r.qlist.assign(qcu.begin() + 1, qcu.end());
    r.kvlist.assign(kcu.begin() + 1, kcu.end());
  } else {
    r.qlist.assign(c.ql.begin(), c.ql.end());
    r.kvlist.assign(c.kvl.begin(), c.kvl.end());
  }
  if (c.mode >= 2) {  // the compressed mask (content not read)
    r.mask = Array<u8>(z(2048 * 2048));
    r.mshape = {2048, 2048};
  } else if (c.mask) {
    r.mshape = {B, c.S1(), c.S2()};
    r.mask = Array<u8>(z(B * c.S1() * c.S2()));
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < c.S1(); ++i)
        for (int j = 0; j < c.S2(); ++j)
          r.mask[z((b * c.S1() + i) * c.S2() + j)] = u8(c.hole(b, i, j) ? 1 : 0);
  }
  if (c.pse)
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < c.N; ++h)
        for (int i = 0; i < c.S1(); ++i)
          for (int j = 0; j < c.S2(); ++j)
            r.pse.push_back(T(static_cast<float>(2 * hv(c.seed + 5, b * 64 + h, i, j) - 1)));
  if (c.sink)
    for (int h = 0; h < c.N; ++h) r.sink.push_back(bfloat16(static_cast<float>(sink_of(h))));
  return r;
}

template <class T>
struct PCall {
  FusedInferAttentionScoreParams p;
  FusedInferAttentionScoreInputs<T> in;
  StridedView<T> o;
  StridedView<float> lse;
};
template <class T>
using PEdit = std::function<void(PCall<T>&)>;
template <class T>
struct Same {  // (keeps an argument out of template deduction)
  using type = T;
};

template <class T>
Shape lse_shape(const PBuilt<T>& r) {
  const PCase& c = r.c;
  return c.layout == "TND" ? shp(r.qd.cu.back(), c.N, 1) : shp(c.B(), c.N, c.S1(), 1);
}

template <class T>
PCall<T> prompt_call(PBuilt<T>& r, std::vector<T>& out, std::vector<float>& lse) {
  const PCase& c = r.c;
  out.assign(r.od.size(), T(kSentinel));
  size_t n = 1;
  for (Index e : lse_shape(r)) n *= z(e);
  lse.assign(n, kSentinel);
  PCall<T> x;
  x.p.num_heads = c.N;
  x.p.num_key_value_heads = c.kvn;
  x.p.scale_value = c.scale;
  x.p.pre_tokens = c.pre;
  x.p.next_tokens = c.next;
  x.p.input_layout = c.layout;
  x.p.sparse_mode = c.mode;
  x.p.inner_precise = c.inner;
  x.p.softmax_lse_flag = true;
  x.in.query = {r.qb.data(), r.qd.shape()};
  x.in.key = {StridedView<const T>(r.kb.data(), r.kd.shape())};
  x.in.value = {StridedView<const T>(r.vb.data(), r.vd.shape())};
  if (r.mask.n) x.in.atten_mask = {r.mask.data(), r.mshape};
  if (c.pse) x.in.pse_shift = {r.pse.data(), shp(c.B(), c.N, c.S1(), c.S2())};
  if (c.sink) x.in.learnable_sink = {r.sink.data(), shp(c.N)};
  x.in.actual_seq_lengths = r.qlist;
  x.in.actual_seq_lengths_kv = r.kvlist;
  x.o = StridedView<T>(out.data(), r.od.shape());
  x.lse = StridedView<float>(lse.data(), lse_shape(r));
  return x;
}

template <class T>
void run_prompt(PBuilt<T>& r, std::vector<T>& out, std::vector<float>& lse,
                const typename Same<PEdit<T>>::type& edit = {}, int threads = 0) {
  PCall<T> x = prompt_call(r, out, lse);
  if (edit) edit(x);
  attnref::fused_infer_attention_score(x.p, x.in, FusedInferAttentionScoreOutputs<T>{x.o, x.lse},
                                       {threads});
}

// The same problem through PromptFlashAttention.
template <class T>
std::vector<T> pfa_out(PBuilt<T>& r) {
  const PCase& c = r.c;
  std::vector<T> out(r.od.size(), T(kSentinel));
  attnref::PromptFlashAttentionParams p;
  p.num_heads = c.N;
  p.num_key_value_heads = c.kvn;
  p.scale_value = c.scale;
  p.pre_tokens = c.pre;
  p.next_tokens = c.next;
  p.input_layout = c.layout;
  p.sparse_mode = c.mode;
  p.inner_precise = c.inner;
  attnref::PromptFlashAttentionInputs<T> in{
      {r.qb.data(), r.qd.shape()}, {r.kb.data(), r.kd.shape()}, {r.vb.data(), r.vd.shape()}};
  if (r.mask.n) in.atten_mask = {r.mask.data(), r.mshape};
  if (c.pse) in.pse_shift = {r.pse.data(), shp(c.B(), c.N, c.S1(), c.S2())};
  in.actual_seq_lengths = r.qlist;
  in.actual_seq_lengths_kv = r.kvlist;
  attnref::prompt_flash_attention(
      p, in, attnref::PromptFlashAttentionOutputs<T>{StridedView<T>(out.data(), r.od.shape())});
  return out;
}

// The reference's lse in softmax_lse's layout: rows without a key and padded rows +inf.
template <class T>
std::vector<double> prompt_lse(const PBuilt<T>& r) {
  const PCase& c = r.c;
  ref::cann::Pfa pr{c.N,    c.kvn, c.D,    c.Dv,    c.ql,  c.kvl,       c.scale,
                    c.mode, c.pre, c.next, c.inner, false, r.mask.n > 0};
  if (c.mask && c.mode < 2) pr.mask = [&c](int b, int i, int j) { return c.hole(b, i, j); };
  if (c.pse)
    pr.pse = [&r, &c](int b, int h, int i, int j) {
      return dbl(r.pse[z(((b * c.N + h) * c.S1() + i) * c.S2() + j)]);
    };
  Seqs lse;
  (void)ref::cann::pfa(pr, r.q, r.k, r.v, &lse);
  std::vector<double> want;
  for (int b = 0; b < c.B(); ++b) {
    const auto at = [&](int h, int i) {
      const double l = lse[z(b)][z(h * c.ql[z(b)] + i)];
      return l == -HUGE_VAL ? HUGE_VAL : l;  // a row without a key: +inf
    };
    if (c.layout == "TND") continue;
    for (int h = 0; h < c.N; ++h)
      for (int i = 0; i < c.S1(); ++i) want.push_back(i < c.ql[z(b)] ? at(h, i) : HUGE_VAL);
  }
  if (c.layout == "TND")  // [T, N, 1]
    for (int b = 0; b < c.B(); ++b)
      for (int i = 0; i < c.ql[z(b)]; ++i)
        for (int h = 0; h < c.N; ++h) {
          const double l = lse[z(b)][z(h * c.ql[z(b)] + i)];
          want.push_back(l == -HUGE_VAL ? HUGE_VAL : l);
        }
  return want;
}

// The reference's output in attention_out's layout (padded rows 0).
template <class T>
std::vector<double> prompt_expected(const PBuilt<T>& r) {
  const PCase& c = r.c;
  ref::cann::Pfa pr{c.N,    c.kvn, c.D,    c.Dv,    c.ql,  c.kvl,       c.scale,
                    c.mode, c.pre, c.next, c.inner, false, r.mask.n > 0};
  if (c.sink) pr.sink = [](int h) { return sink_of(h); };
  const Seqs o = ref::cann::pfa(pr, r.q, r.k, r.v);
  std::vector<double> want(r.od.size(), 0.0);
  for (int b = 0; b < c.B(); ++b)
    for (int i = 0; i < c.ql[z(b)]; ++i)
      for (int h = 0; h < c.N; ++h)
        for (int e = 0; e < c.Dv; ++e)
          want[r.od.at(b, i, h, e)] = o[z(b)][z((i * c.N + h) * c.Dv + e)];
  return want;
}

std::vector<PCase> prompt_grid() {
  std::vector<PCase> g;
  const std::vector<std::string> lays{"BSH", "BSND", "BNSD", "BNSD_BSND", "TND"};
  unsigned seed = 1;
  for (const auto& lay : lays) {
    // no mask; a hole mask (fully masked rows) with inner_precise 0 and 2; causal; band.
    PCase a;
    a.layout = lay;
    a.ql = {5, 9, 3};
    a.kvl = {7, 0, 11};  // batch 1 has no keys
    a.seed = seed++;
    g.push_back(a);
    if (lay != "TND") {
      for (int inner : {0, 2}) {
        PCase m = a;
        m.mask = true;
        m.inner = inner;
        m.kvl = {7, 4, 11};
        m.pse = inner == 0;
        m.seed = seed++;
        g.push_back(m);
      }
      PCase band = a;
      band.mode = 4;
      band.pre = 2;
      band.next = -1;  // rows whose band holds no key
      band.kvl = {3, 9, 11};
      band.seed = seed++;
      g.push_back(band);
    }
    PCase causal = a;
    causal.mode = 3;
    causal.ql = {6, 2, 9};
    causal.kvl = {4, 5, 12};  // batch 0: the first two rows see no key
    causal.kvn = 4;
    causal.seed = seed++;
    g.push_back(causal);
  }
  return g;
}

template <class T>
void prompt_matches(const PCase& c) {
  SCOPED_TRACE(c.layout + " mode " + std::to_string(c.mode) + " seed " + std::to_string(c.seed));
  auto r = build_prompt<T>(c);
  std::vector<T> out;
  std::vector<float> lse;
  run_prompt(r, out, lse);
  EXPECT_TRUE(same_bits(out, pfa_out(r))) << "FIA (Q_S > 1) differs from PromptFlashAttention";
  EXPECT_TRUE(lse_close(prompt_lse(r), lse));
  std::vector<T> out2;
  std::vector<float> lse2;
  run_prompt(r, out2, lse2, {}, 2);
  std::vector<T> out1;
  std::vector<float> lse1;
  run_prompt(r, out1, lse1, {}, 1);
  EXPECT_TRUE(same_bits(out1, out2) && same_bits(lse1, lse2)) << "thread count changed the bits";
}

TEST(FusedInferAttentionScore, PromptBranchIsPfaBitForBitWithLseOfTheReference) {
  for (const PCase& c : prompt_grid()) {
    prompt_matches<half>(c);
    prompt_matches<bfloat16>(c);
  }
}

TEST(FusedInferAttentionScore, LearnableSinkMatchesTheReferenceAndLeavesLseAlone) {
  for (int mode : {0, 3, 4}) {  // (4: mode 3 over 1100 keys, which the engine splits)
    PCase c;
    c.layout = "TND";
    c.mode = mode == 4 ? 3 : mode;
    c.ql = mode == 4 ? std::vector<int>{2} : std::vector<int>{3, 7, 1};
    c.kvl = mode == 4 ? std::vector<int>{1100} : std::vector<int>{9, 7, 0};
    c.D = c.Dv = 64;
    c.sink = true;
    c.seed = 40 + static_cast<unsigned>(mode);
    auto r = build_prompt<bfloat16>(c);
    std::vector<bfloat16> out, plain;
    std::vector<float> lse, plain_lse;
    run_prompt(r, out, lse);
    EXPECT_TRUE(matches(prompt_expected(r), out));
    // lse leaves the sink out: the same bits as without it; head 0's sink is -inf, so its rows
    // are those of the call without a sink, bit for bit.
    run_prompt(r, plain, plain_lse, [](PCall<bfloat16>& x) { x.in.learnable_sink = {}; });
    EXPECT_TRUE(same_bits(lse, plain_lse));
    bool head0 = true, others_differ = false;
    for (int t = 0; t < r.qd.cu.back(); ++t)
      for (int h = 0; h < c.N; ++h)
        for (int e = 0; e < c.Dv; ++e) {
          const size_t at = r.od.at(0, t, h, e);
          const bool same = std::memcmp(&out[at], &plain[at], sizeof(bfloat16)) == 0;
          if (h == 0) head0 = head0 && same;
          if (h != 0 && !same) others_differ = true;
        }
    EXPECT_TRUE(head0) << "a sink of -inf changed the output";
    EXPECT_TRUE(others_differ) << "the sinks changed nothing";
  }
}

TEST(FusedInferAttentionScore, LseOfMaskedRowsIsTheFillValueOrInvalid) {
  // Every row i % 4 == 3 is fully masked. inner_precise 0: its keys score -FLT_MAX (the NPU's
  // select), so its lse is -FLT_MAX + ln n = -FLT_MAX in fp32; inner_precise 2: excluded, +inf.
  for (int inner : {0, 2}) {
    PCase c;
    c.ql = {8};
    c.kvl = {6};
    c.mask = true;
    c.inner = inner;
    auto r = build_prompt<half>(c);
    std::vector<half> out;
    std::vector<float> lse;
    run_prompt(r, out, lse);
    for (int h = 0; h < c.N; ++h) {
      const float l = lse[z(h * c.S1() + 3)];
      EXPECT_EQ(l, inner == 0 ? -FLT_MAX : kInfF) << "inner " << inner << " head " << h;
      EXPECT_EQ(lse[z(h * c.S1() + 9)], kInfF) << "padded row";
    }
  }
}

TEST(FusedInferAttentionScore, FlagOffLeavesSoftmaxLseAlone) {
  PCase c;
  c.ql = {4, 6};
  c.kvl = {5, 7};
  auto r = build_prompt<half>(c);
  std::vector<half> out, want;
  std::vector<float> lse, lse_on;
  run_prompt(r, want, lse_on);
  run_prompt(r, out, lse, [](PCall<half>& x) { x.p.softmax_lse_flag = false; });
  EXPECT_TRUE(same_bits(out, want));
  EXPECT_TRUE(std::all_of(lse.begin(), lse.end(), [](float x) { return x == kSentinel; }));
  // ... also with no lse tensor at all.
  run_prompt(r, out, lse, [](PCall<half>& x) {
    x.p.softmax_lse_flag = false;
    x.lse = {};
  });
  EXPECT_TRUE(same_bits(out, want));
  // ... and with a view the flag would reject: overlapping the output, negative extents.
  run_prompt(r, out, lse, [](PCall<half>& x) {
    x.p.softmax_lse_flag = false;
    x.lse = {reinterpret_cast<float*>(x.o.data()), shp(2, 4, 3)};
  });
  EXPECT_TRUE(same_bits(out, want));
  run_prompt(r, out, lse, [](PCall<half>& x) {
    x.p.softmax_lse_flag = false;
    x.lse = StridedView<float>(nullptr, shp(-1, 4));
  });
  EXPECT_TRUE(same_bits(out, want));
}

// ---------------------------------------------------------------------------------------------
// Q_S == 1: the incremental branch.

enum class Store { Tensor, List, Paged };
enum class Aq { None, Channel, Token };

struct ICase {
  std::string layout = "BSND";
  std::vector<int> L;  // kv lengths
  Store store = Store::Tensor;
  Aq aq = Aq::None;
  bool mask = false;  // holes; batch 1 fully masked
  unsigned seed = 1;
  int N = 8, kvn = 2, D = 32, bs = 32;
  double scale = 0.2;
  int B() const { return static_cast<int>(L.size()); }
  int S() const { return *std::max_element(L.begin(), L.end()) + 1; }
  // Columns of the mask and the per-token scales: every position a batch may read.
  int W() const { return store == Store::Paged ? (S() + bs - 1) / bs * bs : S(); }
  bool hole(int b, int j) const { return b == 1 || hv(seed, b, 0, j) < 0.3; }
};

template <class T, class TKV>
struct IBuilt {
  ICase c;
  Seqs q, k, v;  // the reference's (dequantized) data
  std::vector<T> qb, aqs;
  std::vector<float> tok;
  std::vector<std::vector<TKV>> ks, vs;
  std::vector<Shape> kshape;
  std::vector<std::int32_t> table;
  Array<u8> mask;
  Shape qshape;
};

template <class T, class TKV>
IBuilt<T, TKV> build_incre(const ICase& c) {
  constexpr bool q8 = std::is_same_v<TKV, i8>;
  IBuilt<T, TKV> r;
  r.c = c;
  const int B = c.B(), KVN = c.kvn, D = c.D, S = c.S();
  std::mt19937 rng(c.seed);
  r.q = draw<T>(rng, std::vector<int>(z(B), 1), c.N, D);
  r.qb = concat<T>(r.q);  // S = 1: every layout the same memory
  r.qshape = c.layout == "BSH"    ? shp(B, 1, c.N * D)
             : c.layout == "BSND" ? shp(B, 1, c.N, D)
                                  : shp(B, c.N, 1, D);
  const auto scale_of = [&c](int kv, int x) {  // channel (per channel) or b·S + p (per token)
    return 0.004 + 0.02 * hv(c.seed + 3, kv, x, 0);
  };
  if (c.aq == Aq::Channel)
    for (int kv = 0; kv < 2; ++kv)
      for (int ch = 0; ch < KVN * D; ++ch) r.aqs.push_back(T(static_cast<float>(scale_of(kv, ch))));
  if (c.aq == Aq::Token)
    for (int kv = 0; kv < 2; ++kv)
      for (int x = 0; x < B * c.W(); ++x) r.tok.push_back(static_cast<float>(scale_of(kv, x)));
  std::uniform_int_distribution<int> ui(-100, 100);
  std::normal_distribution<double> nd;
  // Token-major raw rows [b][t][kvn][D]; the reference's dequantized copies.
  std::vector<std::vector<TKV>> raw(z(2 * B));
  r.k.resize(z(B));
  r.v.resize(z(B));
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < S; ++t)
      for (int e = 0; e < KVN * D; ++e)
        for (int kv = 0; kv < 2; ++kv) {
          const TKV x = q8 ? TKV(ui(rng)) : TKV(static_cast<float>(nd(rng)));
          raw[z(2 * b + kv)].push_back(x);
          if (t >= c.L[z(b)]) continue;
          double val = dbl(x);
          if (c.aq == Aq::Channel) val *= dbl(r.aqs[z(kv * KVN * D + e)]);
          if (c.aq == Aq::Token) val *= double(r.tok[z((kv * B + b) * c.W() + t)]);
          (kv ? r.v : r.k)[z(b)].push_back(val);
        }
  const auto layout_of = [&](const std::vector<TKV>& x) {  // one batch in the layout
    std::vector<TKV> out(x.size());
    for (int t = 0; t < S; ++t)
      for (int h = 0; h < KVN; ++h)
        for (int d = 0; d < D; ++d) {
          const size_t at = c.layout == "BNSD" ? z((h * S + t) * D + d) : z((t * KVN + h) * D + d);
          out[at] = x[z((t * KVN + h) * D + d)];
        }
    return out;
  };
  const Shape one = c.layout == "BSH"    ? shp(1, S, KVN * D)
                    : c.layout == "BSND" ? shp(1, S, KVN, D)
                                         : shp(1, KVN, S, D);
  if (c.store == Store::List) {
    for (int b = 0; b < B; ++b) {
      r.ks.push_back(layout_of(raw[z(2 * b)]));
      r.vs.push_back(layout_of(raw[z(2 * b + 1)]));
      r.kshape.push_back(one);
    }
  } else if (c.store == Store::Tensor) {
    std::vector<TKV> kk, vv;
    for (int b = 0; b < B; ++b) {
      const auto kb = layout_of(raw[z(2 * b)]), vb = layout_of(raw[z(2 * b + 1)]);
      kk.insert(kk.end(), kb.begin(), kb.end());
      vv.insert(vv.end(), vb.begin(), vb.end());
    }
    r.ks = {kk};
    r.vs = {vv};
    Shape all = one;
    all[0] = B;
    r.kshape = {all};
  } else {  // paged [blockNum, bs, KV_N·D], blocks shuffled, one spare block of NaN / -128
    const int per = (S + c.bs - 1) / c.bs, nb = B * per + 1;
    std::vector<int> ids(z(B * per));
    for (int i = 0; i < B * per; ++i) ids[z(i)] = i + 1;
    std::shuffle(ids.begin(), ids.end(), std::mt19937(c.seed + 9));
    const TKV bad = q8 ? TKV(-128) : TKV(NAN);
    std::vector<TKV> kc(z(nb * c.bs * KVN * D), bad), vc(kc.size(), bad);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < S; ++t)
        for (int e = 0; e < KVN * D; ++e) {
          const int blk = ids[z(b * per + t / c.bs)];
          const size_t at = z((blk * c.bs + t % c.bs) * KVN * D + e);
          kc[at] = raw[z(2 * b)][z(t * KVN * D + e)];
          vc[at] = raw[z(2 * b + 1)][z(t * KVN * D + e)];
        }
    r.ks = {kc};
    r.vs = {vc};
    r.kshape = {shp(nb, c.bs, KVN * D)};
    r.table.assign(ids.begin(), ids.end());
  }
  if (c.mask) {
    r.mask = Array<u8>(z(B * c.W()));
    for (int b = 0; b < B; ++b)
      for (int j = 0; j < c.W(); ++j) r.mask[z(b * c.W() + j)] = u8(c.hole(b, j) ? 1 : 0);
  }
  return r;
}

template <class T, class TKV>
struct ICall {
  FusedInferAttentionScoreParams p;
  FusedInferAttentionScoreInputs<T, TKV> in;
  attnref::IncreFlashAttentionParams ip;
  attnref::IncreFlashAttentionInputs<T, TKV> ii;
};

// The same call for both operators (FIA's kv lengths are IFA's actual_seq_lengths).
template <class T, class TKV>
ICall<T, TKV> incre_call(IBuilt<T, TKV>& r) {
  const ICase& c = r.c;
  ICall<T, TKV> x;
  x.p.num_heads = x.ip.num_heads = c.N;
  x.p.num_key_value_heads = x.ip.num_key_value_heads = c.kvn;
  x.p.scale_value = x.ip.scale_value = c.scale;
  x.p.input_layout = x.ip.input_layout = c.layout;
  x.p.softmax_lse_flag = true;
  if (c.aq == Aq::Token) x.p.antiquant_mode = x.ip.antiquant_mode = 1;
  x.in.query = x.ii.query = {r.qb.data(), r.qshape};
  for (size_t i = 0; i < r.ks.size(); ++i) {
    x.in.key.push_back({r.ks[i].data(), r.kshape[i]});
    x.in.value.push_back({r.vs[i].data(), r.kshape[i]});
  }
  x.ii.key = x.in.key;
  x.ii.value = x.in.value;
  for (int l : c.L) x.in.actual_seq_lengths_kv.push_back(l);
  x.ii.actual_seq_lengths = x.in.actual_seq_lengths_kv;
  if (c.store == Store::Paged) {
    x.p.block_size = x.ip.block_size = c.bs;
    const int per = static_cast<int>(r.table.size()) / c.B();
    x.in.block_table = x.ii.block_table = {r.table.data(), shp(c.B(), per)};
  }
  if (c.aq == Aq::Channel)
    x.in.antiquant_scale = x.ii.antiquant_scale = {r.aqs.data(), shp(2, c.kvn * c.D)};
  if (c.aq == Aq::Token)
    x.in.antiquant_scale_per_token =
        x.ii.antiquant_scale_per_token = {r.tok.data(), shp(2, c.B(), c.W())};
  if (c.mask) x.in.atten_mask = x.ii.atten_mask = {r.mask.data(), shp(c.B(), c.W())};
  return x;
}

template <class T, class TKV>
void run_incre(ICall<T, TKV>& x, std::vector<T>& out, std::vector<float>& lse, int threads = 0) {
  const Index B = x.in.query.size(0);
  out.assign(z(x.in.query.numel()), T(kSentinel));
  lse.assign(z(B * x.p.num_heads), kSentinel);
  attnref::fused_infer_attention_score(
      x.p, x.in,
      FusedInferAttentionScoreOutputs<T>{
          StridedView<T>(out.data(), x.in.query.shape()),
          StridedView<float>(lse.data(), shp(B, x.p.num_heads, 1, 1))},
      {threads});
}

template <class T, class TKV>
void incre_matches(const ICase& c) {
  SCOPED_TRACE(c.layout + " store " + std::to_string(int(c.store)) + " aq " +
               std::to_string(int(c.aq)) + " seed " + std::to_string(c.seed));
  auto r = build_incre<T, TKV>(c);
  auto x = incre_call(r);
  std::vector<T> out, want(z(x.in.query.numel()), T(kSentinel));
  std::vector<float> lse;
  run_incre(x, out, lse);
  attnref::incre_flash_attention(
      x.ip, x.ii, attnref::IncreFlashAttentionOutputs<T>{StridedView<T>(want.data(), r.qshape)});
  EXPECT_TRUE(same_bits(out, want)) << "FIA (Q_S == 1) differs from IncreFlashAttention";
  // The reference's lse; a batch without keys: -3.40e38.
  ref::cann::Ifa pr{c.N, c.kvn, c.D, c.L, c.scale};
  if (c.mask) pr.mask = [&c](int b, int j) { return c.hole(b, j); };
  Seqs ref_lse;
  (void)ref::cann::ifa(pr, r.q, r.k, r.v, &ref_lse);
  std::vector<double> wl;
  for (const auto& row : ref_lse)
    for (double l : row) wl.push_back(l == -HUGE_VAL ? double(-3.40e38f) : l);
  EXPECT_TRUE(lse_close(wl, lse));
  std::vector<T> o1, o2;
  std::vector<float> l1, l2;
  run_incre(x, o1, l1, 1);
  run_incre(x, o2, l2, 2);
  EXPECT_TRUE(same_bits(o1, o2) && same_bits(l1, l2)) << "thread count changed the bits";
}

TEST(FusedInferAttentionScore, IncrementalBranchIsIfaBitForBitWithLseOfTheReference) {
  unsigned seed = 1;
  for (const std::string lay : {"BSH", "BSND", "BNSD"})
    for (Store st : {Store::Tensor, Store::List, Store::Paged}) {
      ICase c;
      c.layout = lay;
      c.store = st;
      c.L = {37, 0, 20, 5};  // batch 1 has no keys
      c.seed = seed++;
      incre_matches<half, half>(c);
      c.mask = true;
      c.L = {37, 9, 20, 5};  // batch 1 fully masked: -1e12 + ln 9
      c.seed = seed++;
      incre_matches<bfloat16, bfloat16>(c);
      c.aq = Aq::Channel;
      incre_matches<half, i8>(c);
      c.aq = Aq::Token;
      incre_matches<bfloat16, i8>(c);
    }
}

TEST(FusedInferAttentionScore, IncrementalBranchIgnoresThePromptOnlyParameters) {
  ICase c;
  c.L = {12, 30};
  c.mask = true;
  auto r = build_incre<half, half>(c);
  auto x = incre_call(r);
  std::vector<half> want, out;
  std::vector<float> wl, lse;
  run_incre(x, want, wl);
  x.p.pre_tokens = 0;
  x.p.next_tokens = 0;
  x.p.sparse_mode = 1;
  x.in.actual_seq_lengths = {1, 1};
  run_incre(x, out, lse);
  EXPECT_TRUE(same_bits(out, want) && same_bits(lse, wl));
}

TEST(FusedInferAttentionScore, PromptBranchIgnoresAntiquantMode) {
  PCase c;
  c.ql = {4, 6};
  c.kvl = {5, 7};
  auto r = build_prompt<half>(c);
  std::vector<half> out, want;
  std::vector<float> lse, wl;
  run_prompt(r, want, wl);
  run_prompt(r, out, lse, [](PCall<half>& x) { x.p.antiquant_mode = 1; });
  EXPECT_TRUE(same_bits(out, want) && same_bits(lse, wl));
}

// ---------------------------------------------------------------------------------------------
// Rejections: the message names the operator and the argument; both outputs stay untouched.

template <class T>
void prompt_rejected(const PCase& c, const typename Same<PEdit<T>>::type& edit,
                     const std::string& fragment) {
  SCOPED_TRACE(fragment);
  auto r = build_prompt<T>(c);
  std::vector<T> out;
  std::vector<float> lse;
  support::expect_rejected_by([&] { run_prompt(r, out, lse, edit); }, "fused_infer_attention_score",
                              {fragment});
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](const T& v) { return dbl(v) == kSentinel; }));
  EXPECT_TRUE(std::all_of(lse.begin(), lse.end(), [](float v) { return v == kSentinel; }));
}

TEST(FusedInferAttentionScore, Rejections) {
  PCase c;
  c.ql = {5, 6};
  c.kvl = {7, 9};
  using E = PEdit<half>;
  std::vector<u8> m1(64, 0);
  // The vLLM-Ascend #15503 shape: a [1, 1, 1, S] bool mask under a multi-row query.
  prompt_rejected<half>(c, E([&](PCall<half>& x) {
                          x.in.atten_mask = {m1.data(), shp(1, 1, 1, 11)};
                        }),
                        "atten_mask.shape");
  prompt_rejected<half>(c, E([](PCall<half>& x) {
                          x.lse = {x.lse.data(), shp(2, 4, 11)};
                        }),
                        "softmax_lse.shape");
  prompt_rejected<half>(c, E([](PCall<half>& x) { x.lse = {}; }), "softmax_lse.shape");
  prompt_rejected<half>(c, E([](PCall<half>& x) { x.p.sparse_mode = 5; }), "params.sparse_mode");
  prompt_rejected<half>(c, E([](PCall<half>& x) { x.p.input_layout = "NTD_TND"; }),
                        "query.shape rank mismatch for the layout");
  prompt_rejected<half>(c, E([](PCall<half>& x) { x.p.input_layout = "NBSD"; }),
                        "params.input_layout");
  prompt_rejected<half>(c, E([](PCall<half>& x) { x.in.key.push_back(x.in.key[0]); }),
                        "tensor lists are taken with Q_S == 1 only");
  std::vector<std::int32_t> table(4, 0);
  prompt_rejected<half>(c, E([&](PCall<half>& x) {
                          x.in.block_table = {table.data(), shp(2, 2)};
                        }),
                        "key[0].shape not a paged cache for the layout");
  prompt_rejected<half>(c, E([](PCall<half>& x) { x.p.num_heads = 3; }), "params.num_heads");
  std::vector<bfloat16> sink(4, bfloat16(0.5f));
  prompt_rejected<half>(c, E([&](PCall<half>& x) {
                          x.in.learnable_sink = {sink.data(), shp(4)};
                        }),
                        "learnable_sink given with a layout other than TND");
  PCase t = c;
  t.layout = "TND";
  prompt_rejected<half>(t, E([&](PCall<half>& x) {
                          x.in.learnable_sink = {sink.data(), shp(4)};
                        }),
                        "learnable_sink given with a head size other than 64 or 128");
  t.D = t.Dv = 64;
  prompt_rejected<half>(t, E([&](PCall<half>& x) {
                          x.in.learnable_sink = {sink.data(), shp(3)};
                        }),
                        "learnable_sink.shape");
  prompt_rejected<half>(c, E([](PCall<half>& x) {
                          x.in.query = {x.in.query.data(), shp(2, 11, 64)};
                        }),
                        "query.shape");
  // BNSD_BSND with Q_S == 1.
  PCase one = c;
  one.layout = "BNSD_BSND";
  one.ql = {1, 1};
  auto r = build_prompt<half>(one);
  r.qd.S = 1;  // (no padding rows: Q_S is 1)
  std::vector<half> out;
  std::vector<float> lse;
  support::expect_rejected_by(
      [&] {
        run_prompt(r, out, lse, [](PCall<half>& x) {
          x.in.query = {x.in.query.data(), shp(2, 4, 1, 16)};
          x.o = {x.o.data(), shp(2, 1, 4, 16)};
          x.lse = {x.lse.data(), shp(2, 4, 1, 1)};
        });
      },
      "fused_infer_attention_score", {"BNSD_BSND is not supported when Q_S is 1"});
  // The incremental branch: an int8 query; inner_precise 2; a [1, S] mask with B = 2.
  ICase ic;
  ic.L = {6, 9};
  auto ir = build_incre<half, half>(ic);
  auto x = incre_call(ir);
  std::vector<half> io;
  std::vector<float> il;
  x.p.inner_precise = 2;
  support::expect_rejected_by([&] { run_incre(x, io, il); }, "fused_infer_attention_score",
                              {"params.inner_precise"});
  x = incre_call(ir);
  std::vector<u8> m(10, 0);
  x.in.atten_mask = {m.data(), shp(1, 10)};
  support::expect_rejected_by([&] { run_incre(x, io, il); }, "fused_infer_attention_score",
                              {"atten_mask.shape"});
  x = incre_call(ir);
  x.in.actual_seq_lengths_kv = {6, 99};
  support::expect_rejected_by([&] { run_incre(x, io, il); }, "fused_infer_attention_score",
                              {"actual_seq_lengths_kv[1]"});
  EXPECT_TRUE(std::all_of(io.begin(), io.end(), [](const half& v) { return dbl(v) == kSentinel; }));
  std::vector<i8> q8(2 * 4 * 16), k8(2 * 9 * 2 * 16);
  std::vector<half> o8(q8.size());
  FusedInferAttentionScoreParams p8;
  p8.num_heads = 4;
  p8.num_key_value_heads = 2;
  p8.input_layout = "BSND";
  FusedInferAttentionScoreInputs<i8> in8;
  in8.query = {q8.data(), shp(2, 1, 4, 16)};
  in8.key = {StridedView<const i8>(k8.data(), shp(2, 9, 2, 16))};
  in8.value = in8.key;
  support::expect_rejected_by(
      [&] {
        attnref::fused_infer_attention_score(
            p8, in8,
            FusedInferAttentionScoreOutputs<half>{StridedView<half>(o8.data(), shp(2, 1, 4, 16))});
      },
      "fused_infer_attention_score", {"int8 query / key / value with Q_S == 1"});
}

TEST(FusedInferAttentionScore, ValidateAgreesWithTheCall) {
  PCase c;
  c.ql = {5, 6};
  c.kvl = {7, 9};
  auto r = build_prompt<half>(c);
  const std::vector<PEdit<half>> edits{
      {},
      [](PCall<half>& x) { x.p.sparse_mode = 7; },
      [](PCall<half>& x) { x.lse = {}; },
      [](PCall<half>& x) {
        x.in.actual_seq_lengths_kv = {7, 99};
      },
  };
  for (const auto& edit : edits) {
    std::vector<half> out;
    std::vector<float> lse;
    PCall<half> x = prompt_call(r, out, lse);
    if (edit) edit(x);
    const FusedInferAttentionScoreOutputs<half> o{x.o, x.lse};
    support::expect_validate_agrees([&] { attnref::validate(x.p, x.in, o); },
                                    [&] { attnref::fused_infer_attention_score(x.p, x.in, o); });
  }
}

// ---------------------------------------------------------------------------------------------
// Separate K / V antiquant (modes 0, 1, 2 and key 0 with value 1).
template <class T>
std::vector<T> incre_out(ICall<T, i8>& x) {
  std::vector<T> out;
  std::vector<float> lse;
  run_incre(x, out, lse);
  return out;
}

TEST(FusedInferAttentionScore, SeparateAntiquantEqualsTheCombinedScalesBitForBit) {
  for (Aq aq : {Aq::Channel, Aq::Token})
    for (Store st : {Store::Tensor, Store::Paged}) {
      ICase c;
      c.L = {37, 0, 20, 5};
      c.aq = aq;
      c.store = st;
      c.mask = true;
      auto r = build_incre<half, i8>(c);
      auto x = incre_call(r);
      const auto want = incre_out(x);
      // The combined (2, ...) scales split into a key and a value tensor (fp32: exact).
      std::vector<float> ks, vs;
      const std::vector<float> all = aq == Aq::Token ? r.tok : [&] {
        std::vector<float> f;
        for (half h : r.aqs) f.push_back(static_cast<float>(h));
        return f;
      }();
      ks.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(all.size() / 2));
      vs.assign(all.begin() + static_cast<std::ptrdiff_t>(all.size() / 2), all.end());
      const int mode = aq == Aq::Token ? 1 : 0;
      const std::vector<Shape> shapes =
          aq == Aq::Token
              ? std::vector<Shape>{shp(1, c.B(), c.W())}
              : std::vector<Shape>{shp(1, c.kvn * c.D), shp(1, c.kvn, c.D), shp(1, c.kvn, 1, c.D)};
      for (const Shape& sh : shapes) {
        auto y = incre_call(r);
        y.p.antiquant_mode = 0;
        y.in.antiquant_scale = {};
        y.in.antiquant_scale_per_token = {};
        y.p.key_antiquant_mode = y.p.value_antiquant_mode = mode;
        y.in.key_antiquant_scale = {ks.data(), sh};
        y.in.value_antiquant_scale = {vs.data(), sh};
        EXPECT_TRUE(same_bits(incre_out(y), want)) << "mode " << mode << " " << sh.size();
        // Given beside garbage combined scales, the separate ones win.
        std::vector<half> junk(2 * z(c.kvn * c.D), half(1e4f));
        y.p.antiquant_mode = 0;
        y.in.antiquant_scale = {junk.data(), shp(2, c.kvn * c.D)};
        EXPECT_TRUE(same_bits(incre_out(y), want)) << "the combined scales were read";
      }
    }
}

TEST(FusedInferAttentionScore, SeparateAntiquantPerHeadEqualsItsPerChannelExpansion) {
  ICase c;
  c.L = {30, 11};
  auto r = build_incre<bfloat16, i8>(c);
  std::vector<float> kh{0.011f, 0.023f}, vh{0.017f, 0.005f}, ko{3.0f, -2.0f}, vo{-1.0f, 4.0f};
  std::vector<float> kc, vc, koc, voc;
  for (int h = 0; h < c.kvn; ++h)
    for (int d = 0; d < c.D; ++d) {
      kc.push_back(kh[z(h)]), vc.push_back(vh[z(h)]);
      koc.push_back(ko[z(h)]), voc.push_back(vo[z(h)]);
    }
  auto a = incre_call(r), b = incre_call(r);
  a.p.key_antiquant_mode = a.p.value_antiquant_mode = 2;
  a.in.key_antiquant_scale = {kh.data(), shp(c.kvn)};
  a.in.value_antiquant_scale = {vh.data(), shp(c.kvn)};
  a.in.key_antiquant_offset = {ko.data(), shp(c.kvn)};
  a.in.value_antiquant_offset = {vo.data(), shp(c.kvn)};
  b.in.key_antiquant_scale = {kc.data(), shp(1, c.kvn * c.D)};
  b.in.value_antiquant_scale = {vc.data(), shp(1, c.kvn * c.D)};
  b.in.key_antiquant_offset = {koc.data(), shp(1, c.kvn * c.D)};
  b.in.value_antiquant_offset = {voc.data(), shp(1, c.kvn * c.D)};
  EXPECT_TRUE(same_bits(incre_out(a), incre_out(b)));
}

// An incremental call's output and lse against the reference on dequantized K / V (the
// masked holes of the case; lse of an empty batch -3.40e38).
template <class T>
void expect_incre_reference(const ICase& c, const Seqs& q, const Seqs& k, const Seqs& v,
                            const std::vector<T>& out, const std::vector<float>& lse,
                            const std::string& label) {
  ref::cann::Ifa pr{c.N, c.kvn, c.D, c.L, c.scale};
  pr.mask = [&c](int b, int j) { return c.hole(b, j); };
  Seqs ref_lse;
  std::vector<double> want;
  for (const auto& row : ref::cann::ifa(pr, q, k, v, &ref_lse))
    want.insert(want.end(), row.begin(), row.end());
  EXPECT_TRUE(matches(want, out)) << label;
  std::vector<double> wl;
  for (const auto& row : ref_lse)
    for (double l : row) wl.push_back(l == -HUGE_VAL ? double(-3.40e38f) : l);
  EXPECT_TRUE(lse_close(wl, lse)) << label;
}

TEST(FusedInferAttentionScore, SeparateAntiquantKeyPerChannelValuePerTokenMatchesReference) {
  for (Store st : {Store::Tensor, Store::List, Store::Paged}) {
    ICase c;
    c.L = {45, 0, 9};
    c.store = st;
    c.mask = true;
    c.seed = 77;
    auto r = build_incre<half, i8>(c);  // (no combined antiquant: r.k / r.v hold the raw ints)
    const int KVN = c.kvn, D = c.D, W = c.W(), B = c.B();
    std::vector<float> ks, ko, vs, vo;
    for (int ch = 0; ch < KVN * D; ++ch) {
      ks.push_back(static_cast<float>(0.003 + 0.02 * hv(5, 0, ch, 0)));
      ko.push_back(std::round(static_cast<float>(10 * hv(6, 0, ch, 0)) - 5));
    }
    for (int x = 0; x < B * W; ++x) {
      vs.push_back(static_cast<float>(0.003 + 0.02 * hv(7, 0, x, 0)));
      vo.push_back(std::round(static_cast<float>(10 * hv(8, 0, x, 0)) - 5));
    }
    auto x = incre_call(r);
    x.p.value_antiquant_mode = 1;
    x.in.key_antiquant_scale = {ks.data(), shp(1, KVN, 1, D)};
    x.in.key_antiquant_offset = {ko.data(), shp(1, KVN, 1, D)};
    x.in.value_antiquant_scale = {vs.data(), shp(1, B, W)};
    x.in.value_antiquant_offset = {vo.data(), shp(1, B, W)};
    std::vector<half> out;
    std::vector<float> lse;
    run_incre(x, out, lse);
    Seqs k = r.k, v = r.v;  // dequantized here: (x8 + offset) · scale
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < c.L[z(b)]; ++t)
        for (int ch = 0; ch < KVN * D; ++ch) {
          const size_t at = z(t * KVN * D + ch), tok = z(b * W + t);
          k[z(b)][at] = (k[z(b)][at] + ko[z(ch)]) * double(ks[z(ch)]);
          v[z(b)][at] = (v[z(b)][at] + vo[tok]) * double(vs[tok]);
        }
    expect_incre_reference(c, r.q, k, v, out, lse, "store " + std::to_string(int(st)));
  }
}

// Modes 3 (per token and head), 4 and 5 (per token, and head, with the scales in the paged
// cache's blocks): each key and value dequantized here with its own (b, head, position) map, or
// its block's row, then the reference.
TEST(FusedInferAttentionScore, SeparateAntiquantPerTokenAndHeadModesMatchReference) {
  for (int mode : {3, 4, 5})
    for (Store st : {Store::Tensor, Store::List, Store::Paged}) {
      if (mode >= 4 && st != Store::Paged) continue;
      ICase c;
      c.L = {45, 0, 9, 33};
      c.store = st;
      c.mask = true;
      c.seed = static_cast<unsigned>(80 + mode);
      auto r = build_incre<half, i8>(c);
      const int KVN = c.kvn, D = c.D, W = c.W(), B = c.B();
      const int per = st == Store::Paged ? static_cast<int>(r.table.size()) / B : 0;
      const int nb = B * per + 1, heads = mode == 4 ? 1 : KVN;
      // The map of (side, b, head, key position): mode 3 by position, 4 / 5 by the key's slot.
      const auto slot = [&](int b, int t) {
        return mode == 3 ? b * W + t : r.table[z(b * per + t / c.bs)] * c.bs + t % c.bs;
      };
      const auto scale = [&](int side, int b, int h, int t) {
        return static_cast<float>(0.003 + 0.02 * hv(9 + side, h, slot(b, t), 0));
      };
      const auto offset = [&](int side, int b, int h, int t) {
        return std::round(static_cast<float>(10 * hv(11 + side, h, slot(b, t), 0)) - 5);
      };
      std::vector<float> tab[4];  // key scale, key offset, value scale, value offset
      Shape sh;
      if (mode == 3) {
        sh = shp(B, KVN, W);
        for (int side = 0; side < 2; ++side)
          for (int b = 0; b < B; ++b)
            for (int h = 0; h < KVN; ++h)
              for (int t = 0; t < W; ++t) {
                tab[2 * side].push_back(scale(side, b, h, t));
                tab[2 * side + 1].push_back(offset(side, b, h, t));
              }
      } else {  // every slot of every block, laid out (block, [head,] row)
        sh = mode == 4 ? shp(nb, c.bs) : shp(nb, KVN, c.bs);
        for (int side = 0; side < 2; ++side)
          for (int blk = 0; blk < nb; ++blk)
            for (int h = 0; h < heads; ++h)
              for (int row = 0; row < c.bs; ++row) {
                const int sl = blk * c.bs + row;
                tab[2 * side].push_back(static_cast<float>(0.003 + 0.02 * hv(9 + side, h, sl, 0)));
                tab[2 * side + 1].push_back(
                    std::round(static_cast<float>(10 * hv(11 + side, h, sl, 0)) - 5));
              }
      }
      auto x = incre_call(r);
      x.p.key_antiquant_mode = x.p.value_antiquant_mode = mode;
      x.in.key_antiquant_scale = {tab[0].data(), sh};
      x.in.key_antiquant_offset = {tab[1].data(), sh};
      x.in.value_antiquant_scale = {tab[2].data(), sh};
      x.in.value_antiquant_offset = {tab[3].data(), sh};
      std::vector<half> out;
      std::vector<float> lse;
      run_incre(x, out, lse);
      Seqs k = r.k, v = r.v;  // dequantized here: (x8 + offset) · scale, per key and head
      for (int b = 0; b < B; ++b)
        for (int t = 0; t < c.L[z(b)]; ++t)
          for (int h = 0; h < KVN; ++h) {
            const int hh = mode == 4 ? 0 : h;
            for (int d = 0; d < D; ++d) {
              const size_t at = z((t * KVN + h) * D + d);
              k[z(b)][at] = (k[z(b)][at] + offset(0, b, hh, t)) * double(scale(0, b, hh, t));
              v[z(b)][at] = (v[z(b)][at] + offset(1, b, hh, t)) * double(scale(1, b, hh, t));
            }
          }
      expect_incre_reference(c, r.q, k, v, out, lse,
                             "mode " + std::to_string(mode) + " store " + std::to_string(int(st)));
    }
}

TEST(FusedInferAttentionScore, SeparateAntiquantRejections) {
  ICase c;
  c.L = {12, 7};
  auto r = build_incre<half, i8>(c);
  std::vector<float> sc(z(c.B() * c.W() + c.kvn * c.D), 0.01f);
  const auto rejected = [&](const std::function<void(ICall<half, i8>&)>& edit,
                            const std::string& fragment) {
    auto x = incre_call(r);
    x.p.key_antiquant_mode = x.p.value_antiquant_mode = 0;
    x.in.key_antiquant_scale = {sc.data(), shp(1, c.kvn * c.D)};
    x.in.value_antiquant_scale = {sc.data(), shp(1, c.kvn * c.D)};
    edit(x);
    std::vector<half> out;
    std::vector<float> lse;
    support::expect_rejected_by([&] { run_incre(x, out, lse); }, "fused_infer_attention_score",
                                {fragment});
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](half v) { return dbl(v) == kSentinel; }));
  };
  rejected([](ICall<half, i8>& x) { x.p.key_antiquant_mode = x.p.value_antiquant_mode = 3; },
           "key_antiquant_scale.shape mismatch (mode 3, per token and head)");
  rejected(
      [&](ICall<half, i8>& x) {
        x.p.key_antiquant_mode = x.p.value_antiquant_mode = 4;
        x.in.key_antiquant_scale = x.in.value_antiquant_scale = {sc.data(), shp(2, 8)};
      },
      "modes 4 and 5 (page-managed scales) take a paged cache");
  rejected([](ICall<half, i8>& x) { x.p.key_antiquant_mode = x.p.value_antiquant_mode = 6; },
           "out of range with Q_S == 1");
  rejected([](ICall<half, i8>& x) { x.p.key_antiquant_mode = 1; }, "not a documented pair");
  rejected([](ICall<half, i8>& x) { x.in.value_antiquant_scale = {}; },
           "value_antiquant_scale missing");
  rejected(
      [&](ICall<half, i8>& x) {
        x.in.key_antiquant_offset = {sc.data(), shp(1, 64)};
      },
      "one given without the other");
  rejected(
      [&](ICall<half, i8>& x) {
        x.in.key_antiquant_scale = {sc.data(), shp(2, 32)};
      },
      "key_antiquant_scale.shape");
  rejected(
      [&](ICall<half, i8>& x) {
        x.p.value_antiquant_mode = 1;
        x.in.value_antiquant_scale = {sc.data(), shp(1, 2, 3)};  // too few columns
      },
      "value_antiquant_scale.shape");
  rejected(
      [](ICall<half, i8>& x) {
        x.in.key_antiquant_scale = x.in.value_antiquant_scale = {};
        x.p.value_antiquant_mode = 1;
      },
      "nonzero without key_antiquant_scale");
  // Key per channel with value per token takes an fp16 query.
  auto rb = build_incre<bfloat16, i8>(c);
  auto xb = incre_call(rb);
  xb.p.value_antiquant_mode = 1;
  xb.in.key_antiquant_scale = {sc.data(), shp(1, c.kvn * c.D)};
  xb.in.value_antiquant_scale = {sc.data(), shp(1, c.B(), c.W())};
  std::vector<bfloat16> ob;
  std::vector<float> lb;
  support::expect_rejected_by([&] { run_incre(xb, ob, lb); }, "fused_infer_attention_score",
                              {"takes an fp16 query"});
  // Floating-point K / V; and Q_S > 1.
  auto rf = build_incre<half, half>(c);
  auto xf = incre_call(rf);
  xf.in.key_antiquant_scale = xf.in.value_antiquant_scale = {sc.data(), shp(1, c.kvn * c.D)};
  std::vector<half> of;
  std::vector<float> lf;
  support::expect_rejected_by([&] { run_incre(xf, of, lf); }, "fused_infer_attention_score",
                              {"given with floating-point key / value"});
  PCase pc;
  pc.ql = {5, 6};
  pc.kvl = {7, 9};
  prompt_rejected<half>(
      pc,
      [&](PCall<half>& y) {
        y.in.key_antiquant_scale = {sc.data(), shp(1)};
      },
      "given with floating-point key / value");
}

// ---------------------------------------------------------------------------------------------
// The shared prefix == the prefix rows concatenated in front of every sequence's keys.

template <class T>
void prefix_equals_concatenation(PCase c, int P, int Ps) {
  SCOPED_TRACE(c.layout + " mode " + std::to_string(c.mode) + " P " + std::to_string(P) + " rows " +
               std::to_string(c.ql[0]));
  PCase cc = c;  // the concatenated problem: P more keys per sequence
  for (int& l : cc.kvl) l += P;
  auto rc = build_prompt<T>(cc);
  std::mt19937 rng(c.seed + 100);
  const Seqs pre = draw<T>(rng, {Ps}, c.kvn, c.D), prev = draw<T>(rng, {Ps}, c.kvn, c.Dv);
  const size_t kw = z(c.kvn * c.D), vw = z(c.kvn * c.Dv);
  for (int b = 0; b < c.B(); ++b) {
    std::copy_n(pre[0].begin(), z(P) * kw, rc.k[z(b)].begin());
    std::copy_n(prev[0].begin(), z(P) * vw, rc.v[z(b)].begin());
  }
  rc.kb = pack<T>(rc.kd, rc.k, cc.kvl);
  rc.vb = pack<T>(rc.vd, rc.v, cc.kvl);
  std::vector<T> want, got;
  std::vector<float> want_lse, got_lse;
  run_prompt(rc, want, want_lse);
  // The call with a prefix: own rows only (extent c.S2()), the prefix tensors (Ps rows, those
  // past P NaN), the kv lengths without the prefix.
  Seqs ok(z(c.B())), ov(z(c.B()));
  for (int b = 0; b < c.B(); ++b) {
    ok[z(b)].assign(rc.k[z(b)].begin() + static_cast<std::ptrdiff_t>(z(P) * kw), rc.k[z(b)].end());
    ov[z(b)].assign(rc.v[z(b)].begin() + static_cast<std::ptrdiff_t>(z(P) * vw), rc.v[z(b)].end());
  }
  const Dims kd{c.layout == "BNSD_BSND" ? "BNSD" : c.layout, c.B(), c.S2(), c.kvn, c.D, {}};
  const Dims vd{kd.lay, c.B(), c.S2(), c.kvn, c.Dv, {}};
  const Dims pkd{kd.lay, 1, Ps, c.kvn, c.D, {}}, pvd{kd.lay, 1, Ps, c.kvn, c.Dv, {}};
  const auto kb = pack<T>(kd, ok, c.kvl), vb = pack<T>(vd, ov, c.kvl);
  const auto pkb = pack<T>(pkd, pre, {P}), pvb = pack<T>(pvd, prev, {P});
  run_prompt(rc, got, got_lse, [&](PCall<T>& x) {
    x.in.key = {StridedView<const T>(kb.data(), kd.shape())};
    x.in.value = {StridedView<const T>(vb.data(), vd.shape())};
    x.in.key_shared_prefix = {pkb.data(), pkd.shape()};
    x.in.value_shared_prefix = {pvb.data(), pvd.shape()};
    if (P != Ps) x.in.actual_shared_prefix_len = {P};
    x.in.actual_seq_lengths_kv.assign(c.kvl.begin(), c.kvl.end());
  });
  EXPECT_TRUE(same_bits(got, want));
  EXPECT_TRUE(same_bits(got_lse, want_lse));
}

TEST(FusedInferAttentionScore, SharedPrefixEqualsThePrefixInFrontOfEachSequenceBitForBit) {
  unsigned seed = 60;
  for (const std::string lay : {"BSH", "BSND", "BNSD", "BNSD_BSND"}) {
    PCase c;
    c.layout = lay;
    c.ql = {4, 7};
    c.kvl = {6, 0};  // batch 1: the prefix alone
    c.seed = seed++;
    prefix_equals_concatenation<half>(c, 5, 5);
    c.mode = 3;  // causal, anchored at the end of prefix + keys
    c.seed = seed++;
    prefix_equals_concatenation<bfloat16>(c, 3, 8);
    c.mode = 0;
    c.mask = true;  // mask columns [0, P) are the prefix's
    c.pse = true;
    c.kvl = {6, 2};
    c.seed = seed++;
    prefix_equals_concatenation<half>(c, 4, 6);
    if (lay == "BNSD_BSND") continue;
    PCase d;  // Q_S == 1: the incremental branch (split KV over the long prefix)
    d.layout = lay;
    d.nopad = true;
    d.ql = {1, 1, 1};
    d.kvl = {20, 0, 7};
    d.pse = true;
    d.seed = seed++;
    prefix_equals_concatenation<half>(d, 700, 700);
    prefix_equals_concatenation<bfloat16>(d, 9, 40);
  }
}

TEST(FusedInferAttentionScore, SharedPrefixRejections) {
  PCase c;
  c.ql = {5, 6};
  c.kvl = {7, 9};
  std::vector<half> pk(4 * 2 * 16, half(0.5f));
  using E = PEdit<half>;
  const auto both = [&](PCall<half>& x, Shape sh) {
    x.in.key_shared_prefix = {pk.data(), sh};
    x.in.value_shared_prefix = {pk.data(), sh};
  };
  prompt_rejected<half>(c, E([&](PCall<half>& x) {
                          x.in.key_shared_prefix = {pk.data(), shp(1, 4, 2, 16)};
                        }),
                        "given without value_shared_prefix");
  prompt_rejected<half>(c, E([&](PCall<half>& x) { both(x, shp(2, 2, 2, 16)); }),
                        "batch other than 1");
  prompt_rejected<half>(c, E([&](PCall<half>& x) { both(x, shp(1, 4, 1, 16)); }),
                        "key_shared_prefix.shape");
  prompt_rejected<half>(c, E([&](PCall<half>& x) {
                          both(x, shp(1, 4, 2, 16));
                          x.in.actual_shared_prefix_len = {5};
                        }),
                        "actual_shared_prefix_len");
  prompt_rejected<half>(c, E([&](PCall<half>& x) { x.in.actual_shared_prefix_len = {2}; }),
                        "given without key_shared_prefix");
  PCase t = c;
  t.layout = "TND";
  prompt_rejected<half>(t, E([&](PCall<half>& x) { both(x, shp(4, 2, 16)); }),
                        "not supported with TND");
  // The mask must cover prefix + keys: a mask of exactly S2 columns is now too short.
  PCase m = c;
  m.mask = true;
  prompt_rejected<half>(m, E([&](PCall<half>& x) {
                          both(x, shp(1, 4, 2, 16));
                          x.in.atten_mask = {x.in.atten_mask.data(), shp(2, 11, 11)};
                        }),
                        "atten_mask.shape");
}

}  // namespace fia_test
