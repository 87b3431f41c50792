#pragma once
/// The matmuls of ATB's MlaPreprocess (docs/semantics.md §5 steps 2 and 3): int8 activations × an
/// int8 weight with exact int32 sums, bias and dequantization; the floating-point form of the
/// Unquant mode; and the weight formats (ND [out, in], ND [in, out], NZ).
///
/// acc[m][n] = Σ_k a[m][k] · W[n][k] (int32, exact), then in fp32, each step rounded once:
///   per tensor (no per-token scale): out = T((acc + bias[n]) · de_scale[n])
///   per token:                        out = T((acc · de_scale[n]) · token_scale[m])
///   per token with a zero point:      out = T(((acc − zp[m] · Σ_k W[n][k]) · de_scale[n]) ·
///                                             token_scale[m])
/// where acc (an int32) is rounded to fp32 first. de_scale is fp32, or int64 holding the fp32
/// bit pattern in its low 32 bits (the fp16 models' form). The result does not depend on the
/// thread count.

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/core/dense.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/exec.hpp"
#include "attnref/core/nz.hpp"
#include "attnref/core/quant.hpp"
#include "attnref/core/types.hpp"
#include "attnref/detail/simd.hpp"
#include "attnref/detail/threading.hpp"
#include "attnref/mla/rmsnorm_quant.hpp"

namespace attnref {

/// How a weight matrix W (logically [out, in]) is stored.
enum class WeightFormat {
  NdOutIn,  ///< ND [out, in] (ATB's transposeW = true)
  NdInOut,  ///< ND [in, out] (transposeW = false)
  Nz,       ///< NZ of the [out, in] matrix: [ceil(in / C0), ceil(out / 16)·16, C0]
};

/// A weight W of logical shape [out, in].
template <class T>
struct WeightRef {
  StridedView<const T> tensor;
  Index out = 0, in = 0;
  WeightFormat format = WeightFormat::NdOutIn;
};

namespace detail::mla {

template <class T>
void check_weight(const char* fn, const char* arg, const WeightRef<T>& w, Index out, Index in) {
  ATTNREF_CHECK(w.out == out && w.in == in, std::invalid_argument, fn,
                std::string(arg) + " (out, in)", "mismatch", dims(out, in), dims(w.out, w.in));
  const auto& t = w.tensor;
  std::vector<Index> want;
  switch (w.format) {
    case WeightFormat::NdOutIn:
      want = {out, in};
      break;
    case WeightFormat::NdInOut:
      want = {in, out};
      break;
    case WeightFormat::Nz: {
      const auto s = nz_shape<T>(1, out, in);
      want = {s[1], s[2], s[3]};
      break;
    }
    default:
      ATTNREF_CHECK(false, std::invalid_argument, fn, std::string(arg) + ".format", "out of range",
                    "NdOutIn, NdInOut or Nz", std::to_string(static_cast<int>(w.format)));
  }
  ATTNREF_CHECK(
      !t.absent() && t.shape() == want, std::invalid_argument, fn, std::string(arg) + ".shape",
      w.format == WeightFormat::Nz ? "mismatch (NZ of [out, in])" : "mismatch",
      [&] {
        std::string s = "[";
        for (size_t i = 0; i < want.size(); ++i) s += (i ? ", " : "") + std::to_string(want[i]);
        return s + "]";
      }(),
      shape_str(t));
}

/// Rows [n0, n0 + rows) of W as ND [rows, in] into dst.
template <class T>
void weight_rows(const WeightRef<T>& w, Index n0, Index rows, T* dst) {
  const T* p = w.tensor.data();
  if (w.format == WeightFormat::NdOutIn) {
    std::memcpy(dst, p + n0 * w.in, sizeof(T) * static_cast<size_t>(rows * w.in));
  } else if (w.format == WeightFormat::NdInOut) {
    for (Index r = 0; r < rows; ++r)
      for (Index k = 0; k < w.in; ++k) dst[r * w.in + k] = p[k * w.out + n0 + r];
  } else {
    constexpr Index c0 = nz_c0<T>();
    const Index m_pad = (w.out + 15) / 16 * 16;
    for (Index kb = 0; kb * c0 < w.in; ++kb) {
      const Index len = std::min(c0, w.in - kb * c0);
      for (Index r = 0; r < rows; ++r)
        std::memcpy(dst + r * w.in + kb * c0, p + (kb * m_pad + n0 + r) * c0,
                    sizeof(T) * static_cast<size_t>(len));
    }
  }
}

/// acc[m][r] = Σ_k a[m][k] · W[r][k] for the `rows` (<= kRows) output channels of an NZ
/// column run: chunk kb of channel r at w + kb·stride + r·32 (32 int8 of consecutive k). M <= 8,
/// K a multiple of 32. Exact int32.
template <Index kRows>
void nz_block_products(const std::int8_t* a, Index M, Index K, const std::int8_t* w, Index stride,
                       Index rows, std::int32_t (&acc)[8][kRows]) {
  Index done = 0;  // column blocks already summed
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  if (simd::level() != simd::Level::Portable) {
    // 16 int16 products per madd, 8 int32 lanes per channel summed at the end (exact: each lane
    // gathers K / 8 products of at most 2^14).
    constexpr Index kTile = 32;  // channels per pass: 8 · 32 accumulators of 32 bytes (8 KB)
    for (Index r0 = 0; r0 < rows; r0 += kTile) {
      const Index rn = std::min(kTile, rows - r0);
      __m256i lanes[8][kTile];
      for (Index m = 0; m < M; ++m)
        for (Index r = 0; r < rn; ++r) lanes[m][r] = _mm256_setzero_si256();
      for (Index kb = 0; kb < K / 32; ++kb) {
        __m256i va[8][2];
        for (Index m = 0; m < M; ++m) {
          const std::int8_t* am = a + m * K + kb * 32;
          va[m][0] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(am)));
          va[m][1] =
              _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(am + 16)));
        }
        const std::int8_t* blk = w + kb * stride + r0 * 32;
        for (Index r = 0; r < rn; ++r) {
          const __m256i w0 =
              _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + r * 32)));
          const __m256i w1 = _mm256_cvtepi8_epi16(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + r * 32 + 16)));
          for (Index m = 0; m < M; ++m)
            lanes[m][r] = _mm256_add_epi32(
                lanes[m][r],
                _mm256_add_epi32(_mm256_madd_epi16(va[m][0], w0), _mm256_madd_epi16(va[m][1], w1)));
        }
      }
      for (Index m = 0; m < M; ++m)
        for (Index r = 0; r < rn; ++r) {
          alignas(32) std::int32_t l[8];
          _mm256_store_si256(reinterpret_cast<__m256i*>(l), lanes[m][r]);
          std::int32_t s = 0;
          for (std::int32_t x : l) s += x;
          acc[m][r0 + r] = s;
        }
    }
    done = K / 32;
  }
