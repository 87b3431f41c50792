#pragma once
/// attnref::mla_preprocess — ATB MlaPreprocessOperation (docs/semantics.md §5): the whole input
/// preparation of DeepSeek's Multi-head Latent Attention, composed of the public stages
///
///   input [N, H0] ─ rms_norm_quant(gamma0, beta0, quantScale0/Offset0) ─ int8_matmul(wdqkv,
///   bias0, deScale0) ─> mm1 [N, C + R + Q] ─┬─ [0, C)      rms_norm(gamma2) ───────> k_nope
///                                           ├─ [C, C + R)  rope(sin, cos) ─────────> k_rope
///                                           └─ [C + R, ..) rms_norm_quant(gamma1, beta1,
///   quantScale1/Offset1) ─ int8_matmul(wuq, bias1, deScale1) ─> mm2 [N, heads, P + R]
///     mm2[.., 0:P] ─ q_nope_absorb(wuk) ─> q_nope [N, heads, C];  mm2[.., P:] ─ rope ─> q_rope
///   k_nope, k_rope ─ mla_reshape_and_cache(slot_mapping, cache_mode)
///
/// Outputs: KvCache: q_out [N, heads, C + R] = concat(T(q_nope), q_rope); KRopeCtkv and NzCache:
/// q_out [N, heads, C] = T(q_nope), q_rope_out [N, heads, R]; Int8NzCache: q_out_i8 [N, heads, C]
/// = sat8(rne(T(q_nope) · q_nope_scale[h])) (the product rounded to fp16 for fp16 models, fp32
/// for bf16), q_rope_out. Unquant: both norms give T(y + beta) and both matmuls are
/// floating-point (weights in T; biases and scales absent). Per-token modes take no biases.
/// One sin / cos pair [N, R] serves the query and the key (ATB's operation has one).
/// Everything is checked before anything is written; the caches are read-modify-write.

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/core/dense.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/exec.hpp"
#include "attnref/core/types.hpp"
#include "attnref/mla/int8_matmul.hpp"
#include "attnref/mla/params.hpp"
#include "attnref/mla/reshape_and_cache.hpp"
#include "attnref/mla/rmsnorm_quant.hpp"
#include "attnref/mla/rope.hpp"

namespace attnref {

/// MlaPreprocess inputs, named after ATB's (index in ATB's list in brackets).
template <class T>
struct MlaPreprocessInputs {
  StridedView<const T> input;                        ///< [0] [N, H0]
  StridedView<const T> gamma0, beta0;                ///< [1], [2] H0 values (beta optional)
  StridedView<const T> quant_scale0{};               ///< [3] [1] (PerTensorAsymm)
  StridedView<const std::int8_t> quant_offset0{};    ///< [4] [1] (PerTensorAsymm)
  WeightRef<std::int8_t> wdqkv{};                    ///< [5] [C + R + Q, H0] (quantized modes)
  WeightRef<T> wdqkv_float{};                        ///< [5] in Unquant mode
  StridedView<const float> de_scale0{};              ///< [6] C + R + Q values (fp32 ...
  StridedView<const std::int64_t> de_scale0_bits{};  ///< ... or int64 with the fp32 bits)
  StridedView<const std::int32_t> bias0{};           ///< [7] C + R + Q values (PerTensorAsymm)
  StridedView<const T> gamma1, beta1;                ///< [8], [9] Q values
  StridedView<const T> quant_scale1{};               ///< [10]
  StridedView<const std::int8_t> quant_offset1{};    ///< [11]
  WeightRef<std::int8_t> wuq{};                      ///< [12] [heads · (P + R), Q]
  WeightRef<T> wuq_float{};                          ///< [12] in Unquant mode
  StridedView<const float> de_scale1{};              ///< [13] heads · (P + R) values
  StridedView<const std::int64_t> de_scale1_bits{};
  StridedView<const std::int32_t> bias1{};       ///< [14]
  StridedView<const T> gamma2;                   ///< [15] C values
  StridedView<const T> cos, sin;                 ///< [16], [17] [N, R]
  WukRef<T> wuk;                                 ///< [18] [heads, P, C] (or NZ)
  StridedView<const std::int32_t> slot_mapping;  ///< [21] N values
  StridedView<const T> ctkv_scale{};             ///< [22] quantScale3 [1] (Int8NzCache)
  StridedView<const T> q_nope_scale{};           ///< [23] heads values (Int8NzCache)

