// CANN IncreFlashAttention (IFA) against the independent reference
// tests/reference/cann_flash_attention.hpp: grids over layouts, dtypes, masks (a fully masked
// batch), pse, GQA, kv tensor lists, paged caches (shuffled tables, NaN-poisoned spare blocks,
// both cache layouts), antiquant per tensor, per channel and per token, and kv left padding, with
// NaN in every element the operator must not read. Metamorphic: IFA == ATB PagedAttention;
// per-tensor == per-channel antiquant; contiguous == list == paged; padded == the windows as
// their own tensors. Every rejection leaves the output untouched. (PromptFlashAttention:
// prompt_flash_attention_test.cpp; the shared scaffolding: flash_attention_support.hpp.)

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/atb/paged_attention.hpp>
#include <attnref/cann/incre_flash_attention.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cann/flash_attention_support.hpp"
#include "reference/cann_flash_attention.hpp"
#include "support/cast.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"
#include "support/outcome.hpp"
#include "support/views.hpp"

namespace flash_attention_test {

using namespace flash_attention_support;

enum class Quant { None, Channel, Tensor, Token };
constexpr std::int64_t kNoPad = INT64_MIN;  // IfaCase::pad: no kv_padding_size

struct IfaCase {
  int store;  // 0: one tensor with batch B; 1: B tensors with batch 1; else the paged block size
  int mrank, pse, kvn;  // mask rank 2–4 (0: none); pse 0 none, 1 [B, N, 1, W], 2 [1, N, 1, W]
  Quant quant;
  int aq;              // per channel: (2, KV_N, 1, D), (2, 1, KV_N, D), (2, KV_N, D), (2, KV_N·D)
  std::vector<int> S;  // kv extent of each batch (paged: empty)
  std::vector<std::int64_t> act;  // actual_seq_lengths (empty: none)
  int flags = 0;
  std::string layout = "BSND";
  unsigned seed = 1;
  int N = 8, D = 32;
  double scale = 0.2;
  std::int64_t pad = kNoPad;  // kv left padding (one tensor with lengths)
  int B() const { return static_cast<int>(S.empty() ? act.size() : S.size()); }
  int given(int b) const {
    return act.empty() ? S[z(b)] : static_cast<int>(act[act.size() == 1 ? 0 : z(b)]);
  }
  // The window's first position: S - max(pad, 0) - length; -1 when it would start before 0
  // (the batch then reads nothing).
  int start(int b) const {
    if (pad == kNoPad) return 0;
    const std::int64_t s = S[z(b)] - std::max<std::int64_t>(pad, 0) - given(b);
    return s < 0 ? -1 : static_cast<int>(s);
  }
  int shift(int b) const { return std::max(0, start(b)); }
  int len(int b) const { return start(b) < 0 ? 0 : given(b); }
  bool paged() const { return store > 1; }
  bool masked(int b, int j) const {
    if (flags & kNoFullMask) return j > 0 && hv(seed + 5, b, j, 0) < 0.3;
    return b == 1 || hv(seed + 5, b, j, 0) < 0.3;
  }
  std::string name() const {
    return layout + " store " + std::to_string(store) + " seed " + std::to_string(seed);
  }
};

template <class T, class TKV, class TM>
struct IfaBuilt {
  IfaCase c;
  Seqs q, k, v;  // the reference's data (K, V dequantized)
  std::vector<T> qb, pse, out, aqs, aqo;
  std::vector<float> tks, tko;  // per-token antiquant (2, B, W)
  std::int64_t pad = 0;
  std::vector<std::vector<TKV>> ks, vs;  // one per tensor
  std::vector<Shape> kshape;
  Array<TM> mask;
  std::vector<std::int32_t> table;
  Shape qshape, mshape, pshape, aqshape, tshape;
  int W = 0, maxb = 0, blocks = 0;  // W: mask / pse width
};

template <class T, class TKV, class TM>
IfaBuilt<T, TKV, TM> build_ifa(const IfaCase& c) {
  constexpr bool q8 = std::is_same_v<TKV, i8>;
  IfaBuilt<T, TKV, TM> r;
  r.c = c;
  r.pad = c.pad;
  const int B = c.B(), N = c.N, KVN = c.kvn, D = c.D, nch = c.quant == Quant::Tensor ? 1 : KVN * D;
  const bool tok = c.quant == Quant::Token;
  // Per-token antiquant at position p of batch b (k: 0 key, 1 value).
  auto tscale = [&c](int k, int b, int p) {
    return 0.004f + 0.02f * float(hv(c.seed + 3, k, b, p));
  };
  auto toff = [&c](int k, int b, int p) {
    return std::round(16 * float(hv(c.seed + 4, k, b, p)) - 8);
  };
  std::vector<int> L;
  for (int b = 0; b < B; ++b) L.push_back(c.len(b));
  std::mt19937 rng(c.seed);
  r.q = draw<T>(rng, std::vector<int>(z(B), 1), N, D);
  r.qb = concat<T>(r.q);  // BSH, BSND and BNSD with S = 1: the same memory
  r.qshape = c.layout == "BSH"    ? Shape{B, 1, N * D}
             : c.layout == "BSND" ? Shape{B, 1, N, D}
                                  : Shape{B, N, 1, D};
  for (int kv = 0; q8 && !tok && kv < 2; ++kv)
    for (int ch = 0; ch < nch; ++ch) {
      r.aqs.push_back(T(static_cast<float>(0.004 + 0.02 * hv(c.seed + 3, kv, ch, 0))));
      if (c.flags & kOffset)
        r.aqo.push_back(T(std::round(16 * static_cast<float>(hv(c.seed + 4, kv, ch, 0)) - 8)));
    }
  const Shape per_channel[4] = {{2, KVN, 1, D}, {2, 1, KVN, D}, {2, KVN, D}, {2, KVN * D}};
  if (q8 && !tok) r.aqshape = c.quant == Quant::Tensor ? Shape{2} : per_channel[c.aq];
  // Raw K / V in token order (any storage gets the same), dequantized for the reference.
  std::uniform_int_distribution<int> ui(-100, 100);
  std::normal_distribution<double> nd;
  std::vector<std::vector<TKV>> raw(2 * z(B));
  r.k.resize(z(B));
  r.v.resize(z(B));
  for (int b = 0; b < B; ++b)
    for (int e = 0; e < L[z(b)] * KVN * D; ++e)
      for (int kv = 0; kv < 2; ++kv) {
        const TKV x = q8 ? TKV(ui(rng)) : TKV(static_cast<float>(nd(rng)));
        raw[z(2 * b + kv)].push_back(x);
        double val = dbl(x);
        if constexpr (q8) {
          const size_t ch = z(kv * nch + (nch == 1 ? 0 : e % (KVN * D)));
          const int p = c.shift(b) + e / (KVN * D);
          val = tok ? ref::cann::antiquant(x, tscale(kv, b, p),
                                           c.flags & kOffset ? toff(kv, b, p) : 0.0)
                    : ref::cann::antiquant(x, dbl(r.aqs[ch]), r.aqo.empty() ? 0.0 : dbl(r.aqo[ch]));
        }
        (kv ? r.v : r.k)[z(b)].push_back(val);
      }
  auto store = [&](auto&& index, size_t size, int first, int count) {
    std::vector<TKV> kt(size, poison<TKV>()), vt(size, poison<TKV>());
    for (int b = first; b < first + count; ++b)
      for (int t = 0; t < L[z(b)]; ++t)
        for (int h = 0; h < KVN; ++h)
          for (int d = 0; d < D; ++d) {
            const size_t at = index(b, t, h, d), e = z((t * KVN + h) * D + d);
            kt[at] = raw[z(2 * b)][e];
            vt[at] = raw[z(2 * b + 1)][e];
          }
    r.ks.push_back(std::move(kt));
    r.vs.push_back(std::move(vt));
  };
  if (c.paged()) {  // shuffled table, -1 padding, two spare blocks
    const int bs = c.store;
    std::vector<int> nb;
    for (int l : L) {
      nb.push_back((l + bs - 1) / bs);
      r.maxb = std::max(r.maxb, nb.back() + 1);
      r.blocks += nb.back();
    }
    r.blocks += 2;
    std::vector<std::int32_t> ids(z(r.blocks));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(i);
    std::mt19937 trng(c.seed + 2000);
    std::shuffle(ids.begin(), ids.end(), trng);
    r.table.assign(z(B * r.maxb), -1);
    for (int b = 0, next = 0; b < B; ++b)
      for (int j = 0; j < nb[z(b)]; ++j) r.table[z(b * r.maxb + j)] = ids[z(next++)];
    const bool four = c.flags & kCache4d;
    store(
        [&](int b, int t, int h, int d) {
          const int blk = r.table[z(b * r.maxb + t / bs)];
          return four ? z(((blk * KVN + h) * bs + t % bs) * D + d)
                      : z(((blk * bs + t % bs) * KVN + h) * D + d);
        },
        z(r.blocks * bs * KVN * D), 0, B);
    r.kshape.push_back(four ? Shape{r.blocks, KVN, bs, D} : Shape{r.blocks, bs, KVN * D});
    r.W = r.maxb * bs;
  } else {
    for (int b = 0; b < (c.store ? B : 1); ++b) {
      const Dims d{c.layout, c.store ? 1 : B, c.S[z(b)], KVN, D, {}};
      const int b0 = c.store ? b : 0;
      store([&](int x, int t, int h, int e) { return d.at(x - b0, c.shift(x) + t, h, e); },
            d.size(), b0, c.store ? 1 : B);
      r.kshape.push_back(d.shape());
    }
    r.W = *std::max_element(c.S.begin(), c.S.end()) + 3;
  }
  if (c.mrank) {
    r.mshape = c.mrank == 2 ? Shape{B, r.W} : c.mrank == 3 ? Shape{B, 1, r.W} : Shape{B, 1, 1, r.W};
    r.mask = Array<TM>(z(B * r.W));
    for (int b = 0; b < B; ++b)
      for (int j = 0; j < r.W; ++j) r.mask[z(b * r.W + j)] = TM(c.masked(b, j) ? 1 : 0);
  }
  if (tok) {  // (2, B, W): every position drawn, the ones read or not
    r.tshape = {2, B, r.W};
    for (int kv = 0; kv < 2; ++kv)
      for (int b = 0; b < B; ++b)
        for (int p = 0; p < r.W; ++p) {
          r.tks.push_back(tscale(kv, b, p));
          if (c.flags & kOffset) r.tko.push_back(toff(kv, b, p));
        }
  }
  if (c.pse) {  // NaN outside the positions read
    const int Bp = c.pse == 1 ? B : 1;
    int maxE = 0;
    for (int b = 0; b < B; ++b) maxE = std::max(maxE, c.shift(b) + L[z(b)]);
    r.pshape = {Bp, N, 1, r.W};
    for (int b = 0; b < Bp; ++b)
      for (int h = 0; h < N; ++h)
        for (int j = 0; j < r.W; ++j)
          r.pse.push_back((Bp == 1 ? j < maxE : j >= c.shift(b) && j < c.shift(b) + L[z(b)])
                              ? T(static_cast<float>(4 * hv(c.seed + 6, b, h, j) - 2))
                              : poison<T>());
  }
  r.out.assign(r.qb.size(), T(7.0f));
  return r;
}

template <class T, class TKV, class TM>
struct IfaCall {
  attnref::IncreFlashAttentionParams p;
  attnref::IncreFlashAttentionInputs<T, TKV, TM> in;
  StridedView<T> o;
};
template <class T, class TKV, class TM>
using IfaEdit = std::function<void(IfaCall<T, TKV, TM>&)>;

template <class T, class TKV, class TM>
void run(IfaBuilt<T, TKV, TM>& r, const IfaEdit<T, TKV, TM>& edit = {},
         bool validate_only = false) {
  const IfaCase& c = r.c;
  IfaCall<T, TKV, TM> x;
  const std::int64_t kvn = c.kvn == c.N && c.seed % 2 ? 0 : c.kvn;  // 0: num_heads
  const int block = c.paged() ? c.store : 0, inner = c.flags & kInner0 ? 0 : 1;
  x.p = {c.N, c.scale, c.layout, kvn, block, inner, order(c.flags)};
  x.in.query = {r.qb.data(), r.qshape};
  for (size_t i = 0; i < r.ks.size(); ++i) {
    x.in.key.emplace_back(r.ks[i].data(), r.kshape[i]);
    x.in.value.emplace_back(r.vs[i].data(), r.kshape[i]);
  }
  x.in.actual_seq_lengths = c.act;
  if (c.mrank) x.in.atten_mask = {r.mask.data(), r.mshape};
  if (c.pse) x.in.pse_shift = {r.pse.data(), r.pshape};
  if (!r.aqs.empty()) x.in.antiquant_scale = {r.aqs.data(), r.aqshape};
  if (!r.aqo.empty()) x.in.antiquant_offset = {r.aqo.data(), r.aqshape};
  if (c.quant == Quant::Token) {
    x.p.antiquant_mode = 1;
    x.in.antiquant_scale_per_token = {r.tks.data(), r.tshape};
    if (!r.tko.empty()) x.in.antiquant_offset_per_token = {r.tko.data(), r.tshape};
  }
  if (c.pad != kNoPad) x.in.kv_padding_size = {&r.pad, {}};
  if (c.paged()) x.in.block_table = {r.table.data(), {c.B(), r.maxb}};
  x.o = StridedView<T>(r.out.data(), r.qshape);
  if (edit) edit(x);
  const attnref::IncreFlashAttentionOutputs<T> out{x.o};
  if (validate_only)
    attnref::validate(x.p, x.in, out);
  else
    attnref::incre_flash_attention(x.p, x.in, out);
}

template <class T, class TKV, class TM>
std::vector<double> expected(const IfaBuilt<T, TKV, TM>& r) {
  const IfaCase& c = r.c;
  ref::cann::Ifa pr{c.N, c.kvn, c.D, {}, c.scale, bool(c.flags & kAts)};
  for (int b = 0; b < c.B(); ++b) pr.kv_len.push_back(c.len(b));
  if (c.mrank) pr.mask = [&c](int b, int j) { return c.masked(b, c.shift(b) + j); };
  if (c.pse)
    pr.pse = [&r](int b, int h, int j) {
      return dbl(r.pse[z(((r.pshape[0] == 1 ? 0 : b) * r.c.N + h) * r.W + r.c.shift(b) + j)]);
    };
  std::vector<double> want;
  for (const auto& x : ref::cann::ifa(pr, r.q, r.k, r.v))
    want.insert(want.end(), x.begin(), x.end());
  return want;
}

template <class T, class TKV, class TM = u8>
IfaBuilt<T, TKV, TM> checked_ifa(const IfaCase& c) {
  auto r = build_ifa<T, TKV, TM>(c);
  EXPECT_NO_THROW(run(r)) << c.name();
  EXPECT_TRUE(matches(expected(r), r.out)) << c.name();
  return r;
}

template <class T, class TM>
void ifa_check(const IfaCase& c) {
  if (c.quant == Quant::None)
    checked_ifa<T, T, TM>(c);
  else
    checked_ifa<T, i8, TM>(c);
}

std::vector<IfaCase> ifa_grid() {
  const Quant N = Quant::None, C = Quant::Channel, T = Quant::Tensor, K = Quant::Token;
  const std::vector<int> S40{40, 40, 40}, P{};
  return {{0, 0, 0, 2, N, 0, S40, {40, 17, 1}},
          {0, 2, 1, 2, N, 0, {33, 33}, {}, kAts},  // no lengths; batch 1 masked: the mean of V
          {1, 3, 2, 8, N, 0, {40, 7, 129}, {}},
          {1, 4, 0, 2, N, 0, {40, 17, 64}, {30, 0, 64}, kInner0},  // a length 0: zeros
          {0, 0, 0, 2, N, 0, S40, {17}},                           // one length for all
          {16, 2, 1, 2, N, 0, P, {40, 17, 1}, kCache4d},
          {32, 0, 2, 1, N, 0, P, {129, 0, 64}},
          {0, 2, 0, 2, C, 0, S40, {40, 17, 1}, kOffset},
          {32, 0, 1, 2, C, 1, P, {40, 17, 1}, kCache4d},
          {1, 0, 0, 2, C, 2, {40, 7, 129}, {}, kOffset},
          {64, 0, 0, 2, C, 3, P, {1, 100, 64}},
          {32, 3, 0, 2, T, 0, P, {40, 17, 1}, kOffset},
          {0, 0, 2, 8, T, 0, S40, {40, 17, 1}},
          {0, 2, 1, 2, K, 0, S40, {40, 17, 1}, kOffset},
          {1, 0, 0, 8, K, 0, {40, 7, 129}, {}},
          {32, 3, 2, 2, K, 0, P, {40, 0, 65}, kOffset | kCache4d}};
}

TEST(IncreFlashAttention, MatchesReference) {
  unsigned seed = 300;
  for (const char* lay : {"BSH", "BSND", "BNSD"})
    for (IfaCase c : ifa_grid()) {
      c.layout = lay;
      c.seed = seed++;
      if (c.layout != "BNSD") c.flags &= ~kCache4d;  // the 4-D cache needs BNSD
      ifa_check<half, u8>(c);
      ifa_check<bfloat16, bool>(c);
      ifa_check<float, i8>(c);
    }
}

// The key tensor of the first sequence is the shortest, and the output follows it in memory.
TEST(IncreFlashAttention, KvListOfDifferentLengthsWithTheOutputRightAfterAShortTensor) {
  for (const char* lay : {"BSH", "BSND", "BNSD"}) {
    IfaCase c{1, 2, 0, 2, Quant::None, 0, {7, 40, 17}, {}};
    c.layout = lay;
    auto r = build_ifa<half, half, u8>(c);
    std::vector<half> arena(r.ks[0]);
    arena.resize(arena.size() + r.out.size(), half(7.0f));
    EXPECT_NO_THROW(run(r, IfaEdit<half, half, u8>([&](auto& x) {
                          x.in.key[0] = support::with_data(x.in.key[0], arena.data());
                          x.o = support::with_data(x.o, arena.data() + r.ks[0].size());
                        })))
        << lay;
    EXPECT_TRUE(
        matches(expected(r), std::vector<half>(arena.begin() + z(r.ks[0].size()), arena.end())))
        << lay;
  }
}

TEST(IncreFlashAttention, ContiguousListAndPagedAgreeBitForBit) {
  for (const char* lay : {"BSH", "BSND", "BNSD"})
    for (Quant q : {Quant::None, Quant::Channel}) {
      IfaCase c{0, 2, 1, 2, q, 0, {70, 70, 70}, {70, 33, 1}, kOffset};
      c.layout = lay;
      auto go = [&](const IfaCase& x) {
        return q == Quant::None ? checked_ifa<half, half>(x).out : checked_ifa<half, i8>(x).out;
      };
      const auto base = go(c);
      for (int store : {1, 32, -32}) {  // -32: the 4-D paged cache
        if (store < 0 && c.layout != "BNSD") continue;
        IfaCase x = c;
        x.store = std::abs(store);
        x.flags |= store < 0 ? kCache4d : 0;
        EXPECT_TRUE(support::bitwise_equal(base, go(x))) << x.name();
      }
    }
}

TEST(IncreFlashAttention, AntiquantPerTensorEqualsPerChannelWithEqualScalesBitForBit) {
  for (int flags : {0, kOffset})
    for (int aq = 0; aq < 4; ++aq) {
      IfaCase c{aq == 3 ? 32 : 0, 2, 0, 2, Quant::Tensor, 0, {40, 40, 40}, {40, 17, 1}, flags};
      const auto t = checked_ifa<half, i8>(c);
      c.quant = Quant::Channel;
      c.aq = aq;
      auto ch = build_ifa<half, i8, u8>(c);
      const size_t n = z(c.kvn * c.D);
      for (size_t i = 0; i < 2 * n; ++i) {
        ch.aqs[i] = t.aqs[i / n];
        if (flags) ch.aqo[i] = t.aqo[i / n];
      }
      run(ch);
      EXPECT_TRUE(support::bitwise_equal(t.out, ch.out)) << "shape " << aq << " flags " << flags;
    }
}

// kv_padding_size: each batch reads [S - pad - len, S - pad); masks, pse and per-token scales
// follow the positions; a window starting before 0 gives zeros; NaN everywhere else.
TEST(IncreFlashAttention, KvLeftPaddingMatchesReference) {
  unsigned seed = 700;
  for (const char* lay : {"BSH", "BSND", "BNSD"})
    for (Quant q : {Quant::None, Quant::Channel, Quant::Token})
      for (std::int64_t pad : {-3, 0, 5, 30}) {  // 30: batches 0 and 1 start before 0
        IfaCase c{0, 2, 1, 2, q, 1, {40, 40, 40}, {40, 17, 1}, kOffset | kNoFullMask};
        c.layout = lay;
        c.pad = pad;
        c.seed = seed++;
        ifa_check<half, u8>(c);
        ifa_check<bfloat16, bool>(c);
      }
  IfaCase one{0, 0, 0, 2, Quant::None, 0, {40}, {9}};  // batch 1: the list-of-one path
  one.pad = 6;
  checked_ifa<float, float>(one);
}

TEST(IncreFlashAttention, KvLeftPaddingEqualsTheWindowsAsTheirOwnTensorsBitForBit) {
  for (const char* lay : {"BSH", "BSND", "BNSD"})
    for (Quant q : {Quant::None, Quant::Channel}) {
      IfaCase c{0, 0, 0, 2, q, 0, {40, 40, 40}, {33, 17, 1}, kOffset};
      c.layout = lay;
      c.pad = 4;
      IfaCase w{1, 0, 0, 2, q, 0, {33, 17, 1}, {}, kOffset};  // B tensors of the window lengths
      w.layout = lay;
      w.seed = c.seed;
      if (q == Quant::None)
        EXPECT_TRUE(
            support::bitwise_equal(checked_ifa<half, half>(c).out, checked_ifa<half, half>(w).out));
      else
        EXPECT_TRUE(
            support::bitwise_equal(checked_ifa<half, i8>(c).out, checked_ifa<half, i8>(w).out));
    }
}

TEST(IncreFlashAttention, AntiquantPerTokenWithEqualScalesIsPerTensor) {
  for (int store : {0, 32})
    for (int flags : {0, kOffset}) {
      IfaCase c{store, 2, 0, 2, Quant::Tensor, 0, {40, 40, 40}, {40, 17, 1}, flags};
      if (store) c.S.clear();
      const auto t = checked_ifa<half, i8>(c);
      c.quant = Quant::Token;
      auto tk = build_ifa<half, i8, u8>(c);
      const size_t per = tk.tks.size() / 2;
      for (size_t i = 0; i < tk.tks.size(); ++i) {
        tk.tks[i] = float(t.aqs[i / per]);
        if (flags) tk.tko[i] = float(t.aqo[i / per]);
      }
      run(tk);
      EXPECT_TRUE(ulp_close(t.out, tk.out)) << "store " << store << " flags " << flags;
    }
}

// ATB PagedAttention on the same paged data: pse as ALIBI, the mask as an additive NORM mask
// of -inf (key 0 never masked: no row entirely masked), antiquant as DEQUANT_FUSION (integer
// offsets).
template <class T, class TKV>
void ifa_vs_paged_attention(const IfaCase& c) {
  using PP = attnref::PagedAttentionParams;
  const auto r = checked_ifa<T, TKV>(c);
  const int B = c.B();
  PP p;
  p.num_heads = c.N;
  p.num_kv_heads = c.kvn;
  p.qk_scale = static_cast<float>(c.scale);
  attnref::PagedAttentionInputs<T, TKV, T> in;
  in.query = StridedView<const T, 3>(r.qb.data(), {B, c.N, c.D});
  in.key_cache = StridedView<const TKV, 4>(r.ks[0].data(), {r.blocks, c.store, c.kvn, c.D});
  in.value_cache = StridedView<const TKV, 4>(r.vs[0].data(), {r.blocks, c.store, c.kvn, c.D});
  in.block_tables = StridedView<const std::int32_t, 2>(r.table.data(), {B, r.maxb});
  for (int b = 0; b < B; ++b) in.context_lens.push_back(c.len(b));
  std::vector<T> m;
  if (c.mrank) {
    p.mask_type = PP::MaskType::Norm;
    for (int b = 0; b < B; ++b)
      for (int j = 0; j < r.W; ++j) m.push_back(T(c.masked(b, j) ? -INFINITY : 0.0f));
    in.mask = StridedView<const T, 3>(m.data(), {B, 1, r.W});
  }
  if (c.pse) {
    p.mask_type = PP::MaskType::Alibi;
    in.alibi_mask = StridedView<const T, 4>(r.pse.data(), {r.pshape[0], c.N, 1, r.W});
  }
  std::vector<float> kd, vd;
  std::vector<std::int32_t> ko, vo;
  const Index n = c.kvn * c.D;
  for (size_t i = 0; i < r.aqs.size() / 2; ++i) {
    kd.push_back(static_cast<float>(r.aqs[i]));
    vd.push_back(static_cast<float>(r.aqs[z(n) + i]));
    if (c.flags & kOffset) {
      ko.push_back(static_cast<std::int32_t>(static_cast<float>(r.aqo[i])));
      vo.push_back(static_cast<std::int32_t>(static_cast<float>(r.aqo[z(n) + i])));
    }
  }
  if (!kd.empty()) {
    p.quant_type = PP::QuantType::DequantFusion;
    p.has_quant_offset = c.flags & kOffset;
    in.k_descale = StridedView<const float, 1>(kd.data(), {n});
    in.v_descale = StridedView<const float, 1>(vd.data(), {n});
    if (!ko.empty()) in.k_offset = StridedView<const std::int32_t, 1>(ko.data(), {n});
    if (!vo.empty()) in.v_offset = StridedView<const std::int32_t, 1>(vo.data(), {n});
  }
  std::vector<T> o(r.out.size(), T(7.0f));
  attnref::paged_attention(
      p, in, attnref::PagedAttentionOutputs<T>{StridedView<T, 3>(o.data(), {B, c.N, c.D})});
  EXPECT_TRUE(ulp_close(r.out, o)) << c.name();
}

TEST(IncreFlashAttention, EqualsAtbPagedAttention) {
  IfaCase c{16, 0, 0, 2, Quant::None, 0, {}, {40, 17, 1}, kNoFullMask};
  c.scale = 0.125;
  ifa_vs_paged_attention<half, half>(c);
  c.pse = 1;
  ifa_vs_paged_attention<bfloat16, bfloat16>(c);
  ifa_vs_paged_attention<float, float>(c);
  c.pse = 0;
  c.mrank = 2;
  ifa_vs_paged_attention<half, half>(c);
  ifa_vs_paged_attention<bfloat16, bfloat16>(c);
  c.mrank = 0;
  c.store = 32;
  c.quant = Quant::Channel;
  c.aq = 2;
  for (int offset : {0, kOffset}) {
    c.flags = kNoFullMask | offset;
    ifa_vs_paged_attention<half, i8>(c);
    ifa_vs_paged_attention<bfloat16, i8>(c);
  }
}

// Each edit must throw (std::invalid_argument, or std::out_of_range) naming `what`, before the
// output is written.
template <class TKV>
void ifa_rejected(const IfaCase& c,
                  const std::vector<std::pair<IfaEdit<half, TKV, u8>, std::string>>& edits,
                  bool out_of_range = false) {
  const auto built = build_ifa<half, TKV, u8>(c);
  for (const auto& [edit, what] : edits) {
    auto r = built;
    support::expect_throw([&] { run(r, edit); }, what, out_of_range);
    EXPECT_TRUE(untouched(r.out)) << what;
    // the validation alone: the same exception and message
    EXPECT_EQ(support::outcome([&] { run(r, edit, true); }),
              support::outcome([&] { run(r, edit); }))
        << what;
  }
  for (const auto& e : edits)
    if (!e.first) return;  // the case itself is the rejected call
  auto r = built;          // the unedited call: valid, and validate writes nothing
  EXPECT_EQ(support::outcome([&] { run(r, {}, true); }), "");
  EXPECT_TRUE(untouched(r.out));
}

TEST(IncreFlashAttention, Rejections) {
  using X = IfaCall<half, half, u8>;
  using X8 = IfaCall<half, i8, u8>;
  static const half aq[2] = {half(0.5f), half(0.5f)};
  // BSND, one [3, 40, 2, 32] tensor, lengths {40, 17, 1}, mask [3, 43], pse [3, 8, 1, 43].
  IfaCase c{0, 2, 1, 2, Quant::None, 0, {40, 40, 40}, {40, 17, 1}};
  ifa_rejected<half>(
      c,
      {{[](X& x) { x.in.query = support::reshaped(x.in.query, shp(3, 2, 8, 32)); }, "query"},
       {[](X& x) { x.p.input_layout = "TND"; }, "input_layout"},
       {[](X& x) { x.p.input_layout = "BNSD_BSND"; }, "input_layout"},
       {[](X& x) { x.p.num_heads = 4; }, "query"},
       {[](X& x) { x.p.num_key_value_heads = 16; }, "params.num_"},
       {[](X& x) { x.p.num_key_value_heads = -1; }, "num_key_value_heads"},
       {[](X& x) { x.in.key.push_back(x.in.key[0]), x.in.value.push_back(x.in.value[0]); }, "key"},
       {[](X& x) { x.in.value[0] = support::resized(x.in.value[0], 1, 39); }, "value"},
       {[](X& x) { x.in.actual_seq_lengths = lens(40, 41, 1); }, "actual_seq_lengths"},
       {[](X& x) { x.in.actual_seq_lengths = lens(-1); }, "actual_seq_lengths"},
       {[](X& x) { x.in.actual_seq_lengths = lens(40, 17); }, "actual_seq_lengths"},
       {[](X& x) { x.in.atten_mask = support::reshaped(x.in.atten_mask, shp(1, 43)); },
        "atten_mask"},
       {[](X& x) { x.in.atten_mask = support::reshaped(x.in.atten_mask, shp(3, 20)); },
        "atten_mask"},
       {[](X& x) { x.in.pse_shift = support::resized(x.in.pse_shift, 1, 4); }, "pse_shift"},
       {[](X& x) { x.in.pse_shift = support::reshaped(x.in.pse_shift, shp(3, 8, 2, 21)); },
        "pse_shift"},
       {[](X& x) { x.in.antiquant_scale = StridedView<const half>(aq, shp(2)); }, "antiquant"},
       {[](X& x) { x.p.inner_precise = 2; }, "inner_precise"},
       {[](X& x) { x.p.inner_precise = -1; }, "inner_precise"}});
  IfaCase l = c;  // B tensors
  l.store = 1;
  ifa_rejected<half>(
      l, {{[](X& x) { x.in.key.pop_back(); }, "key"},
          {[](X& x) { x.in.value[2] = support::resized(x.in.value[2], 3, 16); }, "value"}});
  IfaCase pg = c;  // paged, block size 16, table [3, 4], mask [3, 64]
  pg.store = 16;
  pg.S.clear();
  ifa_rejected<half>(
      pg, {{[](X& x) { x.in.actual_seq_lengths.clear(); }, "actual_seq_lengths"},
           {[](X& x) { x.p.block_size = 32; }, "block_size"},
           {[](X& x) { x.in.atten_mask = support::reshaped(x.in.atten_mask, shp(3, 63)); },
            "atten_mask"},
           {[](X& x) { x.in.key.push_back(x.in.key[0]), x.in.value.push_back(x.in.value[0]); },
            "key"}});
  static std::vector<std::int32_t> tbl;
  auto r = build_ifa<half, half, u8>(pg);
  tbl = r.table;
  tbl[z(1 * r.maxb + 1)] = r.blocks;  // batch 1 (17 tokens) uses two blocks
  ifa_rejected<half>(
      pg,
      {{[](X& x) { x.in.block_table = support::with_data(x.in.block_table, tbl.data()); },
        "block_table[1][1]"}},
      true);
  tbl = r.table;
  tbl[z(1 * r.maxb + 2)] = 1 << 20;  // past the used blocks: never read
  EXPECT_NO_THROW(run(r, IfaEdit<half, half, u8>([](X& x) {
                        x.in.block_table = support::with_data(x.in.block_table, tbl.data());
                      })));
  EXPECT_TRUE(matches(expected(r), r.out));
  IfaCase p4 = pg;  // [blockNum, KV_N, blockSize, D] needs BNSD
  p4.flags = kCache4d;
  ifa_rejected<half>(p4, {{nullptr, "key"}});
  for (int bs : {24, 528}) {
    IfaCase b = pg;
    b.store = bs;
    ifa_rejected<half>(b, {{nullptr, "block_size"}});
  }
  IfaCase q8 = c;  // int8 K / V, per channel (2, 2, 32) with an offset
  q8.quant = Quant::Channel;
  q8.aq = 2;
  q8.flags = kOffset;
  ifa_rejected<i8>(
      q8,
      {{[](X8& x) { x.in.antiquant_scale = {}; }, "antiquant_scale"},
       {[](X8& x) { x.in.antiquant_scale = support::reshaped(x.in.antiquant_scale, shp(2, 8, 8)); },
        "antiquant_scale"},
       {[](X8& x) { x.in.antiquant_scale = support::reshaped(x.in.antiquant_scale, shp(3)); },
        "antiquant_scale"},
       {[](X8& x) {
          x.in.antiquant_scale = support::reshaped(x.in.antiquant_scale, shp(2, 2, 2, 16));
        },
        "antiquant_scale"},
       {[](X8& x) { x.in.antiquant_offset = support::reshaped(x.in.antiquant_offset, shp(2, 64)); },
        "antiquant_offset"}});
  q8.store = 16;  // int8 K / V in blocks of 16
  q8.S.clear();
  ifa_rejected<i8>(q8, {{nullptr, "block_size"}});
  IfaCase tk = c;  // per token (2, 3, 43) with an offset
  tk.quant = Quant::Token;
  tk.flags = kOffset;
  ifa_rejected<i8>(
      tk, {{[](X8& x) { x.p.antiquant_mode = 2; }, "antiquant_mode"},
           {[](X8& x) { x.p.antiquant_mode = 0; }, "antiquant_scale_per_token"},
           {[](X8& x) { x.in.antiquant_scale = StridedView<const half>(aq, shp(2)); }, "antiquant"},
           {[](X8& x) {
              x.in.antiquant_scale_per_token =
                  support::reshaped(x.in.antiquant_scale_per_token, shp(2, 3, 39));
            },
            "per_token"},
           {[](X8& x) {
              x.in.antiquant_scale_per_token =
                  support::reshaped(x.in.antiquant_scale_per_token, shp(2, 1, 129));
            },
            "per_token"},
           {[](X8& x) {
              x.in.antiquant_scale_per_token =
                  support::reshaped(x.in.antiquant_scale_per_token, shp(1, 3, 43));
            },
            "per_token"},
           {[](X8& x) {
              x.in.antiquant_offset_per_token =
                  support::reshaped(x.in.antiquant_offset_per_token, shp(2, 3, 42));
            },
            "offset_per"},
           {[](X8& x) { x.in.antiquant_scale_per_token = {}; }, "antiquant_scale_per_token"}});
  static std::int64_t pad = 2;
  static const float tks[2] = {1.0f, 1.0f};
  ifa_rejected<half>(
      c, {{[](X& x) { x.p.antiquant_mode = 1; }, "antiquant_mode"},
          {[](X& x) { x.in.antiquant_scale_per_token = StridedView<const float>(tks, shp(2)); },
           "antiquant_scale_per_token"},
          {[](X& x) {
             x.in.kv_padding_size = {&pad, shp(2)};
           },
           "kv_padding_size"},
          {[](X& x) {
             x.in.kv_padding_size = {&pad, {}}, x.in.actual_seq_lengths.clear();
           },
           "kv_padding_size"},
          {[](X& x) {
             x.in.kv_padding_size = {&pad, {}},
             x.in.atten_mask = support::reshaped(x.in.atten_mask, shp(3, 37));
           },
           "atten_mask"}});
  ifa_rejected<half>(l, {{[](X& x) { x.in.kv_padding_size = {&pad, shp(1)}; }, "kv_padding_size"}});
  ifa_rejected<half>(pg, {{[](X& x) {
                             x.in.kv_padding_size = {&pad, shp(1)};
                           },
                           "kv_padding_size"}});
}

}  // namespace flash_attention_test
