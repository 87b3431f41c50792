// FusedInferAttentionScore's left padding with Q_S > 1 (query_padding_size / kv_padding_size in
// the prompt branch, docs/fia.md#left-padding): batch b's query rows are [S1 - qpad - qlen_b,
// S1 - qpad) and its keys [S2 - kvpad - kvlen_b, S2 - kvpad); a present tensor means left-padded
// data even with the value 0, a negative value counts as 0. Against the independent reference
// (tests/reference/cann_flash_attention.hpp) on the windows, with the sparse 0 / 1 mask and pse
// read at the padded positions and the diagonals of modes 2–4 anchored in the windows; every row
// outside a window 0 with lse +inf; the data outside the windows NaN (never read). Metamorphic:
// a padded call == the same windows unpadded, bit for bit (fp16, int8 and the combined antiquant;
// sparse 0's pre / next ignored under padding); thread counts; query_padding_size with Q_S == 1
// changes nothing; every rule's rejection leaves the output untouched.

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/cann/fused_infer_attention_score.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cann/fia_support.hpp"
#include "cann/flash_attention_support.hpp"
#include "reference/cann_flash_attention.hpp"
#include "support/cast.hpp"
#include "support/errors.hpp"

namespace fia_padding_test {

using namespace flash_attention_support;
using attnref::FusedInferAttentionScoreInputs;
using attnref::FusedInferAttentionScoreOutputs;
using attnref::FusedInferAttentionScoreParams;

struct Case {
  std::string layout = "BSND";
  std::vector<int> Q{5, 7, 2};    // query lengths (S1 9)
  std::vector<int> L{17, 20, 0};  // kv lengths (S2 23)
  int S1 = 9, S2 = 23, N = 4, kvn = 2, D = 32;
  bool qp = true, kvp = true;        // the padding tensors given
  std::int64_t qpad = 2, kvpad = 3;  // their values
  int sparse = 0;                    // 0 and 1: a [B, S1, S2] mask
  bool mask = true;                  // (sparse 0 only) a mask given
  bool pse = false;
  int inner = 1;
  unsigned seed = 1;
  int B() const { return static_cast<int>(Q.size()); }
  // The window starts (no tensor: 0, the data right-padded).
  int qs(int b) const {
    return qp ? S1 - static_cast<int>(std::max<std::int64_t>(0, qpad)) - Q[z(b)] : 0;
  }
  int ks(int b) const {
    return kvp ? S2 - static_cast<int>(std::max<std::int64_t>(0, kvpad)) - L[z(b)] : 0;
  }
  bool full_mask() const { return sparse == 1 || (sparse == 0 && mask); }
};

// The case's data: q / k / v (T, TKV) with the windows at the case's starts (`padded`) or at 0,
// the same values either way; a full mask and pse whose in-window values follow the window
// (logical coordinates), random elsewhere.
template <class T, class TKV>
struct Built {
  Case c;
  bool padded = true;
  Seqs q, k, v;  // the windows as the reference reads them
  std::vector<T> qb;
  std::vector<TKV> kb, vb;
  std::vector<u8> mask;
  std::vector<typename attnref::detail::pfa_pse<T>::type> pse;
  std::vector<std::int64_t> qpad, kvpad;
  int qs(int b) const { return padded ? c.qs(b) : 0; }
  int ks(int b) const { return padded ? c.ks(b) : 0; }
};

template <class X>
X value_of(std::mt19937& rng) {
  if constexpr (std::is_same_v<X, i8>) {
    return i8(std::uniform_int_distribution<int>(-100, 100)(rng));
  } else {
    std::normal_distribution<double> nd;
    return X(static_cast<float>(nd(rng)));
  }
}

template <class X>
std::vector<X> rows(const Case& c, const Dims& d, const std::vector<int>& len,
                    const std::function<int(int)>& start, unsigned seed, Seqs& seqs) {
  std::mt19937 rng(seed);
  std::vector<X> buf(d.size(), poison<X>());
  seqs.assign(len.size(), {});
  for (int b = 0; b < c.B(); ++b)
    for (int s = 0; s < len[z(b)]; ++s)
      for (int n = 0; n < d.N; ++n)
        for (int e = 0; e < d.D; ++e) {
          const X x = value_of<X>(rng);
          buf[d.at(b, start(b) + s, n, e)] = x;
          seqs[z(b)].push_back(dbl(x));
        }
  return buf;
}

template <class T, class TKV>
Built<T, TKV> build(const Case& c, bool padded) {
  Built<T, TKV> r;
  r.c = c;
  r.padded = padded;
  const std::string lay = c.layout == "BNSD_BSND" ? "BNSD" : c.layout;
  const Dims qd{lay, c.B(), c.S1, c.N, c.D, {}}, kd{lay, c.B(), c.S2, c.kvn, c.D, {}};
  const auto qs = [&r](int b) { return r.qs(b); };
  const auto ks = [&r](int b) { return r.ks(b); };
  r.qb = rows<T>(c, qd, c.Q, qs, c.seed, r.q);
  r.kb = rows<TKV>(c, kd, c.L, ks, c.seed + 1, r.k);
  r.vb = rows<TKV>(c, kd, c.L, ks, c.seed + 2, r.v);
  // In-window elements from the logical position, the rest from the physical one.
  const auto inside = [&](int b, int i, int j) {
    return i >= r.qs(b) && i < r.qs(b) + c.Q[z(b)] && j >= r.ks(b) && j < r.ks(b) + c.L[z(b)];
  };
  if (c.full_mask()) {
    r.mask.resize(z(c.B() * c.S1 * c.S2));
    for (int b = 0; b < c.B(); ++b)
      for (int i = 0; i < c.S1; ++i)
        for (int j = 0; j < c.S2; ++j)
          r.mask[z((b * c.S1 + i) * c.S2 + j)] = inside(b, i, j)
                                                     ? hv(c.seed, b, i - r.qs(b), j - r.ks(b)) < 0.3
                                                     : hv(c.seed + 9, b, i, j) < 0.5;
  } else if (c.sparse >= 2) {
    r.mask.assign(2048 * 2048, 0);
    for (int i = 0; i < 2048; ++i)
      for (int j = i + 1; j < 2048; ++j) r.mask[z(i * 2048 + j)] = 1;
  }
  if (c.pse)
    for (int b = 0; b < c.B(); ++b)
      for (int h = 0; h < c.N; ++h)
        for (int i = 0; i < c.S1; ++i)
          for (int j = 0; j < c.S2; ++j)
            r.pse.emplace_back(static_cast<float>(
                inside(b, i, j) ? 2 * hv(c.seed + 3, b * c.N + h, i - r.qs(b), j - r.ks(b)) - 1
                                : 50 * hv(c.seed + 4, b * c.N + h, i, j)));
  if (padded) {
    r.qpad = {c.qpad};
    r.kvpad = {c.kvpad};
  }
  return r;
}

template <class T, class TKV>
struct Call {
  FusedInferAttentionScoreParams p;
  FusedInferAttentionScoreInputs<T, TKV> in;
  Shape oshape;
};

// The call of `r`: sparse 0 with padding gets pre / next tokens 1 / 0 (ignored), without it none.
template <class T, class TKV>
Call<T, TKV> call_of(const Built<T, TKV>& r) {
  const Case& c = r.c;
  Call<T, TKV> x;
  x.p.num_heads = c.N;
  x.p.num_key_value_heads = c.kvn;
  x.p.scale_value = std::is_same_v<T, i8> ? 0.5 : 0.125;
  x.p.input_layout = c.layout;
  x.p.sparse_mode = c.sparse;
  x.p.inner_precise = c.inner;
  x.p.pre_tokens = c.sparse == 4 ? 4 : (r.padded ? 1 : kInf);
  x.p.next_tokens = c.sparse == 4 ? 1 : (r.padded ? 0 : kInf);
  const std::string lay = c.layout == "BNSD_BSND" ? "BNSD" : c.layout;
  const Shape qs = Dims{lay, c.B(), c.S1, c.N, c.D, {}}.shape();
  const Shape ks = Dims{lay, c.B(), c.S2, c.kvn, c.D, {}}.shape();
  x.oshape = c.layout == "BNSD_BSND" ? shp(c.B(), c.S1, c.N, c.D) : qs;
  x.in.query = {r.qb.data(), qs};
  x.in.key = {{r.kb.data(), ks}};
  x.in.value = {{r.vb.data(), ks}};
  for (int q : c.Q) x.in.actual_seq_lengths.push_back(q);
  for (int l : c.L) x.in.actual_seq_lengths_kv.push_back(l);
  if (c.full_mask()) x.in.atten_mask = {r.mask.data(), shp(c.B(), c.S1, c.S2)};
  if (c.sparse >= 2) x.in.atten_mask = {r.mask.data(), shp(2048, 2048)};
  if (c.pse) x.in.pse_shift = {r.pse.data(), shp(c.B(), c.N, c.S1, c.S2)};
  if (r.padded && c.qp) x.in.query_padding_size = {r.qpad.data(), shp(1)};
  if (r.padded && c.kvp) x.in.kv_padding_size = {r.kvpad.data(), shp(1)};
  return x;
}

template <class T, class TKV>
std::vector<half> run(const Call<T, TKV>& x, std::vector<float>* lse = nullptr, int threads = 0) {
  Index n = 1;
  for (Index e : x.oshape) n *= e;
  std::vector<half> out(z(n), half(7.0f));
  FusedInferAttentionScoreOutputs<half> o{{out.data(), x.oshape}};
  FusedInferAttentionScoreParams p = x.p;
  if (lse != nullptr) {
    p.softmax_lse_flag = true;
    const bool head_major = x.p.input_layout == "BNSD" || x.p.input_layout == "BNSD_BSND";
    const Index B = x.oshape[0], S1 = x.in.query.size(head_major ? 2 : 1);
    lse->assign(z(B * p.num_heads * S1), 7.0f);
    o.softmax_lse = {lse->data(), shp(B, p.num_heads, S1, 1)};
  }
  attnref::fused_infer_attention_score(p, x.in, o, {threads});
  return out;
}

// Element (b, row i, head h, d) of the output (BSND-like except BNSD).
double out_at(const Case& c, const std::vector<half>& o, int b, int i, int h, int d) {
  const size_t at = c.layout == "BNSD" ? z(((b * c.N + h) * c.S1 + i) * c.D + d)
                                       : z(((b * c.S1 + i) * c.N + h) * c.D + d);
  return dbl(o[at]);
}

void check_reference(const Case& c) {
  SCOPED_TRACE(c.layout + " sparse " + std::to_string(c.sparse) + " qpad " +
               (c.qp ? std::to_string(c.qpad) : "-") + " kvpad " +
               (c.kvp ? std::to_string(c.kvpad) : "-"));
  const auto r = build<half, half>(c, true);
  const auto x = call_of(r);
  std::vector<float> lse;
  const auto out = run(x, &lse);
  ref::cann::Pfa pr;
  pr.num_heads = c.N;
  pr.num_kv_heads = c.kvn;
  pr.head_size = pr.v_head_size = c.D;
  pr.q_len = c.Q;
  pr.kv_len = c.L;
  pr.scale = 0.125;
  pr.sparse_mode = c.sparse;
  pr.inner_precise = c.inner;
  pr.pre = c.sparse == 4 ? 4 : kInf;  // sparse 0 under padding: pre / next ignored
  pr.next = c.sparse == 4 ? 1 : kInf;
  pr.has_mask = !r.mask.empty();
  // The mask and pse at the padded (physical) positions.
  if (c.full_mask())
    pr.mask = [&](int b, int i, int j) {
      return r.mask[z((b * c.S1 + r.qs(b) + i) * c.S2 + r.ks(b) + j)] != 0;
    };
  if (c.pse)
    pr.pse = [&](int b, int h, int i, int j) {
      return dbl(r.pse[z(((b * c.N + h) * c.S1 + r.qs(b) + i) * c.S2 + r.ks(b) + j)]);
    };
  Seqs ref_lse;
  const Seqs want = ref::cann::pfa(pr, r.q, r.k, r.v, &ref_lse);
  std::vector<double> w;
  std::vector<half> g;
  bool others_zero = true, lse_ok = true;
  for (int b = 0; b < c.B(); ++b)
    for (int i = 0; i < c.S1; ++i) {
      const int wi = i - r.qs(b);
      const bool in = wi >= 0 && wi < c.Q[z(b)];
      for (int h = 0; h < c.N; ++h) {
        for (int d = 0; d < c.D; ++d) {
          const double o = out_at(c, out, b, i, h, d);
          if (!in) {
            others_zero = others_zero && o == 0.0;
            continue;
          }
          w.push_back(want[z(b)][z((wi * c.N + h) * c.D + d)]);
          g.push_back(half(static_cast<float>(o)));
        }
        const float gl = lse[z((b * c.N + h) * c.S1 + i)];
        const double wl = in ? ref_lse[z(b)][z(h * c.Q[z(b)] + wi)] : INFINITY;
        const bool ok =
            std::isinf(wl) ? gl == INFINITY : std::abs(gl - wl) <= 1e-4 + 2e-5 * std::abs(wl);
        if (!ok)
          ADD_FAILURE() << "lse (" << b << ", " << h << ", " << i << ") = " << gl << ", want "
                        << wl;
        lse_ok = lse_ok && ok;
      }
    }
  EXPECT_TRUE(others_zero) << "a row outside its window is not 0";
  EXPECT_TRUE(matches(w, g));
  const auto o1 = run(x, nullptr, 1), o2 = run(x, nullptr, 2);
  EXPECT_EQ(std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(half)), 0)
      << "thread count changed the bits";
}