#endif
  for (Index kb = done; kb < K / 32; ++kb)
    for (Index r = 0; r < rows; ++r)
      for (Index m = 0; m < M; ++m) {
        std::int32_t s = 0;
        for (Index c = 0; c < 32; ++c)
          s += static_cast<std::int32_t>(a[m * K + kb * 32 + c]) *
               static_cast<std::int32_t>(w[kb * stride + r * 32 + c]);
        acc[m][r] += s;
      }
}

}  // namespace detail::mla

/// Inputs of int8_matmul. de_scale: exactly one of the fp32 and the int64 forms.
struct Int8MatmulInputs {
  StridedView<const std::int8_t> a;                 ///< [M, K]
  WeightRef<std::int8_t> w;                         ///< [N, K] logically
  StridedView<const std::int32_t> bias{};           ///< N values, optional (per-tensor form only)
  StridedView<const float> de_scale{};              ///< N values
  StridedView<const std::int64_t> de_scale_bits{};  ///< N values: fp32 bits in the low 32 bits
  StridedView<const float> token_scale{};           ///< M values: per-token descale (optional)
  StridedView<const float> zero_point{};            ///< M values: per-token zero point (optional)

  /// Calls f(name, view) for every tensor field.
  template <class F>
  void for_each_view(F&& f) {
    f("a", a), f("w", w.tensor), f("bias", bias), f("de_scale", de_scale);
    f("de_scale_bits", de_scale_bits), f("token_scale", token_scale), f("zero_point", zero_point);
  }
};

