// The MLA preprocessing stages (include/attnref/mla/: ATB MlaPreprocess) against the independent
// reference tests/reference/mla_preprocess.hpp, in fp16 and bf16:
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
//    token); NzCache == KRopeCtkv in NZ, KvCache == KRopeCtkv concatenated;
//  * mla_preprocess in every quant mode x cache mode x dtype, ND and NZ weights, N 1 / 5 / 7,
//    against ref::mla::chain (quantized modes: exact except T(q_nope), 1 ulp, and int8 q_nope,
//    ±1; Unquant: within tolerance), once at the DeepSeek-V3 dims. Metamorphic, bit for bit:
//    ND == NZ weights, de_scale == de_scale_bits, 1 == 2 threads, KvCache == KRopeCtkv split,
//    NzCache == KRopeCtkv in NZ; Int8NzCache dequantized ≈ NzCache within the quantization step;
//  * bad input: every rejection names the argument and leaves outputs and caches untouched.

#include "reference/mla_preprocess.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <attnref/core/nz.hpp>
#include <attnref/core/quant.hpp>
#include <attnref/mla/mla_preprocess.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "support/cast.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"
#include "support/views.hpp"

namespace mla_preprocess_test {

using attnref::bfloat16;
using attnref::half;
using attnref::Index;
using attnref::MlaCacheMode;
using attnref::MlaQuantMode;
using attnref::StridedView;
using attnref::WeightFormat;
using attnref::WeightRef;
using i8 = std::int8_t;
using i32 = std::int32_t;
using i64 = std::int64_t;
using support::dbl;
using support::z;
namespace rm = ref::mla;

constexpr i8 kPoison8 = -77;  // int8 has no NaN: untouched int8 slots keep this sentinel
constexpr float kEps = 1e-5f;

// ---------------------------------------------------------------------------------------------
// Helpers.

template <class T>
constexpr rm::Dt dt_of() {
  return std::is_same_v<T, half> ? rm::Dt::F16 : rm::Dt::BF16;
}
template <class T>
constexpr support::Kind kind_of() {
  return std::is_same_v<T, half> ? support::Kind::F16 : support::Kind::BF16;
}
template <class T>
std::string tname() {
  return std::is_same_v<T, half> ? "f16" : "bf16";
}
template <class T>
T tpoison() {
  return T(std::numeric_limits<float>::quiet_NaN());
}

template <class U>
double as_d(U x) {
  if constexpr (std::is_same_v<U, i8>)
    return x;
  else
    return static_cast<double>(static_cast<float>(x));
}

template <class T>
std::vector<float> fl(const std::vector<T>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = static_cast<float>(v[i]);
  return r;
}
template <class T>
std::vector<T> to_t(const std::vector<float>& v) {
  std::vector<T> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = T(v[i]);
  return r;
}
template <class T>
std::vector<double> to_d(const std::vector<T>& v) {
  std::vector<double> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = as_d(v[i]);
  return r;
}

/// Bitwise equality (NaNs with equal bits are equal).
template <class U>
::testing::AssertionResult same(const std::vector<U>& got, const std::vector<U>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  size_t diff = 0, first = got.size();
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(U)) != 0) {
      if (first == got.size()) first = i;
      ++diff;
    }
  if (diff == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << diff << " of " << got.size() << " differ; first [" << first << "] got "
         << as_d(got[first]) << ", want " << as_d(want[first]);
}

/// got (T) exactly equal to the reference's T values (floats).
template <class T>
::testing::AssertionResult equal_ref(const std::vector<T>& got, const std::vector<float>& want) {
  return same(got, to_t<T>(want));
}

template <class T>
int ulps(T a, T b) {
  auto key = [](T x) {
    std::uint16_t u = 0;
    std::memcpy(&u, &x, sizeof u);
    return (u & 0x8000u) ? -static_cast<int>(u & 0x7fffu) : static_cast<int>(u & 0x7fffu);
  };
  return std::abs(key(a) - key(b));
}

/// The spacing of T at v.
template <class T>
double ulp_of(double v) {
  constexpr int mant = std::is_same_v<T, half> ? 10 : 7;
  constexpr double min_normal = std::is_same_v<T, half> ? 6.103515625e-05 : 1.1754943508222875e-38;
  int e = 0;
  std::frexp(std::max(std::fabs(v), min_normal), &e);
  return std::ldexp(1.0, e - 1 - mant);
}

struct Rng {
  std::mt19937 g;
  explicit Rng(unsigned seed) : g(seed) {}
  template <class T>
  std::vector<T> normal(Index n, double sd = 1.0, double mean = 0.0) {
    std::normal_distribution<double> d(mean, sd);
    std::vector<T> v(z(n));
    for (T& x : v) x = T(static_cast<float>(d(g)));
    return v;
  }
  std::vector<i8> ints(Index n, int lo, int hi) {
    std::uniform_int_distribution<int> d(lo, hi);
    std::vector<i8> v(z(n));
    for (i8& x : v) x = static_cast<i8>(d(g));
    return v;
  }
  double uni(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(g); }
};

template <class U>
struct Nz {
  std::vector<U> data;
  std::array<Index, 4> shape{};
};

/// NZ of a batch of [rows, cols] matrices (nd_to_nz).
template <class U>
Nz<U> to_nz(const std::vector<U>& nd, Index batch, Index rows, Index cols) {
  Nz<U> r;
  r.shape = attnref::nz_shape<U>(batch, rows, cols);
  r.data.assign(z(r.shape[0] * r.shape[1] * r.shape[2] * r.shape[3]), U(0));
  attnref::nd_to_nz<U>(StridedView<const U, 3>(nd.data(), {batch, rows, cols}),
                       StridedView<U, 4>(r.data.data(), r.shape));
  return r;
}
/// [rows, cols] -> [cols, rows].
template <class U>
std::vector<U> transpose(const std::vector<U>& w, Index rows, Index cols) {
  std::vector<U> t(w.size());
  for (Index r = 0; r < rows; ++r)
    for (Index c = 0; c < cols; ++c) t[z(c * rows + r)] = w[z(r * cols + c)];
  return t;
}

/// A weight [out, in] in format `fmt`; `keep` owns the transposed / NZ copy.
template <class U>
WeightRef<U> weight(const std::vector<U>& w, Index out, Index in, WeightFormat fmt,
                    std::vector<U>& keep) {
  switch (fmt) {
    case WeightFormat::NdInOut:
      keep = transpose(w, out, in);
      return {StridedView<const U>(keep.data(), {in, out}), out, in, fmt};
    case WeightFormat::Nz: {
      Nz<U> n = to_nz(w, 1, out, in);
      keep = std::move(n.data);
      return {StridedView<const U>(keep.data(), {n.shape[1], n.shape[2], n.shape[3]}), out, in,
              fmt};
    }
    default:
      return {StridedView<const U>(w.data(), {out, in}), out, in, fmt};
  }
}