TEST(FiaLeftPadding, MatchesReference) {
  unsigned seed = 1;
  for (const std::string lay : {"BSH", "BSND", "BNSD", "BNSD_BSND"})
    for (int sparse : {0, 1, 2, 3, 4}) {
      Case c;
      c.layout = lay;
      c.sparse = sparse;
      c.pse = sparse == 0 || sparse == 3;
      c.inner = sparse == 1 ? 3 : 1;  // bit 1 set: masked keys excluded, empty rows 0
      c.seed = seed++;
      check_reference(c);
    }
}

// One of the two tensors; a zero value (the data still right-aligned: the last rows); a negative
// value (counted as 0); windows that fill the view; sparse 0 without a mask.
TEST(FiaLeftPadding, VariantsMatchReference) {
  Case c;
  c.kvp = false;
  check_reference(c);
  c = Case{};
  c.qp = false;
  c.layout = "BNSD";
  check_reference(c);
  c = Case{};
  c.qpad = 0;
  c.kvpad = -5;
  c.pse = true;
  check_reference(c);
  c = Case{};
  c.Q = {9, 1, 4};
  c.L = {23, 6, 23};
  c.qpad = c.kvpad = 0;
  c.sparse = 3;
  check_reference(c);
  c = Case{};
  c.mask = false;
  c.pse = true;
  c.layout = "BSH";
  check_reference(c);
}

