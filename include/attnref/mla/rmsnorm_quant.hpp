#pragma once
/// RmsNorm and RmsNormQuant of ATB's MlaPreprocess (docs/semantics.md §5 steps 1, 3 and 6).
///
/// Each row x of n values (fp16 / bf16 / float), every step one fp32 operation rounded once:
///   ss = fp32(Σ x²) (summed in double), r = 1 / sqrt(ss / n + eps), y = (x · r) · gamma
/// rms_norm:       out = T(y)
/// rms_norm_quant: yb = y + beta (when given), then by mode
///   PerTensorAsymm: q = sat8(rne((yb · fp32(1 / quant_scale)) + quant_offset))
///   PerTokenSymm:   h = T(yb), s = 127 / max|h|, q = sat8(rne(h · s)), descale = 1 / s
///                   (max|h| = 0: q = 0, descale = 0)
///   PerTokenAsymm:  h = T(yb), s = (max h − min h) / 255 (1 when equal), zp = −128 − min h / s,
///                   q = sat8(rne(h / s + zp)), descale = s, zero point zp (x ≈ (q − zp)·s) —
///                   attnref's choice: the vendor documents no golden for this mode
///   Unquant:        out = T(yb)
/// rne rounds half to even, sat8 clamps to [−128, 127].

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "attnref/core/dense.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/types.hpp"
#include "attnref/mla/params.hpp"

namespace attnref {

namespace detail::mla {

/// Keeps the compiler from fusing the rounded product `v` into a following sum (GCC contracts
/// a*b + c into an fma by default, even across a float conversion): an empty asm that claims to
/// modify v, free at run time.
inline float fp_barrier(float v) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  __asm__("" : "+x"(v));
#elif defined(__GNUC__) && defined(__aarch64__)
  __asm__("" : "+w"(v));
#else
  volatile float t = v;
  v = t;
#endif
  return v;
}

// One fp32 operation rounded once. The double operation on two floats is exact for products
// and correctly rounded to float for sums, quotients and square roots; the product goes through
// fp_barrier so that it is never contracted with a sum.
inline float fmul(float a, float b) {
  return fp_barrier(static_cast<float>(double(a) * double(b)));
}
inline float fadd(float a, float b) { return static_cast<float>(double(a) + double(b)); }
inline float fdiv(float a, float b) { return static_cast<float>(double(a) / double(b)); }
inline float fsqrt(float a) { return static_cast<float>(std::sqrt(double(a))); }

/// clamp(round half to even(x), -128, 127); NaN gives 0.
inline std::int8_t sat8_rne(float x) {
  if (std::isnan(x)) return 0;
  const float r = std::nearbyint(std::min(std::max(x, -129.0f), 128.0f));
  return static_cast<std::int8_t>(std::min(std::max(r, -128.0f), 127.0f));
}

template <class T>
float round_to(float x) {
  return static_cast<float>(T(x));
}

inline std::string dims(Index a, Index b) {
  return "[" + std::to_string(a) + ", " + std::to_string(b) + "]";
}

/// A 2-D tensor [rows, cols] (any rank-2 shape) or a vector of `n` values.
template <class T>
void check_matrix(const char* fn, const char* arg, const StridedView<T>& t, Index rows,
                  Index cols) {
  ATTNREF_CHECK(!t.absent() && t.rank() == 2 && t.size(0) == rows && t.size(1) == cols,
                std::invalid_argument, fn, std::string(arg) + ".shape", "mismatch",
                dims(rows, cols), shape_str(t));
}
template <class T>
void check_vector(const char* fn, const char* arg, const StridedView<T>& t, Index n) {
  ATTNREF_CHECK(!t.absent() && t.numel() == n && t.rank() >= 1, std::invalid_argument, fn,
                std::string(arg) + ".shape", "mismatch", std::to_string(n) + " values",
                shape_str(t));
}

/// y = (x · r) · gamma of one row (fp32), r the row's reciprocal rms.
template <class T>
void rms_row(const T* x, const T* gamma, Index n, float eps, float* y) {
  double ss = 0.0;
  for (Index j = 0; j < n; ++j) {
    const double v = static_cast<float>(x[j]);
    ss += v * v;
  }
  const float ms = fdiv(static_cast<float>(ss), static_cast<float>(n));
  const float r = fdiv(1.0f, fsqrt(fadd(ms, eps)));
  for (Index j = 0; j < n; ++j)
    y[j] = fmul(fmul(static_cast<float>(x[j]), r), static_cast<float>(gamma[j]));
}

}  // namespace detail::mla