  /// Calls f(name, view) for every tensor field.
  template <class F>
  void for_each_view(F&& f) {
    f("input", input), f("gamma0", gamma0), f("beta0", beta0), f("quant_scale0", quant_scale0);
    f("quant_offset0", quant_offset0), f("wdqkv", wdqkv.tensor),
        f("wdqkv_float", wdqkv_float.tensor);
    f("de_scale0", de_scale0), f("de_scale0_bits", de_scale0_bits), f("bias0", bias0);
    f("gamma1", gamma1), f("beta1", beta1), f("quant_scale1", quant_scale1);
    f("quant_offset1", quant_offset1), f("wuq", wuq.tensor), f("wuq_float", wuq_float.tensor);
    f("de_scale1", de_scale1), f("de_scale1_bits", de_scale1_bits), f("bias1", bias1);
    f("gamma2", gamma2), f("cos", cos), f("sin", sin), f("wuk", wuk.tensor);
    f("slot_mapping", slot_mapping), f("ctkv_scale", ctkv_scale), f("q_nope_scale", q_nope_scale);
  }
};

/// MlaPreprocess outputs; the caches ([19] ctkv / kv cache, [20] krope) are updated in place.
template <class T>
struct MlaPreprocessOutputs {
  StridedView<T> q_out{};  ///< KvCache [N, heads, C + R]; KRopeCtkv, NzCache [N, heads, C]
  StridedView<std::int8_t> q_out_i8{};  ///< Int8NzCache [N, heads, C]
  StridedView<T> q_rope_out{};          ///< modes 1-3 [N, heads, R]
  MlaCaches<T> caches{};