const char* fmt_name(WeightFormat f) {
  return f == WeightFormat::NdOutIn ? "NdOutIn" : f == WeightFormat::NdInOut ? "NdInOut" : "Nz";
}

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
  const auto want = rm::rms_norm_quant(mode, fl(x), static_cast<int>(rows), static_cast<int>(n),
                                       fl(gamma), with_beta ? fl(beta) : std::vector<float>{},
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
  EXPECT_TRUE(same(q, want.q));
  if (mode != 0) {
    EXPECT_TRUE(same(d, want.descale)) << "descale";
  }
  if (mode == 2) {
    EXPECT_TRUE(same(zp, want.zero_point)) << "zero_point";
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
        const auto y =
            rm::rms_norm(fl(x), static_cast<int>(rows), static_cast<int>(n), fl(gamma), kEps);
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
    EXPECT_TRUE(same(out, y));
    attnref::RmsNormQuantInputs<float> in{StridedView<const float>(x.data(), {rows, n}),
                                          StridedView<const float>(gamma.data(), {n}),
                                          StridedView<const float>(beta.data(), {n})};
    attnref::rms_norm_quant<float>(MlaQuantMode::Unquant, kEps, in,
                                   {{}, {}, {}, StridedView<float>(outb.data(), {rows, n})});
    std::vector<float> yb(y.size());
    for (size_t i = 0; i < y.size(); ++i) yb[i] = rm::add(y[i], beta[i % z(n)]);
    EXPECT_TRUE(same(outb, yb)) << "with beta";
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
      if (std::fabs(as_d(h[z(r * n + j)])) > std::fabs(as_d(h[z(r * n + arg)]))) arg = j;
    EXPECT_EQ(q[z(r * n + arg)], as_d(h[z(r * n + arg)]) > 0 ? 127 : -127) << "row " << r;
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
  attnref::int8_matmul<T>(in, StridedView<T>(o1.data(), {c.M, c.N}), 1);
  attnref::int8_matmul<T>(in, StridedView<T>(o2.data(), {c.M, c.N}), 2);
  EXPECT_TRUE(equal_ref(o1, want));
  EXPECT_TRUE(same(o1, o2)) << "1 vs 2 threads";
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
  attnref::int8_matmul<float>(in, StridedView<float>(of.data(), {c.M, c.N}), 2);
  EXPECT_TRUE(same(of, want_f)) << "fp32 output";
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
  const auto want = rm::float_matmul(fl(a), static_cast<int>(M), static_cast<int>(K), fl(w),
                                     static_cast<int>(N), dt_of<T>());
  std::vector<T> nd(z(M * N), tpoison<T>());
  std::vector<T> keep;
  attnref::float_matmul<T>(StridedView<const T>(a.data(), {M, K}),
                           weight(w, N, K, WeightFormat::NdOutIn, keep),
                           StridedView<T>(nd.data(), {M, N}), 1);
  // Within 1 ulp of T (fp32 GEMM vs the double sum), or the fp32 accumulation bound near zero.
  size_t bad = 0, off = 0;
  for (Index m = 0; m < M; ++m)
    for (Index n = 0; n < N; ++n) {
      double abs_sum = 0.0;
      for (Index k = 0; k < K; ++k)
        abs_sum += std::fabs(as_d(a[z(m * K + k)]) * as_d(w[z(n * K + k)]));
      const size_t i = z(m * N + n);
      const int u = ulps(nd[i], T(want[i]));
      off += u != 0;
      if (u > 1 &&
          std::fabs(as_d(nd[i]) - want[i]) > double(K) * 0x1p-24 * abs_sum + ulp_of<T>(want[i]))
        ++bad;
    }
  EXPECT_EQ(bad, 0u) << off << " of " << M * N << " differ by an ulp";
  for (WeightFormat fmt : {WeightFormat::NdInOut, WeightFormat::Nz})
    for (int threads : {1, 2}) {
      std::vector<T> o(z(M * N), tpoison<T>());
      attnref::float_matmul<T>(StridedView<const T>(a.data(), {M, K}), weight(w, N, K, fmt, keep),
                               StridedView<T>(o.data(), {M, N}), threads);
      EXPECT_TRUE(same(o, nd)) << fmt_name(fmt) << " threads " << threads;
    }
}

TEST(MlaFloatMatmul, WithinOneUlpOfReferenceAndNzEqualsNd) {
  float_matmul_case<half>();
  float_matmul_case<bfloat16>();
}

// ---------------------------------------------------------------------------------------------
// Stages 4-5: rope_rotate_half, q_nope_absorb.

template <class T>
std::pair<std::vector<T>, std::vector<T>> sin_cos(Rng& g, Index N, Index R) {
  std::vector<T> s(z(N * R)), c(z(N * R));
  for (size_t i = 0; i < s.size(); ++i) {
    const double th = g.uni(-3.2, 3.2);
    s[i] = T(static_cast<float>(std::sin(th)));
    c[i] = T(static_cast<float>(std::cos(th)));
  }
  return {s, c};
}

template <class T>
void rope_case(Index heads) {
  SCOPED_TRACE(tname<T>() + " heads " + std::to_string(heads));
  const Index N = 5, R = 16;
  Rng g(static_cast<unsigned>(20 + heads));
  const auto x = g.normal<T>(N * heads * R, 2.0);
  const auto [sn, cs] = sin_cos<T>(g, N, R);
  const auto want = to_t<T>(rm::rope(fl(x), static_cast<int>(N), static_cast<int>(heads),
                                     static_cast<int>(R), fl(sn), fl(cs), dt_of<T>()));
  const StridedView<const T> s(sn.data(), {N, R}), c(cs.data(), {N, R});
  std::vector<T> o2(x.size(), tpoison<T>()), o3(o2);
  attnref::rope_rotate_half<T>(StridedView<const T>(x.data(), {N, heads * R}), s, c, heads,
                               StridedView<T>(o2.data(), {N, heads * R}));
  EXPECT_TRUE(same(o2, want)) << "[N, heads * R]";
  attnref::rope_rotate_half<T>(StridedView<const T>(x.data(), {N, heads, R}), s, c, heads,
                               StridedView<T>(o3.data(), {N, heads, R}));
  EXPECT_TRUE(same(o3, want)) << "[N, heads, R]";
  std::vector<T> buf = x;  // in place
  attnref::rope_rotate_half<T>(StridedView<const T>(buf.data(), {N, heads, R}), s, c, heads,
                               StridedView<T>(buf.data(), {N, heads, R}));
  EXPECT_TRUE(same(buf, want)) << "in place";
  // sin 0, cos 1: the identity.
  const std::vector<T> zero(z(N * R), T(0.0f)), one(z(N * R), T(1.0f));
  std::vector<T> id(x.size(), tpoison<T>());
  attnref::rope_rotate_half<T>(
      StridedView<const T>(x.data(), {N, heads * R}), StridedView<const T>(zero.data(), {N, R}),
      StridedView<const T>(one.data(), {N, R}), heads, StridedView<T>(id.data(), {N, heads * R}));
  EXPECT_TRUE(same(id, x)) << "identity";
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
  const auto want = rm::q_wuk(fl(q), static_cast<int>(N), static_cast<int>(H), static_cast<int>(P),
                              fl(wuk), static_cast<int>(C));
  std::vector<float> nd(z(N * H * C), NAN);
  attnref::q_nope_absorb<T>(StridedView<const T>(q.data(), {N, H, P}),
                            {StridedView<const T>(wuk.data(), {H, P, C}), false},
                            StridedView<float>(nd.data(), {N, H, C}), 1);
  // Relative to Σ|q·w| (the fp32 accumulation bound), so cancellation does not matter.
  size_t bad = 0;
  for (Index t = 0; t < N; ++t)
    for (Index h = 0; h < H; ++h)
      for (Index c = 0; c < C; ++c) {
        double abs_sum = 0.0;
        for (Index k = 0; k < P; ++k)
          abs_sum += std::fabs(as_d(q[z((t * H + h) * P + k)]) * as_d(wuk[z((h * P + k) * C + c)]));
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
                              StridedView<float>(o.data(), {N, H, C}), threads);
    EXPECT_TRUE(same(o, nd)) << "NZ, threads " << threads;
  }
}

TEST(MlaQNopeAbsorb, WithinFp32BoundOfReferenceAndNzEqualsNd) {
  for (Index P : {16, 20}) {
    absorb_case<half>(P);
    absorb_case<bfloat16>(P);
  }
}

// ---------------------------------------------------------------------------------------------
// Stage 6: mla_reshape_and_cache.

/// The caches of one cache mode (others empty), poisoned.
template <class T>
struct Caches {
  std::vector<T> kv, ctkv, krope;
  std::vector<i8> ctkv_i8;
  Index blocks = 0, bs = 0;
  int cm = 0;

  Caches(int mode, Index nblocks, Index block_size, Index C, Index R)
      : blocks(nblocks), bs(block_size), cm(mode) {
    const size_t rows = z(blocks * bs);
    if (cm == 0) kv.assign(rows * z(C + R), tpoison<T>());
    if (cm == 1 || cm == 3) ctkv.assign(rows * z(C), tpoison<T>());
    if (cm == 2) ctkv_i8.assign(rows * z(C), kPoison8);
    if (cm != 0) krope.assign(rows * z(R), tpoison<T>());
  }
  attnref::MlaCaches<T> refs(Index C, Index R) {
    attnref::MlaCaches<T> c;
    switch (cm) {
      case 0:
        c.kv_cache = StridedView<T>(kv.data(), {blocks, bs, 1, C + R});
        break;
      case 1:
        c.ctkv = StridedView<T>(ctkv.data(), {blocks, bs, 1, C});
        c.krope = StridedView<T>(krope.data(), {blocks, bs, 1, R});
        break;
      case 2:
        c.ctkv_i8 = StridedView<i8>(ctkv_i8.data(), {blocks, C / 32, bs, 32});
        c.krope = StridedView<T>(krope.data(), {blocks, R / 16, bs, 16});
        break;
      default:
        c.ctkv = StridedView<T>(ctkv.data(), {blocks, C / 16, bs, 16});
        c.krope = StridedView<T>(krope.data(), {blocks, R / 16, bs, 16});
    }
    return c;
  }
  /// Writes the reference's rows (k_nope / k_rope T values, k8 for Int8NzCache) in token order.
  void write_expected(const std::vector<i32>& slots, const std::vector<float>& kn,
                      const std::vector<float>& kr, const std::vector<i8>& k8, Index C, Index R) {
    const int ic = static_cast<int>(C), ir = static_cast<int>(R), ib = static_cast<int>(bs);
    for (size_t t = 0; t < slots.size(); ++t) {
      const i32 s = slots[t];
      if (s < 0) continue;
      const int block = s / ib, off = s % ib;
      const size_t row = z(Index{block} * bs + off);
      for (int j = 0; j < ic; ++j) {
        const float v = kn[t * z(C) + z(j)];
        if (cm == 0) kv[row * z(C + R) + z(j)] = T(v);
        if (cm == 1) ctkv[row * z(C) + z(j)] = T(v);
        if (cm == 2) ctkv_i8[rm::nz_cache_index(block, off, j, ic, ib, 32)] = k8[t * z(C) + z(j)];
        if (cm == 3) ctkv[rm::nz_cache_index(block, off, j, ic, ib, 16)] = T(v);
      }
      for (int j = 0; j < ir; ++j) {
        const T v(kr[t * z(R) + z(j)]);
        if (cm == 0) kv[row * z(C + R) + z(C + j)] = v;
        if (cm == 1) krope[row * z(R) + z(j)] = v;
        if (cm >= 2) krope[rm::nz_cache_index(block, off, j, ir, ib, 16)] = v;
      }
    }
  }
};

template <class T>
::testing::AssertionResult same_caches(const Caches<T>& a, const Caches<T>& b) {
  for (auto r : {same(a.kv, b.kv), same(a.ctkv, b.ctkv), same(a.krope, b.krope)})
    if (!r) return r;
  return same(a.ctkv_i8, b.ctkv_i8);
}

