#pragma once
/// Element and index types shared by every attnref header.
///
/// Storage types: float, double, Eigen::half (fp16), Eigen::bfloat16 (bf16) and std::int8_t.
/// Computation happens in float by default (double on request); fp16/bf16 are converted once per
/// tile, never per element in an inner loop.

#include <Eigen/Core>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace attnref {

/// Signed index type used for every shape, stride and position.
using Index = std::ptrdiff_t;

using half = Eigen::half;          ///< IEEE fp16 storage type.
using bfloat16 = Eigen::bfloat16;  ///< bf16 storage type.

/// True for the element types attnref accepts as tensor storage.
template <class T>
inline constexpr bool is_storage_type_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, half> ||
    std::is_same_v<T, bfloat16> || std::is_same_v<T, std::int8_t>;

/// True for the element types attnref computes in (accumulators, softmax state).
template <class T>
inline constexpr bool is_compute_type_v = std::is_same_v<T, float> || std::is_same_v<T, double>;

/// Short dtype name, used in error messages and benchmark names ("f32", "f16", ...).
template <class T>
constexpr const char* dtype_name() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>)
    return "f32";
  else if constexpr (std::is_same_v<U, double>)
    return "f64";
  else if constexpr (std::is_same_v<U, half>)
    return "f16";
  else if constexpr (std::is_same_v<U, bfloat16>)
    return "bf16";
  else if constexpr (std::is_same_v<U, std::int8_t>)
    return "i8";
  else if constexpr (std::is_same_v<U, std::uint8_t>)
    return "u8";
  else if constexpr (std::is_same_v<U, std::int32_t>)
    return "i32";
  else
    return "?";
}

/// Converts a storage value to a compute type (exact for every supported pair).
template <class To, class From>
inline To convert(From x) {
  if constexpr (std::is_same_v<To, From>)
    return x;
  else if constexpr (std::is_same_v<From, half> || std::is_same_v<From, bfloat16>)
    return static_cast<To>(static_cast<float>(x));
  else
    return static_cast<To>(x);
}

}  // namespace attnref