// The output rows (b, window row i) of a padded and an unpadded call of the same windows.
template <class T, class TKV>
void expect_padded_equals_unpadded(const Case& c, const std::function<void(Call<T, TKV>&)>& edit) {
  SCOPED_TRACE(c.layout + " sparse " + std::to_string(c.sparse));
  const auto rp = build<T, TKV>(c, true), ru = build<T, TKV>(c, false);
  auto xp = call_of(rp), xu = call_of(ru);
  edit(xp);
  edit(xu);
  std::vector<float> lp, lu;
  const auto op = run(xp, &lp), ou = run(xu, &lu);
  bool same = true, lse_same = true;
  for (int b = 0; b < c.B(); ++b)
    for (int i = 0; i < c.Q[z(b)]; ++i)
      for (int h = 0; h < c.N; ++h) {
        for (int d = 0; d < c.D; ++d) {
          const double a = out_at(c, op, b, rp.qs(b) + i, h, d), e = out_at(c, ou, b, i, h, d);
          same = same && std::memcmp(&a, &e, sizeof a) == 0;
        }
        const float a = lp[z((b * c.N + h) * c.S1 + rp.qs(b) + i)];
        const float e = lu[z((b * c.N + h) * c.S1 + i)];
        lse_same = lse_same && std::memcmp(&a, &e, sizeof a) == 0;
      }
  EXPECT_TRUE(same) << "padded and unpadded outputs differ";
  EXPECT_TRUE(lse_same) << "padded and unpadded softmax_lse differ";
  const auto o1 = run(xp, nullptr, 1), o2 = run(xp, nullptr, 2);
  EXPECT_EQ(std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(half)), 0)
      << "thread count changed the bits";
}