/// Slots of N tokens into `cap` slots: distinct, then token 1 skipped (-1), token 2 on the last
/// slot, the last token on token 0's slot (the later write wins).
std::vector<i32> make_slots(Index N, Index cap) {
  std::vector<i32> s(z(N));
  for (Index t = 0; t < N; ++t) s[z(t)] = static_cast<i32>((t * 37 + 11) % cap);
  if (N >= 3) {
    s[1] = -1;
    s[z(N - 1)] = s[0];
  }
  if (N >= 4) s[2] = static_cast<i32>(cap - 1);
  return s;
}

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
  want.write_expected(slots, fl(kn), fl(kr), k8, C, R);
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
  EXPECT_TRUE(same(kv.kv, cat)) << "KvCache vs KRopeCtkv";
  // NzCache after nz_to_nd == KRopeCtkv.
  auto to_nd = [&](const std::vector<T>& v, Index w) {
    std::vector<T> nd(z(blocks * bs * w));
    attnref::nz_to_nd<T>(StridedView<const T, 4>(v.data(), {blocks, w / 16, bs, 16}),
                         StridedView<T, 3>(nd.data(), {blocks, bs, w}));
    return nd;
  };
  EXPECT_TRUE(same(to_nd(nz.ctkv, C), split.ctkv)) << "NzCache ctkv";
  EXPECT_TRUE(same(to_nd(nz.krope, R), split.krope)) << "NzCache krope";
}

TEST(MlaReshapeAndCache, NzCacheIsKRopeCtkvInNzAndKvCacheIsTheirConcatenation) {
  reshape_metamorphic<half>(128);
  reshape_metamorphic<bfloat16>(128);
  reshape_metamorphic<half>(32);
}

// ---------------------------------------------------------------------------------------------
// Stage 7: mla_preprocess. A Problem owns every buffer of one configuration and builds the
// library's inputs / outputs and the reference's inputs from them. The data depend only on
// (dims, heads, N, quant mode, block size, seed), so problems differing in cache mode, weight
// format, de_scale form or thread count see the same numbers.

struct Cfg {
  attnref::MlaDims dims{96, 64, 16, 48, 16};
  Index heads = 3, N = 5;
  int qm = 0, cm = 0;
  bool nz = false;    // NZ wdqkv / wuq (int8, or T in Unquant) and NZ wuk
  bool bits = false;  // de_scale as int64 bits
  bool beta = true;   // beta0 / beta1 given
  bool bias = true;   // bias0 / bias1 given (per-tensor mode only)
  Index bs = 128;     // cache block size
  int threads = 1;
  unsigned seed = 1;

  std::string str() const {
    return "qm " + std::to_string(qm) + " cm " + std::to_string(cm) + " N " + std::to_string(N) +
           (nz ? " NZ" : " ND") + (bits ? " bits" : "") + (beta ? "" : " no-beta") +
           (bias ? "" : " no-bias") + " bs " + std::to_string(bs) + " threads " +
           std::to_string(threads);
  }
};

/// The outputs of mla_preprocess (q_out, q_out_i8, q_rope) and the caches.
template <class T>
struct Outs {
  std::vector<T> q_out, q_rope;
  std::vector<i8> q_out_i8;
  Caches<T> caches;
};

template <class T>
::testing::AssertionResult same_outs(const Outs<T>& a, const Outs<T>& b) {
  for (auto r : {same(a.q_out, b.q_out), same(a.q_rope, b.q_rope)})
    if (!r) return r;
  if (auto r = same(a.q_out_i8, b.q_out_i8); !r) return r;
  return same_caches(a.caches, b.caches);
}

template <class T>
struct Problem {
  Cfg c;
  Index H0, C, R, Q, P, NH, N, W1, W2, blocks;
  std::vector<T> input, gamma0, beta0, gamma1, beta1, gamma2, sin, cos, wuk, qns;
  std::vector<T> wdqkv_f, wuq_f;  // Unquant
  std::vector<i8> wdqkv, wuq;
  std::vector<float> ds0, ds1;
  std::vector<i64> ds0b, ds1b;
  std::vector<i32> bias0, bias1, slots;
  T qs0, qs1, qs3;
  i8 qo0 = 3, qo1 = -2;
  // NZ copies
  std::vector<i8> wdqkv_nz, wuq_nz;
  std::vector<T> wdqkv_fnz, wuq_fnz, wuk_nz;
  std::vector<Index> s_wdqkv, s_wuq, s_wuk;
  Outs<T> o;

  explicit Problem(const Cfg& cfg)
      : c(cfg),
        H0(cfg.dims.hidden_size),
        C(cfg.dims.kv_lora_rank),
        R(cfg.dims.rope_dim),
        Q(cfg.dims.q_lora_rank),
        P(cfg.dims.nope_dim),
        NH(cfg.heads),
        N(cfg.N),
        W1(C + R + Q),
        W2(NH * (P + R)),
        blocks(cfg.bs == 128 ? 2 : 3),
        qs0(0.03f),
        qs1(0.04f),
        qs3(0.05f),
        o{{}, {}, {}, Caches<T>(cfg.cm, cfg.bs == 128 ? 2 : 3, cfg.bs, C, R)} {
    Rng g(cfg.seed);
    input = g.normal<T>(N * H0);
    gamma0 = g.normal<T>(H0, 0.1, 1.0);
    beta0 = g.normal<T>(H0, 0.1);
    gamma1 = g.normal<T>(Q, 0.1, 1.0);
    beta1 = g.normal<T>(Q, 0.1);
    gamma2 = g.normal<T>(C, 0.1, 1.0);
    std::tie(sin, cos) = sin_cos<T>(g, N, R);
    wuk = g.normal<T>(NH * P * C, 1.0 / std::sqrt(double(P)));
    for (Index h = 0; h < NH; ++h) qns.push_back(T(16.0f + 2.5f * static_cast<float>(h % 3)));
    wdqkv = g.ints(W1 * H0, -127, 127);
    wuq = g.ints(W2 * Q, -127, 127);
    // de_scale so that mm1 / mm2 are O(1): acc ≈ Σ (y / qs) · w (per tensor), Σ y · w / d.
    auto scales = [&](Index rows, Index K, float qs, std::vector<float>& ds, std::vector<i64>& dsb,
                      std::vector<i32>& bias) {
      const double base = (c.qm == 0 ? double(qs) : 1.0) / (std::sqrt(double(K)) * 73.0);
      for (Index n = 0; n < rows; ++n) {
        ds.push_back(static_cast<float>(base * g.uni(0.8, 1.2)));
        dsb.push_back(static_cast<i64>(attnref::scale_to_bits(ds.back())));
        bias.push_back(static_cast<i32>(g.uni(-400, 400)));
      }
    };
    scales(W1, H0, static_cast<float>(qs0), ds0, ds0b, bias0);
    scales(W2, Q, static_cast<float>(qs1), ds1, ds1b, bias1);
    if (c.qm == 3) {
      wdqkv_f = g.normal<T>(W1 * H0, 1.0 / std::sqrt(double(H0)));
      wuq_f = g.normal<T>(W2 * Q, 1.0 / std::sqrt(double(Q)));
    }
    slots = make_slots(N, blocks * c.bs);
    if (c.nz) {
      auto put = [](auto nz, auto& data, std::vector<Index>& shape, int rank) {
        data = std::move(nz.data);
        shape.assign(nz.shape.begin() + (4 - rank), nz.shape.end());
      };
      if (c.qm == 3) {
        put(to_nz(wdqkv_f, 1, W1, H0), wdqkv_fnz, s_wdqkv, 3);
        put(to_nz(wuq_f, 1, W2, Q), wuq_fnz, s_wuq, 3);
      } else {
        put(to_nz(wdqkv, 1, W1, H0), wdqkv_nz, s_wdqkv, 3);
        put(to_nz(wuq, 1, W2, Q), wuq_nz, s_wuq, 3);
      }
      put(to_nz(wuk, NH, P, C), wuk_nz, s_wuk, 4);
    }
    const size_t nh = z(N * NH);
    if (c.cm == 0) o.q_out.assign(nh * z(C + R), tpoison<T>());
    if (c.cm == 1 || c.cm == 3) o.q_out.assign(nh * z(C), tpoison<T>());
    if (c.cm == 2) o.q_out_i8.assign(nh * z(C), kPoison8);
    if (c.cm != 0) o.q_rope.assign(nh * z(R), tpoison<T>());
  }
  Problem(const Problem&) = delete;
  Problem& operator=(const Problem&) = delete;

  attnref::MlaPreprocessParams params() const {
    attnref::MlaPreprocessParams p;
    p.dims = c.dims;
    p.epsilon = kEps;
    p.quant_mode = static_cast<MlaQuantMode>(c.qm);
    p.cache_mode = static_cast<MlaCacheMode>(c.cm);
    return p;
  }

