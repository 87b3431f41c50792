// The MLA preprocessing stages one by one (include/attnref/mla/: ATB MlaPreprocess) against the
// independent reference tests/reference/mla_preprocess.hpp, in fp16 and bf16:
//  * rms_norm / rms_norm_quant in all four quant modes (with and without beta): int8 values,
//    descales, zero points and T outputs exactly equal; per-token properties (±127 at the row's
//    max |h|, an all-zero row);
//  * int8_matmul (per tensor with / without bias, per token, per token with zero point; weights
//    ND [out, in], ND [in, out] and NZ; de_scale as fp32 and as int64 bits; |acc| > 2^24) exactly
//    equal, bit-identical for 1 and 2 threads; float_matmul within 1 ulp, ND == NZ;
//  * rope_rotate_half exact (also in place; sin 0 / cos 1 is the identity); q_nope_absorb within
//    the fp32 accumulation bound, NZ wuk == ND;
//  * mla_reshape_and_cache in all four cache modes against caches built from the reference
//    (poisoned untouched slots, skipped negative slots, a slot mapped twice keeps the later
//    token); NzCache == KRopeCtkv in NZ, KvCache == KRopeCtkv concatenated.
// The whole mla_preprocess: mla_preprocess_test.cpp; bad input: mla_preprocess_rejects_test.cpp.

#include <gtest/gtest.h>

#include <attnref/core/nz.hpp>
#include <attnref/core/quant.hpp>
#include <attnref/mla/mla_preprocess.hpp>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mla/mla_preprocess_support.hpp"
#include "reference/mla_preprocess.hpp"
#include "support/cast.hpp"
#include "support/compare.hpp"

