// CANN PromptFlashAttention (PFA) against the independent reference
// tests/reference/cann_flash_attention.hpp: grids over layouts, dtypes, sparse modes, masks
// (random holes, fully masked rows), pse, GQA and odd and actual lengths, with NaN in every
// element the operator must not read. Metamorphic: mode 3 == engine bottom-right causal == mode 0
// with the explicit triangle; a huge band with an all-zero mask == no mask; the compressed mask's
// content is not read; PFA == ATB SelfAttention PA_ENCODER; BNSD_BSND == transposed BNSD; TND ==
// padded BSND. Every rejection leaves the output untouched. (IncreFlashAttention:
// flash_attention_test.cpp.)

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/atb/self_attention.hpp>
#include <attnref/attention/attention.hpp>
#include <attnref/cann/prompt_flash_attention.hpp>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cann/flash_attention_support.hpp"
#include "reference/cann_flash_attention.hpp"
#include "support/cast.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"
#include "support/outcome.hpp"
#include "support/views.hpp"

namespace prompt_flash_attention_test {

using namespace flash_attention_support;

enum class Mask { None, Holes, Zero, Tri, Compressed, CompressedOnes };

struct PfaCase {
  int mode;
  Mask mask;
  int inner, pse, kvn, mrank;  // pse: 0 none, 1 [B, N, S1', S2'], 2 [1, N, ...]; mask rank
  std::int64_t pre, next;
  std::vector<int> ql, kvl;  // actual lengths (B = size)
  int flags = 0;
  std::string layout = "BSND";
  unsigned seed = 1;
  int N = 4, D = 16, Dv = 16;
  double scale = 0.3;
  int B() const { return static_cast<int>(ql.size()); }
  int pad() const { return flags & kNoLens ? 0 : 2; }
  int S1() const { return *std::max_element(ql.begin(), ql.end()) + pad(); }
  int S2() const { return *std::max_element(kvl.begin(), kvl.end()) + pad(); }
  int dv() const { return flags & kDv8 ? 8 : Dv; }
  std::string name() const {
    return layout + " mode " + std::to_string(mode) + " seed " + std::to_string(seed);
  }
};

// The mask value of (mask batch b, i, j): random holes and every row i = 3 mod 5 fully masked.
bool hole(const PfaCase& c, int b, int i, int j) {
  if (c.mask == Mask::Tri) return j > i + c.kvl[z(b)] - c.ql[z(b)];
  return c.mask == Mask::Holes && (i % 5 == 3 || hv(c.seed, b, i, j) < 0.3);
}

template <class TM>
const Array<TM>& compressed_mask(bool ones) {
  auto make = [](bool all) {
    Array<TM> m(z(2048 * 2048));
    for (size_t i = 0; i < m.n; ++i) m[i] = TM(all || i % 2048 > i / 2048 ? 1 : 0);
    return m;
  };
  static const Array<TM> tri = make(false), all = make(true);
  return ones ? all : tri;
}

template <class T, class TM>
struct PfaBuilt {
  PfaCase c;
  Dims qd, kd, vd, od;
  Seqs q, k, v;
  std::vector<T> qb, kb, vb, pse, out;
  Array<TM> mask;
  const TM* mptr = nullptr;
  Shape mshape, pshape;
  int mS1 = 0, mS2 = 0, pS1 = 0, pS2 = 0;
  std::vector<std::int64_t> qlist, kvlist;
};

template <class T, class TM>
PfaBuilt<T, TM> build(const PfaCase& c) {
  PfaBuilt<T, TM> r;
  r.c = c;
  const int B = c.B(), S1 = c.S1(), S2 = c.S2();
  std::vector<int> qcu{0}, kcu{0};
  for (int b = 0; b < B; ++b) {
    qcu.push_back(qcu.back() + c.ql[z(b)]);
    kcu.push_back(kcu.back() + c.kvl[z(b)]);
  }
  r.qd = {c.layout, B, S1, c.N, c.D, qcu};
  r.kd = {c.layout, B, S2, c.kvn, c.D, kcu};
  r.vd = {c.layout, B, S2, c.kvn, c.dv(), kcu};
  r.od = {c.layout == "BNSD_BSND" ? "BSND" : c.layout, B, S1, c.N, c.dv(), qcu};
  std::mt19937 rng(c.seed);
  r.q = draw<T>(rng, c.ql, c.N, c.D);
  r.k = draw<T>(rng, c.kvl, c.kvn, c.D);
  r.v = draw<T>(rng, c.kvl, c.kvn, c.dv());
  r.qb = pack<T>(r.qd, r.q, c.ql);
  r.kb = pack<T>(r.kd, r.k, c.kvl);
  r.vb = pack<T>(r.vd, r.v, c.kvl);
  r.out.assign(r.od.size(), T(7.0f));
  const bool one = c.flags & kOneLen;
  if (c.layout == "TND") {
    r.qlist.assign(qcu.begin() + 1, qcu.end());
    r.kvlist.assign(kcu.begin() + 1, kcu.end());
  } else if (!(c.flags & kNoLens)) {
    r.qlist.assign(c.ql.begin(), one ? c.ql.begin() + 1 : c.ql.end());
    r.kvlist.assign(c.kvl.begin(), one ? c.kvl.begin() + 1 : c.kvl.end());
  }
  const int rank = c.mrank;
  if (c.mask == Mask::Compressed || c.mask == Mask::CompressedOnes) {
    r.mptr = compressed_mask<TM>(c.mask == Mask::CompressedOnes).data();
    r.mshape = rank == 2   ? Shape{2048, 2048}
               : rank == 3 ? Shape{1, 2048, 2048}
                           : Shape{1, 1, 2048, 2048};
  } else if (c.mask != Mask::None) {
    r.mS1 = S1 + 2;
    r.mS2 = S2 + 3;
    const int Bm = c.flags & kMaskB1 || rank == 2 ? 1 : B;
    r.mshape = rank == 2   ? Shape{r.mS1, r.mS2}
               : rank == 3 ? Shape{Bm, r.mS1, r.mS2}
                           : Shape{Bm, 1, r.mS1, r.mS2};
    r.mask = Array<TM>(z(Bm * r.mS1 * r.mS2));
    for (int b = 0; b < Bm; ++b)
      for (int i = 0; i < r.mS1; ++i)
        for (int j = 0; j < r.mS2; ++j)
          r.mask[z((b * r.mS1 + i) * r.mS2 + j)] = TM(hole(c, b, i, j) ? 1 : 0);
    r.mptr = r.mask.data();
  }
  if (c.pse) {  // NaN where no batch reads it
    const int Bp = c.pse == 1 ? B : 1;
    r.pS1 = S1 + 1;
    r.pS2 = S2 + 2;
    r.pshape = {Bp, c.N, r.pS1, r.pS2};
    for (int b = 0; b < Bp; ++b)
      for (int h = 0; h < c.N; ++h)
        for (int i = 0; i < r.pS1; ++i)
          for (int j = 0; j < r.pS2; ++j) {
            const bool used =
                Bp == 1 ? i < S1 - c.pad() && j < S2 - c.pad() : i < c.ql[z(b)] && j < c.kvl[z(b)];
            r.pse.push_back(used ? T(static_cast<float>(4 * hv(c.seed + 7, b * 64 + h, i, j) - 2))
                                 : poison<T>());
          }
  }
  return r;
}

template <class T, class TM>
struct PfaCall {
  attnref::PromptFlashAttentionParams p;
  attnref::PromptFlashAttentionInputs<T, TM> in;
  StridedView<T> o;
};
template <class T, class TM>
using PfaEdit = std::function<void(PfaCall<T, TM>&)>;

template <class T, class TM>
void run(PfaBuilt<T, TM>& r, const PfaEdit<T, TM>& edit = {}, int threads = 0,
         bool validate_only = false) {
  const PfaCase& c = r.c;
  PfaCall<T, TM> x;
  const std::int64_t kvn = c.kvn == c.N && c.seed % 2 ? 0 : c.kvn;  // 0: num_heads
  x.p = {c.N, c.scale, c.pre, c.next, c.layout, kvn, c.mode, c.inner, order(c.flags)};
  x.in.query = {r.qb.data(), r.qd.shape()};
  x.in.key = {r.kb.data(), r.kd.shape()};
  x.in.value = {r.vb.data(), r.vd.shape()};
  if (r.mptr) x.in.atten_mask = {r.mptr, r.mshape};
  if (c.pse) x.in.pse_shift = {r.pse.data(), r.pshape};
  x.in.actual_seq_lengths = r.qlist;
  x.in.actual_seq_lengths_kv = r.kvlist;
  x.o = StridedView<T>(r.out.data(), r.od.shape());
  if (edit) edit(x);
  const attnref::PromptFlashAttentionOutputs<T> out{x.o};
  if (validate_only)
    attnref::validate(x.p, x.in, out, {threads});
  else
    attnref::prompt_flash_attention(x.p, x.in, out, {threads});
}

// The reference in the output's layout (padded rows 0).
template <class T, class TM>
std::vector<double> expected(const PfaBuilt<T, TM>& r) {
  const PfaCase& c = r.c;
  const bool ats = c.flags & kAts, has_mask = c.mask != Mask::None;
  ref::cann::Pfa pr{c.N,    c.kvn, c.D,    c.dv(),  c.ql, c.kvl,   c.scale,
                    c.mode, c.pre, c.next, c.inner, ats,  has_mask};
  if (r.mS1)
    pr.mask = [&r](int b, int i, int j) {
      const int mb = r.mshape.size() == 2 || r.mshape[0] == 1 ? 0 : b;
      return r.mask[z((mb * r.mS1 + i) * r.mS2 + j)] != TM(0);
    };
  if (c.pse)
    pr.pse = [&r](int b, int h, int i, int j) {
      return dbl(r.pse[z((((r.pshape[0] == 1 ? 0 : b) * r.c.N + h) * r.pS1 + i) * r.pS2 + j)]);
    };
  const Seqs o = ref::cann::pfa(pr, r.q, r.k, r.v);
  std::vector<double> want(r.od.size(), 0.0);
  for (int b = 0; b < c.B(); ++b)
    for (int i = 0; i < c.ql[z(b)]; ++i)
      for (int h = 0; h < c.N; ++h)
        for (int e = 0; e < c.dv(); ++e)
          want[r.od.at(b, i, h, e)] = o[z(b)][z((i * c.N + h) * c.dv() + e)];
  return want;
}

// The valid output rows in (b, i, h, d) order (= packed tokens).
template <class T, class TM>
std::vector<T> rows(const PfaBuilt<T, TM>& r) {
  std::vector<T> x;
  for (int b = 0; b < r.c.B(); ++b)
    for (int i = 0; i < r.c.ql[z(b)]; ++i)
      for (int h = 0; h < r.c.N; ++h)
        for (int e = 0; e < r.c.dv(); ++e) x.push_back(r.out[r.od.at(b, i, h, e)]);
  return x;
}

template <class T, class TM>
PfaBuilt<T, TM> checked(const PfaCase& c, int threads = 0) {
  auto r = build<T, TM>(c);
  EXPECT_NO_THROW(run(r, {}, threads)) << c.name();
  EXPECT_TRUE(matches(expected(r), r.out)) << c.name();
  return r;
}

std::vector<PfaCase> pfa_grid(bool tnd) {
  const Mask H = Mask::Holes, C = Mask::Compressed, N = Mask::None;
  if (tnd)  // mode 0 without a mask or mode 3; no pse
    return {{0, N, 1, 0, 4, 3, kInf, kInf, {17, 7, 1}, {17, 64, 7}},
            {3, C, 1, 0, 1, 3, kInf, kInf, {7, 17, 1}, {129, 17, 7}, kDv8},
            {3, C, 1, 0, 1, 2, kInf, kInf, {17, 1}, {7, 0}}};       // q longer than kv; kv empty
  return {{0, N, 1, 1, 1, 3, kInf, kInf, {17, 7, 1}, {17, 16, 7}},  // no mask: pre / next ignored
          {0, H, 0, 2, 4, 2, 5, 2, {17, 12}, {7, 7}},  // band [-5, 2]: rows past kv + 5 have no key
          {0, H, 2, 1, 1, 4, kInf, -2, {17, 7, 1}, {17, 16, 7}, kAts},  // rows 0, 1 have no key
          {1, H, 0, 0, 2, 3, kInf, kInf, {64, 1}, {129, 64}},  // fully masked rows: mean of V
          {1, H, 3, 2, 4, 4, kInf, kInf, {7, 7, 7}, {16, 16, 16}, kMaskB1 | kOneLen | kDv8},
          {2, C, 1, 1, 1, 3, kInf, kInf, {17, 7, 1}, {17, 16, 7}},
          {3, C, 1, 0, 4, 4, kInf, kInf, {17, 16, 1}, {7, 17, 1}},   // batch 0: first 10 rows 0
          {4, C, 1, 2, 1, 2, 3, 1, {17, 7, 1}, {17, 16, 7}},         // band [-3, 1] bottom-right
          {4, C, 1, 0, 1, 3, -2, 5, {17, 7, 1}, {17, 17, 7}},        // band [2, 5]: last rows empty
          {0, N, 1, 1, 4, 3, kInf, kInf, {7, 7}, {1, 1}, kNoLens}};  // full extents; one key
}

TEST(PromptFlashAttention, MatchesReference) {
  unsigned seed = 100;
  for (const char* lay : {"BSH", "BSND", "BNSD", "BNSD_BSND", "TND"})
    for (PfaCase c : pfa_grid(std::string(lay) == "TND")) {
      c.layout = lay;
      c.seed = seed++;
      checked<half, u8>(c);
      checked<bfloat16, bool>(c);
      checked<float, i8>(c);
    }
}

TEST(PromptFlashAttention, Mode3EqualsEngineBottomRightAndTheExplicitTriangle) {
  for (bool q_longer : {false, true}) {
    PfaCase c{3, Mask::Compressed, 1, 0, 2, 3, kInf, kInf, {9, 17, 1}, {30, 31, 5}};
    if (q_longer) {
      c.ql = {17, 9, 1};
      c.kvl = {7, 31, 1};
    }
    const auto m3 = checked<half, u8>(c);
    const int B = c.B();
    std::vector<half> eo(m3.out.size(), half(0.0f));
    attnref::AttentionInputs<half> e;
    e.q = attnref::bsnd_view<const half>(m3.qb.data(), B, c.S1(), c.N, c.D);
    e.k = attnref::bsnd_view<const half>(m3.kb.data(), B, c.S2(), c.kvn, c.D);
    e.v = attnref::bsnd_view<const half>(m3.vb.data(), B, c.S2(), c.kvn, c.dv());
    e.seq.q.assign(c.ql.begin(), c.ql.end());
    e.seq.kv.assign(c.kvl.begin(), c.kvl.end());
    attnref::AttentionParams ep;
    ep.scale = c.scale;
    ep.causal = attnref::CausalMode::BottomRight;
    attnref::attention(
        e, ep,
        attnref::AttentionOutputs<half>{attnref::bsnd_view(eo.data(), B, c.S1(), c.N, c.dv())});
    EXPECT_TRUE(ulp_close(m3.out, eo)) << "engine, q longer " << q_longer;
    for (int inner : {2, 0}) {  // inner 0 only when every row keeps a key
      if (q_longer && inner == 0) continue;
      PfaCase t = c;
      t.mode = 0;
      t.mask = Mask::Tri;
      t.pre = t.next = std::int64_t(1) << 40;
      t.inner = inner;
      EXPECT_TRUE(ulp_close(m3.out, checked<half, u8>(t).out)) << "triangle, inner " << inner;
    }
  }
}

TEST(PromptFlashAttention, HugeBandWithAZeroMaskEqualsNoMaskBitForBit) {
  for (const char* lay : {"BSH", "BNSD"})
    for (int inner = 0; inner < 4; ++inner) {
      PfaCase c{0, Mask::None, inner, 1, 2, 3, kInf, 0, {17, 7, 1}, {17, 16, 7}};
      c.layout = lay;
      const auto none = checked<bfloat16, u8>(c);
      c.mask = Mask::Zero;
      c.pre = c.next = std::int64_t(1) << 40;
      EXPECT_TRUE(support::bitwise_equal(none.out, checked<bfloat16, u8>(c).out))
          << lay << " inner " << inner;
    }
}

TEST(PromptFlashAttention, CompressedMaskContentIsNotRead) {
  for (int mode : {2, 3, 4}) {
    PfaCase c{mode, Mask::Compressed, 1, 0, 1, 3, 4, 1, {17, 7, 1}, {17, 16, 7}};
    const auto tri = checked<half, u8>(c);
    c.mask = Mask::CompressedOnes;
    EXPECT_TRUE(support::bitwise_equal(tri.out, checked<half, u8>(c).out)) << "mode " << mode;
  }
}

TEST(PromptFlashAttention, BnsdBsndIsTransposedBnsdBitForBit) {
  for (int mode : {0, 3}) {
    const Mask m = mode ? Mask::Compressed : Mask::Holes;
    PfaCase c{mode, m, 2, 1, 1, 3, kInf, kInf, {17, 7, 1}, {17, 16, 7}, kDv8};
    c.layout = "BNSD";
    const auto a = checked<half, u8>(c);
    c.layout = "BNSD_BSND";
    const auto b = checked<half, u8>(c);
    std::vector<half> t(a.out.size());
    const Dims bsnd{"BSND", c.B(), c.S1(), c.N, c.dv(), {}};
    for (int x = 0; x < c.B(); ++x)
      for (int s = 0; s < c.S1(); ++s)
        for (int n = 0; n < c.N; ++n)
          for (int e = 0; e < c.dv(); ++e) t[bsnd.at(x, s, n, e)] = a.out[a.od.at(x, s, n, e)];
    EXPECT_TRUE(support::bitwise_equal(t, b.out)) << "mode " << mode;
  }
}

TEST(PromptFlashAttention, TndEqualsPaddedBsndBitForBit) {
  for (int mode : {0, 3}) {
    const Mask m = mode ? Mask::Compressed : Mask::None;
    PfaCase c{mode, m, 1, 0, 2, 3, kInf, kInf, {17, 7, 1}, {17, 64, 7}};
    c.layout = "TND";
    const auto t = checked<bfloat16, u8>(c);
    c.layout = "BSND";
    EXPECT_TRUE(support::bitwise_equal(t.out, rows(checked<bfloat16, u8>(c, 3))))
        << "mode " << mode;
  }
}

// TND with sparse_mode 4 (the vendor's tiling takes it for value head size 64 / 128): the band
// anchored bottom-right in every batch, against the reference and == padded BSND bit for bit;
// a negative pre_tokens leaves the last rows of a batch without a key (0).
TEST(PromptFlashAttention, TndBandMatchesReferenceAndPaddedBsnd) {
  for (const auto& [pre, next] : {std::pair<std::int64_t, std::int64_t>{3, 1}, {-2, 5}, {40, -3}}) {
    PfaCase c{4, Mask::Compressed, 1, 0, 2, 2, pre, next, {17, 7, 3, 0}, {17, 64, 7, 5}};
    c.D = c.Dv = 64;
    c.layout = "TND";
    c.seed = static_cast<unsigned>(300 + pre);
    const auto t = checked<bfloat16, u8>(c);
    c.layout = "BSND";
    EXPECT_TRUE(support::bitwise_equal(t.out, rows(checked<bfloat16, u8>(c, 3))))
        << "pre " << pre << " next " << next;
  }
}

template <class T>
void pfa_vs_self_attention(const PfaCase& c, attnref::SelfAttentionParams::MaskType mt) {
  using P = attnref::SelfAttentionParams;
  const auto r = checked<T, u8>(c);
  Index tokens = 0;
  for (int l : c.ql) tokens += l;
  std::vector<T> q = concat<T>(r.q), k = concat<T>(r.k), v = concat<T>(r.v), m;
  std::vector<T> o(z(tokens * c.N * c.dv()), T(7.0f));
  P p;
  p.num_heads = c.N;
  p.num_kv_heads = c.kvn;
  p.calc_type = P::CalcType::PaEncoder;
  p.kernel_type = P::KernelType::HighPrecision;
  p.qk_scale = static_cast<float>(c.scale);
  p.mask_type = mt;
  attnref::SelfAttentionInputs<T> in;
  in.query = StridedView<const T, 3>(q.data(), {tokens, c.N, c.D});
  in.key = StridedView<const T, 3>(k.data(), {tokens, c.kvn, c.D});
  in.value = StridedView<const T, 3>(v.data(), {tokens, c.kvn, c.dv()});
  in.seq_len.assign(c.ql.begin(), c.ql.end());
  if (mt == P::MaskType::Norm) {  // binary [batch, S1, S2]
    for (int b = 0; b < c.B(); ++b)
      for (int i = 0; i < c.S1(); ++i)
        for (int j = 0; j < c.S2(); ++j) m.push_back(T(hole(c, b, i, j) ? 1.0f : 0.0f));
    in.mask = StridedView<const T, 3>(m.data(), {c.B(), c.S1(), c.S2()});
  }
  attnref::self_attention(
      p, in, attnref::SelfAttentionOutputs<T>{StridedView<T, 3>(o.data(), {tokens, c.N, c.dv()})});
  EXPECT_TRUE(ulp_close(rows(r), o)) << c.name();
}

TEST(PromptFlashAttention, EqualsSelfAttentionPaEncoder) {
  using M = attnref::SelfAttentionParams::MaskType;
  PfaCase c{0, Mask::None, 1, 0, 2, 3, kInf, kInf, {17, 9, 1}, {17, 9, 1}};  // equal lengths
  c.scale = 0.25;
  for (const char* lay : {"TND", "BSND"}) {
    c.layout = lay;
    c.mode = 0;
    c.mask = Mask::None;
    pfa_vs_self_attention<half>(c, M::Undefined);
    pfa_vs_self_attention<bfloat16>(c, M::Undefined);
    c.mode = 3;
    c.mask = Mask::Compressed;
    pfa_vs_self_attention<half>(c, M::CausalMask);
    pfa_vs_self_attention<float>(c, M::CausalMask);
  }
  c.mode = 1;  // a user mask with fully masked rows: the -FLT_MAX select vs the -3e38 addition
  c.mask = Mask::Holes;
  c.inner = 0;
  pfa_vs_self_attention<half>(c, M::Norm);
  pfa_vs_self_attention<bfloat16>(c, M::Norm);
}

template <class T, class TM>
using Edits = std::vector<std::pair<PfaEdit<T, TM>, std::string>>;

// Each edit must throw std::invalid_argument naming `what`, before the output is written; the
// validation alone (attnref::validate) throws the same exception with the same message, and on
// an unedited valid call (the case itself, when every edit is given) it passes and writes nothing.
void pfa_rejected(const PfaCase& c, const Edits<half, u8>& edits) {
  const auto built = build<half, u8>(c);
  for (const auto& [edit, what] : edits) {
    auto r = built;
    support::expect_throw([&] { run(r, edit); }, what, false);
    EXPECT_TRUE(untouched(r.out)) << what;
    EXPECT_EQ(support::outcome([&] { run(r, edit, 0, true); }),
              support::outcome([&] { run(r, edit); }))
        << what;
  }
  for (const auto& e : edits)
    if (!e.first) return;  // the case itself is the rejected call
  auto r = built;
  EXPECT_EQ(support::outcome([&] { run(r, {}, 0, true); }), "");
  EXPECT_TRUE(untouched(r.out));
}

TEST(PromptFlashAttention, Rejections) {
  using X = PfaCall<half, u8>;
  static const Array<u8>& cm = compressed_mask<u8>(false);
  // mode 0 with a [3, 21, 22] mask, pse [3, 4, 20, 21], KV_N 2, q / kv extents 19.
  const PfaCase c{0, Mask::Holes, 1, 1, 2, 3, kInf, 0, {17, 7, 1}, {17, 16, 7}};
  pfa_rejected(
      c, {{[](X& x) { x.p.input_layout = "SH"; }, "input_layout"},
          {[](X& x) { x.p.input_layout = "NSD"; }, "input_layout"},
          {[](X& x) { x.in.query = support::reshaped(x.in.query, shp(3, 19, 64)); }, "query"},
          {[](X& x) { x.p.num_heads = 0; }, "num_heads"},
          {[](X& x) { x.p.num_key_value_heads = -1; }, "num_key_value_heads"},
          {[](X& x) { x.p.num_key_value_heads = 3; }, "params.num_"},
          {[](X& x) { x.p.num_key_value_heads = 4; }, "key"},
          {[](X& x) { x.in.value = support::resized(x.in.value, 2, 1); }, "value"},
          {[](X& x) { x.p.sparse_mode = 5; }, "not supported by PromptFlashAttention"},
          {[](X& x) { x.p.sparse_mode = 8; }, "not supported by PromptFlashAttention"},
          {[](X& x) { x.p.sparse_mode = 9; }, "sparse_mode"},
          {[](X& x) { x.p.sparse_mode = -1; }, "sparse_mode"},
          {[](X& x) { x.p.sparse_mode = 1, x.in.atten_mask = {}; }, "atten_mask"},
          {[](X& x) { x.p.sparse_mode = 3, x.in.atten_mask = {}; }, "atten_mask"},
          {[](X& x) { x.p.sparse_mode = 2; }, "atten_mask"},  // not 2048 x 2048
          {[](X& x) {
             x.p.sparse_mode = 4,
             x.in.atten_mask = StridedView<const u8>(cm.data(), shp(2, 1024, 2048));
           },
           "atten_mask"},
          {[](X& x) { x.in.atten_mask = support::resized(x.in.atten_mask, 0, 2); }, "atten_mask"},
          {[](X& x) { x.in.atten_mask = support::reshaped(x.in.atten_mask, shp(3, 2, 21, 11)); },
           "atten_mask"},
          {[](X& x) { x.in.atten_mask = support::resized(x.in.atten_mask, 1, 18); }, "atten_mask"},
          {[](X& x) { x.in.atten_mask = support::resized(x.in.atten_mask, 2, 18); }, "atten_mask"},
          {[](X& x) { x.p.pre_tokens = x.p.next_tokens = -1; }, "pre_tokens"},
          {[](X& x) { x.p.pre_tokens = -5, x.p.next_tokens = 3; }, "pre_tokens"},
          {[](X& x) { x.in.actual_seq_lengths = lens(17, 7); }, "actual_seq_lengths"},
          {[](X& x) { x.in.actual_seq_lengths[1] = 20; }, "actual_seq_lengths"},
          {[](X& x) { x.in.actual_seq_lengths[0] = -1; }, "actual_seq_lengths"},
          {[](X& x) { x.in.actual_seq_lengths_kv = lens(20); }, "actual_seq_lengths_kv"},
          {[](X& x) { x.in.pse_shift = support::reshaped(x.in.pse_shift, shp(3, 4, 20 * 21)); },
           "pse_shift"},
          {[](X& x) { x.in.pse_shift = support::resized(x.in.pse_shift, 0, 2); }, "pse_shift"},
          {[](X& x) { x.in.pse_shift = support::resized(x.in.pse_shift, 1, 2); }, "pse_shift"},
          {[](X& x) { x.in.pse_shift = support::resized(x.in.pse_shift, 2, 18); }, "pse_shift"},
          {[](X& x) { x.in.pse_shift = support::resized(x.in.pse_shift, 3, 18); }, "pse_shift"},
          {[](X& x) { x.p.inner_precise = 4; }, "inner_precise"},
          {[](X& x) { x.p.inner_precise = -1; }, "inner_precise"},
          {[](X& x) { x.o = support::resized(x.o, 3, 8); }, "attention_out"}});
  PfaCase big{0, Mask::None, 1, 0, 6, 3, kInf, kInf, {2}, {2}};  // head limits and sizes
  big.N = 258;                                                   // > 256 (ratio 43)
  pfa_rejected(big, {{nullptr, "num_heads"}});
  big.N = 65;  // ratio 65 > 64
  big.kvn = 1;
  pfa_rejected(big, {{nullptr, "num_heads"}});
  big.N = 1;
  big.D = 520;
  pfa_rejected(big, {{nullptr, "query"}});
  big.D = 16;
  big.Dv = 520;
  pfa_rejected(big, {{nullptr, "value"}});
  PfaCase t{0, Mask::None, 1, 0, 1, 3, kInf, kInf, {17, 7, 1}, {17, 16, 7}};  // TND: T1 25, T2 40
  t.layout = "TND";
  pfa_rejected(
      t,
      {{[](X& x) { x.in.actual_seq_lengths_kv.clear(); }, "actual_seq_lengths"},
       {[](X& x) { x.in.actual_seq_lengths.clear(); }, "actual_seq_lengths"},
       {[](X& x) { x.in.actual_seq_lengths_kv.pop_back(); }, "actual_seq_lengths"},
       {[](X& x) { x.in.actual_seq_lengths = lens(17, 24, 24); }, "actual_seq_lengths"},
       {[](X& x) { x.in.actual_seq_lengths = lens(17, 10, 25); }, "actual_seq_lengths"},
       {[](X& x) { x.in.actual_seq_lengths_kv = lens(17, 33, 39); }, "actual_seq_lengths_kv"},
       {[](X& x) {
          x.p.sparse_mode = 1, x.in.atten_mask = StridedView<const u8>(cm.data(), shp(2048, 2048));
        },
        "sparse_mode"},
       {[](X& x) { x.in.atten_mask = StridedView<const u8>(cm.data(), shp(2048, 2048)); },
        "sparse_mode"},
       {[](X& x) {
          static const std::vector<half> pse(1 * 4 * 25 * 40, half(0.0f));  // its own memory
          x.in.pse_shift = StridedView<const half>(pse.data(), shp(1, 4, 25, 40));
        },
        "pse_shift"},
       {[](X& x) {  // sparse 4 takes value head size 64 or 128 with TND
          x.p.sparse_mode = 4, x.in.atten_mask = StridedView<const u8>(cm.data(), shp(2048, 2048));
        },
        "head size not supported with TND and sparse_mode 4"}});
  t.D = t.Dv = 64;
  pfa_rejected(t, {{[](X& x) {  // batch 1: 7 rows, pre -8 leaves no band
                      x.p.sparse_mode = 4, x.p.pre_tokens = -8, x.p.next_tokens = 20;
                      x.in.atten_mask = StridedView<const u8>(cm.data(), shp(2048, 2048));
                    },
                    "leave batch 1 no band"}});
}

}  // namespace prompt_flash_attention_test