namespace detail {
/// int8_matmul on dense arguments: the public entry below passes every view through a
/// DenseArena first.
template <class T>
void int8_matmul_dense(const Int8MatmulInputs& in, const StridedView<T>& out,
                       const ExecConfig& exec) {
  static_assert(std::is_same_v<T, half> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float>,
                "int8_matmul: half, bfloat16 or float output");
  using namespace detail::mla;
  constexpr const char* fn = "int8_matmul";
  detail::check_views(fn, "a", in.a, "w", in.w.tensor, "bias", in.bias, "de_scale", in.de_scale,
                      "de_scale_bits", in.de_scale_bits, "token_scale", in.token_scale,
                      "zero_point", in.zero_point, "out", out);
  ATTNREF_CHECK(!in.a.absent() && in.a.rank() == 2, std::invalid_argument, fn, "a.shape", "not 2-D",
                "[M, K]", detail::shape_str(in.a));
  const Index M = in.a.size(0), K = in.a.size(1), N = in.w.out;
  ATTNREF_CHECK(K > 0 && K <= (Index{1} << 16), std::invalid_argument, fn, "a.shape[1]",
                "out of range", "(0, 65536]", std::to_string(K));
  check_weight(fn, "w", in.w, N, K);
  check_matrix(fn, "out", out, M, N);
  ATTNREF_CHECK(in.de_scale.absent() != in.de_scale_bits.absent(), std::invalid_argument, fn,
                "de_scale / de_scale_bits", "exactly one is required", "one of them",
                "none or both");
  if (!in.de_scale.absent()) check_vector(fn, "de_scale", in.de_scale, N);
  if (!in.de_scale_bits.absent()) check_vector(fn, "de_scale_bits", in.de_scale_bits, N);
  const bool per_token = !in.token_scale.absent();
  if (per_token) check_vector(fn, "token_scale", in.token_scale, M);
  ATTNREF_CHECK(in.zero_point.absent() || per_token, std::invalid_argument, fn, "zero_point",
                "given without token_scale", "token_scale", "none");
  if (!in.zero_point.absent()) check_vector(fn, "zero_point", in.zero_point, M);
  ATTNREF_CHECK(in.bias.absent() || !per_token, std::invalid_argument, fn, "bias",
                "given with per-token scales", "no bias (per-token modes)",
                detail::shape_str(in.bias));
  if (!in.bias.absent()) check_vector(fn, "bias", in.bias, N);
  // Nothing has been written yet.
  std::vector<float> ds(static_cast<size_t>(N));
  for (Index n = 0; n < N; ++n)
    ds[static_cast<size_t>(n)] =
        in.de_scale.absent() ? scale_from_bits(in.de_scale_bits.data()[n]) : in.de_scale.data()[n];
  // acc of (token m, channel n) -> the fp32 value stored as T.
  auto dequant = [&](std::int32_t acc, Index n, Index m, std::int32_t colsum) {
    if (!per_token) {
      const std::int32_t b = in.bias.absent() ? 0 : in.bias.data()[n];
      return fmul(static_cast<float>(acc + b), ds[static_cast<size_t>(n)]);
    }
    float x = static_cast<float>(acc);
    if (!in.zero_point.absent())
      x = fadd(x, -fmul(in.zero_point.data()[m], static_cast<float>(colsum)));
    return fmul(fmul(x, ds[static_cast<size_t>(n)]), in.token_scale.data()[m]);
  };
  // NZ weights: they stream through in memory order, each item a block of 256 output channels
  // (per 32-wide column block one contiguous 8 KB run), the tokens in tiles of 8.
  const bool nz = in.w.format == WeightFormat::Nz;
  if (nz && K % 32 == 0) {
    constexpr Index kRows = 256;
    const Index m_pad = (N + 15) / 16 * 16;
    detail::parallel_for(
        detail::resolve_threads(exec.threads), (N + kRows - 1) / kRows, [] { return 0; },
        [&](int&, Index item) {
          const Index n0 = item * kRows, rows = std::min(kRows, N - n0);
          std::int32_t colsum[kRows] = {};
          if (!in.zero_point.absent())
            for (Index kb = 0; kb < K / 32; ++kb)
              for (Index r = 0; r < rows; ++r)
                for (Index c = 0; c < 32; ++c)
                  colsum[r] += in.w.tensor.data()[((kb * m_pad + n0 + r) * 32) + c];
          for (Index m0 = 0; m0 < M; m0 += 8) {  // tokens in tiles of 8
            const Index mt = std::min<Index>(8, M - m0);
            std::int32_t acc[8][kRows] = {};
            nz_block_products(in.a.data() + m0 * K, mt, K, in.w.tensor.data() + n0 * 32, m_pad * 32,
                              rows, acc);
            for (Index r = 0; r < rows; ++r)
              for (Index m = 0; m < mt; ++m)
                out.data()[(m0 + m) * N + n0 + r] =
                    T(dequant(acc[m][r], n0 + r, m0 + m, colsum[r]));
          }
        });
    return;
  }
  // Otherwise work items of 32 output channels; NZ and [in, out] weights are gathered into rows
  // first (a per-thread buffer kept across calls), ND [out, in] rows are read in place.
  constexpr Index kBlock = 32;
  const Index items = (N + kBlock - 1) / kBlock;
  const bool gather = in.w.format != WeightFormat::NdOutIn;
  detail::parallel_for(
      detail::resolve_threads(exec.threads), items, [] { return 0; },
      [&](int&, Index item) {
        thread_local std::vector<std::int8_t> wbuf;
        const Index n0 = item * kBlock, rows = std::min(kBlock, N - n0);
        if (gather) {
          if (wbuf.size() < static_cast<size_t>(kBlock * K))
            wbuf.resize(static_cast<size_t>(kBlock * K));
          weight_rows(in.w, n0, rows, wbuf.data());
        }
        for (Index r = 0; r < rows; ++r) {
          const Index n = n0 + r;
          const std::int8_t* wr = gather ? wbuf.data() + r * K : in.w.tensor.data() + n * K;
          std::int32_t colsum = 0;
          if (!in.zero_point.absent())
            for (Index k = 0; k < K; ++k) colsum += wr[k];
          for (Index m = 0; m < M; ++m)
            out.data()[m * N + n] = T(dequant(dot_i8(in.a.data() + m * K, wr, K), n, m, colsum));
        }
      });
}
}  // namespace detail