namespace mla_preprocess_stages_test {

using namespace mla_preprocess_support;

// ---------------------------------------------------------------------------------------------
// Stage 1-2: rms_norm and rms_norm_quant.

struct NormOut {
  std::vector<i8> q;
  std::vector<float> descale, zero_point;
};

template <class T>
void rms_norm_quant_case(int mode, Index rows, Index n, bool with_beta, unsigned seed) {
  SCOPED_TRACE(tname<T>() + " mode " + std::to_string(mode) + " rows " + std::to_string(rows) +
               " n " + std::to_string(n) + (with_beta ? " beta" : ""));
  Rng g(seed);
  const auto x = g.normal<T>(rows * n, 1.5), gamma = g.normal<T>(n, 0.3, 1.0),
             beta = g.normal<T>(n, 0.2);
  const T qs(0.02f);  // y / qs reaches past 127: some values saturate
  const i8 qo = -5;
  const auto want =
      rm::rms_norm_quant(mode, as_floats(x), static_cast<int>(rows), static_cast<int>(n),
                         as_floats(gamma), with_beta ? as_floats(beta) : std::vector<float>{},
                         static_cast<float>(qs), qo, kEps, dt_of<T>());
  attnref::RmsNormQuantInputs<T> in{StridedView<const T>(x.data(), {rows, n}),
                                    StridedView<const T>(gamma.data(), {n})};
  if (with_beta) in.beta = StridedView<const T>(beta.data(), {n});
  if (mode == 0) {
    in.quant_scale = StridedView<const T>(&qs, {1});
    in.quant_offset = StridedView<const i8>(&qo, {1});
  }
  std::vector<i8> q(z(rows * n), kPoison8);
  std::vector<float> d(z(rows), -1.0f), zp(z(rows), -1.0f);
  std::vector<T> u(z(rows * n), tpoison<T>());
  attnref::RmsNormQuantOutputs<T> out;
  if (mode == 3)
    out.unquant = StridedView<T>(u.data(), {rows, n});
  else
    out.q = StridedView<i8>(q.data(), {rows, n});
  if (mode == 1 || mode == 2) out.descale = StridedView<float>(d.data(), {rows});
  if (mode == 2) out.zero_point = StridedView<float>(zp.data(), {rows});
  attnref::rms_norm_quant<T>(static_cast<MlaQuantMode>(mode), kEps, in, out);
  if (mode == 3) {
    EXPECT_TRUE(equal_ref(u, want.unquant));
    return;
  }
  EXPECT_TRUE(support::bitwise_equal(q, want.q));
  if (mode != 0) {
    EXPECT_TRUE(support::bitwise_equal(d, want.descale)) << "descale";
  }
  if (mode == 2) {
    EXPECT_TRUE(support::bitwise_equal(zp, want.zero_point)) << "zero_point";
  }
}

TEST(MlaRmsNorm, RmsNormEqualsReferenceExactly) {
  for (Index rows : {1, 5})
    for (Index n : {1, 7, 96}) {
      auto run = [&](auto tag) {
        using T = decltype(tag);
        SCOPED_TRACE(tname<T>() + " rows " + std::to_string(rows) + " n " + std::to_string(n));
        Rng g(static_cast<unsigned>(rows * 100 + n));
        const auto x = g.normal<T>(rows * n, 2.0), gamma = g.normal<T>(n, 0.3, 1.0);
        const auto y = rm::rms_norm(as_floats(x), static_cast<int>(rows), static_cast<int>(n),
                                    as_floats(gamma), kEps);
        std::vector<float> want(y.size());
        for (size_t i = 0; i < y.size(); ++i) want[i] = rm::rnd(y[i], dt_of<T>());
        std::vector<T> out(z(rows * n), tpoison<T>());
        attnref::rms_norm<T>(StridedView<const T>(x.data(), {rows, n}),
                             StridedView<const T>(gamma.data(), {n}), kEps,
                             StridedView<T>(out.data(), {rows, n}));
        EXPECT_TRUE(equal_ref(out, want));
      };
      run(half{});
      run(bfloat16{});
    }
}

/// With T = float nothing rounds the fp32 core away: y = f(f(x · r) · gamma) (and f(y + beta)) bit
/// for bit, over many rows so that one differently ordered fp32 step shows.
TEST(MlaRmsNorm, Fp32CoreEqualsReferenceBitForBit) {
  for (Index n : {1, 7, 96, 512}) {
    SCOPED_TRACE("n " + std::to_string(n));
    const Index rows = 64;
    Rng g(static_cast<unsigned>(900 + n));
    const auto x = g.normal<float>(rows * n, 3.0), gamma = g.normal<float>(n, 0.5, 1.0),
               beta = g.normal<float>(n, 0.3);
    const auto y = rm::rms_norm(x, static_cast<int>(rows), static_cast<int>(n), gamma, kEps);
    std::vector<float> out(z(rows * n), NAN), outb(out);
    attnref::rms_norm<float>(StridedView<const float>(x.data(), {rows, n}),
                             StridedView<const float>(gamma.data(), {n}), kEps,
                             StridedView<float>(out.data(), {rows, n}));
    EXPECT_TRUE(support::bitwise_equal(out, y));
    attnref::RmsNormQuantInputs<float> in{StridedView<const float>(x.data(), {rows, n}),
                                          StridedView<const float>(gamma.data(), {n}),
                                          StridedView<const float>(beta.data(), {n})};
    attnref::rms_norm_quant<float>(MlaQuantMode::Unquant, kEps, in,
                                   {{}, {}, {}, StridedView<float>(outb.data(), {rows, n})});
    std::vector<float> yb(y.size());
    for (size_t i = 0; i < y.size(); ++i) yb[i] = rm::add(y[i], beta[i % z(n)]);
    EXPECT_TRUE(support::bitwise_equal(outb, yb)) << "with beta";
  }
}

TEST(MlaRmsNorm, RmsNormQuantEveryModeEqualsReferenceExactly) {
  unsigned seed = 1;
  for (int mode = 0; mode < 4; ++mode)
    for (Index rows : {1, 5})
      for (Index n : {1, 7, 96})
        for (bool beta : {false, true}) {
          rms_norm_quant_case<half>(mode, rows, n, beta, ++seed);
          rms_norm_quant_case<bfloat16>(mode, rows, n, beta, ++seed);
        }
}

/// Per-token symmetric: the element of largest |h| (h = T(y + beta), the Unquant output) is
/// quantized to ±127; all-zero rows give q = 0 and descale 0 (symmetric) and, asymmetric, scale 1
/// with zero point -128 (q = -128).
template <class T>
void per_token_properties() {
  SCOPED_TRACE(tname<T>());
  const Index rows = 4, n = 96;
  Rng g(11);
  auto x = g.normal<T>(rows * n);
  std::fill(x.begin() + 2 * n, x.begin() + 3 * n, T(0.0f));  // row 2 all zero
  const auto gamma = g.normal<T>(n, 0.3, 1.0);
  attnref::RmsNormQuantInputs<T> in{StridedView<const T>(x.data(), {rows, n}),
                                    StridedView<const T>(gamma.data(), {n})};
  std::vector<T> h(z(rows * n));
  attnref::rms_norm_quant<T>(MlaQuantMode::Unquant, kEps, in,
                             {{}, {}, {}, StridedView<T>(h.data(), {rows, n})});
  std::vector<i8> q(z(rows * n), kPoison8);
  std::vector<float> d(z(rows), -1.0f), zp(z(rows), -1.0f);
  attnref::rms_norm_quant<T>(
      MlaQuantMode::PerTokenSymm, kEps, in,
      {StridedView<i8>(q.data(), {rows, n}), StridedView<float>(d.data(), {rows})});
  for (Index r = 0; r < rows; ++r) {
    if (r == 2) {
      for (Index j = 0; j < n; ++j) EXPECT_EQ(q[z(r * n + j)], 0);
      EXPECT_EQ(d[z(r)], 0.0f);
      continue;
    }
    Index arg = 0;
    for (Index j = 1; j < n; ++j)
      if (std::fabs(dbl(h[z(r * n + j)])) > std::fabs(dbl(h[z(r * n + arg)]))) arg = j;
    EXPECT_EQ(q[z(r * n + arg)], dbl(h[z(r * n + arg)]) > 0 ? 127 : -127) << "row " << r;
    for (Index j = 0; j < n; ++j) EXPECT_LE(std::abs(int{q[z(r * n + j)]}), 127);
    EXPECT_GT(d[z(r)], 0.0f);
  }
  attnref::rms_norm_quant<T>(
      MlaQuantMode::PerTokenAsymm, kEps, in,
      {StridedView<i8>(q.data(), {rows, n}), StridedView<float>(d.data(), {rows}),
       StridedView<float>(zp.data(), {rows})});
  for (Index j = 0; j < n; ++j) EXPECT_EQ(q[z(2 * n + j)], -128);
  EXPECT_EQ(d[2], 1.0f);
  EXPECT_EQ(zp[2], -128.0f);
}

TEST(MlaRmsNorm, PerTokenSymmPutsPlusMinus127AtRowMaxAndZeroRowGivesZero) {
  per_token_properties<half>();
  per_token_properties<bfloat16>();
}

// ---------------------------------------------------------------------------------------------
// Stage 3: int8_matmul, float_matmul.

struct MmCase {
  int mode = 0;  // 0 per tensor, 1 per token, 2 per token with zero point
  bool bias = false;
  WeightFormat fmt = WeightFormat::NdOutIn;
  bool bits = false;
  Index M = 5, K = 96, N = 300;  // several work items (64 or 256 output channels each)
  bool large = false;            // values in [100, 127]: |acc| > 2^24
  unsigned seed = 1;
};

/// x through memory: keeps the compiler from fusing the product x came from with the next sum.
float no_fma(float x) {
  volatile float v = x;
  return v;
}

template <class T>
void int8_matmul_case(const MmCase& c) {
  SCOPED_TRACE(tname<T>() + " mode " + std::to_string(c.mode) + (c.bias ? " bias " : " ") +
               fmt_name(c.fmt) + (c.bits ? " bits" : " float") + " K " + std::to_string(c.K));
  Rng g(c.seed);
  const int lo = c.large ? 100 : -128, hi = 127;
  const auto a = g.ints(c.M * c.K, lo, hi), w = g.ints(c.N * c.K, lo, hi);
  const double acc_size = c.large ? double(c.K) * 12800.0 : std::sqrt(double(c.K)) * 5400.0;
  std::vector<float> ds(z(c.N)), d(z(c.M)), zp(z(c.M));
  std::vector<i64> dsb(z(c.N));
  std::vector<i32> bias(z(c.N));
  for (size_t n = 0; n < ds.size(); ++n) {
    ds[n] = static_cast<float>(4.0 * g.uni(0.5, 1.5) / acc_size);
    dsb[n] = static_cast<i64>(attnref::scale_to_bits(ds[n]));
    bias[n] = static_cast<i32>(g.uni(-3000, 3000));
  }
  for (size_t m = 0; m < d.size(); ++m) {
    d[m] = static_cast<float>(g.uni(0.5, 1.5));
    zp[m] = static_cast<float>(g.uni(-30, 30));
  }
  if (c.large) {  // the int32 -> fp32 rounding step is exercised
    bool inexact = false;
    for (Index m = 0; m < c.M; ++m)
      for (Index n = 0; n < c.N; ++n) {
        i64 acc = 0;
        for (Index k = 0; k < c.K; ++k) acc += i64{a[z(m * c.K + k)]} * w[z(n * c.K + k)];
        ASSERT_GT(acc, i64{1} << 24);
        inexact |= static_cast<i64>(static_cast<float>(acc)) != acc;
      }
    ASSERT_TRUE(inexact);
  }
  const auto want = rm::int8_matmul(c.mode, a, static_cast<int>(c.M), static_cast<int>(c.K), w,
                                    static_cast<int>(c.N), c.bias ? bias : std::vector<i32>{}, ds,
                                    c.mode ? d : std::vector<float>{},
                                    c.mode == 2 ? zp : std::vector<float>{}, dt_of<T>());
  std::vector<i8> keep;
  attnref::Int8MatmulInputs in{StridedView<const i8>(a.data(), {c.M, c.K}),
                               weight(w, c.N, c.K, c.fmt, keep)};
  if (c.bias) in.bias = StridedView<const i32>(bias.data(), {c.N});
  if (c.bits)
    in.de_scale_bits = StridedView<const i64>(dsb.data(), {c.N});
  else
    in.de_scale = StridedView<const float>(ds.data(), {c.N});
  if (c.mode) in.token_scale = StridedView<const float>(d.data(), {c.M});
  if (c.mode == 2) in.zero_point = StridedView<const float>(zp.data(), {c.M});
  std::vector<T> o1(z(c.M * c.N), tpoison<T>()), o2(o1);
  attnref::int8_matmul<T>(in, StridedView<T>(o1.data(), {c.M, c.N}), {1});
  attnref::int8_matmul<T>(in, StridedView<T>(o2.data(), {c.M, c.N}), {2});
  EXPECT_TRUE(equal_ref(o1, want));
  EXPECT_TRUE(support::bitwise_equal(o1, o2)) << "1 vs 2 threads";
  if (!c.large) return;
  // fp32 output: nothing hides the int32 -> fp32 rounding of acc. The definition's fp32 value,
  // composed from the reference's one-operation helpers, and proof that the step matters.
  std::vector<float> of(z(c.M * c.N), NAN), want_f(of.size());
  size_t step_matters = 0;
  for (Index m = 0; m < c.M; ++m)
    for (Index n = 0; n < c.N; ++n) {
      i64 acc = 0, colsum = 0;
      for (Index k = 0; k < c.K; ++k) {
        acc += i64{a[z(m * c.K + k)]} * w[z(n * c.K + k)];
        colsum += w[z(n * c.K + k)];
      }
      const double exact = double(acc + (c.bias ? bias[z(n)] : 0));
      float v = 0.0f, unrounded = 0.0f;
      if (c.mode == 0) {
        v = rm::mul(rm::f32(exact), ds[z(n)]);
        unrounded = rm::f32(exact * ds[z(n)]);
      } else if (c.mode == 1) {
        v = rm::mul(rm::mul(rm::f32(exact), ds[z(n)]), d[z(m)]);
        unrounded = rm::mul(rm::f32(exact * ds[z(n)]), d[z(m)]);
      } else {
        const float corr = rm::mul(zp[z(m)], rm::f32(double(colsum)));
        v = rm::mul(rm::mul(rm::sub(rm::f32(exact), no_fma(corr)), ds[z(n)]), d[z(m)]);
        unrounded = rm::mul(rm::mul(rm::f32(exact - double(corr)), ds[z(n)]), d[z(m)]);
      }
      want_f[z(m * c.N + n)] = v;
      step_matters += v != unrounded;
    }
  attnref::int8_matmul<float>(in, StridedView<float>(of.data(), {c.M, c.N}), {2});
  EXPECT_TRUE(support::bitwise_equal(of, want_f)) << "fp32 output";
  EXPECT_GT(step_matters, 0u);
}

TEST(MlaInt8Matmul, EveryModeFormatAndDeScaleFormEqualsReferenceExactly) {
  unsigned seed = 100;
  for (int mode = 0; mode < 3; ++mode)
    for (bool bias : {false, true}) {
      if (bias && mode != 0) continue;
      for (WeightFormat fmt : {WeightFormat::NdOutIn, WeightFormat::NdInOut, WeightFormat::Nz})
        for (bool bits : {false, true}) {
          MmCase c;
          c.M = bits ? 9 : 5;  // few tokens (the NZ streaming path) and more
          c.mode = mode;
          c.bias = bias;
          c.fmt = fmt;
          c.bits = bits;
          c.seed = ++seed;
          int8_matmul_case<half>(c);
          int8_matmul_case<bfloat16>(c);
        }
    }
}

TEST(MlaInt8Matmul, AccumulatorAbove2To24IsRoundedToFp32First) {
  for (int mode = 0; mode < 3; ++mode) {
    MmCase c;
    c.mode = mode;
    c.bias = mode == 0;
    c.M = 2;
    c.K = 7168;
    c.N = 16;
    c.large = true;
    c.fmt = mode == 1 ? WeightFormat::Nz : WeightFormat::NdOutIn;
    c.seed = 7 + static_cast<unsigned>(mode);
    int8_matmul_case<half>(c);
    int8_matmul_case<bfloat16>(c);
  }
}

template <class T>
void float_matmul_case() {
  SCOPED_TRACE(tname<T>());
  const Index M = 5, K = 96, N = 300;  // N > 256: two work items
  Rng g(3);
  const auto a = g.normal<T>(M * K), w = g.normal<T>(N * K, 0.1);
  const auto want = rm::float_matmul(as_floats(a), static_cast<int>(M), static_cast<int>(K),
                                     as_floats(w), static_cast<int>(N), dt_of<T>());
  std::vector<T> nd(z(M * N), tpoison<T>());
  std::vector<T> keep;
  attnref::float_matmul<T>(StridedView<const T>(a.data(), {M, K}),
                           weight(w, N, K, WeightFormat::NdOutIn, keep),
                           StridedView<T>(nd.data(), {M, N}), {1});
  // Within 1 ulp of T (fp32 GEMM vs the double sum), or the fp32 accumulation bound near zero.
  size_t bad = 0, off = 0;
  for (Index m = 0; m < M; ++m)
    for (Index n = 0; n < N; ++n) {
      double abs_sum = 0.0;
      for (Index k = 0; k < K; ++k)
        abs_sum += std::fabs(dbl(a[z(m * K + k)]) * dbl(w[z(n * K + k)]));
      const size_t i = z(m * N + n);
      const int u = ulps(nd[i], T(want[i]));
      off += u != 0;
      if (u > 1 &&
          std::fabs(dbl(nd[i]) - want[i]) > double(K) * 0x1p-24 * abs_sum + ulp_of<T>(want[i]))
        ++bad;
    }
  EXPECT_EQ(bad, 0u) << off << " of " << M * N << " differ by an ulp";
  for (WeightFormat fmt : {WeightFormat::NdInOut, WeightFormat::Nz})
    for (int threads : {1, 2}) {
      std::vector<T> o(z(M * N), tpoison<T>());
      attnref::float_matmul<T>(StridedView<const T>(a.data(), {M, K}), weight(w, N, K, fmt, keep),
                               StridedView<T>(o.data(), {M, N}), {threads});
      EXPECT_TRUE(support::bitwise_equal(o, nd)) << fmt_name(fmt) << " threads " << threads;
    }
}

TEST(MlaFloatMatmul, WithinOneUlpOfReferenceAndNzEqualsNd) {
  float_matmul_case<half>();
  float_matmul_case<bfloat16>();
}

// ---------------------------------------------------------------------------------------------
// Stages 4-5: rope_rotate_half, q_nope_absorb.

template <class T>
void rope_case(Index heads) {
  SCOPED_TRACE(tname<T>() + " heads " + std::to_string(heads));
  const Index N = 5, R = 16;
  Rng g(static_cast<unsigned>(20 + heads));
  const auto x = g.normal<T>(N * heads * R, 2.0);
  const auto [sn, cs] = sin_cos<T>(g, N, R);
  const auto want =
      to_t<T>(rm::rope(as_floats(x), static_cast<int>(N), static_cast<int>(heads),
                       static_cast<int>(R), as_floats(sn), as_floats(cs), dt_of<T>()));
  const StridedView<const T> s(sn.data(), {N, R}), c(cs.data(), {N, R});
  std::vector<T> o2(x.size(), tpoison<T>()), o3(o2);
  attnref::rope_rotate_half<T>(StridedView<const T>(x.data(), {N, heads * R}), s, c, heads,
                               StridedView<T>(o2.data(), {N, heads * R}));
  EXPECT_TRUE(support::bitwise_equal(o2, want)) << "[N, heads * R]";
  attnref::rope_rotate_half<T>(StridedView<const T>(x.data(), {N, heads, R}), s, c, heads,
                               StridedView<T>(o3.data(), {N, heads, R}));
  EXPECT_TRUE(support::bitwise_equal(o3, want)) << "[N, heads, R]";
  std::vector<T> buf = x;  // in place
  attnref::rope_rotate_half<T>(StridedView<const T>(buf.data(), {N, heads, R}), s, c, heads,
                               StridedView<T>(buf.data(), {N, heads, R}));
  EXPECT_TRUE(support::bitwise_equal(buf, want)) << "in place";
  // sin 0, cos 1: the identity.
  const std::vector<T> zero(z(N * R), T(0.0f)), one(z(N * R), T(1.0f));
  std::vector<T> id(x.size(), tpoison<T>());
  attnref::rope_rotate_half<T>(
      StridedView<const T>(x.data(), {N, heads * R}), StridedView<const T>(zero.data(), {N, R}),
      StridedView<const T>(one.data(), {N, R}), heads, StridedView<T>(id.data(), {N, heads * R}));
  EXPECT_TRUE(support::bitwise_equal(id, x)) << "identity";
}

TEST(MlaRope, RotateHalfEqualsReferenceExactlyAlsoInPlace) {
  for (Index heads : {1, 3}) {
    rope_case<half>(heads);
    rope_case<bfloat16>(heads);
  }
}

template <class T>
void absorb_case(Index P) {
  SCOPED_TRACE(tname<T>() + " P " + std::to_string(P));
  const Index N = 5, H = 3, C = 64;
  Rng g(static_cast<unsigned>(30 + P));
  const auto q = g.normal<T>(N * H * P), wuk = g.normal<T>(H * P * C, 0.3);
  const auto want = rm::q_wuk(as_floats(q), static_cast<int>(N), static_cast<int>(H),
                              static_cast<int>(P), as_floats(wuk), static_cast<int>(C));
  std::vector<float> nd(z(N * H * C), NAN);
  attnref::q_nope_absorb<T>(StridedView<const T>(q.data(), {N, H, P}),
                            {StridedView<const T>(wuk.data(), {H, P, C}), false},
                            StridedView<float>(nd.data(), {N, H, C}), {1});
  // Relative to Σ|q·w| (the fp32 accumulation bound), so cancellation does not matter.
  size_t bad = 0;
  for (Index t = 0; t < N; ++t)
    for (Index h = 0; h < H; ++h)
      for (Index c = 0; c < C; ++c) {
        double abs_sum = 0.0;
        for (Index k = 0; k < P; ++k)
          abs_sum += std::fabs(dbl(q[z((t * H + h) * P + k)]) * dbl(wuk[z((h * P + k) * C + c)]));
        const size_t i = z((t * H + h) * C + c);
        if (!(std::fabs(double(nd[i]) - want[i]) <= 1e-5 * abs_sum)) ++bad;
      }
  EXPECT_EQ(bad, 0u);
  const Nz<T> wnz = to_nz(wuk, H, P, C);
  ASSERT_EQ(wnz.shape[2], (P + 15) / 16 * 16);
  for (int threads : {1, 2}) {
    std::vector<float> o(z(N * H * C), NAN);
    attnref::q_nope_absorb<T>(StridedView<const T>(q.data(), {N, H, P}),
                              {StridedView<const T>(wnz.data.data(), {wnz.shape[0], wnz.shape[1],
                                                                      wnz.shape[2], wnz.shape[3]}),
                               true},
                              StridedView<float>(o.data(), {N, H, C}), {threads});
    EXPECT_TRUE(support::bitwise_equal(o, nd)) << "NZ, threads " << threads;
  }
}

TEST(MlaQNopeAbsorb, WithinFp32BoundOfReferenceAndNzEqualsNd) {
  for (Index P : {16, 20}) {
    absorb_case<half>(P);
    absorb_case<bfloat16>(P);
  }
}

// ---------------------------------------------------------------------------------------------
// Stage 6: mla_reshape_and_cache (the poisoned caches: mla_preprocess_support.hpp).

template <class T>
void reshape_case(int cm, Index bs) {
  SCOPED_TRACE(tname<T>() + " cache mode " + std::to_string(cm) + " bs " + std::to_string(bs));
  const Index N = 7, C = 64, R = 16, blocks = 3;
  Rng g(static_cast<unsigned>(40 + cm * 1000 + bs));
  const auto kn = g.normal<T>(N * C, 1.2), kr = g.normal<T>(N * R);
  const T qs3(0.02f);  // |k / qs3| passes 127 now and then: saturation included
  std::vector<i32> slots{5, -1, static_cast<i32>(blocks * bs - 1), static_cast<i32>(bs),
                         5, -3, static_cast<i32>(2 * bs - 1)};
  std::vector<i8> k8(kn.size());
  for (size_t i = 0; i < kn.size(); ++i)
    k8[i] = rm::k_nope_quant(static_cast<float>(kn[i]), static_cast<float>(qs3), dt_of<T>());
  Caches<T> got(cm, blocks, bs, C, R), want(cm, blocks, bs, C, R);
  want.write_expected(slots, as_floats(kn), as_floats(kr), k8, C, R);
  attnref::mla_reshape_and_cache<T>(
      static_cast<MlaCacheMode>(cm), StridedView<const T>(kn.data(), {N, C}),
      StridedView<const T>(kr.data(), {N, R}), StridedView<const i32>(slots.data(), {N}),
      cm == 2 ? StridedView<const T>(&qs3, {1}) : StridedView<const T>(), got.refs(C, R));
  EXPECT_TRUE(same_caches(got, want));
}

TEST(MlaReshapeAndCache, EveryCacheModeWritesExactlyTheMappedSlots) {
  for (int cm = 0; cm < 4; ++cm)
    for (Index bs : {16, 32, 128}) {
      if (cm < 2 && bs == 32) continue;  // ND: 16 and 128; NZ: multiples of 16
      if (cm >= 2 && bs == 16) continue;
      reshape_case<half>(cm, bs);
      reshape_case<bfloat16>(cm, bs);
    }
}

template <class T>
void reshape_metamorphic(Index bs) {
  SCOPED_TRACE(tname<T>() + " bs " + std::to_string(bs));
  const Index N = 7, C = 64, R = 16, blocks = 2;
  Rng g(50);
  const auto kn = g.normal<T>(N * C), kr = g.normal<T>(N * R);
  const auto slots = make_slots(N, blocks * bs);
  auto run = [&](int cm) {
    Caches<T> c(cm, blocks, bs, C, R);
    attnref::mla_reshape_and_cache<T>(static_cast<MlaCacheMode>(cm),
                                      StridedView<const T>(kn.data(), {N, C}),
                                      StridedView<const T>(kr.data(), {N, R}),
                                      StridedView<const i32>(slots.data(), {N}), {}, c.refs(C, R));
    return c;
  };
  const Caches<T> kv = run(0), split = run(1), nz = run(3);
  // KvCache == concat(ctkv, krope) row by row (poisoned rows included).
  std::vector<T> cat;
  for (Index r = 0; r < blocks * bs; ++r) {
    cat.insert(cat.end(), split.ctkv.begin() + r * C, split.ctkv.begin() + (r + 1) * C);
    cat.insert(cat.end(), split.krope.begin() + r * R, split.krope.begin() + (r + 1) * R);
  }
  EXPECT_TRUE(support::bitwise_equal(kv.kv, cat)) << "KvCache vs KRopeCtkv";
  // NzCache after nz_to_nd == KRopeCtkv.
  auto to_nd = [&](const std::vector<T>& v, Index w) {
    std::vector<T> nd(z(blocks * bs * w));
    attnref::nz_to_nd<T>(StridedView<const T, 4>(v.data(), {blocks, w / 16, bs, 16}),
                         StridedView<T, 3>(nd.data(), {blocks, bs, w}));
    return nd;
  };
  EXPECT_TRUE(support::bitwise_equal(to_nd(nz.ctkv, C), split.ctkv)) << "NzCache ctkv";
  EXPECT_TRUE(support::bitwise_equal(to_nd(nz.krope, R), split.krope)) << "NzCache krope";
}

TEST(MlaReshapeAndCache, NzCacheIsKRopeCtkvInNzAndKvCacheIsTheirConcatenation) {
  reshape_metamorphic<half>(128);
  reshape_metamorphic<bfloat16>(128);
  reshape_metamorphic<half>(32);
}

}  // namespace mla_preprocess_stages_test