  attnref::MlaPreprocessInputs<T> inputs() const {
    attnref::MlaPreprocessInputs<T> in;
    using CT = StridedView<const T>;
    in.input = CT(input.data(), {N, H0});
    in.gamma0 = CT(gamma0.data(), {H0});
    in.gamma1 = CT(gamma1.data(), {Q});
    in.gamma2 = CT(gamma2.data(), {C});
    if (c.beta) {
      in.beta0 = CT(beta0.data(), {H0});
      in.beta1 = CT(beta1.data(), {Q});
    }
    in.sin = CT(sin.data(), {N, R});
    in.cos = CT(cos.data(), {N, R});
    in.wuk = c.nz ? attnref::WukRef<T>{CT(wuk_nz.data(), s_wuk), true}
                  : attnref::WukRef<T>{CT(wuk.data(), {NH, P, C}), false};
    in.slot_mapping = StridedView<const i32>(slots.data(), {N});
    if (c.qm == 3) {
      in.wdqkv_float = c.nz ? WeightRef<T>{CT(wdqkv_fnz.data(), s_wdqkv), W1, H0, WeightFormat::Nz}
                            : WeightRef<T>{CT(wdqkv_f.data(), {W1, H0}), W1, H0};
      in.wuq_float = c.nz ? WeightRef<T>{CT(wuq_fnz.data(), s_wuq), W2, Q, WeightFormat::Nz}
                          : WeightRef<T>{CT(wuq_f.data(), {W2, Q}), W2, Q};
    } else {
      using CI = StridedView<const i8>;
      in.wdqkv = c.nz ? WeightRef<i8>{CI(wdqkv_nz.data(), s_wdqkv), W1, H0, WeightFormat::Nz}
                      : WeightRef<i8>{CI(wdqkv.data(), {W1, H0}), W1, H0};
      in.wuq = c.nz ? WeightRef<i8>{CI(wuq_nz.data(), s_wuq), W2, Q, WeightFormat::Nz}
                    : WeightRef<i8>{CI(wuq.data(), {W2, Q}), W2, Q};
      if (c.bits) {
        in.de_scale0_bits = StridedView<const i64>(ds0b.data(), {W1});
        in.de_scale1_bits = StridedView<const i64>(ds1b.data(), {W2});
      } else {
        in.de_scale0 = StridedView<const float>(ds0.data(), {W1});
        in.de_scale1 = StridedView<const float>(ds1.data(), {W2});
      }
      if (c.qm == 0) {
        in.quant_scale0 = CT(&qs0, {1});
        in.quant_offset0 = CI(&qo0, {1});
        in.quant_scale1 = CT(&qs1, {1});
        in.quant_offset1 = CI(&qo1, {1});
        if (c.bias) {
          in.bias0 = StridedView<const i32>(bias0.data(), {W1});
          in.bias1 = StridedView<const i32>(bias1.data(), {W2});
        }
      }
    }
    if (c.cm == 2) {
      in.ctkv_scale = CT(&qs3, {1});
      in.q_nope_scale = CT(qns.data(), {NH});
    }
    return in;
  }

  attnref::MlaPreprocessOutputs<T> outputs() {
    attnref::MlaPreprocessOutputs<T> out;
    if (c.cm == 0) out.q_out = StridedView<T>(o.q_out.data(), {N, NH, C + R});
    if (c.cm == 1 || c.cm == 3) out.q_out = StridedView<T>(o.q_out.data(), {N, NH, C});
    if (c.cm == 2) out.q_out_i8 = StridedView<i8>(o.q_out_i8.data(), {N, NH, C});
    if (c.cm != 0) out.q_rope_out = StridedView<T>(o.q_rope.data(), {N, NH, R});
    out.caches = o.caches.refs(C, R);
    return out;
  }

  void run() { attnref::mla_preprocess<T>(params(), inputs(), outputs(), c.threads); }

  rm::ChainOut reference() const {
    rm::ChainIn ci;
    ci.input = fl(input);
    ci.gamma0 = fl(gamma0);
    ci.gamma1 = fl(gamma1);
    ci.gamma2 = fl(gamma2);
    if (c.beta) {
      ci.beta0 = fl(beta0);
      ci.beta1 = fl(beta1);
    }
    ci.quant_scale0 = static_cast<float>(qs0);
    ci.quant_offset0 = qo0;
    ci.quant_scale1 = static_cast<float>(qs1);
    ci.quant_offset1 = qo1;
    ci.wdqkv = wdqkv;
    ci.wuq = wuq;
    ci.wdqkv_f = fl(wdqkv_f);
    ci.wuq_f = fl(wuq_f);
    if (c.qm == 0 && c.bias) {
      ci.bias0 = bias0;
      ci.bias1 = bias1;
    }
    ci.descale0 = ds0;
    ci.descale1 = ds1;
    ci.sin = fl(sin);
    ci.cos = fl(cos);
    ci.wuk = fl(wuk);
    ci.slots.assign(slots.begin(), slots.end());
    ci.quant_scale3 = static_cast<float>(qs3);
    ci.q_nope_scale = fl(qns);
    rm::Dims d;
    d.hidden = static_cast<int>(H0);
    d.kv_lora = static_cast<int>(C);
    d.rope = static_cast<int>(R);
    d.q_lora = static_cast<int>(Q);
    d.nope = static_cast<int>(P);
    d.heads = static_cast<int>(NH);
    return rm::chain(d, c.qm, c.cm, ci, static_cast<int>(N), kEps, dt_of<T>());
  }

  /// The outputs and caches the reference gives (the untouched parts poisoned as here).
  Outs<T> expected(const rm::ChainOut& r) const {
    Outs<T> e{{}, {}, {}, Caches<T>(c.cm, blocks, c.bs, C, R)};
    e.q_out.assign(o.q_out.size(), tpoison<T>());
    e.q_rope.assign(o.q_rope.size(), tpoison<T>());
    e.q_out_i8.assign(o.q_out_i8.size(), kPoison8);
    for (Index th = 0; th < N * NH; ++th) {
      for (Index j = 0; j < C; ++j) {
        const float v = r.q_nope_T[z(th * C + j)];
        if (c.cm == 0) e.q_out[z(th * (C + R) + j)] = T(v);
        if (c.cm == 1 || c.cm == 3) e.q_out[z(th * C + j)] = T(v);
        if (c.cm == 2) e.q_out_i8[z(th * C + j)] = r.q_nope_i8[z(th * C + j)];
      }
      for (Index j = 0; j < R; ++j) {
        const T v(r.q_rope[z(th * R + j)]);
        if (c.cm == 0)
          e.q_out[z(th * (C + R) + C + j)] = v;
        else
          e.q_rope[z(th * R + j)] = v;
      }
    }
    e.caches.write_expected(slots, r.k_nope, r.k_rope, r.k_nope_i8, C, R);
    return e;
  }

  /// The fp32 accumulation bound of each q_nope · wuk element: P · 2^-24 · Σ|q · w|.
  std::vector<double> nope_slack(const rm::ChainOut& r) const {
    std::vector<double> s(z(N * NH * C));
    for (Index t = 0; t < N; ++t)
      for (Index h = 0; h < NH; ++h)
        for (Index j = 0; j < C; ++j) {
          double a = 0.0;
          for (Index k = 0; k < P; ++k)
            a += std::fabs(double(r.mm2[z(t * W2 + h * (P + R) + k)]) *
                           as_d(wuk[z((h * P + k) * C + j)]));
          s[z((t * NH + h) * C + j)] = double(P + 2) * 0x1p-24 * a;
        }
    return s;
  }
};

struct ChainStats {
  size_t nope_T = 0, nope_T_off = 0, nope_i8 = 0, nope_i8_off = 0;
};

/// Runs the problem and compares everything with the reference.
template <class T>
void check_against_reference(const Cfg& cfg, ChainStats& st) {
  SCOPED_TRACE(tname<T>() + " " + cfg.str());
  Problem<T> pr(cfg);
  const rm::ChainOut r = pr.reference();
  const Outs<T> e = pr.expected(r);
  pr.run();
  const Outs<T>& o = pr.o;
  const Index C = pr.C, R = pr.R;
  if (cfg.qm == 3) {  // Unquant: floating-point matmuls summed differently -> tolerance
    const auto tol = support::tolerance(kind_of<T>());
    EXPECT_TRUE(support::all_close(to_d(e.q_out), to_d(o.q_out), tol)) << "q_out";
    EXPECT_TRUE(support::all_close(to_d(e.q_rope), to_d(o.q_rope), tol)) << "q_rope";
    EXPECT_TRUE(support::all_close(to_d(e.caches.kv), to_d(o.caches.kv), tol)) << "kv_cache";
    EXPECT_TRUE(support::all_close(to_d(e.caches.ctkv), to_d(o.caches.ctkv), tol)) << "ctkv";
    EXPECT_TRUE(support::all_close(to_d(e.caches.krope), to_d(o.caches.krope), tol)) << "krope";
    EXPECT_TRUE(support::all_close(to_d(e.q_out_i8), to_d(o.q_out_i8), {2.0, 0.0})) << "q_out_i8";
    EXPECT_TRUE(support::all_close(to_d(e.caches.ctkv_i8), to_d(o.caches.ctkv_i8), {2.0, 0.0}))
        << "ctkv_i8";
    return;
  }
  // Quantized modes: the int8 matmuls are exact, so everything but q_nope · wuk is too.
  EXPECT_TRUE(same(o.q_rope, e.q_rope)) << "q_rope";
  EXPECT_TRUE(same_caches(o.caches, e.caches)) << "caches";
  const auto slack = pr.nope_slack(r);
  const Index w = cfg.cm == 0 ? C + R : C;
  size_t bad = 0;
  for (size_t i = 0; i < o.q_out.size(); ++i) {
    const Index th = static_cast<Index>(i) / w, j = static_cast<Index>(i) % w;
    if (j >= C) {  // the rope part of KvCache's q_out
      bad += std::memcmp(&o.q_out[i], &e.q_out[i], sizeof(T)) != 0;
      continue;
    }
    const double want = r.q_nope_T[z(th * C + j)];
    const int u = ulps(o.q_out[i], e.q_out[i]);
    ++st.nope_T;
    st.nope_T_off += u != 0;
    if (u > 1 && std::fabs(as_d(o.q_out[i]) - want) > slack[z(th * C + j)] + ulp_of<T>(want)) ++bad;
  }
  EXPECT_EQ(bad, 0u) << "q_out beyond 1 ulp of T (rope part: not exact)";
  size_t bad8 = 0;
  for (size_t i = 0; i < o.q_out_i8.size(); ++i) {
    const int d = std::abs(int{o.q_out_i8[i]} - int{e.q_out_i8[i]});
    ++st.nope_i8;
    st.nope_i8_off += d != 0;
    bad8 += d > 1;
  }
  EXPECT_EQ(bad8, 0u) << "q_out_i8 beyond ±1";
}

