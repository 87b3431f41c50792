#pragma once
// Independent reference of ATB MlaPreprocess (DeepSeek MLA input preparation), written from
// attnref's stage-by-stage definition (the MlaPreprocess definition document). Does not include
// attnref. Naive loops; every rounding step of the definition is emulated explicitly:
//
//  * f(.)  fp32 rounding: ONE double operation on float operands, then static_cast<float>
//          (53 >= 2 * 24 + 2, so this is the correctly rounded fp32 operation, also for sqrt),
//          in the order the definition gives. Sums the definition takes "in double, rounded
//          once" are double sums cast to float once.
//  * T(.)  rounding to the model dtype (fp16 or bf16, RNE) through Eigen::half / bfloat16.
//  * rne   nearbyint in the default rounding mode (ties to even); sat8 = clamp to [-128, 127].
//
//  Stage 1  RmsNorm core, row x of n values:
//             ss = f(sum x_j^2) (double sum); ms = f(ss / n); r = f(1 / f(sqrt(f(ms + eps))));
//             y_j = f(f(x_j * r) * gamma_j)
//  Stage 2  RmsNormQuant: yb_j = beta ? f(y_j + beta_j) : y_j, then
//             0 PER_TENSOR_ASYMM: inv = f(1 / double(qs)); q_j = sat8(rne(f(f(yb_j * inv) + o)))
//             1 PER_TOKEN_SYMM:   h = T(yb); a = max|h|; s = f(127 / a); q_j = sat8(rne(f(h_j s)));
//                                 d = f(1 / s)            (a == 0: q = 0, d = 0)
//             2 PER_TOKEN_ASYMM:  h = T(yb); s = f(f(hi - lo) / 255) (hi == lo: 1);
//                                 zp = f(-128 - f(lo / s)); q_j = sat8(rne(f(f(h_j / s) + zp)));
//                                 descale s, zero point zp
//             3 UNQUANT:          T(yb)
//  Stage 3  int8 matmul, acc = exact integer A·W^T, W given as [out, in]:
//             0: T(f(f(acc + bias[n]) * descale[n]))
//             1: T(f(f(f(acc) * descale[n]) * d[m]))
//             2: T(f(f(f(f(acc) - f(zp[m] * f(colsum[n]))) * descale[n]) * d[m]))
//             UNQUANT: T(f(sum_k a * w)) (double sum)
//  Stage 4  RoPE (rotate half): out_j = T(f(T(x_j cos_j) + T(rot_j sin_j))), rot = [-x2, x1]
//  Stage 5  q_nope · wuk per head: fp32 f(double sum); T of it, or in INT8_NZCACHE
//             fp16: sat8(rne(T(T(out) * scale)))   bf16: sat8(rne(f(T(out) * scale)))
//  Stage 6  K path: k_nope = T(RmsNorm core(kv[0:C], gamma)); k_rope = RoPE(kv[C:C+R]);
//             INT8_NZCACHE: inv3 = T(1 / double(qs3)); k8 = sat8(rne(fp16(f(k_nope * inv3))))
//  Stage 7  the chain: RmsNormQuant -> matmul (wdqkv) -> split [kv | ql] -> RmsNormQuant(ql) ->
//           matmul (wuq) -> [q_nope | q_rope] per head -> RoPE(q_rope), stage 5(q_nope), K path.
//
// Inputs said to be T values (x, gamma, beta, quant scales, sin / cos, weights) are taken as given
// and are not rounded again.

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace ref {
namespace mla {

enum class Dt { F16, BF16 };

inline void need(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(what);
}

// ---------------------------------------------------------------------------------------------
// Roundings.

// f(x): to fp32, round to nearest even.
inline float f32(double x) { return static_cast<float>(x); }

// x rounded to fp32 with round-to-odd: the float toward zero, with its last bit forced to 1
// when x is not a float. Rounding that to a format with >= 2 fewer significant bits (fp16: 11,
// bf16: 8, fp32: 24) gives the correct rounding of x itself (Boldo & Melquiond), which the
// naive double -> float -> T path does not when the float lands exactly on a T tie.
inline float f32_odd(double x) {
  float f = static_cast<float>(x);
  if (static_cast<double>(f) == x || !std::isfinite(f)) return f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(x)) f = std::nextafter(f, 0.0f);  // trunc
  std::uint32_t bits = 0;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 1u) == 0u) f = std::nextafter(f, x > 0 ? INFINITY : -INFINITY);  // the odd one
  return f;
}

