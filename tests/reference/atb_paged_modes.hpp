#pragma once
// Independent reference of three modes of ATB PagedAttention, written from docs/semantics.md §1, §3
// and the vendor goldens (test_paged_attention_common.py: group_mm_torch, softmax_quant_numpy,
// softmax_quant_numpy_online, ref_masked_attention; test_paged_attention_lookahead.py):
//
//  * calcType SPEC: several query tokens per sequence; a token sees every key 0..len-1 of its
//    sequence plus its additive mask terms (no implicit causality). One token per sequence is
//    the plain decode.
//  * quantType DEQUANT_FUSION: int8 caches, x_fp[c] = (x_i8[c] + offset[c]) * descale[c] per
//    channel c = kvHead * dim + d; then the ordinary attention.
//  * quantType QKV_OFFLINE / QKV_ONLINE: int8 q, K, V. Scores in fp32, P̂ = exp(s - running max)
//    in fp32, quantized per block of keys through an fp16 rounding and rint, P8 · V exact.
//
// Scores, softmax and P·V are in double, except the steps of the qkv path whose rounding IS the
// definition (fp32 scores, fp32 P̂ and scales, the fp16 rounding of the quantized P), which are
// emulated exactly. Does not include attnref.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <vector>

namespace ref {

// One fp32 operation, rounded once: a double operation on two floats rounded to float is the
// correctly rounded float operation (53 >= 2 * 24 + 2), and the explicit rounding keeps a
// compiler from contracting a product and a sum into one FMA.
inline float f32_mul(float a, float b) {
  return static_cast<float>(static_cast<double>(a) * static_cast<double>(b));
}
inline float f32_div(float a, float b) {
  return static_cast<float>(static_cast<double>(a) / static_cast<double>(b));
}
inline float f32_add(float a, float b) {
  return static_cast<float>(static_cast<double>(a) + static_cast<double>(b));
}
inline float f32_sub(float a, float b) {
  return static_cast<float>(static_cast<double>(a) - static_cast<double>(b));
}

// The fp16 value nearest to x (ties to even), as a float: 11 significant bits, subnormals below
// 2^-14 (step 2^-24), overflow to +-inf from 65520 on.
float fp16_rne(float x);

// ---------------------------------------------------------------------------------------------
// Floating-point modes (unquantized, SPEC, DEQUANT_FUSION after dequant()).

struct PagedModes {
  int num_heads = 1, num_kv_heads = 1, head_size = 1, v_head_size = 1;
  double qk_scale = 1.0;
  std::vector<double> log_n;                        // per sequence; empty: scaleType TOR
  std::function<double(int r, int h, int t)> bias;  // mask + alibi terms of token r, key t
};

using Rows = std::vector<std::vector<double>>;

// q[r]: [heads * D] of query token r, seq[r]: its sequence; k[b]: [len][kvHeads * D], v[b]:
// [len][kvHeads * Dv]. s_t = q·k_t · qkScale (· logN[b]) + bias; out = softmax(s) · V.
// Returns [tokens][heads][Dv]; a sequence without keys gives zeros.
std::vector<double> paged_rows(const PagedModes& pr, const Rows& q, const std::vector<int>& seq,
                               const std::vector<Rows>& k, const std::vector<Rows>& v);

// DEQUANT_FUSION: one cache row [kvHeads * dim] of int8 to (x + offset[c]) * descale[c]
// (offset empty: hasQuantOffset false). Exact in double.
std::vector<double> dequant(const std::int8_t* x, const std::vector<float>& descale,
                            const std::vector<std::int32_t>& offset);

// ---------------------------------------------------------------------------------------------
// QKV_OFFLINE / QKV_ONLINE.
//
// Per token r, head h (kv head h / G), in fp32 with each operation rounded:
//   s_t = fp32(fp32(int32(q·k_t) · kDescale[h]) · qkScale) + mask(r, t)
// Keys in blocks of `block` from key 0; m = running max of s including the block;
//   P̂_t = fp32(exp(s_t - m))                        (fp32 difference, exp correctly rounded)
//   online:  bmax = max_t P̂_t of the block; P8_t = sat8(rint(fp16(P̂_t / (bmax / 127))));
//            factor = (vDescale[h] · bmax) / 127     (bmax = 0: the block contributes nothing)
//   offline: P8_t = sat8(rint(fp16(P̂_t · pScale[h]))); factor = vDescale[h]
//   l = l · exp(m_old - m) + Σ P̂_t;  O = O · exp(m_old - m) + factor · Σ_t P8_t · V_t (exact)
//   out = O / l
//
// An implementation computing exp in float may land a few ulps away from the correctly rounded
// P̂, and near a rounding step of rint(fp16(.)) that moves P8 by one. Each P8 whose value changes
// within a relative window `tie_window` of P̂ / scale is counted as a near tie, and its largest
// possible effect on the output row (|factor| · steps · max|V_t|, rescaled like O, / l) is
// returned as `slack`; `mag` is Σ |terms| / l per element, the scale of the fp32 accumulation
// error.

struct PagedQkv {
  int num_heads = 1, num_kv_heads = 1, head_size = 1, v_head_size = 1;
  float qk_scale = 1.0f;
  std::vector<float> k_descale, v_descale;  // [heads]
  std::vector<float> p_scale;               // [heads]; empty: online
  int block = 128;
  std::function<float(int r, int t)> mask;  // stored mask value (fp32); none: no term
  double tie_window = 6e-6;
};

struct QkvResult {
  std::vector<double> out;    // [tokens][heads][Dv]
  std::vector<double> mag;    // [tokens][heads][Dv]
  std::vector<double> slack;  // [tokens][heads]
  long near_ties = 0, quantized = 0;
};

using Rows8 = std::vector<std::vector<std::int8_t>>;

inline int sat8_rint_fp16(double x) {
  const float h = fp16_rne(static_cast<float>(x));
  return static_cast<int>(std::clamp(std::nearbyint(h), -128.0f, 127.0f));
}

QkvResult paged_qkv(const PagedQkv& pr, const Rows8& q, const std::vector<int>& seq,
                    const std::vector<Rows8>& k, const std::vector<Rows8>& v);

}  // namespace ref