TEST(MlaPreprocess, QuantizedModesMatchReferenceExactlyButQNope) {
  ChainStats st;
  unsigned seed = 500;
  for (int qm = 0; qm < 3; ++qm)
    for (int cm = 0; cm < 4; ++cm)
      for (Index N : {1, 5, 7})
        for (bool nz : {false, true}) {
          Cfg c;
          c.qm = qm;
          c.cm = cm;
          c.N = N;
          c.nz = nz;
          c.bits = nz && N != 5;
          c.beta = c.bias = N != 7;
          c.bs = cm < 2 && N == 7 ? 16 : 128;
          c.seed = ++seed;
          check_against_reference<half>(c, st);
          check_against_reference<bfloat16>(c, st);
        }
  // T(q_nope) is one fp32 GEMM vs a double sum away from the reference: an ulp now and then.
  EXPECT_LE(st.nope_T_off * 20, st.nope_T) << st.nope_T_off << " of " << st.nope_T;
  EXPECT_LE(st.nope_i8_off * 20, st.nope_i8) << st.nope_i8_off << " of " << st.nope_i8;
  ::testing::Test::RecordProperty(
      "q_nope_T_ulp_off", std::to_string(st.nope_T_off) + " / " + std::to_string(st.nope_T));
  ::testing::Test::RecordProperty(
      "q_nope_i8_off", std::to_string(st.nope_i8_off) + " / " + std::to_string(st.nope_i8));
}

TEST(MlaPreprocess, UnquantModeWithinToleranceOfReference) {
  ChainStats st;
  unsigned seed = 700;
  for (int cm = 0; cm < 4; ++cm)
    for (Index N : {1, 5, 7})
      for (bool nz : {false, true}) {
        Cfg c;
        c.qm = 3;
        c.cm = cm;
        c.N = N;
        c.nz = nz;
        c.beta = N != 7;
        c.bs = cm < 2 && N == 7 ? 16 : 128;
        c.seed = ++seed;
        check_against_reference<half>(c, st);
        check_against_reference<bfloat16>(c, st);
      }
}

TEST(MlaPreprocess, DeepSeekV3DimsMatchReference) {
  ChainStats st;
  Cfg c;
  c.dims = attnref::MlaDims{};
  c.heads = 2;
  c.N = 2;
  c.qm = 0;
  c.cm = 2;
  check_against_reference<half>(c, st);
  c.qm = 1;
  c.cm = 3;
  c.nz = true;
  c.seed = 2;
  check_against_reference<bfloat16>(c, st);
  EXPECT_LE(st.nope_i8_off * 20, st.nope_i8) << st.nope_i8_off << " of " << st.nope_i8;
}

/// Runs `a` and `b` (configurations that must agree bit for bit) and compares all outputs.
template <class T>
void expect_same_run(const Cfg& a, const Cfg& b) {
  SCOPED_TRACE(tname<T>() + " [" + a.str() + "] vs [" + b.str() + "]");
  Problem<T> pa(a), pb(b);
  pa.run();
  pb.run();
  EXPECT_TRUE(same_outs(pa.o, pb.o));
}

template <class F>
void both_dtypes(F&& f) {
  f(half{});
  f(bfloat16{});
}

TEST(MlaPreprocess, NdAndNzWeightsGiveIdenticalBits) {
  for (int qm = 0; qm < 4; ++qm)
    both_dtypes([&](auto tag) {
      Cfg a;
      a.qm = qm;
      a.cm = (qm + 1) % 4;
      a.seed = 31 + static_cast<unsigned>(qm);
      Cfg b = a;
      b.nz = true;
      expect_same_run<decltype(tag)>(a, b);
    });
}

TEST(MlaPreprocess, DeScaleFloatAndBitsGiveIdenticalBits) {
  for (int qm = 0; qm < 3; ++qm)
    both_dtypes([&](auto tag) {
      Cfg a;
      a.qm = qm;
      a.cm = qm;
      a.nz = qm == 1;
      a.seed = 41 + static_cast<unsigned>(qm);
      Cfg b = a;
      b.bits = true;
      expect_same_run<decltype(tag)>(a, b);
    });
}

TEST(MlaPreprocess, OneAndTwoThreadsGiveIdenticalBits) {
  for (int qm = 0; qm < 4; ++qm)
    both_dtypes([&](auto tag) {
      Cfg a;
      a.qm = qm;
      a.cm = 3 - qm;
      a.N = 7;
      a.seed = 51 + static_cast<unsigned>(qm);
      Cfg b = a;
      b.threads = 2;
      expect_same_run<decltype(tag)>(a, b);
    });
}

template <class T>
void kv_vs_split(int qm, Index bs) {
  SCOPED_TRACE(tname<T>() + " qm " + std::to_string(qm) + " bs " + std::to_string(bs));
  Cfg a;
  a.qm = qm;
  a.bs = bs;
  a.N = 7;
  a.seed = 61;
  Cfg b = a;
  a.cm = 0;
  b.cm = 1;
  Problem<T> pa(a), pb(b);
  pa.run();
  pb.run();
  const Index C = pa.C, R = pa.R;
  std::vector<T> q_cat, cache_cat;
  for (Index th = 0; th < pa.N * pa.NH; ++th) {
    q_cat.insert(q_cat.end(), pb.o.q_out.begin() + th * C, pb.o.q_out.begin() + (th + 1) * C);
    q_cat.insert(q_cat.end(), pb.o.q_rope.begin() + th * R, pb.o.q_rope.begin() + (th + 1) * R);
  }
  for (Index row = 0; row < pa.blocks * bs; ++row) {
    const auto& cb = pb.o.caches;
    cache_cat.insert(cache_cat.end(), cb.ctkv.begin() + row * C, cb.ctkv.begin() + (row + 1) * C);
    cache_cat.insert(cache_cat.end(), cb.krope.begin() + row * R, cb.krope.begin() + (row + 1) * R);
  }
  EXPECT_TRUE(same(pa.o.q_out, q_cat)) << "q_out";
  EXPECT_TRUE(same(pa.o.caches.kv, cache_cat)) << "kv_cache";
}

TEST(MlaPreprocess, KvCacheOutputsAreKRopeCtkvOutputsConcatenated) {
  for (int qm = 0; qm < 4; ++qm) {
    kv_vs_split<half>(qm, qm % 2 ? 16 : 128);
    kv_vs_split<bfloat16>(qm, qm % 2 ? 128 : 16);
  }
}

template <class T>
void nz_vs_split(int qm) {
  SCOPED_TRACE(tname<T>() + " qm " + std::to_string(qm));
  Cfg a;
  a.qm = qm;
  a.N = 7;
  a.seed = 71;
  Cfg b = a;
  a.cm = 3;
  b.cm = 1;
  Problem<T> pa(a), pb(b);
  pa.run();
  pb.run();
  EXPECT_TRUE(same(pa.o.q_out, pb.o.q_out)) << "q_out";
  EXPECT_TRUE(same(pa.o.q_rope, pb.o.q_rope)) << "q_rope";
  const Index blocks = pa.blocks, bs = a.bs;
  auto to_nd = [&](const std::vector<T>& v, Index w) {
    std::vector<T> nd(z(blocks * bs * w));
    attnref::nz_to_nd<T>(StridedView<const T, 4>(v.data(), {blocks, w / 16, bs, 16}),
                         StridedView<T, 3>(nd.data(), {blocks, bs, w}));
    return nd;
  };
  EXPECT_TRUE(same(to_nd(pa.o.caches.ctkv, pa.C), pb.o.caches.ctkv)) << "ctkv";
  EXPECT_TRUE(same(to_nd(pa.o.caches.krope, pa.R), pb.o.caches.krope)) << "krope";
}

TEST(MlaPreprocess, NzCacheIsKRopeCtkvInNzLayout) {
  for (int qm = 0; qm < 4; ++qm) {
    nz_vs_split<half>(qm);
    nz_vs_split<bfloat16>(qm);
  }
}