inline float to_fp16(float x) { return static_cast<float>(Eigen::half(x)); }
inline float to_bf16(float x) { return static_cast<float>(Eigen::bfloat16(x)); }

// T(x): x rounded to the model dtype (RNE), as a float. Correctly rounded for any double x (via
// f32_odd). Where the definition rounds to fp32 first, callers pass the fp32 value, so T(f(.))
// keeps the definition's double rounding.
inline float rnd(double x, Dt dt) {
  const float f = f32_odd(x);
  return dt == Dt::F16 ? to_fp16(f) : to_bf16(f);
}

// sat8(rne(x)).
inline int sat8_rne(double x) {
  const double r = std::nearbyint(x);  // default rounding mode: ties to even
  return static_cast<int>(std::min(127.0, std::max(-128.0, r)));
}

// One fp32 operation on fp32 operands, rounded once.
// The product is stored through a volatile so that no compiler fuses it into a following sum.
inline float mul(float a, float b) {
  volatile float p = f32(static_cast<double>(a) * b);
  return p;
}
inline float dvd(float a, float b) { return f32(static_cast<double>(a) / b); }
inline float add(float a, float b) { return f32(static_cast<double>(a) + b); }
inline float sub(float a, float b) { return f32(static_cast<double>(a) - b); }

inline size_t ix(int a, int n, int b) {  // row-major index of [a][b] in rows of n
  return static_cast<size_t>(a) * static_cast<size_t>(n) + static_cast<size_t>(b);
}

// ---------------------------------------------------------------------------------------------
// Stage 1: RmsNorm core. x [rows, n] (T values), gamma [n]. Returns y (fp32), not rounded to T.

inline std::vector<float> rms_norm(const std::vector<float>& x, int rows, int n,
                                   const std::vector<float>& gamma, float eps) {
  need(x.size() == ix(rows, n, 0) && gamma.size() == static_cast<size_t>(n), "rms_norm: sizes");
  std::vector<float> y(x.size());
  for (int i = 0; i < rows; ++i) {
    double sum = 0.0;
    for (int j = 0; j < n; ++j) sum += static_cast<double>(x[ix(i, n, j)]) * x[ix(i, n, j)];
    const float ss = f32(sum);
    const float ms = dvd(ss, static_cast<float>(n));
    const float r = dvd(1.0f, f32(std::sqrt(static_cast<double>(add(ms, eps)))));
    for (int j = 0; j < n; ++j) y[ix(i, n, j)] = mul(mul(x[ix(i, n, j)], r), gamma[j]);
  }
  return y;
}

// ---------------------------------------------------------------------------------------------
// Stage 2: RmsNormQuant. mode 0 PER_TENSOR_QUANT_ASYMM, 1 PER_TOKEN_QUANT_SYMM,
// 2 PER_TOKEN_QUANT_ASYMM, 3 UNQUANT. beta empty: none. quant_scale (a T value) and quant_offset
// are used by mode 0 only.

struct Quantized {
  std::vector<std::int8_t> q;     // [rows, n], modes 0-2
  std::vector<float> descale;     // [rows], modes 1, 2 (d = f(1 / s), resp. s)
  std::vector<float> zero_point;  // [rows], mode 2
  std::vector<float> unquant;     // [rows, n] T values, mode 3
};