namespace detail {
/// rms_norm on dense arguments: the public entry below passes every view through a
/// DenseArena first.
template <class T>
void rms_norm_dense(const StridedView<const T>& x, const StridedView<const T>& gamma, float epsilon,
                    const StridedView<T>& out) {
  static_assert(std::is_same_v<T, half> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float>,
                "rms_norm: half, bfloat16 or float");
  constexpr const char* fn = "rms_norm";
  detail::check_views(fn, "x", x, "gamma", gamma, "out", out);
  ATTNREF_CHECK(!x.absent() && x.rank() == 2, std::invalid_argument, fn, "x.shape", "not 2-D",
                "[rows, n]", detail::shape_str(x));
  const Index rows = x.size(0), n = x.size(1);
  detail::mla::check_vector(fn, "gamma", gamma, n);
  detail::mla::check_matrix(fn, "out", out, rows, n);
  ATTNREF_CHECK(epsilon >= 0.0f && std::isfinite(epsilon), std::invalid_argument, fn, "epsilon",
                "out of range", ">= 0 and finite", std::to_string(epsilon));
  std::vector<float> y(static_cast<size_t>(n));
  for (Index r = 0; r < rows; ++r) {
    detail::mla::rms_row(x.data() + r * n, gamma.data(), n, epsilon, y.data());
    for (Index j = 0; j < n; ++j) out.data()[r * n + j] = T(y[static_cast<size_t>(j)]);
  }
}
}  // namespace detail

/// out[r] = T(rmsnorm(x[r]) · gamma). x, out: [rows, n]; gamma: n values.
template <class T>
void rms_norm(const StridedView<const T>& x, const StridedView<const T>& gamma, float epsilon,
              const StridedView<T>& out) {
  detail::DenseArena arena("rms_norm");
  StridedView<const T> dx = x, dg = gamma;
  StridedView<T> dout = out;
  arena.input("x", dx);
  arena.input("gamma", dg);
  arena.output("out", dout);
  detail::rms_norm_dense(dx, dg, epsilon, dout);
  arena.commit();
}

/// RmsNormQuant's inputs (one model dtype T). quant_scale / quant_offset: PerTensorAsymm only.
template <class T>
struct RmsNormQuantInputs {
  StridedView<const T> x;                         ///< [rows, n]
  StridedView<const T> gamma;                     ///< n values
  StridedView<const T> beta{};                    ///< n values, optional
  StridedView<const T> quant_scale{};             ///< [1] (PerTensorAsymm)
  StridedView<const std::int8_t> quant_offset{};  ///< [1] (PerTensorAsymm)

  /// Calls f(name, view) for every tensor field.
  template <class F>
  void for_each_view(F&& f) {
    f("x", x), f("gamma", gamma), f("beta", beta), f("quant_scale", quant_scale);
    f("quant_offset", quant_offset);
  }
};

/// RmsNormQuant's outputs: q for the quantized modes (with descale per token, and zero_point
/// for PerTokenAsymm), unquant for Unquant.
template <class T>
struct RmsNormQuantOutputs {
  StridedView<std::int8_t> q{};     ///< [rows, n]
  StridedView<float> descale{};     ///< [rows] (per-token modes)
  StridedView<float> zero_point{};  ///< [rows] (PerTokenAsymm)
  StridedView<T> unquant{};         ///< [rows, n] (Unquant)

  /// Calls f(name, view) for every tensor field.
  template <class F>
  void for_each_view(F&& f) {
    f("q", q), f("descale", descale), f("zero_point", zero_point), f("unquant", unquant);
  }
};