/// Int8NzCache vs NzCache of the same data: k8 · ctkv_scale within ctkv_scale of k_nope, and
/// q8 / q_nope_scale within 1 / q_nope_scale of T(q_nope); krope and q_rope identical; q8 and k8
/// exactly the reference's int8 rules applied to NzCache's T(q_nope) and k_nope.
template <class T>
void int8_vs_nz(int qm) {
  SCOPED_TRACE(tname<T>() + " qm " + std::to_string(qm));
  Cfg a;
  a.qm = qm;
  a.N = 7;
  a.seed = 81;
  Cfg b = a;
  a.cm = 2;
  b.cm = 3;
  Problem<T> p8(a), pt(b);
  p8.run();
  pt.run();
  EXPECT_TRUE(same(p8.o.q_rope, pt.o.q_rope)) << "q_rope";
  EXPECT_TRUE(same(p8.o.caches.krope, pt.o.caches.krope)) << "krope";
  const Index C = p8.C, NH = p8.NH, bs = a.bs;
  size_t bad_q = 0, bad_k = 0, saturated = 0, exact_q = 0, exact_k = 0;
  for (Index th = 0; th < p8.N * NH; ++th) {
    const double s = as_d(p8.qns[z(th % NH)]);
    for (Index j = 0; j < C; ++j) {
      const int q8 = p8.o.q_out_i8[z(th * C + j)];
      const float qt = static_cast<float>(pt.o.q_out[z(th * C + j)]);
      exact_q += q8 != rm::q_nope_quant(qt, static_cast<float>(s), dt_of<T>());
      saturated += q8 <= -127 || q8 >= 127;
      bad_q += !(std::fabs(q8 / s - as_d(pt.o.q_out[z(th * C + j)])) <= 1.0 / std::fabs(s));
    }
  }
  const double qs3 = as_d(p8.qs3);
  std::vector<bool> seen(z(p8.blocks * bs), false);
  for (const i32 sl : p8.slots) {
    if (sl < 0 || seen[z(sl)]) continue;
    seen[z(sl)] = true;
    const int block = static_cast<int>(sl / bs), off = static_cast<int>(sl % bs);
    for (int j = 0; j < static_cast<int>(C); ++j) {
      const int k8 = p8.o.caches.ctkv_i8[rm::nz_cache_index(block, off, j, static_cast<int>(C),
                                                            static_cast<int>(bs), 32)];
      const double kn = as_d(pt.o.caches.ctkv[rm::nz_cache_index(block, off, j, static_cast<int>(C),
                                                                 static_cast<int>(bs), 16)]);
      exact_k +=
          k8 != rm::k_nope_quant(static_cast<float>(kn), static_cast<float>(qs3), dt_of<T>());
      saturated += k8 <= -127 || k8 >= 127;
      bad_k += !(std::fabs(k8 * qs3 - kn) <= qs3);
    }
  }
  ASSERT_EQ(saturated, 0u) << "scales chosen so nothing saturates";
  EXPECT_EQ(bad_q, 0u) << "q_out_i8";
  EXPECT_EQ(bad_k, 0u) << "ctkv_i8";
  // Both runs share T(q_nope) and k_nope bit for bit, so the int8 rules apply exactly.
  EXPECT_EQ(exact_q, 0u) << "q_out_i8 != the reference rule applied to NzCache's T(q_nope)";
  EXPECT_EQ(exact_k, 0u) << "ctkv_i8 != the reference rule applied to NzCache's k_nope";
}

TEST(MlaPreprocess, Int8NzCacheDequantizesToNzCacheWithinOneStep) {
  for (int qm = 0; qm < 4; ++qm) {
    int8_vs_nz<half>(qm);
    int8_vs_nz<bfloat16>(qm);
  }
}

// ---------------------------------------------------------------------------------------------
// Bad input.

using In = attnref::MlaPreprocessInputs<half>;
using Out = attnref::MlaPreprocessOutputs<half>;
using Params = attnref::MlaPreprocessParams;
using Edit = std::function<void(Problem<half>&, Params&, In&, Out&)>;

/// A fresh problem of `cfg` with one edit must throw naming `what` and write nothing.
void expect_reject(const Cfg& cfg, const Edit& edit, const std::string& what,
                   bool out_of_range = false) {
  SCOPED_TRACE(cfg.str() + ": " + what);
  Problem<half> pr(cfg);
  const Outs<half> before{pr.o.q_out, pr.o.q_rope, pr.o.q_out_i8, pr.o.caches};
  Params p = pr.params();
  In in = pr.inputs();
  Out out = pr.outputs();
  edit(pr, p, in, out);
  support::expect_throw([&] { attnref::mla_preprocess<half>(p, in, out); }, what, out_of_range);
  EXPECT_TRUE(same_outs(pr.o, before)) << "written before throwing";
}

Cfg cfg_of(int qm, int cm, bool nz = false, Index bs = 128) {
  Cfg c;
  c.qm = qm;
  c.cm = cm;
  c.nz = nz;
  c.bs = bs;
  return c;
}

/// Memory for an output given where the mode takes none: its own, since an output overlapping
/// another argument is rejected first.
template <class U>
U* spare() {
  static std::vector<U> v(std::size_t{1} << 20);
  return v.data();
}

