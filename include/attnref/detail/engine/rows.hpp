#pragma once
/// The engine's row conversions: loading q / k / v rows into the compute type (scaled) and
/// storing output rows into the output type, vectorised where the bits allow; the Eigen map
/// aliases the other engine headers use.

#include <Eigen/Core>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "attnref/core/types.hpp"
#include "attnref/detail/simd.hpp"

namespace attnref::detail {

template <class Acc>
using RowMatrix = Eigen::Matrix<Acc, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class Acc>
using RowMap = Eigen::Map<RowMatrix<Acc>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class Acc>
using ConstRowMap = Eigen::Map<const RowMatrix<Acc>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class Acc>
using ArrayMap = Eigen::Map<Eigen::Array<Acc, Eigen::Dynamic, 1>>;
template <class T>
using AlignedVector = std::vector<T, Eigen::aligned_allocator<T>>;

/// True when every entry of m is finite: x · 0 is 0 for a finite x and NaN for ±inf / NaN, one
/// vectorised pass per row (Eigen's allFinite tests entry by entry on a strided map).
template <class Acc>
inline bool all_finite(const ConstRowMap<Acc>& m) {
  for (Index r = 0; r < m.rows(); ++r)
    if (!((m.row(r).array() * Acc(0)).sum() == Acc(0))) return false;
  return true;
}

/// dst[i] = Acc(src[i * stride]) * mul for i < n (vectorised when stride == 1).
template <class Acc, class T>
inline void load_row(const T* src, Index stride, Index n, Acc* dst, Acc mul) {
  if constexpr (std::is_same_v<Acc, float> &&
                (std::is_same_v<T, half> || std::is_same_v<T, bfloat16> ||
                 std::is_same_v<T, std::int8_t>)) {
    if (stride == 1 && simd::enabled()) {  // same bits as the portable conversion
      simd::to_float(src, n, dst);         // exact, same bits as the portable path
      if (mul != Acc(1)) ArrayMap<Acc>(dst, n) *= mul;
      return;
    }
  }
  if (stride == 1) {
    using Src = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;
    if constexpr (std::is_same_v<T, Acc>) {
      if (mul == Acc(1))
        ArrayMap<Acc>(dst, n) = Src(src, n);
      else
        ArrayMap<Acc>(dst, n) = Src(src, n) * mul;
    } else if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
      // fp16/bf16 -> float is exact; one more cast for double.
      if (mul == Acc(1))
        ArrayMap<Acc>(dst, n) = Src(src, n).template cast<float>().template cast<Acc>();
      else
        ArrayMap<Acc>(dst, n) = Src(src, n).template cast<float>().template cast<Acc>() * mul;
    } else {
      ArrayMap<Acc>(dst, n) = Src(src, n).template cast<Acc>() * mul;
    }
  } else {
    for (Index i = 0; i < n; ++i) dst[i] = convert<Acc>(src[i * stride]) * mul;
  }
}

template <class TO, class Acc>
inline TO to_output(Acc x) {
  if constexpr (std::is_same_v<TO, half> || std::is_same_v<TO, bfloat16>)
    return TO(static_cast<float>(x));
  else
    return static_cast<TO>(x);
}

/// Stores an Acc row into the output type.
template <class TO, class Acc>
inline void store_row(const Acc* src, Acc mul, Index n, TO* dst, Index stride) {
  if constexpr (std::is_same_v<Acc, float> && std::is_same_v<TO, half>) {
    if (stride == 1) {  // the same bits as the conversion below, vectorised
      simd::to_half(src, mul, n, dst);
      return;
    }
  }
  if (stride == 1) {
    using Dst = Eigen::Map<Eigen::Array<TO, Eigen::Dynamic, 1>>;
    using Src = Eigen::Map<const Eigen::Array<Acc, Eigen::Dynamic, 1>>;
    if constexpr (std::is_same_v<TO, Acc>)
      Dst(dst, n) = Src(src, n) * mul;
    else if constexpr (std::is_same_v<TO, half> || std::is_same_v<TO, bfloat16>)
      Dst(dst, n) = (Src(src, n) * mul).template cast<float>().template cast<TO>();
    else
      Dst(dst, n) = (Src(src, n) * mul).template cast<TO>();
  } else {
    for (Index i = 0; i < n; ++i) dst[i * stride] = to_output<TO>(src[i] * mul);
  }
}

}  // namespace attnref::detail