namespace detail {
/// rms_norm_quant on dense arguments: the public entry below passes every view through a
/// DenseArena first.
template <class T>
void rms_norm_quant_dense(MlaQuantMode mode, float epsilon, const RmsNormQuantInputs<T>& in,
                          const RmsNormQuantOutputs<T>& out) {
  static_assert(std::is_same_v<T, half> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float>,
                "rms_norm_quant: half, bfloat16 or float");
  using namespace detail::mla;
  constexpr const char* fn = "rms_norm_quant";
  detail::check_views(fn, "x", in.x, "gamma", in.gamma, "beta", in.beta, "quant_scale",
                      in.quant_scale, "quant_offset", in.quant_offset, "q", out.q, "descale",
                      out.descale, "zero_point", out.zero_point, "unquant", out.unquant);
  const int m = static_cast<int>(mode);
  ATTNREF_CHECK(m >= 0 && m <= 3, std::invalid_argument, fn, "mode", "out of range", "0 to 3",
                std::to_string(m));
  ATTNREF_CHECK(!in.x.absent() && in.x.rank() == 2, std::invalid_argument, fn, "x.shape", "not 2-D",
                "[rows, n]", detail::shape_str(in.x));
  ATTNREF_CHECK(epsilon >= 0.0f && std::isfinite(epsilon), std::invalid_argument, fn, "epsilon",
                "out of range", ">= 0 and finite", std::to_string(epsilon));
  const Index rows = in.x.size(0), n = in.x.size(1);
  check_vector(fn, "gamma", in.gamma, n);
  if (!in.beta.absent()) check_vector(fn, "beta", in.beta, n);
  const bool per_tensor = mode == MlaQuantMode::PerTensorAsymm;
  const bool per_token = mode == MlaQuantMode::PerTokenSymm || mode == MlaQuantMode::PerTokenAsymm;
  if (per_tensor) {
    check_vector(fn, "quant_scale", in.quant_scale, 1);
    check_vector(fn, "quant_offset", in.quant_offset, 1);
    const float qs = static_cast<float>(in.quant_scale.data()[0]);
    ATTNREF_CHECK(qs != 0.0f && std::isfinite(qs), std::invalid_argument, fn, "quant_scale",
                  "not usable", "finite and nonzero", std::to_string(qs));
  } else {
    ATTNREF_CHECK(in.quant_scale.absent() && in.quant_offset.absent(), std::invalid_argument, fn,
                  "quant_scale / quant_offset", "given for a mode without a static scale", "none",
                  detail::shape_str(in.quant_scale));
  }
  if (mode == MlaQuantMode::Unquant) {
    check_matrix(fn, "out.unquant", out.unquant, rows, n);
    ATTNREF_CHECK(out.q.absent() && out.descale.absent() && out.zero_point.absent(),
                  std::invalid_argument, fn, "out.q", "given in Unquant mode", "none",
                  detail::shape_str(out.q));
  } else {
    check_matrix(fn, "out.q", out.q, rows, n);
    ATTNREF_CHECK(out.unquant.absent(), std::invalid_argument, fn, "out.unquant",
                  "given in a quantized mode", "none", detail::shape_str(out.unquant));
  }
  if (per_token)
    check_vector(fn, "out.descale", out.descale, rows);
  else
    ATTNREF_CHECK(out.descale.absent(), std::invalid_argument, fn, "out.descale",
                  "given in a mode without per-token scales", "none",
                  detail::shape_str(out.descale));
  if (mode == MlaQuantMode::PerTokenAsymm)
    check_vector(fn, "out.zero_point", out.zero_point, rows);
  else
    ATTNREF_CHECK(out.zero_point.absent(), std::invalid_argument, fn, "out.zero_point",
                  "given outside PerTokenAsymm", "none", detail::shape_str(out.zero_point));

  std::vector<float> y(static_cast<size_t>(n));
  const float inv =
      per_tensor ? static_cast<float>(1.0 / double(static_cast<float>(in.quant_scale.data()[0])))
                 : 0.0f;
  const float off = per_tensor ? static_cast<float>(in.quant_offset.data()[0]) : 0.0f;
  for (Index r = 0; r < rows; ++r) {
    rms_row(in.x.data() + r * n, in.gamma.data(), n, epsilon, y.data());
    if (!in.beta.absent())
      for (Index j = 0; j < n; ++j)
        y[static_cast<size_t>(j)] =
            fadd(y[static_cast<size_t>(j)], static_cast<float>(in.beta.data()[j]));
    std::int8_t* q = out.q.data() == nullptr ? nullptr : out.q.data() + r * n;
    switch (mode) {
      case MlaQuantMode::PerTensorAsymm:
        for (Index j = 0; j < n; ++j)
          q[j] = sat8_rne(fadd(fmul(y[static_cast<size_t>(j)], inv), off));
        break;
      case MlaQuantMode::PerTokenSymm: {
        float a = 0.0f;
        for (float& v : y) {
          v = round_to<T>(v);
          a = std::max(a, std::fabs(v));
        }
        if (a == 0.0f) {
          std::fill(q, q + n, std::int8_t{0});
          out.descale.data()[r] = 0.0f;
          break;
        }
        const float s = fdiv(127.0f, a);
        for (Index j = 0; j < n; ++j) q[j] = sat8_rne(fmul(y[static_cast<size_t>(j)], s));
        out.descale.data()[r] = fdiv(1.0f, s);
        break;
      }
      case MlaQuantMode::PerTokenAsymm: {
        float lo = INFINITY, hi = -INFINITY;
        for (float& v : y) {
          v = round_to<T>(v);
          lo = std::min(lo, v);
          hi = std::max(hi, v);
        }
        float s = fdiv(fadd(hi, -lo), 255.0f);
        if (!(s > 0.0f)) s = 1.0f;
        const float zp = fadd(-128.0f, -fdiv(lo, s));
        for (Index j = 0; j < n; ++j) q[j] = sat8_rne(fadd(fdiv(y[static_cast<size_t>(j)], s), zp));
        out.descale.data()[r] = s;
        out.zero_point.data()[r] = zp;
        break;
      }
      case MlaQuantMode::Unquant:
        for (Index j = 0; j < n; ++j) out.unquant.data()[r * n + j] = T(y[static_cast<size_t>(j)]);
        break;
    }
  }
}
}  // namespace detail

template <class T>
void rms_norm_quant(MlaQuantMode mode, float epsilon, const RmsNormQuantInputs<T>& in,
                    const RmsNormQuantOutputs<T>& out) {
  detail::DenseArena arena("rms_norm_quant");
  RmsNormQuantInputs<T> din = in;
  RmsNormQuantOutputs<T> dout = out;
  din.for_each_view([&](const std::string& name, auto& v) { arena.input(name, v); });
  dout.for_each_view([&](const std::string& name, auto& v) { arena.output(name, v); });
  detail::rms_norm_quant_dense(mode, epsilon, din, dout);
  arena.commit();
}

}  // namespace attnref
