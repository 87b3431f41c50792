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
float f32_odd(double x);

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

std::vector<float> rms_norm(const std::vector<float>& x, int rows, int n,
                            const std::vector<float>& gamma, float eps);

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

Quantized rms_norm_quant(int mode, const std::vector<float>& x, int rows, int n,
                         const std::vector<float>& gamma, const std::vector<float>& beta,
                         float quant_scale, int quant_offset, float eps, Dt dt);

// ---------------------------------------------------------------------------------------------
// Stage 3: int8 matmul. a [M, K], w [Nout, K] (row n = output channel n), bias empty or [Nout]
// (mode 0 only: the per-token modes take no bias), descale [Nout] fp32, d / zp [M] per token
// (mode 1: d; mode 2: d and zp). Returns T values [M, Nout].

std::vector<float> int8_matmul(int mode, const std::vector<std::int8_t>& a, int M, int K,
                               const std::vector<std::int8_t>& w, int Nout,
                               const std::vector<std::int32_t>& bias,
                               const std::vector<float>& descale, const std::vector<float>& d,
                               const std::vector<float>& zp, Dt dt);

// UNQUANT matmul: a [M, K] T values, w [Nout, K] T values -> T(f(double sum)) [M, Nout].
std::vector<float> float_matmul(const std::vector<float>& a, int M, int K,
                                const std::vector<float>& w, int Nout, Dt dt);

// ---------------------------------------------------------------------------------------------
// Stage 4: RoPE, rotate half. x [N, heads * R] (T values), sin / cos [N, R] shared by the heads.
// A product of two T values is exact in double (and in fp32), so T(x * c) is one rounding.

std::vector<float> rope(const std::vector<float>& x, int N, int heads, int R,
                        const std::vector<float>& sin, const std::vector<float>& cos, Dt dt);

// ---------------------------------------------------------------------------------------------
// Stage 5: qn [N, Nh, P] x wuk [Nh, P, C] per head -> fp32 [N, Nh, C] (double sum, rounded once).

std::vector<float> q_wuk(const std::vector<float>& qn, int N, int Nh, int P,
                         const std::vector<float>& wuk, int C);

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
std::vector<float> norm_matmul(int quant_mode, const std::vector<float>& x, int N, int K,
                               const std::vector<float>& gamma, const std::vector<float>& beta,
                               float qs, int qo, const std::vector<std::int8_t>& w,
                               const std::vector<float>& w_f, int Nout,
                               const std::vector<std::int32_t>& bias,
                               const std::vector<float>& descale, float eps, Dt dt);

ChainOut chain(const Dims& d, int quant_mode, int cache_mode, const ChainIn& in, int N, float eps,
               Dt dt);

}  // namespace mla
}  // namespace ref