/// out [M, N] (T: half, bfloat16 or float) = the dequantized int8 product.
template <class T>
void int8_matmul(const Int8MatmulInputs& in, const StridedView<T>& out,
                 const ExecConfig& exec = {}) {
  detail::check_exec("int8_matmul", exec);
  detail::DenseArena arena("int8_matmul");
  Int8MatmulInputs din = in;
  StridedView<T> dout = out;
  din.for_each_view([&](const std::string& name, auto& v) { arena.input(name, v); });
  arena.output("out", dout);
  detail::int8_matmul_dense(din, dout, exec);
  arena.commit();
}

namespace detail {
/// float_matmul on dense arguments: the public entry below passes every view through a
/// DenseArena first.
template <class T>
void float_matmul_dense(const StridedView<const T>& a, const WeightRef<T>& w,
                        const StridedView<T>& out, const ExecConfig& exec) {
  static_assert(std::is_same_v<T, half> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float>,
                "float_matmul: half, bfloat16 or float");
  using namespace detail::mla;
  constexpr const char* fn = "float_matmul";
  detail::check_views(fn, "a", a, "w", w.tensor, "out", out);
  ATTNREF_CHECK(!a.absent() && a.rank() == 2, std::invalid_argument, fn, "a.shape", "not 2-D",
                "[M, K]", detail::shape_str(a));
  const Index M = a.size(0), K = a.size(1), N = w.out;
  check_weight(fn, "w", w, N, K);
  check_matrix(fn, "out", out, M, N);
  using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Mat af(M, K);
  for (Index i = 0; i < M * K; ++i) af.data()[i] = static_cast<float>(a.data()[i]);
  constexpr Index kBlock = 256;
  const Index items = (N + kBlock - 1) / kBlock;
  detail::parallel_for(
      detail::resolve_threads(exec.threads), items, [&] { return std::vector<T>(); },
      [&](std::vector<T>& wbuf, Index item) {
        const Index n0 = item * kBlock, rows = std::min(kBlock, N - n0);
        wbuf.resize(static_cast<size_t>(rows * K));
        weight_rows(w, n0, rows, wbuf.data());
        Mat wf(rows, K);
        for (Index i = 0; i < rows * K; ++i)
          wf.data()[i] = static_cast<float>(wbuf[static_cast<size_t>(i)]);
        const Mat c = af * wf.transpose();
        for (Index m = 0; m < M; ++m)
          for (Index r = 0; r < rows; ++r) out.data()[m * N + n0 + r] = T(c(m, r));
      });
}
}  // namespace detail

/// The Unquant mode's matmul: out [M, N] = T(a · Wᵀ) with a [M, K] and W [N, K] in T, summed in
/// fp32 (Eigen's GEMM; the sum order is Eigen's, the same for every thread count).
template <class T>
void float_matmul(const StridedView<const T>& a, const WeightRef<T>& w, const StridedView<T>& out,
                  const ExecConfig& exec = {}) {
  detail::check_exec("float_matmul", exec);
  detail::DenseArena arena("float_matmul");
  StridedView<const T> da = a;
  WeightRef<T> dw = w;
  StridedView<T> dout = out;
  arena.input("a", da);
  arena.input("w", dw.tensor);
  arena.output("out", dout);
  detail::float_matmul_dense(da, dw, dout, exec);
  arena.commit();
}

}  // namespace attnref