  /// Calls f(name, view) for every tensor field.
  template <class F>
  void for_each_view(F&& f) {
    f("q_out", q_out), f("q_out_i8", q_out_i8), f("q_rope_out", q_rope_out);
    caches.for_each_view(f);
  }
};

namespace detail {
namespace mla {
/// What mla_preprocess's checks found: the dims, the token and head counts, the modes and the
/// caches' block size.
struct MlaPrePlan {
  Index H0 = 0, C = 0, R = 0, Q = 0, P = 0, W1 = 0, W2 = 0, N = 0, NH = 0, bs = 0;
  MlaQuantMode mode = MlaQuantMode::Unquant;
  MlaCacheMode cm = MlaCacheMode::KvCache;
  bool unquant = false, per_tensor = false, int8_q = false;
};

/// The params: dims (sizes, int32 range, the int8 matmuls' limit), the fixed fields, the modes.
inline MlaPrePlan mla_pre_params(const char* fn, const MlaPreprocessParams& params) {
  const MlaDims& d = params.dims;
  MlaPrePlan pl;
  const Index H0 = pl.H0 = d.hidden_size, C = pl.C = d.kv_lora_rank, R = pl.R = d.rope_dim,
              Q = pl.Q = d.q_lora_rank, P = pl.P = d.nope_dim;
  ATTNREF_CHECK(H0 > 0 && C > 0 && R > 0 && R % 2 == 0 && Q > 0 && P > 0, std::invalid_argument, fn,
                "params.dims", "not positive (rope_dim even)", "positive sizes",
                "H0 " + std::to_string(H0) + ", C " + std::to_string(C) + ", R " +
                    std::to_string(R) + ", Q " + std::to_string(Q) + ", P " + std::to_string(P));
  constexpr Index kDimLimit = Index(1) << 31;  // ATB's dims are int32: sums and products of two fit
  ATTNREF_CHECK(H0 < kDimLimit && C < kDimLimit && R < kDimLimit && Q < kDimLimit && P < kDimLimit,
                std::invalid_argument, fn, "params.dims", "too large", "each below 2^31",
                "H0 " + std::to_string(H0) + ", C " + std::to_string(C) + ", R " +
                    std::to_string(R) + ", Q " + std::to_string(Q) + ", P " + std::to_string(P));
  pl.W1 = C + R + Q;
  ATTNREF_CHECK(params.wdq_dim == 0 || Index(params.wdq_dim) == Q, std::invalid_argument, fn,
                "params.wdq_dim", "differs from dims.q_lora_rank", "0 or " + std::to_string(Q),
                std::to_string(params.wdq_dim));
  ATTNREF_CHECK(params.q_rope_dim == 0 || Index(params.q_rope_dim) == R, std::invalid_argument, fn,
                "params.q_rope_dim", "differs from dims.rope_dim", "0 or " + std::to_string(R),
                std::to_string(params.q_rope_dim));
  ATTNREF_CHECK(params.k_rope_dim == 0 || Index(params.k_rope_dim) == R, std::invalid_argument, fn,
                "params.k_rope_dim", "differs from dims.rope_dim", "0 or " + std::to_string(R),
                std::to_string(params.k_rope_dim));
  ATTNREF_CHECK(
      params.q_rotary_coeff == 2 && params.k_rotary_coeff == 2, std::invalid_argument, fn,
      "params.q_rotary_coeff / k_rotary_coeff", "not supported", "2 (rotate half)",
      std::to_string(params.q_rotary_coeff) + " / " + std::to_string(params.k_rotary_coeff));
  ATTNREF_CHECK(params.transpose_wuk, std::invalid_argument, fn, "params.transpose_wuk",
                "not supported", "true", "false");
  ATTNREF_CHECK(params.epsilon >= 0.0f && std::isfinite(params.epsilon), std::invalid_argument, fn,
                "params.epsilon", "out of range", ">= 0 and finite",
                std::to_string(params.epsilon));
  const int qm = static_cast<int>(params.quant_mode);
  ATTNREF_CHECK(qm >= 0 && qm <= 3, std::invalid_argument, fn, "params.quant_mode", "out of range",
                "0 to 3", std::to_string(qm));
  const MlaQuantMode mode = pl.mode = params.quant_mode;
  pl.cm = params.cache_mode;
  const bool unquant = pl.unquant = mode == MlaQuantMode::Unquant;
  pl.per_tensor = mode == MlaQuantMode::PerTensorAsymm;
  // The int8 matmuls reduce over H0 and Q in exact int32 only up to 2^16 (int8_matmul's limit):
  // checked here, under the argument that sets it, not inside the computation.
  ATTNREF_CHECK(unquant || (H0 <= (Index{1} << 16) && Q <= (Index{1} << 16)), std::invalid_argument,
                fn, "params.dims", "too large for the int8 matmuls",
                "hidden_size and q_lora_rank <= 65536 in the quantized modes",
                "H0 " + std::to_string(H0) + ", Q " + std::to_string(Q));

  return pl;
}

/// The input, wuk, the norm parameters, the static scales and the two matmuls' arguments.
template <class T>
void mla_pre_inputs(const char* fn, const MlaPreprocessInputs<T>& in, MlaPrePlan& pl) {
  const Index H0 = pl.H0, C = pl.C, R = pl.R, Q = pl.Q, P = pl.P, W1 = pl.W1;
  const bool unquant = pl.unquant, per_tensor = pl.per_tensor;
  ATTNREF_CHECK(!in.input.absent() && in.input.rank() == 2 && in.input.size(1) == H0,
                std::invalid_argument, fn, "input.shape", "mismatch",
                "[N, " + std::to_string(H0) + "]", shape_str(in.input));
  const Index N = pl.N = in.input.size(0);
  ATTNREF_CHECK(N > 0, std::invalid_argument, fn, "input.shape[0]", "no tokens", ">= 1",
                std::to_string(N));
  const auto& wk = in.wuk.tensor;
  ATTNREF_CHECK(!wk.absent() && (wk.rank() == 3 || wk.rank() == 4) && wk.size(0) > 0,
                std::invalid_argument, fn, "wuk.shape", "not [heads, P, C] or NZ",
                "[heads, " + std::to_string(P) + ", " + std::to_string(C) + "]", shape_str(wk));
  const Index NH = pl.NH = wk.size(0), W2 = pl.W2 = NH * (P + R);
  if (!in.wuk.nz)
    ATTNREF_CHECK(
        wk.rank() == 3 && wk.size(1) == P && wk.size(2) == C, std::invalid_argument, fn,
        "wuk.shape", "mismatch",
        "[" + std::to_string(NH) + ", " + std::to_string(P) + ", " + std::to_string(C) + "]",
        shape_str(wk));
  else
    ATTNREF_CHECK(wk.rank() == 4 && wk.size(1) * 16 == C && wk.size(2) == (P + 15) / 16 * 16 &&
                      wk.size(3) == 16,
                  std::invalid_argument, fn, "wuk.shape", "mismatch (NZ)",
                  "[" + std::to_string(NH) + ", " + std::to_string(C / 16) + ", " +
                      std::to_string((P + 15) / 16 * 16) + ", 16]",
                  shape_str(wk));

  // Norm parameters.
  check_vector(fn, "gamma0", in.gamma0, H0);
  if (!in.beta0.absent()) check_vector(fn, "beta0", in.beta0, H0);
  check_vector(fn, "gamma1", in.gamma1, Q);
  if (!in.beta1.absent()) check_vector(fn, "beta1", in.beta1, Q);
  check_vector(fn, "gamma2", in.gamma2, C);
  check_matrix(fn, "cos", in.cos, N, R);
  check_matrix(fn, "sin", in.sin, N, R);
  auto static_scale = [&](const StridedView<const T>& s, const StridedView<const std::int8_t>& o,
                          const char* sn, const char* on) {
    if (per_tensor) {
      check_vector(fn, sn, s, 1);
      check_vector(fn, on, o, 1);
      const float v = static_cast<float>(s.data()[0]);
      ATTNREF_CHECK(v != 0.0f && std::isfinite(v), std::invalid_argument, fn, sn, "not usable",
                    "finite and nonzero", std::to_string(v));
    } else {
      ATTNREF_CHECK(s.absent() && o.absent(), std::invalid_argument, fn,
                    std::string(sn) + " / " + on, "given for a mode without a static scale", "none",
                    shape_str(s));
    }
  };
  static_scale(in.quant_scale0, in.quant_offset0, "quant_scale0", "quant_offset0");
  static_scale(in.quant_scale1, in.quant_offset1, "quant_scale1", "quant_offset1");
  // Weights, scales and biases.
  auto matmul_args = [&](const WeightRef<std::int8_t>& w, const WeightRef<T>& wf,
                         const StridedView<const float>& ds,
                         const StridedView<const std::int64_t>& db,
                         const StridedView<const std::int32_t>& bias, Index rows, Index cols,
                         const std::string& wn, const std::string& sn, const std::string& bn) {
    if (unquant) {
      check_weight(fn, (wn + "_float").c_str(), wf, rows, cols);
      ATTNREF_CHECK(w.tensor.absent() && ds.absent() && db.absent() && bias.absent(),
                    std::invalid_argument, fn, wn + " / " + sn + " / " + bn,
                    "given in Unquant mode", "none (" + wn + "_float)", "a tensor");
      return;
    }
    check_weight(fn, wn.c_str(), w, rows, cols);
    ATTNREF_CHECK(wf.tensor.absent(), std::invalid_argument, fn, wn + "_float",
                  "given in a quantized mode", "none", shape_str(wf.tensor));
    ATTNREF_CHECK(ds.absent() != db.absent(), std::invalid_argument, fn, sn + " / " + sn + "_bits",
                  "exactly one is required", "one of them", "none or both");
    if (!ds.absent()) check_vector(fn, sn.c_str(), ds, rows);
    if (!db.absent()) check_vector(fn, (sn + "_bits").c_str(), db, rows);
    if (per_tensor) {
      if (!bias.absent()) check_vector(fn, bn.c_str(), bias, rows);
    } else {
      ATTNREF_CHECK(bias.absent(), std::invalid_argument, fn, bn,
                    "given with per-token quantization", "none", shape_str(bias));
    }
  };
  matmul_args(in.wdqkv, in.wdqkv_float, in.de_scale0, in.de_scale0_bits, in.bias0, W1, H0, "wdqkv",
              "de_scale0", "bias0");
  matmul_args(in.wuq, in.wuq_float, in.de_scale1, in.de_scale1_bits, in.bias1, W2, Q, "wuq",
              "de_scale1", "bias1");
}

/// The outputs of the cache mode, the caches, the int8 cache's scales and the slot mapping.
template <class T>
void mla_pre_outputs(const char* fn, const MlaPreprocessInputs<T>& in,
                     const MlaPreprocessOutputs<T>& out, MlaPrePlan& pl) {
  const Index C = pl.C, R = pl.R, N = pl.N, NH = pl.NH;
  const MlaCacheMode cm = pl.cm;
  // Outputs and caches.
  auto shape3 = [](Index a, Index b, Index c) {
    return "[" + std::to_string(a) + ", " + std::to_string(b) + ", " + std::to_string(c) + "]";
  };
  auto out3 = [&](const auto& t, const char* name, Index w) {
    ATTNREF_CHECK(
        !t.absent() && t.rank() == 3 && t.size(0) == N && t.size(1) == NH && t.size(2) == w,
        std::invalid_argument, fn, std::string(name) + ".shape", "mismatch", shape3(N, NH, w),
        shape_str(t));
  };
  const int cmi = static_cast<int>(cm);
  ATTNREF_CHECK(cmi >= 0 && cmi <= 3, std::invalid_argument, fn, "params.cache_mode",
                "out of range", "0 to 3", std::to_string(cmi));
  const bool int8_q = pl.int8_q = cm == MlaCacheMode::Int8NzCache;
  if (cm == MlaCacheMode::KvCache) {
    out3(out.q_out, "q_out", C + R);
    ATTNREF_CHECK(out.q_out_i8.absent() && out.q_rope_out.absent(), std::invalid_argument, fn,
                  "q_out_i8 / q_rope_out", "given with cache_mode KvCache", "none", "a tensor");
  } else {
    out3(out.q_rope_out, "q_rope_out", R);
    if (int8_q) {
      out3(out.q_out_i8, "q_out_i8", C);
      ATTNREF_CHECK(out.q_out.absent(), std::invalid_argument, fn, "q_out",
                    "given with cache_mode Int8NzCache", "none (q_out_i8)", shape_str(out.q_out));
    } else {
      out3(out.q_out, "q_out", C);
      ATTNREF_CHECK(out.q_out_i8.absent(), std::invalid_argument, fn, "q_out_i8",
                    "given without cache_mode Int8NzCache", "none", shape_str(out.q_out_i8));
    }
  }
  const auto [blocks, bs] = check_caches(fn, cm, out.caches, C, R);
  pl.bs = bs;
  const bool nz_cache = cm == MlaCacheMode::Int8NzCache || cm == MlaCacheMode::NzCache;
  ATTNREF_CHECK(nz_cache ? bs == 128 : (bs <= 128 || bs == 256), std::invalid_argument, fn,
                "caches block size", "not supported by ATB",
                nz_cache ? "128 (NZ caches)" : "1 to 128, or 256", std::to_string(bs));
  if (int8_q) {
    check_vector(fn, "ctkv_scale", in.ctkv_scale, 1);
    const float v = static_cast<float>(in.ctkv_scale.data()[0]);
    ATTNREF_CHECK(v != 0.0f && std::isfinite(v), std::invalid_argument, fn, "ctkv_scale",
                  "not usable", "finite and nonzero", std::to_string(v));
    check_vector(fn, "q_nope_scale", in.q_nope_scale, NH);
  } else {
    ATTNREF_CHECK(in.ctkv_scale.absent() && in.q_nope_scale.absent(), std::invalid_argument, fn,
                  "ctkv_scale / q_nope_scale", "given without cache_mode Int8NzCache", "none",
                  "a tensor");
  }
  check_slots<T>(fn, in.slot_mapping, N, blocks * bs);
}

/// The stages on internal buffers (norms, matmuls, the absorbed q_nope, the ropes), then the
/// outputs and the caches.
template <class T>
void mla_pre_run(const MlaPreprocessParams& params, const MlaPreprocessInputs<T>& in,
                 const MlaPreprocessOutputs<T>& out, const MlaPrePlan& pl, const ExecConfig& exec) {
  const Index H0 = pl.H0, C = pl.C, R = pl.R, Q = pl.Q, P = pl.P, W1 = pl.W1, W2 = pl.W2;
  const Index N = pl.N, NH = pl.NH, bs = pl.bs;
  const MlaQuantMode mode = pl.mode;
  const MlaCacheMode cm = pl.cm;
  const bool unquant = pl.unquant, per_tensor = pl.per_tensor, int8_q = pl.int8_q;
  std::vector<T> mm1(static_cast<size_t>(N * W1)), mm2(static_cast<size_t>(N * W2));
  auto norm_matmul = [&](const StridedView<const T>& x, Index K, const StridedView<const T>& g,
                         const StridedView<const T>& b, const StridedView<const T>& qs,
                         const StridedView<const std::int8_t>& qo, const WeightRef<std::int8_t>& w,
                         const WeightRef<T>& wf, const StridedView<const float>& ds,
                         const StridedView<const std::int64_t>& db,
                         const StridedView<const std::int32_t>& bias, std::vector<T>& dst,
                         Index width) {
    const StridedView<T> o(dst.data(), {N, width});
    RmsNormQuantInputs<T> ri{x, g, b, qs, qo};
    if (unquant) {
      std::vector<T> y(static_cast<size_t>(N * K));
      rms_norm_quant<T>(mode, params.epsilon, ri, {{}, {}, {}, StridedView<T>(y.data(), {N, K})});
      float_matmul<T>(StridedView<const T>(y.data(), {N, K}), wf, o, exec);
      return;
    }
    std::vector<std::int8_t> q(static_cast<size_t>(N * K));
    std::vector<float> dsc(static_cast<size_t>(N)), zp(static_cast<size_t>(N));
    RmsNormQuantOutputs<T> ro{StridedView<std::int8_t>(q.data(), {N, K})};
    if (!per_tensor) ro.descale = StridedView<float>(dsc.data(), {N});
    if (mode == MlaQuantMode::PerTokenAsymm) ro.zero_point = StridedView<float>(zp.data(), {N});
    rms_norm_quant<T>(mode, params.epsilon, ri, ro);
    Int8MatmulInputs mi{StridedView<const std::int8_t>(q.data(), {N, K}), w, bias, ds, db};
    if (!per_tensor) mi.token_scale = StridedView<const float>(dsc.data(), {N});
    if (mode == MlaQuantMode::PerTokenAsymm)
      mi.zero_point = StridedView<const float>(zp.data(), {N});
    int8_matmul<T>(mi, o, exec);
  };
  // 1-2: input -> mm1 [N, C + R + Q].
  norm_matmul(in.input, H0, in.gamma0, in.beta0, in.quant_scale0, in.quant_offset0, in.wdqkv,
              in.wdqkv_float, in.de_scale0, in.de_scale0_bits, in.bias0, mm1, W1);
  // 3-5: the query latent -> mm2 [N, heads, P + R].
  std::vector<T> ql(static_cast<size_t>(N * Q)), kv(static_cast<size_t>(N * C)),
      kr(static_cast<size_t>(N * R));
  for (Index t = 0; t < N; ++t) {
    const T* row = mm1.data() + t * W1;
    std::copy(row, row + C, kv.data() + t * C);
    std::copy(row + C, row + C + R, kr.data() + t * R);
    std::copy(row + C + R, row + W1, ql.data() + t * Q);
  }
  norm_matmul(StridedView<const T>(ql.data(), {N, Q}), Q, in.gamma1, in.beta1, in.quant_scale1,
              in.quant_offset1, in.wuq, in.wuq_float, in.de_scale1, in.de_scale1_bits, in.bias1,
              mm2, W2);
  // 6-7: q_nope · wuk and the query rope.
  std::vector<T> qn(static_cast<size_t>(N * NH * P)), qr(static_cast<size_t>(N * NH * R));
  for (Index t = 0; t < N; ++t)
    for (Index h = 0; h < NH; ++h) {
      const T* row = mm2.data() + (t * NH + h) * (P + R);
      std::copy(row, row + P, qn.data() + (t * NH + h) * P);
      std::copy(row + P, row + P + R, qr.data() + (t * NH + h) * R);
    }
  std::vector<float> qa(static_cast<size_t>(N * NH * C));
  q_nope_absorb<T>(StridedView<const T>(qn.data(), {N, NH, P}), in.wuk,
                   StridedView<float>(qa.data(), {N, NH, C}), exec);
  rope_rotate_half<T>(StridedView<const T>(qr.data(), {N, NH, R}), in.sin, in.cos, NH,
                      StridedView<T>(qr.data(), {N, NH, R}));
  // 8: the key path.
  std::vector<T> kn(static_cast<size_t>(N * C));
  rms_norm<T>(StridedView<const T>(kv.data(), {N, C}), in.gamma2, params.epsilon,
              StridedView<T>(kn.data(), {N, C}));
  rope_rotate_half<T>(StridedView<const T>(kr.data(), {N, R}), in.sin, in.cos, 1,
                      StridedView<T>(kr.data(), {N, R}));

  // Outputs, then the caches.
  for (Index t = 0; t < N; ++t)
    for (Index h = 0; h < NH; ++h) {
      const float* a = qa.data() + (t * NH + h) * C;
      const T* r = qr.data() + (t * NH + h) * R;
      if (cm == MlaCacheMode::KvCache) {
        T* o = out.q_out.data() + (t * NH + h) * (C + R);
        for (Index c = 0; c < C; ++c) o[c] = T(a[c]);
        std::copy(r, r + R, o + C);
        continue;
      }
      std::copy(r, r + R, out.q_rope_out.data() + (t * NH + h) * R);
      if (int8_q) {
        std::int8_t* o = out.q_out_i8.data() + (t * NH + h) * C;
        const float s = static_cast<float>(in.q_nope_scale.data()[h]);
        for (Index c = 0; c < C; ++c) {
          const float p = fmul(static_cast<float>(T(a[c])), s);
          o[c] = sat8_rne(std::is_same_v<T, half> ? static_cast<float>(half(p)) : p);
        }
      } else {
        T* o = out.q_out.data() + (t * NH + h) * C;
        for (Index c = 0; c < C; ++c) o[c] = T(a[c]);
      }
    }
  const float inv3 =
      int8_q ? static_cast<float>(T(1.0 / double(static_cast<float>(in.ctkv_scale.data()[0]))))
             : 0.0f;
  write_caches(cm, kn.data(), kr.data(), in.slot_mapping.data(), N, C, R, bs, inv3, out.caches);
}

}  // namespace mla

/// mla_preprocess on dense arguments (the stand-ins of dense_call): every check, then (run) the
/// stages.
template <class T>
void mla_preprocess_dense(const MlaPreprocessParams& params, const MlaPreprocessInputs<T>& in,
                          const MlaPreprocessOutputs<T>& out, const ExecConfig& exec, bool run) {
  static_assert(std::is_same_v<T, half> || std::is_same_v<T, bfloat16>,
                "mla_preprocess: half or bfloat16 (the model dtype)");
  constexpr const char* fn = "mla_preprocess";
  detail::check_views(fn, "input", in.input, "gamma0", in.gamma0, "beta0", in.beta0, "quant_scale0",
                      in.quant_scale0, "quant_offset0", in.quant_offset0, "wdqkv", in.wdqkv.tensor,
                      "wdqkv_float", in.wdqkv_float.tensor, "de_scale0", in.de_scale0,
                      "de_scale0_bits", in.de_scale0_bits, "bias0", in.bias0, "gamma1", in.gamma1,
                      "beta1", in.beta1, "quant_scale1", in.quant_scale1, "quant_offset1",
                      in.quant_offset1, "wuq", in.wuq.tensor, "wuq_float", in.wuq_float.tensor,
                      "de_scale1", in.de_scale1, "de_scale1_bits", in.de_scale1_bits, "bias1",
                      in.bias1, "gamma2", in.gamma2, "cos", in.cos, "sin", in.sin, "wuk",
                      in.wuk.tensor, "slot_mapping", in.slot_mapping, "ctkv_scale", in.ctkv_scale,
                      "q_nope_scale", in.q_nope_scale, "q_out", out.q_out, "q_out_i8", out.q_out_i8,
                      "q_rope_out", out.q_rope_out, "kv_cache", out.caches.kv_cache, "ctkv",
                      out.caches.ctkv, "ctkv_i8", out.caches.ctkv_i8, "krope", out.caches.krope);
  mla::MlaPrePlan pl = mla::mla_pre_params(fn, params);
  mla::mla_pre_inputs(fn, in, pl);
  mla::mla_pre_outputs(fn, in, out, pl);
  // Nothing has been written yet; from here on only internal buffers until the last step.
  if (run) mla::mla_pre_run(params, in, out, pl, exec);
}

template <class T>
void mla_preprocess_call(const MlaPreprocessParams& params, const MlaPreprocessInputs<T>& in,
                         const MlaPreprocessOutputs<T>& out, const ExecConfig& exec, bool run) {
  check_exec("mla_preprocess", exec);
  dense_call("mla_preprocess", in, out, run, [&](const auto& din, const auto& dout) {
    mla_preprocess_dense(params, din, dout, exec, run);
  });
}
}  // namespace detail

/// Every check of mla_preprocess() (params, tensors, caches, execution config), without
/// computing or writing anything.
template <class T>
void validate(const MlaPreprocessParams& params, const MlaPreprocessInputs<T>& in,
              const MlaPreprocessOutputs<T>& out, const ExecConfig& exec = {}) {
  detail::mla_preprocess_call(params, in, out, exec, false);
}

/// ATB MlaPreprocess as validate -> plan -> run: every check runs before anything is written
/// (the caches included).
template <class T>
void mla_preprocess(const MlaPreprocessParams& params, const MlaPreprocessInputs<T>& in,
                    const MlaPreprocessOutputs<T>& out, const ExecConfig& exec = {}) {
  detail::mla_preprocess_call(params, in, out, exec, true);
}

}  // namespace attnref