TEST(MlaPreprocess, BadInputThrowsNamingTheArgumentAndWritesNothing) {
  using CT = StridedView<const half>;
  static const half zero(0.0f);
  const Cfg t0 = cfg_of(0, 0), tnz = cfg_of(0, 0, true), t1 = cfg_of(1, 1), t2 = cfg_of(2, 2),
            t3 = cfg_of(0, 3), tu = cfg_of(3, 1);
  // The unedited problems run.
  for (const Cfg& c : {t0, tnz, t1, t2, t3, tu}) {
    Problem<half> pr(c);
    EXPECT_NO_THROW(pr.run()) << c.str();
  }
  // Shapes of the inputs.
  expect_reject(
      t0,
      [](auto& pr, auto&, In& in, auto&) {
        in.input = support::reshaped(in.input, {pr.N, pr.H0 - 1});
      },
      "input.shape");
  expect_reject(
      t0,
      [](auto& pr, auto&, In& in, auto&) {
        in.input = support::reshaped(in.input, {0, pr.H0});
      },
      "input.shape[0]");
  expect_reject(
      t0,
      [](auto& pr, auto&, In& in, auto&) { in.gamma0 = support::reshaped(in.gamma0, {pr.H0 - 1}); },
      "gamma0.shape");
  expect_reject(
      t0,
      [](auto& pr, auto&, In& in, auto&) { in.beta0 = support::reshaped(in.beta0, {pr.H0 + 1}); },
      "beta0.shape");
  expect_reject(
      t0,
      [](auto& pr, auto&, In& in, auto&) { in.gamma1 = support::reshaped(in.gamma1, {pr.Q - 1}); },
      "gamma1.shape");
  expect_reject(
      t0,
      [](auto& pr, auto&, In& in, auto&) { in.gamma2 = support::reshaped(in.gamma2, {pr.C + 1}); },
      "gamma2.shape");
  expect_reject(
      t0,
      [](auto& pr, auto&, In& in, auto&) {
        in.sin = support::reshaped(in.sin, {pr.N, pr.R - 2});
      },
      "sin.shape");
  expect_reject(
      t0,
      [](auto& pr, auto&, In& in, auto&) {
        in.cos = support::reshaped(in.cos, {pr.N - 1, pr.R});
      },
      "cos.shape");
  // Static quant scales.
  expect_reject(
      t0, [](auto&, auto&, In& in, auto&) { in.quant_scale0 = {}; }, "quant_scale0.shape");
  expect_reject(
      t0, [](auto&, auto&, In& in, auto&) { in.quant_offset1 = {}; }, "quant_offset1.shape");
  expect_reject(
      t0, [](auto&, auto&, In& in, auto&) { in.quant_scale0 = CT(&zero, {1}); },
      "quant_scale0 not usable");
  expect_reject(
      t0, [](auto&, auto&, In& in, auto&) { in.quant_scale1 = CT(&zero, {1}); },
      "quant_scale1 not usable");
  expect_reject(
      t1, [](auto& pr, auto&, In& in, auto&) { in.quant_scale0 = CT(&pr.qs0, {1}); },
      "quant_scale0 / quant_offset0");
  expect_reject(
      t2,
      [](auto& pr, auto&, In& in, auto&) {
        in.quant_offset1 = StridedView<const i8>(&pr.qo1, {1});
      },
      "quant_scale1 / quant_offset1");
  // Weights, de_scales, biases.
  expect_reject(
      t0, [](auto&, auto&, In& in, auto&) { in.wdqkv.out -= 1; }, "wdqkv (out, in)");
  expect_reject(
      t0,
      [](auto& pr, auto&, In& in, auto&) {
        in.wdqkv.tensor = support::reshaped(in.wdqkv.tensor, {pr.W1, pr.H0 - 1});
      },
      "wdqkv.shape");
  expect_reject(
      t0, [](auto&, auto&, In& in, auto&) { in.wuq.in += 1; }, "wuq (out, in)");
  expect_reject(
      t0, [](auto&, auto&, In& in, auto&) { in.wuq.format = WeightFormat::NdInOut; }, "wuq.shape");
  expect_reject(
      tnz,
      [](auto&, auto&, In& in, auto&) {
        in.wdqkv.tensor = support::resized(in.wdqkv.tensor, 1, in.wdqkv.tensor.size(1) - (16));
      },
      "wdqkv.shape");
  expect_reject(
      tnz, [](auto&, auto&, In& in, auto&) { in.wuq.format = WeightFormat::NdOutIn; }, "wuq.shape");
  expect_reject(
      t0,
      [](auto& pr, auto&, In& in, auto&) {
        in.wuk.tensor = support::reshaped(in.wuk.tensor, {pr.NH, pr.P, pr.C - 16});
      },
      "wuk.shape");
  expect_reject(
      t0, [](auto&, auto&, In& in, auto&) { in.wuk.nz = true; }, "wuk.shape");
  expect_reject(
      tnz,
      [](auto&, auto&, In& in, auto&) { in.wuk.tensor = support::resized(in.wuk.tensor, 3, 32); },
      "wuk.shape");
  expect_reject(
      tnz, [](auto&, auto&, In& in, auto&) { in.wuk.nz = false; }, "wuk.shape");
  expect_reject(
      t0,
      [](auto& pr, auto&, In& in, auto&) {
        in.de_scale0_bits = StridedView<const i64>(pr.ds0b.data(), {pr.W1});
      },
      "de_scale0 / de_scale0_bits");
  expect_reject(
      t0, [](auto&, auto&, In& in, auto&) { in.de_scale1 = {}; }, "de_scale1 / de_scale1_bits");
  expect_reject(
      t0,
      [](auto& pr, auto&, In& in, auto&) {
        in.de_scale0 = support::reshaped(in.de_scale0, {pr.W1 - 1});
      },
      "de_scale0.shape");
  expect_reject(
      t0,
      [](auto& pr, auto&, In& in, auto&) { in.bias1 = support::reshaped(in.bias1, {pr.W2 + 1}); },
      "bias1.shape");
  expect_reject(
      t1,
      [](auto& pr, auto&, In& in, auto&) {
        in.bias0 = StridedView<const i32>(pr.bias0.data(), {pr.W1});
      },
      "bias0 given with per-token quantization");
  expect_reject(
      t2,
      [](auto& pr, auto&, In& in, auto&) {
        in.bias1 = StridedView<const i32>(pr.bias1.data(), {pr.W2});
      },
      "bias1 given with per-token quantization");
  expect_reject(
      t0,
      [](auto& pr, auto&, In& in, auto&) {
        in.wdqkv_float = {CT(pr.input.data(), {1, 1}), 1, 1};
      },
      "wdqkv_float given in a quantized mode");
  expect_reject(
      tu,
      [](auto& pr, auto&, In& in, auto&) {
        in.wdqkv = {StridedView<const i8>(pr.wdqkv.data(), {pr.W1, pr.H0}), pr.W1, pr.H0};
      },
      "wdqkv / de_scale0 / bias0 given in Unquant mode");
  expect_reject(
      tu, [](auto&, auto&, In& in, auto&) { in.wuq_float = {}; }, "wuq_float");
  expect_reject(
      tu,
      [](auto& pr, auto&, In& in, auto&) {
        in.wuq_float.tensor = support::reshaped(in.wuq_float.tensor, {pr.W2 - 1, pr.Q});
      },
      "wuq_float.shape");
  // Outputs and caches per cache mode.
  expect_reject(
      t0,
      [](auto& pr, auto&, auto&, Out& out) {
        out.q_out = support::reshaped(out.q_out, {pr.N, pr.NH, pr.C});
      },
      "q_out.shape");
  expect_reject(
      t1,
      [](auto& pr, auto&, auto&, Out& out) {
        out.q_out = support::reshaped(out.q_out, {pr.N, pr.NH, pr.C + pr.R});
      },
      "q_out.shape");
  expect_reject(
      t1,
      [](auto& pr, auto&, auto&, Out& out) {
        out.q_rope_out = support::reshaped(out.q_rope_out, {pr.N, pr.NH, pr.R / 2});
      },
      "q_rope_out.shape");
  expect_reject(
      t0,
      [](auto& pr, auto&, auto&, Out& out) {
        out.q_rope_out = StridedView<half>(spare<half>(), {pr.N, pr.NH, pr.R});
      },
      "q_out_i8 / q_rope_out");
  expect_reject(
      t2, [](auto&, auto&, auto&, Out& out) { out.q_out_i8 = {}; }, "q_out_i8.shape");
  expect_reject(
      t1,
      [](auto& pr, auto&, auto&, Out& out) {
        out.q_out_i8 = StridedView<i8>(spare<i8>(), {pr.N, pr.NH, pr.C});
      },
      "q_out_i8 given without cache_mode Int8NzCache");
  expect_reject(
      t2,
      [](auto& pr, auto&, auto&, Out& out) {
        out.q_out = StridedView<half>(spare<half>(), {pr.N, pr.NH, 1});
      },
      "q_out given with cache_mode Int8NzCache");
  expect_reject(
      t0,
      [](auto& pr, auto&, auto&, Out& out) {
        out.caches.kv_cache =
            support::reshaped(out.caches.kv_cache, {pr.blocks, 128, 1, pr.C + pr.R - 1});
      },
      "kv_cache.shape");
  expect_reject(
      t0,
      [](auto& pr, auto&, auto&, Out& out) {
        out.caches.krope = StridedView<half>(spare<half>(), {pr.blocks, 128, 1, pr.R});
      },
      "ctkv / krope given for another cache mode");
  expect_reject(
      t1,
      [](auto& pr, auto&, auto&, Out& out) {
        out.caches.krope = support::reshaped(out.caches.krope, {pr.blocks - 1, 128, 1, pr.R});
      },
      "krope.shape");
  expect_reject(
      t1,
      [](auto& pr, auto&, auto&, Out& out) {
        out.caches.ctkv = support::reshaped(out.caches.ctkv, {pr.blocks, 128, 1, pr.C / 2});
      },
      "ctkv.shape");
  expect_reject(
      t1,
      [](auto& pr, auto&, auto&, Out& out) {
        out.caches.kv_cache = StridedView<half>(spare<half>(), {1, 16, 1, pr.C + pr.R});
      },
      "kv_cache / ctkv_i8 given for another cache mode");
  expect_reject(
      t2,
      [](auto& pr, auto&, auto&, Out& out) {
        out.caches.ctkv_i8 = support::reshaped(out.caches.ctkv_i8, {pr.blocks, pr.C / 16, 128, 16});
      },
      "ctkv_i8.shape");
  expect_reject(
      t2,
      [](auto& pr, auto&, auto&, Out& out) {
        out.caches.krope = support::reshaped(out.caches.krope, {pr.blocks, pr.R / 8, 128, 8});
      },
      "krope.shape");
  expect_reject(
      t3,
      [](auto& pr, auto&, auto&, Out& out) {
        out.caches.ctkv = support::reshaped(out.caches.ctkv, {pr.blocks, 128, 1, pr.C});
      },
      "ctkv.shape");
  expect_reject(
      t3,
      [](auto& pr, auto&, auto&, Out& out) {
        out.caches.krope = support::reshaped(out.caches.krope, {pr.blocks, pr.R / 16, 64, 16});
      },
      "krope.shape");
  // Block sizes ATB does not support.
  expect_reject(
      t0,
      [](auto& pr, auto&, auto&, Out& out) {
        out.caches.kv_cache = support::reshaped(out.caches.kv_cache, {1, 200, 1, pr.C + pr.R});
      },
      "caches block size");
  expect_reject(
      t3,
      [](auto& pr, auto&, auto&, Out& out) {
        out.caches.ctkv = support::reshaped(out.caches.ctkv, {pr.blocks * 2, pr.C / 16, 64, 16});
        out.caches.krope = support::reshaped(out.caches.krope, {pr.blocks * 2, pr.R / 16, 64, 16});
      },
      "caches block size");
  // Int8NzCache's scales.
  expect_reject(
      t2, [](auto&, auto&, In& in, auto&) { in.ctkv_scale = {}; }, "ctkv_scale.shape");
  expect_reject(
      t2, [](auto&, auto&, In& in, auto&) { in.ctkv_scale = CT(&zero, {1}); },
      "ctkv_scale not usable");
  expect_reject(
      t2,
      [](auto& pr, auto&, In& in, auto&) {
        in.q_nope_scale = support::reshaped(in.q_nope_scale, {pr.NH - 1});
      },
      "q_nope_scale.shape");
  expect_reject(
      t0, [](auto& pr, auto&, In& in, auto&) { in.ctkv_scale = CT(&pr.qs3, {1}); },
      "ctkv_scale / q_nope_scale given without cache_mode Int8NzCache");
  // Slots.
  expect_reject(
      t0, [](auto& pr, auto&, auto&, auto&) { pr.slots[1] = static_cast<i32>(pr.blocks * 128); },
      "slot_mapping[1] out of range", true);
  expect_reject(
      t2, [](auto& pr, auto&, auto&, auto&) { pr.slots[4] = 1 << 30; },
      "slot_mapping[4] out of range", true);
  expect_reject(
      t0,
      [](auto& pr, auto&, In& in, auto&) {
        in.slot_mapping = support::reshaped(in.slot_mapping, {pr.N - 1});
      },
      "slot_mapping.shape");
  // Parameters.
  expect_reject(
      t0, [](auto&, Params& p, auto&, auto&) { p.quant_mode = static_cast<MlaQuantMode>(7); },
      "params.quant_mode");
  expect_reject(
      t0, [](auto&, Params& p, auto&, auto&) { p.cache_mode = static_cast<MlaCacheMode>(9); },
      "params.cache_mode");
  expect_reject(
      t0, [](auto&, Params& p, auto&, auto&) { p.q_rotary_coeff = 1; }, "params.q_rotary_coeff");
  expect_reject(
      t0, [](auto&, Params& p, auto&, auto&) { p.k_rotary_coeff = 4; }, "k_rotary_coeff");
  expect_reject(
      t0, [](auto&, Params& p, auto&, auto&) { p.wdq_dim = 1536; }, "params.wdq_dim");
  expect_reject(
      t0, [](auto&, Params& p, auto&, auto&) { p.k_rope_dim = 64; }, "params.k_rope_dim");
  expect_reject(
      t0, [](auto&, Params& p, auto&, auto&) { p.transpose_wuk = false; }, "params.transpose_wuk");
  expect_reject(
      t0, [](auto&, Params& p, auto&, auto&) { p.epsilon = -1.0f; }, "params.epsilon");
  expect_reject(
      t0, [](auto&, Params& p, auto&, auto&) { p.dims.rope_dim = 15; }, "params.dims");
}