TEST(FiaLeftPadding, PaddedEqualsUnpaddedBitForBit) {
  for (int sparse : {0, 3}) {
    Case c;
    c.sparse = sparse;
    c.pse = sparse == 0;
    expect_padded_equals_unpadded<half, half>(c, [](auto&) {});
  }
  // int8 query / key / value (P quantized block by block from key 0 of the window).
  std::vector<float> deq1{0.002f}, qs1{100.0f}, deq2{0.01f};
  for (const std::string lay : {"BSH", "BNSD"}) {
    Case c;
    c.layout = lay;
    c.sparse = 3;
    c.S2 = 300;
    c.L = {250, 297, 130};
    expect_padded_equals_unpadded<i8, i8>(c, [&](Call<i8, i8>& x) {
      x.p.quant_block_size = 64;
      x.in.deq_scale1 = {deq1.data(), shp(1)};
      x.in.quant_scale1 = {qs1.data(), shp(1)};
      x.in.deq_scale2 = {deq2.data(), shp(1)};
    });
  }
  // int8 key / value with the combined antiquant_scale (fp16 query), per tensor.
  std::vector<half> aq{half(0.02f), half(0.03f)};
  Case c;
  c.layout = "BSND";
  expect_padded_equals_unpadded<half, i8>(c, [&](Call<half, i8>& x) {
    x.in.antiquant_scale = {aq.data(), shp(2)};
  });
}