inline Quantized rms_norm_quant(int mode, const std::vector<float>& x, int rows, int n,
                                const std::vector<float>& gamma, const std::vector<float>& beta,
                                float quant_scale, int quant_offset, float eps, Dt dt) {
  need(mode >= 0 && mode <= 3, "rms_norm_quant: mode");
  need(beta.empty() || beta.size() == static_cast<size_t>(n), "rms_norm_quant: beta size");
  std::vector<float> yb = rms_norm(x, rows, n, gamma, eps);
  if (!beta.empty())
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < n; ++j) yb[ix(i, n, j)] = add(yb[ix(i, n, j)], beta[j]);

  Quantized out;
  if (mode == 3) {
    out.unquant.resize(yb.size());
    for (size_t k = 0; k < yb.size(); ++k) out.unquant[k] = rnd(yb[k], dt);
    return out;
  }
  out.q.resize(yb.size());
  if (mode == 0) {
    const float inv = f32(1.0 / static_cast<double>(quant_scale));
    const float o = static_cast<float>(quant_offset);
    for (size_t k = 0; k < yb.size(); ++k)
      out.q[k] = static_cast<std::int8_t>(sat8_rne(add(mul(yb[k], inv), o)));
    return out;
  }
  out.descale.resize(static_cast<size_t>(rows));
  if (mode == 2) out.zero_point.resize(static_cast<size_t>(rows));
  std::vector<float> h(static_cast<size_t>(n));
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < n; ++j) h[j] = rnd(yb[ix(i, n, j)], dt);  // T(yb), yb is fp32
    std::int8_t* q = &out.q[ix(i, n, 0)];
    if (mode == 1) {
      float a = 0.0f;
      for (float v : h) a = std::max(a, std::fabs(v));
      if (a == 0.0f) {
        std::fill(q, q + n, std::int8_t{0});
        out.descale[i] = 0.0f;
        continue;
      }
      const float s = dvd(127.0f, a);
      for (int j = 0; j < n; ++j) q[j] = static_cast<std::int8_t>(sat8_rne(mul(h[j], s)));
      out.descale[i] = dvd(1.0f, s);
    } else {
      const float lo = *std::min_element(h.begin(), h.end());
      const float hi = *std::max_element(h.begin(), h.end());
      const float s = hi == lo ? 1.0f : dvd(sub(hi, lo), 255.0f);
      const float zp = sub(-128.0f, dvd(lo, s));
      for (int j = 0; j < n; ++j) q[j] = static_cast<std::int8_t>(sat8_rne(add(dvd(h[j], s), zp)));
      out.descale[i] = s;
      out.zero_point[i] = zp;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Stage 3: int8 matmul. a [M, K], w [Nout, K] (row n = output channel n), bias empty or [Nout]
// (mode 0 only: the per-token modes take no bias), descale [Nout] fp32, d / zp [M] per token
// (mode 1: d; mode 2: d and zp). Returns T values [M, Nout].

inline std::vector<float> int8_matmul(int mode, const std::vector<std::int8_t>& a, int M, int K,
                                      const std::vector<std::int8_t>& w, int Nout,
                                      const std::vector<std::int32_t>& bias,
                                      const std::vector<float>& descale,
                                      const std::vector<float>& d, const std::vector<float>& zp,
                                      Dt dt) {
  need(mode >= 0 && mode <= 2, "int8_matmul: mode");
  need(a.size() == ix(M, K, 0) && w.size() == ix(Nout, K, 0), "int8_matmul: sizes");
  need(descale.size() == static_cast<size_t>(Nout), "int8_matmul: descale size");
  need(bias.empty() || (mode == 0 && bias.size() == static_cast<size_t>(Nout)),
       "int8_matmul: bias (mode 0 only, [Nout])");
  need(mode == 0 || d.size() == static_cast<size_t>(M), "int8_matmul: d size");
  need(mode != 2 || zp.size() == static_cast<size_t>(M), "int8_matmul: zp size");
  std::vector<float> out(ix(M, Nout, 0));
  for (int n = 0; n < Nout; ++n) {
    std::int64_t colsum = 0;
    for (int k = 0; k < K; ++k) colsum += w[ix(n, K, k)];
    for (int m = 0; m < M; ++m) {
      std::int64_t acc = 0;
      for (int k = 0; k < K; ++k) acc += static_cast<std::int64_t>(a[ix(m, K, k)]) * w[ix(n, K, k)];
      float v = 0.0f;
      if (mode == 0) {
        const std::int64_t b = bias.empty() ? 0 : bias[n];
        v = mul(f32(static_cast<double>(acc + b)), descale[n]);
      } else if (mode == 1) {
        v = mul(mul(f32(static_cast<double>(acc)), descale[n]), d[m]);
      } else {
        const float corr = mul(zp[m], f32(static_cast<double>(colsum)));
        v = mul(mul(sub(f32(static_cast<double>(acc)), corr), descale[n]), d[m]);
      }
      out[ix(m, Nout, n)] = rnd(v, dt);
    }
  }
  return out;
}

// UNQUANT matmul: a [M, K] T values, w [Nout, K] T values -> T(f(double sum)) [M, Nout].
inline std::vector<float> float_matmul(const std::vector<float>& a, int M, int K,
                                       const std::vector<float>& w, int Nout, Dt dt) {
  need(a.size() == ix(M, K, 0) && w.size() == ix(Nout, K, 0), "float_matmul: sizes");
  std::vector<float> out(ix(M, Nout, 0));
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < Nout; ++n) {
      double sum = 0.0;
      for (int k = 0; k < K; ++k) sum += static_cast<double>(a[ix(m, K, k)]) * w[ix(n, K, k)];
      out[ix(m, Nout, n)] = rnd(f32(sum), dt);
    }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Stage 4: RoPE, rotate half. x [N, heads * R] (T values), sin / cos [N, R] shared by the heads.
// A product of two T values is exact in double (and in fp32), so T(x * c) is one rounding.

inline std::vector<float> rope(const std::vector<float>& x, int N, int heads, int R,
                               const std::vector<float>& sin, const std::vector<float>& cos,
                               Dt dt) {
  need(R % 2 == 0, "rope: R must be even");
  need(x.size() == ix(N, heads * R, 0) && sin.size() == ix(N, R, 0) && cos.size() == sin.size(),
       "rope: sizes");
  const int half = R / 2;
  std::vector<float> out(x.size());
  for (int t = 0; t < N; ++t)
    for (int h = 0; h < heads; ++h) {
      const float* xr = &x[ix(t, heads * R, h * R)];
      for (int j = 0; j < R; ++j) {
        const float rot = j < half ? -xr[j + half] : xr[j - half];
        const float a = rnd(static_cast<double>(xr[j]) * cos[ix(t, R, j)], dt);
        const float b = rnd(static_cast<double>(rot) * sin[ix(t, R, j)], dt);
        out[ix(t, heads * R, h * R + j)] = rnd(add(a, b), dt);
      }
    }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Stage 5: qn [N, Nh, P] x wuk [Nh, P, C] per head -> fp32 [N, Nh, C] (double sum, rounded once).

inline std::vector<float> q_wuk(const std::vector<float>& qn, int N, int Nh, int P,
                                const std::vector<float>& wuk, int C) {
  need(qn.size() == ix(N * Nh, P, 0) && wuk.size() == ix(Nh * P, C, 0), "q_wuk: sizes");
  std::vector<float> out(ix(N * Nh, C, 0));
  for (int t = 0; t < N; ++t)
    for (int h = 0; h < Nh; ++h)
      for (int c = 0; c < C; ++c) {
        double sum = 0.0;
        for (int k = 0; k < P; ++k)
          sum += static_cast<double>(qn[ix(t * Nh + h, P, k)]) * wuk[ix(h * P + k, C, c)];
        out[ix(t * Nh + h, C, c)] = f32(sum);
      }
  return out;
}

// Stage 5, INT8_NZCACHE: v_T = T(out), scale_T = qNopeScale[h] (a T value).
//   fp16: sat8(rne(fp16(v * scale)))     bf16: sat8(rne(f(v * scale)))
inline std::int8_t q_nope_quant(float v_T, float scale_T, Dt dt) {
  const double p = static_cast<double>(v_T) * scale_T;  // exact
  const double r = dt == Dt::F16 ? rnd(p, Dt::F16) : f32(p);
  return static_cast<std::int8_t>(sat8_rne(r));
}

// Stage 6, INT8_NZCACHE: inv3 = T(1 / double(qs3)); sat8(rne(fp16(f(v * inv3)))), fp16 even for
// bf16 models (fp16 overflow gives +-inf, saturated to 127 / -128).
inline std::int8_t k_nope_quant(float v_T, float qs3_T, Dt dt) {
  const float inv3 = rnd(1.0 / static_cast<double>(qs3_T), dt);
  return static_cast<std::int8_t>(sat8_rne(to_fp16(mul(v_T, inv3))));
}

// Offset of element j of the row of slot (block, off) in an NZ cache
// [numBlocks, width / c0, blockSize, c0]: [block][j / c0][off][j % c0].
inline size_t nz_cache_index(int block, int off, int j, int width, int block_size, int c0) {
  const size_t tiles = static_cast<size_t>(width / c0);
  return ((static_cast<size_t>(block) * tiles + static_cast<size_t>(j / c0)) *
              static_cast<size_t>(block_size) +
          static_cast<size_t>(off)) *
             static_cast<size_t>(c0) +
         static_cast<size_t>(j % c0);
}

// ---------------------------------------------------------------------------------------------
// Stage 7: the chain. quant_mode 0..3 (stage 2, used for both RmsNormQuant steps; 3 = UNQUANT
// with float matmuls), cache_mode 0 KVCACHE, 1 KROPE_CTKV, 2 INT8_NZCACHE, 3 NZCACHE. One eps for
// the three RmsNorms.

struct Dims {
  int hidden = 7168, kv_lora = 512, rope = 64, q_lora = 1536, nope = 128, heads = 1;
};

struct ChainIn {             // all ND, row-major; weights as [out, in]
  std::vector<float> input;  // [N, hidden]
  std::vector<float> gamma0, beta0;
  float quant_scale0 = 1;
  int quant_offset0 = 0;
  std::vector<std::int8_t> wdqkv;  // [kv_lora + rope + q_lora, hidden] (modes 0-2)
  std::vector<float> wdqkv_f;      // same shape, T values (mode 3)
  std::vector<std::int32_t> bias0;
  std::vector<float> descale0;
  std::vector<float> gamma1, beta1;
  float quant_scale1 = 1;
  int quant_offset1 = 0;
  std::vector<std::int8_t> wuq;  // [heads * (nope + rope), q_lora]
  std::vector<float> wuq_f;
  std::vector<std::int32_t> bias1;
  std::vector<float> descale1;
  std::vector<float> gamma2;        // [kv_lora]
  std::vector<float> sin, cos;      // [N, rope]
  std::vector<float> wuk;           // [heads, nope, kv_lora]
  std::vector<int> slots;           // [N], negative = skip (used by the caller's caches)
  float quant_scale3 = 1;           // cache mode 2
  std::vector<float> q_nope_scale;  // [heads], cache mode 2
};

struct ChainOut {
  std::vector<float> q_nope_T;         // [N, heads, kv_lora]: T(stage 5) (all modes)
  std::vector<std::int8_t> q_nope_i8;  // [N, heads, kv_lora]: cache mode 2 only
  std::vector<float> q_rope;           // [N, heads, rope] T values
  std::vector<float> k_nope, k_rope;   // [N, kv_lora], [N, rope] T values (before caching)
  std::vector<std::int8_t> k_nope_i8;  // [N, kv_lora] (cache mode 2)
  std::vector<float> mm1, mm2;         // [N, W1], [N, heads * (nope + rope)] T values
};

// One RmsNormQuant + matmul step of the chain: x [N, K] -> T [N, Nout].
inline std::vector<float> norm_matmul(int quant_mode, const std::vector<float>& x, int N, int K,
                                      const std::vector<float>& gamma,
                                      const std::vector<float>& beta, float qs, int qo,
                                      const std::vector<std::int8_t>& w,
                                      const std::vector<float>& w_f, int Nout,
                                      const std::vector<std::int32_t>& bias,
                                      const std::vector<float>& descale, float eps, Dt dt) {
  const Quantized xq = rms_norm_quant(quant_mode, x, N, K, gamma, beta, qs, qo, eps, dt);
  if (quant_mode == 3) return float_matmul(xq.unquant, N, K, w_f, Nout, dt);
  return int8_matmul(quant_mode, xq.q, N, K, w, Nout, bias, descale, xq.descale, xq.zero_point, dt);
}

inline ChainOut chain(const Dims& d, int quant_mode, int cache_mode, const ChainIn& in, int N,
                      float eps, Dt dt) {
  need(cache_mode >= 0 && cache_mode <= 3, "chain: cache_mode");
  const int C = d.kv_lora, R = d.rope, Q = d.q_lora, P = d.nope, Nh = d.heads;
  const int W1 = C + R + Q, W2 = Nh * (P + R);
  ChainOut o;

  // Steps 1-2: mm1 = [kv (C + R) | ql (Q)].
  o.mm1 = norm_matmul(quant_mode, in.input, N, d.hidden, in.gamma0, in.beta0, in.quant_scale0,
                      in.quant_offset0, in.wdqkv, in.wdqkv_f, W1, in.bias0, in.descale0, eps, dt);

  // Steps 3-5: mm2 = matmul(RmsNormQuant(ql), wuq) = per head [q_nope (P) | q_rope (R)].
  std::vector<float> ql(ix(N, Q, 0));
  for (int t = 0; t < N; ++t)
    for (int j = 0; j < Q; ++j) ql[ix(t, Q, j)] = o.mm1[ix(t, W1, C + R + j)];
  o.mm2 = norm_matmul(quant_mode, ql, N, Q, in.gamma1, in.beta1, in.quant_scale1, in.quant_offset1,
                      in.wuq, in.wuq_f, W2, in.bias1, in.descale1, eps, dt);

  // Step 6: split per head, RoPE on the rope part.
  std::vector<float> qn(ix(N * Nh, P, 0)), qr(ix(N * Nh, R, 0));
  for (int t = 0; t < N; ++t)
    for (int h = 0; h < Nh; ++h) {
      for (int j = 0; j < P; ++j) qn[ix(t * Nh + h, P, j)] = o.mm2[ix(t, W2, h * (P + R) + j)];
      for (int j = 0; j < R; ++j) qr[ix(t * Nh + h, R, j)] = o.mm2[ix(t, W2, h * (P + R) + P + j)];
    }
  o.q_rope = rope(qr, N, Nh, R, in.sin, in.cos, dt);

  // Step 7: stage 5.
  const std::vector<float> qw = q_wuk(qn, N, Nh, P, in.wuk, C);
  o.q_nope_T.resize(qw.size());
  for (size_t k = 0; k < qw.size(); ++k) o.q_nope_T[k] = rnd(qw[k], dt);
  if (cache_mode == 2) {
    need(in.q_nope_scale.size() == static_cast<size_t>(Nh), "chain: q_nope_scale size");
    o.q_nope_i8.resize(qw.size());
    for (int th = 0; th < N * Nh; ++th)
      for (int c = 0; c < C; ++c)
        o.q_nope_i8[ix(th, C, c)] =
            q_nope_quant(o.q_nope_T[ix(th, C, c)], in.q_nope_scale[th % Nh], dt);
  }

  // Step 8: the K path (stage 6).
  std::vector<float> kv_n(ix(N, C, 0)), kv_r(ix(N, R, 0));
  for (int t = 0; t < N; ++t) {
    for (int j = 0; j < C; ++j) kv_n[ix(t, C, j)] = o.mm1[ix(t, W1, j)];
    for (int j = 0; j < R; ++j) kv_r[ix(t, R, j)] = o.mm1[ix(t, W1, C + j)];
  }
  const std::vector<float> y = rms_norm(kv_n, N, C, in.gamma2, eps);
  o.k_nope.resize(y.size());
  for (size_t k = 0; k < y.size(); ++k) o.k_nope[k] = rnd(y[k], dt);
  o.k_rope = rope(kv_r, N, 1, R, in.sin, in.cos, dt);
  if (cache_mode == 2) {
    o.k_nope_i8.resize(o.k_nope.size());
    for (size_t k = 0; k < o.k_nope.size(); ++k)
      o.k_nope_i8[k] = k_nope_quant(o.k_nope[k], in.quant_scale3, dt);
  }
  return o;
}

}  // namespace mla
}  // namespace ref