TEST(MlaStages, BadInputThrowsNamingTheArgumentAndWritesNothing) {
  using CT = StridedView<const half>;
  const Index rows = 3, n = 8;
  const std::vector<half> x(z(rows * n), half(1.0f)), gamma(z(n), half(1.0f));
  const half qs(0.5f), zero(0.0f);
  const i8 qo = 0;
  std::vector<i8> q(z(rows * n), kPoison8);
  std::vector<half> u(z(rows * n), tpoison<half>());
  std::vector<float> d(z(rows), -1.0f);
  const auto q0 = q;
  const auto u0 = u;
  const auto d0 = d;
  auto unchanged = [&] {
    EXPECT_TRUE(same(q, q0));
    EXPECT_TRUE(same(u, u0));
    EXPECT_TRUE(same(d, d0));
  };
  using NI = attnref::RmsNormQuantInputs<half>;
  using NO = attnref::RmsNormQuantOutputs<half>;
  auto norm = [&](MlaQuantMode m, NI in, NO out, const std::string& what) {
    support::expect_throw([&] { attnref::rms_norm_quant<half>(m, kEps, in, out); }, what, false);
    unchanged();
  };
  const NI ok{CT(x.data(), {rows, n}),
              CT(gamma.data(), {n}),
              {},
              CT(&qs, {1}),
              StridedView<const i8>(&qo, {1})};
  const NO okq{StridedView<i8>(q.data(), {rows, n})};
  NI bad = ok;
  bad.gamma = support::reshaped(bad.gamma, {n - 1});
  norm(MlaQuantMode::PerTensorAsymm, bad, okq, "gamma.shape");
  bad = ok;
  bad.quant_scale = {};
  norm(MlaQuantMode::PerTensorAsymm, bad, okq, "quant_scale.shape");
  bad = ok;
  bad.quant_scale = CT(&zero, {1});
  norm(MlaQuantMode::PerTensorAsymm, bad, okq, "quant_scale not usable");
  norm(MlaQuantMode::PerTokenSymm, ok,
       {StridedView<i8>(q.data(), {rows, n}), StridedView<float>(d.data(), {rows})},
       "quant_scale / quant_offset");
  bad = ok;
  bad.quant_scale = {};
  bad.quant_offset = {};
  norm(MlaQuantMode::PerTokenSymm, bad, okq, "out.descale.shape");
  norm(MlaQuantMode::PerTensorAsymm, ok,
       {StridedView<i8>(q.data(), {rows, n}), {}, {}, StridedView<half>(u.data(), {rows, n})},
       "out.unquant");
  norm(static_cast<MlaQuantMode>(5), ok, okq, "mode");
  support::expect_throw(
      [&] {
        attnref::rms_norm<half>(CT(x.data(), {rows, n}), CT(gamma.data(), {n}), kEps,
                                StridedView<half>(u.data(), {rows, n + 1}));
      },
      "out.shape", false);
  unchanged();

  // int8_matmul / float_matmul.
  const std::vector<i8> a(z(rows * n), 1), w(z(4 * n), 1);
  const std::vector<float> ds(4, 1.0f), ts(z(rows), 1.0f);
  const std::vector<i64> dsb(4, 0);
  const std::vector<i32> bias(4, 0);
  std::vector<half> mo(z(rows * 4), tpoison<half>());
  const auto mo0 = mo;
  const attnref::Int8MatmulInputs mok{StridedView<const i8>(a.data(), {rows, n}),
                                      {StridedView<const i8>(w.data(), {4, n}), 4, n},
                                      {},
                                      StridedView<const float>(ds.data(), {4})};
  auto mm = [&](const attnref::Int8MatmulInputs& in, const std::string& what) {
    support::expect_throw(
        [&] {
          attnref::int8_matmul<half>(in, StridedView<half>(mo.data(), {rows, 4}));
        },
        what, false);
    EXPECT_TRUE(same(mo, mo0));
  };
  auto mi = mok;
  mi.de_scale_bits = StridedView<const i64>(dsb.data(), {4});
  mm(mi, "de_scale / de_scale_bits");
  mi = mok;
  mi.token_scale = StridedView<const float>(ts.data(), {rows});
  mi.bias = StridedView<const i32>(bias.data(), {4});
  mm(mi, "bias given with per-token scales");
  mi = mok;
  mi.zero_point = StridedView<const float>(ts.data(), {rows});
  mm(mi, "zero_point given without token_scale");
  mi = mok;
  mi.w.format = WeightFormat::Nz;
  mm(mi, "w.shape");
  mi = mok;
  mi.de_scale = support::reshaped(mi.de_scale, {3});
  mm(mi, "de_scale.shape");
  const std::vector<half> af(z(rows * n), half(1.0f)), wf(z(4 * n), half(1.0f));
  support::expect_throw(
      [&] {
        attnref::float_matmul<half>(CT(af.data(), {rows, n}), {CT(wf.data(), {4, n}), 4, n + 1},
                                    StridedView<half>(mo.data(), {rows, 4}));
      },
      "w (out, in)", false);
  EXPECT_TRUE(same(mo, mo0));

  // rope_rotate_half, q_nope_absorb.
  const Index R = 4, heads = 2;
  const std::vector<half> rx(z(rows * heads * R), half(1.0f)), sc(z(rows * R), half(0.5f));
  std::vector<half> ro(rx.size(), tpoison<half>());
  const auto ro0 = ro;
  auto rope = [&](Index r_sin, Index cos_rows, Index out_w, int coeff, const std::string& what) {
    support::expect_throw(
        [&] {
          attnref::rope_rotate_half<half>(CT(rx.data(), {rows, heads * R}),
                                          CT(sc.data(), {rows, r_sin}),
                                          CT(sc.data(), {cos_rows, r_sin}), heads,
                                          StridedView<half>(ro.data(), {rows, out_w}), coeff);
        },
        what, false);
    EXPECT_TRUE(same(ro, ro0));
  };
  rope(R, rows, heads * R, 1, "rotary_coeff");
  rope(3, rows, heads * R, 2, "sin.shape[1]");
  rope(R, rows - 1, heads * R, 2, "cos.shape");
  rope(R, rows, heads * R - 1, 2, "out.shape");
  const std::vector<half> qn(z(rows * heads * 16), half(1.0f)), wk(z(heads * 16 * 32), half(1.0f));
  std::vector<float> qa(z(rows * heads * 32), NAN);
  support::expect_throw(
      [&] {
        attnref::q_nope_absorb<half>(CT(qn.data(), {rows, heads, 16}),
                                     {CT(wk.data(), {heads, 15, 32}), false},
                                     StridedView<float>(qa.data(), {rows, heads, 32}));
      },
      "wuk.shape", false);
  support::expect_throw(
      [&] {
        attnref::q_nope_absorb<half>(CT(qn.data(), {rows, heads, 16}),
                                     {CT(wk.data(), {heads, 16, 32}), false},
                                     StridedView<float>(qa.data(), {rows, heads, 16}));
      },
      "out.shape", false);
  for (float v : qa) EXPECT_TRUE(std::isnan(v));

  // mla_reshape_and_cache.
  const Index C = 32, RR = 16, bs = 16, blocks = 2;
  const std::vector<half> kn(z(rows * C), half(1.0f)), kr(z(rows * RR), half(1.0f));
  std::vector<i32> slots{0, -1, 5};
  auto reshape = [&](int cm, const std::vector<i32>& sl, CT qs3, Index width,
                     const std::string& what, bool oor) {
    Caches<half> c(cm, blocks, bs, C, RR);
    const Caches<half> c0(cm, blocks, bs, C, RR);
    auto refs = c.refs(C, RR);
    if (cm == 0 && width) refs.kv_cache = support::resized(refs.kv_cache, 3, width);
    support::expect_throw(
        [&] {
          attnref::mla_reshape_and_cache<half>(
              static_cast<MlaCacheMode>(cm), CT(kn.data(), {rows, C}), CT(kr.data(), {rows, RR}),
              StridedView<const i32>(sl.data(), {rows}), qs3, refs);
        },
        what, oor);
    EXPECT_TRUE(same_caches(c, c0));
  };
  reshape(0, {0, -1, static_cast<i32>(blocks * bs)}, {}, 0, "slot_mapping[2] out of range", true);
  reshape(2, slots, {}, 0, "quant_scale3.shape", false);
  reshape(2, slots, CT(&zero, {1}), 0, "quant_scale3 not usable", false);
  reshape(1, slots, CT(&qs, {1}), 0, "quant_scale3 given outside Int8NzCache", false);
  reshape(0, slots, {}, C, "kv_cache.shape", false);
  support::expect_throw(
      [&] {
        Caches<half> c(0, blocks, bs, C, RR);
        attnref::mla_reshape_and_cache<half>(
            static_cast<MlaCacheMode>(9), CT(kn.data(), {rows, C}), CT(kr.data(), {rows, RR}),
            StridedView<const i32>(slots.data(), {rows}), {}, c.refs(C, RR));
      },
      "cache_mode", false);
}

}  // namespace mla_preprocess_test