// With Q_S == 1 (the incremental branch) query_padding_size is invalid, so ignored.
TEST(FiaLeftPadding, QueryPaddingIgnoredWithOneQueryRow) {
  Case c;
  c.S1 = 1;
  c.Q = {1, 1, 1};
  c.qpad = 0;
  c.kvp = false;
  c.mask = false;
  const auto r = build<half, half>(c, true);
  auto with = call_of(r), without = call_of(r);
  without.in.query_padding_size = {};
  EXPECT_FALSE(with.in.query_padding_size.absent());
  const auto a = run(with), b = run(without);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(half)), 0);
}

TEST(FiaLeftPadding, Rejections) {
  Case c;
  const auto r = build<half, half>(c, true);
  const auto rejected = [&](const std::function<void(Call<half, half>&)>& edit,
                            const std::string& frag) {
    auto x = call_of(r);
    edit(x);
    fia_support::expect_rejected<half>(x, x.oshape, frag);
  };
  const std::vector<std::int64_t> two{1, 1}, big{3}, big_kv{4};
  rejected(
      [&](auto& x) {
        x.in.query_padding_size = {two.data(), shp(2)};
      },
      "query_padding_size.shape");
  rejected(
      [&](auto& x) {
        x.in.kv_padding_size = {two.data(), shp(1, 2)};
      },
      "kv_padding_size.shape");
  rejected([&](auto& x) { x.in.actual_seq_lengths.clear(); }, "given without actual_seq_lengths");
  rejected([&](auto& x) { x.in.actual_seq_lengths_kv.clear(); },
           "given without actual_seq_lengths_kv");
  // 3 + 7 rows do not fit in S1 9; 4 + 20 keys not in S2 23.
  rejected(
      [&](auto& x) {
        x.in.query_padding_size = {big.data(), shp(1)};
      },
      "actual_seq_lengths[1] = 7 starts the window before position 0");
  rejected(
      [&](auto& x) {
        x.in.kv_padding_size = {big_kv.data(), shp(1)};
      },
      "actual_seq_lengths_kv[1] = 20 starts the window before position 0");
  std::vector<std::int32_t> table(3, 0);
  rejected([&](auto& x) { x.in.block_table = {table.data(), shp(3, 1)}; }, "paged cache");
  std::vector<float> q2(z(c.N * c.D), 1.0f);
  rejected(
      [&](auto& x) {
        x.in.quant_scale2 = {q2.data(), shp(c.N * c.D)};
      },
      "per-channel quant_scale2");
  const std::vector<std::int64_t> plen{4};
  rejected(
      [&](auto& x) {
        x.in.key_shared_prefix = x.in.key[0];
        x.in.value_shared_prefix = x.in.value[0];
        x.in.actual_shared_prefix_len = plen;
        x.in.kv_padding_size = {};
      },
      "query left padding");
  rejected(
      [&](auto& x) {
        x.in.key_shared_prefix = x.in.key[0];
        x.in.value_shared_prefix = x.in.value[0];
      },
      "kv left padding");
  // TND (the query's T rows) and tensor lists.
  rejected(
      [&](auto& x) {
        x.p.input_layout = "TND";
        x.p.sparse_mode = 3;
        x.in.atten_mask = {r.mask.data(), shp(2048, 2048)};
        x.in.query = {r.qb.data(), shp(14, c.N, c.D)};
        x.in.key = {{r.kb.data(), shp(37, c.kvn, c.D)}};
        x.in.value = {{r.vb.data(), shp(37, c.kvn, c.D)}};
        x.in.actual_seq_lengths = lens(5, 12, 14);
        x.in.actual_seq_lengths_kv = lens(17, 37, 37);
        x.in.pse_shift = {};
        x.oshape = shp(14, c.N, c.D);
      },
      "TND");
  // The separate K / V antiquant: int8 key / value with a bf16 query.
  using bf = attnref::bfloat16;
  const auto rb = build<bf, i8>(c, true);
  auto x = call_of(rb);
  x.p.key_antiquant_mode = x.p.value_antiquant_mode = 0;
  std::vector<float> sc(z(c.kvn * c.D), 0.01f);
  x.in.key_antiquant_scale = x.in.value_antiquant_scale = {sc.data(), shp(c.kvn, c.D)};
  std::vector<bf> out(z(c.B() * c.S1 * c.N * c.D), bf(7.0f));
  support::expect_rejected_by(
      [&] {
        attnref::fused_infer_attention_score(
            x.p, x.in, FusedInferAttentionScoreOutputs<bf>{{out.data(), x.oshape}});
      },
      "fused_infer_attention_score", {"separate key / value antiquant"});
  EXPECT_TRUE(untouched(out));
}

}  // namespace fia_padding_test
