#pragma once
/// RoPE with rotary coefficient 2 (rotate half) as ATB's MlaPreprocess applies it to the query
/// and key rope parts (docs/semantics.md §5 steps 5 and 6), in the model dtype's arithmetic:
///   rot = [−x₂, x₁] (the two halves of each head), out = T(T(x · cos) + T(rot · sin))
/// with each product rounded to T and the sum of the two T values rounded once (through fp32).
/// sin and cos are per token [N, R], the same for every head.
///
/// q_nope_absorb: the per-head product q_nope · wuk ("matmulEin"): out[t][h] = q[t][h] · wuk[h],
/// [N, heads, P] × [heads, P, C] -> [N, heads, C], accumulated in fp32 in k order, each step
/// o = fp32(o + q·w) rounded once (the product exact).

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/core/dense.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/exec.hpp"
#include "attnref/core/nz.hpp"
#include "attnref/core/types.hpp"
#include "attnref/detail/simd.hpp"
#include "attnref/detail/threading.hpp"
#include "attnref/mla/rmsnorm_quant.hpp"

namespace attnref {

namespace detail::mla {

/// One head of R values, in place into out (may alias nothing).
template <class T>
void rope_head(const T* x, const T* sin, const T* cos, Index R, T* out) {
  const Index h = R / 2;
  for (Index j = 0; j < R; ++j) {
    const float xr = static_cast<float>(x[j]);
    const float rot = j < h ? -static_cast<float>(x[j + h]) : static_cast<float>(x[j - h]);
    const float a = round_to<T>(fmul(xr, static_cast<float>(cos[j])));
    const float b = round_to<T>(fmul(rot, static_cast<float>(sin[j])));
    out[j] = T(fadd(a, b));
  }
}

/// fp32(a·b + c) rounded once: the product is exact in double, so a compiler-fused multiply-add
/// gives the same bits as the separate operations, at every SIMD level.
inline float fma_f32(float a, float b, float c) {
  return static_cast<float>(double(a) * double(b) + double(c));
}

}  // namespace detail::mla

namespace detail {
/// rope_rotate_half on dense arguments: the public entry below passes every view through a
/// DenseArena first.
template <class T>
void rope_rotate_half_dense(const StridedView<const T>& x, const StridedView<const T>& sin,
                            const StridedView<const T>& cos, Index heads, const StridedView<T>& out,
                            int rotary_coeff) {
  static_assert(std::is_same_v<T, half> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float>,
                "rope_rotate_half: half, bfloat16 or float");
  using namespace detail::mla;
  constexpr const char* fn = "rope_rotate_half";
  detail::check_views(fn, "x", x, "sin", sin, "cos", cos, "out", out);
  ATTNREF_CHECK(rotary_coeff == 2, std::invalid_argument, fn, "rotary_coeff", "not supported",
                "2 (rotate half)", std::to_string(rotary_coeff));
  ATTNREF_CHECK(!sin.absent() && sin.rank() == 2, std::invalid_argument, fn, "sin.shape", "not 2-D",
                "[N, R]", detail::shape_str(sin));
  const Index N = sin.size(0), R = sin.size(1);
  ATTNREF_CHECK(R > 0 && R % 2 == 0, std::invalid_argument, fn, "sin.shape[1]",
                "not a positive even rope width", "even R", std::to_string(R));
  ATTNREF_CHECK(!cos.absent() && cos.shape() == sin.shape(), std::invalid_argument, fn, "cos.shape",
                "differs from sin's", detail::shape_str(sin), detail::shape_str(cos));
  ATTNREF_CHECK(heads > 0, std::invalid_argument, fn, "heads", "not positive", ">= 1",
                std::to_string(heads));
  auto ok = [&](const auto& t) {
    return !t.absent() &&
           ((t.rank() == 2 && t.size(0) == N && t.size(1) == heads * R) ||
            (t.rank() == 3 && t.size(0) == N && t.size(1) == heads && t.size(2) == R));
  };
  const std::string want = "[" + std::to_string(N) + ", " + std::to_string(heads * R) + "] or [" +
                           std::to_string(N) + ", " + std::to_string(heads) + ", " +
                           std::to_string(R) + "]";
  ATTNREF_CHECK(ok(x), std::invalid_argument, fn, "x.shape", "mismatch", want,
                detail::shape_str(x));
  ATTNREF_CHECK(ok(out), std::invalid_argument, fn, "out.shape", "mismatch", want,
                detail::shape_str(out));
  const bool same = static_cast<const void*>(x.data()) == static_cast<const void*>(out.data());
  std::vector<T> tmp(same ? static_cast<size_t>(R) : 0);
  for (Index t = 0; t < N; ++t)
    for (Index h = 0; h < heads; ++h) {
      const T* xs = x.data() + (t * heads + h) * R;
      T* os = out.data() + (t * heads + h) * R;
      if (same) {
        rope_head(xs, sin.data() + t * R, cos.data() + t * R, R, tmp.data());
        std::copy(tmp.begin(), tmp.end(), os);
      } else {
        rope_head(xs, sin.data() + t * R, cos.data() + t * R, R, os);
      }
    }
}
}  // namespace detail

/// x, out: [N, heads·R] or [N, heads, R]; sin, cos: [N, R]. rotary_coeff must be 2.
template <class T>
void rope_rotate_half(const StridedView<const T>& x, const StridedView<const T>& sin,
                      const StridedView<const T>& cos, Index heads, const StridedView<T>& out,
                      int rotary_coeff = 2) {
  detail::DenseArena arena("rope_rotate_half");
  StridedView<const T> dx = x, ds = sin, dc = cos;
  StridedView<T> dout = out;
  arena.input("x", dx);
  arena.input("sin", ds);
  arena.input("cos", dc);
  arena.output("out", dout, /*in_place=*/true);  // out may be x
  detail::rope_rotate_half_dense(dx, ds, dc, heads, dout, rotary_coeff);
  arena.commit();
}

/// wuk [heads, P, C] as ND, or NZ per head [heads, C / 16, P rounded to 16, 16] (fp16 / bf16).
template <class T>
struct WukRef {
  StridedView<const T> tensor;
  bool nz = false;
};

namespace detail {
/// q_nope_absorb on dense arguments: the public entry below passes every view through a
/// DenseArena first.
template <class T>
void q_nope_absorb_dense(const StridedView<const T>& q, const WukRef<T>& wuk,
                         const StridedView<float>& out, const ExecConfig& exec) {
  static_assert(std::is_same_v<T, half> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float>,
                "q_nope_absorb: half, bfloat16 or float");
  using namespace detail::mla;
  constexpr const char* fn = "q_nope_absorb";
  detail::check_views(fn, "q", q, "wuk", wuk.tensor, "out", out);
  ATTNREF_CHECK(!q.absent() && q.rank() == 3, std::invalid_argument, fn, "q.shape", "not 3-D",
                "[N, heads, P]", detail::shape_str(q));
  const Index N = q.size(0), H = q.size(1), P = q.size(2);
  const auto& w = wuk.tensor;
  Index C = 0;
  if (!wuk.nz) {
    ATTNREF_CHECK(!w.absent() && w.rank() == 3 && w.size(0) == H && w.size(1) == P,
                  std::invalid_argument, fn, "wuk.shape", "mismatch",
                  "[" + std::to_string(H) + ", " + std::to_string(P) + ", C]",
                  detail::shape_str(w));
    C = w.size(2);
  } else {
    constexpr Index c0 = nz_c0<T>();
    ATTNREF_CHECK(!w.absent() && w.rank() == 4 && w.size(0) == H &&
                      w.size(2) == (P + 15) / 16 * 16 && w.size(3) == c0,
                  std::invalid_argument, fn, "wuk.shape", "mismatch (NZ)",
                  "[" + std::to_string(H) + ", C / " + std::to_string(c0) + ", " +
                      std::to_string((P + 15) / 16 * 16) + ", " + std::to_string(c0) + "]",
                  detail::shape_str(w));
    C = w.size(1) * c0;
  }
  ATTNREF_CHECK(
      !out.absent() && out.rank() == 3 && out.size(0) == N && out.size(1) == H && out.size(2) == C,
      std::invalid_argument, fn, "out.shape", "mismatch",
      "[" + std::to_string(N) + ", " + std::to_string(H) + ", " + std::to_string(C) + "]",
      detail::shape_str(out));
  // Per head: out[t][h][:] = Σ_k q[t][h][k] · wuk[h][k][:], k ascending (fp32 axpys), so each
  // element's sum order is the same for every N and thread count.
  detail::parallel_for(
      detail::resolve_threads(exec.threads), H,
      [&] { return std::vector<float>(static_cast<size_t>(C)); },
      [&](std::vector<float>& wrow, Index h) {
        for (Index t = 0; t < N; ++t) std::fill_n(out.data() + (t * H + h) * C, C, 0.0f);
        constexpr Index c0 = nz_c0<T>();
        for (Index k = 0; k < P; ++k) {
          if (!wuk.nz) {
            detail::simd::to_float(w.data() + (h * P + k) * C, C, wrow.data());
          } else {
            const Index pp = w.size(2);
            const T* base = w.data() + h * w.size(1) * pp * c0;
            for (Index cb = 0; cb < C / c0; ++cb)
              detail::simd::to_float(base + (cb * pp + k) * c0, c0, wrow.data() + cb * c0);
          }
          for (Index t = 0; t < N; ++t) {
            const float qk = static_cast<float>(q.data()[(t * H + h) * P + k]);
            float* o = out.data() + (t * H + h) * C;
            for (Index c = 0; c < C; ++c) o[c] = fma_f32(qk, wrow[static_cast<size_t>(c)], o[c]);
          }
        }
      });
}
}  // namespace detail

/// out [N, heads, C] (fp32) = q [N, heads, P] · wuk[h] per head.
template <class T>
void q_nope_absorb(const StridedView<const T>& q, const WukRef<T>& wuk,
                   const StridedView<float>& out, const ExecConfig& exec = {}) {
  detail::check_exec("q_nope_absorb", exec);
  detail::DenseArena arena("q_nope_absorb");
  StridedView<const T> dq = q;
  WukRef<T> dw = wuk;
  StridedView<float> dout = out;
  arena.input("q", dq);
  arena.input("wuk", dw.tensor);
  arena.output("out", dout);
  detail::q_nope_absorb_dense(dq, dw, dout, exec);
  arena.commit();
}

}  // namespace attnref
